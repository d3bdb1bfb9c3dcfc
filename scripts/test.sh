#!/usr/bin/env bash
# Sets up, builds and runs every test:
#   1. the plain Release build: ctest (the Boost.Test suites per layer, the examples, tdx, the package test, the
#      fuzz targets, the leak soaks and the load test)
#   2. scripts/sanitize.sh all: ASan + UBSan over every Boost.Test suite (build-asan), TSan over the concurrency
#      suites (build-tsan); see tests/README.md, "sanitizers"
# Needs the project's shared/ folder (default ../shared beside the checkout; override with TD_SHARED_DIR=...).
#   TD_JOBS=N          parallel build and test jobs (default 2)
#   TD_SANITIZERS=0    skip step 2 (a quicker local run; CI runs both)
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
scripts/setup.sh
# the benchmarks are not built here (no test runs them; scripts/bench.sh builds the ones it runs): ~3 min on 2 cores
scripts/build.sh -DTD_BUILD_TESTS=ON -DTD_BUILD_BENCH=OFF
t1=$(date +%s)
(cd build && ctest --output-on-failure -j"${TD_JOBS:-2}")
t2=$(date +%s)
echo "test.sh: plain build $((t1 - t0)) s, plain tests $((t2 - t1)) s"
if [ "${TD_SANITIZERS:-1}" != 0 ]; then
  scripts/sanitize.sh all
  echo "test.sh: sanitizers $(($(date +%s) - t2)) s; total $(($(date +%s) - t0)) s"
fi
