//! core_demo: a tour of the in-memory TensorDict: nested keys, a non-tensor leaf, indexing by int /
//! slice / mask, a preallocated buffer filled row by row, stack, reshape and printing.
//! Run: scripts/run.sh (or build/examples/core_demo).
#include <iostream>
#include <sstream>
#include <string>

#include <tensordict/tensordict.hpp>

using namespace tensordict;
using at::indexing::Slice;

//! a 1-D tensor as "[a, b, c]"
static std::string list(const at::Tensor& t) {
  std::ostringstream os;
  at::Tensor c = t.to(at::kDouble).contiguous();
  os << "[";
  for (int64_t i = 0; i < c.numel(); ++i) os << (i ? ", " : "") << c[i].item<double>();
  os << "]";
  return os.str();
}

int main() {
  at::manual_seed(0);
  const int64_t n = 6;

  // ---- build: tensors, a nested sub-TensorDict (via a nested key and a nested Dict), a string
  TensorDict td(
      {
          {"obs", at::randn({n, 4})},
          {"action", at::randint(0, 3, {n}, at::kLong)},
          {NestedKey{"next", "obs"}, at::randn({n, 4})},
          {"info", Dict{{"step", at::arange(n)}, {"done", at::zeros({n}, at::kBool)}}},
          {"task", "pick-and-place"},  // non-tensor leaf, broadcast over the batch
      },
      /*batch_size=*/{n});
  std::cout << "td =\n" << td << "\n\n";
  std::cout << "td[\"task\"] = " << td.get_non_tensor("task").dump() << "\n";
  std::cout << "td[(\"next\", \"obs\")].shape = " << td.get({"next", "obs"}).sizes() << "\n\n";

  // ---- indexing on the batch dims
  TensorDict row = td.index({2});                       // td[2]      -> batch []
  TensorDict rows = td.index({Slice(1, 4)});            // td[1:4]    -> batch [3]
  at::Tensor mask = td.get({"info", "step"}) % 2 == 0;  // td[mask]   -> batch [3]
  TensorDict even = td.index({mask});
  std::cout << "td[2].batch_size = " << repr_batch_size(row.batch_size())
            << ", td[2][(\"info\", \"step\")] = " << row.get({"info", "step"}).item<int64_t>() << "\n";
  std::cout << "td[1:4].batch_size = " << repr_batch_size(rows.batch_size()) << "\n";
  std::cout << "td[step % 2 == 0][(\"info\", \"step\")] = " << list(even.get({"info", "step"})) << "\n";

  // ---- preallocate a buffer and fill it row by row: the first write allocates every leaf
  const int64_t capacity = 10;
  TensorDict buffer(BatchSize{capacity});
  for (int64_t i = 0; i < capacity; ++i) {
    TensorDict sample({{"obs", at::full({4}, static_cast<double>(i))}, {"reward", at::scalar_tensor(0.5 * i)}});
    buffer.index_put_({i}, sample);
  }
  std::cout << "\nbuffer (filled with index_put_) =\n" << buffer << "\n";
  std::cout << "buffer[\"reward\"] = " << list(buffer.get("reward")) << "\n";

  // ---- stack and reshape
  TensorDict stacked = stack({buffer, buffer.apply([](const at::Tensor& x) { return x * 2; })}, 0);
  TensorDict reshaped = stacked.reshape({4, 5});
  std::cout << "\nstack([buffer, buffer * 2]).batch_size = " << repr_batch_size(stacked.batch_size())
            << ", reshaped to " << repr_batch_size(reshaped.batch_size()) << "\n";
  std::cout << reshaped << "\n";

  // ---- a check, so the demo fails loudly if the core misbehaves
  bool ok = buffer.get("obs")[7][0].item<float>() == 7.0f && stacked.get("reward")[1][3].item<float>() == 3.0f &&
            even.batch_size() == BatchSize{3} && row.batch_size().empty();
  std::cout << (ok ? "core_demo: OK" : "core_demo: MISMATCH") << std::endl;
  return ok ? 0 : 1;
}
