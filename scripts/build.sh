#!/usr/bin/env bash
# Configures and builds tensordict-cpp (Release) into ./build.
# Usage: scripts/build.sh [extra cmake -D args]
#   TD_JOBS=N              parallel jobs (default 2)
#   TD_TARGETS="a b"       build only these targets (default: all)
#   TD_SHARED_DIR=/path    the shared/ folder the tests read (default: ../shared beside the checkout)
set -euo pipefail
cd "$(dirname "$0")/.."
args=(-DCMAKE_BUILD_TYPE=Release)
[ -n "${TD_SHARED_DIR:-}" ] && args+=("-DTD_SHARED_DIR=${TD_SHARED_DIR}")
cmake -S . -B build "${args[@]}" "$@" >/dev/null
targets=()
for t in ${TD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build build -j"${TD_JOBS:-2}" "${targets[@]}"
