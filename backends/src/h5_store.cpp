// The HDF5 LeafStore (see h5_store.hpp and backends/README.md "HDF5 store").
#include "tensordict/backends/h5_store.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <hdf5.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <unordered_map>
#include <utility>

#include <ATen/EmptyTensor.h>

#include "tensordict/errors.hpp"

namespace tensordict {
namespace backends {

namespace {

// ------------------------------------------------------------------------------------- library state
//! true when the library serializes its own API calls (a --enable-threadsafe build, as Debian's)
bool library_threadsafe() {
  static const bool ts = [] {
    hbool_t t = 0;
    if (H5is_library_threadsafe(&t) < 0) return false;
    return t != 0;
  }();
  return ts;
}

std::recursive_mutex& library_mutex() {
  static std::recursive_mutex m;
  return m;
}

//! the structure generation of one file (by device and inode), shared by this process's stores of the file:
//! HDF5 lets several stores of one process open a file (even read-write), and each store keeps datasets open,
//! so a store that creates, erases or replaces a dataset bumps it and the others drop what they keep
using Generation = std::atomic<uint64_t>;
std::shared_ptr<Generation> file_generation(dev_t dev, ino_t ino) {
  static std::mutex m;
  static auto* files = new std::map<std::pair<dev_t, ino_t>, std::weak_ptr<Generation>>();  // never destroyed
  std::lock_guard<std::mutex> lock(m);
  for (auto it = files->begin(); it != files->end();) it = it->second.expired() ? files->erase(it) : std::next(it);
  std::weak_ptr<Generation>& w = (*files)[{dev, ino}];
  if (auto g = w.lock()) return g;
  auto g = std::make_shared<Generation>(0);
  w = g;
  return g;
}

//! held for the duration of every public call: takes the process-wide mutex when the library is not
//! thread-safe, and turns off HDF5's automatic error printing for this thread (error stacks are per
//! thread in a thread-safe build)
class LibraryGuard {
 public:
  LibraryGuard() {
    if (!library_threadsafe()) lock_ = std::unique_lock<std::recursive_mutex>(library_mutex());
    thread_local bool silenced = false;
    if (!silenced) {
      H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
      silenced = true;
    }
  }

 private:
  std::unique_lock<std::recursive_mutex> lock_;
};

herr_t collect_error(unsigned, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::string*>(data);
  std::string line = err->desc ? err->desc : "";
  if (line.empty()) {
    char buf[256];
    if (H5Eget_msg(err->min_num, nullptr, buf, sizeof buf) > 0) line = buf;
  }
  if (line.empty()) return 0;
  if (!out->empty()) *out += "; ";
  *out += line;
  return 0;
}

//! HDF5's error stack of this thread as one line (outermost first), then cleared
std::string hdf5_message() {
  std::string s;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &s);
  H5Eclear2(H5E_DEFAULT);
  if (s.empty()) return "HDF5 gave no error message";
  return "HDF5: " + s;
}

void clear_errors() { H5Eclear2(H5E_DEFAULT); }

// ------------------------------------------------------------------------------------- RAII ids
class Id {
 public:
  Id() = default;
  Id(hid_t id, herr_t (*closer)(hid_t)) : id_(id), closer_(closer) {}
  Id(Id&& o) noexcept : id_(o.id_), closer_(o.closer_) { o.id_ = -1; }
  Id& operator=(Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      closer_ = o.closer_;
      o.id_ = -1;
    }
    return *this;
  }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  ~Id() { reset(); }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset() {
    if (id_ >= 0 && closer_) closer_(id_);
    id_ = -1;
  }
  hid_t release() {
    hid_t i = id_;
    id_ = -1;
    return i;
  }

 private:
  hid_t id_ = -1;
  herr_t (*closer_)(hid_t) = nullptr;
};

Id type_id(hid_t t) { return Id(t, H5Tclose); }
Id space_id(hid_t s) { return Id(s, H5Sclose); }
Id plist_id(hid_t p) { return Id(p, H5Pclose); }
Id dataset_id(hid_t d) { return Id(d, H5Dclose); }
Id group_id(hid_t g) { return Id(g, H5Gclose); }
Id object_id(hid_t o) { return Id(o, H5Oclose); }

// ------------------------------------------------------------------------------------- types
//! h5py's IEEE half: a copy of F32LE with the fields of binary16
Id make_half_type() {
  Id t = type_id(H5Tcopy(H5T_IEEE_F32LE));
  H5Tset_fields(t.get(), 15, 10, 5, 0, 10);
  H5Tset_size(t.get(), 2);
  H5Tset_ebias(t.get(), 15);
  return t;
}

//! h5py's numpy bool: ENUM on int8 {FALSE: 0, TRUE: 1}
Id make_bool_type() {
  Id t = type_id(H5Tenum_create(H5T_STD_I8LE));
  int8_t v = 0;
  H5Tenum_insert(t.get(), "FALSE", &v);
  v = 1;
  H5Tenum_insert(t.get(), "TRUE", &v);
  return t;
}

//! h5py's complex: COMPOUND {r, i} of float32 / float64
Id make_complex_type(bool dbl) {
  const size_t half = dbl ? 8 : 4;
  Id t = type_id(H5Tcreate(H5T_COMPOUND, 2 * half));
  hid_t member = dbl ? H5T_IEEE_F64LE : H5T_IEEE_F32LE;
  H5Tinsert(t.get(), "r", 0, member);
  H5Tinsert(t.get(), "i", half, member);
  return t;
}

//! the HDF5 type of a torch dtype (file and memory alike: the store assumes a little-endian host, as the
//! rest of the project does); nullopt when numpy / h5py have no such type
std::optional<Id> h5_type_of(at::ScalarType dtype) {
  switch (dtype) {
    case at::kChar: return type_id(H5Tcopy(H5T_STD_I8LE));
    case at::kShort: return type_id(H5Tcopy(H5T_STD_I16LE));
    case at::kInt: return type_id(H5Tcopy(H5T_STD_I32LE));
    case at::kLong: return type_id(H5Tcopy(H5T_STD_I64LE));
    case at::kByte: return type_id(H5Tcopy(H5T_STD_U8LE));
    case at::kHalf: return make_half_type();
    case at::kFloat: return type_id(H5Tcopy(H5T_IEEE_F32LE));
    case at::kDouble: return type_id(H5Tcopy(H5T_IEEE_F64LE));
    case at::kBool: return make_bool_type();
    case at::kComplexFloat: return make_complex_type(false);
    case at::kComplexDouble: return make_complex_type(true);
    default: return std::nullopt;
  }
}

std::string h5_string(char* s) {
  std::string out = s ? s : "";
  if (s) H5free_memory(s);
  return out;
}

//! what a dataset's type is to the store
struct TypeClass {
  enum Kind { Tensor, String, Opaque, Unsupported } kind = Unsupported;
  at::ScalarType dtype = at::kFloat;
  std::string why;  //!< Unsupported: what the type is
};

const char* class_name(H5T_class_t c) {
  switch (c) {
    case H5T_INTEGER: return "integer";
    case H5T_FLOAT: return "float";
    case H5T_TIME: return "time";
    case H5T_STRING: return "string";
    case H5T_BITFIELD: return "bitfield";
    case H5T_OPAQUE: return "opaque";
    case H5T_COMPOUND: return "compound";
    case H5T_REFERENCE: return "reference";
    case H5T_ENUM: return "enum";
    case H5T_VLEN: return "variable-length sequence";
    case H5T_ARRAY: return "array";
    default: return "unknown";
  }
}

TypeClass classify(hid_t t) {
  TypeClass out;
  const H5T_class_t c = H5Tget_class(t);
  const size_t size = H5Tget_size(t);
  auto unsupported = [&](std::string why) {
    out.kind = TypeClass::Unsupported;
    out.why = std::move(why);
    return out;
  };
  switch (c) {
    case H5T_INTEGER: {
      const bool sign = H5Tget_sign(t) == H5T_SGN_2;
      out.kind = TypeClass::Tensor;
      if (sign && size == 1) out.dtype = at::kChar;
      else if (sign && size == 2) out.dtype = at::kShort;
      else if (sign && size == 4) out.dtype = at::kInt;
      else if (sign && size == 8) out.dtype = at::kLong;
      else if (!sign && size == 1) out.dtype = at::kByte;
      else
        return unsupported(std::string(sign ? "" : "unsigned ") + std::to_string(8 * size) +
                           "-bit integer (torch has no such dtype)");
      return out;
    }
    case H5T_FLOAT:
      out.kind = TypeClass::Tensor;
      if (size == 2) out.dtype = at::kHalf;
      else if (size == 4) out.dtype = at::kFloat;
      else if (size == 8) out.dtype = at::kDouble;
      else return unsupported(std::to_string(8 * size) + "-bit float");
      return out;
    case H5T_ENUM: {
      Id base = type_id(H5Tget_super(t));
      const int n = H5Tget_nmembers(t);
      bool is_bool = base.valid() && H5Tget_class(base.get()) == H5T_INTEGER && H5Tget_size(base.get()) == 1 &&
                     H5Tget_sign(base.get()) == H5T_SGN_2 && n == 2;
      bool seen_false = false, seen_true = false;
      for (int i = 0; is_bool && i < n; ++i) {
        std::string name = h5_string(H5Tget_member_name(t, static_cast<unsigned>(i)));
        int8_t v = -1;
        if (H5Tget_member_value(t, static_cast<unsigned>(i), &v) < 0) is_bool = false;
        else if (name == "FALSE" && v == 0) seen_false = true;
        else if (name == "TRUE" && v == 1) seen_true = true;
        else is_bool = false;
      }
      clear_errors();
      if (is_bool && seen_false && seen_true) {
        out.kind = TypeClass::Tensor;
        out.dtype = at::kBool;
        return out;
      }
      return unsupported("enum (only h5py's bool enum {FALSE: 0, TRUE: 1} on int8 is supported)");
    }
    case H5T_COMPOUND: {
      if (H5Tget_nmembers(t) == 2) {
        std::string n0 = h5_string(H5Tget_member_name(t, 0)), n1 = h5_string(H5Tget_member_name(t, 1));
        Id m0 = type_id(H5Tget_member_type(t, 0)), m1 = type_id(H5Tget_member_type(t, 1));
        if (n0 == "r" && n1 == "i" && m0.valid() && m1.valid() && H5Tget_class(m0.get()) == H5T_FLOAT &&
            H5Tget_class(m1.get()) == H5T_FLOAT) {
          const size_t s0 = H5Tget_size(m0.get()), s1 = H5Tget_size(m1.get());
          if (s0 == s1 && (s0 == 4 || s0 == 8)) {
            out.kind = TypeClass::Tensor;
            out.dtype = s0 == 4 ? at::kComplexFloat : at::kComplexDouble;
            return out;
          }
        }
      }
      clear_errors();
      return unsupported("compound (only h5py's complex {r, i} of float32/float64 is supported)");
    }
    case H5T_STRING:
      out.kind = TypeClass::String;
      return out;
    case H5T_OPAQUE:
      out.kind = TypeClass::Opaque;
      return out;
    default:
      clear_errors();
      return unsupported(std::string(class_name(c)) + " type");
  }
}

// ------------------------------------------------------------------------------------- paths and values
std::string join_path(const LeafPath& p) {
  if (p.empty()) return "/";
  std::string s;
  for (const auto& part : p) s += "/" + part;
  return s;
}

//! "a/b" relative to the store's root group ("." for the root itself)
std::string rel_path(const LeafPath& p) {
  if (p.empty()) return ".";
  std::string s;
  for (size_t i = 0; i < p.size(); ++i) {
    if (i) s += '/';
    s += p[i];
  }
  return s;
}

bool bad_part(const std::string& part) {
  return part.empty() || part == "." || part == ".." || part.find('/') != std::string::npos ||
         part.find('\0') != std::string::npos;
}

void check_path(const LeafPath& p, const std::string& where) {
  for (const auto& part : p)
    if (bad_part(part))
      throw ValueError(where + ": invalid key part '" + part + "' in " + join_path(p) +
                       " (HDF5 names cannot be empty, '.', '..' or hold '/')");
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

int64_t checked_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) return -1;
    n *= d;
  }
  return n;
}

// UTF-8 <-> code points (numpy's '<U n' is UCS-4)
bool utf8_decode(const std::string& s, std::vector<uint32_t>& out) {
  out.clear();
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    uint32_t cp;
    int extra;
    if (c < 0x80) { cp = c; extra = 0; }
    else if ((c & 0xE0) == 0xC0) { cp = c & 0x1F; extra = 1; }
    else if ((c & 0xF0) == 0xE0) { cp = c & 0x0F; extra = 2; }
    else if ((c & 0xF8) == 0xF0) { cp = c & 0x07; extra = 3; }
    else return false;
    for (int k = 1; k <= extra; ++k) {
      if (i + k >= s.size()) return false;
      unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    out.push_back(cp);
    i += extra + 1;
  }
  return true;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | ((cp >> 18) & 0x07));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

//! values (row-major) folded into nested arrays of `dims` (a scalar for rank 0)
JsonValue nest(std::vector<JsonValue>& values, const std::vector<hsize_t>& dims, size_t dim, size_t& pos) {
  if (dim == dims.size()) return std::move(values[pos++]);
  JsonValue::Array a;
  a.reserve(static_cast<size_t>(dims[dim]));
  for (hsize_t i = 0; i < dims[dim]; ++i) a.push_back(nest(values, dims, dim + 1, pos));
  return JsonValue(std::move(a));
}

// opaque values whose tag the store does not decode: their bytes come back as JsonValue::Bytes; writing
// the same bytes back re-creates the same tag and shape (a bounded process-wide table)
struct OpaqueOrigin {
  std::string tag;
  std::vector<hsize_t> dims;
  size_t elsize = 1;
};
std::mutex g_opaque_mutex;
std::unordered_map<std::string, OpaqueOrigin> g_opaque;
size_t g_opaque_bytes = 0;
constexpr size_t kOpaqueTableBytes = size_t{64} << 20;

void remember_opaque(const std::string& data, OpaqueOrigin origin) {
  std::lock_guard<std::mutex> lk(g_opaque_mutex);
  if (data.size() > kOpaqueTableBytes / 4) return;
  if (g_opaque_bytes + data.size() > kOpaqueTableBytes) {
    g_opaque.clear();
    g_opaque_bytes = 0;
  }
  if (g_opaque.emplace(data, std::move(origin)).second) g_opaque_bytes += data.size();
}

std::optional<OpaqueOrigin> opaque_origin(const std::string& data) {
  std::lock_guard<std::mutex> lk(g_opaque_mutex);
  auto it = g_opaque.find(data);
  if (it == g_opaque.end()) return std::nullopt;
  return it->second;
}

//! a non-tensor value as numpy would hold it (np.array(value)): the dtype string, shape and raw bytes
struct NumpyValue {
  std::string tag;    //!< the HDF5 opaque tag: "NUMPY:" + the dtype, or a tag kept from a read
  std::string dtype;  //!< "<i8", "<f8", "|b1", "<U3"
  std::vector<hsize_t> dims;
  size_t itemsize = 0;
  std::string bytes;
};

//! maximum non-tensor payload the store reads (a non-tensor is one small value, not bulk data)
constexpr hsize_t kMaxNonTensorBytes = hsize_t{256} << 20;

}  // namespace

// ---------------------------------------------------------------------------------------------- modes
H5Mode parse_h5_mode(const std::string& mode) {
  if (mode == "r") return H5Mode::Read;
  if (mode == "r+") return H5Mode::ReadWrite;
  if (mode == "w") return H5Mode::Write;
  if (mode == "a") return H5Mode::Append;
  throw ValueError("invalid HDF5 mode '" + mode + "' (expected \"r\", \"r+\", \"w\" or \"a\")");
}

std::string to_string(H5Mode mode) {
  switch (mode) {
    case H5Mode::Read: return "r";
    case H5Mode::ReadWrite: return "r+";
    case H5Mode::Write: return "w";
    case H5Mode::Append: return "a";
  }
  return "r";
}

// ---------------------------------------------------------------------------------------------- store
namespace {

class H5Store final : public LeafStore {
 public:
  H5Store(std::string file, H5Mode mode, LeafPath group, CreateOptions defaults, bool durable)
      : file_(std::move(file)), mode_(mode), group_(std::move(group)), defaults_(std::move(defaults)), durable_(durable) {
    open();
  }
  ~H5Store() override {
    try {
      LibraryGuard g;
      close_ids();
    } catch (...) {
    }
  }

  std::string driver() const override { return "h5"; }
  JsonValue spec_fields() const override {
    JsonValue::Object o{{"path", JsonValue(file_)}, {"group", JsonValue(join_path(group_))}, {"mode", JsonValue(to_string(mode_))}};
    if (!durable_) o.emplace_back("durable", JsonValue(false));
    return JsonValue::object(std::move(o));
  }
  std::string describe() const override {
    std::string d = "HDF5 file " + file_;
    if (!group_.empty()) d += " (group " + join_path(group_) + ")";
    return d;
  }
  bool writable() const override { return mode_ != H5Mode::Read; }
  std::optional<std::vector<int64_t>> stored_batch_size() const override { return std::nullopt; }
  void set_stored_batch_size(const std::vector<int64_t>&) override {}

  std::vector<LeafInfo> list() override {
    LibraryGuard g;
    ensure_open();
    std::vector<LeafInfo> out;
    list_group(root_.get(), {}, 0, out);
    return out;
  }

  std::vector<at::Tensor> read(const std::vector<LeafRead>& reads) override {
    LibraryGuard g;
    ensure_open();
    std::vector<at::Tensor> out;
    out.reserve(reads.size());
    for (const auto& r : reads) out.push_back(read_one(r));
    return out;
  }

  void write(const std::vector<LeafWrite>& writes) override {
    LibraryGuard g;
    ensure_open();
    ensure_writable("write");
    // validate everything first: a bad request leaves the file untouched
    for (const auto& w : writes) check_write(w);
    for (const auto& w : writes) do_write(w);
    // HDF5 keeps small raw-data writes (a row of a narrow leaf) in a dataset's sieve buffer (contiguous) or
    // chunk cache (chunked) until evicted or the file closed: a row reported written could then be lost to a
    // full disk at close (tests/api/test_faults.cpp, h5_writes_on_a_full_disk_keep_every_acknowledged_row).
    // A durable store reports a write batch done only once its bytes are in the file (the page cache); reads
    // keep the caches. Not durable (h5py's behaviour): the bytes reach the file at flush() / close().
    if (!durable_) return;
    for (const auto& w : writes) {
      if (w.path.empty()) continue;
      auto it = datasets_.find(rel_path(w.path));
      if (it != datasets_.end() && H5Dflush(it->second->ds.get()) < 0)
        fail<BackendError>(w.path, "cannot write the rows to the file");
    }
  }

  void create(const LeafPath& path, at::ScalarType dtype, const std::vector<int64_t>& shape, const at::Tensor& data,
              const CreateOptions& options) override {
    LibraryGuard g;
    ensure_open();
    ensure_writable("create " + join_path(path));
    check_path(path, describe());
    if (path.empty()) throw ValueError(describe() + ": cannot create a dataset at the root");
    auto ftype = h5_type_of(dtype);
    if (!ftype)
      throw TypeError(describe() + ", key '" + rel_path(path) + "': dtype " + c10::toString(dtype) +
                      " cannot be stored in HDF5 (numpy has no such dtype; upstream cannot write it either)");
    if (checked_numel(shape) < 0 || shape.size() > H5S_MAX_RANK)
      throw ValueError(where(path) + ": invalid shape " + shape_str(shape));
    at::Tensor src;
    if (data.defined()) {
      if (data.sizes().vec() != shape)
        throw ValueError(where(path) + ": data of shape " + shape_str(data.sizes().vec()) + " for a dataset of shape " +
                         shape_str(shape));
      src = data.to(at::kCPU, dtype).contiguous();
      if (src.is_conj()) src = src.resolve_conj();
      if (src.is_neg()) src = src.resolve_neg();
    }
    if (auto k = kind_at(path)) throw KeyError(where(path) + ": already exists (a " + *k + ")");
    ensure_parents(path);
    forget(path);
    StructureChange change(*this);  // bumps the generation when done, failed or not

    const CreateOptions& opt =
        (options.chunks.empty() && options.compression_level < 0 && !options.shuffle) ? defaults_ : options;
    std::vector<hsize_t> dims(shape.begin(), shape.end());
    Id space = space_id(shape.empty() ? H5Screate(H5S_SCALAR)
                                      : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
    if (!space.valid()) fail<BackendError>(path, "cannot create the dataspace");
    Id dcpl = plist_id(H5Pcreate(H5P_DATASET_CREATE));
    const size_t elsize = H5Tget_size(ftype->get());
    const bool chunked = !shape.empty() && (!opt.chunks.empty() || opt.compression_level >= 0 || opt.shuffle);
    if (opt.compression_level > 9) throw ValueError(where(path) + ": gzip level must be 0-9");
    if (chunked) {
      std::vector<hsize_t> chunk = chunk_shape(path, shape, opt.chunks, elsize);
      if (H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()) < 0)
        fail<ValueError>(path, "invalid chunk shape");
      if (opt.shuffle && H5Pset_shuffle(dcpl.get()) < 0) fail<BackendError>(path, "cannot set the shuffle filter");
      if (opt.compression_level >= 0 && H5Pset_deflate(dcpl.get(), static_cast<unsigned>(opt.compression_level)) < 0)
        fail<BackendError>(path, "cannot set the gzip filter");
      // chunks are allocated when first written; filling at allocation (per chunk) keeps unwritten parts
      // of a written chunk at zero and costs nothing for the chunks never written
      H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_ALLOC);
    } else if (!src.defined() && !may_reuse_space_) {
      // contiguous: allocated now (H5D_ALLOC_TIME_EARLY) and never pre-filled: fresh file space past the end
      // of file is a hole that reads as 0, so a 10 GB preallocation writes nothing and takes no disk. Early,
      // not at the first write (HDF5's default): the first write of a late dataset raises the file's end in
      // the superblock before the file itself grows, and a writer stopped in between (disk full, the file
      // size limit, a crash before close) leaves a file HDF5 refuses as truncated (tests/api/test_faults.cpp).
      // Only space freed in this session (or a persistent free-space manager) could hold old bytes: then the
      // fill value is written at allocation.
      H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY);
      H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_IFSET);
    } else if (src.defined()) {
      H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_IFSET);  // every byte is written right away
    } else {
      H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_ALLOC);  // the zeros are written at the first write
    }
    Id lcpl = plist_id(H5Pcreate(H5P_LINK_CREATE));
    H5Pset_create_intermediate_group(lcpl.get(), 1);
    Id ds = dataset_id(
        H5Dcreate2(root_.get(), rel_path(path).c_str(), ftype->get(), space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT));
    if (!ds.valid()) fail<BackendError>(path, "cannot create the dataset");
    if (src.defined() && src.numel() > 0) {
      if (H5Dwrite(ds.get(), ftype->get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, src.data_ptr()) < 0)
        fail<BackendError>(path, "cannot write the dataset");
    }
  }

  void create_group(const LeafPath& path) override {
    LibraryGuard g;
    ensure_open();
    ensure_writable("create group " + join_path(path));
    check_path(path, describe());
    if (path.empty()) return;
    if (auto k = kind_at(path)) {
      if (*k == "group") return;
      throw KeyError(where(path) + ": already exists (a " + *k + ")");
    }
    ensure_parents(path);
    Id lcpl = plist_id(H5Pcreate(H5P_LINK_CREATE));
    H5Pset_create_intermediate_group(lcpl.get(), 1);
    Id grp = group_id(H5Gcreate2(root_.get(), rel_path(path).c_str(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT));
    if (!grp.valid()) fail<BackendError>(path, "cannot create the group");
  }

  bool erase(const LeafPath& path) override {
    LibraryGuard g;
    ensure_open();
    ensure_writable("erase " + join_path(path));
    check_path(path, describe());
    if (path.empty()) throw ValueError(describe() + ": cannot erase the root group");
    if (!link_exists(path)) return false;
    forget_all();  // the path may be a group, or the target of soft links cached under other paths
    StructureChange change(*this);  // bumps the generation when done, failed or not
    if (H5Ldelete(root_.get(), rel_path(path).c_str(), H5P_DEFAULT) < 0) fail<BackendError>(path, "cannot delete");
    may_reuse_space_ = true;
    return true;
  }

  NonTensorValue read_non_tensor(const LeafPath& path) override {
    LibraryGuard g;
    ensure_open();
    check_path(path, describe());
    Id ds = open_dataset(path);
    Id ftype = type_id(H5Dget_type(ds.get()));
    if (!ftype.valid()) fail<FormatError>(path, "cannot read the datatype");
    TypeClass tc = classify(ftype.get());
    if (tc.kind == TypeClass::Tensor) throw TypeError(where(path) + ": is a tensor dataset, not a non-tensor");
    if (tc.kind == TypeClass::Unsupported) throw TypeError(where(path) + ": unsupported HDF5 type: " + tc.why);
    Id space = space_id(H5Dget_space(ds.get()));
    std::vector<hsize_t> dims = dataspace_dims(path, space.get());
    hsize_t n = 1;
    for (hsize_t d : dims) {
      if (d != 0 && n > kMaxNonTensorBytes / d) throw ValueError(where(path) + ": non-tensor value too large");
      n *= d;
    }
    NonTensorValue out;
    out.value = tc.kind == TypeClass::String ? read_strings(path, ds.get(), ftype.get(), space.get(), dims, n)
                                             : read_opaque(path, ds.get(), ftype.get(), dims, n);
    return out;
  }

  void write_non_tensor(const LeafPath& path, const NonTensorValue& value) override {
    LibraryGuard g;
    ensure_open();
    ensure_writable("write " + join_path(path));
    check_path(path, describe());
    if (path.empty()) throw ValueError(describe() + ": cannot write a non-tensor at the root");
    if (value.stacked)
      throw NotImplementedError(where(path) + ": HDF5 stores one non-tensor value per dataset (no per-row stack)");
    const JsonValue& v = value.value;
    // encode first: an unsupported value leaves the file untouched
    Id ftype, space;
    std::string payload;
    const char* str_ptr = nullptr;
    if (v.is_string()) {
      ftype = type_id(H5Tcopy(H5T_C_S1));
      H5Tset_size(ftype.get(), H5T_VARIABLE);
      H5Tset_cset(ftype.get(), H5T_CSET_UTF8);
      space = space_id(H5Screate(H5S_SCALAR));
      str_ptr = v.as_string().c_str();
      if (v.as_string().find('\0') != std::string::npos)
        throw ValueError(where(path) + ": a string with NUL characters cannot be stored as an HDF5 string");
    } else {
      NumpyValue nv = to_numpy(path, v);
      ftype = type_id(H5Tcreate(H5T_OPAQUE, nv.itemsize));
      if (!ftype.valid() || H5Tset_tag(ftype.get(), nv.tag.c_str()) < 0)
        fail<BackendError>(path, "cannot create the opaque type '" + nv.tag + "'");
      space = space_id(nv.dims.empty() ? H5Screate(H5S_SCALAR)
                                       : H5Screate_simple(static_cast<int>(nv.dims.size()), nv.dims.data(), nullptr));
      payload = std::move(nv.bytes);
    }
    if (!space.valid()) fail<BackendError>(path, "cannot create the dataspace");
    if (auto k = kind_at(path)) {
      if (*k == "group") throw TypeError(where(path) + ": is a group, not a leaf");
      forget_all();  // soft links elsewhere may have led to the dataset replaced here
      if (H5Ldelete(root_.get(), rel_path(path).c_str(), H5P_DEFAULT) < 0)
        fail<BackendError>(path, "cannot replace the dataset");
      may_reuse_space_ = true;
    }
    ensure_parents(path);
    forget(path);
    StructureChange change(*this);  // bumps the generation when done, failed or not
    Id lcpl = plist_id(H5Pcreate(H5P_LINK_CREATE));
    H5Pset_create_intermediate_group(lcpl.get(), 1);
    Id ds = dataset_id(H5Dcreate2(root_.get(), rel_path(path).c_str(), ftype.get(), space.get(), lcpl.get(),
                                  H5P_DEFAULT, H5P_DEFAULT));
    if (!ds.valid()) fail<BackendError>(path, "cannot create the dataset");
    herr_t rc = 0;
    if (str_ptr) rc = H5Dwrite(ds.get(), ftype.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, &str_ptr);
    else if (!payload.empty()) rc = H5Dwrite(ds.get(), ftype.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, payload.data());
    if (rc < 0) fail<BackendError>(path, "cannot write the dataset");
  }

  void flush() override {
    LibraryGuard g;
    ensure_open();
    if (!writable()) return;
    if (H5Fflush(file_id_.get(), H5F_SCOPE_LOCAL) < 0) fail<BackendError>({}, "flush failed");
  }

  void close() override {
    LibraryGuard g;
    if (!file_id_.valid()) return;
    // the cached dataset ids first: H5F_CLOSE_STRONG would close them under the cache, leaving stale ids
    datasets_.clear();
    root_.reset();
    hid_t f = file_id_.release();
    if (H5Fclose(f) < 0) throw BackendError(describe() + ": closing failed: " + hdf5_message());
  }

 private:
  struct Prepared {
    at::ScalarType dtype = at::kFloat;
    std::vector<hsize_t> dims;
  };

  //! an open dataset kept for tensor I/O, with what is derived from it. Valid while this store alone changes
  //! the file's structure (a writer has the file to itself: HDF5's lock, and a second writer is refused).
  struct CachedDataset {
    Id ds, ftype, fspace;  //!< fspace: the file dataspace, its selection set anew by every transfer
    TypeClass tc;
    bool tensor_ready = false;  //!< p, mtype and read_type are set (a tensor dataset with a valid dataspace)
    Prepared p;
    Id mtype;      //!< the dtype's own type (writes; reads of every dtype but bool)
    Id read_type;  //!< bool: the file's enum as native type (read as is, normalized to 0/1)
    size_t row_bytes = 0;  //!< bytes of one row (dim 0) in memory
    Id mspace;             //!< the memory dataspace of the last selection of `mspace_rows` rows
    hsize_t mspace_rows = 0;
    bool chunked = false;  //!< chunked layout: scattered rows go one run per transfer (transfer_rows)
  };
  //! open datasets cached by path: far above the datasets of a TensorDict, bounded for files of many leaves
  static constexpr size_t kMaxCachedDatasets = 4096;

  // ----------------------------------------------------------------------------- open / close
  void open() {
    LibraryGuard g;
    namespace fs = std::filesystem;
    if (file_.empty()) throw ValueError("HDF5 store: empty file path");
    file_ = fs::absolute(fs::path(file_)).lexically_normal().string();
    check_path(group_, "HDF5 file " + file_);
    struct stat st;
    const bool exists = ::stat(file_.c_str(), &st) == 0;
    const int stat_errno = errno;
    if (exists && S_ISDIR(st.st_mode)) throw BackendError("HDF5 file " + file_ + ": is a directory");
    if (exists && !S_ISREG(st.st_mode)) throw BackendError("HDF5 file " + file_ + ": not a regular file");
    if (!exists && stat_errno != ENOENT)
      throw BackendError("HDF5 file " + file_ + ": cannot stat: " + std::strerror(stat_errno));
    H5Mode how = mode_;
    if (how == H5Mode::Append) how = exists ? H5Mode::ReadWrite : H5Mode::Write;
    if ((how == H5Mode::Read || how == H5Mode::ReadWrite) && !exists)
      throw BackendError("HDF5 file " + file_ + ": no such file (mode \"" + to_string(mode_) + "\")");
    // HDF5 would turn an empty file opened read-write into a new file: it is no HDF5 file
    if (how == H5Mode::ReadWrite && st.st_size == 0)
      throw FormatError("HDF5 file " + file_ + ": not a valid HDF5 file (truncated or corrupted): the file is empty");

    Id fapl = plist_id(H5Pcreate(H5P_FILE_ACCESS));
    H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG);  // close() really releases the file
    // a durable writable file flushes the sieve buffer of every dataset it writes (write()): 4 KiB instead of
    // HDF5's 64 KiB makes that flush a 4 KiB pwrite while reads of nearby rows still hit the buffer
    if (durable_ && how != H5Mode::Read) H5Pset_sieve_buf_size(fapl.get(), kDurableSieveBytes);

    if (how == H5Mode::Write) {
      if (exists) refuse_if_locked();  // HDF5 truncates BEFORE it takes its lock: never wipe another writer's file
      hid_t f = H5Fcreate(file_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get());
      if (f < 0) {
        std::string msg = hdf5_message();
        throw BackendError("HDF5 file " + file_ + ": cannot create" + lock_hint(msg) + ": " + msg);
      }
      file_id_ = Id(f, H5Fclose);
    } else {
      const bool rw = how == H5Mode::ReadWrite;
      if (::access(file_.c_str(), rw ? (R_OK | W_OK) : R_OK) != 0)
        throw BackendError("HDF5 file " + file_ + ": cannot open for " + (rw ? "writing" : "reading") + ": " +
                           std::strerror(errno));
      hid_t f = H5Fopen(file_.c_str(), rw ? H5F_ACC_RDWR : H5F_ACC_RDONLY, fapl.get());
      if (f < 0) {
        std::string msg = hdf5_message();
        if (is_lock_error(msg))
          throw BackendError("HDF5 file " + file_ + ": cannot open (mode \"" + to_string(mode_) + "\")" +
                             lock_hint(msg) + ": " + msg);
        throw FormatError("HDF5 file " + file_ + ": not a valid HDF5 file (truncated or corrupted): " + msg);
      }
      file_id_ = Id(f, H5Fclose);
      // a persistent free-space manager may hand out old bytes for new datasets: write fill values then
      Id fcpl = plist_id(H5Fget_create_plist(f));
      H5F_fspace_strategy_t strategy;
      hbool_t persist = 0;
      hsize_t threshold = 0;
      if (fcpl.valid() && H5Pget_file_space_strategy(fcpl.get(), &strategy, &persist, &threshold) >= 0 && persist)
        may_reuse_space_ = true;
      clear_errors();
    }
    // this process's stores of the file share its structure generation
    struct stat opened;
    generation_ = ::stat(file_.c_str(), &opened) == 0 ? file_generation(opened.st_dev, opened.st_ino)
                                                       : std::make_shared<Generation>(0);
    seen_generation_ = generation_->load();
    // the root group
    if (group_.empty()) {
      root_ = group_id(H5Gopen2(file_id_.get(), "/", H5P_DEFAULT));
      if (!root_.valid()) {
        std::string msg = hdf5_message();
        close_ids();
        throw FormatError("HDF5 file " + file_ + ": cannot open the root group: " + msg);
      }
      return;
    }
    Id top = group_id(H5Gopen2(file_id_.get(), "/", H5P_DEFAULT));
    if (!top.valid()) {
      std::string msg = hdf5_message();
      close_ids();
      throw FormatError("HDF5 file " + file_ + ": cannot open the root group: " + msg);
    }
    std::optional<std::string> kind;
    try {
      kind = kind_at_in(top.get(), group_);
    } catch (...) {
      top.reset();
      close_ids();
      throw;
    }
    if (!kind) {
      if (!writable()) {
        top.reset();
        close_ids();
        throw KeyError("HDF5 file " + file_ + ": no group " + join_path(group_));
      }
      Id lcpl = plist_id(H5Pcreate(H5P_LINK_CREATE));
      H5Pset_create_intermediate_group(lcpl.get(), 1);
      Id made = group_id(H5Gcreate2(top.get(), rel_path(group_).c_str(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT));
      if (!made.valid()) {
        std::string msg = hdf5_message();
        top.reset();
        close_ids();
        throw BackendError("HDF5 file " + file_ + ": cannot create the group " + join_path(group_) + ": " + msg);
      }
    } else if (*kind != "group") {
      top.reset();
      close_ids();
      throw KeyError("HDF5 file " + file_ + ": " + join_path(group_) + " is a " + *kind + ", not a group");
    }
    root_ = group_id(H5Gopen2(top.get(), rel_path(group_).c_str(), H5P_DEFAULT));
    if (!root_.valid()) {
      std::string msg = hdf5_message();
      top.reset();
      close_ids();
      throw FormatError("HDF5 file " + file_ + ": cannot open the group " + join_path(group_) + ": " + msg);
    }
  }

  static bool is_lock_error(const std::string& msg) {
    for (const char* k : {"unable to lock", "lock file", "file lock", "already open"})
      if (msg.find(k) != std::string::npos) return true;
    return false;
  }
  static std::string lock_hint(const std::string& msg) {
    return is_lock_error(msg) ? " (the file is locked: another process or store has it open for writing, or this "
                                "process has it open already)"
                              : "";
  }

  //! HDF5 (1.10) truncates a file opened with H5F_ACC_TRUNC before taking its flock, so a "w" open of a file
  //! that another process is writing would destroy it and only then fail. Check the lock first (unless
  //! HDF5's file locking is turned off by HDF5_USE_FILE_LOCKING=FALSE).
  void refuse_if_locked() const {
    if (const char* env = std::getenv("HDF5_USE_FILE_LOCKING"); env && std::strcmp(env, "FALSE") == 0) return;
    int fd = ::open(file_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return;  // H5Fcreate reports it
    const bool locked = ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    if (!locked) ::flock(fd, LOCK_UN);
    ::close(fd);
    if (locked)
      throw BackendError("HDF5 file " + file_ +
                         ": cannot open with mode \"w\": the file is locked by another process or store (HDF5 file "
                         "locking); it was left untouched");
  }

  void close_ids() {
    datasets_.clear();
    root_.reset();
    file_id_.reset();
  }

  void ensure_open() const {
    if (!file_id_.valid()) throw BackendError(describe() + " is closed");
  }
  void ensure_writable(const std::string& what) const {
    if (!writable()) throw ValueError(describe() + " is opened read-only (mode \"r\"): cannot " + what);
  }

  std::string where(const LeafPath& path) const { return describe() + ", dataset " + join_path(path); }

  //! check_path(path, describe()), the message built only for a bad path (reads and writes of rows are hot)
  void check_key(const LeafPath& path) const {
    for (const auto& part : path)
      if (bad_part(part)) check_path(path, describe());
  }

  template <class E>
  [[noreturn]] void fail(const LeafPath& path, const std::string& what) const {
    throw E(where(path) + ": " + what + ": " + hdf5_message());
  }

  // ----------------------------------------------------------------------------- structure
  //! "group" | "dataset" | "link" (any other object / a dangling link) | nullopt when missing
  std::optional<std::string> kind_at_in(hid_t base, const LeafPath& path) const {
    std::string prefix;
    for (size_t i = 0; i < path.size(); ++i) {
      prefix += (i ? "/" : "") + path[i];
      htri_t e = H5Lexists(base, prefix.c_str(), H5P_DEFAULT);
      if (e < 0) {
        std::string msg = hdf5_message();
        throw FormatError(describe() + ": cannot look up " + join_path(path) + ": " + msg);
      }
      if (e == 0) return std::nullopt;
      if (i + 1 < path.size()) {
        // a prefix must be a group to hold more
        Id o = object_id(H5Oopen(base, prefix.c_str(), H5P_DEFAULT));
        if (!o.valid()) {
          clear_errors();
          return "link";
        }
        if (H5Iget_type(o.get()) != H5I_GROUP) return std::nullopt;
      }
    }
    Id o = object_id(H5Oopen(base, prefix.c_str(), H5P_DEFAULT));
    if (!o.valid()) {
      clear_errors();
      return std::string("link");
    }
    switch (H5Iget_type(o.get())) {
      case H5I_GROUP: return std::string("group");
      case H5I_DATASET: return std::string("dataset");
      default: return std::string("link");
    }
  }
  std::optional<std::string> kind_at(const LeafPath& path) const { return kind_at_in(root_.get(), path); }

  bool link_exists(const LeafPath& path) const {
    std::string prefix;
    for (size_t i = 0; i < path.size(); ++i) {
      prefix += (i ? "/" : "") + path[i];
      htri_t e = H5Lexists(root_.get(), prefix.c_str(), H5P_DEFAULT);
      if (e < 0) {
        clear_errors();
        return false;
      }
      if (e == 0) return false;
    }
    return true;
  }

  //! every prefix of `path` (without its last part) must be a group or missing
  void ensure_parents(const LeafPath& path) const {
    for (size_t n = 1; n < path.size(); ++n) {
      LeafPath prefix(path.begin(), path.begin() + static_cast<std::ptrdiff_t>(n));
      auto k = kind_at(prefix);
      if (k && *k != "group")
        throw KeyError(where(path) + ": its parent " + join_path(prefix) + " is a " + *k + ", not a group");
      if (!k) break;
    }
  }

  Id open_dataset(const LeafPath& path) const {
    if (path.empty()) throw KeyError(describe() + ": the root is a group, not a dataset");
    auto k = kind_at(path);
    if (!k) throw KeyError(where(path) + ": no such dataset");
    if (*k != "dataset") throw KeyError(where(path) + ": is a " + *k + ", not a dataset");
    Id ds = dataset_id(H5Dopen2(root_.get(), rel_path(path).c_str(), H5P_DEFAULT));
    if (!ds.valid()) fail<FormatError>(path, "cannot open the dataset");
    check_storage(path, ds.get());
    return ds;
  }

  //! the dataset's storage must hold its elements: libhdf5 1.10 trusts the layout message, and reading a
  //! compact dataset whose recorded size is too small crashes inside the library (found by fuzz_h5_open).
  //! External raw files and virtual datasets (data read from other files) are refused.
  void check_storage(const LeafPath& path, hid_t ds) const {
    Id dcpl = plist_id(H5Dget_create_plist(ds));
    if (!dcpl.valid()) fail<FormatError>(path, "cannot read the dataset's creation properties");
    const H5D_layout_t layout = H5Pget_layout(dcpl.get());
    if (layout == H5D_VIRTUAL)
      throw FormatError(where(path) + ": virtual datasets (data in other files) are not supported");
    if (layout != H5D_COMPACT && layout != H5D_CONTIGUOUS && layout != H5D_CHUNKED)
      fail<FormatError>(path, "unknown storage layout");
    if (H5Pget_external_count(dcpl.get()) > 0)
      throw FormatError(where(path) + ": external raw data files are not supported");
    if (layout == H5D_CHUNKED) return;
    Id ftype = type_id(H5Dget_type(ds));
    Id space = space_id(H5Dget_space(ds));
    if (!ftype.valid() || !space.valid()) fail<FormatError>(path, "cannot read the datatype or dataspace");
    const hssize_t npoints = H5Sget_simple_extent_npoints(space.get());
    const size_t elsize = H5Tget_size(ftype.get());
    if (npoints < 0 || elsize == 0) fail<FormatError>(path, "bad dataspace or datatype");
    const double need = static_cast<double>(npoints) * static_cast<double>(elsize);
    const hsize_t have = H5Dget_storage_size(ds);
    clear_errors();
    const bool allocated = have > 0 || layout == H5D_COMPACT;
    if (allocated && static_cast<double>(have) < need)
      throw FormatError(where(path) + ": its storage holds " + std::to_string(have) + " bytes, its shape and type need " +
                        std::to_string(static_cast<unsigned long long>(need)));
  }

  //! the dims of a scalar ({}) or simple dataspace; FormatError for a null dataspace
  std::vector<hsize_t> dataspace_dims(const LeafPath& path, hid_t space) const {
    if (space < 0) fail<FormatError>(path, "cannot read the dataspace");
    H5S_class_t c = H5Sget_simple_extent_type(space);
    if (c == H5S_SCALAR) return {};
    if (c != H5S_SIMPLE) throw FormatError(where(path) + ": has a null (empty) dataspace, not a value");
    int rank = H5Sget_simple_extent_ndims(space);
    if (rank < 0 || rank > H5S_MAX_RANK) fail<FormatError>(path, "bad dataspace rank");
    std::vector<hsize_t> dims(static_cast<size_t>(rank));
    if (rank > 0 && H5Sget_simple_extent_dims(space, dims.data(), nullptr) < 0)
      fail<FormatError>(path, "cannot read the dataspace dims");
    for (hsize_t d : dims)
      if (d > static_cast<hsize_t>(std::numeric_limits<int64_t>::max()))
        throw FormatError(where(path) + ": dimension overflows int64");
    return dims;
  }

  struct LinkEntry {
    std::string name;
    H5L_type_t type;
  };
  static herr_t collect_link(hid_t, const char* name, const H5L_info_t* info, void* data) {
    auto* v = static_cast<std::vector<LinkEntry>*>(data);
    try {
      v->push_back({name, info->type});
    } catch (...) {
      return -1;
    }
    return 0;
  }

  static constexpr int kMaxDepth = 64;
  static constexpr size_t kMaxEntries = 1000000;

  void list_group(hid_t grp, const LeafPath& prefix, int depth, std::vector<LeafInfo>& out) const {
    if (depth > kMaxDepth)
      throw FormatError(describe() + ": groups nested deeper than " + std::to_string(kMaxDepth) + " levels at " +
                        join_path(prefix) + " (a cycle of links?)");
    std::vector<LinkEntry> links;
    hsize_t idx = 0;
    if (H5Literate(grp, H5_INDEX_NAME, H5_ITER_INC, &idx, collect_link, &links) < 0) {
      std::string msg = hdf5_message();
      throw FormatError(describe() + ": cannot list the group " + join_path(prefix) + ": " + msg);
    }
    for (const auto& l : links) {
      if (l.type != H5L_TYPE_HARD && l.type != H5L_TYPE_SOFT) continue;  // external / user links: not followed
      LeafPath path = prefix;
      path.push_back(l.name);
      if (l.name.empty() || l.name == "." || l.name.find('/') != std::string::npos) continue;
      Id o = object_id(H5Oopen(grp, l.name.c_str(), H5P_DEFAULT));
      if (!o.valid()) {
        if (l.type == H5L_TYPE_SOFT) {  // a dangling soft link: nothing to list
          clear_errors();
          continue;
        }
        std::string msg = hdf5_message();
        throw FormatError(describe() + ": cannot open " + join_path(path) + ": " + msg);
      }
      if (out.size() >= kMaxEntries) throw FormatError(describe() + ": more than 1e6 groups and datasets");
      const H5I_type_t t = H5Iget_type(o.get());
      if (t == H5I_GROUP) {
        LeafInfo info;
        info.path = path;
        info.kind = LeafKind::Group;
        out.push_back(std::move(info));
        list_group(o.get(), path, depth + 1, out);
      } else if (t == H5I_DATASET) {
        out.push_back(dataset_info(o.get(), path));
      }
      // committed datatypes are not leaves
    }
  }

  LeafInfo dataset_info(hid_t ds, const LeafPath& path) const {
    LeafInfo info;
    info.path = path;
    Id ftype = type_id(H5Dget_type(ds));
    if (!ftype.valid()) fail<FormatError>(path, "cannot read the datatype");
    TypeClass tc = classify(ftype.get());
    // a type the store cannot map (compound records, vlen sequences, references, ...) is listed as a non-tensor
    // leaf, as upstream lists every dataset: the file opens and its other keys work; reading that key (tensor or
    // non-tensor) is the TypeError naming it (read_non_tensor, cached_tensor)
    if (tc.kind != TypeClass::Tensor) {
      info.kind = LeafKind::NonTensor;
      return info;
    }
    info.kind = LeafKind::Tensor;
    info.dtype = tc.dtype;
    Id space = space_id(H5Dget_space(ds));
    for (hsize_t d : dataspace_dims(path, space.get())) info.shape.push_back(static_cast<int64_t>(d));
    if (checked_numel(info.shape) < 0 ||
        checked_numel(info.shape) > std::numeric_limits<int64_t>::max() / 16)
      throw FormatError(where(path) + ": shape " + shape_str(info.shape) + " overflows");
    return info;
  }

  // ----------------------------------------------------------------------------- tensor I/O
  //! rows within dim 0, ascending and unique; a list is checked once for the leaves of a call that share it
  //! (and the same dim 0)
  void check_rows(const LeafPath& path, const std::vector<hsize_t>& dims, const RowList& list) {
    if (dims.empty()) throw ValueError(where(path) + ": a zero-dim dataset can only be read or written whole");
    checked_rows_.get(list, static_cast<int64_t>(dims[0]), [&] {
      check_rows_once(path, dims, list.vec());
      return true;
    });
  }
  void check_rows_once(const LeafPath& path, const std::vector<hsize_t>& dims, const std::vector<int64_t>& rows) const {
    for (size_t i = 0; i < rows.size(); ++i) {
      if (rows[i] < 0 || static_cast<hsize_t>(rows[i]) >= dims[0])
        throw IndexError(where(path) + ": row " + std::to_string(rows[i]) + " out of range for dim 0 of size " +
                         std::to_string(dims[0]));
      if (i && rows[i] <= rows[i - 1]) throw ValueError(where(path) + ": rows must be ascending and unique");
    }
  }

  //! runs of consecutive rows per HDF5 selection: HDF5 1.10 merges each OR-ed hyperslab into the
  //! selection in time linear in its size, so one selection of n runs costs O(n^2) (20000 single-row runs:
  //! ~37 s). Batches of kRunsPerTransfer runs (one H5Dread/H5Dwrite each) keep it linear.
  static constexpr size_t kRunsPerTransfer = 32;

  //! how a list of rows (ascending, unique) is selected: runs of consecutive rows of one length `len` whose
  //! starts are evenly spaced `step` apart (one run, td[a:b:s], blocks of a regular pattern) are ONE strided
  //! hyperslab and one transfer; other rows go as `runs` (first row, count)
  struct RowLayout {
    bool regular = false;
    hsize_t first = 0, len = 1, step = 1, count = 0;
    std::vector<std::pair<hsize_t, hsize_t>> runs;
  };
  static RowLayout layout_of(const std::vector<int64_t>& rows) {
    RowLayout l;
    const size_t n_rows = rows.size();
    if (n_rows == 0) return l;
    size_t len = 1;
    while (len < n_rows && rows[len] == rows[len - 1] + 1) ++len;
    bool regular = n_rows % len == 0;
    const int64_t step = len < n_rows ? rows[len] - rows[0] : static_cast<int64_t>(len);
    for (size_t i = len; regular && i < n_rows; ++i)
      regular = rows[i] - rows[i - len] == step;  // periodic differences: runs of len, step apart
    if (regular) {
      l.regular = true;
      l.first = static_cast<hsize_t>(rows[0]);
      l.len = static_cast<hsize_t>(len);
      l.step = static_cast<hsize_t>(step);
      l.count = static_cast<hsize_t>(n_rows / len);
      return l;
    }
    for (size_t i = 0; i < n_rows;) {
      size_t j = i + 1;
      while (j < n_rows && rows[j] == rows[j - 1] + 1) ++j;
      l.runs.emplace_back(static_cast<hsize_t>(rows[i]), static_cast<hsize_t>(j - i));
      i = j;
    }
    return l;
  }

  //! reads (or writes) `rows` (ascending, unique) along dim 0 of the cached dataset `e` from (to) the
  //! contiguous buffer `buf` of [rows.size(), dims[1:]...] elements of `mtype`. The list's layout is worked
  //! out once for all the leaves of a call that share it (layouts_)
  void transfer_rows(const LeafPath& path, CachedDataset& e, hid_t mtype, const RowList& rows, void* buf,
                     bool write) {
    if (rows.empty()) return;
    if (!e.fspace.valid()) fail<FormatError>(path, "cannot read the dataspace");
    const RowLayout& layout = layouts_.get(rows, 0, [&] { return layout_of(rows.vec()); });
    const std::vector<hsize_t>& dims = e.p.dims;
    const size_t rank = dims.size();
    const hid_t fspace = e.fspace.get();
    // inner dims: whole (stride = block = the dim: one block per row, never overlapping)
    std::array<hsize_t, H5S_MAX_RANK> start{}, stride{}, count{}, block{}, mdims{};
    for (size_t d = 1; d < rank; ++d) {
      stride[d] = block[d] = mdims[d] = dims[d];
      count[d] = 1;
    }
    auto transfer = [&](hsize_t n, size_t out_row) {
      if (!e.mspace.valid() || e.mspace_rows != n) {
        mdims[0] = n;
        e.mspace = space_id(H5Screate_simple(static_cast<int>(rank), mdims.data(), nullptr));
        e.mspace_rows = n;
        if (!e.mspace.valid()) fail<BackendError>(path, "cannot create the memory dataspace");
      }
      char* p = static_cast<char*>(buf) + out_row * e.row_bytes;
      if (write) {
        if (H5Dwrite(e.ds.get(), mtype, e.mspace.get(), fspace, H5P_DEFAULT, p) < 0)
          fail<BackendError>(path, "cannot write");
      } else {
        if (H5Dread(e.ds.get(), mtype, e.mspace.get(), fspace, H5P_DEFAULT, p) < 0)
          fail<FormatError>(path, "cannot read");
      }
    };
    if (layout.regular) {
      start[0] = layout.first;
      stride[0] = layout.step;
      count[0] = layout.count;
      block[0] = layout.len;
      if (H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start.data(), stride.data(), count.data(), block.data()) < 0)
        fail<BackendError>(path, "cannot select rows");
      transfer(static_cast<hsize_t>(rows.size()), 0);
      return;
    }
    const auto& runs = layout.runs;
    size_t out_row = 0;
    stride[0] = 1;
    block[0] = 1;
    // chunked: one run per transfer. HDF5 maps a multi-run selection onto chunks before it reads any; single
    // runs (mostly inside one cached chunk) measured faster for scattered rows (bench_h5: a ~50% mask of a
    // gzip-chunked [10000, 64] dataset, 1.6x slower in 32-run batches than the raw API one run at a time)
    const size_t per_transfer = e.chunked ? 1 : kRunsPerTransfer;
    for (size_t b = 0; b < runs.size(); b += per_transfer) {
      const size_t end = std::min(runs.size(), b + per_transfer);
      hsize_t n = 0;
      for (size_t k = b; k < end; ++k) {
        start[0] = runs[k].first;
        count[0] = runs[k].second;
        n += runs[k].second;
        if (H5Sselect_hyperslab(fspace, k == b ? H5S_SELECT_SET : H5S_SELECT_OR, start.data(), stride.data(),
                                count.data(), block.data()) < 0)
          fail<BackendError>(path, "cannot select rows");
      }
      transfer(n, out_row);
      out_row += static_cast<size_t>(n);
    }
  }

  at::Tensor allocate(const LeafPath& path, at::IntArrayRef shape, at::ScalarType dtype) const {
    try {
      return at::detail::empty_cpu(shape, dtype);  // at::empty without the dispatcher (~0.3 us a call)
    } catch (const std::bad_alloc&) {
    } catch (const c10::Error&) {
    }
    throw BackendError(where(path) + ": cannot allocate a tensor of shape " + shape_str(shape.vec()));
  }

  // ----------------------------------------------------------------------------- dataset cache
  //! forget the cached dataset at `path` (and below it)
  void forget(const LeafPath& path) {
    const std::string key = rel_path(path);
    for (auto it = datasets_.begin(); it != datasets_.end();) {
      const std::string& k = it->first;
      if (k == key || (k.size() > key.size() && k.compare(0, key.size(), key) == 0 && k[key.size()] == '/'))
        it = datasets_.erase(it);
      else
        ++it;
    }
  }
  void forget_all() { datasets_.clear(); }

  //! tells this process's other stores of the file that its structure changed (this store forgets itself)
  void changed_structure() noexcept {
    const uint64_t before = generation_->fetch_add(1);
    if (before == seen_generation_) seen_generation_ = before + 1;  // no other store changed it meanwhile
  }
  //! calls changed_structure() at the end of a scope that changes the structure: after the change, so that a
  //! store on another thread cannot keep what it opened while the change was under way
  struct StructureChange {
    H5Store& store;
    explicit StructureChange(H5Store& s) : store(s) {}
    StructureChange(const StructureChange&) = delete;
    StructureChange& operator=(const StructureChange&) = delete;
    ~StructureChange() { store.changed_structure(); }
  };

  //! the dataset at `path`, opened once and kept (open_dataset's checks and errors on the first use)
  CachedDataset& cached_dataset(const LeafPath& path) {
    if (path.empty()) throw KeyError(describe() + ": the root is a group, not a dataset");
    const uint64_t generation = generation_->load();
    if (generation != seen_generation_) {  // another store of this process changed the file's structure
      datasets_.clear();
      seen_generation_ = generation;
    }
    const std::string key = rel_path(path);
    auto it = datasets_.find(key);
    // the ids stay valid until this store closes them: another store's H5F_CLOSE_STRONG closes only the
    // objects opened through its own file id (two_stores_on_one_file); structure changes: generation_
    if (it != datasets_.end()) return *it->second;
    auto e = std::make_unique<CachedDataset>();
    e->ds = open_dataset(path);
    e->ftype = type_id(H5Dget_type(e->ds.get()));
    if (!e->ftype.valid()) fail<FormatError>(path, "cannot read the datatype");
    e->tc = classify(e->ftype.get());
    e->fspace = space_id(H5Dget_space(e->ds.get()));
    if (datasets_.size() >= kMaxCachedDatasets) datasets_.clear();
    return *datasets_.emplace(key, std::move(e)).first->second;
  }

  //! the tensor dataset at `path` (tensor_dataset's checks and errors), its dtype, dims and memory types set
  CachedDataset& cached_tensor(const LeafPath& path) {
    CachedDataset& e = cached_dataset(path);
    if (e.tc.kind == TypeClass::Unsupported) throw TypeError(where(path) + ": unsupported HDF5 type: " + e.tc.why);
    if (e.tc.kind != TypeClass::Tensor) throw TypeError(where(path) + ": is a non-tensor dataset, not a tensor");
    if (e.tensor_ready) return e;
    Prepared p;
    p.dtype = e.tc.dtype;
    p.dims = dataspace_dims(path, e.fspace.get());
    std::vector<int64_t> shape(p.dims.begin(), p.dims.end());
    if (checked_numel(shape) < 0 || checked_numel(shape) > std::numeric_limits<int64_t>::max() / 16)
      throw FormatError(where(path) + ": shape " + shape_str(shape) + " overflows");
    e.mtype = std::move(*h5_type_of(p.dtype));
    if (p.dtype == at::kBool) e.read_type = type_id(H5Tget_native_type(e.ftype.get(), H5T_DIR_ASCEND));
    clear_errors();
    e.row_bytes = c10::elementSize(p.dtype);  // the memory types' size (bool: the file's 1-byte enum)
    for (size_t d = 1; d < p.dims.size(); ++d) e.row_bytes *= static_cast<size_t>(p.dims[d]);
    e.p = std::move(p);
    {
      Id dcpl = plist_id(H5Dget_create_plist(e.ds.get()));
      e.chunked = dcpl.valid() && H5Pget_layout(dcpl.get()) == H5D_CHUNKED;
      clear_errors();
    }
    e.tensor_ready = true;
    return e;
  }

  at::Tensor read_one(const LeafRead& r) {
    check_key(r.path);
    CachedDataset& e = cached_tensor(r.path);
    const Prepared& p = e.p;
    const bool whole = r.whole && r.rows.empty();
    c10::SmallVector<int64_t, 8> shape(p.dims.begin(), p.dims.end());
    if (!whole) {
      check_rows(r.path, p.dims, r.rows);
      shape[0] = static_cast<int64_t>(r.rows.size());
    }
    if (r.shape) {
      if (checked_numel(std::vector<int64_t>(shape.begin(), shape.end())) != checked_numel(*r.shape))
        throw ValueError(where(r.path) + ": cannot return the rows read as shape " + shape_str(*r.shape));
      shape.assign(r.shape->begin(), r.shape->end());
    }
    at::Tensor out = allocate(r.path, shape, p.dtype);
    if (out.numel() == 0) return out;
    // memory type: the dtype's own type (HDF5 converts byte order / float layouts); bool reads the file's
    // enum as is (no enum conversion), normalized to 0/1 below
    const Id& mtype = p.dtype == at::kBool ? e.read_type : e.mtype;
    if (!mtype.valid()) fail<FormatError>(r.path, "cannot build the memory type");
    if (whole) {
      if (H5Dread(e.ds.get(), mtype.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data_ptr()) < 0)
        fail<FormatError>(r.path, "cannot read");
    } else {
      transfer_rows(r.path, e, mtype.get(), r.rows, out.data_ptr(), /*write=*/false);
    }
    if (p.dtype == at::kBool) {
      at::Tensor bytes = out.view(at::kByte);
      bytes.ne_(0);
    }
    return out;
  }

  void check_write(const LeafWrite& w) {
    check_key(w.path);
    const Prepared& p = cached_tensor(w.path).p;
    if (!w.data.defined()) throw ValueError(where(w.path) + ": no data to write");
    if (w.data.scalar_type() != p.dtype)
      throw TypeError(where(w.path) + ": data of dtype " + c10::toString(w.data.scalar_type()) +
                      " for a dataset of dtype " + c10::toString(p.dtype));
    std::vector<int64_t> expect(p.dims.begin(), p.dims.end());
    const bool whole = w.whole && w.rows.empty();
    if (!whole) {
      check_rows(w.path, p.dims, w.rows);
      expect[0] = static_cast<int64_t>(w.rows.size());
    }
    int64_t want = 1;
    for (int64_t d : expect) want *= d;
    if (w.data.numel() != want)  // the elements count, not the shape (LeafWrite)
      throw ValueError(where(w.path) + ": data of shape " + shape_str(w.data.sizes().vec()) + ", expected " +
                       shape_str(expect));
  }

  void do_write(const LeafWrite& w) {
    if (w.data.numel() == 0) return;
    at::Tensor src = (w.data.is_cpu() ? w.data : w.data.to(at::kCPU)).contiguous();
    if (src.is_conj()) src = src.resolve_conj();
    if (src.is_neg()) src = src.resolve_neg();
    CachedDataset& e = cached_tensor(w.path);
    if (w.whole && w.rows.empty()) {
      if (H5Dwrite(e.ds.get(), e.mtype.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, src.data_ptr()) < 0)
        fail<BackendError>(w.path, "cannot write");
    } else {
      transfer_rows(w.path, e, e.mtype.get(), w.rows, src.data_ptr(), /*write=*/true);
    }
  }

  //! the chunk shape for create(): the asked one (checked), or rows of ~1 MiB
  std::vector<hsize_t> chunk_shape(const LeafPath& path, const std::vector<int64_t>& shape,
                                   const std::vector<int64_t>& asked, size_t elsize) const {
    std::vector<hsize_t> chunk(shape.size());
    if (!asked.empty()) {
      if (asked.size() != shape.size())
        throw ValueError(where(path) + ": chunk shape " + shape_str(asked) + " does not match the rank of " +
                         shape_str(shape));
      for (size_t i = 0; i < shape.size(); ++i) {
        if (asked[i] <= 0 || (shape[i] > 0 && asked[i] > shape[i]))
          throw ValueError(where(path) + ": chunk shape " + shape_str(asked) + " invalid for shape " +
                           shape_str(shape));
        chunk[i] = static_cast<hsize_t>(asked[i]);
      }
      return chunk;
    }
    constexpr double kTarget = 1 << 20;
    for (size_t i = 0; i < shape.size(); ++i) chunk[i] = static_cast<hsize_t>(std::max<int64_t>(1, shape[i]));
    for (size_t i = 0; i < shape.size(); ++i) {
      double bytes = static_cast<double>(elsize);
      for (hsize_t c : chunk) bytes *= static_cast<double>(c);
      if (bytes <= kTarget) break;
      const double keep = std::max(1.0, static_cast<double>(chunk[i]) * kTarget / bytes);
      chunk[i] = static_cast<hsize_t>(keep);
    }
    return chunk;
  }

  // ----------------------------------------------------------------------------- non-tensors
  JsonValue read_strings(const LeafPath& path, hid_t ds, hid_t ftype, hid_t space, const std::vector<hsize_t>& dims,
                         hsize_t n) const {
    std::vector<JsonValue> values;
    values.reserve(static_cast<size_t>(n));
    if (H5Tis_variable_str(ftype) > 0) {
      Id mtype = type_id(H5Tcopy(H5T_C_S1));
      H5Tset_size(mtype.get(), H5T_VARIABLE);
      H5Tset_cset(mtype.get(), H5Tget_cset(ftype));
      std::vector<char*> ptrs(static_cast<size_t>(n), nullptr);
      if (n > 0 && H5Dread(ds, mtype.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()) < 0)
        fail<FormatError>(path, "cannot read the string");
      for (char* s : ptrs) values.emplace_back(std::string(s ? s : ""));
      if (n > 0) H5Dvlen_reclaim(mtype.get(), space, H5P_DEFAULT, ptrs.data());
    } else {
      const size_t len = H5Tget_size(ftype);
      if (len == 0 || static_cast<hsize_t>(len) > kMaxNonTensorBytes / std::max<hsize_t>(n, 1))
        throw FormatError(where(path) + ": bad fixed-length string size");
      Id mtype = type_id(H5Tcopy(ftype));
      std::string buf(static_cast<size_t>(n) * len, '\0');
      if (n > 0 && H5Dread(ds, mtype.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0)
        fail<FormatError>(path, "cannot read the string");
      const bool space_pad = H5Tget_strpad(ftype) == H5T_STR_SPACEPAD;
      for (hsize_t i = 0; i < n; ++i) {
        std::string s = buf.substr(static_cast<size_t>(i) * len, len);
        if (auto z = s.find('\0'); z != std::string::npos) s.resize(z);
        if (space_pad)
          while (!s.empty() && s.back() == ' ') s.pop_back();
        values.emplace_back(std::move(s));
      }
    }
    size_t pos = 0;
    return nest(values, dims, 0, pos);
  }

  JsonValue read_opaque(const LeafPath& path, hid_t ds, hid_t ftype, const std::vector<hsize_t>& dims,
                        hsize_t n) const {
    const size_t elsize = H5Tget_size(ftype);
    if (elsize == 0 || static_cast<hsize_t>(elsize) > kMaxNonTensorBytes / std::max<hsize_t>(n, 1))
      throw FormatError(where(path) + ": bad opaque element size");
    std::string tag = h5_string(H5Tget_tag(ftype));
    clear_errors();
    std::string buf(static_cast<size_t>(n) * elsize, '\0');
    if (n > 0 && H5Dread(ds, ftype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0)
      fail<FormatError>(path, "cannot read the opaque value");
    std::string dt = tag.rfind("NUMPY:", 0) == 0 ? tag.substr(6) : tag;
    // numpy dtype strings the store decodes: <i1..<i8 (|i1), <u1..<u8 (|u1), <f2 <f4 <f8, |b1, <U n
    char kind = 0;
    size_t size = 0;
    if (dt.size() >= 3 && (dt[0] == '<' || dt[0] == '|')) {
      kind = dt[1];
      bool digits = true;
      for (size_t i = 2; i < dt.size(); ++i) digits = digits && dt[i] >= '0' && dt[i] <= '9';
      if (digits && dt.size() <= 12) size = static_cast<size_t>(std::stoull(dt.substr(2)));
    }
    bool known = false;
    if (kind == 'i' || kind == 'u') known = size == 1 || size == 2 || size == 4 || size == 8;
    else if (kind == 'f') known = size == 2 || size == 4 || size == 8;
    else if (kind == 'b') known = size == 1;
    else if (kind == 'U') known = size >= 1;
    const size_t itemsize = kind == 'U' ? size * 4 : size;
    if (!known || itemsize != elsize) {
      remember_opaque(buf, OpaqueOrigin{tag, dims, elsize});
      return JsonValue(JsonValue::Bytes{std::move(buf)});
    }
    std::vector<JsonValue> values;
    values.reserve(static_cast<size_t>(n));
    for (hsize_t e = 0; e < n; ++e) {
      const char* p = buf.data() + static_cast<size_t>(e) * elsize;
      switch (kind) {
        case 'b': values.emplace_back(*p != 0); break;
        case 'i': {
          int64_t v = 0;
          if (size == 1) { int8_t x; std::memcpy(&x, p, 1); v = x; }
          else if (size == 2) { int16_t x; std::memcpy(&x, p, 2); v = x; }
          else if (size == 4) { int32_t x; std::memcpy(&x, p, 4); v = x; }
          else std::memcpy(&v, p, 8);
          values.emplace_back(static_cast<long long>(v));
          break;
        }
        case 'u': {
          uint64_t v = 0;
          std::memcpy(&v, p, size);  // little-endian host
          if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) values.emplace_back(static_cast<double>(v));
          else values.emplace_back(static_cast<long long>(v));
          break;
        }
        case 'f': {
          double v;
          if (size == 2) { at::Half h; std::memcpy(&h, p, 2); v = static_cast<float>(h); }
          else if (size == 4) { float x; std::memcpy(&x, p, 4); v = x; }
          else std::memcpy(&v, p, 8);
          values.emplace_back(v);
          break;
        }
        case 'U': {
          std::string s;
          size_t len = size;
          auto cp_at = [&](size_t k) { uint32_t c; std::memcpy(&c, p + 4 * k, 4); return c; };
          while (len > 0 && cp_at(len - 1) == 0) --len;  // numpy strips trailing NULs
          for (size_t k = 0; k < len; ++k) {
            uint32_t c = cp_at(k);
            if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) c = 0xFFFD;
            utf8_append(s, c);
          }
          values.emplace_back(std::move(s));
          break;
        }
      }
    }
    size_t pos = 0;
    return nest(values, dims, 0, pos);
  }

  //! np.array(value) for the values numpy holds with a fixed dtype; TypeError for the rest (as upstream)
  NumpyValue to_numpy(const LeafPath& path, const JsonValue& v) const {
    NumpyValue out;
    if (v.is_bytes()) {
      const std::string& data = v.as_bytes().data;
      if (auto origin = opaque_origin(data)) {
        hsize_t n = 1;
        for (hsize_t d : origin->dims) n *= d;
        if (n * origin->elsize == data.size()) {
          out.tag = origin->tag;
          out.dims = origin->dims;
          out.itemsize = origin->elsize;
          out.bytes = data;
          return out;
        }
      }
      // np.void of the bytes: one opaque element ("|V n"); empty bytes: a zero-length array of |V1
      if (data.empty()) {
        out.dtype = "|V1";
        out.dims = {0};
        out.itemsize = 1;
      } else {
        out.dtype = "|V" + std::to_string(data.size());
        out.itemsize = data.size();
      }
      out.tag = "NUMPY:" + out.dtype;
      out.bytes = data;
      return out;
    }
    // the shape: nested arrays of equal lengths
    const JsonValue* cur = &v;
    while (cur->is_array()) {
      out.dims.push_back(cur->as_array().size());
      if (cur->as_array().empty()) break;
      cur = &cur->as_array()[0];
    }
    std::vector<const JsonValue*> leaves;
    collect_leaves(path, v, 0, out.dims, leaves);
    // the dtype numpy infers
    bool any_bool = false, any_int = false, any_double = false, any_string = false, any_other = false;
    size_t max_chars = 1;
    std::vector<uint32_t> cps;
    for (const JsonValue* l : leaves) {
      if (l->is_bool()) any_bool = true;
      else if (l->is_int()) any_int = true;
      else if (l->is_double()) any_double = true;
      else if (l->is_string()) {
        any_string = true;
        if (!utf8_decode(l->as_string(), cps)) throw ValueError(where(path) + ": a string that is not valid UTF-8");
        max_chars = std::max(max_chars, cps.size());
      } else {
        any_other = true;
      }
    }
    if (any_other || (any_string && (any_bool || any_int || any_double)))
      throw TypeError(where(path) + ": value " + v.dump() +
                      " has no fixed-size numpy dtype (objects, null, bytes or mixed strings and numbers); h5py "
                      "cannot store it either");
    if (any_string) {
      out.dtype = "<U" + std::to_string(max_chars);
      out.itemsize = 4 * max_chars;
      out.bytes.assign(leaves.size() * out.itemsize, '\0');
      for (size_t i = 0; i < leaves.size(); ++i) {
        utf8_decode(leaves[i]->as_string(), cps);
        std::memcpy(out.bytes.data() + i * out.itemsize, cps.data(), cps.size() * 4);
      }
    } else if (any_double || leaves.empty()) {
      out.dtype = "<f8";
      out.itemsize = 8;
      out.bytes.resize(leaves.size() * 8);
      for (size_t i = 0; i < leaves.size(); ++i) {
        double d = leaves[i]->is_bool() ? (leaves[i]->as_bool() ? 1.0 : 0.0) : leaves[i]->as_double();
        std::memcpy(out.bytes.data() + 8 * i, &d, 8);
      }
    } else if (any_int) {
      out.dtype = "<i8";
      out.itemsize = 8;
      out.bytes.resize(leaves.size() * 8);
      for (size_t i = 0; i < leaves.size(); ++i) {
        int64_t x = leaves[i]->is_bool() ? (leaves[i]->as_bool() ? 1 : 0) : leaves[i]->as_int();
        std::memcpy(out.bytes.data() + 8 * i, &x, 8);
      }
    } else {
      out.dtype = "|b1";
      out.itemsize = 1;
      out.bytes.resize(leaves.size());
      for (size_t i = 0; i < leaves.size(); ++i) out.bytes[i] = leaves[i]->as_bool() ? 1 : 0;
    }
    out.tag = "NUMPY:" + out.dtype;
    return out;
  }

  void collect_leaves(const LeafPath& path, const JsonValue& v, size_t dim, const std::vector<hsize_t>& dims,
                      std::vector<const JsonValue*>& leaves) const {
    if (dim == dims.size()) {
      if (v.is_array())
        throw TypeError(where(path) + ": value " + v.dump() + " is ragged (inhomogeneous shape); numpy cannot hold it");
      leaves.push_back(&v);
      return;
    }
    if (!v.is_array() || v.as_array().size() != dims[dim])
      throw TypeError(where(path) + ": value is ragged (inhomogeneous shape); numpy cannot hold it");
    for (const auto& e : v.as_array()) collect_leaves(path, e, dim + 1, dims, leaves);
  }

  std::string file_;
  H5Mode mode_;
  LeafPath group_;
  CreateOptions defaults_;
  Id file_id_, root_;
  std::unordered_map<std::string, std::unique_ptr<CachedDataset>> datasets_;  //!< by rel_path; cleared before close
  RowMemo<bool> checked_rows_;   //!< the last row list checked (and the dim 0 it was checked against)
  RowMemo<RowLayout> layouts_;   //!< the last row list's selection layout
  std::shared_ptr<Generation> generation_ = std::make_shared<Generation>(0);  //!< see file_generation()
  uint64_t seen_generation_ = 0;  //!< the generation datasets_ is valid for
  bool may_reuse_space_ = false;  //!< freed file space may be reused: write fill values for new datasets
  bool durable_ = true;           //!< every write batch flushed before it is reported done (write())
  static constexpr size_t kDurableSieveBytes = 4096;
};

}  // namespace

std::shared_ptr<LeafStore> open_h5_store(const std::string& file, H5Mode mode, const LeafPath& group,
                                         const CreateOptions& defaults, bool durable) {
  return std::make_shared<H5Store>(file, mode, group, defaults, durable);
}

std::shared_ptr<LeafStore> open_h5_store(const JsonValue& spec, std::optional<H5Mode> mode_override) {
  auto bad = [](const std::string& why) -> FormatError { return FormatError("h5 storage spec: " + why); };
  if (!spec.is_object()) throw bad("expected an object, found " + spec.dump());
  const JsonValue* path = spec.find("path");
  if (!path || !path->is_string() || path->as_string().empty()) throw bad("\"path\" must be a non-empty string");
  LeafPath group;
  if (const JsonValue* g = spec.find("group")) {
    if (!g->is_string()) throw bad("\"group\" must be a string");
    const std::string& s = g->as_string();
    size_t i = 0;
    while (i < s.size()) {
      size_t j = s.find('/', i);
      if (j == std::string::npos) j = s.size();
      if (j > i) group.push_back(s.substr(i, j - i));
      i = j + 1;
    }
  }
  H5Mode mode = H5Mode::Read;
  if (const JsonValue* m = spec.find("mode")) {
    if (!m->is_string()) throw bad("\"mode\" must be a string");
    mode = parse_h5_mode(m->as_string());
  }
  // a store created with "w" reopens its file as "r+": a spec never truncates
  if (mode == H5Mode::Write) mode = H5Mode::ReadWrite;
  if (mode_override) mode = *mode_override;
  bool durable = true;
  if (const JsonValue* d = spec.find("durable")) {
    if (!d->is_bool()) throw bad("\"durable\" must be a boolean");
    durable = d->as_bool();
  }
  return open_h5_store(path->as_string(), mode, group, {}, durable);
}

}  // namespace backends
}  // namespace tensordict
