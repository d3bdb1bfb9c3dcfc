// td_store_client: the other process of tests/api/test_store.cpp.
//   add <port> <index> <begin> <end>   connect to 127.0.0.1:<port>, add key "k<index>" = full([rows, 2], index)
//                                      through the owner's actor, write rows [begin, end) of "x" = index + 1
//                                      directly into the mapping; exit 0
//   own_add <prefix> <key>             open the memmap directory as a store of its own, add <key> = ones, close
//   serve <prefix> <portfile>          open the directory as a store, publish it, write the port into
//                                      <portfile>, then wait (at most 120 s) to be killed
// Exit codes: 0 ok, 2 usage, 3 a tensordict error (printed on stderr).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include <ATen/ATen.h>

#include "tensordict/tensordict.hpp"

using namespace tensordict;

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "add" && argc == 6) {
      const auto port = static_cast<uint16_t>(std::stoi(argv[2]));
      const int64_t index = std::stoll(argv[3]), begin = std::stoll(argv[4]), end = std::stoll(argv[5]);
      Store store = Store::connect("127.0.0.1", port);
      const int64_t rows = store.batch_size().at(0);
      store.add_key("k" + std::to_string(index), at::full({rows, 2}, static_cast<double>(index)));
      store.td().get("x").index_put_({at::indexing::Slice(begin, end)}, static_cast<double>(index + 1));
      store.flush();
      return 0;
    }
    if (mode == "own_add" && argc == 4) {
      Store store = Store::open_memmap(argv[2]);
      store.add_key(argv[3], at::ones({store.batch_size().at(0)}));
      store.close();
      return 0;
    }
    if (mode == "serve" && argc == 4) {
      Store store = Store::open_memmap(argv[2]);
      const uint16_t port = store.publish();
      const std::string tmp = std::string(argv[3]) + ".tmp";
      {
        std::ofstream out(tmp);
        out << port << "\n";
      }
      std::rename(tmp.c_str(), argv[3]);
      std::this_thread::sleep_for(std::chrono::seconds(120));
      return 0;
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "td_store_client %s: %s\n", mode.c_str(), e.what());
    return 3;
  }
  std::fprintf(stderr, "usage: td_store_client add <port> <index> <begin> <end> | own_add <prefix> <key> | "
                       "serve <prefix> <portfile>\n");
  return 2;
}
