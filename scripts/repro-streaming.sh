#!/usr/bin/env bash
# Small-scale reproduction of Streaming DiLoCo on the Brown corpus (docs/results/streaming.md):
# configs/small.toml, 4 in-process replicas, 160 steps of 4 x 128 tokens per replica (327,680
# tokens in all), H = 20, over an emulated 1 Gbit/s, 30 ms link:
#   DDP, DiLoCo, Streaming fp32 (tau = 1), Streaming fp4 E3M0 with tau in {0, 1, 2, 5};
# then compute utilization at 100 Mbit/s, 30 ms on short runs. Prints `loco compare` tables.
# Usage: scripts/repro-streaming.sh [OUT_DIR]   (default runs/repro-streaming; about 20 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/repro-streaming}
scripts/brown-data.sh
rm -rf "$out"
common=(--config configs/small.toml --set distributed.replicas=4 --set data.batch_size=4
        --set train.eval_interval=40 --set train.checkpoint_interval=0 --set network.latency=30ms --quiet)
stream=(--set algorithm=streaming --set outer.inner_steps=20 --set streaming.fragment_blocks=3
        --set streaming.pattern=strided --set streaming.alpha=0.5)
run() {
  local name=$1; shift
  mkdir -p "$out"
  build/loco train "${common[@]}" "$@" --set train.out_dir="$out/$name" > "$out/$name.log"
  echo "$name: $(grep -m1 'final val loss' "$out/$name.log")"
}

fast=(--set network.bandwidth=1Gbit --set train.steps=160)
run ddp "${fast[@]}" --set algorithm=ddp
run diloco "${fast[@]}" --set algorithm=diloco --set outer.inner_steps=20
run streaming-fp32-tau1 "${fast[@]}" "${stream[@]}" --set streaming.tau=1 --set outer.codec=fp32
for tau in 0 1 2 5; do
  run streaming-fp4-tau$tau "${fast[@]}" "${stream[@]}" --set streaming.tau=$tau --set outer.codec=fp4-e3m0
done

slow=(--set network.bandwidth=100Mbit --set train.eval_interval=0)
run ddp-100mbit "${slow[@]}" --set train.steps=20 --set algorithm=ddp
run diloco-100mbit "${slow[@]}" --set train.steps=40 --set algorithm=diloco --set outer.inner_steps=20
run streaming-fp4-100mbit "${slow[@]}" --set train.steps=40 "${stream[@]}" --set streaming.tau=1 --set outer.codec=fp4-e3m0

echo
echo "1 Gbit/s, 30 ms, 160 steps:"
build/loco compare "$out"/ddp "$out"/diloco "$out"/streaming-fp32-tau1 "$out"/streaming-fp4-tau{0,1,2,5}
echo
echo "100 Mbit/s, 30 ms (short runs, compute utilization):"
build/loco compare "$out"/ddp-100mbit "$out"/diloco-100mbit "$out"/streaming-fp4-100mbit
build/loco plot "$out"/ddp "$out"/diloco "$out"/streaming-fp32-tau1 "$out"/streaming-fp4-tau1 --out "$out/loss.png"
