#!/usr/bin/env bash
# Sets up, builds and runs every test (ctest: the Boost.Test suites per layer + the downstream package test).
# Needs the project's shared/ folder (default ../shared beside the checkout; override with TD_SHARED_DIR=...).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh -DTD_BUILD_TESTS=ON
cd build
ctest --output-on-failure -j"${TD_JOBS:-2}"
