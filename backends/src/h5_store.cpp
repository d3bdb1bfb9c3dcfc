// The HDF5 LeafStore (see h5_store.hpp and backends/README.md "HDF5 store"): opening the file (modes,
// HDF5's file lock), the structure (groups, links, listing), closing, and the spec a store reopens from.
// Tensor I/O: h5_tensor_io.cpp; non-tensor values: h5_non_tensor.cpp; shared helpers: h5_types.cpp.
#include "h5_internal.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>

namespace tensordict {
namespace backends {

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

namespace h5_detail {

H5Store::~H5Store() {
  try {
    LibraryGuard g;
    close_ids();
  } catch (...) {
  }
}

JsonValue H5Store::spec_fields() const {
  JsonValue::Object o{{"path", JsonValue(file_)}, {"group", JsonValue(join_path(group_))}, {"mode", JsonValue(to_string(mode_))}};
  if (!durable_) o.emplace_back("durable", JsonValue(false));
  return JsonValue::object(std::move(o));
}

std::vector<LeafInfo> H5Store::list() {
  LibraryGuard g;
  ensure_open();
  std::vector<LeafInfo> out;
  list_group(root_.get(), {}, 0, out);
  return out;
}

void H5Store::create_group(const LeafPath& path) {
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

bool H5Store::erase(const LeafPath& path) {
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

void H5Store::move(const LeafPath& from, const LeafPath& to) {
  LibraryGuard g;
  ensure_open();
  ensure_writable("move " + join_path(from));
  check_path(from, describe());
  check_path(to, describe());
  if (from.empty() || to.empty()) throw ValueError(describe() + ": cannot move the root group");
  if (!link_exists(from)) throw KeyError(where(from) + ": not found");
  if (link_exists(to)) throw KeyError(where(to) + ": already exists");
  forget_all();
  StructureChange change(*this);
  if (H5Lmove(root_.get(), rel_path(from).c_str(), root_.get(), rel_path(to).c_str(), H5P_DEFAULT, H5P_DEFAULT) < 0)
    fail<BackendError>(from, "cannot move to " + join_path(to));
}

void H5Store::flush() {
  LibraryGuard g;
  ensure_open();
  if (!writable()) return;
  if (H5Fflush(file_id_.get(), H5F_SCOPE_LOCAL) < 0) fail<BackendError>({}, "flush failed");
}

void H5Store::close() {
  LibraryGuard g;
  if (!file_id_.valid()) return;
  // the cached dataset ids first: H5F_CLOSE_STRONG would close them under the cache, leaving stale ids
  datasets_.clear();
  root_.reset();
  hid_t f = file_id_.release();
  if (H5Fclose(f) < 0) throw BackendError(describe() + ": closing failed: " + hdf5_message());
}

void H5Store::open() {
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

bool H5Store::is_lock_error(const std::string& msg) {
  for (const char* k : {"unable to lock", "lock file", "file lock", "already open"})
    if (msg.find(k) != std::string::npos) return true;
  return false;
}

std::string H5Store::lock_hint(const std::string& msg) {
  return is_lock_error(msg) ? " (the file is locked: another process or store has it open for writing, or this "
                              "process has it open already)"
                            : "";
}

void H5Store::refuse_if_locked() const {
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

void H5Store::close_ids() {
  datasets_.clear();
  root_.reset();
  file_id_.reset();
}

std::optional<std::string> H5Store::kind_at_in(hid_t base, const LeafPath& path) const {
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

bool H5Store::link_exists(const LeafPath& path) const {
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

void H5Store::ensure_parents(const LeafPath& path) const {
  for (size_t n = 1; n < path.size(); ++n) {
    LeafPath prefix(path.begin(), path.begin() + static_cast<std::ptrdiff_t>(n));
    auto k = kind_at(prefix);
    if (k && *k != "group")
      throw KeyError(where(path) + ": its parent " + join_path(prefix) + " is a " + *k + ", not a group");
    if (!k) break;
  }
}

Id H5Store::open_dataset(const LeafPath& path) const {
  if (path.empty()) throw KeyError(describe() + ": the root is a group, not a dataset");
  auto k = kind_at(path);
  if (!k) throw KeyError(where(path) + ": no such dataset");
  if (*k != "dataset") throw KeyError(where(path) + ": is a " + *k + ", not a dataset");
  Id ds = dataset_id(H5Dopen2(root_.get(), rel_path(path).c_str(), H5P_DEFAULT));
  if (!ds.valid()) fail<FormatError>(path, "cannot open the dataset");
  check_storage(path, ds.get());
  return ds;
}

void H5Store::check_storage(const LeafPath& path, hid_t ds) const {
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

std::vector<hsize_t> H5Store::dataspace_dims(const LeafPath& path, hid_t space) const {
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

herr_t H5Store::collect_link(hid_t, const char* name, const H5L_info_t* info, void* data) {
  auto* v = static_cast<std::vector<LinkEntry>*>(data);
  try {
    v->push_back({name, info->type});
  } catch (...) {
    return -1;
  }
  return 0;
}

void H5Store::list_group(hid_t grp, const LeafPath& prefix, int depth, std::vector<LeafInfo>& out) const {
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

//! an opaque type tagged with a numpy dtype that upstream maps to a torch dtype (NUMPY_TO_TORCH_DTYPE_DICT:
//! h5py's opaque encoding of int / float / bool values); such a dataset counts in upstream's batch inference
static bool opaque_numpy_number(hid_t ftype) {
  if (H5Tget_class(ftype) != H5T_OPAQUE) return false;
  const std::string tag = h5_string(H5Tget_tag(ftype));
  clear_errors();
  if (tag.rfind("NUMPY:", 0) != 0) return false;
  static const char* const kNumbers[] = {"|b1", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4",
                                         "<u8", "<f2", "<f4", "<f8", "<c8", "<c16"};
  for (const char* n : kNumbers)
    if (tag.compare(6, std::string::npos, n) == 0) return true;
  return false;
}

LeafInfo H5Store::dataset_info(hid_t ds, const LeafPath& path) const {
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
    if (opaque_numpy_number(ftype.get())) {
      Id space = space_id(H5Dget_space(ds));
      info.inferred_shape.emplace();
      for (hsize_t d : dataspace_dims(path, space.get())) info.inferred_shape->push_back(static_cast<int64_t>(d));
    }
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

}  // namespace h5_detail

std::shared_ptr<LeafStore> open_h5_store(const std::string& file, H5Mode mode, const LeafPath& group,
                                         const CreateOptions& defaults, bool durable) {
  return std::make_shared<h5_detail::H5Store>(file, mode, group, defaults, durable);
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
