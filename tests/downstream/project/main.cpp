//! Builds a TensorDict through the installed headers and libraries and checks values; then goes through each
//! dependency the package keeps to itself (a memmap directory: RapidJSON; an HDF5 file: HDF5; map on the
//! engine's actors: CAF, spdlog), which this program neither finds nor links. argv[1]: a scratch directory.
#include <iostream>

#include <tensordict/tensordict.hpp>

int main(int argc, char** argv) {
  using namespace tensordict;
  if (argc != 2) {
    std::cerr << "usage: downstream <scratch directory>\n";
    return 2;
  }
  const std::string dir = argv[1];
  try {
    TensorDict td({{"x", at::arange(6, at::kFloat).reshape({3, 2})}, {NestedKey{"sub", "y"}, at::ones({3})}},
                  {3});
    td.set_non_tensor("name", "downstream");
    const float x = td.get("x")[2][1].item<float>();
    const float y = td.get({"sub", "y"}).sum().item<float>();
    if (x != 5.0f || y != 3.0f || td.batch_size() != BatchSize{3} ||
        td.get_non_tensor("name").as_string() != "downstream") {
      std::cerr << "downstream: unexpected values x=" << x << " y=" << y << "\n";
      return 1;
    }
    // a memmap directory, loaded back (meta.json: RapidJSON inside libtensordict_backends)
    td.memmap(dir + "/td");
    TensorDict loaded = TensorDict::load_memmap(dir + "/td");
    if (!loaded.get("x").equal(td.get("x")) || loaded.get_non_tensor("name").as_string() != "downstream") {
      std::cerr << "downstream: the memmap directory reads back different values\n";
      return 1;
    }
    // an HDF5 file (HDF5 inside the libraries)
    PersistentTensorDict h5 = PersistentTensorDict::from_dict(td.exclude({"name"}), dir + "/td.h5");
    const float hy = h5.get({"sub", "y"}).sum().item<float>();
    h5.close();
    if (hy != 3.0f) {
      std::cerr << "downstream: the HDF5 file reads back " << hy << "\n";
      return 1;
    }
    // map on the engine's worker actors (CAF and spdlog inside the libraries)
    Engine engine;
    TensorDict doubled =
        engine.map(td.exclude({"name"}), [](const TensorDict& t) { return t.apply([](const at::Tensor& v) { return v * 2; }); },
                   MapOptions().num_workers(2).chunksize(1));
    if (doubled.get("x")[2][1].item<float>() != 10.0f) {
      std::cerr << "downstream: map gave " << doubled.get("x") << "\n";
      return 1;
    }
  } catch (const std::exception& e) {
    std::cerr << "downstream: " << e.what() << "\n";
    return 1;
  }
  std::cout << "downstream: OK\n";
  return 0;
}
