// The HDF5 LeafStore: round trips, indexed I/O, non-tensors, modes, reopening and specs (the files suite,
// test_h5_store_files.cpp, has the rest). Helpers in test_h5_store_util.hpp.
#include "backends/test_h5_store_util.hpp"

BOOST_AUTO_TEST_SUITE(h5_store)

BOOST_AUTO_TEST_CASE(modes) {
  BOOST_TEST((be::parse_h5_mode("r") == be::H5Mode::Read));
  BOOST_TEST((be::parse_h5_mode("r+") == be::H5Mode::ReadWrite));
  BOOST_TEST((be::parse_h5_mode("w") == be::H5Mode::Write));
  BOOST_TEST((be::parse_h5_mode("a") == be::H5Mode::Append));
  for (auto m : {be::H5Mode::Read, be::H5Mode::ReadWrite, be::H5Mode::Write, be::H5Mode::Append})
    BOOST_TEST((be::parse_h5_mode(be::to_string(m)) == m));
  check_throws<tensordict::ValueError>([] { be::parse_h5_mode("rw"); }, {"rw"});
}


BOOST_AUTO_TEST_CASE(every_dtype_round_trips) {
  TempDir dir;
  const std::vector<at::ScalarType> dtypes = {at::kChar,  at::kShort, at::kInt,          at::kLong,
                                              at::kByte,  at::kHalf,  at::kFloat,        at::kDouble,
                                              at::kBool,  at::kComplexFloat, at::kComplexDouble};
  const std::vector<std::vector<int64_t>> shapes = {{5}, {4, 3}, {}, {0}, {0, 3}, {2, 0, 2}};
  {
    auto s = be::open_h5_store(dir / "t.h5", be::H5Mode::Write);
    BOOST_TEST(s->driver() == "h5");
    BOOST_TEST(s->writable());
    BOOST_TEST(!s->stored_batch_size().has_value());
    for (auto dt : dtypes)
      for (size_t k = 0; k < shapes.size(); ++k)
        s->create({std::string(c10::toString(dt)) + "_" + std::to_string(k)}, dt, shapes[k], sample(dt, shapes[k]), {});
    s->close();
  }
  auto s = be::open_h5_store(dir / "t.h5", be::H5Mode::Read);
  BOOST_TEST(!s->writable());
  auto infos = s->list();
  BOOST_TEST(infos.size() == dtypes.size() * shapes.size());
  for (auto dt : dtypes)
    for (size_t k = 0; k < shapes.size(); ++k) {
      const std::string key = std::string(c10::toString(dt)) + "_" + std::to_string(k);
      at::Tensor got = read1(*s, {key});
      BOOST_TEST(same(got, sample(dt, shapes[k])), key << ": " << got);
      bool found = false;
      for (const auto& i : infos)
        if (i.path == be::LeafPath{key}) {
          found = true;
          BOOST_TEST((i.kind == be::LeafKind::Tensor));
          BOOST_TEST((i.dtype == dt), key);
          BOOST_TEST(i.shape == shapes[k], key);
        }
      BOOST_TEST(found, key);
    }
  // float16 extremes survive
  auto w = be::open_h5_store(dir / "h.h5", be::H5Mode::Write);
  at::Tensor h = at::tensor({65504.0, -65504.0, 6.1035e-05, 0.0, 1.0 / 3}, at::kFloat).to(at::kHalf);
  w->create({"h"}, at::kHalf, {5}, h, {});
  BOOST_TEST(same(read1(*w, {"h"}), h));
}

BOOST_AUTO_TEST_CASE(dtypes_numpy_lacks_are_type_errors) {
  TempDir dir;
  auto s = be::open_h5_store(dir / "t.h5", be::H5Mode::Write);
  check_throws<tensordict::TypeError>(
      [&] { s->create({"sub", "bf"}, at::kBFloat16, {2}, at::ones({2}, at::kBFloat16), {}); }, {"sub/bf", "BFloat16"});
  check_throws<tensordict::TypeError>([&] { s->create({"c32"}, at::kComplexHalf, {2}, {}, {}); }, {"c32"});
  BOOST_TEST(s->list().empty());  // nothing half-created
}

BOOST_AUTO_TEST_CASE(nested_groups_and_list_order) {
  TempDir dir;
  auto s = be::open_h5_store(dir / "t.h5", be::H5Mode::Write);
  s->create({"z"}, at::kFloat, {2}, {}, {});
  s->create({"a", "b", "x"}, at::kLong, {2, 2}, sample(at::kLong, {2, 2}), {});
  s->create({"a", "y"}, at::kBool, {2}, {}, {});
  s->create_group({"m", "empty"});
  s->create_group({"m", "empty"});  // existing group: no-op
  s->write_non_tensor({"a", "name"}, {JsonValue("hi"), false});
  auto l = s->list();
  std::vector<std::string> paths;
  for (const auto& i : l) {
    std::string p;
    for (const auto& part : i.path) p += "/" + part;
    paths.push_back(p + (i.kind == be::LeafKind::Group ? "/" : i.kind == be::LeafKind::NonTensor ? "=" : ""));
  }
  // H5_INDEX_NAME order (h5py's), parents before children
  std::vector<std::string> expect = {"/a/", "/a/b/", "/a/b/x", "/a/name=", "/a/y", "/m/", "/m/empty/", "/z"};
  BOOST_TEST(paths == expect, boost::test_tools::per_element());
  check_throws<tensordict::KeyError>([&] { s->create({"a", "b"}, at::kFloat, {1}, {}, {}); }, {"/a/b", "exists"});
  check_throws<tensordict::KeyError>([&] { s->create({"z", "under"}, at::kFloat, {1}, {}, {}); }, {"/z", "not a group"});
  check_throws<tensordict::KeyError>([&] { s->read({whole({"a", "nope"})}); }, {"/a/nope"});
  check_throws<tensordict::KeyError>([&] { s->read({whole({"a"})}); }, {"/a", "group"});
  check_throws<tensordict::ValueError>([&] { s->create({"a", ""}, at::kFloat, {1}, {}, {}); }, {"invalid key"});
  check_throws<tensordict::ValueError>([&] { s->create({"a/b"}, at::kFloat, {1}, {}, {}); }, {"invalid key"});
}

// LeafStore::replace's default (erase, then move): over a leaf, over a missing key, and a leaf moved over the
// group that holds it (set aside first, so that erasing the group does not take it along)
BOOST_AUTO_TEST_CASE(replace_moves_over_a_key_and_out_of_the_group_it_replaces) {
  TempDir dir;
  auto s = be::open_h5_store(dir / "t.h5", be::H5Mode::Write);
  s->create({"a"}, at::kLong, {3}, at::arange(3), {});
  s->create({"b"}, at::kFloat, {2}, at::ones({2}), {});
  s->create({"g", "x"}, at::kLong, {2}, at::full({2}, 7, at::kLong), {});
  s->create({"g", "y"}, at::kFloat, {2}, at::zeros({2}), {});
  auto leaves = [&] {
    std::vector<std::string> out;
    for (const auto& i : s->list()) {
      std::string p;
      for (const auto& part : i.path) p += "/" + part;
      if (i.kind != be::LeafKind::Group) out.push_back(p);
    }
    return out;
  };
  s->replace({"a"}, {"b"});
  BOOST_TEST(s->read({whole({"b"})})[0].equal(at::arange(3)));
  s->replace({"b"}, {"c"});  // nothing at c
  BOOST_TEST(s->read({whole({"c"})})[0].equal(at::arange(3)));
  s->replace({"g", "x"}, {"g"});
  BOOST_TEST(s->read({whole({"g"})})[0].equal(at::full({2}, 7, at::kLong)));
  BOOST_TEST(leaves() == (std::vector<std::string>{"/c", "/g"}), boost::test_tools::per_element());
  check_throws<tensordict::KeyError>([&] { s->replace({"nope"}, {"c"}); }, {"/nope"});
  BOOST_TEST(s->read({whole({"c"})})[0].equal(at::arange(3)));
}

BOOST_AUTO_TEST_CASE(rows_read_and_write) {
  TempDir dir;
  auto s = be::open_h5_store(dir / "t.h5", be::H5Mode::Write);
  for (auto dt : {at::kFloat, at::kBool, at::kComplexDouble, at::kHalf}) {
    const std::string key = c10::toString(dt);
    at::Tensor full = sample(dt, {12, 3, 2});
    s->create({"g", key}, dt, {12, 3, 2}, full, {});
    // one run, strided single rows (td[a:b:s]), strided blocks, irregular rows (runs per transfer)
    const std::vector<std::vector<int64_t>> cases = {{0},           {11},           {0, 11},         {2, 3, 4, 5},
                                                     {1, 3, 5, 7},  {0, 3, 6, 9},   {2, 7},          {0, 1, 5, 6, 10, 11},
                                                     {1, 2, 3, 7, 8, 9}, {0, 1, 5, 6, 7, 11}, {0, 2, 4, 5}, {1, 4, 7, 11},
                                                     {},            {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}};
    for (const auto& r : cases) {
      at::Tensor got = s->read({rows({"g", key}, r)}).at(0);
      BOOST_TEST(same(got, pick(full, r)), key << " rows " << r.size());
    }
    // write rows: runs, scattered, first and last
    at::Tensor expect = full.clone();
    for (const auto& r : std::vector<std::vector<int64_t>>{
             {0}, {11}, {3, 4, 5}, {1, 6, 9}, {0, 4, 8}, {2, 3, 8, 9}, {1, 3, 5, 7, 9, 11}, {0, 2, 3}}) {
      at::Tensor data = sample(dt, {static_cast<int64_t>(r.size()), 3, 2});
      if (dt == at::kBool) data = data.logical_not();
      else data = data.mul(3).add(1).to(dt);
      s->write({be::LeafWrite{{"g", key}, false, r, data}});
      expect.index_copy_(0, at::tensor(r, at::kLong), data);
      BOOST_TEST(same(read1(*s, {"g", key}), expect), key);
    }
  }
  // batched: several leaves in one call, in order
  s->create({"a"}, at::kLong, {4}, at::arange(4), {});
  s->create({"b"}, at::kInt, {4, 2}, {}, {});
  s->write({be::LeafWrite{{"a"}, false, {1, 3}, at::tensor({10, 30}, at::kLong)},
            be::LeafWrite{{"b"}, true, {}, at::ones({4, 2}, at::kInt)}, be::LeafWrite{{"a"}, false, {3}, at::tensor({33}, at::kLong)}});
  auto got = s->read({whole({"a"}), rows({"b"}, {0, 3}), rows({"a"}, {3})});
  BOOST_TEST(same(got[0], at::tensor({0, 10, 2, 33}, at::kLong)));
  BOOST_TEST(same(got[1], at::ones({2, 2}, at::kInt)));
  BOOST_TEST(same(got[2], at::tensor({33}, at::kLong)));
  // bad requests, validated before anything is written
  check_throws<tensordict::ValueError>(
      [&] {
        s->write({be::LeafWrite{{"a"}, true, {}, at::full({4}, 7, at::kLong)},
                  be::LeafWrite{{"b"}, false, {0, 1}, at::ones({3, 2}, at::kInt)}});
      },
      {"/b", "[3, 2]", "[2, 2]"});
  BOOST_TEST(same(read1(*s, {"a"}), at::tensor({0, 10, 2, 33}, at::kLong)));  // the first write was not applied
  check_throws<tensordict::TypeError>([&] { s->write({be::LeafWrite{{"a"}, true, {}, at::ones({4}, at::kFloat)}}); },
                                      {"/a", "Float"});
  check_throws<tensordict::IndexError>([&] { s->read({rows({"a"}, {4})}); }, {"/a", "row 4"});
  check_throws<tensordict::ValueError>([&] { s->read({rows({"a"}, {2, 1})}); }, {"/a", "ascending"});
  check_throws<tensordict::ValueError>([&] { s->read({rows({"a"}, {1, 1})}); }, {"/a", "ascending"});
  s->create({"scalar"}, at::kDouble, {}, at::scalar_tensor(2.5, at::kDouble), {});
  check_throws<tensordict::ValueError>([&] { s->read({rows({"scalar"}, {0})}); }, {"/scalar", "zero-dim"});
  s->write({be::LeafWrite{{"scalar"}, true, {}, at::scalar_tensor(-1.0, at::kDouble)}});
  BOOST_TEST(read1(*s, {"scalar"}).item<double>() == -1.0);
  // a read may ask for its result shape (td[i] wants [f], not [1, f]); a write is checked by element count
  {
    be::LeafRead one = rows({"b"}, {2});
    one.shape = std::vector<int64_t>{2};
    BOOST_TEST(same(s->read({one}).at(0), at::ones({2}, at::kInt)));
    be::LeafRead all = whole({"b"});
    all.shape = std::vector<int64_t>{1, 8};
    BOOST_TEST(same(s->read({all}).at(0), at::ones({1, 8}, at::kInt)));
    one.shape = std::vector<int64_t>{3};
    check_throws<tensordict::ValueError>([&] { s->read({one}); }, {"/b", "[3]"});
    s->write({be::LeafWrite{{"b"}, false, {2}, at::tensor({5, 6}, at::kInt)}});  // a row [2] at rows {2}
    BOOST_TEST(same(read1(*s, {"b"}).select(0, 2), at::tensor({5, 6}, at::kInt)));
    s->write({be::LeafWrite{{"b"}, true, {}, at::ones({8}, at::kInt)}});
    BOOST_TEST(same(read1(*s, {"b"}), at::ones({4, 2}, at::kInt)));
  }
  // one row list shared by the leaves of a call (as the remote node sends it): checked and laid out once
  // for leaves of one dim 0, checked again for a leaf of another dim 0 (the list fits "a" [4], not "short" [2])
  {
    s->create({"short"}, at::kLong, {2}, at::arange(2), {});
    const be::RowList shared = std::vector<int64_t>{1, 3};
    be::LeafRead ra{{"a"}, false, shared}, rb{{"b"}, false, shared}, rs{{"short"}, false, shared};
    auto got2 = s->read({ra, rb});
    BOOST_TEST(same(got2[0], at::tensor({10, 33}, at::kLong)));
    BOOST_TEST(same(got2[1], at::ones({2, 2}, at::kInt)));
    check_throws<tensordict::IndexError>([&] { s->read({ra, rs}); }, {"/short", "row 3"});
    check_throws<tensordict::IndexError>(
        [&] { s->write({be::LeafWrite{{"a"}, false, shared, at::tensor({7, 8}, at::kLong)},
                        be::LeafWrite{{"short"}, false, shared, at::tensor({7, 8}, at::kLong)}}); },
        {"/short", "row 3"});
    BOOST_TEST(same(read1(*s, {"a"}), at::tensor({0, 10, 2, 33}, at::kLong)));  // nothing written
    BOOST_TEST(same(read1(*s, {"short"}), at::arange(2)));
    // an unsorted shared list is refused for every leaf, however often it is sent
    const be::RowList unsorted = std::vector<int64_t>{2, 1};
    for (int k = 0; k < 2; ++k)
      check_throws<tensordict::ValueError>([&] { s->read({be::LeafRead{{"a"}, false, unsorted}}); }, {"/a", "ascending"});
    s->erase({"short"});
  }
  // zero-size: rows of an empty leaf, whole writes
  s->create({"empty"}, at::kFloat, {0, 4}, {}, {});
  BOOST_TEST(same(s->read({rows({"empty"}, {})}).at(0), at::empty({0, 4})));
  s->write({be::LeafWrite{{"empty"}, true, {}, at::empty({0, 4})}});
  BOOST_TEST(same(read1(*s, {"empty"}), at::empty({0, 4})));
}

BOOST_AUTO_TEST_CASE(many_scattered_rows) {
  TempDir dir;
  auto s = be::open_h5_store(dir / "t.h5", be::H5Mode::Write);
  const int64_t n = 200000;
  at::Tensor full = at::arange(n * 8, at::kFloat).reshape({n, 8});
  s->create({"x"}, at::kFloat, {n, 8}, full, {});
  std::vector<int64_t> r;
  for (int64_t i = 0; i < n; i += 10) r.push_back(i);  // 20000 runs of one row, evenly spaced: one strided selection
  auto t0 = std::chrono::steady_clock::now();
  at::Tensor got = s->read({rows({"x"}, r)}).at(0);
  auto t1 = std::chrono::steady_clock::now();
  BOOST_TEST(same(got, pick(full, r)));
  std::vector<int64_t> runs;
  for (int64_t i = 0; i < n; i += 100)
    for (int64_t k = 0; k < 10; ++k) runs.push_back(i + k);  // 2000 runs of 10 rows
  auto t2 = std::chrono::steady_clock::now();
  got = s->read({rows({"x"}, runs)}).at(0);
  auto t3 = std::chrono::steady_clock::now();
  BOOST_TEST(same(got, pick(full, runs)));
  s->write({be::LeafWrite{{"x"}, false, r, at::zeros({static_cast<int64_t>(r.size()), 8})}});
  auto t4 = std::chrono::steady_clock::now();
  at::Tensor expect = full.clone();
  expect.index_fill_(0, at::tensor(r, at::kLong), 0);
  BOOST_TEST(same(read1(*s, {"x"}), expect));
  std::vector<int64_t> irregular;  // 20000 single rows, not evenly spaced: runs, kRunsPerTransfer per transfer
  for (int64_t i = 0; i < n; i += 10) irregular.push_back(i % 70 == 0 ? i + 1 : i);
  auto t5 = std::chrono::steady_clock::now();
  got = s->read({rows({"x"}, irregular)}).at(0);
  auto t6 = std::chrono::steady_clock::now();
  BOOST_TEST(same(got, pick(expect, irregular)));
  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  BOOST_TEST_MESSAGE("h5 rows [200000, 8] float: read every 10th row (20000) " << ms(t0, t1) << " ms, 2000 runs of 10 "
                                                                             << ms(t2, t3) << " ms, write every 10th "
                                                                             << ms(t3, t4) << " ms, read 20000 irregular "
                                                                             << ms(t5, t6) << " ms");
}

BOOST_AUTO_TEST_CASE(create_without_data_reads_zeros) {
  TempDir dir;
  auto s = be::open_h5_store(dir / "t.h5", be::H5Mode::Write);
  s->create({"c"}, at::kFloat, {6, 2}, {}, {});
  s->create({"k"}, at::kLong, {6, 2}, {}, be::CreateOptions{{2, 2}, -1, false});
  s->create({"b"}, at::kBool, {6}, {}, {});
  s->create({"z"}, at::kComplexFloat, {3}, {}, {});
  BOOST_TEST(same(read1(*s, {"c"}), at::zeros({6, 2})));
  BOOST_TEST(same(read1(*s, {"k"}), at::zeros({6, 2}, at::kLong)));
  BOOST_TEST(same(read1(*s, {"b"}), at::zeros({6}, at::kBool)));
  BOOST_TEST(same(read1(*s, {"z"}), at::zeros({3}, at::kComplexFloat)));
  // a partial write keeps the rest at zero (contiguous and chunked)
  s->write({be::LeafWrite{{"c"}, false, {2}, at::full({1, 2}, 5.0)}, be::LeafWrite{{"k"}, false, {3}, at::full({1, 2}, 7, at::kLong)}});
  at::Tensor ec = at::zeros({6, 2});
  ec[2] = 5.0;
  at::Tensor ek = at::zeros({6, 2}, at::kLong);
  ek[3] = 7;
  BOOST_TEST(same(read1(*s, {"c"}), ec));
  BOOST_TEST(same(read1(*s, {"k"}), ek));
  // after an erase, freed space may be reused: a new dataset still reads zeros
  s->create({"junk"}, at::kFloat, {1024}, at::full({1024}, 9.0), {});
  s->flush();
  BOOST_TEST(s->erase({"junk"}));
  s->create({"fresh"}, at::kFloat, {1024}, {}, {});
  s->write({be::LeafWrite{{"fresh"}, false, {0}, at::ones({1})}});
  at::Tensor ef = at::zeros({1024});
  ef[0] = 1;
  BOOST_TEST(same(read1(*s, {"fresh"}), ef));
  s->close();
  auto r = be::open_h5_store(dir / "t.h5", be::H5Mode::Read);
  BOOST_TEST(same(read1(*r, {"c"}), ec));
  BOOST_TEST(same(read1(*r, {"fresh"}), ef));
}

BOOST_AUTO_TEST_CASE(large_create_costs_nothing) {
  TempDir dir;
  const std::string f = dir / "big.h5";
  auto s = be::open_h5_store(f, be::H5Mode::Write);
  auto t0 = std::chrono::steady_clock::now();
  s->create({"big"}, at::kFloat, {262144, 1024}, {}, {});  // 1 GiB
  s->flush();
  auto t1 = std::chrono::steady_clock::now();
  struct stat st;
  BOOST_TEST_REQUIRE(::stat(f.c_str(), &st) == 0);
  const double after_create = static_cast<double>(st.st_blocks) * 512;
  BOOST_TEST(after_create < 1e6, "allocated bytes after create: " << after_create);
  s->write({be::LeafWrite{{"big"}, false, {131072}, at::ones({1, 1024})}});
  s->flush();
  auto t2 = std::chrono::steady_clock::now();
  BOOST_TEST_REQUIRE(::stat(f.c_str(), &st) == 0);
  const double after_write = static_cast<double>(st.st_blocks) * 512;
  at::Tensor got = s->read({rows({"big"}, {0, 131071, 131072, 262143})}).at(0);
  at::Tensor expect = at::zeros({4, 1024});
  expect[2] = 1;
  BOOST_TEST(same(got, expect));
  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  BOOST_TEST_MESSAGE("h5 create 1 GiB float32 without data: " << ms(t0, t1) << " ms, " << after_create
                                                              << " bytes on disk; after writing one row: "
                                                              << ms(t1, t2) << " ms, " << after_write << " bytes on disk ("
                                                              << st.st_size << " apparent)");
}

BOOST_AUTO_TEST_CASE(chunked_gzip_shuffle) {
  TempDir dir;
  const std::string dump = require_h5dump(dir);
  const std::string f = dir / "t.h5";
  {
    auto s = be::open_h5_store(f, be::H5Mode::Write);
    at::Tensor x = sample(at::kFloat, {100, 7});
    s->create({"auto"}, at::kFloat, {100, 7}, x, be::CreateOptions{{}, 9, true});
    s->create({"given"}, at::kLong, {10, 4}, at::arange(40).reshape({10, 4}), be::CreateOptions{{3, 4}, 4, false});
    s->create({"shuf"}, at::kInt, {5}, {}, be::CreateOptions{{}, -1, true});
    s->create({"bigrow"}, at::kFloat, {64, 1024, 1024}, {}, be::CreateOptions{{}, 1, false});  // 4 MiB rows
    check_throws<tensordict::ValueError>([&] { s->create({"bad"}, at::kFloat, {4}, {}, be::CreateOptions{{2, 2}, -1, false}); },
                                         {"/bad", "chunk"});
    check_throws<tensordict::ValueError>([&] { s->create({"bad"}, at::kFloat, {4}, {}, be::CreateOptions{{8}, -1, false}); },
                                         {"/bad", "chunk"});
    check_throws<tensordict::ValueError>([&] { s->create({"bad"}, at::kFloat, {4}, {}, be::CreateOptions{{}, 10, false}); },
                                         {"/bad", "gzip"});
    s->write({be::LeafWrite{{"given"}, false, {0, 9}, at::full({2, 4}, -1, at::kLong)}});
    BOOST_TEST(same(read1(*s, {"auto"}), x));
    at::Tensor g = at::arange(40).reshape({10, 4});
    g[0] = -1;
    g[9] = -1;
    BOOST_TEST(same(read1(*s, {"given"}), g));
    BOOST_TEST(same(read1(*s, {"shuf"}), at::zeros({5}, at::kInt)));
    BOOST_TEST(same(s->read({rows({"bigrow"}, {63})}).at(0), at::zeros({1, 1024, 1024})));
  }
  Run r = run(dir, "'" + dump + "' -p -H '" + f + "'");
  BOOST_TEST_REQUIRE(r.rc == 0, r.err);
  for (const char* needle : {"CHUNKED ( 100, 7 )", "CHUNKED ( 3, 4 )", "CHUNKED ( 1, 256, 1024 )", "SHUFFLE",
                             "COMPRESSION DEFLATE { LEVEL 9 }", "COMPRESSION DEFLATE { LEVEL 4 }"})
    BOOST_TEST(r.out.find(needle) != std::string::npos, "h5dump -p lacks " << needle << ":\n" << r.out);
  // store-wide defaults apply when a create asks for nothing
  auto d = be::open_h5_store(dir / "d.h5", be::H5Mode::Write, {}, be::CreateOptions{{}, 3, false});
  d->create({"x"}, at::kDouble, {10}, at::arange(10, at::kDouble), {});
  d->close();
  r = run(dir, "'" + dump + "' -p -H '" + (dir / "d.h5") + "'");
  BOOST_TEST(r.out.find("COMPRESSION DEFLATE { LEVEL 3 }") != std::string::npos, r.out);
}

BOOST_AUTO_TEST_CASE(non_tensors) {
  TempDir dir;
  auto s = be::open_h5_store(dir / "t.h5", be::H5Mode::Write);
  const std::vector<std::pair<std::string, JsonValue>> values = {
      {"str", JsonValue("a string!")},
      {"utf8", JsonValue("h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80")},
      {"empty_str", JsonValue("")},
      {"int", JsonValue(3)},
      {"neg", JsonValue(-(int64_t{1} << 40))},
      {"float", JsonValue(2.5)},
      {"bool", JsonValue(true)},
      {"ints", JsonValue::array({1, 2, 3})},
      {"floats", JsonValue::array({1.5, -2.0})},
      {"bools", JsonValue::array({true, false})},
      {"strs", JsonValue::array({"a", "bc", "d\xc3\xa9"})},
      {"matrix", JsonValue::array({JsonValue::array({1, 2}), JsonValue::array({3, 4})})},
      {"empty_list", JsonValue::array({})},
      {"bytes", JsonValue(JsonValue::Bytes{std::string("\x00\x01\xff", 3)})},
  };
  for (const auto& [k, v] : values) s->write_non_tensor({"nt", k}, {v, false});
  s->close();
  s = be::open_h5_store(dir / "t.h5", be::H5Mode::ReadWrite);
  for (const auto& i : s->list())
    if (i.path.size() == 2) BOOST_TEST((i.kind == be::LeafKind::NonTensor), i.path[1]);
  for (const auto& [k, v] : values) {
    JsonValue got = s->read_non_tensor({"nt", k}).value;
    JsonValue expect = v;
    if (k == "empty_list") expect = JsonValue::array({});  // np.array([]) is float64 (0,)
    BOOST_TEST((got == expect), k << ": " << got << " != " << expect);
  }
  // numpy promotion: ints with floats -> <f8, bools with ints -> <i8
  s->write_non_tensor({"mixed_num"}, {JsonValue::array({1, 2.5}), false});
  BOOST_TEST((s->read_non_tensor({"mixed_num"}).value == JsonValue::array({1.0, 2.5})));
  s->write_non_tensor({"mixed_bool"}, {JsonValue::array({true, 2}), false});
  BOOST_TEST((s->read_non_tensor({"mixed_bool"}).value == JsonValue::array({1, 2})));
  // replacing a non-tensor
  s->write_non_tensor({"nt", "int"}, {JsonValue("now a string"), false});
  BOOST_TEST((s->read_non_tensor({"nt", "int"}).value == JsonValue("now a string")));
  // what numpy cannot hold with a fixed dtype: TypeError, nothing written
  for (const JsonValue& bad : {JsonValue::object({{"a", 1}}), JsonValue(nullptr), JsonValue::array({1, "a"}),
                               JsonValue::array({JsonValue::array({1}), JsonValue::array({1, 2})}),
                               JsonValue::array({JsonValue(nullptr)})})
    check_throws<tensordict::TypeError>([&] { s->write_non_tensor({"nt", "bad"}, {bad, false}); }, {"/nt/bad"});
  BOOST_TEST(!s->erase({"nt", "bad"}));
  check_throws<tensordict::NotImplementedError>(
      [&] { s->write_non_tensor({"st"}, {JsonValue::array({"a", "b"}), true}); }, {"/st"});
  check_throws<tensordict::KeyError>([&] { s->read_non_tensor({"nope"}); }, {"/nope"});
}

BOOST_AUTO_TEST_CASE(erase_and_kinds) {
  TempDir dir;
  auto s = be::open_h5_store(dir / "t.h5", be::H5Mode::Write);
  s->create({"g", "x"}, at::kFloat, {2}, {}, {});
  s->create({"g", "h", "y"}, at::kFloat, {2}, {}, {});
  s->create({"k"}, at::kFloat, {2}, {}, {});
  s->write_non_tensor({"s"}, {JsonValue("v"), false});
  check_throws<tensordict::TypeError>([&] { s->read_non_tensor({"k"}); }, {"/k", "tensor"});
  check_throws<tensordict::TypeError>([&] { s->read({whole({"s"})}); }, {"/s", "non-tensor"});
  check_throws<tensordict::TypeError>([&] { s->write_non_tensor({"g"}, {JsonValue(1), false}); }, {"/g", "group"});
  BOOST_TEST(s->erase({"g", "x"}));
  BOOST_TEST(!s->erase({"g", "x"}));
  BOOST_TEST(s->erase({"g"}));
  BOOST_TEST(s->erase({"s"}));
  BOOST_TEST(!s->erase({"missing", "deep"}));
  auto l = s->list();
  BOOST_TEST_REQUIRE(l.size() == 1u);
  BOOST_TEST(l[0].path == be::LeafPath{"k"});
  check_throws<tensordict::ValueError>([&] { s->erase({}); }, {"root"});
}

BOOST_AUTO_TEST_CASE(open_datasets_follow_changes) {
  // the store keeps datasets open between calls: every change of the structure must be seen
  TempDir dir;
  const std::string f = dir / "t.h5";
  auto s = be::open_h5_store(f, be::H5Mode::Write);
  s->create({"x"}, at::kFloat, {4, 2}, at::ones({4, 2}), {});
  s->create({"g", "y"}, at::kLong, {3}, at::arange(3), {});
  s->create({"n"}, at::kInt, {2}, at::arange(2, at::kInt), {});
  BOOST_TEST(same(s->read({rows({"x"}, {1, 3})}).at(0), at::ones({2, 2})));
  BOOST_TEST(same(read1(*s, {"g", "y"}), at::arange(3)));
  BOOST_TEST(same(read1(*s, {"n"}), at::arange(2, at::kInt)));
  // erase, then create anew with another dtype and shape
  BOOST_TEST(s->erase({"x"}));
  check_throws<tensordict::KeyError>([&] { s->read({rows({"x"}, {1})}); }, {"/x", "no such dataset"});
  check_throws<tensordict::KeyError>(
      [&] { s->write({be::LeafWrite{{"x"}, false, {1}, at::zeros({1, 2})}}); }, {"/x", "no such dataset"});
  s->create({"x"}, at::kDouble, {5}, at::arange(5, at::kDouble), {});
  BOOST_TEST(same(s->read({rows({"x"}, {0, 2, 4})}).at(0), at::tensor({0.0, 2.0, 4.0}, at::kDouble)));
  s->write({be::LeafWrite{{"x"}, false, {1, 3}, at::full({2}, 9.0, at::kDouble)}});
  BOOST_TEST(same(read1(*s, {"x"}), at::tensor({0.0, 9.0, 2.0, 9.0, 4.0}, at::kDouble)));
  // erase a group holding a dataset kept open, then a dataset at its place
  BOOST_TEST(s->erase({"g"}));
  check_throws<tensordict::KeyError>([&] { read1(*s, {"g", "y"}); }, {"/g/y", "no such dataset"});
  s->create({"g"}, at::kShort, {2}, at::full({2}, 7, at::kShort), {});
  BOOST_TEST(same(read1(*s, {"g"}), at::full({2}, 7, at::kShort)));
  // a tensor replaced by a non-tensor
  s->write_non_tensor({"n"}, {JsonValue("now a string"), false});
  check_throws<tensordict::TypeError>([&] { read1(*s, {"n"}); }, {"/n", "non-tensor"});
  BOOST_TEST(s->read_non_tensor({"n"}).value.as_string() == "now a string");
  // close and reopen: nothing stale survives
  s->close();
  check_throws<tensordict::BackendError>([&] { read1(*s, {"x"}); }, {"closed"});
  auto r = be::open_h5_store(f, be::H5Mode::Read);
  BOOST_TEST(same(read1(*r, {"x"}), at::tensor({0.0, 9.0, 2.0, 9.0, 4.0}, at::kDouble)));
}

BOOST_AUTO_TEST_CASE(stores_of_one_process_see_each_others_changes) {
  // HDF5 lets one process open a file in several stores, read-write too: each keeps datasets open, so a
  // structure change by one must reach the others
  TempDir dir;
  const std::string f = dir / "t.h5";
  auto a = be::open_h5_store(f, be::H5Mode::Write);
  a->create({"x"}, at::kLong, {3}, at::arange(3), {});
  a->create({"g", "y"}, at::kInt, {2}, at::arange(2, at::kInt), {});
  auto b = be::open_h5_store(f, be::H5Mode::ReadWrite);
  const std::string link = dir / "hard-link.h5";
  std::filesystem::create_hard_link(f, link);  // one file, another name: HDF5 and the store know it by inode
  auto r = be::open_h5_store(link, be::H5Mode::Append, {"g"});
  BOOST_TEST(same(read1(*a, {"x"}), at::arange(3)));
  BOOST_TEST(same(read1(*b, {"x"}), at::arange(3)));
  BOOST_TEST(same(read1(*r, {"y"}), at::arange(2, at::kInt)));
  // rows written by one store: the same object in HDF5, seen at once
  b->write({be::LeafWrite{{"x"}, false, {1}, at::tensor({7}, at::kLong)}});
  BOOST_TEST(same(read1(*a, {"x"}), at::tensor({0, 7, 2}, at::kLong)));
  // replaced by another store: a sees the new dataset, not the one it kept open
  BOOST_TEST(b->erase({"x"}));
  check_throws<tensordict::KeyError>([&] { read1(*a, {"x"}); }, {"/x", "no such dataset"});
  b->create({"x"}, at::kDouble, {2}, at::full({2}, 1.5, at::kDouble), {});
  BOOST_TEST(same(read1(*a, {"x"}), at::full({2}, 1.5, at::kDouble)));
  a->write_non_tensor({"g", "y"}, {JsonValue(3), false});
  check_throws<tensordict::TypeError>([&] { read1(*r, {"y"}); }, {"hard-link.h5", "/y", "non-tensor"});
}

BOOST_AUTO_TEST_CASE(soft_link_to_an_erased_dataset) {
  // a dataset kept open under a soft link's path: erasing its target must not leave it readable
  TempDir dir;
  require_h5py(dir);
  const std::string f = dir / "py.h5";
  Run r = python(dir, R"PY(
import h5py, numpy as np, sys
with h5py.File(sys.argv[1], "w") as f:
    f["d"] = np.arange(4, dtype=np.int64)
    f["l"] = h5py.SoftLink("/d")
)PY",
                 "'" + f + "'");
  BOOST_TEST_REQUIRE(r.rc == 0, r.err);
  auto s = be::open_h5_store(f, be::H5Mode::ReadWrite);
  BOOST_TEST(same(s->read({rows({"l"}, {1, 3})}).at(0), at::tensor({1, 3}, at::kLong)));
  BOOST_TEST(s->erase({"d"}));
  check_throws<tensordict::KeyError>([&] { read1(*s, {"l"}); }, {"/l", "not a dataset"});
  s->create({"d"}, at::kLong, {2}, at::tensor({5, 6}, at::kLong), {});  // the link leads to the new dataset
  BOOST_TEST(same(read1(*s, {"l"}), at::tensor({5, 6}, at::kLong)));
}

BOOST_AUTO_TEST_CASE(reopen_modes_and_specs) {
  TempDir dir;
  const std::string f = dir / "t.h5";
  {
    auto s = be::open_h5_store(f, be::H5Mode::Write);
    s->create({"x"}, at::kLong, {3}, at::arange(3), {});
  }  // the destructor closes
  {
    auto s = be::open_h5_store(f, be::H5Mode::Read);
    BOOST_TEST(same(read1(*s, {"x"}), at::arange(3)));
    check_throws<tensordict::ValueError>([&] { s->write({be::LeafWrite{{"x"}, true, {}, at::zeros({3}, at::kLong)}}); },
                                         {f, "read-only"});
    check_throws<tensordict::ValueError>([&] { s->create({"y"}, at::kFloat, {1}, {}, {}); }, {f, "read-only"});
    check_throws<tensordict::ValueError>([&] { s->erase({"x"}); }, {f, "read-only"});
    check_throws<tensordict::ValueError>([&] { s->write_non_tensor({"n"}, {JsonValue(1), false}); }, {f, "read-only"});
    check_throws<tensordict::ValueError>([&] { s->create_group({"g"}); }, {f, "read-only"});
    s->flush();
    BOOST_TEST(same(read1(*s, {"x"}), at::arange(3)));  // nothing lost
    JsonValue spec = s->spec_fields();
    BOOST_TEST(spec.find("path")->as_string() == f);
    BOOST_TEST(spec.find("group")->as_string() == "/");
    BOOST_TEST(spec.find("mode")->as_string() == "r");
    BOOST_TEST(s->describe() == "HDF5 file " + f);
  }
  {
    auto s = be::open_h5_store(f, be::H5Mode::ReadWrite);
    s->write({be::LeafWrite{{"x"}, false, {1}, at::tensor({9}, at::kLong)}});
  }
  {
    auto s = be::open_h5_store(f, be::H5Mode::Append, {"sub", "deeper"});  // the group is created
    s->create({"y"}, at::kFloat, {2}, at::ones({2}), {});
    BOOST_TEST(s->describe() == "HDF5 file " + f + " (group /sub/deeper)");
    BOOST_TEST(s->spec_fields().find("group")->as_string() == "/sub/deeper");
    // reopen from the spec in read-only mode (what another process does)
    auto r = be::open_h5_store(s->spec_fields(), be::H5Mode::Read);
    BOOST_TEST(r->list().size() == 1u);
    BOOST_TEST(same(read1(*r, {"y"}), at::ones({2})));
  }
  {
    auto s = be::open_h5_store(f, be::H5Mode::Append);
    BOOST_TEST(same(read1(*s, {"x"}), at::tensor({0, 9, 2}, at::kLong)));
    BOOST_TEST(same(read1(*s, {"sub", "deeper", "y"}), at::ones({2})));
    check_throws<tensordict::KeyError>([&] { be::open_h5_store(f, be::H5Mode::Read, {"nope"}); }, {f, "/nope"});
  }
  {
    auto s = be::open_h5_store(dir / "fresh.h5", be::H5Mode::Append);  // "a" creates
    BOOST_TEST(s->list().empty());
  }
  {
    auto s = be::open_h5_store(f, be::H5Mode::Write);  // "w" truncates
    BOOST_TEST(s->list().empty());
    JsonValue spec = s->spec_fields();
    s->create({"k"}, at::kFloat, {1}, at::ones({1}), {});
    s->close();
    auto again = be::open_h5_store(spec);  // a "w" spec reopens as "r+", never truncating
    BOOST_TEST(again->list().size() == 1u);
    BOOST_TEST(again->writable());
  }
  {
    // relative paths become absolute
    auto cwd = std::filesystem::current_path();
    std::filesystem::current_path(dir.path);
    auto s = be::open_h5_store("rel.h5", be::H5Mode::Write);
    std::filesystem::current_path(cwd);
    BOOST_TEST(s->spec_fields().find("path")->as_string() == dir / "rel.h5");
  }
  check_throws<tensordict::FormatError>([] { be::open_h5_store(JsonValue::object({{"group", "/"}})); }, {"path"});
  check_throws<tensordict::ValueError>(
      [&] { be::open_h5_store(JsonValue::object({{"path", f}, {"mode", "rw"}})); }, {"rw"});
}

BOOST_AUTO_TEST_CASE(not_durable_stores) {
  // durable = false (h5py's behaviour): writes stay in HDF5's caches until flush() / close(); the spec
  // carries the choice to other processes, and what was written reads back in the store and after close
  TempDir dir;
  const std::string f = dir / "nd.h5";
  be::CreateOptions gz;
  gz.chunks = {4, 3};
  gz.compression_level = 4;
  gz.shuffle = true;
  {
    auto durable = be::open_h5_store(dir / "d.h5", be::H5Mode::Write);
    BOOST_TEST(durable->spec_fields().find("durable") == nullptr);  // the default stays out of specs
    auto s = be::open_h5_store(f, be::H5Mode::Write, {}, {}, /*durable=*/false);
    BOOST_TEST(s->spec_fields().find("durable")->as_bool() == false);
    s->create({"c"}, at::kFloat, {10, 3}, at::Tensor(), {});
    s->create({"z"}, at::kFloat, {10, 3}, at::Tensor(), gz);
    at::Tensor rows = at::arange(6, at::kFloat).reshape({2, 3});
    s->write({be::LeafWrite{{"c"}, false, {2, 7}, rows}, be::LeafWrite{{"z"}, false, {2, 7}, rows + 1}});
    at::Tensor want = at::zeros({10, 3});
    want.index_put_({at::tensor({2, 7}, at::kLong)}, rows);
    BOOST_TEST(same(read1(*s, {"c"}), want));
    at::Tensor want_z = at::zeros({10, 3});
    want_z.index_put_({at::tensor({2, 7}, at::kLong)}, rows + 1);
    BOOST_TEST(same(read1(*s, {"z"}), want_z));
    s->flush();
    auto again = be::open_h5_store(s->spec_fields());  // another handle from the spec: still not durable
    BOOST_TEST(again->spec_fields().find("durable")->as_bool() == false);
    s->write({be::LeafWrite{{"c"}, false, {0}, at::full({3}, 5.0)}});
    s->close();
    again->close();
  }
  {
    auto r = be::open_h5_store(f, be::H5Mode::Read);
    at::Tensor c = read1(*r, {"c"});
    BOOST_TEST(same(c.index({0}), at::full({3}, 5.0)));  // written after the flush: reached the file at close
    BOOST_TEST(same(c.index({2}), at::arange(3, at::kFloat)));
    BOOST_TEST(same(read1(*r, {"z"}).index({7}), at::arange(3, 6, at::kFloat) + 1));
  }
  check_throws<tensordict::FormatError>(
      [&] { be::open_h5_store(JsonValue::object({{"path", f}, {"durable", "no"}})); }, {"durable", "boolean"});
}

BOOST_AUTO_TEST_SUITE_END()
