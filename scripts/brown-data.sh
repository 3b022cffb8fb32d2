#!/usr/bin/env bash
# Shared by the demo and the reproduction scripts: installs and builds, fetches the Brown
# corpus and prepares it once with a 4096-token SentencePiece vocabulary (data/brown/tok4k).
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
