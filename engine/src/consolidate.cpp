// consolidate (upstream's TensorDictBase.consolidate / _reduce_vals_and_metadata) and its inverse
// (_rebuild_tensordict_files_consolidated, from_consolidated): every tensor leaf of a tree as a view into one
// uint8 storage, laid out byte for byte as upstream lays it out, so that a storage and its record cross to a
// Python rank (tensordict/distributed.hpp) or a file Python reads.
//
// Layout: the tensor leaves in insertion order, depth first (a sub-TensorDict's leaves where its key comes; a
// lazy stack's members "0", "1", ... in stack order), each C-contiguous and padded with zero bytes to a
// multiple of 8. Record of each level: {"cls", "non_tensors": {key: [value, batch_size, device]},
// "leaves": {key: [dtype, shape, start, stop, pad]}, "cls_metadata", then one record per sub-TensorDict}.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <thread>
#include <unordered_set>

#include <c10/util/strides.h>

#include "tensordict/backends/memmap_file.hpp"
#include "tensordict/backends/memmap_format.hpp"
#include "tensordict/backends/shm.hpp"
#include "tensordict/lazy_stack.hpp"
#include "tensordict/shared_storage.hpp"
#include "tensor_dict_internal.hpp"

namespace tensordict {

namespace {

using Object = JsonValue::Object;

//! the tensor of `dtype` and `sizes` whose bytes start `start` bytes into the 1-D uint8 `storage`: one TensorImpl
//! on the same storage (narrow + view + view made three, through the dispatcher: most of a wide level's cost)
at::Tensor view_bytes(const at::Tensor& storage, int64_t start, at::ScalarType dtype, at::IntArrayRef sizes) {
  const auto item = static_cast<int64_t>(c10::elementSize(dtype));
  const int64_t at_byte = storage.storage_offset() + start;
  if (at_byte % item != 0) {
    int64_t numel = 1;
    for (int64_t d : sizes) numel *= d;
    return storage.narrow(0, start, numel * item).view(dtype).view(sizes);
  }
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage.storage()), storage.key_set(),
                                                          caffe2::TypeMeta::fromScalarType(dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, c10::contiguous_strides(sizes));
  t.unsafeGetTensorImpl()->set_storage_offset(at_byte / item);
  return t;
}
using Array = JsonValue::Array;

JsonValue int_list(const std::vector<int64_t>& v) {
  Array a;
  a.reserve(v.size());
  for (int64_t x : v) a.emplace_back(static_cast<long long>(x));
  return JsonValue(std::move(a));
}

JsonValue device_json(const std::optional<at::Device>& device) {
  return device ? JsonValue(device->str()) : JsonValue();
}

//! one tensor leaf of the layout: its bytes go to [start, start + nbytes), zeros up to the next multiple of 8
struct Slot {
  at::Tensor value;  //!< C-contiguous CPU
  int64_t start = 0;
  int64_t nbytes = 0;
  int64_t pad = 0;
};

struct Planner {
  std::vector<Slot> slots;
  int64_t offset = 0;

  JsonValue leaf(const at::Tensor& t) {
    at::Tensor v = t.device().is_cpu() ? t : t.cpu();
    if (!v.is_contiguous() || v.storage_offset() != 0) v = v.contiguous();
    const int64_t n = v.numel() * static_cast<int64_t>(v.element_size());
    const int64_t pad = n % 8 == 0 ? 0 : 8 - n % 8;
    Slot s{v, offset, n, pad};
    offset += n + pad;
    slots.push_back(s);
    return JsonValue(Array{backends::dtype_to_string(t.scalar_type()), int_list(t.sizes().vec()),
                           static_cast<long long>(s.start), static_cast<long long>(offset),
                           static_cast<long long>(pad)});
  }

  //! the record of a NonTensorStack: one level per batch dim, the elements in "non_tensors" by index
  JsonValue stack_record(const NonTensorStack& s, size_t dim, int64_t flat0, int64_t stride) {
    const BatchSize& bs = s.batch_size();
    Object nt;
    Object rec{{"cls", "NonTensorStack"}};
    std::vector<std::pair<std::string, JsonValue>> subs;
    const int64_t n = bs[dim];
    const int64_t inner = n == 0 ? 0 : stride / n;
    for (int64_t i = 0; i < n; ++i) {
      if (dim + 1 == bs.size()) {
        nt.emplace_back(std::to_string(i), JsonValue(Array{s.at(flat0 + i), int_list({}), JsonValue()}));
      } else {
        subs.emplace_back(std::to_string(i), stack_record(s, dim + 1, flat0 + i * inner, inner));
      }
    }
    rec.emplace_back("non_tensors", JsonValue(std::move(nt)));
    rec.emplace_back("leaves", JsonValue::object());
    rec.emplace_back("cls_metadata", JsonValue(Object{{"stack_dim", 0}, {"stack_dim_name", JsonValue()},
                                                      {"is_locked", false}}));
    for (auto& kv : subs) rec.push_back(std::move(kv));
    return JsonValue(std::move(rec));
  }

  JsonValue record(const TensorDict& td) {
    if (StackMembers sm = td.node()->stack_members()) {
      Object rec{{"cls", "LazyStackedTensorDict"}, {"non_tensors", JsonValue::object()},
                 {"leaves", JsonValue::object()},
                 {"cls_metadata", JsonValue(Object{{"stack_dim", static_cast<long long>(sm.dim)},
                                                   {"stack_dim_name", JsonValue()},
                                                   {"is_locked", td.is_locked()}})}};
      for (size_t i = 0; i < sm.members->size(); ++i) rec.emplace_back(std::to_string(i), record((*sm.members)[i]));
      return JsonValue(std::move(rec));
    }
    Object nt, leaves;
    std::vector<std::pair<std::string, JsonValue>> subs;
    for (const auto& [key, e] : td.node()->read_all()) {
      switch (e.kind()) {
        case Entry::Kind::Tensor:
          if (e.tensor().is_nested() || e.tensor().layout() != at::kStrided)
            throw NotImplementedError("consolidate: the leaf '" + key + "' is not a strided tensor");
          leaves.emplace_back(key, leaf(e.tensor()));
          break;
        case Entry::Kind::TensorDict:
          subs.emplace_back(key, record(e.tensordict()));
          break;
        case Entry::Kind::NonTensorData:
          nt.emplace_back(key, JsonValue(Array{e.non_tensor_data().value(), int_list(e.non_tensor_data().batch_size()),
                                               device_json(td.device())}));
          break;
        case Entry::Kind::NonTensorStack: {
          const NonTensorStack& s = e.non_tensor_stack();
          if (s.batch_size().empty()) {
            nt.emplace_back(key, JsonValue(Array{s.numel() ? s.at(0) : JsonValue(), int_list({}), JsonValue()}));
          } else {
            subs.emplace_back(key, stack_record(s, 0, 0, s.numel()));
          }
          break;
        }
        default:
          throw TypeError("consolidate: the entry '" + key + "' is a " + Entry::kind_name(e.kind()));
      }
    }
    Array names;
    for (size_t i = 0; i < td.batch_size().size(); ++i) names.emplace_back();
    Object rec{{"cls", "TensorDict"},
               {"non_tensors", JsonValue(std::move(nt))},
               {"leaves", JsonValue(std::move(leaves))},
               {"cls_metadata", JsonValue(Object{{"device", device_json(td.device())},
                                                 {"names", JsonValue(std::move(names))},
                                                 {"batch_size", int_list(td.batch_size())},
                                                 {"is_locked", td.is_locked()}})}};
    for (auto& kv : subs) rec.push_back(std::move(kv));
    return JsonValue(std::move(rec));
  }
};

void copy_slots(const std::vector<Slot>& slots, uint8_t* base, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) {
    const Slot& s = slots[i];
    if (s.nbytes) std::memcpy(base + s.start, s.value.data_ptr(), static_cast<size_t>(s.nbytes));
    if (s.pad) std::memset(base + s.start + s.nbytes, 0, static_cast<size_t>(s.pad));
  }
}

//! the leaves' bytes into `storage` (threads split the leaves into runs of about equal bytes)
void fill_storage(const std::vector<Slot>& slots, const at::Tensor& storage, int num_threads) {
  auto* base = storage.data_ptr<uint8_t>();
  const int64_t total = storage.numel();
  if (num_threads <= 1 || slots.size() < 2 || total < (int64_t{1} << 20)) {
    copy_slots(slots, base, 0, slots.size());
    return;
  }
  const size_t n = std::min(slots.size(), static_cast<size_t>(num_threads));
  std::vector<size_t> cuts{0};
  for (size_t i = 0, t = 1; i < slots.size() && t < n; ++i) {
    if (slots[i].start >= total * static_cast<int64_t>(t) / static_cast<int64_t>(n)) {
      cuts.push_back(i);
      ++t;
    }
  }
  cuts.push_back(slots.size());
  std::vector<std::thread> threads;
  for (size_t t = 1; t + 1 < cuts.size(); ++t) threads.emplace_back(copy_slots, std::cref(slots), base, cuts[t], cuts[t + 1]);
  copy_slots(slots, base, cuts[0], cuts[1]);
  for (auto& th : threads) th.join();
}

const JsonValue& member(const JsonValue& rec, const char* key, const std::string& where) {
  const JsonValue* v = rec.is_object() ? rec.find(key) : nullptr;
  if (!v) throw FormatError("consolidated metadata: the record of " + where + " has no \"" + key + "\"");
  return *v;
}

bool fixed_key(const std::string& k) {
  return k == "cls" || k == "non_tensors" || k == "leaves" || k == "cls_metadata" || k == "size" ||
         k == "_total_bytes" || k == "_storage_device" || k == "_tensorclass_type";
}

std::vector<int64_t> ints(const JsonValue& v, const std::string& what) {
  if (!v.is_array()) throw FormatError("consolidated metadata: " + what + " is not a list");
  std::vector<int64_t> out;
  for (const JsonValue& x : v.as_array()) {
    if (!x.is_int() || x.as_int() < 0) throw FormatError("consolidated metadata: " + what + " holds " + x.dump());
    out.push_back(x.as_int());
  }
  return out;
}

//! the leaf a record's [dtype, shape, start, stop, pad] describes in `storage` (a view)
at::Tensor leaf_view(const at::Tensor& storage, const JsonValue& spec, const std::string& where) {
  if (!spec.is_array() || spec.as_array().size() < 5 || spec.as_array().size() > 6)
    throw FormatError("consolidated metadata: the leaf " + where + " is not [dtype, shape, start, stop, pad]");
  const Array& a = spec.as_array();
  if (!a[0].is_string()) throw FormatError("consolidated metadata: the dtype of " + where + " is not a string");
  auto dtype = backends::dtype_from_string(a[0].as_string());
  if (!dtype) throw FormatError("consolidated metadata: the leaf " + where + " has an unknown dtype " + a[0].dump());
  std::vector<int64_t> shape = ints(a[1], "the shape of " + where);
  if (!a[2].is_int() || !a[3].is_int() || !a[4].is_int())
    throw FormatError("consolidated metadata: the offsets of " + where + " are not integers");
  const int64_t start = a[2].as_int(), stop = a[3].as_int(), pad = a[4].as_int();
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d != 0 && numel > (int64_t{1} << 50) / d) throw FormatError("consolidated metadata: the shape of " + where + " overflows");
    numel *= d;
  }
  const int64_t item = static_cast<int64_t>(c10::elementSize(*dtype));
  if (start < 0 || stop < start || stop > storage.numel() || pad < 0 || pad >= 8 ||
      stop - start - pad != numel * item || start % item != 0) {
    throw FormatError("consolidated metadata: the leaf " + where + " (" + a[0].as_string() + ", " + a[1].dump() +
                      ", bytes " + std::to_string(start) + ".." + std::to_string(stop) + ", pad " + std::to_string(pad) +
                      ") does not fit a storage of " + std::to_string(storage.numel()) + " bytes");
  }
  return view_bytes(storage, start, *dtype, shape);
}

std::optional<at::Device> device_of(const JsonValue& v) {
  if (v.is_null()) return std::nullopt;
  if (!v.is_string()) throw FormatError("consolidated metadata: a device is " + v.dump());
  try {
    return at::Device(v.as_string());
  } catch (const std::exception&) {
    throw FormatError("consolidated metadata: unknown device " + v.dump());
  }
}

Entry rebuild(const at::Tensor& storage, const JsonValue& rec, const std::string& where, int depth);
TensorDict level_of(BatchSize batch, std::optional<at::Device> device, std::vector<std::pair<std::string, Entry>> entries);

//! a NonTensorStack record back into its shape and values (C order): a level holds its elements in
//! "non_tensors" (the last dim) or one NonTensorStack record per index
BatchSize stack_values(const JsonValue& rec, const std::string& where, std::vector<JsonValue>& out, int depth) {
  if (depth > 64) throw FormatError("consolidated metadata: nesting too deep at " + where);
  if (!rec.is_object()) throw FormatError("consolidated metadata: the record of " + where + " is not a dict");
  const JsonValue& nt = member(rec, "non_tensors", where);
  if (nt.is_object() && !nt.as_object().empty()) {
    for (const auto& kv : nt.as_object()) {
      if (!kv.second.is_array() || kv.second.as_array().empty())
        throw FormatError("consolidated metadata: the non-tensor " + where + "." + kv.first + " is not [data, ...]");
      out.push_back(kv.second.as_array()[0]);
    }
    return {static_cast<int64_t>(nt.as_object().size())};
  }
  int64_t n = 0;
  std::optional<BatchSize> inner;
  for (const auto& kv : rec.as_object()) {
    if (fixed_key(kv.first)) continue;
    BatchSize s = stack_values(kv.second, where + "." + kv.first, out, depth + 1);
    if (inner && *inner != s) throw FormatError("consolidated metadata: the NonTensorStack " + where + " is ragged");
    inner = s;
    ++n;
  }
  BatchSize shape{n};
  if (inner) shape.insert(shape.end(), inner->begin(), inner->end());
  return shape;
}

Entry rebuild(const at::Tensor& storage, const JsonValue& rec, const std::string& where, int depth) {
  if (depth > 64) throw FormatError("consolidated metadata: nesting too deep at " + where);
  if (!rec.is_object()) throw FormatError("consolidated metadata: the record of " + where + " is not a dict");
  const JsonValue& cls = member(rec, "cls", where);
  if (!cls.is_string())
    throw FormatError("consolidated metadata: the class of " + where + " is not a name (" + cls.dump() + ")");
  const JsonValue& cm = member(rec, "cls_metadata", where);
  const JsonValue* locked = cm.find("is_locked");
  const bool is_locked = locked && locked->is_bool() && locked->as_bool();
  if (cls.as_string() == "NonTensorStack") {
    std::vector<JsonValue> values;
    BatchSize shape = stack_values(rec, where, values, depth);
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    if (numel != static_cast<int64_t>(values.size()))
      throw FormatError("consolidated metadata: the NonTensorStack " + where + " is ragged");
    return Entry(NonTensorStack(std::move(values), shape));
  }
  if (cls.as_string() == "LazyStackedTensorDict") {
    const JsonValue* sd = cm.find("stack_dim");
    if (!sd || !sd->is_int()) throw FormatError("consolidated metadata: the lazy stack " + where + " has no stack_dim");
    std::vector<TensorDict> members;
    for (const auto& kv : rec.as_object()) {
      if (fixed_key(kv.first)) continue;
      Entry m = rebuild(storage, kv.second, where + "." + kv.first, depth + 1);
      if (!m.is_tensordict()) throw FormatError("consolidated metadata: the member " + where + "." + kv.first + " is not a TensorDict");
      members.push_back(m.tensordict());
    }
    if (members.empty()) throw FormatError("consolidated metadata: the lazy stack " + where + " has no member");
    TensorDict out = lazy_stack(members, sd->as_int());
    if (is_locked) out.lock_();
    return Entry(out);
  }
  if (cls.as_string() != "TensorDict")
    throw FormatError("consolidated metadata: " + where + " is a " + cls.as_string() +
                      " (TensorDict, LazyStackedTensorDict and NonTensorStack are read)");
  const JsonValue* bs = cm.find("batch_size");
  BatchSize batch = bs ? ints(*bs, "the batch size of " + where) : BatchSize{};
  const JsonValue* dev = cm.find("device");
  const std::string prefix = where.empty() ? "" : where + ".";
  std::vector<std::pair<std::string, Entry>> entries;
  std::unordered_set<std::string> seen;
  // every value must fit the level's batch size (a record is input: checked as TensorDict::set checks)
  auto add = [&](const std::string& key, Entry value) {
    if (key.empty() || !seen.insert(key).second)
      throw FormatError("consolidated metadata: the key '" + prefix + key + "' is empty or appears twice");
    const BatchSize shape = value.shape();
    if (shape.size() < batch.size() || !std::equal(batch.begin(), batch.end(), shape.begin()))
      throw FormatError("consolidated metadata: the value of '" + prefix + key + "' does not fit the batch size " +
                        int_list(batch).dump());
    entries.emplace_back(key, std::move(value));
  };
  const JsonValue& nt = member(rec, "non_tensors", where);
  if (!nt.is_object()) throw FormatError("consolidated metadata: non_tensors of " + where + " is not a dict");
  for (const auto& [key, v] : nt.as_object()) {
    if (!v.is_array() || v.as_array().size() < 2)
      throw FormatError("consolidated metadata: the non-tensor " + prefix + key + " is not [data, batch_size, device]");
    add(key, Entry(NonTensorData(v.as_array()[0], ints(v.as_array()[1], "the batch size of " + prefix + key))));
  }
  const JsonValue& leaves = member(rec, "leaves", where);
  if (!leaves.is_object()) throw FormatError("consolidated metadata: leaves of " + where + " is not a dict");
  for (const auto& [key, spec] : leaves.as_object()) add(key, Entry(leaf_view(storage, spec, prefix + key)));
  for (const auto& [key, sub] : rec.as_object()) {
    if (fixed_key(key)) continue;
    add(key, rebuild(storage, sub, prefix + key, depth + 1));
  }
  return Entry(level_of(std::move(batch), dev ? device_of(*dev) : std::nullopt, std::move(entries)));
}

//! marks every dense level of `td` consolidated over `storage`, with the level's own record
void mark(const TensorDict& td, const at::Tensor& storage, const JsonValue& rec) {
  if (StackMembers sm = td.node()->stack_members()) {
    size_t i = 0;
    for (const auto& kv : rec.as_object()) {
      if (fixed_key(kv.first)) continue;
      if (i < sm.members->size()) mark((*sm.members)[i++], storage, kv.second);
    }
    return;
  }
  TensorDictImpl* impl = td.node()->dense_node();
  if (!impl) return;
  impl->consolidated = std::make_shared<TensorDictImpl::Consolidated>(TensorDictImpl::Consolidated{storage, rec});
  for (const auto& [key, e] : impl->entries) {
    if (!e.is_tensordict()) continue;
    const JsonValue* sub = rec.find(key);
    if (sub) mark(e.tensordict(), storage, *sub);
  }
}

//! a dense level built from entries known to fit (views of the storage, values of a checked source): no per-key
//! validation, no lookup (TensorDict::set looks each key up, quadratic in a level's width)
TensorDict level_of(BatchSize batch, std::optional<at::Device> device, std::vector<std::pair<std::string, Entry>> entries) {
  auto impl = std::make_shared<TensorDictImpl>();
  impl->batch_size = std::move(batch);
  impl->device = device;
  impl->entries = std::move(entries);
  return TensorDict(std::move(impl));
}

//! the source's structure with every tensor leaf replaced by its view into `storage` (insertion order kept)
TensorDict views_like(const TensorDict& src, const at::Tensor& storage, const std::vector<Slot>& slots, size_t& next) {
  auto view_of = [&](const at::Tensor& t) {
    // the slots were planned from an earlier read of the source: a store another handle changed in between
    // (a key added, a leaf replaced) no longer matches them, and a view past its slot would reach past the storage
    const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
    if (next >= slots.size() || slots[next].nbytes != bytes ||
        slots[next].start + bytes > storage.numel()) {
      throw RuntimeError("consolidate: the source changed while it was consolidated (a leaf of " +
                         std::to_string(bytes) + " bytes where the plan holds " +
                         (next < slots.size() ? std::to_string(slots[next].nbytes) : std::string("none")) + ")");
    }
    const Slot& s = slots[next++];
    return view_bytes(storage, s.start, t.scalar_type(), t.sizes());
  };
  if (StackMembers sm = src.node()->stack_members()) {
    std::vector<TensorDict> members;
    for (const TensorDict& m : *sm.members) members.push_back(views_like(m, storage, slots, next));
    return lazy_stack(members, sm.dim);
  }
  std::vector<std::pair<std::string, Entry>> entries;
  for (auto& [key, e] : src.node()->read_all()) {
    if (e.is_tensor()) entries.emplace_back(key, Entry(view_of(e.tensor())));
    else if (e.is_tensordict()) entries.emplace_back(key, Entry(views_like(e.tensordict(), storage, slots, next)));
    else entries.emplace_back(key, e);
  }
  return level_of(src.batch_size(), src.device(), std::move(entries));
}

std::string file_error(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

}  // namespace

TensorDict TensorDict::consolidate(const ConsolidateOptions& options) const {
  if (!node_) throw RuntimeError("consolidate: undefined TensorDict");
  if (is_consolidated()) return *this;
  Planner plan;
  JsonValue rec = plan.record(*this);
  const int64_t total = plan.offset;
  at::Tensor storage;
  std::string text;
  if (!options.filename().empty()) {
    // [leaf bytes][metadata JSON][its length, int64], built in memory and written with pwrite to a file beside the
    // target (a full disk is an error, not a SIGBUS in a mapping), renamed over it when whole: a failure leaves
    // what was there and removes the temporary. The result's leaves then map the file.
    text = rec.dump();
    const auto len = static_cast<int64_t>(text.size());
    at::Tensor whole = at::empty({total + len + 8}, at::kByte);
    fill_storage(plan.slots, whole.narrow(0, 0, total), options.num_threads());
    std::memcpy(whole.data_ptr<uint8_t>() + total, text.data(), text.size());
    std::memcpy(whole.data_ptr<uint8_t>() + total + len, &len, 8);
    const std::string tmp = options.filename() + ".consolidating-" + std::to_string(::getpid());
    try {
      backends::write_file(tmp, whole);
      if (::rename(tmp.c_str(), options.filename().c_str()) != 0)
        throw BackendError(file_error("consolidate: cannot rename to", options.filename()));
    } catch (...) {
      ::unlink(tmp.c_str());
      throw;
    }
    storage = backends::map_file(options.filename(), at::kByte, {total + len + 8}, /*writable=*/true).narrow(0, 0, total);
  } else if (options.buffer().defined()) {
    const at::Tensor& b = options.buffer();
    if (b.scalar_type() != at::kByte || b.dim() != 1 || !b.is_contiguous() || !b.device().is_cpu() || b.numel() < total)
      throw ValueError("consolidate: the buffer must be a contiguous 1-D uint8 CPU tensor of at least " +
                       std::to_string(total) + " bytes");
    storage = b.narrow(0, 0, total);
    fill_storage(plan.slots, storage, options.num_threads());
  } else if (options.share_memory()) {
    backends::ShmAllocation alloc = backends::allocate({{{"storage"}, at::kByte, {total}}}, {}, shm_prefix());
    storage = alloc.tensors.at(0);
    fill_storage(plan.slots, storage, options.num_threads());
  } else {
    storage = at::empty({total}, at::kByte);
    fill_storage(plan.slots, storage, options.num_threads());
  }
  size_t next = 0;
  TensorDict out = views_like(*this, storage, plan.slots, next);
  mark(out, storage, rec);
  out.lock_();
  return out;
}

bool TensorDict::is_consolidated() const {
  if (!node_) return false;
  TensorDictImpl* impl = node_->dense_node();
  return impl && impl->consolidated != nullptr;
}

at::Tensor TensorDict::consolidated_storage() const {
  if (!is_consolidated()) return {};
  return node_->dense_node()->consolidated->storage;
}

JsonValue TensorDict::consolidated_metadata() const {
  if (!is_consolidated()) return {};
  return node_->dense_node()->consolidated->metadata;
}

TensorDict TensorDict::from_consolidated(const at::Tensor& storage, const JsonValue& metadata) {
  if (!storage.defined() || storage.scalar_type() != at::kByte || storage.dim() != 1 || !storage.is_contiguous())
    throw ValueError("from_consolidated: the storage must be a contiguous 1-D uint8 tensor");
  Entry e = rebuild(storage, metadata, "", 0);
  if (!e.is_tensordict()) throw FormatError("consolidated metadata: the root is not a TensorDict");
  TensorDict out = e.tensordict();
  mark(out, storage, metadata);
  return out;
}

TensorDict TensorDict::from_consolidated(const std::string& filename) {
  int fd = ::open(filename.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw BackendError(file_error("from_consolidated: cannot open", filename));
  const off_t size = ::lseek(fd, 0, SEEK_END);
  ::close(fd);
  if (size < 8) throw FormatError("from_consolidated: " + filename + " is " + std::to_string(size) + " bytes, too short for a consolidated file");
  at::Tensor whole = backends::map_file(filename, at::kByte, {static_cast<int64_t>(size)}, /*writable=*/false);
  int64_t len = 0;
  std::memcpy(&len, whole.data_ptr<uint8_t>() + size - 8, 8);
  if (len < 0 || len > size - 8)
    throw FormatError("from_consolidated: " + filename + " ends with a metadata length of " + std::to_string(len) +
                      " bytes, which does not fit its " + std::to_string(size) + " bytes");
  const int64_t total = size - 8 - len;
  std::string text(reinterpret_cast<const char*>(whole.data_ptr<uint8_t>()) + total, static_cast<size_t>(len));
  JsonValue rec;
  try {
    rec = JsonValue::parse(text);
  } catch (const FormatError& e) {
    throw FormatError("from_consolidated: the metadata of " + filename + " is not JSON (" + e.message() + ")");
  }
  return from_consolidated(whole.narrow(0, 0, total), rec);
}

}  // namespace tensordict
