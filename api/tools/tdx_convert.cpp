// tdx convert: SRC -> DST (memmap directory, HDF5 file, Redis store: any pair), in row chunks of <= 64 MiB.
// The copy never writes DST itself: it goes into a sibling (a memmap save's staging directory beside DST,
// backends::StagingDir, held by its lock for the copy's life, or a fresh td_id in DST's Redis database), is
// checked, and only then switched in with one rename (one renameat2 RENAME_EXCHANGE over an existing
// directory, one atomic script over an existing store). A copy that fails removes its sibling and leaves DST as
// it was; the sibling of a convert that was killed is removed by the next convert (or memmap save) to the same
// DST; an HDF5 DST another process holds open for writing is refused. --durable fsyncs the copy before the
// rename and the parent directory after.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "tdx_common.hpp"
#include "tensordict/actors/progress.hpp"
#include "tensordict/backends/memmap_file.hpp"
#include "tensordict/backends/memmap_format.hpp"
#include "tensordict/backends/redis_store.hpp"
#include "tensordict/describe.hpp"
#include "tensordict/engine.hpp"
#include "tensordict/errors.hpp"
#include "tensordict/persistent.hpp"

namespace tdx {
namespace {

namespace fs = std::filesystem;

//! the source of a convert: memmap directories load read-only (private mappings), lazy-stack directories and
//! stores as lazy stacks
Input open_source(const std::string& path) {
  const InputKind kind = input_kind(path);
  if (kind != InputKind::Memmap) return open_store_input(path, kind);
  check_input_dir(path);
  const auto load = td::LoadOptions().writable(false).on_warning([](const std::string& w) {
    std::cerr << "tdx: warning: " << escape_text(w) << "\n";
  });
  Input in;
  in.kind = kind;
  if (td::is_lazy_stack_dir(path)) {
    in.lazy.emplace(td::LazyStackedTensorDict::load_memmap(path, load));
    in.td = *in.lazy;
  } else {
    in.td = td::TensorDict::load_memmap(path, load);
    in.class_path = in.td.class_path();
  }
  in.close = [] {};
  return in;
}

//! what a copy of a lazy stack must hold: stack dim, and per member its batch size and every leaf's kind, dtype
//! and shape (sorted by key: a store lists its keys sorted)
std::string lazy_signature(const td::LazyStackedTensorDict& l) {
  std::string out = "stack_dim " + std::to_string(l.stack_dim()) + "\n";
  for (const auto& m : l.tensordicts()) {
    std::map<std::string, std::string> leaves;
    for (const auto& kv : m.items(td::KeysOptions().include_nested(true).leaves_only(true).non_tensor_leaves(true))) {
      const td::Entry& e = kv.second;
      leaves[key_str(kv.first)] = e.is_tensor() ? short_dtype(e.tensor().scalar_type()) + " " + shape_str(e.tensor().sizes().vec())
                                                : std::string("non-tensor");
    }
    out += "member " + shape_str(m.batch_size()) + "\n";
    for (const auto& kv : leaves) out += "  " + kv.first + ": " + kv.second + "\n";
  }
  return out;
}

//! an HDF5 file holds no lazy stack: its members stacked densely when they stack (the same keys and shapes)
td::TensorDict dense_for_h5(const td::LazyStackedTensorDict& l, const std::string& src_path) {
  td::TensorDict dense = td::maybe_dense_stack(l.tensordicts(), l.stack_dim());
  if (td::LazyStackedTensorDict::is_lazy_stack(dense))
    throw ToolError("'" + shown(src_path) + "' holds a lazy stack whose members differ in keys or shapes: an HDF5 "
                    "file cannot hold it (convert it to a memmap directory or a Redis store, which keep lazy stacks)");
  return dense;
}

// ------------------------------------------------------------------------------------------ the sibling
enum class DstKind { Memmap, H5, Redis };

//! fsyncs every file below `dir`, then every directory below it and `dir` itself, deepest first (--durable:
//! the copy's bytes and names are on the disk before the rename that switches it in)
void sync_tree(const std::string& dir) {
  std::vector<std::string> dirs{dir};
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_symlink()) continue;
    if (e.is_directory())
      dirs.push_back(e.path().string());
    else if (e.is_regular_file())
      tdb::sync_path(e.path().string(), false);
  }
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) tdb::sync_path(*it, true);
}

//! the directory holding `path` ("." for a bare name)
std::string parent_of(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  return p.parent_path().empty() ? std::string(".") : p.parent_path().string();
}

//! a shared flock on an existing HDF5 DST, held until it is replaced: a process holding the file open for
//! writing (HDF5's exclusive lock: PersistentTensorDict "r+"/"w", h5py "r+") makes it fail, and while it is
//! held no writer can open the file. Off when HDF5_USE_FILE_LOCKING=FALSE, as HDF5's own locking.
class H5ReplaceLock {
 public:
  explicit H5ReplaceLock(const std::string& path) {
    if (const char* env = std::getenv("HDF5_USE_FILE_LOCKING"); env && std::strcmp(env, "FALSE") == 0) return;
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    if (fd_ < 0) throw ToolError("'" + shown(path) + "': cannot open to replace it: " + std::strerror(errno));
    if (::flock(fd_, LOCK_SH | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd_);
      fd_ = -1;
      if (err == EWOULDBLOCK)
        throw ToolError("'" + shown(path) +
                        "' is open for writing in another process (HDF5 file lock): not replaced, nothing was changed");
      throw ToolError("'" + shown(path) + "': cannot lock: " + std::strerror(err));
    }
  }
  ~H5ReplaceLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  H5ReplaceLock(const H5ReplaceLock&) = delete;
  H5ReplaceLock& operator=(const H5ReplaceLock&) = delete;

 private:
  int fd_ = -1;
};

//! `stage` becomes `dst`: over an existing directory by exchange (then the old one is removed), over an
//! existing file by rename, else by a rename that refuses to replace what appeared meanwhile
void switch_path_in(const std::string& stage, const std::string& dst, bool replace, bool is_dir) {
  auto fail = [&](const std::string& what) {
    throw ToolError("cannot switch the copy in for '" + shown(dst) + "': " + what + ": " + std::strerror(errno));
  };
  if (!replace) {
    if (::renameat2(AT_FDCWD, stage.c_str(), AT_FDCWD, dst.c_str(), RENAME_NOREPLACE) == 0) return;
    if (errno != EINVAL && errno != ENOSYS) fail("rename");
    if (::link(stage.c_str(), dst.c_str()) == 0 || is_dir) {  // a filesystem without RENAME_NOREPLACE
      if (is_dir ? ::rename(stage.c_str(), dst.c_str()) != 0 : ::unlink(stage.c_str()) != 0) fail("rename");
      return;
    }
    fail("link");
  }
  if (!is_dir) {
    if (::rename(stage.c_str(), dst.c_str()) != 0) fail("rename");
    return;
  }
  std::error_code ec;
  if (::renameat2(AT_FDCWD, stage.c_str(), AT_FDCWD, dst.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(stage, ec);  // now the old directory
    return;
  }
  if (errno != EINVAL && errno != ENOSYS) fail("exchange");
  // a filesystem without RENAME_EXCHANGE: two renames (DST is briefly absent, never a mix)
  const std::string old = stage + ".old";
  if (::rename(dst.c_str(), old.c_str()) != 0) fail("rename");
  if (::rename(stage.c_str(), dst.c_str()) != 0) {
    const int err = errno;
    if (::rename(old.c_str(), dst.c_str()) != 0) {  // put the old one back
    }
    errno = err;
    fail("rename");
  }
  fs::remove_all(old, ec);
}

//! what the copy must hold: every tensor leaf with its dtype and full shape, every non-tensor key
std::map<std::string, std::string> leaf_signature(const Layout& l) {
  std::map<std::string, std::string> out;
  for (const auto& s : l.tensors) {
    out[key_str(s.key)] = short_dtype(s.dtype) + " " + shape_str(l.leaf_shape(s, l.batch.empty() ? 0 : l.batch[0]));
  }
  for (const auto& nt : l.non_tensors) out[key_str(nt.first)] = "non-tensor";
  return out;
}

//! the copy, opened again the way tdx reads it, holds the source's leaves (dtypes and shapes)
void check_copy(const Layout& src, const std::string& src_type, const std::string& where, DstKind kind,
                const td::RedisOptions& ro) {
  Input in;
  if (kind == DstKind::Memmap) {
    in.td = td::TensorDict::load_memmap(where, td::LoadOptions().writable(false));
    in.close = [] {};
  } else if (kind == DstKind::H5) {
    in = open_store_input(where, InputKind::H5);
  } else {
    td::TensorDictStore s = td::TensorDictStore::from_store(ro.td_id(), ro);
    in.td = s;
    in.close = [s] { s.close(); };
  }
  const Layout got = layout_of(in.td);
  const std::string got_type = in.td.type_name();
  in.close();
  if (kind == DstKind::Memmap) {  // a directory keeps every sub-TensorDict's batch size and the class
    if (got.sub_batches != src.sub_batches)
      throw ToolError("the copy's sub-TensorDicts have other batch sizes than the source's: nothing was replaced");
    if (!src_type.empty() && got_type != src_type)
      throw ToolError("the copy is a " + got_type + ", the source a " + src_type + ": nothing was replaced");
  }
  const auto want = leaf_signature(src), have = leaf_signature(got);
  for (const auto& kv : want) {
    auto it = have.find(kv.first);
    if (it == have.end())
      throw ToolError("the copy has no leaf '" + kv.first + "': nothing was replaced");
    if (kv.second != "non-tensor" && it->second != kv.second)
      throw ToolError("the copy's leaf '" + kv.first + "' is " + it->second + ", expected " + kv.second +
                      ": nothing was replaced");
  }
}

struct Copied {
  int64_t leaves = 0, bytes = 0;
  double secs = 0, read_s = 0, write_s = 0;
};

//! copies every row and non-tensor of `src` into the preallocated `dst`
Copied copy_rows(const Input& src, const Layout& l, td::TensorDict& dst, DstKind kind, const std::string& dst_dir,
                 bool quiet, bool structure_copied) {
  using at::indexing::Slice;
  Copied c;
  const auto t0 = std::chrono::steady_clock::now();
  c.bytes = l.total_bytes();
  c.leaves = static_cast<int64_t>(l.tensors.size() + l.non_tensors.size());
  if (!l.tensors.empty()) {
    if (l.batch.empty()) {
      td::TensorDict all = src.td.to_tensordict();
      for (const auto& s : l.tensors) dst.set_(s.key, all.get(s.key));
    } else {
      std::vector<td::NestedKey> tensor_keys;
      for (const auto& s : l.tensors) tensor_keys.push_back(s.key);
      const int64_t n = l.batch[0], step = rows_per_chunk(l);
      const int64_t steps = (n + step - 1) / step;
      td::actors::Progress bar(!quiet, steps, std::chrono::milliseconds(1000), "tdx convert");
      int64_t done = 0;
      for (int64_t a = 0; a < n; a += step) {
        const int64_t b = std::min(n, a + step);
        const auto r0 = std::chrono::steady_clock::now();
        // a memmap source: the rows are a view of its mapping (copied once, by the write); a store: one read
        td::TensorDict rows = src.td.index({Slice(a, b)});
        if (src.kind != InputKind::Memmap) rows = rows.to_tensordict();
        // the tensor leaves, in their sub-TensorDicts as they are (nested batch sizes kept)
        td::TensorDict tensors = rows.select(tensor_keys);
        const auto r1 = std::chrono::steady_clock::now();
        dst.index_put_({Slice(a, b)}, tensors);
        c.read_s += std::chrono::duration<double>(r1 - r0).count();
        c.write_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - r1).count();
        bar.update(++done);
      }
      bar.finish(true);
    }
  }
  if (structure_copied) {  // memmap_like wrote the non-tensors, batch sizes and class already
    c.secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return c;
  }
  // non-tensor leaves, whole (one read each: the preview holds their first row only)
  std::vector<std::pair<td::NestedKey, td::Entry>> values;
  for (const auto& nt : l.non_tensors) values.emplace_back(nt.first, src.td.get_entry(nt.first));
  // sub-TensorDicts whose batch is longer than the root's (from_schema gives every one the root's)
  bool nested_batches = false;
  for (const auto& sb : l.sub_batches) nested_batches = nested_batches || sb.second != l.batch;
  if (kind == DstKind::Memmap && (!values.empty() || nested_batches)) {
    // a memmap directory: set them and rewrite meta.json (the tensor leaves stay where they are); the deepest
    // sub-TensorDicts first, so that each parent's batch stays a prefix of its children's
    td::TensorDict d = dst;
    d.unlock_();
    for (const auto& v : values) d.set(v.first, v.second);
    for (auto it = l.sub_batches.rbegin(); it != l.sub_batches.rend(); ++it)
      if (it->second != l.batch) d.get_entry(it->first).tensordict().set_batch_size(it->second);
    d.memmap_(dst_dir, td::MemmapOptions().existsok(true));
  } else {
    for (const auto& v : values) dst.set(v.first, v.second);
  }
  c.secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return c;
}

}  // namespace

int cmd_convert(const std::string& src_path, const std::string& dst_path, const ConvertOptions& o) {
  // what DST is, and whether it may be replaced (checked before anything is read or written)
  const PathKind pk = is_redis_address(dst_path) ? PathKind::Missing : path_kind(dst_path);
  const DstKind kind = is_redis_address(dst_path)                                          ? DstKind::Redis
                       : has_h5_extension(dst_path) || (pk == PathKind::File && is_hdf5_file(dst_path)) ? DstKind::H5
                                                                                                       : DstKind::Memmap;
  td::RedisOptions ro;
  std::string replace_id;  // Redis: the td_id replaced (--force)
  std::optional<H5ReplaceLock> h5_lock;
  if (kind == DstKind::Redis) {
    ro = td::RedisOptions::from_url(dst_path);
    replace_id = ro.td_id();
    if (o.durable)
      throw ToolError("--durable applies to a memmap or HDF5 DST (a Redis server's persistence is its own "
                      "configuration: appendonly / appendfsync)");
    if (!replace_id.empty() && !o.force)
      throw ToolError("'" + shown(dst_path) +
                      "' names a store (td_id): convert makes a new one (leave td_id out, or --force)");
  } else if (pk != PathKind::Missing) {
    if (!o.force)
      throw ToolError("'" + shown(dst_path) + "' exists (convert writes a new file or directory; --force replaces it)");
    if (pk == PathKind::Other) throw ToolError("'" + shown(dst_path) + "' is not a file or directory");
    if (kind == DstKind::Memmap && pk != PathKind::Directory)
      throw ToolError("'" + shown(dst_path) + "' is a file: not replaced by a memmap directory");
    if (kind == DstKind::H5 && pk != PathKind::File)
      throw ToolError("'" + shown(dst_path) + "' is a directory: not replaced by an HDF5 file");
    if (kind == DstKind::Memmap && path_kind(join_path(dst_path, "meta.json")) != PathKind::File)
      throw ToolError("'" + shown(dst_path) + "' is a directory without meta.json: not replaced");
    if (kind == DstKind::H5) h5_lock.emplace(dst_path);  // refused while another process writes it
  }

  Input src = open_source(src_path);
  if (src.lazy && kind == DstKind::H5) {  // copied as the dense TensorDict its members stack into
    src.td = dense_for_h5(*src.lazy, src_path);
    src.lazy.reset();
    src.kind = InputKind::Redis;  // in memory: rows are copied as they are read
  }
  const Layout l = src.lazy ? Layout{} : layout_of(src.td);
  td::Schema schema;
  for (const auto& s : l.tensors) schema.push_back({s.key, {s.elem, s.dtype}});

  // the sibling: written, closed and checked before it replaces anything. A file-system copy is written inside a
  // memmap save's staging directory beside DST (".NAME.td-stage.PID.RANDOM"), locked for its whole life, so that
  // the next convert or save to DST removes it if this process is killed, and never while it lives
  std::string stage;
  td::RedisOptions stage_ro = ro;
  std::optional<tdb::StagingDir> staging;
  if (kind == DstKind::Redis) {
    stage_ro.td_id(tdb::new_redis_td_id());
  } else {
    staging.emplace(dst_path);  // removes the abandoned siblings of DST first
    if (staging->path().empty())
      throw ToolError("cannot write beside '" + shown(dst_path) + "' (its directory is not writable)");
    stage = join_path(staging->path(), kind == DstKind::H5 ? "data.h5" : "data");
  }
  std::function<void()> dst_close = [] {};
  auto remove_stage = [&] {
    try {
      dst_close();
    } catch (...) {
    }
    try {
      if (kind == DstKind::Redis) {
        td::TensorDictStore::remove(stage_ro.td_id(), ro);
      } else {
        staging.reset();  // the sibling, its contents and its lock file
      }
    } catch (const std::exception& e) {
      std::cerr << "tdx: warning: could not remove the partial copy: " << escape_text(first_line(e.what())) << "\n";
    }
  };
  Copied c;
  std::string address;
  try {
    if (src.lazy) {
      // a lazy stack stays one: a lazy-stack directory (members in 0/, 1/, ...) or a lazy-stack store
      const auto t0 = std::chrono::steady_clock::now();
      const std::string want = lazy_signature(*src.lazy);
      std::vector<td::TensorDict> members;
      for (const auto& m : src.lazy->tensordicts()) {
        members.push_back(m.clone());
        for (const auto& kv : m.items(td::KeysOptions().include_nested(true).leaves_only(true).non_tensor_leaves(true))) {
          ++c.leaves;
          if (kv.second.is_tensor()) c.bytes += static_cast<int64_t>(kv.second.tensor().nbytes());
        }
      }
      td::LazyStackedTensorDict copy(std::move(members), src.lazy->stack_dim());
      std::string got;
      if (kind == DstKind::Redis) {
        td::TensorDictStore::save_lazy_stack(copy, stage_ro);
        got = lazy_signature(td::TensorDictStore::load_lazy_stack(stage_ro.td_id(), stage_ro));
      } else {
        copy.memmap_(stage);
        got = lazy_signature(td::LazyStackedTensorDict::load_memmap(stage, td::LoadOptions().writable(false)));
      }
      if (got != want)
        throw ToolError("the copy's members differ from the source's: nothing was replaced (source:\n" + want +
                        "copy:\n" + got + ")");
      c.secs = c.write_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } else {
      td::TensorDict dst;
      bool like = false;
      if (kind == DstKind::Redis) {
        td::TensorDictStore s = td::TensorDictStore::from_schema(schema, l.batch, stage_ro);
        dst_close = [s] { s.close(); };
        dst = s;
        if (!src.class_path.empty()) s.set_tensorclass(src.class_path);  // Python's __tensorclass__
      } else if (kind == DstKind::H5) {
        if (!src.class_path.empty()) {  // upstream's h5 files record no class (printed with --quiet too)
          std::cerr << "tdx: note: an HDF5 file records no tensorclass: the fields of " << escape_text(src.class_path)
                    << " are copied as a TensorDict\n";
        }
        dst = td::TensorDict::from_schema(schema, l.batch, "h5", td::H5Options().filename(stage).mode("w"));
        td::PersistentTensorDict h5(dst);
        dst_close = [h5] { h5.close(); };
      } else if (src.kind == InputKind::Memmap) {
        // a directory's structure as it is: sub-TensorDicts' batch sizes, a tensorclass, non-tensor values
        dst = src.td.memmap_like(stage);
        like = true;
      } else {
        dst = td::TensorDict::from_schema(schema, l.batch, "memmap",
                                          td::MemmapOptions().prefix(stage).class_path(src.class_path));
      }
      c = copy_rows(src, l, dst, kind, stage, o.quiet, like);
      dst_close();
      dst_close = [] {};
    }  // a memmap copy's mappings are released here, before its directory is renamed
    if (!src.lazy) check_copy(l, src.kind == InputKind::Memmap ? src.td.type_name() : "", stage, kind, stage_ro);
    if (kind == DstKind::Redis) {
      if (!replace_id.empty()) td::TensorDictStore::replace(replace_id, stage_ro.td_id(), ro);
      td::RedisOptions final_ro = ro;
      final_ro.td_id(replace_id.empty() ? stage_ro.td_id() : replace_id);
      if (src.lazy) {
        address = td::TensorDictStore::address_of(final_ro.td_id(), final_ro);
      } else {
        td::TensorDictStore s = td::TensorDictStore::from_store(final_ro.td_id(), final_ro);
        address = s.address();
        s.close();
      }
    } else {
      if (o.durable) sync_tree(staging->path());  // every leaf, meta.json / the .h5 file, their directories
      switch_path_in(stage, dst_path, pk != PathKind::Missing, kind == DstKind::Memmap);
      if (o.durable) tdb::sync_path(parent_of(dst_path), true);  // the rename itself
      staging.reset();  // the old directory an exchange put there, the sibling and its lock
    }
  } catch (...) {
    remove_stage();
    throw;
  }
  src.close();
  if (!address.empty()) std::cout << address << "\n";
  char line[256];
  std::snprintf(line, sizeof line, "%.1f MB/s", c.secs > 0 ? static_cast<double>(c.bytes) / 1e6 / c.secs : 0.0);
  std::cerr << "tdx: converted " << count(c.leaves, "leaf", "leaves") << ", " << human_bytes(c.bytes) << " in "
            << std::fixed << std::setprecision(3) << c.secs << " s: " << line << " (reading " << c.read_s
            << " s, writing " << c.write_s << " s)\n";
  return 0;
}

}  // namespace tdx
