// The Redis LeafStore: round trips, rows, non-tensors, specs, the Python fixture, connection failures, hostile
// metadata, concurrent readers (test_redis_store_secrets.cpp: credentials, timeouts). Helpers in test_redis_store_util.hpp.
#include "backends/test_redis_store_util.hpp"

BOOST_AUTO_TEST_SUITE(redis_store)

BOOST_AUTO_TEST_CASE(every_dtype_round_trip) {
  auto s = new_store({3});
  std::vector<at::ScalarType> dtypes = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kChar, at::kByte,
                                        at::kShort, at::kInt, at::kLong, at::kBool, at::kComplexFloat,
                                        at::kComplexDouble};
  for (at::ScalarType dt : dtypes) {
    std::string name = "x_" + std::string(c10::toString(dt));
    at::Tensor t = sample(dt, {3, 5});
    s->create({name}, dt, {3, 5}, t, {});
    at::Tensor back = s->read({LeafRead{{name}, true, {}}})[0];
    BOOST_TEST(same(back, t), name);
    // the value is the raw C-order bytes; the hash holds Python's spelling
    BOOST_TEST(s->client().command(RedisCommand{"GET", s->key("d:" + name)}).str == raw_bytes(t));
    BOOST_TEST(s->client().command(RedisCommand{"HGET", s->key("m:" + name), "dtype"}).str == dtype_to_string(dt));
    BOOST_TEST(s->client().command(RedisCommand{"HGET", s->key("m:" + name), "shape"}).str == "[3, 5]");
    // rows too, through a fresh store (no cached metadata)
    auto other = open_redis_store(s->spec_fields());
    at::Tensor rows = other->read({LeafRead{{name}, false, {0, 2}}})[0];
    BOOST_TEST(same(rows, t.index_select(0, at::tensor(std::vector<int64_t>{0, 2}, at::kLong))), name);
  }
  std::vector<LeafInfo> l = s->list();
  BOOST_TEST(l.size() == dtypes.size());
}

BOOST_AUTO_TEST_CASE(rows_runs_scattered_repeated) {
  auto s = new_store({10});
  at::Tensor local = at::zeros({10, 3}, at::kFloat);
  s->create({"obs"}, at::kFloat, {10, 3}, {}, {});
  s->create({"act"}, at::kLong, {10}, {}, {});
  at::Tensor act = at::zeros({10}, at::kLong);
  auto idx = [](std::vector<int64_t> v) { return at::tensor(v, at::kLong); };
  // a run, scattered rows, a single row, the whole leaf, repeated
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<std::vector<int64_t>> sets = {{2, 3, 4}, {0, 5, 9}, {7}, {1, 2, 6, 7, 8}};
    for (const auto& rows : sets) {
      at::Tensor data = at::rand({static_cast<int64_t>(rows.size()), 3});
      at::Tensor a = at::randint(-1000, 1000, {static_cast<int64_t>(rows.size())}, at::kLong);
      s->write({LeafWrite{{"obs"}, false, rows, data}, LeafWrite{{"act"}, false, rows, a}});
      local.index_copy_(0, idx(rows), data);
      act.index_copy_(0, idx(rows), a);
      for (const auto& q : sets) {
        std::vector<at::Tensor> got =
            s->read({LeafRead{{"obs"}, false, q}, LeafRead{{"act"}, false, q}, LeafRead{{"obs"}, true, {}}});
        BOOST_TEST(same(got[0], local.index_select(0, idx(q))));
        BOOST_TEST(same(got[1], act.index_select(0, idx(q))));
        BOOST_TEST(same(got[2], local));
      }
    }
  }
  // whole write, then rows of it
  at::Tensor w = at::rand({10, 3});
  s->write({LeafWrite{{"obs"}, true, {}, w}});
  BOOST_TEST(same(s->read({LeafRead{{"obs"}, false, {9}}})[0], w.slice(0, 9, 10)));
  // a read may ask for its result shape (td[i] wants [f], not [1, f]); a write is checked by element count
  {
    LeafRead one{{"obs"}, false, {9}, std::vector<int64_t>{3}};
    BOOST_TEST(same(s->read({one})[0], w.select(0, 9)));
    LeafRead all{{"obs"}, true, {}, std::vector<int64_t>{30}};
    BOOST_TEST(same(s->read({all})[0], w.reshape({30})));
    one.shape = std::vector<int64_t>{4};
    BOOST_TEST(contains(message_of<ValueError>([&] { s->read({one}); }), "[4]"));
    at::Tensor row = at::tensor(std::vector<float>{1.5f, 2.5f, 3.5f});
    s->write({LeafWrite{{"obs"}, false, {4}, row}});  // a row [3] at rows {4}
    w.select(0, 4).copy_(row);
    BOOST_TEST(same(s->read({LeafRead{{"obs"}, true, {}}})[0], w));
  }
  // empty rows
  BOOST_TEST(s->read({LeafRead{{"obs"}, false, {}}})[0].sizes() == at::IntArrayRef({0, 3}));
  // bad rows and shapes
  BOOST_TEST(contains(message_of<ValueError>([&] { s->read({LeafRead{{"obs"}, false, {10}}}); }), "d:obs"));
  BOOST_TEST(contains(message_of<ValueError>([&] { s->read({LeafRead{{"obs"}, false, {3, 2}}}); }), "ascending"));
  message_of<ValueError>([&] { s->write({LeafWrite{{"obs"}, false, {1}, at::zeros({2, 3})}}); });
  message_of<ValueError>([&] { s->write({LeafWrite{{"obs"}, false, {1}, at::zeros({1, 3}, at::kDouble)}}); });
  BOOST_TEST(contains(message_of<KeyError>([&] { s->read({LeafRead{{"nope"}, true, {}}}); }), "nope"));
  // one row list shared by the leaves of a call (as the remote node sends it): checked and split into runs
  // once for leaves of one dim 0, checked again for a leaf of another dim 0
  {
    s->create({"short"}, at::kLong, {2}, at::arange(2), {});
    const RowList shared = std::vector<int64_t>{1, 3, 4, 8};
    std::vector<at::Tensor> got = s->read({LeafRead{{"obs"}, false, shared}, LeafRead{{"act"}, false, shared}});
    BOOST_TEST(same(got[0], s->read({LeafRead{{"obs"}, true, {}}})[0].index_select(0, idx({1, 3, 4, 8}))));
    BOOST_TEST(same(got[1], s->read({LeafRead{{"act"}, true, {}}})[0].index_select(0, idx({1, 3, 4, 8}))));
    BOOST_TEST(contains(message_of<ValueError>([&] {
                          s->read({LeafRead{{"act"}, false, shared}, LeafRead{{"short"}, false, shared}});
                        }),
                        "d:short"));
    const at::Tensor act_before = s->read({LeafRead{{"act"}, true, {}}})[0];
    BOOST_TEST(contains(message_of<ValueError>([&] {
                          s->write({LeafWrite{{"act"}, false, shared, at::full({4}, 5, at::kLong)},
                                    LeafWrite{{"short"}, false, shared, at::full({4}, 5, at::kLong)}});
                        }),
                        "d:short"));
    BOOST_TEST(same(s->read({LeafRead{{"act"}, true, {}}})[0], act_before));  // nothing written
    BOOST_TEST(same(s->read({LeafRead{{"short"}, true, {}}})[0], at::arange(2)));
  }
}

BOOST_AUTO_TEST_CASE(create_zero_fill_and_empty) {
  auto s = new_store({6});
  s->create({"z"}, at::kDouble, {6, 4}, {}, {});
  BOOST_TEST(s->client().command(RedisCommand{"STRLEN", s->key("d:z")}).integer == 6 * 4 * 8);
  BOOST_TEST(same(s->read({LeafRead{{"z"}, true, {}}})[0], at::zeros({6, 4}, at::kDouble)));
  // empty tensors: an empty value, read back as an empty tensor (whole and rows)
  s->create({"e"}, at::kFloat, {0, 3}, {}, {});
  s->create({"e2"}, at::kLong, {6, 0}, {}, {});
  BOOST_TEST(s->read({LeafRead{{"e"}, true, {}}})[0].sizes() == at::IntArrayRef({0, 3}));
  BOOST_TEST(s->read({LeafRead{{"e2"}, false, {1, 4}}})[0].sizes() == at::IntArrayRef({2, 0}));
  s->write({LeafWrite{{"e2"}, false, {1}, at::zeros({1, 0}, at::kLong)}});
  // a 0-dim leaf
  s->create({"scalar"}, at::kInt, {}, at::tensor(7, at::kInt).reshape({}), {});
  BOOST_TEST(s->read({LeafRead{{"scalar"}, true, {}}})[0].item<int>() == 7);
  // existing key, too large, unsupported path
  BOOST_TEST(contains(message_of<KeyError>([&] { s->create({"z"}, at::kFloat, {6}, {}, {}); }), "'z'"));
  std::string m = message_of<ValueError>(
      [&] { s->create({"huge"}, at::kByte, {int64_t{600} * 1024 * 1024}, {}, {}); });
  BOOST_TEST(contains(m, "d:huge"));
  BOOST_TEST(contains(m, "512 MiB"));
  message_of<ValueError>([&] { s->create({"a.b"}, at::kFloat, {6}, {}, {}); });
  message_of<ValueError>([&] { s->create({}, at::kFloat, {6}, {}, {}); });
  // create with data of another dtype converts
  s->create({"conv"}, at::kFloat, {6}, at::arange(6, at::kLong), {});
  BOOST_TEST(same(s->read({LeafRead{{"conv"}, true, {}}})[0], at::arange(6, at::kFloat)));
}

BOOST_AUTO_TEST_CASE(nested_paths_list_erase) {
  auto s = new_store({2});
  s->create({"y"}, at::kFloat, {2}, {}, {});
  s->create({"a", "x"}, at::kFloat, {2}, {}, {});
  s->create({"a", "b", "c"}, at::kLong, {2, 2}, {}, {});
  s->write_non_tensor({"a", "n"}, NonTensorValue{JsonValue("text"), false});
  BOOST_TEST(s->client().command(RedisCommand{"SISMEMBER", s->key("__keys__"), "a.b.c"}).integer == 1);
  std::vector<LeafInfo> l = s->list();
  std::vector<std::pair<std::string, LeafKind>> got;
  for (const auto& i : l) got.push_back({redis_join_path(i.path), i.kind});
  std::vector<std::pair<std::string, LeafKind>> want = {{"a", LeafKind::Group},     {"a.b", LeafKind::Group},
                                                        {"a.b.c", LeafKind::Tensor}, {"a.n", LeafKind::NonTensor},
                                                        {"a.x", LeafKind::Tensor},   {"y", LeafKind::Tensor}};
  BOOST_TEST_REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    BOOST_TEST(got[i].first == want[i].first);
    BOOST_TEST((got[i].second == want[i].second), got[i].first);
  }
  BOOST_TEST((l[2].shape == std::vector<int64_t>{2, 2}));
  BOOST_TEST((l[2].dtype == at::kLong));
  // collisions with nested levels
  message_of<KeyError>([&] { s->create({"a"}, at::kFloat, {2}, {}, {}); });
  message_of<KeyError>([&] { s->create({"y", "z"}, at::kFloat, {2}, {}, {}); });
  // erase a leaf, then a group
  BOOST_TEST(s->erase({"a", "x"}));
  BOOST_TEST(!s->erase({"a", "x"}));
  BOOST_TEST(s->client().command(RedisCommand{"EXISTS", s->key("d:a.x"), s->key("m:a.x")}).integer == 0);
  BOOST_TEST(s->erase({"a"}));
  BOOST_TEST(s->list().size() == 1u);
  BOOST_TEST(keys_of(s->client(), "tensordict", s->td_id()) ==
             (std::vector<std::string>{"__batch_size__", "__device__", "__keys__", "d:y", "m:y"}));
  message_of<KeyError>([&] { s->read({LeafRead{{"a", "b", "c"}, true, {}}}); });
}

BOOST_AUTO_TEST_CASE(non_tensors) {
  auto s = new_store({3});
  std::vector<std::pair<JsonValue, std::string>> cases = {
      {JsonValue("a string"), "\"a string\""},
      {JsonValue(1), "1"},
      {JsonValue(2.5), "2.5"},
      {JsonValue(nullptr), "null"},
      {JsonValue::array({1, 2}), "[1, 2]"},
      {JsonValue::object({{"k", JsonValue::array({true, "v"})}}), "{\"k\": [true, \"v\"]}"},
      {JsonValue("caf\xc3\xa9"), "\"caf\\u00e9\""},
  };
  int i = 0;
  for (const auto& c : cases) {
    std::string name = "nt" + std::to_string(i++);
    s->write_non_tensor({name}, NonTensorValue{c.first, false});
    BOOST_TEST(s->client().command(RedisCommand{"GET", s->key("d:" + name)}).str == c.second);
    BOOST_TEST(s->client().command(RedisCommand{"HGET", s->key("m:" + name), "encoding"}).str == "json");
    BOOST_TEST(s->client().command(RedisCommand{"HGET", s->key("m:" + name), "is_non_tensor"}).str == "1");
    NonTensorValue back = s->read_non_tensor({name});
    BOOST_TEST(back.value == c.first, c.second);
    BOOST_TEST(!back.stacked);
  }
  // stacked: json_array, one element per row
  JsonValue arr = JsonValue::array({"a", JsonValue(nullptr), 3});
  s->write_non_tensor({"st"}, NonTensorValue{arr, true});
  BOOST_TEST(s->client().command(RedisCommand{"HGET", s->key("m:st"), "encoding"}).str == "json_array");
  BOOST_TEST(s->client().command(RedisCommand{"GET", s->key("d:st")}).str == "[\"a\", null, 3]");
  NonTensorValue st = s->read_non_tensor({"st"});
  BOOST_TEST(st.stacked);
  BOOST_TEST(st.value == arr);
  // upstream's NonTensorStack (from_tensordict: ONE json blob of its tolist()): a json list of one value per row
  // reads back stacked (issue 35 item 7); [1, 2] above (2 items for 3 rows) stays one value
  s->write_non_tensor({"nts"}, NonTensorValue{JsonValue::array({"x", "y", "z"}), false});
  BOOST_TEST(s->client().command(RedisCommand{"HGET", s->key("m:nts"), "encoding"}).str == "json");
  NonTensorValue nts = s->read_non_tensor({"nts"});
  BOOST_TEST(nts.stacked);
  BOOST_TEST(nts.value == JsonValue::array({"x", "y", "z"}));
  // pickle (written by Python when JSON fails): kept opaque, re-written verbatim
  std::string pickle("\x80\x04\x95\x00\xff", 5);
  s->client().transaction({RedisCommand{"SET", s->key("d:pk"), pickle},
                           RedisCommand{"HSET", s->key("m:pk"), "is_non_tensor", "1", "encoding", "pickle"},
                           RedisCommand{"SADD", s->key("__keys__"), "pk"}});
  NonTensorValue pk = s->read_non_tensor({"pk"});
  BOOST_TEST_REQUIRE(pk.value.is_bytes());
  BOOST_TEST(pk.value.as_bytes().data == pickle);
  s->write_non_tensor({"pk2"}, pk);
  BOOST_TEST(s->client().command(RedisCommand{"GET", s->key("d:pk2")}).str == pickle);
  BOOST_TEST(s->client().command(RedisCommand{"HGET", s->key("m:pk2"), "encoding"}).str == "pickle");
  // replacing a tensor by a non-tensor and back: the old hash fields are gone
  s->create({"t"}, at::kFloat, {3}, {}, {});
  s->write_non_tensor({"t"}, NonTensorValue{JsonValue(5), false});
  BOOST_TEST(s->client().command(RedisCommand{"HEXISTS", s->key("m:t"), "dtype"}).integer == 0);
  BOOST_TEST(s->read_non_tensor({"t"}).value == JsonValue(5));
  BOOST_TEST(s->erase({"t"}));
  s->create({"t"}, at::kFloat, {3}, {}, {});
  BOOST_TEST(s->client().command(RedisCommand{"HEXISTS", s->key("m:t"), "is_non_tensor"}).integer == 0);
  // kinds and errors
  message_of<TypeError>([&] { s->read_non_tensor({"t"}); });
  message_of<TypeError>([&] { s->read({LeafRead{{"nt0"}, true, {}}}); });
  message_of<KeyError>([&] { s->read_non_tensor({"missing"}); });
  message_of<TypeError>([&] {
    s->write_non_tensor({"bad"}, NonTensorValue{JsonValue::array({JsonValue(JsonValue::Bytes{"x"})}), false});
  });
  // invalid UTF-8 / invalid JSON in a stored value: FormatError naming the key
  s->client().command(RedisCommand{"SET", s->key("d:nt0"), "\"\xff\xfe\""});
  BOOST_TEST(contains(message_of<FormatError>([&] { s->read_non_tensor({"nt0"}); }), s->key("d:nt0")));
  s->client().command(RedisCommand{"SET", s->key("d:st"), "{\"not\": \"a list\"}"});
  BOOST_TEST(contains(message_of<FormatError>([&] { s->read_non_tensor({"st"}); }), s->key("d:st")));
}

BOOST_AUTO_TEST_CASE(reopen_spec_and_metadata) {
  auto s = std::dynamic_pointer_cast<RedisStore>(create_redis_store(opts(shared_server()), {5, 2}, "cpu"));
  BOOST_TEST(s->driver() == "redis");
  BOOST_TEST(s->td_id().size() == 36u);
  BOOST_TEST(s->td_id()[14] == '4');  // uuid4
  BOOST_TEST(s->client().command(RedisCommand{"GET", s->key("__batch_size__")}).str == "[5, 2]");
  BOOST_TEST(s->device() == "cpu");
  BOOST_TEST(redis_store_td_id(*s) == s->td_id());
  BOOST_TEST(contains(s->describe(), "Redis store tensordict:{" + s->td_id() + "} at 127.0.0.1:"));
  JsonValue spec = s->spec_fields();
  BOOST_TEST(spec.find("td_id")->as_string() == s->td_id());
  BOOST_TEST(spec.find("password") == nullptr);
  s->create({"w"}, at::kShort, {5, 2}, sample(at::kShort, {5, 2}), {});
  auto other = open_redis_store(spec);  // a second connection
  BOOST_TEST(*other->stored_batch_size() == (std::vector<int64_t>{5, 2}));
  BOOST_TEST(same(other->read({LeafRead{{"w"}, true, {}}})[0], sample(at::kShort, {5, 2})));
  other->set_stored_batch_size({7});
  BOOST_TEST(*s->stored_batch_size() == std::vector<int64_t>{7});
  // a missing td_id: KeyError naming it
  std::string m = message_of<KeyError>([&] { open_redis_store(RedisOptions(opts(shared_server())).td_id("no-such-id")); });
  BOOST_TEST(contains(m, "no-such-id"));
  // another prefix, another db, a unix socket
  auto p = create_redis_store(RedisOptions(opts(shared_server())).prefix("rb").db(3), {1});
  BOOST_TEST(contains(p->describe(), "rb:{"));
  BOOST_TEST(contains(p->describe(), "/3"));
  auto u = open_redis_store(RedisOptions().unix_socket(shared_server().unix_socket()).td_id(s->td_id()));
  BOOST_TEST(same(u->read({LeafRead{{"w"}, false, {4}}})[0], sample(at::kShort, {5, 2}).slice(0, 4, 5)));
  BOOST_TEST(contains(u->describe(), shared_server().unix_socket()));
  // closed
  s->close();
  BOOST_TEST(contains(message_of<BackendError>([&] { s->list(); }), "closed"));
}

BOOST_AUTO_TEST_CASE(python_fixture_read) {
  testutil::RedisServer server(testutil::RedisServerOptions{td_test::fixture("redis/python-store.rdb"), "", false});
  RedisClient raw(opts(server).connect_options());
  BOOST_TEST(raw.command(RedisCommand{"DBSIZE"}).integer == expected_json().find("total_keys")->as_int());
  for (const std::string name : {"a_from_tensordict", "b_from_schema"}) {
    const JsonValue& e = expected_store(name);
    auto s = open_redis_store(
        RedisOptions(opts(server)).prefix(e.find("prefix")->as_string()).td_id(e.find("td_id")->as_string()));
    BOOST_TEST(*s->stored_batch_size() == json_shape(*e.find("structure")->find("batch_size")));
    std::vector<LeafInfo> l = s->list();
    size_t leaves = 0;
    for (const auto& i : l) leaves += i.kind != LeafKind::Group;
    BOOST_TEST(leaves == e.find("leaves")->as_array().size(), name);
    for (const auto& leaf : e.find("leaves")->as_array()) {
      LeafPath path;
      for (const auto& k : leaf.find("key")->as_array()) path.push_back(k.as_string());
      if (leaf.find("kind")->as_string() == "non_tensor") {
        NonTensorValue v = s->read_non_tensor(path);
        BOOST_TEST(v.value == *leaf.find("data"), name << " " << redis_join_path(path));
        BOOST_TEST(!v.stacked);
        continue;
      }
      at::Tensor t = s->read({LeafRead{path, true, {}}})[0];
      BOOST_TEST(dtype_to_string(t.scalar_type()) == leaf.find("dtype")->as_string());
      BOOST_TEST(t.sizes().vec() == json_shape(*leaf.find("shape")));
      BOOST_TEST(flat_values(t) == json_values(*leaf.find("values")), name << " " << redis_join_path(path));
      // and row 1 by GETRANGE
      at::Tensor r = s->read({LeafRead{path, false, {1, 3}}})[0];
      BOOST_TEST(same(r, t.index_select(0, at::tensor(std::vector<int64_t>{1, 3}, at::kLong))));
    }
  }
  // the lazy stack: heterogeneous x (offset table) read without truncation, homogeneous shared
  const JsonValue& e = expected_store("c_lazy_stack");
  RedisOptions o = RedisOptions(opts(server)).td_id(e.find("td_id")->as_string());
  BOOST_TEST(contains(message_of<KeyError>([&] { open_redis_store(o); }), "lazy-stack"));
  RedisLazyStackStore ls(o);
  const RedisStackLayout& lay = ls.layout();
  BOOST_TEST(lay.count == 2);
  BOOST_TEST(lay.stack_dim == 0);
  BOOST_TEST(lay.inner_batch_size.empty());
  BOOST_TEST_REQUIRE(lay.leaves.size() == 2u);
  BOOST_TEST(redis_join_path(lay.leaves[0].path) == "shared");
  BOOST_TEST(lay.leaves[0].homogeneous);
  BOOST_TEST(!lay.leaves[1].homogeneous);
  BOOST_TEST((lay.leaves[1].offsets == std::vector<int64_t>{0, 12, 32}));
  std::vector<std::vector<at::Tensor>> all = ls.read_leaves({{"shared"}, {"x"}});
  const auto& members = e.find("structure")->find("tensordicts")->as_array();
  for (size_t m = 0; m < 2; ++m) {
    std::vector<at::Tensor> mem = ls.read_member(static_cast<int64_t>(m));
    for (const auto& leaf : members[m].find("leaves")->as_array()) {
      size_t li = leaf.find("key")->as_array()[0].as_string() == "shared" ? 0 : 1;
      BOOST_TEST(mem[li].sizes().vec() == json_shape(*leaf.find("shape")));
      BOOST_TEST(flat_values(mem[li]) == json_values(*leaf.find("values")));
      BOOST_TEST(same(all[li][m], mem[li]));
    }
  }
}

BOOST_AUTO_TEST_CASE(python_fixture_key_layout) {
  testutil::RedisServer server(testutil::RedisServerOptions{td_test::fixture("redis/python-store.rdb"), "", false});
  RedisClient raw(opts(server).connect_options());
  // a: from_tensordict: the same content under a new td_id
  {
    const JsonValue& e = expected_store("a_from_tensordict");
    auto s = std::dynamic_pointer_cast<RedisStore>(create_redis_store(opts(server), {4}));
    s->create({"obs"}, at::kFloat, {4, 3},
              at::tensor(std::vector<float>{0.0f, 1.5f, -2.0f, 3.0f, 4.25f, -5.5f, 6.0f, 7.0f, 8.0f, -9.75f, 10.0f, 0.001f})
                  .reshape({4, 3}),
              {});
    s->create({"action"}, at::kLong, {4}, at::tensor(std::vector<int64_t>{0, -1, int64_t{1} << 40, 7}, at::kLong), {});
    s->create({"sub", "done"}, at::kBool, {4, 2},
              at::tensor(std::vector<int64_t>{1, 0, 0, 0, 1, 1, 0, 1}, at::kLong).to(at::kBool).reshape({4, 2}), {});
    s->write_non_tensor({"name"}, NonTensorValue{JsonValue("hello store"), false});
    compare_layout(raw, "tensordict", e.find("td_id")->as_string(), s->client(), "tensordict", s->td_id());
  }
  // b: from_schema (zero-filled), rows 0 and 3 written
  {
    const JsonValue& e = expected_store("b_from_schema");
    auto s = std::dynamic_pointer_cast<RedisStore>(create_redis_store(RedisOptions(opts(server)).prefix("rb"), {6}));
    s->create({"obs"}, at::kFloat, {6, 2}, {}, {});
    s->write({LeafWrite{{"obs"}, false, {0, 3}, at::tensor(std::vector<float>{1.5f, -2.0f, 3.25f, 4.0f}).reshape({2, 2})}});
    compare_layout(raw, "rb", e.find("td_id")->as_string(), s->client(), "rb", s->td_id());
  }
  // c: the lazy stack, written by RedisLazyStackStore::create
  {
    const JsonValue& e = expected_store("c_lazy_stack");
    std::vector<std::vector<std::pair<LeafPath, at::Tensor>>> members = {
        {{{"shared"}, at::tensor(int64_t{1}, at::kLong).reshape({})}, {{"x"}, at::tensor(std::vector<float>{0, 1, 2})}},
        {{{"shared"}, at::tensor(int64_t{2}, at::kLong).reshape({})},
         {{"x"}, at::tensor(std::vector<float>{0, 10, 20, 30, 40})}}};
    auto ls = RedisLazyStackStore::create(opts(server), members, 0, {});
    compare_layout(raw, "tensordict", e.find("td_id")->as_string(), ls->client(), "tensordict", ls->td_id());
    BOOST_TEST(same(ls->read_leaves({{"x"}})[0][1], at::tensor(std::vector<float>{0, 10, 20, 30, 40})));
  }
}

BOOST_AUTO_TEST_CASE(connection_failures) {
  // refused port: a port nobody listens on (a fresh server's port after it stopped)
  int dead_port;
  {
    testutil::RedisServer tmp(testutil::RedisServerOptions{"", "", false});
    dead_port = tmp.port();
  }
  std::string m = message_of<BackendError>(
      [&] { create_redis_store(RedisOptions().port(dead_port).retries(2).retry_delay_ms(10), {1}); });
  BOOST_TEST(contains(m, "127.0.0.1:" + std::to_string(dead_port)));
  // wrong host (.invalid never resolves)
  m = message_of<BackendError>(
      [&] { create_redis_store(RedisOptions().host("no-such-host.invalid").retries(1), {1}); });
  BOOST_TEST(contains(m, "no-such-host.invalid:6379"));
  // a socket path that does not exist
  m = message_of<BackendError>([&] { RedisClient c(RedisOptions().unix_socket("/nonexistent/redis.sock").retries(1).connect_options()); });
  BOOST_TEST(contains(m, "/nonexistent/redis.sock"));
  // authentication
  testutil::RedisServer secured(testutil::RedisServerOptions{"", "s3cret", false});
  m = message_of<BackendError>([&] { create_redis_store(opts(secured), {1}); });
  BOOST_TEST(contains(m, "authentication"));
  BOOST_TEST(contains(m, "127.0.0.1:" + std::to_string(secured.port())));
  m = message_of<BackendError>([&] { create_redis_store(RedisOptions(opts(secured)).password("wrong"), {1}); });
  BOOST_TEST(contains(m, "authentication"));
  auto ok = create_redis_store(RedisOptions(opts(secured)).password("s3cret"), {2});
  BOOST_TEST(*ok->stored_batch_size() == std::vector<int64_t>{2});
  // the password comes from the caller or the environment, never from the spec
  BOOST_TEST(open_redis_store(ok->spec_fields(), "s3cret")->stored_batch_size().has_value());
  message_of<BackendError>([&] { open_redis_store(ok->spec_fields()); });
  ::setenv("TENSORDICT_REDIS_PASSWORD", "s3cret", 1);
  BOOST_TEST(open_redis_store(ok->spec_fields())->stored_batch_size().has_value());
  ::unsetenv("TENSORDICT_REDIS_PASSWORD");
}

BOOST_AUTO_TEST_CASE(server_killed_mid_session) {
  testutil::RedisServer server(testutil::RedisServerOptions{"", "", false});
  auto s = std::dynamic_pointer_cast<RedisStore>(
      create_redis_store(RedisOptions(opts(server)).retries(3).retry_delay_ms(50), {4}));
  s->create({"x"}, at::kFloat, {4}, at::ones({4}), {});
  server.kill();
  // the request in flight fails, and so do calls while the server is down (bounded retries)
  std::string m = message_of<BackendError>([&] { s->write({LeafWrite{{"x"}, true, {}, at::zeros({4})}}); });
  BOOST_TEST(contains(m, "127.0.0.1:" + std::to_string(server.port())));
  message_of<BackendError>([&] { s->read({LeafRead{{"x"}, true, {}}}); });
  server.restart();  // no persistence: an empty server on the same port
  s->set_stored_batch_size({4});  // the next call reconnects and succeeds
  BOOST_TEST(*s->stored_batch_size() == std::vector<int64_t>{4});
  s->invalidate_cache();
  s->create({"x"}, at::kFloat, {4}, at::full({4}, 2.0), {});
  BOOST_TEST(same(s->read({LeafRead{{"x"}, false, {1, 2}}})[0], at::full({2}, 2.0)));
  BOOST_TEST(s->client().connections() >= 2);
}

BOOST_AUTO_TEST_CASE(connection_closed_by_server) {
  // the server drops our idle connection; the next (large) write must fail with BackendError, not SIGPIPE,
  // and the call after it reconnects
  auto s = new_store({1024});
  s->create({"big"}, at::kFloat, {1024, 4096}, {}, {});  // 16 MiB
  RedisClient killer(opts(shared_server()).connect_options());
  std::string id = std::to_string(s->client().command(RedisCommand{"CLIENT", "ID"}).integer);
  BOOST_TEST(killer.command(RedisCommand{"CLIENT", "KILL", "ID", id}).integer == 1);
  at::Tensor data = at::rand({1024, 4096});
  std::string m = message_of<BackendError>([&] { s->write({LeafWrite{{"big"}, true, {}, data}}); });
  BOOST_TEST(contains(m, "lost"));
  s->write({LeafWrite{{"big"}, true, {}, data}});
  BOOST_TEST(same(s->read({LeafRead{{"big"}, false, {1023}}})[0], data.slice(0, 1023, 1024)));
}

BOOST_AUTO_TEST_CASE(a_connection_lost_before_an_erase_move_or_clear_changes_nothing) {
  // the server drops our connection right before an erase, a move or a clear (one Lua script or one DEL each):
  // the call is a BackendError that names the lost connection, another client still sees every key whole, and
  // the same call then succeeds on a new connection
  auto s = new_store({4});
  s->create({"a"}, at::kFloat, {4}, at::full({4}, 1.f), {});
  s->create({"g", "x"}, at::kLong, {4, 2}, at::full({4, 2}, 2, at::kLong), {});
  s->create({"g", "y"}, at::kFloat, {4}, at::full({4}, 3.f), {});
  RedisClient killer(opts(shared_server()).connect_options());
  auto drop_connection = [&] {
    const std::string id = std::to_string(s->client().command(RedisCommand{"CLIENT", "ID"}).integer);
    BOOST_TEST_REQUIRE(killer.command(RedisCommand{"CLIENT", "KILL", "ID", id}).integer == 1);
  };
  // what another client sees: each key present or not, with its value
  auto seen = [&](const std::vector<LeafPath>& present, const std::vector<LeafPath>& absent) {
    auto other = open_redis_store(s->spec_fields());
    std::set<std::string> names;
    for (const LeafInfo& l : other->list()) names.insert(redis_join_path(l.path));
    for (const LeafPath& p : present) {
      BOOST_TEST(names.count(redis_join_path(p)) == 1u, redis_join_path(p));
      const at::Tensor v = other->read({LeafRead{p, true, {}}})[0];
      const double want = p.back() == "a" ? 1 : p.back() == "x" ? 2 : 3;
      BOOST_TEST(at::all(v == want).item<bool>(), redis_join_path(p));
    }
    for (const LeafPath& p : absent) BOOST_TEST(names.count(redis_join_path(p)) == 0u, redis_join_path(p));
  };
  drop_connection();
  BOOST_TEST(contains(message_of<BackendError>([&] { s->erase({"a"}); }), "lost"));
  seen({{"a"}, {"g", "x"}, {"g", "y"}}, {});
  BOOST_TEST(s->erase({"a"}));
  seen({{"g", "x"}, {"g", "y"}}, {{"a"}});

  drop_connection();
  BOOST_TEST(contains(message_of<BackendError>([&] { s->move({"g"}, {"h"}); }), "lost"));
  seen({{"g", "x"}, {"g", "y"}}, {{"h", "x"}, {"h", "y"}});
  s->move({"g"}, {"h"});
  seen({{"h", "x"}, {"h", "y"}}, {{"g", "x"}, {"g", "y"}});

  // a replace (the old key and the moved one in one script): the same
  s->create({"a"}, at::kFloat, {4}, at::full({4}, 1.f), {});
  drop_connection();
  BOOST_TEST(contains(message_of<BackendError>([&] { s->replace({"a"}, {"h", "y"}); }), "lost"));
  seen({{"a"}, {"h", "x"}, {"h", "y"}}, {});
  s->replace({"a"}, {"h", "y"});
  {
    auto other = open_redis_store(s->spec_fields());
    BOOST_TEST(at::all(other->read({LeafRead{{"h", "y"}, true, {}}})[0] == 1.f).item<bool>());
    size_t leaves = 0;
    for (const LeafInfo& l : other->list()) leaves += l.kind != LeafKind::Group;
    BOOST_TEST(leaves == 2u);  // h.x and h.y
  }
  s->erase({"h", "y"});
  s->create({"h", "y"}, at::kFloat, {4}, at::full({4}, 3.f), {});

  drop_connection();
  BOOST_TEST(contains(message_of<BackendError>([&] { s->clear(); }), "lost"));
  seen({{"h", "x"}, {"h", "y"}}, {});
  BOOST_TEST(*open_redis_store(s->spec_fields())->stored_batch_size() == std::vector<int64_t>{4});
  s->clear();  // every key of the store gone, its __batch_size__ too
  BOOST_TEST(killer.command(RedisCommand{"KEYS", s->key("*")}).elements.empty());
}

BOOST_AUTO_TEST_CASE(move_and_replace_keep_every_key_of_a_leaf) {
  // a zero-byte leaf has no value key (only its hash): moved and replaced, it stays a leaf of its shape; a leaf
  // moved over the level that holds it replaces the rest of that level
  auto s = new_store({4});
  s->create({"empty"}, at::kFloat, {4, 0}, {}, {});
  s->create({"g", "x"}, at::kLong, {4}, at::arange(4), {});
  s->create({"g", "y"}, at::kFloat, {4}, at::full({4}, 3.f), {});
  s->move({"empty"}, {"e2"});
  s->replace({"e2"}, {"g", "y"});
  auto names = [&] {
    std::set<std::string> out;
    for (const LeafInfo& l : open_redis_store(s->spec_fields())->list())
      if (l.kind != LeafKind::Group) out.insert(redis_join_path(l.path));
    return out;
  };
  BOOST_TEST((names() == std::set<std::string>{"g.x", "g.y"}));
  auto other = open_redis_store(s->spec_fields());
  BOOST_TEST(other->read({LeafRead{{"g", "y"}, true, {}}})[0].sizes().vec() == (std::vector<int64_t>{4, 0}));
  s->replace({"g", "x"}, {"g"});
  BOOST_TEST((names() == std::set<std::string>{"g"}));
  BOOST_TEST(same(open_redis_store(s->spec_fields())->read({LeafRead{{"g"}, true, {}}})[0], at::arange(4)));
  // into itself: refused before anything changes
  s->create({"k", "x"}, at::kFloat, {4}, at::ones({4}), {});
  BOOST_TEST(contains(message_of<ValueError>([&] { s->replace({"k"}, {"k", "x", "z"}); }), "into itself"));
  BOOST_TEST(contains(message_of<KeyError>([&] { s->replace({"nope"}, {"g"}); }), "nope"));  // g not erased
  BOOST_TEST((names() == std::set<std::string>{"g", "k.x"}));
}

BOOST_AUTO_TEST_CASE(hostile_metadata) {
  auto s = new_store({4});
  RedisClient& c = s->client();
  auto plant = [&](const std::string& name, std::vector<std::string> hset, const std::string& data) {
    RedisCommand h{"HSET", s->key("m:" + name)};
    for (auto& f : hset) h.arg(f);
    c.transaction({RedisCommand{"DEL", s->key("m:" + name)}, h, RedisCommand{"SET", s->key("d:" + name), data},
                   RedisCommand{"SADD", s->key("__keys__"), name}});
  };
  auto read_msg = [&](const std::string& name, bool whole = true) {
    auto other = open_redis_store(s->spec_fields());
    return message_of<FormatError>([&] { other->read({LeafRead{{name}, whole, whole ? std::vector<int64_t>{} : std::vector<int64_t>{0, 2}}}); });
  };
  plant("dt", {"dtype", "torch.float128", "shape", "[4]"}, std::string(16, '\0'));
  BOOST_TEST(contains(read_msg("dt"), s->key("m:dt")));
  plant("ovf", {"dtype", "torch.float32", "shape", "[9223372036854775807, 9223372036854775807]"}, "");
  BOOST_TEST(contains(read_msg("ovf"), s->key("m:ovf")));
  plant("big", {"dtype", "torch.float64", "shape", "[100000000]"}, "");
  BOOST_TEST(contains(read_msg("big"), "512 MiB"));
  plant("neg", {"dtype", "torch.float32", "shape", "[-4]"}, "");
  BOOST_TEST(contains(read_msg("neg"), s->key("m:neg")));
  plant("notlist", {"dtype", "torch.float32", "shape", "{\"a\": 1}"}, "");
  BOOST_TEST(contains(read_msg("notlist"), s->key("m:notlist")));
  plant("long", {"dtype", "torch.float32", "shape", "[4]"}, std::string(20, '\1'));
  BOOST_TEST(contains(read_msg("long"), s->key("d:long")));
  BOOST_TEST(contains(read_msg("long", false), s->key("d:long")));
  plant("short", {"dtype", "torch.float32", "shape", "[4]"}, std::string(10, '\1'));  // truncated
  BOOST_TEST(contains(read_msg("short"), s->key("d:short")));
  BOOST_TEST(contains(read_msg("short", false), s->key("d:short")));
  plant("enc", {"is_non_tensor", "1", "encoding", "yaml"}, "x");
  BOOST_TEST(contains(message_of<FormatError>([&] { s->read_non_tensor({"enc"}); }), s->key("m:enc")));
  // list() reports the first bad hash by name
  BOOST_TEST(contains(message_of<FormatError>([&] { s->list(); }), s->key("m:")));
  // a bad __batch_size__
  c.command(RedisCommand{"SET", s->key("__batch_size__"), "[4, \"x\"]"});
  BOOST_TEST(contains(message_of<FormatError>([&] { s->stored_batch_size(); }), s->key("__batch_size__")));
  // the pure decoder
  BOOST_TEST(contains(message_of<FormatError>([] { decode_redis_meta({"k"}, "K", {}); }), "K"));
  RedisLeafMeta ok = decode_redis_meta({"k"}, "K", {{"dtype", "torch.int16"}, {"shape", "[3, 0, 5]"}});
  BOOST_TEST(ok.nbytes == 0);
  BOOST_TEST(ok.row_bytes == 0);
}

BOOST_AUTO_TEST_CASE(concurrent_reader_sees_whole_rows) {
  // rows of 16 KiB: one write call is ~100 KiB of commands, more than Redis reads from a client at once, so
  // without MULTI/EXEC another client would be served in the middle of it
  const int64_t kW = 2048;
  auto s = new_store({8});
  s->create({"a"}, at::kLong, {8, kW}, {}, {});
  s->create({"b", "c"}, at::kLong, {8, kW}, {}, {});
  std::atomic<bool> done{false};
  std::atomic<int64_t> torn{0}, reads{0};
  std::string worker_error;
  JsonValue spec = s->spec_fields();
  std::thread reader([&] {
    try {
      auto r = open_redis_store(spec);
      while (!done.load()) {
        std::vector<at::Tensor> got = r->read({LeafRead{{"a"}, false, {1, 2, 5}}, LeafRead{{"b", "c"}, false, {1, 2, 5}}});
        ++reads;
        // every written row set holds one value v in both leaves
        int64_t v = got[0][0][0].item<int64_t>();
        bool whole = got[0].eq(v).all().item<bool>() && got[1].eq(v).all().item<bool>();
        if (!whole) ++torn;
      }
    } catch (const std::exception& e) {
      worker_error = e.what();
    }
  });
  for (int64_t v = 1; v <= 300; ++v) {
    at::Tensor d = at::full({3, kW}, v, at::kLong);
    if (v % 2)  // scattered rows (Lua SETRANGES) and whole runs alternately
      s->write({LeafWrite{{"a"}, false, {1, 2, 5}, d}, LeafWrite{{"b", "c"}, false, {1, 2, 5}, d}});
    else
      s->write({LeafWrite{{"b", "c"}, true, {}, at::full({8, kW}, v, at::kLong)},
                LeafWrite{{"a"}, true, {}, at::full({8, kW}, v, at::kLong)}});
  }
  while (reads.load() < 5 && worker_error.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  done = true;
  reader.join();
  BOOST_TEST(worker_error.empty(), worker_error);
  BOOST_TEST_MESSAGE("concurrent reads: " << reads.load() << ", torn: " << torn.load());
  BOOST_TEST(torn.load() == 0);
  BOOST_TEST(reads.load() > 0);
}

BOOST_AUTO_TEST_CASE(getranges_script_reloaded_after_flush) {
  auto s = new_store({6});
  s->create({"x"}, at::kInt, {6, 2}, at::arange(12, at::kInt).reshape({6, 2}), {});
  at::Tensor want = at::arange(12, at::kInt).reshape({6, 2}).index_select(0, at::tensor(std::vector<int64_t>{0, 4}, at::kLong));
  BOOST_TEST(same(s->read({LeafRead{{"x"}, false, {0, 4}}})[0], want));
  s->client().command(RedisCommand{"SCRIPT", "FLUSH"});  // NOSCRIPT next time: reloaded, read again
  BOOST_TEST(same(s->read({LeafRead{{"x"}, false, {0, 4}}})[0], want));
  BOOST_TEST(same(s->read({LeafRead{{"x"}, false, {0, 4}}, LeafRead{{"x"}, true, {}}})[0], want));
}

BOOST_AUTO_TEST_CASE(transaction_errors_reports_each_failed_command_and_keeps_the_stream_in_step) {
  // the write path's transaction keeps only error replies: every other reply (+QUEUED, EXEC's integers, and the
  // other kinds a transaction may hold) is parsed and dropped, and the next request reads its own reply
  RedisClient c(opts(shared_server()).connect_options());
  const std::string s = "tx-errors:s", l = "tx-errors:l";
  c.command(RedisCommand{"DEL", s, l});
  c.command(RedisCommand{"RPUSH", l, "x"});
  auto after = [&] { return c.command(RedisCommand{"ECHO", "in step"}).str == "in step"; };
  // all applied: no errors (integers, a status, a bulk string, a nil, an array)
  auto none = c.transaction_errors({RedisCommand{"SETRANGE", s, "0", "abc"}, RedisCommand{"SET", "tx-errors:t", "v"},
                                    RedisCommand{"GET", "tx-errors:t"}, RedisCommand{"GET", "tx-errors:none"},
                                    RedisCommand{"LRANGE", l, "0", "-1"}, RedisCommand{"SETRANGE", s, "3", "de"}});
  BOOST_TEST(none.empty());
  BOOST_TEST(c.command(RedisCommand{"GET", s}).str == "abcde");
  BOOST_TEST(after());
  // failing when run (WRONGTYPE on the list): that command's index, the others applied
  auto errs = c.transaction_errors({RedisCommand{"SETRANGE", s, "0", "X"}, RedisCommand{"SETRANGE", l, "0", "Y"},
                                    RedisCommand{"SETRANGE", s, "1", "Z"}, RedisCommand{"SETRANGE", l, "1", "W"}});
  BOOST_TEST(errs.size() == 2u);
  BOOST_TEST((errs.size() == 2 && errs[0].first == 1 && errs[1].first == 3));
  BOOST_TEST((errs.size() == 2 && contains(errs[0].second.str, "WRONGTYPE")));
  BOOST_TEST(c.command(RedisCommand{"GET", s}).str == "XZcde");
  BOOST_TEST(after());
  // refused while queueing (wrong arity): nothing applied, the refusal named, the stream still in step
  const std::string m = message_of<BackendError>(
      [&] { c.transaction_errors({RedisCommand{"SETRANGE", s, "0", "Q"}, RedisCommand{"SETRANGE", s}}); });
  BOOST_TEST(contains(m, "transaction not applied"), m);
  BOOST_TEST(c.command(RedisCommand{"GET", s}).str == "XZcde");
  BOOST_TEST(after());
  // many commands: the replies arrive over several reads
  std::vector<RedisCommand> many;
  for (int i = 0; i < 5000; ++i) many.push_back(RedisCommand{"SETRANGE", s, std::to_string(i), "k"});
  BOOST_TEST(c.transaction_errors(many).empty());
  BOOST_TEST(c.command(RedisCommand{"STRLEN", s}).integer == 5000);
  BOOST_TEST(after());
  c.command(RedisCommand{"DEL", s, l, "tx-errors:t"});
}

// ------------------------------------------------------------------ credentials, reply timeouts, __device__
BOOST_AUTO_TEST_SUITE_END()
