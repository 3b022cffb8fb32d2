#!/usr/bin/env bash
# Installs the build dependencies (Debian 12) and builds Release into build/ (program build/loco).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
loco_install build
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build -j"$(nproc)"
