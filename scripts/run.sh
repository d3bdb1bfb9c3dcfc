#!/usr/bin/env bash
# Sets up, builds and runs the main example.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
./build/examples/core_demo
