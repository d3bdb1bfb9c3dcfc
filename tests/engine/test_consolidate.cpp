// consolidate (upstream's consolidate / from_consolidated): one uint8 storage with every leaf a view into it,
// byte for byte upstream's layout and metadata record (the Python-written tests/data/python_consolidated.bin is
// the reference), the file form, malformed records and files, and unlock dropping the consolidation.
#include <fstream>

#include <boost/test/unit_test.hpp>

#include "engine/fixtures.hpp"
#include "process_util.hpp"
#include "tensordict/lazy_stack.hpp"
#include "tensordict/tensor_dict.hpp"

using namespace tensordict;

namespace {

//! the TensorDict scripts/python_consolidated.py writes
TensorDict python_sample() {
  TensorDict td(BatchSize{3});
  td.set("a", at::arange(3, at::kFloat));
  td.set("label", "hello");
  td.set("c", at::arange(6, at::kFloat).reshape({3, 2}));
  TensorDict nested(BatchSize{3});
  nested.set("h", at::arange(3, at::kHalf));
  nested.set("i", at::arange(3, at::kLong).reshape({3, 1}));
  nested.set("b", at::tensor({1, 0, 1}, at::kByte).to(at::kBool));
  td.set("nested", nested);
  return td;
}

//! tests/data/python_consolidated.bin: written by Python tensordict v0.14.0 (scripts/python_consolidated.py write)
std::string fixture() {
  return (std::filesystem::path(__FILE__).parent_path().parent_path() / "data" / "python_consolidated.bin").string();
}

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string storage_bytes(const at::Tensor& s) {
  return std::string(reinterpret_cast<const char*>(s.data_ptr<uint8_t>()), static_cast<size_t>(s.numel()));
}

const char* kPythonRecord =
    R"({"cls":"TensorDict","non_tensors":{"label":["hello",[3],null]},"leaves":{"a":["torch.float32",[3],0,16,4],)"
    R"("c":["torch.float32",[3,2],16,40,0]},"cls_metadata":{"device":null,"names":[null],"batch_size":[3],)"
    R"("is_locked":false},"nested":{"cls":"TensorDict","non_tensors":{},"leaves":{"h":["torch.float16",[3],40,48,2],)"
    R"("i":["torch.int64",[3,1],48,72,0],"b":["torch.bool",[3],72,80,5]},"cls_metadata":{"device":null,)"
    R"("names":[null],"batch_size":[3],"is_locked":false}}})";

}  // namespace

BOOST_AUTO_TEST_SUITE(consolidate)

BOOST_AUTO_TEST_CASE(layout_and_record_are_upstreams) {
  TensorDict src = python_sample();
  TensorDict c = src.consolidate();
  BOOST_CHECK(c.is_consolidated());
  BOOST_CHECK(!src.is_consolidated());
  BOOST_CHECK(c.is_locked());
  BOOST_CHECK_EQUAL(c.consolidated_metadata().dump(), JsonValue::parse(kPythonRecord).dump());
  at::Tensor s = c.consolidated_storage();
  BOOST_CHECK_EQUAL(s.numel(), 80);
  // the storage equals the one Python wrote (the file's first 80 bytes), zero padding included
  const std::string py = file_bytes(fixture());
  BOOST_REQUIRE_GT(py.size(), 88u);
  BOOST_CHECK(storage_bytes(s) == py.substr(0, 80));
  // the leaves are views of the storage, in insertion order
  BOOST_CHECK(c.get("a").data_ptr() == s.data_ptr());
  s.zero_();
  BOOST_CHECK(at::equal(c.get({"nested", "i"}), at::zeros({3, 1}, at::kLong)));
  BOOST_CHECK(at::equal(src.get({"nested", "i"}), at::arange(3, at::kLong).reshape({3, 1})));
  BOOST_CHECK_EQUAL(c.get_entry("label").non_tensor_value(), JsonValue("hello"));
  // a consolidated TensorDict consolidates to itself; unlock_ drops the consolidation (upstream)
  BOOST_CHECK(c.consolidate().consolidated_storage().data_ptr() == s.data_ptr());
  BOOST_CHECK(c.get_entry("nested").tensordict().is_consolidated());
  c.unlock_();
  BOOST_CHECK(!c.is_consolidated());
  BOOST_CHECK(!c.consolidated_storage().defined());
}

BOOST_AUTO_TEST_CASE(reads_the_file_python_wrote_and_writes_what_python_reads) {
  const std::string py = fixture();
  TensorDict td = TensorDict::from_consolidated(py);
  BOOST_CHECK(td.is_consolidated());
  BOOST_CHECK(td.equal(python_sample()));
  BOOST_CHECK(td.batch_size() == BatchSize{3});
  // ours: the same bytes as Python's file (the record's JSON text may differ in spacing only)
  fixtures::TempDir dir("consolidate");
  const std::string mine = std::string(TD_BINARY_DIR) + "/test-tmp/cpp_consolidated.bin";
  TensorDict c = python_sample().consolidate(ConsolidateOptions().filename(mine));
  const std::string bytes = file_bytes(mine);
  BOOST_REQUIRE_GE(bytes.size(), 88u);
  BOOST_CHECK(bytes.substr(0, 80) == file_bytes(py).substr(0, 80));
  int64_t len = 0;
  std::memcpy(&len, bytes.data() + bytes.size() - 8, 8);
  BOOST_CHECK_EQUAL(static_cast<size_t>(len), bytes.size() - 88);
  BOOST_CHECK_EQUAL(JsonValue::parse(bytes.substr(80, static_cast<size_t>(len))).dump(), JsonValue::parse(kPythonRecord).dump());
  BOOST_CHECK(TensorDict::from_consolidated(mine).equal(python_sample()));
  // the result's leaves map the file (another file: scripts/python_consolidated.py check reads `mine`)
  const std::string other = dir / "mapped.bin";
  TensorDict m = python_sample().consolidate(ConsolidateOptions().filename(other));
  m.get("a").fill_(7);
  BOOST_CHECK(at::equal(TensorDict::from_consolidated(other).get("a"), at::full({3}, 7.f)));
}

BOOST_AUTO_TEST_CASE(nested_stacks_non_tensor_stacks_and_threads) {
  std::vector<TensorDict> parts;
  for (int i = 0; i < 3; ++i) {
    TensorDict p(BatchSize{2});
    p.set("x", at::full({2, i + 1}, static_cast<double>(i), at::kFloat));
    parts.push_back(p);
  }
  TensorDict td(BatchSize{3, 2});
  td.set("stack", lazy_stack(parts, 0));
  td.set("names", Entry(NonTensorStack({"a", "b", "c", "d", "e", "f"}, BatchSize{3, 2})));
  td.set("big", at::randn({3, 2, 100000}));
  TensorDict c1 = td.consolidate();
  TensorDict c4 = td.consolidate(ConsolidateOptions().num_threads(4));
  BOOST_CHECK(at::equal(c1.consolidated_storage(), c4.consolidated_storage()));
  TensorDict back = TensorDict::from_consolidated(c1.consolidated_storage(), c1.consolidated_metadata());
  BOOST_CHECK(back.equal(td));
  BOOST_CHECK(LazyStackedTensorDict::is_lazy_stack(back.get_entry("stack").tensordict()));
  BOOST_CHECK(back.get_entry("names").non_tensor_stack() == td.get_entry("names").non_tensor_stack());
  // the stack record: children "0", "1", "2" with upstream's cls and stack_dim
  const JsonValue& rec = c1.consolidated_metadata();
  BOOST_REQUIRE(rec.find("stack"));
  BOOST_CHECK_EQUAL(rec.find("stack")->find("cls")->as_string(), "LazyStackedTensorDict");
  BOOST_CHECK(rec.find("stack")->find("2"));
  BOOST_CHECK_EQUAL(rec.find("names")->find("cls")->as_string(), "NonTensorStack");
  // a shared-memory storage
  TensorDict sh = td.consolidate(ConsolidateOptions().share_memory(true));
  BOOST_CHECK(at::equal(sh.consolidated_storage(), c1.consolidated_storage()));
}

BOOST_AUTO_TEST_CASE(a_leaf_without_strided_bytes_is_refused) {
  // upstream refuses non-jagged nested tensors the same way; the source is left as it was
  TensorDict td(BatchSize{3});
  td.set("dense", at::ones({3, 2}));
  td.set("sparse", at::eye(3).to_sparse());
  BOOST_CHECK_THROW(td.consolidate(), NotImplementedError);
  BOOST_CHECK(!td.is_consolidated());
  BOOST_CHECK(at::equal(td.get("dense"), at::ones({3, 2})));
}

BOOST_AUTO_TEST_CASE(malformed_records_and_files_are_format_errors) {
  TensorDict c = python_sample().consolidate();
  at::Tensor s = c.consolidated_storage();
  auto with = [&](const std::string& from, const std::string& to) {
    std::string text = JsonValue::parse(kPythonRecord).dump();
    auto pos = text.find(from);
    BOOST_REQUIRE(pos != std::string::npos);
    return JsonValue::parse(text.replace(pos, from.size(), to));
  };
  BOOST_CHECK_THROW(TensorDict::from_consolidated(s, with("[3],0,16,4", "[3],0,96,4")), FormatError);   // past the end
  BOOST_CHECK_THROW(TensorDict::from_consolidated(s, with("[3],0,16,4", "[4],0,16,4")), FormatError);   // wrong size
  BOOST_CHECK_THROW(TensorDict::from_consolidated(s, with("[3],0,16,4", "[3],2,18,6")), FormatError);   // misaligned
  BOOST_CHECK_THROW(TensorDict::from_consolidated(s, with("torch.float32", "torch.nope")), FormatError);
  BOOST_CHECK_THROW(TensorDict::from_consolidated(s, with("\"cls\":\"TensorDict\"", "\"cls\":\"Evil\"")), FormatError);
  BOOST_CHECK_THROW(TensorDict::from_consolidated(s, with("\"leaves\":{\"a\"", "\"leaves\":{\"x\":1,\"a\"")), FormatError);
  BOOST_CHECK_THROW(TensorDict::from_consolidated(s, JsonValue(3)), FormatError);
  BOOST_CHECK_THROW(TensorDict::from_consolidated(at::zeros({4}, at::kFloat), c.consolidated_metadata()), ValueError);
  // files: truncated, a length that does not fit, metadata that is not JSON
  fixtures::TempDir dir("consolidate-bad");
  const std::string good = file_bytes(fixture());
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir / name, std::ios::binary) << bytes;
    return dir / name;
  };
  BOOST_CHECK_THROW(TensorDict::from_consolidated(write("short", "1234")), FormatError);
  BOOST_CHECK_THROW(TensorDict::from_consolidated(write("cut", good.substr(0, good.size() - 3))), FormatError);
  std::string bad_json = good;
  bad_json[85] = '#';
  BOOST_CHECK_THROW(TensorDict::from_consolidated(write("json", bad_json)), FormatError);
  BOOST_CHECK_THROW(TensorDict::from_consolidated(dir / "missing"), BackendError);
  // a write that fails leaves the existing file as it was and no temporary behind
  BOOST_CHECK_THROW(python_sample().consolidate(ConsolidateOptions().filename(dir / "no/such/dir/x.bin")), BackendError);
  fixtures::TempDir tiny_fs("consolidate-full");
  pid_t child = testutil::spawn_on_small_fs(tiny_fs.path, 256, [&] {
    const std::string target = tiny_fs / "kept.bin";
    { std::ofstream(target, std::ios::binary) << good; }
    TensorDict big(BatchSize{});
    big.set("x", at::ones({1 << 20}, at::kFloat));  // 4 MiB on a 256 KiB file system
    try {
      big.consolidate(ConsolidateOptions().filename(target));
      return 1;  // no error on a full disk
    } catch (const BackendError&) {
    }
    if (file_bytes(target) != good) return 2;
    for (const auto& e : std::filesystem::directory_iterator(tiny_fs.path))
      if (e.path().filename().string().find("consolidating") != std::string::npos) return 3;
    return 0;
  });
  const int rc = testutil::wait_child(child, std::chrono::seconds(60));
  BOOST_CHECK_MESSAGE(rc == 0, "the full-disk consolidate: " << testutil::describe_child(rc)
                                   << " (1: no error, 2: the old file changed, 3: a temporary was left)");
}

BOOST_AUTO_TEST_SUITE_END()
