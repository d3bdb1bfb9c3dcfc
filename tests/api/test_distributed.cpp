// Distributed tensordicts on c10d (tensordict/distributed.hpp): process groups of forked ranks on loopback
// (TCPStore and FileStore), every method, nested keys, every dtype, non-tensor values, lazy stacks, empty
// tensordicts, completion order, and the faults: another structure on the receiver, a group timeout, a rank
// SIGKILLed mid-send. Each rank checks its own results and reports; the parent asserts (dist_util.hpp).
#include <signal.h>

#include <boost/test/unit_test.hpp>

#include "dist_util.hpp"
#include "tensordict/tensordict.hpp"

using namespace tensordict;
using disttest::expect;
using disttest::expect_throw;
using disttest::run_ranks;
using disttest::StoreKind;
using dist::GroupOptions;

namespace {

//! every dtype our ranks send (values that depend on `v`), nested levels, a non-tensor value
TensorDict sample(double v, const std::string& label = "hello") {
  TensorDict td(BatchSize{3});
  td.set("b", at::full({3, 4}, v, at::kFloat));
  td.set("a", at::full({3}, v, at::kDouble));
  td.set("label", label);
  TensorDict inner(BatchSize{3});
  inner.set("z", at::full({3, 2}, v, at::kLong));
  inner.set("h", at::full({3}, v, at::kHalf));
  inner.set("bf", at::full({3, 1}, v, at::kBFloat16));
  inner.set("i8", at::full({3}, v, at::kChar));
  inner.set("u8", at::full({3}, v, at::kByte));
  inner.set("i16", at::full({3}, v, at::kShort));
  inner.set("i32", at::full({3, 5}, v, at::kInt));
  inner.set("flag", at::full({3}, static_cast<int64_t>(v) % 2 == 1, at::kBool));
  inner.set("c64", at::full({3}, v, at::kComplexFloat));
  TensorDict deeper(BatchSize{3});
  deeper.set("x", at::full({3, 2, 2}, v, at::kFloat));
  inner.set("deeper", deeper);
  td.set("inner", inner);
  td.set("_under", at::full({3}, v, at::kFloat));
  return td;
}

//! every tensor leaf of td equals v (cast to its dtype)
void expect_all(const TensorDict& td, double v, const std::string& what) {
  for (const auto& key : td.keys(KeysOptions().include_nested(true).leaves_only(true))) {
    at::Tensor t = td.get(key);
    at::Tensor want = at::full(t.sizes(), v, t.options());
    if (t.scalar_type() == at::kBool) want = at::full(t.sizes(), static_cast<int64_t>(v) % 2 == 1, t.options());
    expect(at::equal(t, want), what + ": the leaf " + key.repr() + " is not " + std::to_string(v));
  }
}

std::shared_ptr<dist::Group> join(const GroupOptions& o) { return dist::init_process_group(o); }

}  // namespace

BOOST_AUTO_TEST_SUITE(distributed)

BOOST_AUTO_TEST_CASE(int_generator_is_upstreams_chain) {
  // numpy's default_rng: upstream's test vectors and the docstring's chain from 10
  const int64_t first[] = {9651, 1907, 2722, 8485, 3521};
  for (int s = 0; s < 5; ++s) BOOST_CHECK_EQUAL(dist::int_generator(s), first[s]);
  const int64_t chain[] = {6756, 1717, 4410, 9740, 9611, 9716, 5397, 7745, 4521, 7523};
  int64_t x = 10;
  for (int64_t want : chain) {
    x = dist::int_generator(x);
    BOOST_CHECK_EQUAL(x, want);
  }
  // the pseudo_rand tags of four leaves from init_tag 0
  int64_t tag = -1;
  const int64_t tags[] = {9651, 3450, 3834, 3840};
  for (int64_t want : tags) {
    tag = dist::int_generator(tag + 1);
    BOOST_CHECK_EQUAL(tag, want);
  }
  BOOST_CHECK_THROW(dist::int_generator(-1), ValueError);
}

BOOST_AUTO_TEST_CASE(send_recv_every_dtype_nested_both_stores) {
  for (StoreKind kind : {StoreKind::Tcp, StoreKind::File}) {
    for (bool pseudo : {false, true}) {
      auto rs = run_ranks(2, [&](int rank, const GroupOptions& o) {
        join(o);
        DistOptions d = DistOptions().pseudo_rand(pseudo).init_tag(pseudo ? 5 : 100);
        if (rank == 0) {
          sample(1.0).send(1, d);
          sample(2.0).send(1, d.staged(false));
        } else {
          TensorDict td = sample(0.0, "mine");
          auto tag = td.recv(0, d);
          expect_all(td, 1.0, "staged recv");
          expect(td.get_entry("label").non_tensor_value() == JsonValue("mine"), "non-tensors are not sent");
          // 13 tensor leaves: the last tag is init_tag + 12, or the 13th of the chain
          int64_t want = 112;
          if (pseudo) {
            want = 4;
            for (int i = 0; i < 13; ++i) want = dist::int_generator(want + 1);
          }
          expect(tag && *tag == want, "recv returns the last tag (" + std::to_string(tag.value_or(-1)) + ")");
          td.recv(0, d.staged(false));
          expect_all(td, 2.0, "direct recv");
        }
      }, kind);
      BOOST_TEST_CONTEXT("store " << (kind == StoreKind::Tcp ? "tcp" : "file") << " pseudo_rand " << pseudo) {
        DIST_CHECK_ALL(rs);
      }
    }
  }
}

// A receive straight into the leaves (staged(false)) must not hand the leaves' storage to the group's pool of
// staging buffers: a later staged receive into another TensorDict would land in it (and both would then share it).
BOOST_AUTO_TEST_CASE(a_direct_receive_does_not_lend_its_leaves_to_a_later_staged_one) {
  auto rs = run_ranks(2, [&](int rank, const GroupOptions& o) {
    join(o);
    auto big = [](double v) {
      TensorDict td(BatchSize{1000});
      td.set("x", at::full({1000, 16}, v, at::kFloat));
      td.set("y", at::full({1000}, v, at::kLong));
      return td;
    };
    if (rank == 0) {
      big(1.0).send(1, DistOptions().staged(false));
      for (double v : {2.0, 3.0}) big(v).send(1);
    } else {
      TensorDict direct = big(0.0), staged = big(0.0);
      direct.recv(0, DistOptions().staged(false));
      expect_all(direct, 1.0, "the direct receive");
      for (double v : {2.0, 3.0}) {
        staged.recv(0);
        expect_all(staged, v, "the staged receive");
        expect_all(direct, 1.0, "the directly received TensorDict after a staged receive into another one");
      }
      expect(!staged.get("x").is_alias_of(direct.get("x")), "two TensorDicts share a storage after their receives");
    }
  });
  DIST_CHECK_ALL(rs);
}

BOOST_AUTO_TEST_CASE(lazy_stacks_empty_tensordicts_and_views) {
  auto rs = run_ranks(2, [&](int rank, const GroupOptions& o) {
    join(o);
    auto make = [](double v) {
      std::vector<TensorDict> parts;
      for (int i = 0; i < 3; ++i) {
        TensorDict p(BatchSize{2});
        p.set("x", at::full({2, i + 1}, v + i, at::kFloat));  // heterogeneous shapes
        if (i == 1) p.set("only1", at::full({2}, v, at::kLong));
        parts.push_back(p);
      }
      TensorDict td(BatchSize{3, 2});
      td.set("stack", lazy_stack(parts, 0));
      td.set("w", at::full({3, 2}, v, at::kFloat));
      return td;
    };
    if (rank == 0) {
      make(10).send(1);
      TensorDict(BatchSize{4}).send(1);  // empty: nothing moves, tags unused
      TensorDict big(BatchSize{6});
      big.set("v", at::arange(6, at::kFloat));
      big.index({at::indexing::Slice(0, 6, 2)}).send(1);  // a strided view is sent by its values
    } else {
      TensorDict td = make(0);
      td.recv(0);
      LazyStackedTensorDict st(td.get_entry("stack").tensordict());
      for (int i = 0; i < 3; ++i)
        expect(at::equal(st.member(i).get("x"), at::full({2, i + 1}, 10.0 + i, at::kFloat)), "stack member " + std::to_string(i));
      expect(at::equal(st.member(1).get("only1"), at::full({2}, 10, at::kLong)), "a member's own key");
      expect(at::equal(td.get("w"), at::full({3, 2}, 10.0, at::kFloat)), "w");
      TensorDict empty(BatchSize{4});
      auto tag = empty.recv(0);
      expect(tag && *tag == -1, "an empty recv returns init_tag - 1");
      TensorDict into(BatchSize{6});
      into.set("v", at::zeros({6}, at::kFloat));
      TensorDict view = into.index({at::indexing::Slice(1, 6, 2)});
      view.recv(0);
      expect(at::equal(into.get("v"), at::tensor({0.f, 0.f, 0.f, 2.f, 0.f, 4.f})), "recv into a strided view writes through");
    }
  });
  DIST_CHECK_ALL(rs);
}

BOOST_AUTO_TEST_CASE(isend_irecv_and_completion_order) {
  auto rs = run_ranks(2, [&](int rank, const GroupOptions& o) {
    join(o);
    if (rank == 0) {
      dist::Pending p = sample(3.0).isend(1, DistOptions().init_tag(7));
      expect(p.size() == 13, "one pending send per tensor leaf");
      expect(p.tag() && *p.tag() == 19, "isend's last tag");
      p.wait_all();
      expect(p.is_completed(), "completed after wait_all");
    } else {
      TensorDict td = sample(0.0);
      dist::Pending p = td.irecv(0, DistOptions().init_tag(7));
      std::vector<bool> seen(p.size(), false);
      for (size_t i = 0; i < p.size(); ++i) {
        size_t k = p.wait_any();
        expect(k < seen.size() && !seen[k], "wait_any returns each operation once");
        seen[k] = true;
      }
      expect_throw<RuntimeError>([&] { p.wait_any(); }, "every operation", "wait_any after all");
      expect_all(td, 3.0, "irecv");
    }
  });
  DIST_CHECK_ALL(rs);
}

// a leaf set_ to another storage while its irecv is in flight: gloo still writes into the storage it was given,
// which the pending operation keeps alive (under ASan a freed one is a heap-use-after-free); the leaf holds its
// new storage, untouched
BOOST_AUTO_TEST_CASE(a_leaf_set_elsewhere_during_irecv_frees_nothing_gloo_writes) {
  auto rs = run_ranks(2, [&](int rank, const GroupOptions& o) {
    join(o);
    if (rank == 0) {
      TensorDict td(BatchSize{4});
      td.set("x", at::full({4, 1 << 14}, 5.f));
      td.isend(1).wait_all();
    } else {
      TensorDict td(BatchSize{4});
      td.set("x", at::zeros({4, 1 << 14}));
      dist::Pending p = td.irecv(0);
      td.get("x").set_(at::full({4, 1 << 14}, 2.f));  // the only other holder of the old storage lets it go
      p.wait_all();
      expect(at::equal(td.get("x"), at::full({4, 1 << 14}, 2.f)), "the leaf keeps its new storage");
    }
  });
  DIST_CHECK_ALL(rs);
}

BOOST_AUTO_TEST_CASE(init_remote_then_consolidated_sends) {
  for (bool pickle : {false, true}) {
    auto rs = run_ranks(2, [&](int rank, const GroupOptions& o) {
      join(o);
      if (rank == 0) {
        TensorDict td = sample(1.0);
        td.init_remote(1, DistOptions().pickle_metadata(pickle));
        TensorDict td2 = sample(5.0);
        td2.send(1, DistOptions().consolidated(true));
      } else {
        TensorDict td = TensorDict::from_remote_init(0);
        expect(td.is_consolidated(), "from_remote_init gives a consolidated TensorDict");
        expect_all(td, 1.0, "from_remote_init");
        expect(td.get_entry("label").non_tensor_value() == JsonValue("hello"), "non-tensors travel in the metadata");
        expect(td.batch_size() == BatchSize{3}, "batch size");
        expect(td.get({"inner", "deeper", "x"}).sizes() == at::IntArrayRef({3, 2, 2}), "nested shapes");
        auto r = td.recv(0, DistOptions().consolidated(true));
        expect(!r, "a consolidated recv returns no tag");
        expect_all(td, 5.0, "consolidated recv");
      }
    });
    BOOST_TEST_CONTEXT("pickle_metadata " << pickle) { DIST_CHECK_ALL(rs); }
  }
}

BOOST_AUTO_TEST_CASE(storages_other_ranks_can_open_travel_by_spec) {
  fixtures::TempDir dir("dist-spec");
  const std::string prefix = dir / "td";
  auto rs = run_ranks(2, [&](int rank, const GroupOptions& o) {
    join(o);
    if (rank == 0) {
      TensorDict td = sample(3.0).memmap(prefix);
      td.init_remote(1);                                         // the spec, not the data
      td.init_remote(1, DistOptions().pickle_metadata(true));   // a Python rank's form: by value
      dist::default_group()->barrier();                          // rank 1 wrote through its mapping
      expect(at::equal(td.get("b"), at::full({3, 4}, 11.f)), "a write of the receiver reaches the sender's storage");
      (void)td.broadcast(0);
    } else {
      TensorDict got = TensorDict::from_remote_init(0);
      expect(got.is_memmap() && !got.is_consolidated(), "a memmap TensorDict arrives as the same memmap storage");
      expect_all(got, 3.0, "by spec");
      expect(got.get_entry("label").non_tensor_value() == JsonValue("hello"), "non-tensors by spec");
      TensorDict copy = TensorDict::from_remote_init(0);
      expect(copy.is_consolidated() && !copy.is_memmap(), "pickle_metadata sends the values");
      expect_all(copy, 3.0, "by value");
      got.get("b").fill_(11);
      dist::default_group()->barrier();
      TensorDict b = TensorDict(BatchSize{}).broadcast(0);
      expect(b.is_memmap() && at::equal(b.get("b"), at::full({3, 4}, 11.f)), "broadcast by spec");
    }
  });
  DIST_CHECK_ALL(rs);
}

// a receiver whose TensorDict lives in a store (an HDF5 file): its leaves are read in one batched request and the
// received values written back into the file
BOOST_AUTO_TEST_CASE(a_store_backed_tensordict_sends_and_receives) {
  fixtures::TempDir dir("dist-h5");
  auto plain = [](double v) {
    TensorDict td(BatchSize{3});
    td.set("a", at::full({3, 4}, v, at::kFloat));
    TensorDict inner(BatchSize{3});
    inner.set("z", at::full({3, 2}, v, at::kLong));
    td.set("inner", inner);
    return td;
  };
  auto rs = run_ranks(2, [&](int rank, const GroupOptions& o) {
    join(o);
    TensorDict h5(PersistentTensorDict::from_dict(plain(rank == 0 ? 6.0 : 0.0), dir / ("r" + std::to_string(rank) + ".h5")));
    if (rank == 0) {
      h5.send(1);
    } else {
      h5.recv(0);
      TensorDict back(PersistentTensorDict::from_h5(dir / "r1.h5"));
      expect(at::equal(back.get("a"), at::full({3, 4}, 6.f)), "the received values are in the file");
      expect(at::equal(back.get({"inner", "z"}), at::full({3, 2}, int64_t{6}, at::kLong)), "nested level in the file");
    }
  });
  DIST_CHECK_ALL(rs);
}

BOOST_AUTO_TEST_CASE(broadcast_all_gather_reduce_all_reduce_three_ranks) {
  auto rs = run_ranks(3, [&](int rank, const GroupOptions& o) {
    join(o);
    // broadcast: rank 1's TensorDict to everyone (the others pass an empty one, as upstream's test)
    TensorDict b = rank == 1 ? sample(7.0) : TensorDict(BatchSize{});
    TensorDict got = b.broadcast(1);
    expect(got.is_consolidated(), "broadcast returns a consolidated TensorDict");
    expect_all(got, 7.0, "broadcast");
    // init_remote over broadcast
    TensorDict ib = sample(8.0);
    if (rank == 0) ib.init_remote(-1, DistOptions().use_broadcast(true));
    else ib = TensorDict::from_remote_init(0, DistOptions().use_broadcast(true));
    expect_all(ib, 8.0, "init_remote(use_broadcast)");
    // all_gather: every rank's values, by rank
    auto all = sample(static_cast<double>(rank)).all_gather();
    expect(all.size() == 3, "all_gather returns one per rank");
    for (int r = 0; r < 3; ++r) expect_all(all[r], r, "all_gather of rank " + std::to_string(r));
    // all_reduce: sum (bfloat16, int16 and complex leaves too) and max; a bool leaf is reduced as a bool, not
    // as the numbers sample() checks
    auto numbers = [](double v) { return sample(v).exclude({NestedKey({"inner", "flag"})}); };
    TensorDict s = numbers(static_cast<double>(rank + 1));
    s.all_reduce();
    expect_all(s, 6.0, "all_reduce sum");
    TensorDict m = numbers(static_cast<double>(rank + 1)).exclude({NestedKey({"inner", "c64"})});
    m.all_reduce(dist::ReduceOp::Max);
    expect_all(m, 3.0, "all_reduce max");
    expect_throw<TypeError>([&] { numbers(1.0).all_reduce(dist::ReduceOp::Max); }, "c64", "max of complex leaves");
    // reduce into rank 0, async then waited
    TensorDict r = numbers(2.0).exclude({NestedKey({"inner", "c64"})});
    dist::Pending p = r.reduce(0, dist::ReduceOp::Product, DistOptions().async_op(true));
    expect(p.size() == 11, "reduce: one operation per leaf");
    p.wait_all();
    if (rank == 0) expect_all(r, 8.0, "reduce product on the root");
  });
  DIST_CHECK_ALL(rs);
}

BOOST_AUTO_TEST_CASE(a_receiver_with_another_structure_is_refused_and_left_as_it_was) {
  auto rs = run_ranks(2, [&](int rank, const GroupOptions& o) {
    join(o);
    if (rank == 0) {
      for (int i = 0; i < 3; ++i)
        expect_throw<DistributedError>([&] { sample(1.0).send(1); }, "refused", "send to a refusing receiver");
      // the leaves are posted before the answer: a refusing receiver drains them (pseudo-random tags, and one
      // consolidated message), and the pair still works afterwards
      const DistOptions pseudo = DistOptions().pseudo_rand(true).init_tag(9), whole = DistOptions().consolidated(true);
      expect_throw<DistributedError>([&] { sample(1.0).send(1, pseudo); }, "refused", "a pseudo_rand send");
      expect_throw<DistributedError>([&] { sample(1.0).send(1, whole); }, "refused", "a consolidated send");
      sample(5.0).send(1, whole);
      sample(4.0).send(1);  // the pair still works after the refusals
    } else {
      TensorDict missing = sample(0.0);
      missing.del({"inner", "i16"});
      expect_throw<KeyError>([&] { missing.recv(0); }, "i16", "a key the receiver lacks");
      TensorDict dtype = sample(0.0);
      dtype.set("b", at::zeros({3, 4}, at::kInt));  // same bytes, other dtype
      expect_throw<TypeError>([&] { dtype.recv(0); }, "'b'", "another dtype");
      expect(at::equal(dtype.get("b"), at::zeros({3, 4}, at::kInt)), "the refused TensorDict is as it was");
      TensorDict shape = sample(0.0);
      shape.set({"inner", "i32"}, at::zeros({3, 6}, at::kInt));
      expect_throw<ValueError>([&] { shape.recv(0); }, "inner.i32", "another shape");
      expect_all(shape.exclude({NestedKey({"inner", "i32"})}), 0.0, "nothing written on refusal");
      expect_throw<KeyError>([&] { missing.recv(0, DistOptions().pseudo_rand(true).init_tag(9)); }, "i16",
                             "a key the receiver lacks (pseudo_rand tags)");
      TensorDict small = sample(0.0);
      small.del("b");
      TensorDict small_c = small.consolidate(), whole_c = sample(0.0).consolidate();
      expect_throw<KeyError>([&] { small_c.recv(0, DistOptions().consolidated(true)); }, "'b'",
                             "a consolidated receiver without the key");
      expect_all(small_c, 0.0, "the refused consolidated TensorDict is as it was");
      whole_c.recv(0, DistOptions().consolidated(true));
      expect_all(whole_c, 5.0, "a consolidated recv after the refusals");
      TensorDict ok = sample(0.0);
      ok.recv(0);
      expect_all(ok, 4.0, "a matching recv after the refusals");
    }
  });
  DIST_CHECK_ALL(rs);
}

BOOST_AUTO_TEST_CASE(a_silent_peer_times_out_and_a_killed_sender_fails_the_receiver) {
  // a peer that never sends: DistributedError after the group's timeout, the TensorDict as it was
  auto rs = run_ranks(2, [&](int rank, const GroupOptions& o) {
    join(o);
    // alive, silent, past rank 1's timeout. The group's timeout (4 s) also bounds the joins: 2 s left two freshly
    // forked ranks little room to join on a loaded machine
    if (rank == 0) ::usleep(8 * 1000 * 1000);
    if (rank == 1) {
      TensorDict td = sample(0.0);
      const auto t0 = std::chrono::steady_clock::now();
      expect_throw<DistributedError>([&] { td.recv(0, DistOptions().checked(false)); }, "recv from rank 0",
                                     "a recv nobody answers");
      const auto waited = std::chrono::steady_clock::now() - t0;
      expect(waited >= std::chrono::milliseconds(3500) && waited < std::chrono::seconds(30),
             "the recv failed after the group's timeout");
      expect_all(td, 0.0, "a timed-out recv writes nothing");
    }
  }, StoreKind::Tcp, std::chrono::seconds(60), std::chrono::seconds(4));
  DIST_CHECK_ALL(rs);

  // a sender killed in the middle of a large send: the receiver gets an error, not a hang, and keeps its values
  fixtures::TempDir dir("dist-kill");
  GroupOptions base = GroupOptions().store("tcp").port(disttest::free_port()).world_size(2).timeout(std::chrono::seconds(10));
  pid_t sender = testutil::spawn([&] {
    join(GroupOptions(base).rank(0));
    // half the leaves (k0 .. k3: tags 0 .. 3, the receiver's first four), then the parent kills it
    TensorDict half(BatchSize{});
    for (int i = 0; i < 4; ++i) half.set("k" + std::to_string(i), at::full({4 << 20}, 1.0, at::kFloat));
    half.send(1, DistOptions().checked(false));
    ::raise(SIGSTOP);
    return 0;
  });
  const std::string out = dir / "report";
  pid_t receiver = testutil::spawn([&] {
    std::string report;
    try {
      join(GroupOptions(base).rank(1));
      TensorDict big(BatchSize{});
      for (int i = 0; i < 8; ++i) big.set("k" + std::to_string(i), at::zeros({4 << 20}, at::kFloat));
      expect_throw<DistributedError>([&] { big.recv(0, DistOptions().checked(false)); }, "rank 0",
                                     "recv from a sender killed after half its leaves");
      expect_all(big, 0.0, "a failed staged recv writes nothing (not even the leaves that arrived)");
    } catch (const std::exception& e) {
      report = e.what();
    }
    std::ofstream(out) << report;
    return report.empty() ? 0 : 1;
  });
  // wait until the sender stopped itself (its half was sent), then kill it
  int status = 0;
  BOOST_REQUIRE(::waitpid(sender, &status, WUNTRACED) == sender);
  BOOST_REQUIRE(WIFSTOPPED(status));
  ::usleep(300 * 1000);
  ::kill(sender, SIGKILL);
  testutil::wait_child(sender, std::chrono::seconds(10));
  const int rc = testutil::wait_child(receiver, std::chrono::seconds(60));
  BOOST_CHECK_MESSAGE(rc == 0, "receiver " << testutil::describe_child(rc) << ": " << testutil::read_text(out));
}

BOOST_AUTO_TEST_CASE(groups_from_the_environment_several_per_process_and_bad_options) {
  auto rs = run_ranks(2, [&](int rank, const GroupOptions& o) {
    // the environment of torch.distributed's env://
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", std::to_string(o.port()).c_str(), 1);
    ::setenv("RANK", std::to_string(rank).c_str(), 1);
    ::setenv("WORLD_SIZE", "2", 1);
    auto g = dist::init_process_group(GroupOptions().name("env"));
    expect(g->rank() == rank && g->size() == 2, "rank and size from the environment");
    expect_throw<RuntimeError>([&] { dist::init_process_group(GroupOptions().name("again")); }, "already",
                               "a second default group");
    // a second group on the same store, by name; each keeps its own traffic
    Engine engine;
    auto other = engine.process_group(GroupOptions(o).name("second"));
    TensorDict td = sample(rank == 0 ? 9.0 : 0.0);
    if (rank == 0) {
      td.send(1, DistOptions().group(other));
      td.send(1);
    } else {
      td.recv(0, DistOptions().group(other));
      expect_all(td, 9.0, "the second group");
      TensorDict t2 = sample(0.0);
      t2.recv(0);
      expect_all(t2, 9.0, "the default group");
    }
    g->barrier();
    other->shutdown();
    expect_throw<DistributedError>([&] { td.send(1 - rank, DistOptions().group(other)); }, "shut down",
                                   "a group that was shut down");
    expect_throw<ValueError>([&] { td.send(rank); }, "this rank", "send to oneself");
    expect_throw<ValueError>([&] { td.send(5); }, "not in the group", "a rank outside the group");
    dist::destroy_process_group();
    expect_throw<RuntimeError>([&] { td.send(0); }, "not been initialized", "no default group");
  });
  DIST_CHECK_ALL(rs);
  BOOST_CHECK_THROW(dist::Group::create(GroupOptions().store("tcp").port(1).rank(2).world_size(2)), ValueError);
  BOOST_CHECK_THROW(dist::Group::create(GroupOptions().store("nope").rank(0).world_size(1)), ValueError);
}

// The same exchanges between two "hosts": network namespaces joined by a veth pair (CI runs as root; a user who
// may not create them sees the test say so and check nothing more)
BOOST_AUTO_TEST_CASE(ranks_on_two_hosts_joined_by_a_veth_pair) {
  disttest::TwoHosts hosts;
  if (!hosts.ok()) {
    BOOST_TEST_MESSAGE("distributed across network namespaces: NOT RUN (" << hosts.why() << ")");
    BOOST_CHECK(::geteuid() != 0);  // root must be able to run it
    return;
  }
  BOOST_TEST_MESSAGE("distributed across network namespaces: RUN (" << hosts.address(0) << " <-> " << hosts.address(1) << ")");
  auto rs = run_ranks(2, [&](int rank, const GroupOptions& o) {
    expect(hosts.enter(rank), "entering the namespace of host " + std::to_string(rank));
    join(GroupOptions(o).host(hosts.address(0)).port(29511).bind_address(hosts.address(rank)));
    if (rank == 0) {
      sample(1.0).send(1);
      sample(2.0).init_remote(1);
    } else {
      TensorDict td = sample(0.0);
      td.recv(0);
      expect_all(td, 1.0, "recv across hosts");
      expect_all(TensorDict::from_remote_init(0), 2.0, "from_remote_init across hosts");
    }
    TensorDict s = sample(static_cast<double>(rank + 1)).exclude({NestedKey({"inner", "flag"})});
    s.all_reduce();
    expect_all(s, 3.0, "all_reduce across hosts");
  });
  DIST_CHECK_ALL(rs);
}

// A Python rank (Debian's python3-torch: torch.distributed with gloo, no tensordict package) speaking upstream's
// protocol by hand (tests/api/dist_python_rank.py) exchanges the nested TensorDict with a C++ rank both ways:
// leaf by leaf with init_tag and pseudo_rand tags, init_remote with a pickled record both ways, and a
// consolidated send into what from_remote_init built.
BOOST_AUTO_TEST_CASE(a_python_rank_exchanges_nested_tensordicts_both_ways) {
  const std::string python = "/usr/bin/python3";
  const std::string script =
      (std::filesystem::path(__FILE__).parent_path() / "dist_python_rank.py").string();
  BOOST_REQUIRE_MESSAGE(std::system((python + " -c 'import torch.distributed, numpy' 2>/dev/null").c_str()) == 0,
                        "python3-torch is missing (scripts/setup.sh installs it): the interop test cannot run");
  const int port = disttest::free_port();
  fixtures::TempDir dir("dist-python");
  const std::string out = dir / "cpp";
  pid_t cpp = testutil::spawn([&] {
    std::string report;
    try {
      // the Python rank's default group, made with init_process_group("gloo", store=TCPStore(...))
      join(GroupOptions().store("tcp").port(port).rank(0).world_size(2).timeout(std::chrono::seconds(60))
               .python_default_group(true));
      const DistOptions py = DistOptions().checked(false);  // upstream's protocol: no structure step
      sample(1.0).send(1, py);
      sample(2.0).send(1, DistOptions(py).init_tag(3).pseudo_rand(true));
      TensorDict a = sample(0.0);
      a.recv(1, py);
      expect_all(a, 5.0, "recv from Python");
      a.recv(1, DistOptions(py).init_tag(11).pseudo_rand(true));
      expect_all(a, 6.0, "recv from Python with pseudo_rand tags");
      sample(7.0).init_remote(1, DistOptions().pickle_metadata(true));
      TensorDict r = TensorDict::from_remote_init(1);
      expect(r.is_consolidated(), "from_remote_init of Python's record is consolidated");
      expect_all(r, 9.0, "from_remote_init from Python");
      expect(r.get_entry("label").non_tensor_value() == JsonValue("from python"), "Python's non-tensor value");
      expect(r.get({"inner", "deeper", "x"}).sizes() == at::IntArrayRef({3, 2, 2}), "Python's nested shape");
      r.recv(1, DistOptions(py).consolidated(true));
      expect_all(r, 4.0, "a consolidated recv from Python");
      dist::default_group()->barrier();
    } catch (const std::exception& e) {
      report = e.what();
    }
    std::ofstream(out) << report;
    return report.empty() ? 0 : 1;
  });
  ::usleep(200 * 1000);  // the C++ rank serves the store
  pid_t pyr = testutil::spawn_exec(python, {script, std::to_string(port)});
  const int rc_py = testutil::wait_child(pyr, std::chrono::seconds(120));
  const int rc_cpp = testutil::wait_child(cpp, std::chrono::seconds(120));
  BOOST_CHECK_MESSAGE(rc_py == 0, "the Python rank " << testutil::describe_child(rc_py) << " (its output is above)");
  BOOST_CHECK_MESSAGE(rc_cpp == 0, "the C++ rank " << testutil::describe_child(rc_cpp) << ": " << testutil::read_text(out));
}

BOOST_AUTO_TEST_SUITE_END()
