#!/usr/bin/env bash
# Configures and builds tensordict-cpp (Release, -j2) into ./build. Usage: scripts/build.sh [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"${TD_JOBS:-2}"
