#!/usr/bin/env bash
# Installs what the tests need (PyTorch from Debian as the oracle), builds, runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
loco_install build test
scripts/build.sh
cd build
ctest --output-on-failure -j"$(nproc)" "$@"
