#pragma once
// The conformance zoo: every kind of TensorDict node the generic tests run on, in-memory kinds of the engine
// zoo plus memmap, shared memory, store-backed TensorDicts (a memmap and a shared store), a lazy stack, a nested lazy stack and a lazy
// stack of heterogeneous members (exclusive keys). Every member has batch_size [4, 3, 2, 1] and the tensor
// leaves "a" [..,5] f32, "b" [..,1,10] f32, "c" [..,3] i64 (common to every member of a lazy stack).
// A new node kind joins the suite with one line in members().
#include <unistd.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "engine/fixtures.hpp"
#include "redis_server.hpp"
#include "engine/zoo.hpp"
#include "tensordict/index_math.hpp"
#include "tensordict/lazy_stack.hpp"
#include "tensordict/node.hpp"
#include "tensordict/tensordict.hpp"
#include "tensordict/typed.hpp"

namespace conformance {

using tensordict::BatchSize;
using tensordict::TensorDict;

//! the typed wrapper of the zoo's leaves (upstream's typed_td / nested_typed_td members)
struct ZooTyped : tensordict::TypedTensorDict<ZooTyped> {
  TD_FIELDS(ZooTyped, TD_TENSOR(a), TD_TENSOR(b), TD_TENSOR(c))
};

struct Member {
  std::string name;
  std::function<TensorDict()> make;
  //! in-place writes reach distinct memory (false for expanded stride-0 leaves)
  bool writable = true;
  //! setting a key under a missing level creates the level (false: KeyError naming the missing parent)
  bool new_levels = true;
  //! keys can be removed and renamed (false: a dense store keeps every key it made: NotImplementedError)
  bool removes_keys = true;
};

//! the directory memmap and store members live in (one per test process)
inline const std::string& workdir() {
  static fixtures::TempDir dir("conformance");
  return dir.path;
}

//! a fresh directory name under workdir()
inline std::string fresh_dir(const std::string& tag) {
  static std::atomic<int> n{0};
  return workdir() + "/" + tag + std::to_string(n++);
}

//! the redis-server the Redis members live on: a real server on a free loopback port, started on first use
//! and stopped by its pid when the test process exits
inline tensordict::RedisOptions redis() {
  static testutil::RedisServer server;
  return tensordict::RedisOptions().port(server.port());
}

inline std::vector<Member> members() {
  using tensordict::lazy_stack;
  const BatchSize bs{4, 3, 2, 1};
  std::vector<Member> out;
  for (const auto& k : zoo::kinds()) out.push_back({k.name, k.make, k.writable});
  out.push_back({"memmap_td", [=] { return zoo::plain(bs, 31).memmap(fresh_dir("memmap")); }, true});
  out.push_back({"shared_td",
                 [=] {
                   TensorDict td = zoo::plain(bs, 33);
                   td.share_memory_();
                   return td;
                 },
                 true});
  // consolidate(): every leaf a view into one storage (locked, as memmap and shared members)
  out.push_back({"consolidated_td", [=] { return zoo::plain(bs, 39).consolidate(); }, true});
  out.push_back({"store_td",
                 [=] {
                   TensorDict buf = zoo::plain(bs, 35).memmap(fresh_dir("store"));
                   return tensordict::Store::open(buf).tensordict();
                 },
                 true, true, false});
  out.push_back({"shared_store_td",
                 [=] {
                   TensorDict buf = zoo::plain(bs, 37);
                   buf.share_memory_();
                   return tensordict::Store::open(buf).tensordict();
                 },
                 true, true, false});
  // HDF5 (PersistentTensorDict): a file, a group of a file, an indexed view of a file
  out.push_back({"h5_td",
                 [=] { return TensorDict(tensordict::PersistentTensorDict::from_dict(zoo::plain(bs, 101), fresh_dir("h5") + ".h5")); },
                 true});
  out.push_back({"h5_group_td",
                 [=] {
                   TensorDict outer(BatchSize{4, 3});
                   outer.set("grp", zoo::plain(bs, 103));
                   auto f = tensordict::PersistentTensorDict::from_dict(outer, fresh_dir("h5g") + ".h5");
                   return f.get_entry("grp").tensordict();
                 },
                 true});
  out.push_back({"h5_view_td",
                 [] {
                   auto f = tensordict::PersistentTensorDict::from_dict(zoo::plain({6, 3, 2, 1}, 105), fresh_dir("h5v") + ".h5");
                   return f.index({at::indexing::Slice(1, 5)});
                 },
                 true});
  // Redis (TensorDictStore): a store, a nested level of a store, an indexed view of a store
  out.push_back({"redis_td", [=] { return TensorDict(tensordict::TensorDictStore::from_tensordict(zoo::plain(bs, 111), redis())); },
                 true});
  // the same with write-behind (RedisOptions::write_behind): row writes queued, every other call after them
  out.push_back({"redis_write_behind_td",
                 [=] {
                   return TensorDict(
                       tensordict::TensorDictStore::from_tensordict(zoo::plain(bs, 117), redis().write_behind(64)));
                 },
                 true});
  out.push_back({"redis_nested_td",
                 [=] {
                   TensorDict outer(bs);
                   outer.set("grp", zoo::plain(bs, 113));
                   return tensordict::TensorDictStore::from_tensordict(outer, redis()).get_entry("grp").tensordict();
                 },
                 true});
  out.push_back({"redis_view_td",
                 [] {
                   auto s = tensordict::TensorDictStore::from_tensordict(zoo::plain({6, 3, 2, 1}, 115), redis());
                   return s.index({at::indexing::Slice(1, 5)});
                 },
                 true});
  out.push_back({"lazy_stacked_td",
                 [] {
                   std::vector<TensorDict> parts;
                   for (int i = 0; i < 4; ++i) parts.push_back(zoo::plain({3, 2, 1}, 40 + i));
                   return TensorDict(lazy_stack(parts, 0));
                 },
                 true});
  out.push_back({"lazy_stacked_td_dim2",
                 [] {
                   std::vector<TensorDict> parts;
                   for (int i = 0; i < 2; ++i) parts.push_back(zoo::plain({4, 3, 1}, 50 + i));
                   return TensorDict(lazy_stack(parts, 2));
                 },
                 true});
  out.push_back({"nested_lazy_td",
                 [=] {
                   TensorDict td = zoo::plain(bs, 60);
                   std::vector<TensorDict> parts;
                   for (int i = 0; i < 4; ++i) {
                     parts.push_back(TensorDict({{"x", zoo::randn({3, 2, 1, 2, 3}, 61 + i)}}, {3, 2, 1, 2}));
                   }
                   td.set("nested", lazy_stack(parts, 0));
                   return td;
                 },
                 true});
  out.push_back({"hetero_lazy_td",
                 [] {
                   std::vector<TensorDict> parts;
                   for (int i = 0; i < 4; ++i) {
                     TensorDict p = zoo::plain({3, 2, 1}, 70 + i);
                     // exclusive keys: a ragged one in odd members, another in member 0
                     if (i % 2 == 1) p.set("ragged", zoo::randn({3, 2, 1, i + 1}, 80 + i));
                     if (i == 0) p.set("only0", zoo::randn({3, 2, 1}, 90));
                     parts.push_back(p);
                   }
                   return TensorDict(lazy_stack(parts, 0));
                 },
                 true});
  // typed wrappers (TypedTensorDict) over memory, HDF5 and a lazy stack, and one nested in a TensorDict
  out.push_back({"typed_td", [=] { return TensorDict(ZooTyped::from_tensordict(zoo::plain(bs, 121))); }, true});
  out.push_back({"typed_h5_td",
                 [=] {
                   return TensorDict(ZooTyped::from_tensordict(
                       tensordict::PersistentTensorDict::from_dict(zoo::plain(bs, 123), fresh_dir("h5t") + ".h5")));
                 },
                 true});
  out.push_back({"typed_lazy_td",
                 [] {
                   std::vector<TensorDict> parts;
                   for (int i = 0; i < 4; ++i) parts.push_back(zoo::plain({3, 2, 1}, 125 + i));
                   return TensorDict(ZooTyped::from_tensordict(lazy_stack(parts, 0)));
                 },
                 true});
  out.push_back({"nested_typed_td",
                 [=] {
                   TensorDict td = zoo::plain(bs, 131);
                   td.set("typed", ZooTyped::from_tensordict(zoo::plain(bs, 133)));
                   return td;
                 },
                 true});
  return out;
}

//! runs body(member, td, ref) on a fresh td of every member (ref: its dense form, cloned), in a Boost.Test
//! context naming the member; an exception fails that member and the others still run
template <class F>
void for_each_member(F&& body) {
  for (const Member& m : members()) {
    BOOST_TEST_CONTEXT("zoo member " << m.name) {
      try {
        TensorDict td = m.make();
        TensorDict ref = td.contiguous().clone();
        body(m, td, ref);
      } catch (const std::exception& e) {
        BOOST_ERROR("zoo member " << m.name << ": unexpected exception: " << e.what());
      }
    }
  }
}

}  // namespace conformance
