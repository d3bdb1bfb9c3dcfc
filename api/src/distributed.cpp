// TensorDict's send / recv / isend / irecv / init_remote / from_remote_init / broadcast / reduce / all_reduce /
// all_gather on a c10d process group (tensordict/distributed.hpp), in upstream's order and tags:
//  - point to point and reduce: tensor leaves in sorted key order, depth first (a lazy stack member by member),
//    leaf i with tag init_tag + i, or upstream's pseudo-random chain; non-tensor leaves are not sent;
//  - all_reduce: leaves in insertion order;
//  - init_remote / broadcast / all_gather: the consolidated metadata as one object (an int64 length, then its
//    bytes, as torch's send_object_list frames it), then the consolidated storage (tag 0).
// Between our ranks, a checked transfer (DistOptions::checked) first compares the structure (kStructureTag).
#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>

#include <c10/core/CPUAllocator.h>
#include <c10/util/strides.h>

#include "distributed_internal.hpp"
#include "pickle_plain.hpp"
#include "tensordict/backends/memmap_format.hpp"
#include "tensordict/node.hpp"
#include "tensordict/storage_spec.hpp"

namespace tensordict {

namespace {

using dist::Group;
using dist::guarded;
using dist::Pending;
using dist::PendingOp;

//! the tag of the structure messages of a checked transfer (never one of upstream's leaf tags in practice)
constexpr int kStructureTag = 0x7ffffff0;
//! the receiver's answer to a checked transfer's structure (a tag of its own: the sender posts its receive first)
constexpr int kAnswerTag = 0x7ffffff1;
//! bounds what a peer may announce (a structure text, a metadata object)
constexpr int64_t kMaxObjectBytes = int64_t{1} << 30;

//! one tensor leaf to move: where it lives (its level and key) and its value
struct Leaf {
  TensorDict owner;
  std::string key;
  std::string path;  //!< dotted, for messages
  at::Tensor value;
  bool direct = false;  //!< value is the leaf's own contiguous storage (a receive may land in it)
};

void collect(const TensorDict& td, const std::string& prefix, bool sorted, std::vector<Leaf>& out) {
  const auto& node = td.node();
  if (StackMembers sm = node->stack_members()) {
    for (size_t i = 0; i < sm.members->size(); ++i)
      collect((*sm.members)[i], prefix + std::to_string(i) + ".", sorted, out);
    return;
  }
  // every entry of the level (Node::read_all: the tensor leaves in one batched read, a store node's in one request);
  // non-tensor leaves are not sent (upstream)
  auto entries = node->read_all();
  if (sorted) std::sort(entries.begin(), entries.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  const bool views = node->caps().zero_copy_views;
  for (const auto& [key, e] : entries) {
    if (e.is_tensor()) {
      const at::Tensor& t = e.tensor();
      out.push_back({td, key, prefix + key, t, views && t.is_contiguous() && t.device().is_cpu()});
    } else if (e.is_tensordict()) {
      collect(e.tensordict(), prefix + key + ".", sorted, out);
    }
  }
}

std::vector<Leaf> leaves_of(const TensorDict& td, bool sorted) {
  if (!td.defined()) throw RuntimeError("undefined TensorDict");
  std::vector<Leaf> out;
  collect(td, "", sorted, out);
  return out;
}

//! a contiguous CPU tensor with the leaf's bytes (the leaf itself when it is one)
at::Tensor sendable(const at::Tensor& t) {
  at::Tensor v = t.device().is_cpu() ? t : t.cpu();
  return v.is_contiguous() ? v : v.contiguous();
}

//! the next tag of upstream's chain
int64_t next_tag(int64_t tag, bool pseudo_rand) { return pseudo_rand ? dist::int_generator(tag + 1) : tag + 1; }

int tag_int(int64_t tag) {
  if (tag < 0 || tag > 0x7fffffef) throw ValueError("tag " + std::to_string(tag) + " is out of range");
  return static_cast<int>(tag);
}

std::string shape_str(at::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

//! the structure of a transfer: a line per leaf, "path\tdtype\tshape", in send order
std::string signature(const std::vector<Leaf>& leaves) {
  std::string s;
  for (const Leaf& l : leaves)
    s += l.path + "\t" + backends::dtype_to_string(l.value.scalar_type()) + "\t" + shape_str(l.value.sizes()) + "\n";
  return s;
}

std::vector<std::array<std::string, 3>> parse_signature(const std::string& s) {
  std::vector<std::array<std::string, 3>> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t nl = s.find('\n', pos);
    if (nl == std::string::npos) nl = s.size();
    std::string line = s.substr(pos, nl - pos);
    size_t t1 = line.find('\t'), t2 = line.find('\t', t1 == std::string::npos ? 0 : t1 + 1);
    if (t1 == std::string::npos) break;
    if (t2 == std::string::npos)  // a consolidated record's line: the key and its description
      out.push_back({line.substr(0, t1), line.substr(t1 + 1), ""});
    else
      out.push_back({line.substr(0, t1), line.substr(t1 + 1, t2 - t1 - 1), line.substr(t2 + 1)});
    pos = nl + 1;
  }
  return out;
}

at::Tensor bytes_tensor(const std::string& s) {
  at::Tensor t = at::empty({static_cast<int64_t>(s.size())}, at::kByte);
  if (!s.empty()) std::memcpy(t.data_ptr<uint8_t>(), s.data(), s.size());
  return t;
}

std::string tensor_bytes(const at::Tensor& t) {
  return std::string(reinterpret_cast<const char*>(t.data_ptr<uint8_t>()), static_cast<size_t>(t.numel()));
}

std::string rank_str(int r) { return "rank " + std::to_string(r); }

// ---------------------------------------------------------------- point-to-point primitives

void send_now(c10d::ProcessGroupGloo& pg, at::Tensor t, int dst, int tag, const std::string& what) {
  std::vector<at::Tensor> v{std::move(t)};
  guarded(what, [&] { pg.send(v, dst, tag)->wait(); });
}

void recv_now(c10d::ProcessGroupGloo& pg, at::Tensor t, int src, int tag, const std::string& what) {
  std::vector<at::Tensor> v{std::move(t)};
  guarded(what, [&] { pg.recv(v, src, tag)->wait(); });
}

//! an object as torch's send_object_list frames it: its length (int64 [1]), then its bytes (uint8)
void send_object(c10d::ProcessGroupGloo& pg, const std::string& bytes, int dst, int tag, const std::string& what) {
  at::Tensor len = at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong);
  send_now(pg, len, dst, tag, what);
  send_now(pg, bytes_tensor(bytes), dst, tag, what);
}

std::string recv_object(c10d::ProcessGroupGloo& pg, int src, int tag, const std::string& what) {
  at::Tensor len = at::zeros({1}, at::kLong);
  recv_now(pg, len, src, tag, what);
  const int64_t n = len.item<int64_t>();
  if (n < 0 || n > kMaxObjectBytes)
    throw DistributedError(what + ": " + rank_str(src) + " announced an object of " + std::to_string(n) + " bytes");
  at::Tensor body = at::empty({n}, at::kByte);
  recv_now(pg, body, src, tag, what);
  return tensor_bytes(body);
}

//! a hash of the structure every collective rank must share (FNV-1a of its signature)
int64_t structure_hash(const std::string& sig) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : sig) h = (h ^ c) * 1099511628211ULL;
  return static_cast<int64_t>(h >> 1);
}

// A checked transfer costs one round trip before any data moves. The sender sends a digest of its structure
// (int64 [hash, length]) and waits; the receiver takes it and, when the structures agree, posts its receives and
// then answers int64 [0], so that the sender posts its leaves into receives already waiting (gloo moves data
// ~15-30% slower when a send is posted before its receive; bench_distributed). On a mismatch the receiver answers
// [1] without posting anything: the sender then sends its whole structure, the receiver answers with the reason,
// and both throw. Nothing is written.

//! the sender's side of a checked transfer (before it posts anything)
void offer_structure(c10d::ProcessGroupGloo& pg, const std::string& sig, int dst, const std::string& what) {
  // the answer's receive is posted first: it waits for the answer, not the answer for it
  std::vector<at::Tensor> answer{at::zeros({1}, at::kLong)};
  c10::intrusive_ptr<c10d::Work> w;
  guarded(what + " (the receiver's answer)", [&] { w = pg.recv(answer, dst, kAnswerTag); });
  at::Tensor digest = at::tensor({structure_hash(sig), static_cast<int64_t>(sig.size())}, at::kLong);
  send_now(pg, digest, dst, kStructureTag, what + " (its structure)");
  guarded(what + " (the receiver's answer)", [&] { w->wait(); });
  if (answer[0].data_ptr<int64_t>()[0] == 0) return;
  send_object(pg, sig, dst, kStructureTag, what + " (its whole structure)");
  const std::string reason = recv_object(pg, dst, kStructureTag, what + " (the receiver's reason)");
  throw DistributedError(what + ": " + rank_str(dst) + " refused the transfer: " + reason);
}

//! the receiver's side: compares the sender's structure with its own. When they agree it returns (with
//! `answer_now`, after answering; without, the caller posts its receives and then calls answer_same). A mismatch is
//! answered and thrown as a typed error naming the first key that differs.
void accept_structure(c10d::ProcessGroupGloo& pg, const std::string& mine, int src, const std::string& what,
                      std::chrono::milliseconds timeout, bool answer_now = true) {
  at::Tensor digest = at::zeros({2}, at::kLong);
  try {
    recv_now(pg, digest, src, kStructureTag, what + " (the sender's structure)");
  } catch (const DistributedError& e) {
    throw DistributedError(e.message() + " [a checked receive waits for the sender's structure for " +
                           std::to_string(timeout.count()) + " ms; a Python rank or a DistOptions().checked(false) "
                           "sender sends none: receive with checked(false)]");
  }
  const int64_t* d = digest.data_ptr<int64_t>();
  const bool same = d[0] == structure_hash(mine) && d[1] == static_cast<int64_t>(mine.size());
  if (same && !answer_now) return;
  send_now(pg, at::full({1}, same ? int64_t{0} : int64_t{1}, at::kLong), src, kAnswerTag, what + " (the answer)");
  if (same) return;
  const std::string theirs = recv_object(pg, src, kStructureTag, what + " (the sender's whole structure)");
  auto a = parse_signature(theirs), b = parse_signature(mine);
  std::string msg;
  ErrorCode code = ErrorCode::Key;
  for (size_t i = 0; i < std::max(a.size(), b.size()) && msg.empty(); ++i) {
    if (i >= a.size()) {
      msg = "the key '" + b[i][0] + "' is not sent by " + rank_str(src);
    } else if (i >= b.size() || a[i][0] != b[i][0]) {
      msg = "the key '" + a[i][0] + "' sent by " + rank_str(src) + " is not a tensor leaf here" +
            (i < b.size() ? " (next here: '" + b[i][0] + "')" : "");
    } else if (a[i][1] != b[i][1]) {
      code = ErrorCode::Type;
      msg = "the key '" + a[i][0] + "' is " + a[i][1] + " on " + rank_str(src) + " and " + b[i][1] + " here";
    } else if (a[i][2] != b[i][2]) {
      code = ErrorCode::Value;
      msg = "the key '" + a[i][0] + "' has shape " + a[i][2] + " on " + rank_str(src) + " and " + b[i][2] + " here";
    }
  }
  if (msg.empty()) msg = "the structures differ";
  send_object(pg, msg, src, kStructureTag, what + " (the reason)");
  msg = what + ": " + msg + "; nothing was received";
  if (code == ErrorCode::Type) throw TypeError(msg);
  if (code == ErrorCode::Value) throw ValueError(msg);
  throw KeyError(msg);
}

//! writes received values into their leaves (after every receive succeeded)
void write_back(const Leaf& l, const at::Tensor& received) {
  if (l.direct) {
    if (received.data_ptr() != l.value.data_ptr()) l.value.copy_(received);
  } else {
    TensorDict owner = l.owner;
    owner.set_(l.key, received);
  }
}

// ---------------------------------------------------------------- staged receives without a copy
// A staged receive lands in buffers of its own. A leaf that is the sole owner of a plain CPU storage (not a view
// of another tensor, not a memmap or shared-memory mapping) then takes the buffer's storage over (set_: every
// handle on the leaf sees the new values, as with a copy) and its old storage becomes a buffer of the group's
// pool for the next receive of that size. Other leaves are copied into.

bool swappable(const Leaf& l) {
  if (!l.direct) return false;
  const at::Tensor& t = l.value;
  const c10::Storage& st = t.storage();
  return t.storage_offset() == 0 && t.is_contiguous() && st.use_count() == 1 && st.allocator() == c10::GetCPUAllocator() &&
         st.nbytes() == static_cast<size_t>(t.numel()) * t.element_size();
}

at::Tensor staging_buffer(Group::Impl& g, const at::Tensor& like) {
  const size_t n = static_cast<size_t>(like.numel()) * like.element_size();
  c10::Storage st;
  {
    std::lock_guard<std::mutex> lock(g.staging_mu);
    auto it = g.staging.find(n);
    if (it != g.staging.end()) {
      st = std::move(it->second);
      g.staging.erase(it);
      g.staging_bytes -= n;
    }
  }
  at::TensorOptions opts = like.options().device(at::kCPU);
  if (!st) return at::empty(like.sizes(), opts);
  return at::empty({0}, opts).set_(st, 0, like.sizes(), c10::contiguous_strides(like.sizes()));
}

//! the receiver's agreeing answer, posted once its receives are (waited for beside them)
c10::intrusive_ptr<c10d::Work> answer_same(c10d::ProcessGroupGloo& pg, std::vector<at::Tensor>& keep, int src,
                                           const std::string& what) {
  keep = {at::zeros({1}, at::kLong)};
  c10::intrusive_ptr<c10d::Work> w;
  guarded(what + " (the answer)", [&] { w = pg.send(keep, src, kAnswerTag); });
  return w;
}

//! the received buffer into its leaf: the leaf takes the buffer's storage over (its old one goes to the pool), or
//! the bytes are copied
void land(Group::Impl& g, const Leaf& l, const at::Tensor& buf) {
  // received straight into the leaf (not staged): nothing to land, and the leaf's storage is not the pool's
  if (l.direct && buf.storage().is_alias_of(l.value.storage())) return;
  if (!swappable(l) || buf.storage().use_count() != 1) {
    write_back(l, buf);
    return;
  }
  c10::Storage old = l.value.storage();
  {
    at::NoGradGuard no_grad;
    at::Tensor leaf = l.value;
    leaf.set_(buf);
  }
  const size_t n = old.nbytes();
  std::lock_guard<std::mutex> lock(g.staging_mu);
  if (g.staging_bytes + n <= Group::Impl::kMaxStagingBytes) {
    g.staging.emplace(n, std::move(old));
    g.staging_bytes += n;
  }
}

//! the structure of a consolidated record: every leaf's path, dtype, shape and bytes, and the total
void record_signature(const JsonValue& rec, const std::string& prefix, std::string& out) {
  if (!rec.is_object()) return;
  if (const JsonValue* leaves = rec.find("leaves"); leaves && leaves->is_object())
    for (const auto& [k, v] : leaves->as_object()) out += prefix + k + "\t" + v.dump() + "\n";
  for (const auto& [k, v] : rec.as_object()) {
    if (k == "cls" || k == "non_tensors" || k == "leaves" || k == "cls_metadata" || k.rfind('_', 0) == 0) continue;
    record_signature(v, prefix + k + ".", out);
  }
}

std::string consolidated_signature(const TensorDict& td) {
  std::string s;
  record_signature(td.consolidated_metadata(), "", s);
  // last: a mismatch then names the first leaf that differs, not the total
  return s + "(the consolidated storage's bytes)\t" + std::to_string(td.consolidated_storage().numel()) + "\n";
}

//! the storage spec of td when it is to travel by spec (our ranks, a storage other processes can open)
std::optional<StorageSpec> spec_to_send(const TensorDict& td, const DistOptions& o) {
  if (!o.by_spec() || o.pickle_metadata()) return std::nullopt;
  if (td.node()->storage_spec().empty() && !td.node()->stack_members()) return std::nullopt;
  try {
    return StorageSpec::of(td);
  } catch (const ValueError&) {
    return std::nullopt;  // in-memory members of a stack: by value
  }
}

//! the metadata object of a TensorDict sent by spec: the spec, and no storage bytes
std::string spec_metadata(const StorageSpec& spec) {
  return JsonValue(JsonValue::Object{{"_storage_spec", spec.json()}, {"_total_bytes", 0}}).dump();
}

//! the metadata record to send: consolidated metadata with upstream's extra keys, as JSON or a plain pickle
std::string metadata_bytes(const TensorDict& td_c, const DistOptions& o) {
  JsonValue meta = td_c.consolidated_metadata();
  meta.as_object().emplace_back("_total_bytes", static_cast<long long>(td_c.consolidated_storage().numel()));
  meta.as_object().emplace_back("_storage_device", "cpu");
  return o.pickle_metadata() ? pickle::dump_plain(meta) : meta.dump();
}

//! parses a received metadata record (our JSON, or a Python rank's pickle of plain data); pops the extra keys
JsonValue parse_metadata(const std::string& bytes, int64_t& total, const std::string& what) {
  JsonValue meta;
  try {
    meta = !bytes.empty() && static_cast<unsigned char>(bytes[0]) == 0x80 ? pickle::load_plain(bytes) : JsonValue::parse(bytes);
  } catch (const Error& e) {
    throw FormatError(what + ": the metadata is neither JSON nor a pickle of plain data (" + e.message() + ")");
  }
  if (!meta.is_object()) throw FormatError(what + ": the metadata is not a dict");
  total = -1;
  auto& obj = meta.as_object();
  for (auto it = obj.begin(); it != obj.end();) {
    if (it->first == "_total_bytes" && it->second.is_int()) total = it->second.as_int();
    if (it->first == "_total_bytes" || it->first == "_storage_device" || it->first == "_tensorclass_type" ||
        it->first == "_max_bytes")
      it = obj.erase(it);
    else
      ++it;
  }
  if (total < 0 || total > (int64_t{1} << 44)) throw FormatError(what + ": the metadata has no valid _total_bytes");
  return meta;
}

//! the TensorDict a received record describes: the storage its spec names, or the consolidated storage
TensorDict rebuilt(const JsonValue& meta, const at::Tensor& storage) {
  if (const JsonValue* spec = meta.find("_storage_spec")) return open_storage(StorageSpec::parse(spec->dump()));
  return TensorDict::from_consolidated(storage, meta);
}


//! checked collectives: every rank's structure must be rank 0's (a small all_gather of hashes)
void check_collective(c10d::ProcessGroupGloo& pg, const Group& g, const std::string& sig, const std::string& what) {
  std::vector<at::Tensor> mine{at::full({1}, structure_hash(sig), at::kLong)};
  std::vector<std::vector<at::Tensor>> all(1);
  for (int r = 0; r < g.size(); ++r) all[0].push_back(at::zeros({1}, at::kLong));
  guarded(what + " (structure check)", [&] { pg.allgather(all, mine)->wait(); });
  for (int r = 1; r < g.size(); ++r) {
    if (all[0][r].item<int64_t>() != all[0][0].item<int64_t>())
      throw ValueError(what + ": the TensorDict of " + rank_str(r) + " has another structure (keys, dtypes or shapes) "
                       "than rank 0's; nothing was reduced");
  }
}

//! what gloo reduces for a leaf: the leaf itself (its dtypes), or a float32 / int32 copy of a bfloat16 / int16
//! leaf, or the real view of a complex leaf (Sum only); TypeError naming the key otherwise. `back` writes the
//! result into the leaf once reduced (nullptr when the reduction happened in the leaf itself)
struct Reducible {
  at::Tensor t;
  std::function<void()> back;
};

Reducible reducible(const Leaf& l, dist::ReduceOp op, bool writes, const std::string& what) {
  const at::ScalarType dt = l.value.scalar_type();
  at::Tensor base = l.direct ? l.value : sendable(l.value).clone();
  auto back_of = [&](const at::Tensor& t) -> std::function<void()> {
    if (!writes) return nullptr;
    if (l.direct && t.data_ptr() == l.value.data_ptr()) return nullptr;
    return [l, t] { write_back(l, t.scalar_type() == l.value.scalar_type() ? t : t.to(l.value.scalar_type())); };
  };
  switch (dt) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kChar: case at::kByte: case at::kInt:
    case at::kLong: case at::kBool:
      return {base, back_of(base)};
    case at::kBFloat16: {
      at::Tensor t = base.to(at::kFloat);
      return {t, back_of(t)};
    }
    case at::kShort: {
      at::Tensor t = base.to(at::kInt);
      return {t, back_of(t)};
    }
    case at::kComplexFloat: case at::kComplexDouble:
      if (op != dist::ReduceOp::Sum)
        throw TypeError(what + ": the leaf '" + l.path + "' is complex, which only Sum reduces");
      return {at::view_as_real(base), back_of(base)};
    default:
      throw TypeError(what + ": the leaf '" + l.path + "' is " + backends::dtype_to_string(dt) + ", which gloo cannot reduce");
  }
}

Pending make_pending(std::vector<PendingOp> ops, std::optional<int64_t> tag, std::shared_ptr<Group> g) {
  auto st = std::make_unique<Pending::State>();
  for (PendingOp& op : ops)
    for (const at::Tensor& t : op.keep)
      if (t.defined() && t.has_storage()) op.storages.push_back(t.storage());
  st->ops = std::move(ops);
  st->tag = tag;
  st->group = std::move(g);
  return Pending(std::move(st));
}

std::string peer_what(const char* op, const char* dir, int peer) {
  return std::string(op) + " " + dir + " " + rank_str(peer);
}

void check_peer(const Group& g, int peer, const char* op) {
  if (peer < 0 || peer >= g.size())
    throw ValueError(std::string(op) + ": rank " + std::to_string(peer) + " is not in the group (size " +
                     std::to_string(g.size()) + ")");
  if (peer == g.rank()) throw ValueError(std::string(op) + ": rank " + std::to_string(peer) + " is this rank");
}

}  // namespace

// ------------------------------------------------------------------ send / recv

void TensorDict::send(int dst, const DistOptions& o) const {
  auto g = dist::group_of(o);
  check_peer(*g, dst, "send");
  auto& pg = g->impl().get("send");
  const std::string what = peer_what("send", "to", dst);
  if (o.consolidated()) {
    TensorDict td_c = is_consolidated() ? *this : consolidate();
    if (o.checked()) offer_structure(pg, consolidated_signature(td_c), dst, what);
    send_now(pg, td_c.consolidated_storage(), dst, 0, what + " (the consolidated storage)");
    return;
  }
  std::vector<Leaf> leaves = leaves_of(*this, true);
  if (o.checked()) offer_structure(pg, signature(leaves), dst, what);
  // every leaf posted at once (gloo matches them by tag), then waited for: the order of tags is upstream's
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  std::vector<std::vector<at::Tensor>> bufs;
  bufs.reserve(leaves.size());
  int64_t tag = o.init_tag() - 1;
  guarded(what, [&] {
    for (const Leaf& l : leaves) {
      tag = next_tag(tag, o.pseudo_rand());
      bufs.push_back({sendable(l.value)});
      works.push_back(pg.send(bufs.back(), dst, tag_int(tag)));
    }
  });
  for (size_t i = 0; i < works.size(); ++i)
    guarded(what + ": the leaf '" + leaves[i].path + "'", [&] { works[i]->wait(); });
}

std::optional<int64_t> TensorDict::recv(int src, const DistOptions& o) {
  auto g = dist::group_of(o);
  check_peer(*g, src, "recv");
  auto& pg = g->impl().get("recv");
  const std::string what = peer_what("recv", "from", src);
  std::vector<at::Tensor> answer_keep;
  c10::intrusive_ptr<c10d::Work> answer;
  if (o.consolidated()) {
    if (!is_consolidated())
      throw ValueError("recv(consolidated): this TensorDict is not consolidated (make it with consolidate() or "
                       "from_remote_init, with the sender's structure)");
    if (o.checked()) accept_structure(pg, consolidated_signature(*this), src, what, g->timeout(), false);
    at::Tensor storage = consolidated_storage();
    std::vector<at::Tensor> buf{o.staged() ? at::empty_like(storage) : storage};
    c10::intrusive_ptr<c10d::Work> w;
    guarded(what, [&] { w = pg.recv(buf, src, 0); });
    if (o.checked()) answer = answer_same(pg, answer_keep, src, what);
    guarded(what + " (the consolidated storage)", [&] { w->wait(); });
    if (answer) guarded(what + " (the answer)", [&] { answer->wait(); });
    if (o.staged()) std::memcpy(storage.data_ptr(), buf[0].data_ptr(), static_cast<size_t>(storage.numel()));
    return std::nullopt;
  }
  std::vector<Leaf> leaves = leaves_of(*this, true);
  if (o.checked()) accept_structure(pg, signature(leaves), src, what, g->timeout(), false);
  std::vector<std::vector<at::Tensor>> bufs;
  bufs.reserve(leaves.size());
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  int64_t tag = o.init_tag() - 1;
  guarded(what, [&] {
    for (const Leaf& l : leaves) {
      tag = next_tag(tag, o.pseudo_rand());
      at::Tensor into = !o.staged() && l.direct ? l.value : staging_buffer(g->impl(), l.value);
      bufs.push_back({into});
      works.push_back(pg.recv(bufs.back(), src, tag_int(tag)));
    }
  });
  if (o.checked()) answer = answer_same(pg, answer_keep, src, what);
  std::exception_ptr first;
  for (size_t i = 0; i < works.size(); ++i) {
    try {
      guarded(what + ": the leaf '" + leaves[i].path + "'", [&] { works[i]->wait(); });
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (answer && !first) {
    try {
      guarded(what + " (the answer)", [&] { answer->wait(); });
    } catch (...) {
      first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);  // staged: nothing was written
  works.clear();  // a finished Work still holds its tensor
  for (size_t i = 0; i < leaves.size(); ++i) {
    at::Tensor buf = std::move(bufs[i][0]);
    bufs[i].clear();
    land(g->impl(), leaves[i], buf);
  }
  return tag;
}

namespace {

//! isend / irecv: every leaf posted (irecv: into the leaf itself where it is contiguous, else into a buffer
//! written back when its receive completes), returned pending
Pending post_leaves(const TensorDict& td, int peer, bool sending, const DistOptions& o) {
  const char* op_name = sending ? "isend" : "irecv";
  auto g = dist::group_of(o);
  check_peer(*g, peer, op_name);
  auto& pg = g->impl().get(op_name);
  const std::string what = peer_what(op_name, sending ? "to" : "from", peer);
  std::vector<Leaf> leaves = leaves_of(td, true);
  if (o.checked()) {
    if (sending) offer_structure(pg, signature(leaves), peer, what);
    else accept_structure(pg, signature(leaves), peer, what, g->timeout());
  }
  std::vector<PendingOp> ops;
  int64_t tag = o.init_tag() - 1;
  guarded(what, [&] {
    for (const Leaf& l : leaves) {
      tag = next_tag(tag, o.pseudo_rand());
      PendingOp op;
      op.what = what + ": the leaf '" + l.path + "' (tag " + std::to_string(tag) + ")";
      if (sending) {
        op.keep = {sendable(l.value)};
        op.work = pg.send(op.keep, peer, tag_int(tag));
      } else {
        at::Tensor into = l.direct ? l.value : at::empty(l.value.sizes(), l.value.options().device(at::kCPU));
        op.keep = {into};
        if (!l.direct) op.on_done = [l, into] { write_back(l, into); };
        op.work = pg.recv(op.keep, peer, tag_int(tag));
      }
      ops.push_back(std::move(op));
    }
  });
  return make_pending(std::move(ops), tag, g);
}

}  // namespace

Pending TensorDict::isend(int dst, const DistOptions& o) const { return post_leaves(*this, dst, true, o); }

Pending TensorDict::irecv(int src, const DistOptions& o) { return post_leaves(*this, src, false, o); }

// ------------------------------------------------------------------ init_remote / broadcast / all_gather

void TensorDict::init_remote(int dst, const DistOptions& o) const {
  if (o.use_broadcast()) {
    auto g = dist::group_of(o);
    (void)broadcast(g->rank(), o);
    return;
  }
  auto g = dist::group_of(o);
  check_peer(*g, dst, "init_remote");
  auto& pg = g->impl().get("init_remote");
  const std::string what = peer_what("init_remote", "to", dst);
  if (auto spec = spec_to_send(*this, o)) {
    send_object(pg, spec_metadata(*spec), dst, 0, what + " (the storage spec)");
    send_now(pg, at::empty({0}, at::kByte), dst, 0, what + " (no storage bytes)");
    return;
  }
  TensorDict td_c = consolidate();
  send_object(pg, metadata_bytes(td_c, o), dst, 0, what + " (the metadata)");
  send_now(pg, td_c.consolidated_storage(), dst, 0, what + " (the storage)");
}

TensorDict TensorDict::from_remote_init(int src, const DistOptions& o) {
  if (o.use_broadcast()) return TensorDict(BatchSize{}).broadcast(src, o);
  auto g = dist::group_of(o);
  check_peer(*g, src, "from_remote_init");
  auto& pg = g->impl().get("from_remote_init");
  const std::string what = peer_what("from_remote_init", "from", src);
  int64_t total = 0;
  JsonValue meta = parse_metadata(recv_object(pg, src, 0, what + " (the metadata)"), total, what);
  at::Tensor storage = at::empty({total}, at::kByte);
  recv_now(pg, storage, src, 0, what + " (the storage)");
  return rebuilt(meta, storage);
}

TensorDict TensorDict::broadcast(int src, const DistOptions& o) const {
  auto g = dist::group_of(o);
  if (src < 0 || src >= g->size()) throw ValueError("broadcast: rank " + std::to_string(src) + " is not in the group");
  auto& pg = g->impl().get("broadcast");
  const std::string what = "broadcast from " + rank_str(src);
  auto bcast = [&](at::Tensor t, const std::string& part) {
    std::vector<at::Tensor> v{std::move(t)};
    c10d::BroadcastOptions bo;
    bo.rootRank = src;
    guarded(what + " (" + part + ")", [&] { pg.broadcast(v, bo)->wait(); });
  };
  if (g->rank() == src) {
    auto spec = spec_to_send(*this, o);
    TensorDict td_c = spec ? *this : consolidate();
    const std::string meta = spec ? spec_metadata(*spec) : metadata_bytes(td_c, o);
    bcast(at::full({1}, static_cast<int64_t>(meta.size()), at::kLong), "the metadata length");
    bcast(bytes_tensor(meta), "the metadata");
    bcast(spec ? at::empty({0}, at::kByte) : td_c.consolidated_storage(), "the storage");
    return td_c;
  }
  at::Tensor len = at::zeros({1}, at::kLong);
  bcast(len, "the metadata length");
  const int64_t n = len.item<int64_t>();
  if (n < 0 || n > kMaxObjectBytes) throw DistributedError(what + ": an object of " + std::to_string(n) + " bytes");
  at::Tensor body = at::empty({n}, at::kByte);
  bcast(body, "the metadata");
  int64_t total = 0;
  JsonValue meta = parse_metadata(tensor_bytes(body), total, what);
  at::Tensor storage = at::empty({total}, at::kByte);
  bcast(storage, "the storage");
  return rebuilt(meta, storage);
}

std::vector<TensorDict> TensorDict::all_gather(const DistOptions& o) const {
  auto g = dist::group_of(o);
  auto& pg = g->impl().get("all_gather");
  const std::string what = "all_gather";
  const int n = g->size();
  auto gather = [&](const at::Tensor& mine, int64_t each, const std::string& part) {
    std::vector<std::vector<at::Tensor>> out(1);
    for (int r = 0; r < n; ++r) out[0].push_back(at::zeros({each}, mine.options()));
    std::vector<at::Tensor> in{mine};
    guarded(what + " (" + part + ")", [&] { pg.allgather(out, in)->wait(); });
    return out[0];
  };
  TensorDict td_c = consolidate();
  const std::string meta = metadata_bytes(td_c, o);
  // all_gather_object's framing: the lengths, then the objects padded to the longest; then the storages padded
  auto lens = gather(at::full({1}, static_cast<int64_t>(meta.size()), at::kLong), 1, "the metadata lengths");
  int64_t max_len = 0;
  for (auto& t : lens) max_len = std::max(max_len, t.item<int64_t>());
  if (max_len > kMaxObjectBytes) throw DistributedError(what + ": a metadata object of " + std::to_string(max_len) + " bytes");
  at::Tensor padded = at::zeros({max_len}, at::kByte);
  std::memcpy(padded.data_ptr(), meta.data(), meta.size());
  auto metas = gather(padded, max_len, "the metadata");
  std::vector<JsonValue> records;
  std::vector<int64_t> totals;
  int64_t max_total = 0;
  for (int r = 0; r < n; ++r) {
    const int64_t len = lens[r].item<int64_t>();
    if (len < 0 || len > max_len) throw DistributedError(what + ": " + rank_str(r) + " announced " + std::to_string(len) + " bytes");
    int64_t total = 0;
    records.push_back(parse_metadata(tensor_bytes(metas[r].narrow(0, 0, len)), total, what + " of " + rank_str(r)));
    totals.push_back(total);
    max_total = std::max(max_total, total);
  }
  at::Tensor mine = at::zeros({max_total}, at::kByte);
  at::Tensor own = td_c.consolidated_storage();
  if (own.numel()) std::memcpy(mine.data_ptr(), own.data_ptr(), static_cast<size_t>(own.numel()));
  auto storages = gather(mine, max_total, "the storages");
  std::vector<TensorDict> out;
  for (int r = 0; r < n; ++r) out.push_back(from_consolidated(storages[r].narrow(0, 0, totals[r]).clone(), records[r]));
  return out;
}

// ------------------------------------------------------------------ reduce / all_reduce

namespace {

//! reduce into `dst` (sorted leaves, as upstream's reduce) or, without a dst, all_reduce (insertion order)
Pending reduce_leaves(TensorDict& td, std::optional<int> dst, dist::ReduceOp op, const DistOptions& o) {
  auto g = dist::group_of(o);
  if (dst && (*dst < 0 || *dst >= g->size())) throw ValueError("reduce: rank " + std::to_string(*dst) + " is not in the group");
  auto& pg = g->impl().get(dst ? "reduce" : "all_reduce");
  std::vector<Leaf> leaves = leaves_of(td, /*sorted=*/dst.has_value());
  const std::string what = dst ? "reduce to " + rank_str(*dst) : std::string("all_reduce");
  std::vector<Reducible> rs;
  for (const Leaf& l : leaves) rs.push_back(reducible(l, op, !dst || g->rank() == *dst, what));
  if (o.checked()) check_collective(pg, *g, signature(leaves), what);
  std::vector<PendingOp> ops;
  guarded(what, [&] {
    for (size_t i = 0; i < leaves.size(); ++i) {
      PendingOp p;
      p.keep = {rs[i].t};
      p.what = what + ": the leaf '" + leaves[i].path + "'";
      p.on_done = rs[i].back;
      if (dst) {
        c10d::ReduceOptions ro;
        ro.rootRank = *dst;
        ro.reduceOp = dist::to_c10d(op);
        p.work = pg.reduce(p.keep, ro);
      } else {
        c10d::AllreduceOptions ao;
        ao.reduceOp = dist::to_c10d(op);
        p.work = pg.allreduce(p.keep, ao);
      }
      ops.push_back(std::move(p));
    }
  });
  Pending pending = make_pending(std::move(ops), std::nullopt, g);
  if (!o.async_op()) pending.wait_all();
  return pending;
}

}  // namespace

Pending TensorDict::reduce(int dst, dist::ReduceOp op, const DistOptions& o) { return reduce_leaves(*this, dst, op, o); }

Pending TensorDict::all_reduce(dist::ReduceOp op, const DistOptions& o) { return reduce_leaves(*this, std::nullopt, op, o); }

}  // namespace tensordict
