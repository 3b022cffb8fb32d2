#!/usr/bin/env bash
# Regenerates the seed corpora in corpus/ (committed) from valid files loco writes, plus
# every input in regressions/ that once made a target fail.
# Usage: tests/fuzz/make_corpus.sh build/loco
set -euo pipefail
loco=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
c=$here/corpus
rm -rf "$c" && mkdir -p "$c"/{safetensors,token_file,run_config,hf_config,tokenizer,peer_messages,text_input,secure_frames,run_files}
cat > small.toml <<'TOML'
[model]
vocab_size = 16
hidden_size = 8
num_layers = 1
num_heads = 2
intermediate_size = 8
max_seq_len = 8
TOML
"$loco" init --config small.toml --seed 1 --out ck > /dev/null
cp ck/model.safetensors "$c/safetensors/model"
cp ck/config.json "$c/hf_config/loco"
$py "$here/../tools/make_tokens.py" train.tok 16 300 1
cp train.tok "$c/token_file/small"
"$loco" train --config small.toml --set data.train=train.tok --set data.seq_len=4 --set data.batch_size=2 \
  --set train.steps=2 --set train.log_interval=1 --set train.out_dir=run --quiet > /dev/null
cp run/checkpoints/step_00000002/state.safetensors "$c/safetensors/run-state"
cp run/checkpoints/step_00000002/replica-0.safetensors "$c/safetensors/worker-state"
cp "$here/../../configs/tiny.toml" "$c/run_config/tiny"
cp run/config.toml "$c/run_config/full"
# A run's files for fuzz_run_files: metrics.jsonl, a NUL byte, summary.json (and metrics alone).
{ cat run/metrics.jsonl; printf '\0'; cat run/summary.json; } > "$c/run_files/run"
cp run/metrics.jsonl "$c/run_files/metrics"
printf '[pipeline]\nstages = 2\nmicrobatches = 4\nsplit = "1,1"\n[model]\nnum_layers = 2\n' > "$c/run_config/pipeline"
printf '{"vocab_size":32,"hidden_size":16,"num_hidden_layers":2,"num_attention_heads":2,"intermediate_size":24,' > "$c/hf_config/hf"
printf '"tie_word_embeddings":true,"rms_norm_eps":1e-6}' >> "$c/hf_config/hf"
printf '{"vocab_size":32,"hidden_size":16,"num_hidden_layers":1,"num_attention_heads":4,"num_key_value_heads":2,' > "$c/hf_config/gqa"
printf '"intermediate_size":24}' >> "$c/hf_config/gqa"
mkdir -p text && for i in $(seq 1 400); do echo "The jury said line $i of the report was fine and well written, said Mr. Jones $((i * 7))."; done > text/a.txt
"$loco" data prepare --input text --tokenizer sentencepiece --vocab-size 300 --val-fraction 0 --out sp > /dev/null
cp sp/tokenizer.model "$c/tokenizer/small"
# Peer messages: selector byte, then the message (see fuzz_peer_messages.cpp).
$py - "$c/peer_messages" <<'PY'
import os, struct, sys
d = sys.argv[1]
def w(name, data): open(os.path.join(d, name), "wb").write(data)
w("codec-fp32", b"\x00" + struct.pack("<H", 8) + struct.pack("<8f", *range(8)))
w("codec-fp4", b"\x00" + struct.pack("<H", 64) + bytes(range(40)))
w("allreduce", b"\x01" + bytes([2, 7]) + struct.pack("<14f", *([1.0] * 14)))
w("link", b"\x02" + struct.pack("<d", 0.5) + b"payload")
w("boundary", b"\x03" + struct.pack("<32f", *([0.1] * 32)) + struct.pack("<5i", 1, 2, 3, 4, 5))
w("norm", b"\x04" + bytes([16]) + struct.pack("<4d", 0, 1.5, 3, 2.0))
PY
# Data-plane bytes: selector byte, then the bytes (see fuzz_secure_frames.cpp).
$py - "$c/secure_frames" <<'PY'
import os, struct, sys
d = sys.argv[1]
def w(name, data): open(os.path.join(d, name), "wb").write(data)
w("hello", b"\x00" + b"LOCOSEC1" + struct.pack("<II", 1, 0) + bytes(64) + bytes(32))
w("welcome", b"\x01" + bytes(range(64)))
w("frames", b"\x02" + struct.pack("<III", 1, 4, 1) + b"abcd" + bytes(16) + struct.pack("<III", 9, 0, 0) + bytes(16))
w("altered", b"\x03" + bytes([5, 7, 0]) + bytes([1, 6]) + b"payload" + bytes([2, 0]) + bytes([0, 3]) + b"end")
PY
# Text inputs: format byte (0 text, 1 JSON Lines), then the file, plain or gzip.
{ printf '\x00'; printf 'One line caf\xc3\xa9.\nTwo lines.\n'; } > "$c/text_input/text"
{ printf '\x01'; printf '{"text": "a\\nb"}\n\n{"id": 2, "text": "c\\u00e9"}\n'; } > "$c/text_input/jsonl"
{ printf '\x01'; printf '{"text": "zipped"}\n{"text": "two"}\n' | gzip -n; } > "$c/text_input/jsonl-gz"
{ printf '\x00'; printf 'zipped text\nline two\n' | gzip -n; } > "$c/text_input/text-gz"
# Inputs that once crashed a target (regressions/TARGET/NAME) stay in its corpus.
for f in "$here"/regressions/*/*; do
  cp "$f" "$c/$(basename "$(dirname "$f")")/regression-$(basename "$f")"
done
ls -R "$c" | head -40
