// The program tests/engine/test_memmap_safety.cpp runs under the syscall recorder (syscall_recorder.c): a durable
// save into a new prefix, a durable save over it (the rename exchange), then a key added to the saved directory
// (a meta.json rewrite). Before each step it appends "mark <step>" to $TD_SYSCALL_LOG, so the test can tell the
// steps' calls apart. td_durable_save PREFIX [plain]: "plain" saves without the durable option.
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

#include <tensordict/tensordict.hpp>

using namespace tensordict;

static void mark(const std::string& step) {
  if (const char* log = std::getenv("TD_SYSCALL_LOG")) std::ofstream(log, std::ios::app) << "mark " << step << "\n";
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: td_durable_save PREFIX [plain]\n";
    return 2;
  }
  const std::string prefix = argv[1];
  const bool durable = !(argc > 2 && std::string(argv[2]) == "plain");
  try {
    TensorDict td({{"a", at::full({4, 3}, 1.0f)}, {"b", at::arange(4)}, {NestedKey{"sub", "c"}, at::ones({4, 2})}}, {4});
    mark("save-new");
    td.save(prefix, MemmapOptions().durable(durable));
    mark("save-over");
    td.set("a", at::full({4, 3}, 2.0f));
    td.save(prefix, MemmapOptions().durable(durable));
    mark("add-key");
    TensorDict back = TensorDict::load_memmap(prefix);
    make_memmap(back, "added", {4, 5});
    mark("end");
    return TensorDict::load_memmap(prefix).get("a").eq(2).all().item<bool>() ? 0 : 3;
  } catch (const std::exception& e) {
    std::cerr << "td_durable_save: " << e.what() << "\n";
    return 1;
  }
}
