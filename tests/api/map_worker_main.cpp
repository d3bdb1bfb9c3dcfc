// td_map_worker: the worker executable of the map_process tests. A real program's main looks like this:
// register the named map functions, then run_worker_if_requested first thing (it returns false at once
// when this is not a worker process; a worker serves its chunks and exits inside it).
#include <cstdio>

#include "api/map_process_fns.hpp"

int main(int argc, char** argv) {
  map_process_test::register_fns();
  tensordict::run_worker_if_requested(argc, argv);
  std::fprintf(stderr, "td_map_worker: a worker process for the map_process tests (started by td.map)\n");
  return 1;
}
