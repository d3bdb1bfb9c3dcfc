#pragma once
// Helpers of the HDF5 LeafStore suites (backends.h5_store, backends.h5_store_files).
#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <thread>

#include "backends/backends_test_util.hpp"
#include "process_util.hpp"
#include "tensordict/backends/h5_store.hpp"
#include "tensordict/backends/memmap_format.hpp"
#include "tensordict/errors.hpp"

namespace be = tensordict::backends;
using tensordict::JsonValue;
using td_test::check_throws;
using td_test::TempDir;

// each suite uses a part of these helpers
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-variable"
namespace {

const char* kPython = "/usr/bin/python3";

struct Run {
  int rc = -1;
  std::string out, err;
};

//! runs a shell command, capturing stdout / stderr through files in `dir`
Run run(const TempDir& dir, const std::string& cmd) {
  const std::string o = dir / "cmd.out", e = dir / "cmd.err";
  Run r;
  int status = std::system((cmd + " > '" + o + "' 2> '" + e + "'").c_str());
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = td_test::read_file(o);
  r.err = td_test::read_file(e);
  return r;
}

//! /usr/bin/python3 with h5py: required (the test fails loudly without it)
void require_h5py(const TempDir& dir) {
  BOOST_TEST_REQUIRE(td_test::exists(kPython), "outside reader missing: " << kPython << " (install python3-h5py)");
  Run r = run(dir, std::string(kPython) + " -c 'import h5py, numpy'");
  BOOST_TEST_REQUIRE(r.rc == 0, "h5py is not importable by " << kPython << " (install python3-h5py): " << r.err);
}

std::string require_h5dump(const TempDir& dir) {
  Run r = run(dir, "command -v h5dump");
  BOOST_TEST_REQUIRE(r.rc == 0, "h5dump missing from PATH (install hdf5-tools)");
  std::string p = r.out;
  while (!p.empty() && (p.back() == '\n' || p.back() == '\r')) p.pop_back();
  return p;
}

//! runs a Python script with h5py: argv[1..] = args
Run python(const TempDir& dir, const std::string& script, const std::string& args) {
  const std::string path = dir / "script.py";
  td_test::write_text(path, script);
  return run(dir, std::string(kPython) + " '" + path + "' " + args);
}

const char* kDumpScript = R"PY(
import h5py, json, sys, numpy as np
def conv(x):
    if isinstance(x, bytes): return {"bytes": x.decode("utf-8")}
    if isinstance(x, np.ndarray):
        if x.dtype.kind == 'c': return [[float(v.real), float(v.imag)] for v in x.ravel()]
        return conv(x.tolist())
    if isinstance(x, complex): return [[x.real, x.imag]]
    if isinstance(x, np.generic): return conv(x.item())
    if isinstance(x, (list, tuple)): return [conv(v) for v in x]
    return x
items = []
attrs = 0
with h5py.File(sys.argv[1], "r") as f:
    attrs += len(f.attrs)
    def visit(name, obj):
        global attrs
        attrs += len(obj.attrs)
        if isinstance(obj, h5py.Group):
            items.append({"path": name, "kind": "group"})
        else:
            s = h5py.check_string_dtype(obj.dtype)
            items.append({"path": name, "kind": "dataset",
                          "dtype": ("str:" + s.encoding) if s else obj.dtype.str,
                          "shape": list(obj.shape), "value": conv(obj[()])})
    f.visititems(visit)
print(json.dumps({"attrs": attrs, "items": items}))
)PY";

const JsonValue* item(const JsonValue& dump, const std::string& path) {
  for (const auto& it : dump.find("items")->as_array())
    if (it.find("path")->as_string() == path) return &it;
  return nullptr;
}

//! distinct values of `dt` (bool alternates, complex gets an imaginary part)
at::Tensor sample(at::ScalarType dt, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  at::Tensor t = at::arange(n, at::kDouble).sub(3).mul(1.5).reshape(shape);
  if (dt == at::kBool) return at::arange(n).remainder(3).eq(0).reshape(shape);
  if (dt == at::kByte) return at::arange(n).mul(37).remainder(256).to(at::kByte).reshape(shape);
  if (at::isIntegralType(dt, false)) return at::arange(n).sub(n / 2).mul(7).to(dt).reshape(shape);
  if (at::isComplexType(dt)) return at::complex(t.to(at::kFloat), t.neg().add(0.25).to(at::kFloat)).to(dt);
  return t.to(dt);
}

bool same(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && (a.numel() == 0 || at::equal(a, b));
}

be::LeafRead whole(const be::LeafPath& p) { return be::LeafRead{p, true, {}}; }
be::LeafRead rows(const be::LeafPath& p, std::vector<int64_t> r) { return be::LeafRead{p, false, std::move(r)}; }

at::Tensor read1(be::LeafStore& s, const be::LeafPath& p) { return s.read({whole(p)}).at(0); }

at::Tensor pick(const at::Tensor& t, const std::vector<int64_t>& r) {
  return t.index_select(0, at::tensor(r, at::kLong));
}

}  // namespace
#pragma GCC diagnostic pop
