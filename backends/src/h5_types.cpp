// The HDF5 store's shared helpers (h5_internal.hpp): the library guard and error stack, the type mapping
// between torch dtypes and HDF5 types (h5py's layout), key paths.
#include "tensordict/backends/shape_text.hpp"
#include "h5_internal.hpp"

#include <cstring>
#include <iterator>
#include <limits>
#include <map>

namespace tensordict {
namespace backends {
namespace h5_detail {
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

}  // namespace

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

LibraryGuard::LibraryGuard() {
  if (!library_threadsafe()) lock_ = std::unique_lock<std::recursive_mutex>(library_mutex());
  thread_local bool silenced = false;
  if (!silenced) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    silenced = true;
  }
}

std::string hdf5_message() {
  std::string s;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &s);
  H5Eclear2(H5E_DEFAULT);
  if (s.empty()) return "HDF5 gave no error message";
  return "HDF5: " + s;
}

void clear_errors() { H5Eclear2(H5E_DEFAULT); }

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

std::string shape_str(const std::vector<int64_t>& s) { return shape_text(s); }

int64_t checked_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) return -1;
    n *= d;
  }
  return n;
}

}  // namespace h5_detail

bool h5_can_store(at::ScalarType dtype) {
  h5_detail::LibraryGuard g;
  return h5_detail::h5_type_of(dtype).has_value();
}
}  // namespace backends
}  // namespace tensordict
