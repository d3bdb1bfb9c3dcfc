// td_store_client: the other process of tests/api/test_store.cpp.
//   add <port> <index> <begin> <end>   connect to 127.0.0.1:<port> (the store's token from the environment,
//                                      TENSORDICT_STORE_TOKEN), add key "k<index>" = full([rows, 2], index)
//                                      through the owner's actor, write rows [begin, end) of "x" = index + 1
//                                      directly into the mapping; exit 0
//   own_add <prefix> <key>             open the memmap directory as a store of its own, add <key> = ones, close
//   serve <prefix> <portfile>          open the directory as a store, publish it, write its token into
//                                      <portfile>.token (mode 0600) and then the port into <portfile>, then
//                                      wait (at most 120 s) to be killed
//   fill <spec> <first> <count> <stride> [<progress file>]
//                                      open the storage by its storage spec (memmap, shared, redis, ...) and
//                                      write rows first, first + stride, ... (count of them) one call per row:
//                                      obs = full([8], r), id = r, sum = 8 r (tests/api/test_load.cpp);
//                                      every 1000 rows the number written goes into <progress file>
//   add_big <prefix|shared> <key> <bytes> <report>
//                                      open the memmap directory as a store (made first, x [64, 4] float32,
//                                      when missing; for "shared", a new shared store x [64, 4]), add <key> = zeros([64, bytes / 64]) uint8, and write
//                                      into <report>: the error ("<what()>") or "added", then a line per
//                                      leaf key of the store afterwards and, for a directory, "files:" and
//                                      the files in it (tests/api/test_store.cpp: a small tmpfs)
// Exit codes: 0 ok, 2 usage, 3 a tensordict error (printed on stderr).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

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
    if (mode == "fill" && (argc == 6 || argc == 7)) {
      at::set_num_threads(1);
      TensorDict buf = open_storage(StorageSpec::parse(argv[2]));
      const int64_t first = std::stoll(argv[3]), count = std::stoll(argv[4]), stride = std::stoll(argv[5]);
      const std::string progress = argc == 7 ? argv[6] : "";
      for (int64_t i = 0; i < count; ++i) {
        const int64_t r = first + i * stride;
        TensorDict row({{"obs", at::full({8}, static_cast<float>(r))},
                        {"id", at::full({}, r, at::kLong)},
                        {"sum", at::full({}, static_cast<double>(8 * r), at::kDouble)}},
                       {});
        buf.index_put_({r}, row);
        if (!progress.empty() && (i + 1) % 1000 == 0) {
          std::ofstream out(progress + ".tmp");
          out << (i + 1) << "\n";
          out.close();
          std::rename((progress + ".tmp").c_str(), progress.c_str());
        }
      }
      return 0;
    }
    if (mode == "add_big" && argc == 6) {
      const std::string where = argv[2];
      TensorDict shared = TensorDict::undefined();
      if (where == "shared") {
        shared = TensorDict(BatchSize{64});
        shared.set("x", at::zeros({64, 4}));
        shared.share_memory_();
      }
      if (where != "shared" && !std::filesystem::exists(where))
        TensorDict::from_schema({{"x", {{4}, at::kFloat}}}, {64}, "memmap", MemmapOptions().prefix(where));
      Store store = where == "shared" ? Store::open(shared) : Store::open_memmap(where);
      std::ofstream out(argv[5]);
      try {
        store.add_key(argv[3], {64, std::stoll(argv[4]) / 64}, at::kByte);
        out << "added\n";
      } catch (const Error& e) {
        out << e.what() << "\n";
      }
      for (const auto& k : store.keys()) out << "key " << k.repr() << "\n";
      if (where != "shared") {
        out << "files:";
        for (const auto& f : std::filesystem::directory_iterator(where)) out << " " << f.path().filename().string();
        out << "\n";
      }
      store.close();
      return 0;
    }
    if (mode == "serve" && argc == 4) {
      Store store = Store::open_memmap(argv[2]);
      const uint16_t port = store.publish();
      store.save_token(std::string(argv[3]) + ".token");
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
                       "serve <prefix> <portfile> | add_big <prefix|shared> <key> <bytes> <report> | fill <spec> <first> <count> <stride> [<progress file>]\n");
  return 2;
}
