#!/usr/bin/env bash
# Protocol models on the Brown corpus (docs/results/protocol.md): configs/small.toml untied
# (d = 256, 4 blocks), a pipeline of S = 4 stages (one block each), 4 microbatches of 4
# sequences of 128 tokens per step, in-process workers over the emulated 80 Mbit/s / 30 ms link:
#  1. throughput: the unconstrained model's pipeline on that link, on an unlimited one, and on
#     an unlimited one with the 30 ms latency alone; the
#     protocol model compressed at k = d/8, d/16, d/32 and uncompressed (protocol.compress =
#     false, the same model sending all d);
#  2. loss at equal tokens: unconstrained vs protocol (project / subspace-adamw, each with and
#     without Grassmann updates every 50 steps, default eta), and one run with E_fixed at the
#     trainable init's scale (protocol.fixed_std = 0.02) instead of the reference code's 1.
# Prints a Markdown table. Usage: scripts/repro-protocol.sh [STEPS] [OUT_DIR]
#   (default 300 steps, runs/repro-protocol; about 50 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-300}
out=${2:-runs/repro-protocol}
scripts/brown-data.sh > /dev/null
rm -rf "$out"
mkdir -p "$out"
common=(--config configs/small.toml --set model.tie_embeddings=false --set pipeline.stages=4
        --set pipeline.microbatches=4 --set train.steps="$steps" --set train.eval_interval=100
        --set train.checkpoint_interval=0 --quiet)
link=(--set network.bandwidth=80Mbit --set network.latency=30ms)
run() {
  local name=$1; shift
  build/loco train "${common[@]}" "$@" --set train.out_dir="$out/$name" > "$out/$name.log"
  echo "$name: $(grep -m1 'final val loss' "$out/$name.log" || echo 'no final val loss')" >&2
}
run plain-unlimited
run plain-latency-only --set network.latency=30ms
run plain-80mbit "${link[@]}"
for k in 32 16 8; do run "protocol-k$k" "${link[@]}" --set protocol.rank=$k; done
run protocol-k32-uncompressed "${link[@]}" --set protocol.rank=32 --set protocol.compress=false
run protocol-k32-adamw "${link[@]}" --set protocol.rank=32 --set protocol.constraint=subspace-adamw
run protocol-k32-grassmann "${link[@]}" --set protocol.rank=32 --set protocol.grassmann_interval=50
run protocol-k32-adamw-grassmann "${link[@]}" --set protocol.rank=32 --set protocol.constraint=subspace-adamw \
  --set protocol.grassmann_interval=50
run protocol-k32-fixed002 "${link[@]}" --set protocol.rank=32 --set protocol.fixed_std=0.02

echo "| run | link | k | constraint | Grassmann | tokens/s | CU | bubble | activations B per boundary per microbatch | val loss | gap to unconstrained | max residual |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for name in plain-unlimited plain-latency-only plain-80mbit protocol-k32 protocol-k16 protocol-k8 protocol-k32-uncompressed \
            protocol-k32-adamw protocol-k32-grassmann protocol-k32-adamw-grassmann protocol-k32-fixed002; do
  /usr/bin/python3 - "$out/$name/summary.json" "$out/plain-80mbit/summary.json" "$name" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
base = json.load(open(sys.argv[2]))["final_val_loss"]
name = sys.argv[3]
ws = s["workers"]
steps = ws[0]["steps_run"]
tokens = 16 * 128 * steps
train = max(w["wall_s"] - w["eval_s"] - w["checkpoint_s"] for w in ws)
cu = sum(w["compute_utilization"] for w in ws) / len(ws)
bubble = sum(w["bubble_share"] for w in ws) / len(ws)
first = [w for w in ws if w["stage"] == 0][0]
act = first["by_operation"]["activations"]
per_mb = act["bytes_sent"] / act["messages_sent"]
p = [w.get("protocol") for w in ws if w.get("protocol")]
k = p[0]["rank"] if p else "-"
res = max(x["max_residual"] for x in p) if p else None
constraint = ("subspace-adamw" if "adamw" in name else "project") if p else "-"
grass = "every 50" if "grassmann" in name else "-"
link = {"plain-unlimited": "unlimited", "plain-latency-only": "unlimited, 30 ms"}.get(name, "80 Mbit/s, 30 ms")
if "uncompressed" in name:
    k = f"{k} (sent as d)"
if "fixed002" in name:
    constraint += ", E_fixed std 0.02"
val = s["final_val_loss"]
print(f"| {name} | {link} | {k} | {constraint} | {grass} | {tokens / train:.0f} | {100 * cu:.0f}% | {100 * bubble:.0f}% | "
      f"{per_mb:.0f} | {val:.4f} | {100 * (val - base) / base:+.2f}% | {res:.1e} |" if res is not None else
      f"| {name} | {link} | {k} | {constraint} | {grass} | {tokens / train:.0f} | {100 * cu:.0f}% | {100 * bubble:.0f}% | "
      f"{per_mb:.0f} | {val:.4f} | {100 * (val - base) / base:+.2f}% | - |")
PY
done
