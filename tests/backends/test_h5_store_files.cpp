// The HDF5 LeafStore on files: closed stores, two stores on one file, the Python fixture, bad files and fuzz
// regressions, refused types, a second writer across processes, threads, and outside readers (h5py through
// /usr/bin/python3, h5dump). Helpers in test_h5_store_util.hpp.
#include "backends/test_h5_store_util.hpp"

BOOST_AUTO_TEST_SUITE(h5_store_files)

BOOST_AUTO_TEST_CASE(closed_store) {
  TempDir dir;
  auto s = be::open_h5_store(dir / "t.h5", be::H5Mode::Write);
  s->create({"x"}, at::kFloat, {1}, {}, {});
  s->close();
  s->close();  // idempotent
  check_throws<tensordict::BackendError>([&] { s->list(); }, {dir / "t.h5", "is closed"});
  check_throws<tensordict::BackendError>([&] { s->read({whole({"x"})}); }, {"is closed"});
  check_throws<tensordict::BackendError>([&] { s->flush(); }, {"is closed"});
  check_throws<tensordict::BackendError>([&] { s->read_non_tensor({"x"}); }, {"is closed"});
  // the file is really released: another store opens it for writing
  auto t = be::open_h5_store(dir / "t.h5", be::H5Mode::ReadWrite);
  BOOST_TEST(t->list().size() == 1u);
}

BOOST_AUTO_TEST_CASE(two_stores_on_one_file) {
  TempDir dir;
  const std::string f = dir / "t.h5";
  {
    auto w = be::open_h5_store(f, be::H5Mode::Write);
    w->create({"g", "x"}, at::kLong, {3}, at::arange(3), {});
  }
  auto a = be::open_h5_store(f, be::H5Mode::Read);
  auto b = be::open_h5_store(f, be::H5Mode::Read, {"g"});
  BOOST_TEST(same(read1(*a, {"g", "x"}), at::arange(3)));  // both keep the dataset open
  BOOST_TEST(same(read1(*b, {"x"}), at::arange(3)));
  a->close();  // closing one store leaves the other usable (H5F_CLOSE_STRONG closes a's objects only)
  BOOST_TEST(same(read1(*b, {"x"}), at::arange(3)));
  // a writer while this process reads it: refused, named
  check_throws<tensordict::BackendError>([&] { be::open_h5_store(f, be::H5Mode::ReadWrite); }, {f});
  check_throws<tensordict::BackendError>([&] { be::open_h5_store(f, be::H5Mode::Write); }, {f});
  BOOST_TEST(same(read1(*b, {"x"}), at::arange(3)));
  b->close();
  auto c = be::open_h5_store(f, be::H5Mode::ReadWrite);
  BOOST_TEST(c->list().size() == 2u);
}

BOOST_AUTO_TEST_CASE(python_fixture) {
  const std::string file = td_test::fixture("python-written/i_h5.h5");
  JsonValue expected = JsonValue::parse(td_test::read_file(td_test::fixture("python-written/i_h5.expected.json")));
  auto s = be::open_h5_store(file, be::H5Mode::Read);
  auto l = s->list();
  size_t tensors = 0;
  bool has_sub = false;
  for (const auto& i : l) {
    if (i.kind == be::LeafKind::Group) has_sub = has_sub || i.path == be::LeafPath{"sub"};
    if (i.kind == be::LeafKind::Tensor) ++tensors;
  }
  BOOST_TEST(has_sub);
  const auto& leaves = expected.find("leaves")->as_array();
  BOOST_TEST(tensors == leaves.size());
  for (const auto& leaf : leaves) {
    be::LeafPath key;
    for (const auto& k : leaf.find("key")->as_array()) key.push_back(k.as_string());
    const std::string name = key.back();
    auto dt_opt = be::dtype_from_string(leaf.find("dtype")->as_string());
    BOOST_TEST_REQUIRE(dt_opt.has_value());
    const at::ScalarType dt = *dt_opt;
    std::vector<int64_t> shape;
    for (const auto& d : leaf.find("shape")->as_array()) shape.push_back(d.as_int());
    at::Tensor got = read1(*s, key);
    BOOST_TEST((got.scalar_type() == dt), name);
    BOOST_TEST(got.sizes().vec() == shape, name);
    at::Tensor flat = got.reshape({-1}).to(at::kDouble);
    const auto& vals = leaf.find("values")->as_array();
    BOOST_TEST_REQUIRE(static_cast<size_t>(flat.numel()) == vals.size());
    for (size_t i = 0; i < vals.size(); ++i) {
      double e = vals[i].is_bool() ? (vals[i].as_bool() ? 1.0 : 0.0) : vals[i].as_double();
      BOOST_TEST(flat[static_cast<int64_t>(i)].item<double>() == e, name << "[" << i << "]");
    }
    // rows of the fixture too
    at::Tensor r = s->read({rows(key, {0, 2})}).at(0);
    BOOST_TEST(same(r, pick(got, {0, 2})), name);
  }
}

BOOST_AUTO_TEST_CASE(bad_files) {
  TempDir dir;
  const std::string good = dir / "good.h5";
  {
    auto s = be::open_h5_store(good, be::H5Mode::Write);
    s->create({"sub", "x"}, at::kFloat, {64, 4}, sample(at::kFloat, {64, 4}), {});
    s->create({"b"}, at::kBool, {64}, sample(at::kBool, {64}), {});
    s->write_non_tensor({"s"}, {JsonValue("text"), false});
  }
  const std::string bytes = td_test::read_file(good);
  BOOST_TEST_REQUIRE(bytes.size() > 200u);
  check_throws<tensordict::BackendError>([&] { be::open_h5_store(dir / "missing.h5", be::H5Mode::Read); },
                                         {dir / "missing.h5", "no such file"});
  check_throws<tensordict::BackendError>([&] { be::open_h5_store(dir / "missing.h5", be::H5Mode::ReadWrite); },
                                         {"no such file"});
  BOOST_TEST(!td_test::exists(dir / "missing.h5"));
  std::filesystem::create_directory(dir / "adir");
  for (auto m : {be::H5Mode::Read, be::H5Mode::ReadWrite, be::H5Mode::Write, be::H5Mode::Append})
    check_throws<tensordict::BackendError>([&] { be::open_h5_store(dir / "adir", m); }, {dir / "adir", "directory"});
  check_throws<tensordict::BackendError>([&] { be::open_h5_store(dir / "nodir/x.h5", be::H5Mode::Write); },
                                         {dir / "nodir"});
  // truncated copies
  for (size_t cut : {size_t{0}, size_t{7}, size_t{100}, bytes.size() / 2, bytes.size() - 1}) {
    const std::string f = dir / ("cut" + std::to_string(cut) + ".h5");
    td_test::write_text(f, bytes.substr(0, cut));
    check_throws<tensordict::FormatError>([&] { be::open_h5_store(f, be::H5Mode::Read); }, {f});
    check_throws<tensordict::FormatError>([&] { be::open_h5_store(f, be::H5Mode::ReadWrite); }, {f});
    BOOST_TEST(td_test::read_file(f).size() == cut);  // left as it was
  }
  td_test::write_text(dir / "text.h5", "this is not an HDF5 file at all\n");
  check_throws<tensordict::FormatError>([&] { be::open_h5_store(dir / "text.h5", be::H5Mode::Read); },
                                        {dir / "text.h5", "not a valid HDF5 file"});
  // the signature: a flipped byte makes it no HDF5 file
  for (size_t pos : {size_t{0}, size_t{3}, size_t{7}}) {
    std::string b = bytes;
    b[pos] = static_cast<char>(b[pos] ^ 0x5A);
    const std::string f = dir / ("sig" + std::to_string(pos) + ".h5");
    td_test::write_text(f, b);
    check_throws<tensordict::FormatError>([&] { be::open_h5_store(f, be::H5Mode::Read); }, {f});
  }
  // the rest of the superblock (and a few later bytes): opening, listing, reading either work or throw a
  // tensordict::Error (never crash, never another exception)
  for (size_t pos = 8; pos < 120 && pos < bytes.size(); ++pos)
    for (unsigned char mask : {0x01, 0xFF}) {
      std::string b = bytes;
      b[pos] = static_cast<char>(b[pos] ^ mask);
      const std::string f = dir / "flip.h5";
      td_test::write_text(f, b);
      try {
        auto s = be::open_h5_store(f, be::H5Mode::Read);
        for (const auto& i : s->list()) {
          if (i.kind == be::LeafKind::Tensor) (void)s->read({whole(i.path)});
          if (i.kind == be::LeafKind::NonTensor) (void)s->read_non_tensor(i.path);
        }
      } catch (const tensordict::Error&) {
      } catch (const std::exception& e) {
        BOOST_ERROR("byte " << pos << " ^ " << int(mask) << ": not a tensordict::Error: " << e.what());
      }
    }
}

BOOST_AUTO_TEST_CASE(fuzz_regressions) {
  // a compact dataset whose layout records 0 bytes: libhdf5 1.10 crashes reading it; the store refuses it
  const std::string f =
      (std::filesystem::path(__FILE__).parent_path().parent_path() / "fuzz/h5_findings/fixed-compact-size0.h5").string();
  BOOST_TEST_REQUIRE(td_test::exists(f), "missing " << f);
  auto s = be::open_h5_store(f, be::H5Mode::Read);
  check_throws<tensordict::FormatError>([&] { s->read_non_tensor({"ob"}); }, {f, "/ob", "storage holds 0 bytes"});
  BOOST_TEST(same(read1(*s, {"flag"}), at::tensor({1, 0, 1, 1}).to(at::kBool)));
}

BOOST_AUTO_TEST_CASE(types_the_store_refuses) {
  TempDir dir;
  require_h5py(dir);
  Run r;
  // one file per odd dataset, beside a fine one
  for (const std::string name : {"u16", "u64", "color", "vlen", "ref", "null", "rec"}) {
    const std::string g = dir / (name + ".h5");
    r = python(dir, R"PY(
import h5py, numpy as np, sys
with h5py.File(sys.argv[1], "w") as f:
    k = sys.argv[2]
    if k == "u16": f[k] = np.arange(3, dtype=np.uint16)
    if k == "u64": f[k] = np.arange(3, dtype=np.uint64)
    if k == "color": f.create_dataset(k, data=np.array([0, 1, 2], dtype=np.int8), dtype=h5py.enum_dtype({"R": 0, "G": 1, "B": 2}, basetype="i1"))
    if k == "vlen": f.create_dataset(k, (2,), dtype=h5py.vlen_dtype(np.int32))
    if k == "ref": f.create_dataset(k, (1,), dtype=h5py.ref_dtype)
    if k == "null": f.create_dataset(k, data=h5py.Empty("f4"))
    if k == "rec": f.create_dataset(k, data=np.zeros(2, dtype=[("a", "i4"), ("b", "f8")]))
    f["fine"] = np.arange(2)
)PY",
               "'" + g + "' " + name);
    BOOST_TEST_REQUIRE(r.rc == 0, r.err);
    auto s = be::open_h5_store(g, be::H5Mode::Read);
    // the file opens and lists the odd dataset (as upstream lists every dataset); only reading it fails
    if (name != "null") {
      bool listed = false;
      for (const auto& i : s->list()) listed = listed || (i.path == be::LeafPath{name} && i.kind == be::LeafKind::NonTensor);
      BOOST_TEST(listed, name);
    }
    auto refused = [&](const std::function<void()>& read) {
      try {
        read();
        BOOST_ERROR(name << ": no error");
      } catch (const tensordict::TypeError& e) {
        BOOST_TEST(std::string(e.what()).find(g) != std::string::npos, e.what());
        BOOST_TEST(std::string(e.what()).find("/" + name) != std::string::npos, e.what());
        BOOST_TEST(std::string(e.what()).find("unsupported HDF5 type") != std::string::npos, e.what());
      } catch (const tensordict::FormatError& e) {
        BOOST_TEST(name == "null", e.what());
        BOOST_TEST(std::string(e.what()).find("/" + name) != std::string::npos, e.what());
      }
    };
    refused([&] {
      (void)s->list();
      (void)s->read({whole({name})});
    });
    if (name != "null") refused([&] { (void)s->read_non_tensor({name}); });
    BOOST_TEST(same(read1(*s, {"fine"}), at::arange(2)));
  }
}

BOOST_AUTO_TEST_CASE(second_writer_is_refused) {
  TempDir dir;
  const std::string f = dir / "locked.h5";
  {
    auto s = be::open_h5_store(f, be::H5Mode::Write);
    s->create({"x"}, at::kLong, {4}, at::arange(4), {});
  }
  int ready[2], go[2];
  BOOST_TEST_REQUIRE(::pipe(ready) == 0);
  BOOST_TEST_REQUIRE(::pipe(go) == 0);
  pid_t child = testutil::spawn([&] {
    ::close(ready[0]);
    ::close(go[1]);
    auto s = be::open_h5_store(f, be::H5Mode::ReadWrite);  // the child holds the write lock
    s->write({be::LeafWrite{{"x"}, false, {0}, at::tensor({100}, at::kLong)}});
    s->flush();
    char c = 1;
    if (::write(ready[1], &c, 1) != 1) return 2;
    if (::read(go[0], &c, 1) != 1) return 3;
    s->close();
    return 0;
  });
  ::close(ready[1]);
  ::close(go[0]);
  pollfd pfd{ready[0], POLLIN, 0};
  const bool child_ready = ::poll(&pfd, 1, 60000) == 1;
  if (!child_ready) ::kill(child, SIGKILL);
  BOOST_TEST_REQUIRE(child_ready, "the child did not open the file");
  char c = 0;
  BOOST_TEST_REQUIRE(::read(ready[0], &c, 1) == 1);
  for (auto m : {be::H5Mode::ReadWrite, be::H5Mode::Append, be::H5Mode::Write, be::H5Mode::Read})
    check_throws<tensordict::BackendError>([&] { be::open_h5_store(f, m); }, {f, "locked"});
  BOOST_TEST(::write(go[1], &c, 1) == 1);
  BOOST_TEST(testutil::wait_child(child) == 0);
  ::close(ready[0]);
  ::close(go[1]);
  // nothing was truncated by the refused "w"
  auto s = be::open_h5_store(f, be::H5Mode::Read);
  BOOST_TEST(same(read1(*s, {"x"}), at::tensor({100, 1, 2, 3}, at::kLong)));
}

BOOST_AUTO_TEST_CASE(stores_on_threads) {
  TempDir dir;
  std::vector<std::string> errors(3);
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t)
    threads.emplace_back([&, t] {
      try {
        auto s = be::open_h5_store(dir / ("t" + std::to_string(t) + ".h5"), be::H5Mode::Write);
        for (int i = 0; i < 100; ++i) {
          const std::string k = "k" + std::to_string(i);
          s->create({"g", k}, at::kLong, {8}, at::full({8}, i + 1000 * t, at::kLong), {});
          s->write({be::LeafWrite{{"g", k}, false, {3}, at::full({1}, -i, at::kLong)}});
          at::Tensor r = s->read({rows({"g", k}, {2, 3})}).at(0);
          if (r[0].item<int64_t>() != i + 1000 * t || r[1].item<int64_t>() != -i) errors[t] = "wrong values at " + k;
          s->write_non_tensor({"n", k}, {JsonValue(i), false});
          if (s->read_non_tensor({"n", k}).value != JsonValue(i)) errors[t] = "wrong non-tensor at " + k;
          try {
            s->read({whole({"missing"})});
            errors[t] = "no KeyError";
          } catch (const tensordict::KeyError&) {
          }
        }
        if (s->list().size() != 202u) errors[t] = "wrong list size";
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  for (auto& th : threads) th.join();
  for (const auto& e : errors) BOOST_TEST(e.empty(), e);
}

BOOST_AUTO_TEST_CASE(outside_readers_see_h5py_layout) {
  TempDir dir;
  require_h5py(dir);
  const std::string dump = require_h5dump(dir);
  const std::string f = dir / "ours.h5";
  {
    auto s = be::open_h5_store(f, be::H5Mode::Write);
    s->create({"obs"}, at::kFloat, {3, 2}, at::arange(6, at::kFloat).reshape({3, 2}), {});
    s->create({"idx"}, at::kLong, {3}, at::tensor({1, 2, 3}, at::kLong), {});
    s->create({"sub", "flag"}, at::kBool, {3}, at::tensor({1, 0, 1}).to(at::kBool), {});
    s->create({"sub", "deeper", "h"}, at::kHalf, {2}, at::tensor({0.5, 65504.0}).to(at::kHalf), {});
    s->create({"c"}, at::kComplexFloat, {2}, at::complex(at::tensor({1.0f, 3.0f}), at::tensor({2.0f, -4.0f})), {});
    s->create({"cd"}, at::kComplexDouble, {1}, at::complex(at::tensor({0.5}), at::tensor({-0.25})), {});
    s->create({"i8"}, at::kChar, {2}, at::tensor({-128, 127}, at::kChar), {});
    s->create({"u8"}, at::kByte, {2}, at::tensor({0, 255}, at::kByte), {});
    s->create({"i16"}, at::kShort, {1}, at::tensor({-300}, at::kShort), {});
    s->create({"i32"}, at::kInt, {1}, at::tensor({70000}, at::kInt), {});
    s->create({"f64"}, at::kDouble, {}, at::scalar_tensor(0.1, at::kDouble), {});
    s->create({"zeros"}, at::kFloat, {2, 2}, {}, {});
    s->create({"empty"}, at::kLong, {0, 3}, {}, {});
    s->write_non_tensor({"name"}, {JsonValue("a string!"), false});
    s->write_non_tensor({"n_int"}, {JsonValue(3), false});
    s->write_non_tensor({"n_float"}, {JsonValue(2.5), false});
    s->write_non_tensor({"n_bool"}, {JsonValue(true), false});
    s->write_non_tensor({"n_list"}, {JsonValue::array({1, 2, 3}), false});
    s->write_non_tensor({"n_strs"}, {JsonValue::array({"a", "bc"}), false});
  }
  Run r = python(dir, kDumpScript, "'" + f + "'");
  BOOST_TEST_REQUIRE(r.rc == 0, "h5py could not read our file: " << r.err);
  JsonValue d = JsonValue::parse(r.out);
  BOOST_TEST(d.find("attrs")->as_int() == 0);  // no attributes anywhere, as upstream
  struct Expect {
    std::string path, dtype, shape, value;
  };
  const std::vector<Expect> expect = {
      {"obs", "<f4", "[3,2]", "[[0.0,1.0],[2.0,3.0],[4.0,5.0]]"},
      {"idx", "<i8", "[3]", "[1,2,3]"},
      {"sub/flag", "|b1", "[3]", "[true,false,true]"},
      {"sub/deeper/h", "<f2", "[2]", "[0.5,65504.0]"},
      {"c", "<c8", "[2]", "[[1.0,2.0],[3.0,-4.0]]"},
      {"cd", "<c16", "[1]", "[[0.5,-0.25]]"},
      {"i8", "|i1", "[2]", "[-128,127]"},
      {"u8", "|u1", "[2]", "[0,255]"},
      {"i16", "<i2", "[1]", "[-300]"},
      {"i32", "<i4", "[1]", "[70000]"},
      {"f64", "<f8", "[]", "0.1"},
      {"zeros", "<f4", "[2,2]", "[[0.0,0.0],[0.0,0.0]]"},
      {"empty", "<i8", "[0,3]", "[]"},
      {"name", "str:utf-8", "[]", "{\"bytes\":\"a string!\"}"},  // h5py gives bytes, as upstream expects
      {"n_int", "<i8", "[]", "3"},
      {"n_float", "<f8", "[]", "2.5"},
      {"n_bool", "|b1", "[]", "true"},
      {"n_list", "<i8", "[3]", "[1,2,3]"},
      {"n_strs", "<U2", "[2]", "[\"a\",\"bc\"]"},
  };
  for (const auto& e : expect) {
    const JsonValue* it = item(d, e.path);
    BOOST_TEST_REQUIRE(it != nullptr, "h5py does not see " << e.path << " in " << r.out);
    BOOST_TEST(it->find("kind")->as_string() == "dataset", e.path);
    BOOST_TEST(it->find("dtype")->as_string() == e.dtype, e.path);
    BOOST_TEST(it->find("shape")->dump() == e.shape, e.path);
    BOOST_TEST(it->find("value")->dump() == e.value, e.path);
  }
  for (const char* g : {"sub", "sub/deeper"}) {
    const JsonValue* it = item(d, g);
    BOOST_TEST_REQUIRE(it != nullptr, g);
    BOOST_TEST(it->find("kind")->as_string() == "group");
  }
  BOOST_TEST(d.find("items")->as_array().size() == expect.size() + 2);

  r = run(dir, "'" + dump + "' -H '" + f + "'");
  BOOST_TEST_REQUIRE(r.rc == 0, r.err);
  const std::string& h = r.out;
  for (const char* needle :
       {"GROUP \"sub\"", "GROUP \"deeper\"", "DATASET \"flag\"", "H5T_ENUM", "H5T_STD_I8LE;", "\"FALSE\"            0;",
        "\"TRUE\"             1;", "H5T_COMPOUND", "H5T_IEEE_F32LE \"r\";", "H5T_IEEE_F32LE \"i\";", "H5T_IEEE_F64LE \"i\";",
        "16-bit little-endian floating-point", "H5T_STD_I64LE", "H5T_STD_U8LE", "OPAQUE_TAG \"NUMPY:<i8\"",
        "OPAQUE_TAG \"NUMPY:|b1\"", "OPAQUE_TAG \"NUMPY:<U2\"", "STRSIZE H5T_VARIABLE", "CSET H5T_CSET_UTF8",
        "DATASPACE  SCALAR", "SIMPLE { ( 0, 3 ) / ( 0, 3 ) }"})
    BOOST_TEST(h.find(needle) != std::string::npos, "h5dump -H lacks " << needle << ":\n" << h);
  BOOST_TEST(h.find("ATTRIBUTE") == std::string::npos);
}

BOOST_AUTO_TEST_CASE(reads_what_h5py_writes) {
  TempDir dir;
  require_h5py(dir);
  const std::string f = dir / "py.h5";
  Run r = python(dir, R"PY(
import h5py, numpy as np, sys
with h5py.File(sys.argv[1], "w") as f:
    f["b"] = np.array([True, False, True])
    f["h"] = np.array([1.5, -65504, 0.25], dtype=np.float16)
    f["c"] = np.array([1 + 2j, -3.5j], dtype=np.complex64)
    f["cd"] = np.array([[0.5 - 1j]], dtype=np.complex128)
    f["s"] = "a string!"
    g = f.create_group("g")
    g.create_group("h")["x"] = np.arange(6, dtype=np.int32).reshape(2, 3)
    for k, v in [("oi", 3), ("of", 2.5), ("ob", True), ("ol", [1, 2, 3]), ("ou", ["a", "bc"]), ("ou8", np.uint8(200))]:
        a = np.array(v)
        f[k] = a.astype(h5py.opaque_dtype(a.dtype))
    f["bytes"] = np.array(b"\x00\x01").astype(h5py.opaque_dtype(np.array(b"\x00\x01").dtype))
    f["fixed"] = np.array([b"ab", b"c"], dtype="S3")
    f["full"] = np.array([b"abc", b"xyz"], dtype="S3")  # fills its whole width: no NUL to stop at
    f["full1"] = np.bytes_(b"abc")                       # a scalar S3
    f["scalar"] = np.float64(7.25)
    f.create_dataset("chunked", data=np.arange(20, dtype=np.int16), chunks=(4,), compression="gzip", shuffle=True)
)PY",
                 "'" + f + "'");
  BOOST_TEST_REQUIRE(r.rc == 0, r.err);
  auto s = be::open_h5_store(f, be::H5Mode::ReadWrite);
  std::map<std::string, be::LeafInfo> infos;
  for (const auto& i : s->list()) {
    std::string p;
    for (const auto& part : i.path) p += (p.empty() ? "" : "/") + part;
    infos[p] = i;
  }
  BOOST_TEST((infos.at("b").dtype == at::kBool));
  BOOST_TEST((infos.at("h").dtype == at::kHalf));
  BOOST_TEST((infos.at("c").dtype == at::kComplexFloat));
  BOOST_TEST((infos.at("g").kind == be::LeafKind::Group));
  BOOST_TEST((infos.at("g/h").kind == be::LeafKind::Group));
  BOOST_TEST((infos.at("g/h/x").dtype == at::kInt));
  for (const char* k : {"s", "oi", "of", "ob", "ol", "ou", "ou8", "bytes", "fixed", "full", "full1"})
    BOOST_TEST((infos.at(k).kind == be::LeafKind::NonTensor), k);
  BOOST_TEST(same(read1(*s, {"b"}), at::tensor({1, 0, 1}).to(at::kBool)));
  BOOST_TEST(same(read1(*s, {"h"}), at::tensor({1.5, -65504.0, 0.25}).to(at::kHalf)));
  BOOST_TEST(same(read1(*s, {"c"}), at::complex(at::tensor({1.0f, 0.0f}), at::tensor({2.0f, -3.5f}))));
  BOOST_TEST(same(read1(*s, {"cd"}), at::complex(at::tensor({0.5}), at::tensor({-1.0})).reshape({1, 1})));
  BOOST_TEST(same(read1(*s, {"g", "h", "x"}), at::arange(6, at::kInt).reshape({2, 3})));
  BOOST_TEST(same(s->read({rows({"g", "h", "x"}, {1})}).at(0), at::tensor({3, 4, 5}, at::kInt).reshape({1, 3})));
  BOOST_TEST(same(read1(*s, {"scalar"}), at::scalar_tensor(7.25, at::kDouble)));
  BOOST_TEST(same(s->read({rows({"chunked"}, {0, 5, 19})}).at(0), at::tensor({0, 5, 19}, at::kShort)));
  BOOST_TEST((s->read_non_tensor({"s"}).value == JsonValue("a string!")));
  BOOST_TEST((s->read_non_tensor({"oi"}).value == JsonValue(3)));
  BOOST_TEST((s->read_non_tensor({"of"}).value == JsonValue(2.5)));
  BOOST_TEST((s->read_non_tensor({"ob"}).value == JsonValue(true)));
  BOOST_TEST((s->read_non_tensor({"ol"}).value == JsonValue::array({1, 2, 3})));
  BOOST_TEST((s->read_non_tensor({"ou"}).value == JsonValue::array({"a", "bc"})));
  BOOST_TEST((s->read_non_tensor({"ou8"}).value == JsonValue(200)));
  BOOST_TEST((s->read_non_tensor({"fixed"}).value == JsonValue::array({"ab", "c"})));
  BOOST_TEST((s->read_non_tensor({"full"}).value == JsonValue::array({"abc", "xyz"})));
  BOOST_TEST((s->read_non_tensor({"full1"}).value == JsonValue("abc")));
  // an unknown tag ("|S2": numpy bytes) comes back as Bytes and is re-written as is
  JsonValue raw = s->read_non_tensor({"bytes"}).value;
  BOOST_TEST_REQUIRE(raw.is_bytes());
  BOOST_TEST(raw.as_bytes().data == std::string("\x00\x01", 2));
  s->write_non_tensor({"bytes_copy"}, {raw, false});
  s->close();
  r = python(dir, R"PY(
import h5py, sys
with h5py.File(sys.argv[1], "r") as f:
    a, b = f["bytes"], f["bytes_copy"]
    print(a.dtype.str, b.dtype.str, a.shape, b.shape, a[()] == b[()])
)PY",
             "'" + f + "'");
  BOOST_TEST(r.rc == 0, r.err);
  BOOST_TEST(r.out == "|S2 |S2 () () True\n", r.out);
}

BOOST_AUTO_TEST_SUITE_END()
