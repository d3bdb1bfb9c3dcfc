#!/usr/bin/env bash
# Builds benchmarks and runs them, one JSON object per benchmark on stdout (build output goes to stderr).
# Usage: scripts/bench.sh [bench_core] [bench_actors] [bench_map] [bench_storage] [bench_h5] [bench_h5_store] [bench_redis] [bench_loader] [bench_typed]   (default: bench_core)
set -euo pipefail
cd "$(dirname "$0")/.."
benches=("$@")
[ "${#benches[@]}" -gt 0 ] || benches=(bench_core)
extra=(-DTD_BUILD_BENCH=ON)
if [ ! -d "${TD_SHARED_DIR:-../shared}/fixtures" ]; then extra+=(-DTD_BUILD_TESTS=OFF); fi
TD_TARGETS="${benches[*]}" scripts/build.sh "${extra[@]}" >&2
for b in "${benches[@]}"; do ./build/bench/"$b"; done
