#pragma once
//! Internal to backends/src: what the HDF5 store's sources share (the library guard, RAII ids, the type
//! mapping, path helpers) and the H5Store class, whose members are defined in h5_store.cpp (open, locking,
//! structure), h5_tensor_io.cpp (tensor datasets) and h5_non_tensor.cpp (non-tensor values).
#include <sys/types.h>

#include <hdf5.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tensordict/backends/h5_store.hpp"
#include "tensordict/errors.hpp"

namespace tensordict {
namespace backends {
namespace h5_detail {

// ------------------------------------------------------------------------------------- library state
//! the structure generation of one file (by device and inode), shared by this process's stores of the file:
//! HDF5 lets several stores of one process open a file (even read-write), and each store keeps datasets open,
//! so a store that creates, erases or replaces a dataset bumps it and the others drop what they keep
using Generation = std::atomic<uint64_t>;
std::shared_ptr<Generation> file_generation(dev_t dev, ino_t ino);

//! held for the duration of every public call: takes the process-wide mutex when the library is not
//! thread-safe, and turns off HDF5's automatic error printing for this thread (error stacks are per
//! thread in a thread-safe build)
class LibraryGuard {
 public:
  LibraryGuard();

 private:
  std::unique_lock<std::recursive_mutex> lock_;
};

//! HDF5's error stack of this thread as one line (outermost first), then cleared
std::string hdf5_message();

void clear_errors();

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

inline Id type_id(hid_t t) { return Id(t, H5Tclose); }
inline Id space_id(hid_t s) { return Id(s, H5Sclose); }
inline Id plist_id(hid_t p) { return Id(p, H5Pclose); }
inline Id dataset_id(hid_t d) { return Id(d, H5Dclose); }
inline Id group_id(hid_t g) { return Id(g, H5Gclose); }
inline Id object_id(hid_t o) { return Id(o, H5Oclose); }

// ------------------------------------------------------------------------------------- types
//! the HDF5 type of a torch dtype (file and memory alike: the store assumes a little-endian host, as the
//! rest of the project does); nullopt when numpy / h5py have no such type
std::optional<Id> h5_type_of(at::ScalarType dtype);

std::string h5_string(char* s);

//! what a dataset's type is to the store
struct TypeClass {
  enum Kind { Tensor, String, Opaque, Unsupported } kind = Unsupported;
  at::ScalarType dtype = at::kFloat;
  std::string why;  //!< Unsupported: what the type is
};

TypeClass classify(hid_t t);

// ------------------------------------------------------------------------------------- paths and values
std::string join_path(const LeafPath& p);

//! "a/b" relative to the store's root group ("." for the root itself)
std::string rel_path(const LeafPath& p);
bool bad_part(const std::string& part);
void check_path(const LeafPath& p, const std::string& where);
std::string shape_str(const std::vector<int64_t>& s);
int64_t checked_numel(const std::vector<int64_t>& shape);

//! a non-tensor value as numpy would hold it (h5_non_tensor.cpp)
struct NumpyValue;

// ---------------------------------------------------------------------------------------------- store
class H5Store final : public LeafStore {
 public:
  H5Store(std::string file, H5Mode mode, LeafPath group, CreateOptions defaults, bool durable)
      : file_(std::move(file)), mode_(mode), group_(std::move(group)), defaults_(std::move(defaults)), durable_(durable) {
    open();
  }
  ~H5Store() override;

  std::string driver() const override { return "h5"; }
  JsonValue spec_fields() const override;
  std::string describe() const override {
    std::string d = "HDF5 file " + file_;
    if (!group_.empty()) d += " (group " + join_path(group_) + ")";
    return d;
  }
  bool writable() const override { return mode_ != H5Mode::Read; }
  std::optional<std::vector<int64_t>> stored_batch_size() const override { return std::nullopt; }
  void set_stored_batch_size(const std::vector<int64_t>&) override {}

  std::vector<LeafInfo> list() override;
  std::vector<at::Tensor> read(const std::vector<LeafRead>& reads) override;
  void write(const std::vector<LeafWrite>& writes) override;
  void create(const LeafPath& path, at::ScalarType dtype, const std::vector<int64_t>& shape, const at::Tensor& data,
              const CreateOptions& options) override;
  void create_group(const LeafPath& path) override;
  bool erase(const LeafPath& path) override;
  bool holds_non_tensor_rows() const override { return false; }
  //! H5Lmove of the link (a dataset or a whole group)
  void move(const LeafPath& from, const LeafPath& to) override;
  NonTensorValue read_non_tensor(const LeafPath& path) override;
  void write_non_tensor(const LeafPath& path, const NonTensorValue& value) override;
  void flush() override;
  void close() override;

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
  void open();
  static bool is_lock_error(const std::string& msg);
  static std::string lock_hint(const std::string& msg);

  //! HDF5 (1.10) truncates a file opened with H5F_ACC_TRUNC before taking its flock, so a "w" open of a file
  //! that another process is writing would destroy it and only then fail. Check the lock first (unless
  //! HDF5's file locking is turned off by HDF5_USE_FILE_LOCKING=FALSE).
  void refuse_if_locked() const;
  void close_ids();
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
  std::optional<std::string> kind_at_in(hid_t base, const LeafPath& path) const;
  std::optional<std::string> kind_at(const LeafPath& path) const { return kind_at_in(root_.get(), path); }

  bool link_exists(const LeafPath& path) const;

  //! every prefix of `path` (without its last part) must be a group or missing
  void ensure_parents(const LeafPath& path) const;
  Id open_dataset(const LeafPath& path) const;

  //! the dataset's storage must hold its elements: libhdf5 1.10 trusts the layout message, and reading a
  //! compact dataset whose recorded size is too small crashes inside the library (found by fuzz_h5_open).
  //! External raw files and virtual datasets (data read from other files) are refused.
  void check_storage(const LeafPath& path, hid_t ds) const;

  //! the dims of a scalar ({}) or simple dataspace; FormatError for a null dataspace
  std::vector<hsize_t> dataspace_dims(const LeafPath& path, hid_t space) const;

  struct LinkEntry {
    std::string name;
    H5L_type_t type;
  };
  static herr_t collect_link(hid_t, const char* name, const H5L_info_t* info, void* data);

  static constexpr int kMaxDepth = 64;
  static constexpr size_t kMaxEntries = 1000000;

  void list_group(hid_t grp, const LeafPath& prefix, int depth, std::vector<LeafInfo>& out) const;
  LeafInfo dataset_info(hid_t ds, const LeafPath& path) const;

  // ----------------------------------------------------------------------------- tensor I/O
  //! rows within dim 0, ascending and unique; a list is checked once for the leaves of a call that share it
  //! (and the same dim 0)
  void check_rows(const LeafPath& path, const std::vector<hsize_t>& dims, const RowList& list);
  void check_rows_once(const LeafPath& path, const std::vector<hsize_t>& dims, const std::vector<int64_t>& rows) const;

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
  static RowLayout layout_of(const std::vector<int64_t>& rows);

  //! reads (or writes) `rows` (ascending, unique) along dim 0 of the cached dataset `e` from (to) the
  //! contiguous buffer `buf` of [rows.size(), dims[1:]...] elements of `mtype`. The list's layout is worked
  //! out once for all the leaves of a call that share it (layouts_)
  void transfer_rows(const LeafPath& path, CachedDataset& e, hid_t mtype, const RowList& rows, void* buf,
                     bool write);
  at::Tensor allocate(const LeafPath& path, at::IntArrayRef shape, at::ScalarType dtype) const;

  // ----------------------------------------------------------------------------- dataset cache
  //! forget the cached dataset at `path` (and below it)
  void forget(const LeafPath& path);
  void forget_all() { datasets_.clear(); }

  //! tells this process's other stores of the file that its structure changed (this store forgets itself)
  void changed_structure() noexcept;
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
  CachedDataset& cached_dataset(const LeafPath& path);

  //! the tensor dataset at `path` (tensor_dataset's checks and errors), its dtype, dims and memory types set
  CachedDataset& cached_tensor(const LeafPath& path);
  at::Tensor read_one(const LeafRead& r);
  void check_write(const LeafWrite& w);
  void do_write(const LeafWrite& w);

  //! the chunk shape for create(): the asked one (checked), or rows of ~1 MiB
  std::vector<hsize_t> chunk_shape(const LeafPath& path, const std::vector<int64_t>& shape,
                                   const std::vector<int64_t>& asked, size_t elsize) const;

  // ----------------------------------------------------------------------------- non-tensors
  JsonValue read_strings(const LeafPath& path, hid_t ds, hid_t ftype, hid_t space, const std::vector<hsize_t>& dims,
                         hsize_t n) const;

  JsonValue read_opaque(const LeafPath& path, hid_t ds, hid_t ftype, const std::vector<hsize_t>& dims,
                        hsize_t n) const;

  //! np.array(value) for the values numpy holds with a fixed dtype; TypeError for the rest (as upstream)
  NumpyValue to_numpy(const LeafPath& path, const JsonValue& v) const;
  void collect_leaves(const LeafPath& path, const JsonValue& v, size_t dim, const std::vector<hsize_t>& dims,
                      std::vector<const JsonValue*>& leaves) const;

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

}  // namespace h5_detail
}  // namespace backends
}  // namespace tensordict
