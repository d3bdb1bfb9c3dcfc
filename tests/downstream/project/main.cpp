//! Builds a TensorDict through the installed headers and libraries and checks a value.
#include <iostream>

#include <tensordict/tensordict.hpp>

int main() {
  using namespace tensordict;
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
  } catch (const std::exception& e) {
    std::cerr << "downstream: " << e.what() << "\n";
    return 1;
  }
  std::cout << "downstream: OK\n";
  return 0;
}
