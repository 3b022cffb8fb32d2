#!/usr/bin/env bash
# Sanitizer and fuzzing passes (part of scripts/test.sh), with clang at -O1:
#  - build-asan/: AddressSanitizer + UndefinedBehaviorSanitizer (every finding fatal) with
#    libFuzzer coverage. The whole suite runs under it (the MPI tests and the PyTorch oracle
#    included), then every fuzz target for FUZZ_SECONDS (default 30) from its seed corpus.
#  - build-tsan/: ThreadSanitizer over the communication, pipeline and algorithm tests and
#    in-process multi-worker training runs with syncs in flight and failures (tests/cli/threads.sh).
# Suppressions, each with its reason, are in tests/sanitizers/.
# Usage: scripts/sanitize.sh [asan|tsan|all] [FUZZ_SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
loco_install build test fuzz
which=${1:-all} fuzz_seconds=${2:-30}
supp=$PWD/tests/sanitizers
build() {  # dir, cmake options...
  local dir=$1
  shift
  CC=clang CXX=clang++ cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" -DLOCO_BENCH=OFF "$@" > /dev/null
  cmake --build "$dir" -j"$(nproc)" 2>&1 | grep -E "error|warning: " || true
}
if [ "$which" = all ] || [ "$which" = asan ]; then
  start=$(date +%s)
  build build-asan -DLOCO_SANITIZE=address -DLOCO_FUZZ=ON -DLOCO_FUZZ_SECONDS="$fuzz_seconds"
  built=$(date +%s)
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1"
  export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  export LOCO_SANITIZED=address
  (cd build-asan && ctest --output-on-failure -j"$(nproc)" -E '^fuzz\.')
  suite=$(date +%s)
  (cd build-asan && ctest --output-on-failure -j"$(nproc)" -R '^fuzz\.')
  awk '/Testing: fuzz\./ {name = $NF} /^stat::number_of_executed_units/ {print "  " name ": " $2 " executions"}' \
    build-asan/Testing/Temporary/LastTest.log
  echo "asan+ubsan: build $(( built - start )) s, suite $(( suite - built )) s, fuzzing $(( $(date +%s) - suite )) s" \
       "($fuzz_seconds s per target)"
fi
if [ "$which" = all ] || [ "$which" = tsan ]; then
  start=$(date +%s)
  build build-tsan -DLOCO_SANITIZE=thread
  built=$(date +%s)
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp"
  export LOCO_SANITIZED=thread
  (cd build-tsan && ctest --output-on-failure -j"$(nproc)" \
    -R '^(Parallel|Communicator|LinkModel|Executor|PipelineSimulator|Partial|Streaming|StreamingPlan|OuterStore|Diloco|Codec|Noloco|SecureTransport|SyncGroup|ReduceOuter|JoinState)\.|^cli\.threads')
  echo "tsan: build $(( built - start )) s, tests $(( $(date +%s) - built )) s"
fi
