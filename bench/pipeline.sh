#!/usr/bin/env bash
# Pipeline parallelism on the Brown corpus with configs/small.toml (in-process workers over the
# emulated link): for S stages and m microbatches, the measured tokens/s, bubble share, CU and
# bytes per step, next to `loco simulate pipeline --calibrate` (the simulator given each run's
# measured stage times). Prints a Markdown table. Usage: bench/pipeline.sh [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/brown-data.sh > /dev/null
steps=${1:-12}
out=runs/bench-pipeline
rm -rf "$out"
mkdir -p "$out"
run() {  # name, settings...
  local name=$1
  shift
  build/loco train --config configs/small.toml --set train.steps="$steps" --set train.eval_interval=0 \
    --set data.val= --set train.checkpoint_interval=0 --set train.out_dir="$out/$name" --quiet "$@" > /dev/null
}
row() {  # name, S, m, link
  local name=$1 S=$2 m=$3 link=$4
  local cal pred untied free
  cal=$(build/loco simulate pipeline --calibrate "$out/$name")
  pred=$(awk '$1 == "predicted" && $2 ~ /^[0-9]/ { print $2 }' <<< "$cal")
  untied=$(awk '/without the tied-embedding exchange/ { print $(NF-3) }' <<< "$cal")
  free=$(awk '/on an unlimited link/ { print $(NF-3) }' <<< "$cal")
  /usr/bin/python3 - "$out/$name/summary.json" "$S" "$m" "$link" "$pred" "$out/S$S-m$m-inf/summary.json" "$untied" \
    "$free" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
S, m, link, pred = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
untied, free = float(sys.argv[7]), float(sys.argv[8])
ws = s["workers"]
tokens = 16 * 128
steps = ws[0]["steps_run"]
step = sum((w["wall_s"] - w["eval_s"] - w["checkpoint_s"]) / steps for w in ws) / len(ws)
def per_step(ops):
    return sum(w["by_operation"].get(op, {}).get("bytes_sent", 0) for w in ws for op in ops) / steps
pipe = per_step(["activations", "activation_grads", "tokens"])
tied = per_step(["tied_embedding"])
bubble = sum(w["bubble_share"] for w in ws) / len(ws)
cu = sum(w["compute_utilization"] for w in ws) / len(ws)
try:
    base = json.load(open(sys.argv[6]))["workers"]
    base_step = sum((w["wall_s"] - w["eval_s"] - w["checkpoint_s"]) / w["steps_run"] for w in base) / len(base)
    link_share = f"{100 * (1 - base_step / step):.0f}%" if link != "none" else "-"
except FileNotFoundError:
    link_share = "-"
# Of the step, the part that the activations alone cost on this link (predicted from this run's
# stage times: the step without the tied-embedding exchange against an unlimited link).
act_share = f"{100 * (1 - free / untied):.0f}%" if link != "none" else "-"
print(f"| {S} | {m} | {link} | {tokens / step:.0f} | {tokens / pred:.0f} | {step:.3f} | {pred:.3f} | "
      f"{100 * bubble:.0f}% | {100 * cu:.0f}% | {pipe / 1e6:.2f} | {tied / 1e6:.2f} | {link_share} | {act_share} |")
PY
}
run S1 --set pipeline.microbatches=4
echo "one worker, no pipeline (4 micro-batches): $(/usr/bin/python3 -c "
import json; w = json.load(open('$out/S1/summary.json'))['workers'][0]
print(f\"{16 * 128 * w['steps_run'] / (w['wall_s'] - w['eval_s'] - w['checkpoint_s']):.0f} tokens/s\")")"
echo
echo "| S | m | link | tokens/s | predicted | step s | predicted | bubble | CU | pipeline MB/step | tied MB/step | link share | activations' share |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for S in 2 4; do
  for m in 1 4 8; do
    for link in none 1Gbit/10ms 100Mbit/30ms; do
      name=S$S-m$m-${link//\//-}
      [ "$link" = none ] && name=S$S-m$m-inf
      bw=${link%/*} lat=${link#*/}
      [ "$link" = none ] && bw=inf lat=0ms
      run "$name" --set pipeline.stages=$S --set pipeline.microbatches=$m --set network.bandwidth=$bw \
        --set network.latency=$lat
      row "$name" $S $m "$link"
    done
  done
done
