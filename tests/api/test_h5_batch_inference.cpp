// PersistentTensorDict::from_h5 without a batch size: the batch inferred as upstream's _set_max_batch_size does
// (issue 35, item 8). h5py writes an int / float / bool non-tensor as an opaque dataset of a numpy number, and
// upstream counts such a dataset as an array of its shape (a single value: shape [], so the batch is []).
#include <fstream>

#include <boost/test/unit_test.hpp>

#include "engine/fixtures.hpp"
#include "tensordict/tensordict.hpp"

using namespace tensordict;
using fixtures::TempDir;

namespace {

//! writes `file` with h5py: obs float32 [3, 2], idx int64 [3], sub/flag bool [3], then `extra` (Python lines
//! over `f`, the file, `g`, the group sub, and `op(v)`, h5py's opaque encoding of a value as upstream writes it)
void write_h5(const std::string& dir, const std::string& file, const std::string& extra) {
  const std::string script = dir + "/make.py";
  std::ofstream(script) << "import h5py, numpy as np, sys\n"
                           "def op(v):\n"
                           "    a = np.array(v)\n"
                           "    return a.astype(h5py.opaque_dtype(a.dtype))\n"
                           "with h5py.File(sys.argv[1], 'w') as f:\n"
                           "    f['obs'] = np.zeros((3, 2), dtype=np.float32)\n"
                           "    f['idx'] = np.arange(3, dtype=np.int64)\n"
                           "    g = f.create_group('sub')\n"
                           "    g['flag'] = np.ones(3, dtype=bool)\n"
                        << extra;
  BOOST_TEST_REQUIRE(std::system(("/usr/bin/python3 '" + script + "' '" + file + "'").c_str()) == 0);
}

struct Case {
  const char* name;
  const char* extra;  //!< Python lines (indented under the `with`)
  BatchSize root, sub;
};

}  // namespace

BOOST_AUTO_TEST_SUITE(h5_batch_inference)

BOOST_AUTO_TEST_CASE(test_from_h5_opaque_scalars_infer_as_upstream) {
  // each expectation is what Python tensordict v0.14's PersistentTensorDict.from_h5 gives for the same file
  const Case cases[] = {
      {"no non-tensor", "", {3}, {3}},
      {"int", "    f['x'] = op(3)\n", {}, {3}},
      {"float", "    f['x'] = op(1.5)\n", {}, {3}},
      {"bool", "    f['x'] = op(True)\n", {}, {3}},
      {"string", "    f['x'] = 'hello'\n", {3}, {3}},
      {"opaque string", "    f['x'] = op('hello')\n", {3}, {3}},
      {"int in sub", "    g['x'] = op(3)\n", {}, {}},
      {"three ints", "    f['x'] = op([1, 2, 3])\n", {3}, {3}},
      {"two ints", "    f['x'] = op([1, 2])\n", {}, {3}},
  };
  TempDir dir("h5_inference");
  int n = 0;
  for (const Case& c : cases) {
    BOOST_TEST_CONTEXT(c.name) {
      const std::string file = dir.path + "/f" + std::to_string(n++) + ".h5";
      write_h5(dir.path, file, c.extra);
      PersistentTensorDict h5 = PersistentTensorDict::from_h5(file);
      BOOST_TEST(h5.batch_size() == c.root);
      BOOST_TEST(h5.get_td("sub").batch_size() == c.sub);
      BOOST_TEST(h5.get("idx").equal(at::arange(3)));
      BOOST_TEST(h5.get({"sub", "flag"}).all().item<bool>());
    }
  }
}

BOOST_AUTO_TEST_CASE(test_from_h5_opaque_scalar_value_reads_back) {
  // the value keeps its type and reads as a NonTensorData of the inferred (empty) batch
  TempDir dir("h5_inference");
  const std::string file = dir.path + "/v.h5";
  write_h5(dir.path, file, "    f['n'] = op(7)\n    f['s'] = 'hi'\n");
  PersistentTensorDict h5 = PersistentTensorDict::from_h5(file);
  BOOST_TEST(h5.batch_size() == BatchSize{});
  Entry n = h5.get_entry("n");
  BOOST_TEST_REQUIRE(n.is_non_tensor_data());
  BOOST_TEST(n.non_tensor_data().value().as_int() == 7);
  BOOST_TEST(n.shape() == BatchSize{});
  BOOST_TEST(h5.get_entry("s").non_tensor_data().value().as_string() == "hi");
  // a batch size given by the caller is kept (no inference)
  PersistentTensorDict given = PersistentTensorDict::from_h5(file, H5Options().batch_size(BatchSize{3}));
  BOOST_TEST(given.batch_size() == BatchSize{3});
}

BOOST_AUTO_TEST_SUITE_END()
