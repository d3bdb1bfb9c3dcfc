// The HDF5 store's non-tensor values (h5_internal.hpp): strings as HDF5 strings, other values as numpy
// arrays in OPAQUE datasets tagged with numpy's dtype (h5py's layout), unknown tags kept as bytes.
#include "h5_internal.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

namespace tensordict {
namespace backends {
namespace h5_detail {

//! a non-tensor value as numpy would hold it (np.array(value)): the dtype string, shape and raw bytes
struct NumpyValue {
  std::string tag;    //!< the HDF5 opaque tag: "NUMPY:" + the dtype, or a tag kept from a read
  std::string dtype;  //!< "<i8", "<f8", "|b1", "<U3"
  std::vector<hsize_t> dims;
  size_t itemsize = 0;
  std::string bytes;
};

namespace {

//! maximum non-tensor payload the store reads (a non-tensor is one small value, not bulk data)
constexpr hsize_t kMaxNonTensorBytes = hsize_t{256} << 20;

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

}  // namespace

NonTensorValue H5Store::read_non_tensor(const LeafPath& path) {
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

void H5Store::write_non_tensor(const LeafPath& path, const NonTensorValue& value) {
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

JsonValue H5Store::read_strings(const LeafPath& path, hid_t ds, hid_t ftype, hid_t space,
                                const std::vector<hsize_t>& dims, hsize_t n) const {
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

JsonValue H5Store::read_opaque(const LeafPath& path, hid_t ds, hid_t ftype, const std::vector<hsize_t>& dims,
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

NumpyValue H5Store::to_numpy(const LeafPath& path, const JsonValue& v) const {
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

void H5Store::collect_leaves(const LeafPath& path, const JsonValue& v, size_t dim, const std::vector<hsize_t>& dims,
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

}  // namespace h5_detail
}  // namespace backends
}  // namespace tensordict
