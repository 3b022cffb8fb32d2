#!/usr/bin/env bash
# loco's link model against a real network (docs/results/network.md). For DDP, DiLoCo (H 10)
# and Streaming DiLoCo (fp4, tau 1, H 10) on configs/small.toml (8 sequences of 128 tokens per
# replica and step, one compute thread per worker), with 2 and 4 workers, over
# 100 Mbit/s + 30 ms and 1 Gbit/s + 10 ms:
#   - lab: one MPI rank per network namespace of scripts/netlab.sh (real TCP through tbf and
#     the delay helper);
#   - emulated: the same run in-process under loco's link model, as an ideal pipe
#     (network.tcp = false) and with TCP's behaviour (network.tcp = true), both at the link's
#     nominal rate, and as an ideal pipe at the rate plain TCP reached around the same ring of
#     lab hosts in the same run (the all-reduce bench below, run first);
#   - predicted: `loco simulate cu --calibrate` on the ideal-pipe run.
# Prints a Markdown table: wall time, CU and bytes sent per worker for each; then the ring
# all-reduce against raw TCP in the lab. Needs root (the lab).
# Usage: bench/network.sh [STEPS] [OUT_DIR] [PARTS] [LINKS] [METHODS]   (default 30 steps,
# runs/bench-network, PARTS all; "cu" or "allreduce" runs one of the two tables; LINKS a
# space-separated subset of "100mbit 1gbit", METHODS of "ddp diloco streaming-fp4", default all)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-30}
out=${2:-runs/bench-network}
parts=${3:-all}
links=${4:-100mbit 1gbit}
methods=${5:-ddp diloco streaming-fp4}
for l in $links; do case $l in 100mbit | 1gbit) ;; *) echo "bench/network.sh: unknown link '$l' (100mbit, 1gbit)" >&2; exit 2 ;; esac; done
for m in $methods; do case $m in ddp | diloco | streaming-fp4) ;; *) echo "bench/network.sh: unknown method '$m'" >&2; exit 2 ;; esac; done
case $parts in all | cu | allreduce) ;; *) echo "bench/network.sh: PARTS must be all, cu or allreduce" >&2; exit 2 ;; esac
bash scripts/brown-data.sh > /dev/null
rm -rf "$out"
mkdir -p "$out"
out=$(cd "$out" && pwd)  # absolute: the lab's hosts run in other directories

# The ring all-reduce bench in the lab, once per link and worker count: the all-reduce table
# (item 4 of the lab) and the CU table's "pipe at the lab's TCP rate" both read its log.
allreduce_log() { echo "$out/allreduce-$1-$2.log"; }  # np rate
measure_allreduce() {  # np rate delay floats
  local log
  log=$(allreduce_log "$1" "$2")
  [ -f "$log" ] || scripts/netlab.sh run "$1" "$2" "$3" -- "$PWD/build/bench/loco_allreduce_bench" "$4" 3 > "$log" 2>&1
}
# What a log says, as a row of the all-reduce table (row) or as the mean over ranks of raw TCP's
# rate in bits per second (raw_bps).
allreduce_stats() {  # log np what [link floats]
  /usr/bin/python3 - "$@" <<'PY'
import re, sys
log, np_, what = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = [tuple(map(float, m.groups())) for m in
        re.finditer(r"raw ([0-9.e+]+) B/s, ring all-reduce ([0-9.e+]+) B/s, ratio ([0-9.]+), "
                    r"CPU ms per MB raw ([0-9.]+) ring ([0-9.]+)", open(log).read())]
assert len(rows) == np_, f"{log}: {len(rows)} of {np_} ranks reported"
mean = lambda k: sum(r[k] for r in rows) / len(rows)
if what == "raw_bps":
    print(f"{8 * mean(0):.0f}")
else:
    ratios = [r[2] for r in rows]
    print(f"| {sys.argv[4]} | {np_} | {sys.argv[5]} | {mean(0) / 1e6:.2f} | {mean(1) / 1e6:.2f} | "
          f"{min(ratios):.3f}-{max(ratios):.3f} | {mean(3):.2f} / {mean(4):.2f} |")
PY
}

all_links=("100mbit 30ms 100Mbit 4194304" "1gbit 10ms 1Gbit 16777216")
if [ "$parts" != allreduce ]; then
common=(--config configs/small.toml --set train.steps="$steps" --set train.eval_interval=0 --set data.val=
        --set train.checkpoint_interval=0 --set data.batch_size=8 --set train.threads=1 --quiet)
declare -A method_args=(
  [ddp]="--set algorithm=ddp"
  [diloco]="--set algorithm=diloco --set outer.inner_steps=10"
  [streaming-fp4]="--set algorithm=streaming --set outer.inner_steps=10 --set outer.codec=fp4-e3m0 --set streaming.tau=1"
)
# "pipe at lab TCP": the ideal pipe at the rate raw TCP reached around the same ring of lab hosts
# (mean over ranks, from the all-reduce bench), i.e. the link as a user would measure it, where
# "pipe" uses the nominal rate.
echo "| method | workers | link | lab wall s | pipe wall s | TCP-model wall s | lab CU | pipe CU | TCP-model CU | lab TCP MB/s | pipe at lab TCP CU | predicted CU | pipe - lab | TCP model - lab | pipe at lab TCP - lab | lab MB sent/worker | emulated MB sent/worker |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for link in "${all_links[@]}"; do
  read -r rate delay bw floats <<< "$link"
  [[ " $links " == *" $rate "* ]] || continue
  for np in 2 4; do
    measure_allreduce "$np" "$rate" "$delay" "$floats"
    raw_bps=$(allreduce_stats "$(allreduce_log "$np" "$rate")" "$np" raw_bps)
    for method in $methods; do
      name=$method-$np-$rate
      # shellcheck disable=SC2206
      margs=(${method_args[$method]})
      NETLAB_STATS="$out/$name-lab.tc" scripts/netlab.sh run "$np" "$rate" "$delay" -- \
        "$PWD/build/loco" train "${common[@]}" "${margs[@]}" --set data.train="$PWD/data/brown/tok4k/train.tok" \
        --set train.out_dir="$out/$name-lab" > "$out/$name-lab.log" 2>&1
      for model in "false false $bw" "true true $bw" "raw false ${raw_bps}bit"; do  # run name, network.tcp, rate
        read -r kind tcp rate_bw <<< "$model"
        build/loco train "${common[@]}" "${margs[@]}" --set distributed.replicas="$np" --set network.bandwidth="$rate_bw" \
          --set network.latency="$delay" --set network.tcp="$tcp" --set train.out_dir="$out/$name-emu-$kind" \
          > "$out/$name-emu-$kind.log" 2>&1
      done
      pred=$(build/loco simulate cu --calibrate "$out/$name-emu-false" | sed -nE 's/.*predicted ([0-9.]+)%.*/\1/p')
      /usr/bin/python3 - "$out/$name-lab/summary.json" "$out/$name-emu-false/summary.json" \
        "$out/$name-emu-true/summary.json" "$out/$name-emu-raw/summary.json" "$method" "$np" "$rate/$delay" "$pred" \
        "$raw_bps" <<'PY'
import json, sys
lab, emu, tcp, raw = (json.load(open(p)) for p in sys.argv[1:5])
method, np_, link, pred = sys.argv[5], sys.argv[6], sys.argv[7], float(sys.argv[8])
raw_mbs = float(sys.argv[9]) / 8e6
def stats(s):
    ws = s["workers"]
    cu = 100 * sum(w["compute_utilization"] for w in ws) / len(ws)
    sent = sum(w["bytes_sent"] for w in ws) / len(ws) / 1e6
    return s["seconds"], cu, sent
lw, lc, ls = stats(lab)
ew, ec, es = stats(emu)
tw, tc, ts = stats(tcp)
rw, rc, rs = stats(raw)
print(f"| {method} | {np_} | {link} | {lw:.1f} | {ew:.1f} | {tw:.1f} | {lc:.1f}% | {ec:.1f}% | {tc:.1f}% | {raw_mbs:.1f} | "
      f"{rc:.1f}% | {pred:.1f}% | {ec - lc:+.1f} | {tc - lc:+.1f} | {rc - lc:+.1f} | {ls:.1f} | {es:.1f} |")
PY
    done
  done
done
fi
[ "$parts" = cu ] && exit 0

# Item 4 of the lab: how much of the link a ring all-reduce of a large buffer uses, as a ratio to
# plain TCP sockets carrying the same bytes around the same ring in the same run, the two timed
# in alternation (min and max over the ranks), and the CPU each rank spent per MB sent.
echo
echo "| link | workers | floats | raw MB/s per rank | ring MB/s per rank | ring / raw (min-max over ranks) | CPU ms per MB raw / ring |"
echo "|---|---|---|---|---|---|---|"
for link in "${all_links[@]}"; do
  read -r rate delay bw floats <<< "$link"
  [[ " $links " == *" $rate "* ]] || continue
  for np in 2 4; do
    measure_allreduce "$np" "$rate" "$delay" "$floats"
    allreduce_stats "$(allreduce_log "$np" "$rate")" "$np" row "$rate/$delay" "$floats"
  done
done
