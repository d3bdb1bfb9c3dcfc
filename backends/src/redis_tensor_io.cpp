// The Redis store's tensor I/O (RedisStore::read / write): whole leaves, rows and runs of rows in one
// pipeline (GET, GETRANGE, or the Lua range scripts of Python's TensorDictStore), lengths checked against
// the cached metadata.
#include "redis_internal.hpp"

#include <algorithm>
#include <array>
#include <set>

#include "tensordict/backends/tensor_values.hpp"
#include "tensordict/backends/memmap_format.hpp"
#include "tensordict/errors.hpp"

namespace tensordict {
namespace backends {

using namespace redis_detail;

// ------------------------------------------------------------------------------------------ Lua scripts
namespace {

// KEYS[1] = data key, ARGV = off1 len1 off2 len2 ...: the concatenated ranges (Python's _LUA_GETRANGES)
const char* const kLuaGetRanges =
    "local k = KEYS[1]\n"
    "local out = {}\n"
    "for i = 1, #ARGV, 2 do\n"
    "  local off = tonumber(ARGV[i])\n"
    "  local len = tonumber(ARGV[i + 1])\n"
    "  if len > 0 then out[#out + 1] = redis.call('GETRANGE', k, off, off + len - 1) end\n"
    "end\n"
    "return table.concat(out)\n";

// KEYS[1] = data key, ARGV = off1 bytes1 off2 bytes2 ...: SETRANGE of each (Python's _LUA_SETRANGES)
const char* const kLuaSetRanges =
    "local k = KEYS[1]\n"
    "for i = 1, #ARGV, 2 do\n"
    "  redis.call('SETRANGE', k, tonumber(ARGV[i]), ARGV[i + 1])\n"
    "end\n"
    "return 1\n";

std::string sha1_of_script(RedisClient& c, const char* script) {
  RedisReply r = c.command(RedisCommand{"SCRIPT", "LOAD", script});
  return r.str;
}

bool is_noscript(const RedisReply& r) { return r.is_error() && r.str.rfind("NOSCRIPT", 0) == 0; }

struct Run {
  int64_t first;
  int64_t count;
};

std::vector<Run> runs_of(const std::vector<int64_t>& rows) {
  std::vector<Run> runs;
  for (int64_t r : rows) {
    if (!runs.empty() && runs.back().first + runs.back().count == r)
      ++runs.back().count;
    else
      runs.push_back({r, 1});
  }
  return runs;
}

void check_rows(const std::vector<int64_t>& rows, int64_t n, const std::string& key) {
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= n)
      throw ValueError("row " + std::to_string(rows[i]) + " out of range for " + key + " with " + std::to_string(n) +
                       " rows");
    if (i > 0 && rows[i] <= rows[i - 1])
      throw ValueError("rows of " + key + " must be ascending and unique");
  }
}

//! the last few distinct paths met, each with what it maps to: the writes (or reads) of a merged call repeat the
//! same few paths row after row, so each is joined and looked up once per call, not per row (joining and
//! looking up every leaf of every row was 12% of a write-behind store actor). The paths are the items' own
//! (they outlive the call)
template <class T>
class RecentPaths {
 public:
  T* find(const LeafPath& p) {
    for (size_t i = 0; i < n_; ++i)
      if (*slots_[i].first == p) return &slots_[i].second;
    return nullptr;
  }
  T& add(const LeafPath& p, T v) {
    auto& slot = slots_[next_];
    slot = {&p, std::move(v)};
    next_ = (next_ + 1) % kSlots;
    n_ = std::min(n_ + 1, kSlots);
    return slot.second;
  }

 private:
  static constexpr size_t kSlots = 8;
  std::array<std::pair<const LeafPath*, T>, kSlots> slots_{};
  size_t n_ = 0, next_ = 0;
};

//! the distinct paths of `items` (LeafReads or LeafWrites) whose metadata is not cached yet
template <class Items>
std::vector<LeafPath> uncached(const Items& items, const std::map<std::string, RedisLeafMeta>& cache) {
  std::vector<LeafPath> missing;
  std::set<std::string> seen;
  RecentPaths<bool> recent;
  for (const auto& it : items) {
    if (recent.find(it.path)) continue;
    recent.add(it.path, true);
    std::string j = redis_join_path(it.path);
    if (!cache.count(j) && seen.insert(j).second) missing.push_back(it.path);
  }
  return missing;
}

//! the shape a read asked for (LeafRead::shape) in place of `shape`, when it holds the same elements
void reshape_to(const LeafRead& r, const std::string& dkey, std::vector<int64_t>* shape) {
  if (!r.shape) return;
  int64_t a = 1, b = 1;
  for (int64_t d : *shape) a *= d;
  for (int64_t d : *r.shape) b *= d;
  if (a != b) throw ValueError(dkey + ": cannot return the rows read as shape " + shape_str(*r.shape));
  *shape = *r.shape;
}

}  // namespace

std::vector<at::Tensor> RedisStore::read(const std::vector<LeafRead>& reads) {
  if (reads.empty()) return {};
  std::vector<size_t> bad;
  std::vector<at::Tensor> out = read_once(reads, &bad);
  if (bad.empty()) return out;
  // a length that disagrees with cached metadata: the leaf may have been replaced elsewhere; re-read once
  for (size_t i : bad) {
    meta_cache_.erase(redis_join_path(reads[i].path));
    length_checked_.erase(redis_join_path(reads[i].path));
  }
  return read_once(reads, nullptr);
}

std::vector<at::Tensor> RedisStore::read_once(const std::vector<LeafRead>& reads, std::vector<size_t>* bad) {
  // metadata of every leaf (cached; the missing ones in one pipeline)
  if (auto missing = uncached(reads, meta_cache_); !missing.empty()) fetch_meta(missing);

  enum class Op { Get, GetRange, Ranges, None };
  struct Plan {
    Op op = Op::None;
    size_t data = 0, strlen = 0;
    bool check_len = false;
    std::vector<int64_t> shape;
    int64_t expect = 0;
    RedisLeafMeta* meta = nullptr;  //!< in meta_cache_ (a std::map: stable while this call runs)
  };
  std::vector<Plan> plans(reads.size());
  std::vector<RedisCommand> cmds;
  cmds.reserve(2 * reads.size());
  bool uses_script = false;
  auto command = [](const char* name, const std::string& dkey) {
    RedisCommand c;
    c.reserve(4);
    c.arg_view(name, std::char_traits<char>::length(name)).arg_view(dkey.data(), dkey.size());
    return c;
  };
  RowMemo<bool> checked_rows;  // the leaves of a call share their row lists: check and split each once
  RowMemo<std::vector<Run>> runs_memo;
  for (size_t i = 0; i < reads.size(); ++i) {
    const LeafRead& r = reads[i];
    Plan& p = plans[i];
    const std::string joined = redis_join_path(r.path);
    RedisLeafMeta& m = meta_cache_.at(joined);
    p.meta = &m;
    if (m.data_key.empty()) m.data_key = key("d:" + joined);
    const std::string& dkey = m.data_key;  // borrowed by the commands below
    if (m.info.kind != LeafKind::Tensor) throw TypeError("key '" + joined + "' in " + describe() + " is a non-tensor");
    if (r.whole) {
      p.shape = m.info.shape;
      reshape_to(r, dkey, &p.shape);
      p.expect = m.nbytes;
      p.op = Op::Get;
      p.data = cmds.size();
      cmds.push_back(command("GET", dkey));
      continue;
    }
    if (m.info.shape.empty()) throw ValueError("cannot read rows of the 0-dim leaf " + dkey);
    checked_rows.get(r.rows, m.info.shape[0], [&] {
      check_rows(r.rows.vec(), m.info.shape[0], dkey);
      return true;
    });
    p.shape = m.info.shape;
    p.shape[0] = static_cast<int64_t>(r.rows.size());
    reshape_to(r, dkey, &p.shape);
    p.expect = static_cast<int64_t>(r.rows.size()) * m.row_bytes;
    if (p.expect == 0) {
      p.op = Op::None;
      continue;
    }
    // the value's length is checked once per leaf (with its first rows read); later reads trust the cache
    if (!length_checked_.count(joined)) {
      p.strlen = cmds.size();
      p.check_len = true;
      cmds.push_back(command("STRLEN", dkey));
    }
    p.data = cmds.size();
    if (r.rows.size() == 1 || r.rows.back() - r.rows.front() + 1 == static_cast<int64_t>(r.rows.size())) {
      p.op = Op::GetRange;  // one run (rows are ascending and unique)
      int64_t off = r.rows.front() * m.row_bytes;
      cmds.push_back(command("GETRANGE", dkey).arg(off).arg(off + static_cast<int64_t>(r.rows.size()) * m.row_bytes - 1));
      continue;
    }
    const std::vector<Run>& runs = runs_memo.get(r.rows, 0, [&] { return runs_of(r.rows.vec()); });
    {
      p.op = Op::Ranges;
      uses_script = true;
      RedisCommand c{"EVALSHA", "", "1", dkey};  // sha filled in below
      for (const Run& run : runs) c.arg(run.first * m.row_bytes).arg(run.count * m.row_bytes);
      cmds.push_back(std::move(c));
    }
  }

  std::vector<RedisReply> replies;
  for (int attempt = 0;; ++attempt) {
    if (uses_script) {
      if (!getranges_loaded_ || attempt > 0) {
        sha_getranges_ = sha1_of_script(client(), kLuaGetRanges);
        getranges_loaded_ = true;
      }
      for (size_t i = 0; i < reads.size(); ++i)
        if (plans[i].op == Op::Ranges) {
          // rebuild the command with the sha (argument 1)
          RedisCommand& old = cmds[plans[i].data];
          RedisCommand c;
          c.arg("EVALSHA").arg(sha_getranges_);
          for (size_t a = 2; a < old.size(); ++a) c.arg(old.at(a));
          old = std::move(c);
        }
    }
    if (cmds.empty())
      replies.clear();
    else if (cmds.size() == 1)
      replies = client().pipeline(cmds);
    else
      replies = client().read_together(cmds);
    bool noscript = false;
    for (const auto& r : replies) noscript = noscript || is_noscript(r);
    if (!noscript) break;
    if (attempt >= 1) throw BackendError(describe() + ": the server keeps losing the GETRANGES script (NOSCRIPT)");
    getranges_loaded_ = false;
  }

  std::vector<at::Tensor> out(reads.size());
  for (size_t i = 0; i < reads.size(); ++i) {
    const Plan& p = plans[i];
    const RedisLeafMeta& meta = *p.meta;
    const std::string& dkey = meta.data_key;
    at::ScalarType dtype = meta.info.dtype;
    if (p.op == Op::None) {
      out[i] = at::empty(p.shape, at::TensorOptions().dtype(dtype));
      continue;
    }
    RedisReply& d = replies[p.data];
    if (d.is_error()) redis_reply_error(d, dkey);
    auto mismatch = [&](int64_t got, int64_t want) {
      if (bad) {
        bad->push_back(i);
        return;
      }
      throw FormatError(dkey + ": value holds " + std::to_string(got) + " bytes, metadata " +
                        key("m:" + redis_join_path(meta.info.path)) + " says " + std::to_string(want) + " (shape " +
                        shape_str(meta.info.shape) + ", " + dtype_to_string(dtype) + ")");
    };
    if (p.op == Op::Get) {
      if (d.is_nil() && p.expect != 0) {
        if (bad) {
          bad->push_back(i);
          continue;
        }
        throw FormatError(dkey + ": data value is missing (metadata says " + std::to_string(p.expect) + " bytes)");
      }
      if (static_cast<int64_t>(d.str.size()) != p.expect) {
        mismatch(static_cast<int64_t>(d.str.size()), p.expect);
        continue;
      }
      length_checked_.insert(redis_join_path(meta.info.path));
    } else {
      if (p.check_len) {
        const RedisReply& sl = replies[p.strlen];
        if (sl.is_error()) redis_reply_error(sl, dkey);
        int64_t want = meta.nbytes;
        if (sl.integer != want) {
          mismatch(sl.integer, want);
          continue;
        }
        length_checked_.insert(redis_join_path(meta.info.path));
      }
      if (static_cast<int64_t>(d.str.size()) != p.expect) {
        mismatch(static_cast<int64_t>(d.str.size()), p.expect);
        continue;
      }
    }
    out[i] = tensor_from_bytes(std::move(d.str), dtype, p.shape);
  }
  return out;
}

void RedisStore::write(const std::vector<LeafWrite>& writes) {
  if (writes.empty()) return;
  if (auto missing = uncached(writes, meta_cache_); !missing.empty()) fetch_meta(missing);

  std::vector<at::Tensor> keep;  // payloads are borrowed by the commands
  std::vector<RedisCommand> cmds;
  std::vector<const std::string*> what;  // the data key of each command, for its error
  keep.reserve(writes.size());
  cmds.reserve(writes.size());
  what.reserve(writes.size());
  RowMemo<bool> checked_rows;  // the leaves of a call share their row lists: check and split each once
  RowMemo<std::vector<Run>> runs_memo;
  RecentPaths<RedisLeafMeta*> recent;
  for (const LeafWrite& w : writes) {
    RedisLeafMeta* const* known = recent.find(w.path);
    RedisLeafMeta& m = known ? **known : *recent.add(w.path, &meta_cache_.at(redis_join_path(w.path)));
    if (m.data_key.empty()) m.data_key = key("d:" + redis_join_path(w.path));
    const std::string& dkey = m.data_key;  // borrowed by the commands (meta_cache_ is a std::map)
    if (m.info.kind != LeafKind::Tensor)
      throw TypeError("key '" + redis_join_path(w.path) + "' in " + describe() + " is a non-tensor");
    if (!w.data.defined()) throw ValueError("no data to write to " + dkey);
    if (w.data.scalar_type() != m.info.dtype)
      throw ValueError("cannot write " + std::string(c10::toString(w.data.scalar_type())) + " data to " + dkey +
                       " of dtype " + dtype_to_string(m.info.dtype));
    const std::vector<int64_t>& shape = m.info.shape;
    if (!w.whole) {
      if (shape.empty()) throw ValueError("cannot write rows of the 0-dim leaf " + dkey);
      checked_rows.get(w.rows, shape[0], [&] {
        check_rows(w.rows.vec(), shape[0], dkey);
        return true;
      });
    }
    // the shape written: the leaf's, or its rows' (no copy of it unless it is wrong)
    int64_t want_numel = w.whole ? 1 : static_cast<int64_t>(w.rows.size());
    for (size_t d = w.whole ? 0 : 1; d < shape.size(); ++d) want_numel *= shape[d];
    if (w.data.numel() != want_numel) {  // the elements count, not the shape (LeafWrite)
      std::vector<int64_t> want = shape;
      if (!w.whole) want[0] = static_cast<int64_t>(w.rows.size());
      throw ValueError("data of shape " + shape_str(std_shape(w.data.sizes())) + " does not fit " + dkey +
                       " (expected " + shape_str(want) + ")");
    }
    at::Tensor t = value_bytes(w.data);
    keep.push_back(t);
    const char* base = static_cast<const char*>(t.data_ptr());
    if (w.whole) {
      RedisCommand c{"SET", dkey};
      c.arg_view(t.numel() ? base : "", static_cast<size_t>(m.nbytes));
      cmds.push_back(std::move(c));
      what.push_back(&dkey);
      continue;
    }
    if (m.row_bytes == 0 || w.rows.empty()) continue;
    const std::vector<Run>& runs = runs_memo.get(w.rows, 0, [&] { return runs_of(w.rows.vec()); });
    if (runs.size() == 1) {
      RedisCommand c;
      c.reserve(4);
      c.arg_view("SETRANGE", 8).arg_view(dkey.data(), dkey.size());
      c.arg(runs[0].first * m.row_bytes).arg_view(base, static_cast<size_t>(runs[0].count * m.row_bytes));
      cmds.push_back(std::move(c));
    } else {
      RedisCommand c{"EVAL", kLuaSetRanges, "1", dkey};
      int64_t src = 0;
      for (const Run& run : runs) {
        int64_t len = run.count * m.row_bytes;
        c.arg(run.first * m.row_bytes).arg_view(base + src, static_cast<size_t>(len));
        src += len;
      }
      cmds.push_back(std::move(c));
    }
    what.push_back(&dkey);
  }
  if (cmds.empty()) return;
  if (cmds.size() == 1) {
    const std::vector<RedisReply> replies = client().pipeline(cmds);
    if (replies[0].is_error()) redis_reply_error(replies[0], *what[0]);
    return;
  }
  for (const auto& [i, reply] : client().transaction_errors(cmds)) redis_reply_error(reply, *what[i]);
}

}  // namespace backends
}  // namespace tensordict
