#!/usr/bin/env bash
# loco simulate / estimate from the command line: tables, plots, calibration on a real run,
# and errors for bad input.
set -euo pipefail
loco=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
py=/usr/bin/python3
rm -rf "$work" && mkdir -p "$work" && cd "$work"

"$loco" simulate cu --model 1b --bandwidth-range 0.1:100:4 --plot cu.svg --gantt gantt.svg --gantt-steps 2 > cu.txt
grep -q "bandwidth (Gbit/s) needed" cu.txt
"$loco" simulate cu --model 1b --bandwidth-range 0.1:100:4 --convention paper | grep -q "convention: paper"
# fp4 at 64 replicas: reduce-scatter keeps about 1 byte per value per worker.
"$loco" simulate cu --model 1b --set 1b.replicas=64 --method streaming-overlap-fp4 --bandwidth-range 1:10:2 |
  grep -qE "bytes per value each worker sends per reduction: streaming-overlap-fp4 (0\.9[0-9]*|1|1\.0[0-9]*)$"
grep -qE "^1b +streaming-overlap-fp4 " cu.txt
# Each needed bandwidth comes with the first point of the 1.2x log grid reaching it: at or above
# it, less than one grid step away.
$py - cu.txt <<'PY'
import re, sys
cells = re.findall(r"([0-9.e+]+) \[([0-9.e+]+)\]", open(sys.argv[1]).read())
print(f"{len(cells)} needed bandwidths with their grid point")
sys.exit(0 if cells and all(float(x) <= float(g) * 1.01 and float(g) < float(x) * 1.2 * 1.01 for x, g in cells) else 1)
PY
[ -s cu.svg ] && [ -s gantt.svg ]
# A custom profile defined on the command line.
"$loco" simulate cu --model mine --set mine.layers=8 --set mine.params=2e8 --set mine.nonblock_params=1e7 \
  --set mine.step_time_s=0.05 --set mine.inner_steps=30 --method diloco --bandwidth-range 1:10:2 > mine.txt
grep -qE "^mine +diloco " mine.txt
"$loco" simulate latency --workers 4,16 --sigma 1 --trials 200 --plot lat.svg > lat.txt
grep -q "global barrier" lat.txt && [ -s lat.svg ]
"$loco" estimate --paper-table | grep -q "1/4 MLPs + heads"
"$loco" estimate --config "$root/configs/small.toml" --slices 4 --strategy mlp+heads --nodes 8 --bandwidth 1Gbit |
  grep -q "ring all-reduce"
# info (loco's engine) and estimate (the papers' setup) say what they count, in the same unit,
# and agree where they count the same thing: fp32 AdamW moments, 8 bytes per parameter.
"$loco" info --config "$root/configs/small.toml" > info.txt
"$loco" estimate --config "$root/configs/small.toml" > estimate.txt
grep -q "loco's engine" info.txt && grep -q "papers' accelerator setup" estimate.txt
$py - info.txt estimate.txt <<'PY'
import re, sys
info, est = open(sys.argv[1]).read(), open(sys.argv[2]).read()
adam_info = float(re.search(r"AdamW ([0-9.]+) MiB", info).group(1))
row = re.search(r"^ +ddp +([0-9. ]+)$", est, re.M).group(1).split()
assert "memory per node (MiB)" in est, est
assert abs(float(row[3]) - adam_info) <= 0.1, (row, adam_info)
print(f"info and estimate agree on AdamW: {adam_info} MiB")
PY

# Calibration on a real DiLoCo run over an emulated link.
$py "$here/../tools/make_tokens.py" train.tok 256 20000 5
"$loco" train --config "$root/configs/tiny.toml" --set data.train=train.tok --quiet --set train.steps=20 \
  --set algorithm=diloco --set outer.inner_steps=10 --set distributed.replicas=2 --set network.bandwidth=50Mbit \
  --set network.latency=5ms --set train.out_dir=run > /dev/null
"$loco" simulate cu --calibrate run | tee cal.txt
grep -qE "predicted [0-9.]+%, measured [0-9.]+%" cal.txt

# The pipeline model: a table per link, and calibration on a pipelined run over a link.
"$loco" simulate pipeline --config "$root/configs/small.toml" --set pipeline.stages=2 --set pipeline.microbatches=4 \
  --link inf --link 100Mbit/30ms > pipe.txt
grep -qE "^  100Mbit/30ms +[0-9.]+ +[0-9]+ " pipe.txt
"$loco" train --config "$root/configs/tiny.toml" --set data.train=train.tok --quiet --set train.steps=6 \
  --set pipeline.stages=2 --set pipeline.microbatches=2 --set network.bandwidth=20Mbit --set network.latency=5ms \
  --set train.out_dir=piped > /dev/null
"$loco" simulate pipeline --calibrate piped | tee pcal.txt
grep -qE "^  predicted +[0-9.]+ " pcal.txt && grep -qE "^  measured +[0-9.]+ " pcal.txt

# Bad input: one line naming the problem, non-zero exit.
expect_error() {  # expect_error PATTERN ARGS...
  local pattern=$1; shift
  if "$loco" "$@" > out.txt 2> err.txt; then echo "FAIL: accepted: $*"; exit 1; fi
  grep -q "$pattern" err.txt || { echo "FAIL: $*: expected '$pattern', got: $(cat err.txt)"; exit 1; }
  # Refused before any output (latency --workers 48 printed its table's heading first).
  [ ! -s out.txt ] || { echo "FAIL: $*: refused after printing: $(head -3 out.txt)"; exit 1; }
}
expect_error "no such profile" simulate cu --model 7b
expect_error "unknown method" simulate cu --method fsdp
expect_error "unknown profile key" simulate cu --set 1b.depth=3
expect_error "not a number" simulate cu --set 1b.layers=many
expect_error "tau must be smaller than inner_steps" simulate cu --set 1b.tau=100
expect_error "convention must be loco or paper" simulate cu --model 1b --convention mine
expect_error "MIN:MAX:POINTS" simulate cu --bandwidth-range 10:1:5
# Sizes that overflowed or never ended (hostile tester, 2026-11-29): 1e30 parameters printed 100%
# CU at every bandwidth (int64 overflow); 1e12 inner steps or 1e9 bandwidth points ran on
# without end; 1e10 layers overflowed int and was reported as "layers must be >= 1".
expect_error "0 < params <= 1e15" simulate cu --model 1b --method ddp --set 1b.params=1e30
expect_error "inner_steps must be in \[1, 10000\]" simulate cu --model 1b --set 1b.inner_steps=1e12
expect_error "inner_steps x layers must be at most 1e6" simulate cu --model 1b --set 1b.inner_steps=10000 \
  --set 1b.layers=200
expect_error "layers: expected an integer of at most 2147483647" simulate cu --model 1b --set 1b.layers=1e10
expect_error "step_time_s must be in" simulate cu --model 1b --set 1b.step_time_s=inf
expect_error "POINTS a whole number in \[2, 10000\]" simulate cu --model 1b --bandwidth-range 1:10:1e9
expect_error "workers: 1e+10 is not a whole number in \[2, 65536\]" simulate latency --workers 1e10
expect_error "the Monte Carlo would draw" simulate latency --workers 1024 --trials 100000000
expect_error "sigma: each must be in (0, 10\]" simulate latency --sigma nan
expect_error "steps must be in \[2, 100000\]" simulate pipeline --config "$root/configs/tiny.toml" --steps 1000000000
# NaN taken as a number (CLI11 reads it, and its range checks let it through): silently the
# config's batch, or an unplotted schedule; --nodes without --bandwidth silently ignored.
expect_error "batch: not a finite number: nan" estimate --config "$root/configs/tiny.toml" --batch nan
expect_error "gantt-bandwidth: not a finite number: nan" simulate cu --model 1b --gantt-bandwidth nan
expect_error "nodes and --bandwidth go together" estimate --config "$root/configs/tiny.toml" --nodes 8
expect_error "power of two" simulate latency --workers 48
expect_error "divisible" estimate --config "$root/configs/small.toml" --slices 3
expect_error "no such file\|cannot\|not found\|No such" simulate cu --calibrate does-not-exist
# A spoiled summary of the calibrated run: checked as loco report checks it, and what the
# calibration reads must be there (a missing compute_s was nlohmann's raw out_of_range).
# spoiled RUN SIMULATION 'PYTHON:EXPECTED'...: each edit of RUN's summary refused, naming it.
spoiled() {
  local run=$1 simulation=$2 spoil; shift 2
  for spoil in "$@"; do
    rm -rf spoiled && cp -r "$run" spoiled
    $py - "$run/summary.json" spoiled/summary.json "${spoil%%:*}" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
exec(sys.argv[3])
json.dump(s, open(sys.argv[2], "w"))
PY
    expect_error "spoiled/summary.json: .*${spoil#*:}" simulate "$simulation" --calibrate spoiled
  done
}
spoiled run cu 'del s["workers"][0]["compute_s"]:workers\[0\] has no compute_s' \
  's["workers"][1]["compute_utilization"] = None:workers\[1\] has no compute_utilization' \
  's["workers"] = []:an empty workers list' 's["replicas"] = 1e300:replicas is 1e+300'
spoiled piped pipeline 'del s["workers"][1]["wall_s"]:workers\[1\] has no wall_s' 's["replicas"] = 0:replicas is 0' \
  's["workers"][0]["eval_s"] = "x":eval_s is "x"' 's["workers"][0]["wall_s"] = None:workers\[0\] has no wall_s'
echo "simulate: OK"
