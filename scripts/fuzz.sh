#!/usr/bin/env bash
# Fuzzes every parser of outside input for SECONDS each (default 600), with AddressSanitizer
# and UBSan, from the seed corpus in tests/fuzz/corpus/ (new inputs go to
# build-asan/tests/fuzz/corpus-TARGET/). A finding leaves its input in
# build-asan/tests/fuzz/crash-TARGET-*; reproduce it with build-asan/tests/fuzz/fuzz_TARGET FILE.
# The test suite runs the same targets for 30 s each (scripts/sanitize.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
source scripts/deps.sh
loco_install build fuzz
CC=clang CXX=clang++ cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" -DLOCO_BENCH=OFF -DLOCO_SANITIZE=address -DLOCO_FUZZ=ON \
  -DLOCO_FUZZ_SECONDS="$seconds" > /dev/null
cmake --build build-asan -j"$(nproc)" 2>&1 | grep -E "error|warning: " || true
cd build-asan && ctest --output-on-failure -j"$(nproc)" -R '^fuzz\.'
awk '/Testing: fuzz\./ {name = $NF} /^stat::number_of_executed_units/ {print name ": " $2 " executions"}' \
  Testing/Temporary/LastTest.log
