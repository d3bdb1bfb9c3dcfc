#pragma once
//! Message types of the actors. Rule: what may cross a process boundary (CAF middleman) has an `inspect`
//! and is added with add_message_type (see register_message_types); what is in-process only (TensorDict
//! handles, shared reply boxes) is whitelisted with CAF_ALLOW_UNSAFE_MESSAGE_TYPE and never sent remotely.
//!
//! map protocol (coordinator C, worker W):
//!   C -> W  (map_chunk_atom, int64 chunk)                       inspectable: a remote worker can take it
//!   W -> C  (map_done_atom, int64 worker, int64 chunk, TensorDict result)   local only (result handle);
//!           worker processes write into memmap/shared `out` and reply with the inspectable
//!           (map_done_atom, int64 worker, int64 chunk) below
//!   W -> C  (map_failed_atom, int64 worker, map_error)          inspectable
//! The job itself (source TensorDict, fn, plan) is given to local workers at spawn time.
//!
//! worker processes (P, another process, connected through the middleman; everything inspectable):
//!   P -> C  (map_hello_atom, string token, int64 worker, int64 pid)   once connected; C monitors P
//!   C -> P  (map_job_atom, map_job_desc)                               the job: storage handles + fn name
//!   C -> P  (map_chunk_atom, int64 chunk)                              as for local workers
//!   P -> C  (map_done_atom, int64 worker, int64 chunk)                 the chunk is written into `out`
//!   P -> C  (map_failed_atom, int64 worker, map_error)
//!   C -> P  (map_stop_atom)                                            done or failed: P exits
//! P exits as well when C goes down (P monitors C: a dropped connection is a down message).
//!
//! store protocol (store_client.hpp; in-process callers run their calls themselves, with the store held,
//! and message the store actor S only to hand it calls left waiting: (leaf-call atom), no payload):
//!   R -> S  (store_atom, store_request) -> store_response          inspectable: what another process may
//!           ask. Data never travels in messages across processes: the response carries the storage
//!           handle (memmap directory or share_handle() bytes) and the client maps it, zero-copy.
//!           A request from another node (or with no sender) must carry the store's token (store_request::
//!           token, the owner's Store::token()); S refuses any other with a BackendError and applies nothing.
//!           Requests from this process's own actors need none.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "tensordict/actors/inbox.hpp"
#include "tensordict/actors/reply.hpp"
#include "tensordict/errors.hpp"
#include "tensordict/map.hpp"  // map_detail::CarriedError
#include "tensordict/tensor_dict.hpp"

namespace tensordict {
namespace actors {

using map_chunk_atom = caf::atom_constant<caf::atom("tdmchunk")>;
using map_done_atom = caf::atom_constant<caf::atom("tdmdone")>;
using map_failed_atom = caf::atom_constant<caf::atom("tdmfail")>;
using ping_atom = caf::atom_constant<caf::atom("tdping")>;
using map_hello_atom = caf::atom_constant<caf::atom("tdmhello")>;
using map_job_atom = caf::atom_constant<caf::atom("tdmjob")>;
using map_stop_atom = caf::atom_constant<caf::atom("tdmstop")>;
using map_poll_atom = caf::atom_constant<caf::atom("tdmpoll")>;          // coordinator -> itself
using map_connect_timeout_atom = caf::atom_constant<caf::atom("tdmcto")>; // coordinator -> itself

//! an error on the wire (fn in a worker, a store request): the ErrorCode as its number (errors.hpp's table,
//! static_cast<int32_t>(code); an unknown number is read as Runtime) + the bare message (no "Name: " prefix)
struct map_error {
  int32_t code = static_cast<int32_t>(ErrorCode::Runtime);
  std::string message;
  int64_t chunk = -1;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, map_error& x) {
  return f(caf::meta::type_name("tensordict::map_error"), x.code, x.message, x.chunk);
}

//! CarriedError -> wire and back
inline map_error to_wire(const map_detail::CarriedError& e) {
  return map_error{static_cast<int32_t>(e.code), e.message, e.chunk};
}
inline map_detail::CarriedError from_wire(const map_error& e) {
  return map_detail::CarriedError{error_code_from_int(e.code), e.message, e.chunk};
}

//! what a worker process needs to run its chunks: where the source and `out` live (storage specs, JSON:
//! tensordict/storage_spec.hpp), the registered fn name and the plan's chunk table (start, length per chunk,
//! along `dim`; drop_dim for chunksize 0)
struct map_job_desc {
  std::string fn_name;
  std::string src_spec;
  std::string out_spec;
  int64_t dim = 0;
  int64_t seed = 0;
  int64_t worker_threads = 1;
  bool drop_dim = false;
  std::vector<int64_t> starts;
  std::vector<int64_t> lengths;
  std::string log_level;
  int32_t out_write = 0;  //!< MapOutWrite: how the worker writes its chunks into out (config map.out_write)
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, map_job_desc& x) {
  return f(caf::meta::type_name("tensordict::map_job_desc"), x.fn_name, x.src_spec, x.out_spec, x.dim, x.seed, x.worker_threads, x.drop_dim, x.starts, x.lengths, x.log_level, x.out_write);
}

//! the reply slot of a facade request (in-process only)
using int_reply_ptr = std::shared_ptr<Reply<int64_t>>;

// ---------------------------------------------------------------------------------------- store protocol
using store_atom = caf::atom_constant<caf::atom("tdstore")>;

//! what a store request asks for
enum class StoreOp : int32_t {
  Info = 0,  //!< batch size, leaves (key, dtype, shape), storage handle, version
  AddKey,    //!< a new leaf: zero-filled (dtype + full shape) or, in-process, with the given tensor's data
  Flush,     //!< msync every leaf (memmap); nothing for shared memory
  Refresh,   //!< pick up leaves another process added to the directory (memmap_refresh_)
  Read,      //!< refused: rows are read through the mapping in another process (StoreClient::read here)
  Write,     //!< refused: rows are written through the mapping in another process
  Close,     //!< flush and stop the actor
};

//! one leaf of a store, as a remote client learns it
struct store_leaf {
  std::vector<std::string> key;
  std::string dtype;  // "torch.float32"
  std::vector<int64_t> shape;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, store_leaf& x) {
  return f(caf::meta::type_name("tensordict::store_leaf"), x.key, x.dtype, x.shape);
}

//! inspectable request (remote clients; StoreClient::call makes one in-process)
struct store_request {
  int32_t op = 0;
  std::vector<std::string> key;  // AddKey
  std::string dtype;             // AddKey: "torch.float32"
  std::vector<int64_t> shape;    // AddKey: batch size + feature shape
  std::string token;             // the store's token (required from another process)
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, store_request& x) {
  return f(caf::meta::type_name("tensordict::store_request"), x.op, x.key, x.dtype, x.shape, x.token);
}

//! inspectable response: ok, or the error (code + bare message) the store raised
struct store_response {
  bool ok = true;
  map_error error;
  std::string kind;  // the storage spec's driver: "memmap" | "shared"
  std::string spec;  // the storage spec (JSON) another process opens with open_storage
  std::vector<int64_t> batch_size;
  std::vector<store_leaf> leaves;
  int64_t version = 0;  // bumped by every structural change
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, store_response& x) {
  return f(caf::meta::type_name("tensordict::store_response"), x.ok, x.error, x.kind, x.spec, x.batch_size,
           x.leaves, x.version);
}

//! adds the inspectable types to a config (both sides of a middleman connection must do it)
void register_message_types(caf::actor_system_config& cfg);

}  // namespace actors
}  // namespace tensordict

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tensordict::TensorDict)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tensordict::actors::int_reply_ptr)
