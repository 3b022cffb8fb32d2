#!/usr/bin/env bash
# Two runs with the same seed give bitwise identical checkpoints and gradients; another seed differs.
set -euo pipefail
loco=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
printf '[model]\nvocab_size = 64\nhidden_size = 32\nnum_layers = 2\nnum_heads = 2\nintermediate_size = 64\nmax_seq_len = 32\n' > "$work/c.toml"
/usr/bin/python3 "$here/../tools/make_tokens.py" "$work/t.bin" 64 2000 3
for run in a b; do
  "$loco" init --config "$work/c.toml" --seed 5 --out "$work/$run" > /dev/null
  "$loco" grad --checkpoint "$work/$run" --data "$work/t.bin" --seq-len 32 --windows 8 --out "$work/$run.g" > /dev/null
done
"$loco" init --config "$work/c.toml" --seed 6 --out "$work/c" > /dev/null
cmp "$work/a/model.safetensors" "$work/b/model.safetensors"
cmp "$work/a.g" "$work/b.g"
if cmp -s "$work/a/model.safetensors" "$work/c/model.safetensors"; then
  echo "FAIL: seeds 5 and 6 gave the same model"; exit 1
fi
echo "determinism: OK"
