#pragma once
//! The Redis LeafStore: Python tensordict's TensorDictStore layout (shared/reference/upstream-formats.md §3),
//! byte for byte. Keys are "<prefix>:{<td_id>}:<suffix>" (literal braces: a Redis-Cluster hash tag):
//!   __batch_size__  json.dumps(list)   "[100, 4]"
//!   __device__      "" or "cpu" ...
//!   __keys__        SET of leaf paths joined by "."  (groups are implied by "a.b")
//!   d:<path>        raw C-order little-endian bytes (non-tensor: the JSON text / pickle bytes)
//!   m:<path>        HASH shape="[100, 84]" dtype="torch.float32" | is_non_tensor="1" encoding=json|json_array|pickle
//! Reads of one call are ONE round trip (a MULTI/EXEC pipeline when more than one command: a reader never sees
//! half of another client's multi-leaf write); writes of one call are ONE MULTI/EXEC. See backends/README.md.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tensordict/backends/json_value.hpp"
#include "tensordict/backends/leaf_store.hpp"
#include "tensordict/backends/redis_client.hpp"

namespace tensordict {
namespace backends {

//! Redis strings are capped at 512 MiB (proto-max-bulk-len): the largest leaf a store accepts
inline constexpr int64_t kRedisMaxValueBytes = int64_t{512} * 1024 * 1024;

//! where a store lives; builder style (`RedisOptions().port(7000).td_id("...")`) or plain member access
struct RedisOptions {
  std::string host_ = "127.0.0.1";
  int port_ = 6379;
  int db_ = 0;
  std::string unix_socket_;  //!< non-empty: used instead of host:port
  std::string prefix_ = "tensordict";
  std::string user_;      //!< an ACL user (with password_); never part of spec_fields()
  std::string password_;  //!< never part of spec_fields() nor of a message; empty: the environment's (RedisClient)
  std::string td_id_;     //!< empty: create_redis_store draws a new uuid4
  int connect_timeout_ms_ = 2000;
  int command_timeout_ms_ = 5000;  //!< no byte received for this long: BackendError "no reply from ..."; 0: none
  int retries_ = 3;
  int retry_delay_ms_ = 100;

#define TD_REDIS_OPT(T, name)                 \
  RedisOptions& name(T v) {                   \
    name##_ = std::move(v);                   \
    return *this;                             \
  }                                           \
  const T& name() const { return name##_; }
  TD_REDIS_OPT(std::string, host)
  TD_REDIS_OPT(int, port)
  TD_REDIS_OPT(int, db)
  TD_REDIS_OPT(std::string, unix_socket)
  TD_REDIS_OPT(std::string, prefix)
  TD_REDIS_OPT(std::string, user)
  TD_REDIS_OPT(std::string, password)
  TD_REDIS_OPT(std::string, td_id)
  TD_REDIS_OPT(int, connect_timeout_ms)
  TD_REDIS_OPT(int, command_timeout_ms)
  TD_REDIS_OPT(int, retries)
  TD_REDIS_OPT(int, retry_delay_ms)
#undef TD_REDIS_OPT

  RedisConnectOptions connect_options() const;
};

//! a new random td_id (uuid4 text, as Python's str(uuid.uuid4()))
std::string new_redis_td_id();
//! "<prefix>:{<td_id>}:<suffix>"
std::string redis_key(const std::string& prefix, const std::string& td_id, const std::string& suffix);
//! json.dumps(list) spelling of a shape / batch size: "[]", "[4]", "[100, 84]"
std::string redis_shape_text(const std::vector<int64_t>& shape);
//! parses a JSON list of non-negative ints ("[100, 84]"); FormatError naming `what` otherwise
std::vector<int64_t> parse_redis_shape(const std::string& text, const std::string& what);

//! what an m:<path> hash says (pure: no I/O; the fuzz target calls it)
struct RedisLeafMeta {
  LeafInfo info;               //!< kind Tensor (dtype, shape) or NonTensor
  std::string encoding;        //!< non-tensor: "json" | "json_array" | "pickle"
  int64_t nbytes = 0;          //!< tensor: numel * itemsize (<= kRedisMaxValueBytes)
  int64_t row_bytes = 0;       //!< tensor: itemsize * prod(shape[1:]) (0 for a 0-dim tensor)
  std::string data_key;        //!< the full "d:" key, kept by the store that caches this (empty until used)
};
//! decodes the fields of `key` (the full m: key, for messages). FormatError naming the key: empty hash, unknown
//! dtype, a shape that is not a JSON list of non-negative ints, a byte size that overflows or exceeds 512 MiB,
//! an unknown encoding. Fields other than shape/dtype/is_non_tensor/encoding are ignored.
RedisLeafMeta decode_redis_meta(const LeafPath& path, const std::string& key,
                                const std::map<std::string, std::string>& fields);
//! the value of a non-tensor (pure): json → value; json_array → stacked (must be a JSON list); pickle → opaque
//! Bytes. FormatError naming `key` for invalid JSON / UTF-8 or an unknown encoding.
NonTensorValue decode_redis_non_tensor(const std::string& key, const std::string& encoding, const std::string& bytes);
//! "a.b" <-> {"a","b"}
std::string redis_join_path(const LeafPath& path);
LeafPath redis_split_path(const std::string& joined);

class RedisStore : public LeafStore {
 public:
  //! connects; does not touch the store's keys (see create_redis_store / open_redis_store)
  explicit RedisStore(const RedisOptions& options);
  ~RedisStore() override;

  std::string driver() const override { return "redis"; }
  JsonValue spec_fields() const override;
  std::string describe() const override;
  bool writable() const override { return true; }
  std::optional<std::vector<int64_t>> stored_batch_size() const override;
  void set_stored_batch_size(const std::vector<int64_t>& batch) override;
  std::vector<LeafInfo> list() override;
  std::vector<at::Tensor> read(const std::vector<LeafRead>& reads) override;
  void write(const std::vector<LeafWrite>& writes) override;
  void create(const LeafPath& path, at::ScalarType dtype, const std::vector<int64_t>& shape, const at::Tensor& data,
              const CreateOptions& options) override;
  void create_group(const LeafPath&) override {}
  bool erase(const LeafPath& path) override;
  //! RENAME of every key of the leaves under `from` and the key set updated, in one transaction
  void move(const LeafPath& from, const LeafPath& to) override;
  //! the old keys under `to` deleted and `from`'s renamed over them, in one script
  void replace(const LeafPath& from, const LeafPath& to) override;
  NonTensorValue read_non_tensor(const LeafPath& path) override;
  void write_non_tensor(const LeafPath& path, const NonTensorValue& value) override;
  void flush() override {}
  void close() override;

  const std::string& td_id() const { return options_.td_id(); }
  const RedisOptions& options() const { return options_; }
  //! "<prefix>:{<td_id>}:<suffix>"
  std::string key(const std::string& suffix) const { return redis_key(options_.prefix(), options_.td_id(), suffix); }
  //! the stored __device__ ("" when none / missing)
  std::string device() const;
  void set_device(const std::string& device);
  //! a NonTensorStack set whole is one json blob (Python's layout), read back as a stack
  bool stack_as_one_value() const override { return true; }
  //! the stored __tensorclass__ (Python's "module.QualName" of a tensorclass; "" when none)
  std::string tensorclass() const override;
  void set_tensorclass(const std::string& class_path) override;
  //! erases every leaf, then __batch_size__, __device__ and __keys__ (upstream clear_redis)
  void clear() override;
  //! a new RedisStore of the same options (td_id included): its own connection
  std::function<std::shared_ptr<LeafStore>()> lane_opener() const override;
  void forget_structure() override { invalidate_cache(); }
  //! the connection (tests; raw access for tools)
  RedisClient& client() const;
  //! forgets the cached metadata (m: hashes); the next access re-reads them
  void invalidate_cache() {
    meta_cache_.clear();
    length_checked_.clear();
  }

 private:
  const RedisLeafMeta& meta(const LeafPath& path);
  void fetch_meta(const std::vector<LeafPath>& paths);
  std::vector<std::string> members() const;
  //! the leaves at `joined` or below it
  std::vector<std::string> members_under(const std::string& joined) const;
  //! the commands that rename the leaves `targets` (under `jf`) to under `jt` and update the key set
  std::vector<RedisCommand> rename_cmds(const std::string& jf, const std::string& jt,
                                        const std::vector<std::string>& targets);
  //! the leaf's cached metadata and length check dropped
  void forget(const std::string& joined) {
    meta_cache_.erase(joined);
    length_checked_.erase(joined);
  }
  //! runs cmds atomically in one script (not MULTI/EXEC, which a server over its maxmemory refuses whole: erase and
  //! move must still run there); an error reply raises, naming `what`
  void transact(const std::vector<RedisCommand>& cmds, const std::string& what);
  void check_open() const;
  std::vector<at::Tensor> read_once(const std::vector<LeafRead>& reads, std::vector<size_t>* bad);

  RedisOptions options_;
  mutable std::unique_ptr<RedisClient> client_;
  std::map<std::string, RedisLeafMeta> meta_cache_;
  std::set<std::string> length_checked_;  //!< leaves whose value length matched the metadata once
  bool getranges_loaded_ = false;  //!< SCRIPT LOAD done on this connection (EVALSHA; NOSCRIPT reloads)
  std::string sha_getranges_;
};

//! a new store: writes __batch_size__ and __device__ (Python's _apersist_metadata); a new uuid4 td_id when
//! options.td_id() is empty. Existing keys of that td_id are kept (as in Python).
std::shared_ptr<LeafStore> create_redis_store(const RedisOptions& options, const std::vector<int64_t>& batch_size,
                                              const std::string& device = "");
//! an existing store: KeyError naming the td_id when its __batch_size__ is missing (a lazy-stack store says so);
//! FormatError naming the store and the field when __batch_size__ or __device__ ("" or a device such as "cpu",
//! "cuda:0") holds something else
std::shared_ptr<LeafStore> open_redis_store(const RedisOptions& options);
//! from spec_fields() of another process: {"host","port","db","unix_socket","prefix","td_id"}. The password is
//! never in a spec: it is `password` when given, else the environment's (redis_env_credentials).
std::shared_ptr<LeafStore> open_redis_store(const JsonValue& spec_fields, const std::string& password = "");
//! what a td_id holds: nothing, a TensorDict store (__batch_size__) or a lazy-stack store (__type__ "lazy_stack")
enum class RedisStoreKind { None, TensorDict, LazyStack };
//! asks the server (one round trip, no data read); None for an empty td_id
RedisStoreKind redis_store_kind(const RedisOptions& options);
//! the td_id of a Redis store (ValueError for another kind of store)
std::string redis_store_td_id(const LeafStore& store);
//! removes every key of the td_id options.td_id() under options.prefix() (a TensorDict or a lazy-stack store,
//! or what a failed write left of one): SCAN and DEL in pieces of 1000; returns how many keys it removed
int64_t remove_redis_store(const RedisOptions& options);
//! switches a store written under `staged_td_id` in under options.td_id(), in one server-side script (atomic:
//! no client sees both or neither): every key of options.td_id() removed, every key of `staged_td_id` renamed
//! to it. Returns how many keys moved
int64_t replace_redis_store(const RedisOptions& options, const std::string& staged_td_id);

// ------------------------------------------------------------------------------------ lazy-stack stores
//! Python's LazyStackedTensorDictStore (§3.7): __type__="lazy_stack", __count__, __stack_dim__,
//! __inner_batch_size__, __device__, __keys__; per leaf d:<path> = all members' bytes concatenated and
//! m:<path> {shape=[N,*elem0], dtype, homogeneous="1"|"0", shapes=[[...],...] when heterogeneous} plus
//! d:<path>:idx = N+1 little-endian int64 byte offsets when heterogeneous.
struct RedisStackLeaf {
  LeafPath path;
  LeafKind kind = LeafKind::Tensor;  //!< Tensor or NonTensor
  at::ScalarType dtype = at::kFloat;
  bool homogeneous = true;
  std::vector<std::vector<int64_t>> shapes;  //!< per member: its element shape
  std::vector<int64_t> offsets;              //!< N+1 byte offsets of the members in d:<path>
  std::string encoding;                      //!< NonTensor only
};
struct RedisStackLayout {
  int64_t count = 0;
  int64_t stack_dim = 0;
  std::vector<int64_t> inner_batch_size;
  std::string device;
  std::vector<RedisStackLeaf> leaves;  //!< sorted by path
};

//! the most members a lazy-stack store may declare (a hostile __count__ cannot make a huge allocation)
inline constexpr int64_t kRedisMaxStackCount = int64_t{1} << 20;

//! decodes one leaf of a lazy-stack store (pure: the fuzz target calls it): its m: hash `fields`, the member
//! `count`, the bytes of d:<path>:idx (nullopt when missing) and the length of d:<path>. `key_base` is
//! "<prefix>:{<td_id>}:" (for messages). FormatError naming the key for anything inconsistent.
RedisStackLeaf decode_redis_stack_leaf(const LeafPath& path, const std::string& key_base,
                                       const std::map<std::string, std::string>& fields, int64_t count,
                                       const std::optional<std::string>& idx, int64_t data_len);

class RedisLazyStackStore {
 public:
  //! KeyError naming the td_id when __type__ is not "lazy_stack"; FormatError for a malformed layout (offsets
  //! that disagree with the shapes or with the data's length, ...)
  explicit RedisLazyStackStore(const RedisOptions& options);
  //! writes a lazy stack of `members` (each: the same leaf paths, same dtypes, any element shapes) as Python's
  //! TensorDictStore.from_tensordict(lazy_stack) does. Tensors only.
  static std::unique_ptr<RedisLazyStackStore> create(
      const RedisOptions& options, const std::vector<std::vector<std::pair<LeafPath, at::Tensor>>>& members,
      int64_t stack_dim, const std::vector<int64_t>& inner_batch_size, const std::string& device = "");

  const RedisStackLayout& layout() const { return layout_; }
  const std::string& td_id() const { return options_.td_id(); }
  //! every member's value of the given tensor leaves (ragged members as they are, never truncated):
  //! result[i][m] = member m of paths[i]. ONE round trip.
  std::vector<std::vector<at::Tensor>> read_leaves(const std::vector<LeafPath>& paths);
  //! the tensor leaves of member m (in layout().leaves order, non-tensors skipped): one round trip of GETRANGEs
  std::vector<at::Tensor> read_member(int64_t member);
  RedisClient& client() { return *client_; }

 private:
  const RedisStackLeaf& leaf(const LeafPath& path) const;
  RedisOptions options_;
  std::unique_ptr<RedisClient> client_;
  RedisStackLayout layout_;
  std::map<std::string, int64_t> data_len_;
};
//! the layout of a lazy-stack store (one RedisLazyStackStore without keeping it)
RedisStackLayout read_redis_lazy_stack_layout(const RedisOptions& options);

}  // namespace backends
}  // namespace tensordict
