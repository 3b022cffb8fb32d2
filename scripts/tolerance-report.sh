#!/usr/bin/env bash
# scripts/tolerance-report.sh [BUILD_DIR]: runs the unit tests (BUILD_DIR/tests/loco_tests,
# default build/) with LOCO_TOLERANCE_REPORT set and prints every floating-point tolerance site
# of tests/ (tests/tolerance.h) with the largest share of its tolerance that this machine used:
# |a - b| / tol for a closeness check, x / bound for a bound. Run it on each machine kind (AMD
# EPYC, Intel Xeon) and compare: a site whose share differs between kinds depends on the
# machine's arithmetic. The machine and the commit head the table.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
LOCO_TOLERANCE_REPORT="$out" "$build/tests/loco_tests" > /dev/null 2>&1 || {
  echo "tolerance-report: the unit tests failed; run $build/tests/loco_tests to see which" >&2; exit 1; }
echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores; commit $(git rev-parse --short HEAD)"
echo
echo "| site | share of the tolerance used | checks | the check |"
echo "|---|---|---|---|"
sort -k2 -g -r "$out" | while read -r site ratio checks; do
  file=${site%%:*} line=${site##*:}
  text=$(sed -n "${line}p" "$file" | sed 's/^ *//; s/|/\\|/g' | cut -c1-110)
  echo "| $site | $ratio | $checks | \`$text\` |"
done
