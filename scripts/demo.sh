#!/usr/bin/env bash
# The main job: installs, builds, fetches the Brown corpus, prepares a 4096-token SentencePiece
# vocabulary, then trains configs/small.toml with 4 in-process replicas over an emulated
# 1 Gbit/s, 30 ms link, once with DDP and once with DiLoCo on the same token budget, and prints
# a comparison (validation loss, bytes sent per worker, compute utilization) and a loss plot.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
loco_install build demo
scripts/build.sh > /dev/null
scripts/fetch-corpus.sh brown
if [ ! -f data/brown/tok4k/train.tok ]; then
  build/loco data prepare --input data/brown/text --tokenizer sentencepiece --vocab-size 4096 \
    --val-fraction 0.05 --out data/brown/tok4k
fi
rm -rf runs/demo
common=(--config configs/small.toml --set distributed.replicas=4 --set data.batch_size=4 --set train.steps=240
        --set train.eval_interval=60 --set train.checkpoint_interval=0
        --set network.bandwidth=1Gbit --set network.latency=30ms)
echo "== DDP: gradients all-reduced every step =="
build/loco train "${common[@]}" --set algorithm=ddp --set train.out_dir=runs/demo/ddp
echo "== DiLoCo: outer gradients all-reduced every H = 30 steps =="
build/loco train "${common[@]}" --set algorithm=diloco --set outer.inner_steps=30 --set train.out_dir=runs/demo/diloco
echo
build/loco compare runs/demo/ddp runs/demo/diloco
build/loco plot runs/demo/ddp runs/demo/diloco --out runs/demo/loss.png
build/loco generate --checkpoint runs/demo/diloco/checkpoints/step_00000240 --prompt "The jury said" \
  --max-tokens 40 --seed 1
