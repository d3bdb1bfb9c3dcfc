// The DataLoader's ring: one shared-memory segment of batch slots (its layout and the JSON config the trainer
// writes into it for the worker processes), and the futex / spin waits trainer and workers use on it.
#include "tensordict/backends/shape_text.hpp"
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>
#include <cstring>

#include "loader_internal.hpp"
#include "tensordict/backends/json_value.hpp"
#include "tensordict/errors.hpp"

namespace tensordict::loader_internal {
namespace {

constexpr uint64_t kMagic = 0x31524c445444ull;  // "TDLR1"
constexpr uint32_t kVersion = 2;  // 2: RingHeader::done_want

JsonValue key_json(const NestedKey& k) {
  JsonValue::Array a;
  for (const auto& p : k.parts()) a.emplace_back(p);
  return JsonValue::array(std::move(a));
}

JsonValue ints_json(const std::vector<int64_t>& v) {
  JsonValue::Array a;
  for (int64_t x : v) a.emplace_back(static_cast<long long>(x));
  return JsonValue::array(std::move(a));
}

std::vector<int64_t> ints_of(const JsonValue& v) {
  std::vector<int64_t> out;
  for (const auto& x : v.as_array()) out.push_back(x.as_int());
  return out;
}

std::string dump_config(const RingConfig& c) {
  JsonValue::Array leaves;
  for (const auto& l : c.leaves) {
    leaves.push_back(JsonValue::object({{"key", key_json(l.key)},
                                        {"dtype", JsonValue(backends::dtype_name(l.dtype))},
                                        {"feature", ints_json(l.feature)},
                                        {"offset", JsonValue(static_cast<long long>(l.offset))}}));
  }
  return JsonValue::object({{"src", JsonValue(c.src_spec)},
                            {"transform", JsonValue(c.transform)},
                            {"leaves", JsonValue::array(std::move(leaves))},
                            {"batch_rest", ints_json(c.batch_rest)},
                            {"worker_threads", JsonValue(static_cast<long long>(c.worker_threads))},
                            {"log_level", JsonValue(c.log_level)}})
      .dump();
}

RingConfig parse_config(const std::string& text) {
  JsonValue v = JsonValue::parse(text);
  RingConfig c;
  c.src_spec = v.find("src")->as_string();
  c.transform = v.find("transform")->as_string();
  for (const auto& l : v.find("leaves")->as_array()) {
    LeafSpec s;
    std::vector<std::string> parts;
    for (const auto& p : l.find("key")->as_array()) parts.push_back(p.as_string());
    s.key = NestedKey(parts);
    s.dtype = backends::dtype_from_name(l.find("dtype")->as_string());
    s.feature = ints_of(*l.find("feature"));
    s.offset = static_cast<uint64_t>(l.find("offset")->as_int());
    c.leaves.push_back(std::move(s));
  }
  c.batch_rest = ints_of(*v.find("batch_rest"));
  c.worker_threads = v.find("worker_threads")->as_int();
  c.log_level = v.find("log_level")->as_string();
  return c;
}

}  // namespace

int64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

bool futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_us) {
  timespec ts{};
  ts.tv_sec = timeout_us / 1000000;
  ts.tv_nsec = (timeout_us % 1000000) * 1000;
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0) == 0;
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void signal_seq(std::atomic<uint32_t>& seq, std::atomic<uint32_t>& waiters) {
  seq.fetch_add(1, std::memory_order_seq_cst);
  if (waiters.load(std::memory_order_seq_cst) > 0) futex_wake_all(&seq);
}

void signal_done(RingHeader& h, uint32_t slot) {
  h.done_seq.fetch_add(1, std::memory_order_seq_cst);
  if (h.done_waiters.load(std::memory_order_seq_cst) == 0) return;
  const uint32_t want = h.done_want.load(std::memory_order_seq_cst);
  if (want == 0 || want == slot + 1) futex_wake_all(&h.done_seq);
}

const SpinBudget& spin_budget() {
  static const SpinBudget b;
  return b;
}

void copy_message(char* dst, uint32_t& len, const std::string& msg) {
  const size_t n = std::min(msg.size(), kErrBytes);
  std::memcpy(dst, msg.data(), n);
  len = static_cast<uint32_t>(n);
}

std::shared_ptr<Ring> Ring::create(RingConfig cfg, int64_t capacity, uint32_t num_slots, uint32_t num_workers,
                                   const std::string& prefix) {
  std::vector<backends::ShmLayoutEntry> entries;
  for (const auto& l : cfg.leaves) {
    backends::ShmLayoutEntry e;
    e.key = l.key.parts();
    e.dtype = l.dtype;
    e.shape = {capacity};
    e.shape.insert(e.shape.end(), l.feature.begin(), l.feature.end());
    entries.push_back(std::move(e));
  }
  backends::ShmLayout layout = backends::ShmLayout::plan(entries);
  for (size_t i = 0; i < cfg.leaves.size(); ++i) cfg.leaves[i].offset = layout.offsets[i];
  auto r = std::make_shared<Ring>();
  r->cfg = std::move(cfg);
  r->capacity = capacity;
  r->num_slots = num_slots;
  r->index_bytes = round64(static_cast<uint64_t>(capacity) * sizeof(int64_t));
  r->stride = round64(round64(sizeof(SlotCtl)) + r->index_bytes + layout.total_bytes);
  const std::string text = dump_config(r->cfg);
  const uint64_t config_offset = round64(sizeof(RingHeader));
  r->slots_offset = round64(config_offset + text.size() + 1);
  const uint64_t total = r->slots_offset + r->stride * num_slots;
  r->seg = backends::ShmSegment::create(total, prefix);
  char* base = static_cast<char*>(r->seg->data());
  r->hdr = new (base) RingHeader();  // the segment is zero-filled: atomics start at 0
  RingHeader& h = *r->hdr;
  h.version = kVersion;
  h.num_slots = num_slots;
  h.num_workers = num_workers;
  h.num_leaves = static_cast<uint32_t>(r->cfg.leaves.size());
  h.capacity = capacity;
  h.slot_stride = r->stride;
  h.slots_offset = r->slots_offset;
  h.config_offset = config_offset;
  h.config_len = text.size();
  h.trainer_pid = static_cast<int32_t>(::getpid());
  std::memcpy(base + config_offset, text.data(), text.size());
  for (uint32_t s = 0; s < num_slots; ++s) new (r->slot_base(s)) SlotCtl();
  std::atomic_thread_fence(std::memory_order_release);
  h.magic = kMagic;
  return r;
}

std::shared_ptr<Ring> Ring::attach(const std::string& name) {
  auto r = std::make_shared<Ring>();
  r->seg = backends::ShmSegment::open(name);
  if (r->seg->size() < sizeof(RingHeader)) throw FormatError("DataLoader: shared-memory segment " + name + " is not a loader ring");
  r->hdr = reinterpret_cast<RingHeader*>(r->seg->data());
  RingHeader& h = *r->hdr;
  if (h.magic != kMagic || h.version != kVersion) {
    throw FormatError("DataLoader: shared-memory segment " + name + " is not a loader ring of this version");
  }
  if (h.config_offset + h.config_len > r->seg->size() || h.slots_offset + h.slot_stride * h.num_slots > r->seg->size()) {
    throw FormatError("DataLoader: the ring " + name + " is truncated");
  }
  const char* base = static_cast<const char*>(r->seg->data());
  r->cfg = parse_config(std::string(base + h.config_offset, h.config_len));
  r->capacity = h.capacity;
  r->num_slots = h.num_slots;
  r->stride = h.slot_stride;
  r->slots_offset = h.slots_offset;
  r->index_bytes = round64(static_cast<uint64_t>(r->capacity) * sizeof(int64_t));
  return r;
}

int64_t batch_seed(int64_t seed, int64_t epoch, int64_t batch) {
  uint64_t x = static_cast<uint64_t>(seed) ^ (static_cast<uint64_t>(epoch) * 0x9E3779B97F4A7C15ull) ^
               (static_cast<uint64_t>(batch) * 0xC2B2AE3D27D4EB4Full);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return static_cast<int64_t>(x & static_cast<uint64_t>(INT64_MAX));
}

std::string batch_name(int64_t batch, int64_t epoch) {
  return "batch " + std::to_string(batch) + " of epoch " + std::to_string(epoch);
}

std::string shape_str(at::IntArrayRef s) { return shape_text(s); }

}  // namespace tensordict::loader_internal
