#!/usr/bin/env bash
# The large corpus of the quality-parity study (docs/results/parity.md): the C sources of the
# Linux kernel 6.1 (Debian package linux-source-6.1), every .c and .h file outside drivers/gpu
# (mostly generated register tables) and tools/, valid UTF-8 only, prepared once with a
# 1024-token SentencePiece vocabulary into data/linux/tok1k (a small vocabulary for small models: the
# head of a 4096-token vocabulary would cost more than the blocks of the study's model; the
# split holds out 0.5% of 64-line blocks for validation). Brown stays the demo's corpus.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
loco_install build code
scripts/build.sh > /dev/null
if [ ! -f data/linux/src/.complete ]; then
  rm -rf data/linux/src data/linux/extract
  mkdir -p data/linux/extract
  echo "code-data: extracting the kernel's C sources (about a minute)" >&2
  tar -xJf /usr/src/linux-source-6.1.tar.xz -C data/linux/extract --wildcards '*.c' '*.h'
  python3 scripts/code_corpus.py data/linux/extract/linux-source-6.1 data/linux/src
  rm -rf data/linux/extract
  touch data/linux/src/.complete
fi
if [ ! -f data/linux/tok1k/train.tok ]; then
  echo "code-data: tokenizing (several minutes on one core)" >&2
  build/loco data prepare --input data/linux/src --extensions c,h --tokenizer sentencepiece --vocab-size 1024 \
    --val-fraction 0.005 --out data/linux/tok1k.tmp
  rm -rf data/linux/tok1k
  mv data/linux/tok1k.tmp data/linux/tok1k
fi
