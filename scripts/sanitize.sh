#!/usr/bin/env bash
# Sanitizer runs of the test suites (tests/README.md, "sanitizers"); scripts/test.sh runs `all` after the plain
# suite. Prints what each build and run took.
#   address  ASan + UBSan build in build-asan: every Boost.Test suite (backends, engine, actors, api, conformance)
#   thread   TSan build in build-tsan: the concurrency suites (concurrent fill, map, store actors, loader threads)
# Usage: scripts/sanitize.sh [address|thread|all]     (default: all)
#   TD_JOBS=N   parallel build jobs (default 2)
# Suppressions (each with its reason) are in tests/sanitizers/. Needs the packages of scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-all}
root=$(pwd)
jobs=${TD_JOBS:-2}
tsan_suites='^(engine/test_(concurrent_fill|module)|api/test_(map|map_unbind|store|loader|tensordict_store|leaf_store_client))$'
shared_args=()
[ -n "${TD_SHARED_DIR:-}" ] && shared_args+=("-DTD_SHARED_DIR=${TD_SHARED_DIR}")

configure_and_build() {  # dir sanitizer test-filter targets...
  local dir=$1 san=$2 filter=$3
  shift 3
  # -O1 (set by CMakeLists.txt for TD_SANITIZE builds); no examples / benchmarks in them
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release \
        -DTD_SANITIZE="$san" -DTD_TEST_FILTER="$filter" -DTD_BUILD_TESTS=ON -DTD_BUILD_EXAMPLES=OFF -DTD_BUILD_BENCH=OFF \
        "${shared_args[@]}" >/dev/null
  local targets=()
  for t in "$@"; do targets+=(--target "$t"); done
  local t=$(date +%s)
  cmake --build "$dir" -j"$jobs" "${targets[@]}"
  echo "sanitize.sh: $dir built in $(($(date +%s) - t)) s"
}

run_tests() {  # dir ctest-jobs regex [exclude]
  local t=$(date +%s)
  (cd "$1" && ctest --output-on-failure -j"$2" -R "$3" ${4:+-E "$4"})
  echo "sanitize.sh: $1 tests ran in $(($(date +%s) - t)) s"
}

run_address() {
  configure_and_build build-asan address "" backends_tests engine_tests actors_tests api_tests conformance_tests \
                      td_map_worker td_store_client td_loader_worker sanitizer_canary
  # detect_leaks: LeakSanitizer on, with the third-party libraries' process-lifetime allocations suppressed;
  # alloc_dealloc_mismatch off: libtorch's (uninstrumented) allocator pairs are reported across the boundary
  export ASAN_OPTIONS="detect_leaks=1:alloc_dealloc_mismatch=0:detect_odr_violation=0:abort_on_error=0:halt_on_error=1:allocator_may_return_null=1"
  export LSAN_OPTIONS="suppressions=${root}/tests/sanitizers/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=${root}/tests/sanitizers/ubsan.supp"
  # the leak soaks and the load test count resources and rows/s: plain build only
  run_tests build-asan "$jobs" '^(sanitizers|backends|engine|actors|api|conformance)\.' '^api\.(soak|load)$'
}

run_thread() {
  # only the concurrency suites' files are compiled (TD_TEST_FILTER, tests/CMakeLists.txt)
  configure_and_build build-tsan thread "${tsan_suites}" engine_tests api_tests td_map_worker td_store_client \
                      td_loader_worker sanitizer_canary
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=${root}/tests/sanitizers/tsan.supp"
  run_tests build-tsan "$jobs" '^(sanitizers|engine|api)\.'
}

case "$kind" in
  address) run_address ;;
  thread) run_thread ;;
  all) run_address; run_thread ;;
  *) echo "usage: scripts/sanitize.sh [address|thread|all]" >&2; exit 2 ;;
esac
