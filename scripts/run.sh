#!/usr/bin/env bash
# Sets up, builds and runs the main job: build/examples/preprocess (map over a memmap image dataset).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
extra=(-DTD_BUILD_EXAMPLES=ON)
# the tests need the shared/ folder; without it, configure without them (scripts/test.sh turns them back on)
if [ ! -d "${TD_SHARED_DIR:-../shared}/fixtures" ]; then extra+=(-DTD_BUILD_TESTS=OFF); fi
TD_TARGETS=preprocess scripts/build.sh "${extra[@]}"
./build/examples/preprocess "$@"
