// Shared-memory handles: the bytes that name a tensor or a TensorDict in segments (share_handle), their
// binary format ("TDSH", checked field by field when parsed), and opening them in another process.
#include <map>
#include <set>

#include "shm_internal.hpp"
#include "tensordict/errors.hpp"

namespace tensordict::backends {

using namespace shm_internal;

namespace {

// ---------------------------------------------------------------------------------------------------
// binary (de)serialization

constexpr char kMagic[4] = {'T', 'D', 'S', 'H'};
constexpr uint8_t kVersion = 1;
constexpr uint8_t kKindTensor = 1;
constexpr uint8_t kKindTensorDict = 2;

class Writer {
 public:
  void u8(uint8_t v) { out_.push_back(char(v)); }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out_.push_back(char((v >> (8 * i)) & 0xff));
  }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(char((v >> (8 * i)) & 0xff));
  }
  void i64(int64_t v) { u64(uint64_t(v)); }
  void count(size_t n) {
    if (n > UINT32_MAX) throw ValueError("shm handle: too many items to serialize");
    u32(uint32_t(n));
  }
  void str(const std::string& s) {
    count(s.size());
    out_ += s;
  }
  void header(uint8_t kind) {
    out_.append(kMagic, 4);
    u8(kVersion);
    u8(kind);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const std::string& in) : in_(in) {}
  [[noreturn]] void fail(const std::string& why) const {
    throw FormatError("malformed shm handle at byte " + std::to_string(pos_) + ": " + why);
  }
  size_t remaining() const { return in_.size() - pos_; }
  void need(size_t n) const {
    if (remaining() < n) fail("truncated (need " + std::to_string(n) + " more bytes)");
  }
  uint8_t u8() {
    need(1);
    return uint8_t(in_[pos_++]);
  }
  uint32_t u32() {
    need(4);
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(uint8_t(in_[pos_++])) << (8 * i);
    return v;
  }
  uint64_t u64() {
    need(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t(uint8_t(in_[pos_++])) << (8 * i);
    return v;
  }
  int64_t i64() { return int64_t(u64()); }
  // a count of items each at least min_item_bytes long
  uint32_t count(size_t min_item_bytes) {
    uint32_t n = u32();
    if (min_item_bytes && uint64_t(n) * min_item_bytes > remaining())
      fail("truncated or corrupt: count " + std::to_string(n) + " needs at least " +
           std::to_string(uint64_t(n) * min_item_bytes) + " bytes, " + std::to_string(remaining()) + " remain");
    return n;
  }
  std::string str() {
    uint32_t n = count(1);
    std::string s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  void header(uint8_t kind) {
    need(6);
    if (std::memcmp(in_.data(), kMagic, 4) != 0) fail("bad magic (expected \"TDSH\")");
    pos_ = 4;
    uint8_t v = u8();
    if (v != kVersion) fail("unsupported version " + std::to_string(v));
    uint8_t k = u8();
    if (k != kind)
      fail("wrong handle kind " + std::to_string(k) + " (expected " + std::to_string(kind) + ")");
  }
  void end() const {
    if (remaining() != 0) fail(std::to_string(remaining()) + " trailing bytes");
  }

 private:
  const std::string& in_;
  size_t pos_ = 0;
};

void write_tensor_body(Writer& w, const ShmTensorHandle& h) {
  w.u64(h.offset);
  w.str(dtype_name(h.dtype));
  w.count(h.shape.size());
  for (int64_t d : h.shape) w.i64(d);
}

void read_tensor_body(Reader& r, ShmTensorHandle& h) {
  h.offset = r.u64();
  std::string dt = r.str();
  bool found = false;
  for (const auto& d : kDtypes)
    if (dt == d.name) {
      h.dtype = d.type;
      found = true;
    }
  if (!found) r.fail("unknown dtype '" + dt + "'");
  uint32_t ndim = r.count(8);
  if (ndim > kMaxDims) r.fail("more than " + std::to_string(kMaxDims) + " dims");
  h.shape.resize(ndim);
  for (auto& d : h.shape) d = r.i64();
  uint64_t nbytes = 0;
  std::string problem = extent_problem(h.offset, h.dtype, h.shape, &nbytes);
  if (!problem.empty()) r.fail(problem);
}

void check_segment_name(Reader& r, const std::string& name) {
  std::string problem = name_problem(name);
  if (!problem.empty()) r.fail(problem);
}

}  // namespace

// =====================================================================================================
// handles

uint64_t ShmTensorHandle::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= uint64_t(d < 0 ? 0 : d);
  return n;
}

uint64_t ShmTensorHandle::nbytes() const { return numel() * c10::elementSize(dtype); }

bool ShmTensorHandle::operator==(const ShmTensorHandle& o) const {
  return segment == o.segment && offset == o.offset && dtype == o.dtype && shape == o.shape;
}

std::vector<std::string> ShmTensorDictHandle::segments() const {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const auto& e : entries)
    if (seen.insert(e.tensor.segment).second) out.push_back(e.tensor.segment);
  return out;
}

std::string serialize(const ShmTensorHandle& h) {
  Writer w;
  w.header(kKindTensor);
  w.str(h.segment);
  write_tensor_body(w, h);
  return w.take();
}

std::string serialize(const ShmTensorDictHandle& h) {
  Writer w;
  w.header(kKindTensorDict);
  w.count(h.batch_size.size());
  for (int64_t d : h.batch_size) w.i64(d);
  std::vector<std::string> segs = h.segments();
  std::map<std::string, uint32_t> index;
  for (size_t i = 0; i < segs.size(); ++i) index[segs[i]] = uint32_t(i);
  w.count(segs.size());
  for (const auto& s : segs) w.str(s);
  w.count(h.entries.size());
  for (const auto& e : h.entries) {
    w.count(e.key.size());
    for (const auto& k : e.key) w.str(k);
    w.u32(index.at(e.tensor.segment));
    write_tensor_body(w, e.tensor);
  }
  return w.take();
}

ShmTensorHandle parse_tensor_handle(const std::string& bytes) {
  Reader r(bytes);
  r.header(kKindTensor);
  ShmTensorHandle h;
  h.segment = r.str();
  check_segment_name(r, h.segment);
  read_tensor_body(r, h);
  r.end();
  return h;
}

ShmTensorDictHandle parse_tensordict_handle(const std::string& bytes) {
  Reader r(bytes);
  r.header(kKindTensorDict);
  ShmTensorDictHandle h;
  uint32_t nbatch = r.count(8);
  if (nbatch > kMaxDims) r.fail("batch_size has more than " + std::to_string(kMaxDims) + " dims");
  h.batch_size.resize(nbatch);
  for (auto& d : h.batch_size) {
    d = r.i64();
    if (d < 0) r.fail("negative batch dim " + std::to_string(d));
  }
  uint32_t nseg = r.count(5);
  std::vector<std::string> segs(nseg);
  for (auto& s : segs) {
    s = r.str();
    check_segment_name(r, s);
  }
  // min entry: nparts(4) + one part (4+1) + segidx(4) + offset(8) + dtype (4+4) + ndim(4)
  uint32_t nentries = r.count(33);
  std::set<std::vector<std::string>> keys;
  for (uint32_t i = 0; i < nentries; ++i) {
    ShmTensorDictHandle::Entry e;
    uint32_t nparts = r.count(5);
    e.key.resize(nparts);
    for (auto& k : e.key) k = r.str();
    std::string problem = key_problem(e.key);
    if (!problem.empty()) r.fail(problem);
    if (!keys.insert(e.key).second) r.fail("duplicate key " + key_text(e.key));
    uint32_t si = r.u32();
    if (si >= nseg) r.fail("segment index " + std::to_string(si) + " out of range");
    e.tensor.segment = segs[si];
    read_tensor_body(r, e.tensor);
    if (!starts_with_batch(e.tensor.shape, h.batch_size))
      r.fail("shape " + shape_text(e.tensor.shape) + " of " + key_text(e.key) + " does not start with batch_size " +
             shape_text(h.batch_size));
    h.entries.push_back(std::move(e));
  }
  r.end();
  return h;
}

at::Tensor open_tensor(const ShmTensorHandle& h) {
  return ShmSegment::open(h.segment)->tensor_at(h.offset, h.dtype, h.shape);
}

std::vector<at::Tensor> open_tensordict(const ShmTensorDictHandle& h) {
  std::map<std::string, std::shared_ptr<ShmSegment>> opened;
  std::vector<at::Tensor> out;
  out.reserve(h.entries.size());
  for (const auto& e : h.entries) {
    auto& seg = opened[e.tensor.segment];
    if (!seg) seg = ShmSegment::open(e.tensor.segment);
    out.push_back(seg->tensor_at(e.tensor.offset, e.tensor.dtype, e.tensor.shape));
  }
  return out;
}

}  // namespace tensordict::backends
