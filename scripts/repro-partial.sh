#!/usr/bin/env bash
# Partial parameter updates on the Brown corpus (docs/results/partial.md): configs/small.toml,
# 4 nodes as MPI processes (so each node's peak RSS is its own), 160 steps of 4 x 128 tokens per
# node, DiLoCo with H = 20; DiLoCo vs 1/2 MLPs, 1/4 MLPs, 1/2 MLPs + heads, 1/4 MLPs + heads.
# Usage: scripts/repro-partial.sh [OUT_DIR]   (default runs/repro-partial; about 10 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/repro-partial}
scripts/brown-data.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
rm -rf "$out" && mkdir -p "$out"
common=(--config configs/small.toml --set data.batch_size=4 --set train.steps=160 --set train.eval_interval=40
        --set train.checkpoint_interval=0 --set algorithm=diloco --set outer.inner_steps=20 --quiet
        --set outer.lr=0.7 --set outer.momentum=0.9)  # the DiLoCo paper's outer settings, as recorded
run() {
  local name=$1; shift
  mpirun -np 4 build/loco train "${common[@]}" "$@" --set train.out_dir="$out/$name" > "$out/$name.log" 2>&1
  echo "$name: $(grep -m1 'final val loss' "$out/$name.log")"
}
run diloco
run mlp-1of2 --set partial.slices=2 --set partial.strategy=mlp
run mlp-1of4 --set partial.slices=4 --set partial.strategy=mlp
run mlp-heads-1of2 --set partial.slices=2 --set partial.strategy=mlp+heads
run mlp-heads-1of4 --set partial.slices=4 --set partial.strategy=mlp+heads
/usr/bin/python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
runs = ["diloco", "mlp-1of2", "mlp-1of4", "mlp-heads-1of2", "mlp-heads-1of4"]
base = None
print("| run | val loss | trainable / node | allocated B / node (params+grads+AdamW+outer) | peak RSS / node | "
      "backward s / step | vs DiLoCo | backward FLOPs / step | bytes sent / node |")
print("|---|---|---|---|---|---|---|---|---|")
for r in runs:
    s = json.load(open(f"{out}/{r}/summary.json"))
    w = s["workers"]
    alloc = max(x["param_bytes"] + x["grad_bytes"] + x["optimizer_bytes"] + x["outer_state_bytes"] for x in w)
    rss = max(x["peak_rss_bytes"] for x in w)
    bwd = sum(x["backward_s_per_step"] for x in w) / len(w)
    base = base or bwd
    sent = sum(x["train_bytes_sent"] for x in w) / len(w)
    print(f"| {r} | {s['final_val_loss']:.4f} | {w[0]['trainable_params']} | {alloc} | {rss / 2**20:.1f} MiB | "
          f"{bwd:.4f} | {100 * (bwd / base - 1):+.1f}% | {w[0]['backward_flops_per_step']:.4g} | {sent:.4g} |")
PY
