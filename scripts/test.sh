#!/usr/bin/env bash
# Installs what the tests need (PyTorch from Debian as the oracle, clang for the sanitizer and
# fuzzing builds), builds, and runs the whole suite: first as built for use (build/), then under
# AddressSanitizer + UBSan with bounded fuzzing of every parser, then the threaded tests under
# ThreadSanitizer (scripts/sanitize.sh). LOCO_SANITIZERS=0 runs the first part only.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
loco_install build test
start=$(date +%s)
scripts/build.sh
(cd build && ctest --output-on-failure -j"$(nproc)" "$@")
echo "plain suite: $(( $(date +%s) - start )) s (build included)"
if [ "${LOCO_SANITIZERS:-1}" != 0 ]; then
  scripts/sanitize.sh all 30
fi
echo "scripts/test.sh: all passed in $(( $(date +%s) - start )) s"
