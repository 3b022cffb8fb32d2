#!/usr/bin/env bash
# The main job: installs, builds, fetches the Brown corpus, prepares a 4096-token SentencePiece
# vocabulary and trains configs/small.toml, then prints the summary and writes the loss plot.
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
rm -rf runs/small
build/loco train --config configs/small.toml
build/loco plot runs/small --out runs/small/loss.png
build/loco generate --checkpoint runs/small/checkpoints/step_00000300 --prompt "The jury said" \
  --max-tokens 40 --seed 1
