#!/usr/bin/env bash
# What a hostile tester broke, each case failing before its fix (issue 12):
#  1. many workers under an address-space limit: a one-line error, not SIGABRT or a hang;
#  2. a checkpoint whose config.json claims a huge model: refused at once, before allocating;
#  3. a flipped digit in a training state's header, counters out of range, and a worker's state
#     holding entries the run does not read (another method's): refused;
#  4. a new run into a directory holding a run: refused, unless --overwrite;
#  5. two processes training in one run directory: the second is refused;
#  6. traffic counters continue across a resume;
#  7. --config given a directory;
#  8. a validation file shorter than one window, an empty validation split, --until 0,
#     absurd sizes, and old checkpoints pruned (train.keep_checkpoints).
set -euo pipefail
source "$(dirname "$0")/distributed_env.sh" "$@"
base=(--config "$root/configs/tiny.toml" --set data.train=train.tok --set data.val=val.tok --quiet)
fails() {  # fails EXPECTED COMMAND...: exit 1, one line on stderr containing EXPECTED
  local want=$1; shift
  set +e
  "$@" > out.txt 2> err.txt
  local rc=$?
  set -e
  if [ $rc -ne 1 ] || [ "$(wc -l < err.txt)" -ne 1 ] || ! grep -qF -- "$want" err.txt || [ -s out.txt ]; then
    echo "FAIL: $* -> exit $rc: $(cat err.txt)"; echo "      expected exit 1, no output and: $want"
    [ -s out.txt ] && echo "      stdout: $(head -3 out.txt)"; exit 1
  fi
  echo "ok: $(cat err.txt)"
}

# 1. 16 in-process workers in 400 MB of address space (skipped under sanitizers, which need
#    terabytes of it).
if [ -z "${LOCO_SANITIZED:-}" ]; then
  fails "of address space" bash -c "ulimit -v 400000; exec timeout 60 '$loco' train ${base[*]} \
    --set distributed.replicas=16 --set train.out_dir=ulimit"
fi

# 2. config.json claiming 10^9 layers (or 10^5, within the cap): refused at once.
"$loco" init --config "$root/configs/tiny.toml" --seed 1 --out ck > /dev/null
for layers in 1000000000 100000; do
  rm -rf huge && cp -r ck huge
  sed -i "s/\"num_hidden_layers\": 2/\"num_hidden_layers\": $layers/" huge/config.json
  want=$([ $layers = 100000 ] && echo 'missing tensor "model.layers.2.' || echo "num_layers must be in [1, 100000]")
  fails "$want" timeout 60 "$loco" eval --checkpoint huge --data val.tok --seq-len 8 --windows 2
done

# 3. A training state whose step 20 is edited to 30; a step beyond the run's length; a worker's
#    state from another method's run (DiLoCo's, with its outer parameters and momentum, copied
#    into a data-parallel run's checkpoint): refused, not resumed with those entries ignored.
"$loco" train "${base[@]}" --set train.steps=40 --set train.out_dir=edit --until 20
cp -r edit edit2
state=edit/checkpoints/step_00000020/state.safetensors
sed -i 's/"step":"20"/"step":"30"/' $state
grep -q '"step":"30"' $state
fails "checksum mismatch" "$loco" train --resume edit
sed -i 's/^steps = 40/steps = 10/' edit2/config.toml
fails "step 20 is outside this run's 1..10" "$loco" train --resume edit2
"$loco" train "${base[@]}" --set train.steps=40 --set algorithm=diloco --set outer.inner_steps=5 \
  --set train.out_dir=other --until 20
cp other/checkpoints/step_00000020/replica-0.safetensors edit2/checkpoints/step_00000020/
sed -i 's/^steps = 10/steps = 40/' edit2/config.toml
fails "replica-0.safetensors: the state holds tensor(s) this run does not read: outer.momentum, outer.params" \
  "$loco" train --resume edit2

# 4. A new run into a directory holding one; --overwrite starts over.
"$loco" train "${base[@]}" --set train.steps=4 --set train.out_dir=reuse
fails "reuse already holds a run" "$loco" train "${base[@]}" --set train.steps=4 --set train.out_dir=reuse
"$loco" train "${base[@]}" --set train.steps=6 --set train.out_dir=reuse --overwrite
[ "$(cat reuse/checkpoints/latest)" = step_00000006 ] && [ ! -d reuse/checkpoints/step_00000004 ]

# 5. Two resumes of one run at once: the second is refused while the first trains.
"$loco" train "${base[@]}" --set train.steps=100000 --set train.checkpoint_interval=0 --set train.out_dir=busy \
  --until 5
"$loco" train --resume busy --quiet > /dev/null 2>&1 &
first=$!
for _ in $(seq 1 100); do grep -q "$first" busy/lock 2> /dev/null && break; sleep 0.05; done
fails "busy is in use by another loco train (process $first)" "$loco" train --resume busy
kill $first; wait $first 2> /dev/null || true

# 6. Traffic counters across a resume: the gradient bytes of 2 DDP replicas are those of the
#    uninterrupted run.
ddp=("${base[@]}" --set distributed.replicas=2 --set train.steps=12)
"$loco" train "${ddp[@]}" --set train.out_dir=whole
"$loco" train "${ddp[@]}" --set train.out_dir=halves --until 6
"$loco" train --resume halves --quiet
$py - whole/summary.json halves/summary.json <<'PY'
import json, sys
a, b = (json.load(open(p))["workers"] for p in sys.argv[1:])
for x, y in zip(a, b):
    ga, gb = x["by_operation"]["gradients"], y["by_operation"]["gradients"]
    assert ga["bytes_sent"] == gb["bytes_sent"] > 0, (ga, gb)
    assert ga["instances"] == gb["instances"] == 12, (ga, gb)
print("gradient bytes after resume equal the uninterrupted run's")
PY

# 7. --config given a directory.
fails "is a directory, not a config file" "$loco" train --config ck

# 8. The smaller ones.
$py "$here/../tools/make_tokens.py" short.tok 256 20 3
fails "short.tok: 20 tokens, fewer than one window of 33" "$loco" train "${base[@]}" --set data.val=short.tok \
  --set train.out_dir=short
fails "--until" "$loco" train "${base[@]}" --set train.out_dir=zero --until 0
fails "of memory; this machine has" "$loco" train "${base[@]}" --set model.hidden_size=1048576 \
  --set model.num_heads=8 --set train.out_dir=absurd
# A vocabulary of 2e9 entries (the tiny data uses 256): refused by the memory check before
# anything large is allocated (it counted the training tokens into 2e9 counters first: 16 GB,
# over a minute of memset; in 2 GB of address space, std::bad_alloc). Sanitizers need terabytes.
if [ -z "${LOCO_SANITIZED:-}" ]; then
  fails "of memory; this machine has" bash -c "ulimit -v 2000000; exec timeout 120 '$loco' train ${base[*]} \
    --set model.vocab_size=2000000000 --set train.out_dir=wide"
fi
fails "of memory; this machine has" "$loco" init --config "$root/configs/tiny.toml" --set model.hidden_size=1048576 \
  --set model.num_heads=8 --seed 1 --out absurd
# data prepare: a tiny input still gets a validation split (its last lines); hidden files, hidden
# directories and other extensions in an input directory are skipped and listed; a one-line input
# warns that nothing was held out; JSON Lines documents are never split between train and val.
mkdir -p text/.git text/sub && printf 'one line\nanother line\n' > text/a.txt && printf 'a third\n' > text/b.txt
echo hidden > text/.notes.txt && echo git > text/.git/config && echo readme > text/README && echo nested > text/sub/c.md
"$loco" data prepare --input text --tokenizer bytes --val-fraction 0.1 --out prepared > out.txt
grep -q "4 lines -> 30 train / 7 val tokens" out.txt  # the last line, "nested\n", is validation
grep -q "skipped 3 file(s) in the input directories (hidden, or not .txt, .text, .md, .rst, .jsonl): text/.git/, text/.notes.txt, text/README" out.txt
grep -q "validation is the input's last lines" out.txt
printf 'only line\n' > one.txt
"$loco" data prepare --input one.txt --tokenizer bytes --val-fraction 0.1 --out one > /dev/null 2> warn.txt
grep -q "warning: --val-fraction 0.1 held out no validation text: the input has 1 line(s)" warn.txt
$py - docs.jsonl <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for d in range(300):
        f.write(json.dumps({"text": "\n".join(f"doc {d:03d} line {i}" for i in range(5))}) + "\n")
PY
"$loco" data prepare --input docs.jsonl --tokenizer bytes --val-fraction 0.2 --out jsonl > /dev/null
$py - jsonl <<'PY'
import re, struct, sys
def docs(split):  # LOCOTOKS (docs/formats.md); with the bytes tokenizer, id = byte
    raw = open(f"{sys.argv[1]}/{split}.tok", "rb").read()
    width, n = struct.unpack("<I", raw[12:16])[0], struct.unpack("<Q", raw[24:32])[0]
    ids = struct.unpack(f"<{n}{'H' if width == 2 else 'I'}", raw[64:64 + n * width])
    return set(re.findall(r"doc (\d{3})", bytes(ids).decode()))
train, val = docs("train"), docs("val")
assert train and val and not (train & val), (len(train), len(val), len(train & val))
print(f"jsonl: {len(train)} train and {len(val)} val documents, none in both")
PY
"$loco" train "${base[@]}" --set train.steps=40 --set train.log_interval=5 --set train.checkpoint_interval=5 \
  --set train.keep_checkpoints=2 --set train.out_dir=pruned
[ "$(ls pruned/checkpoints | grep -c '^step_')" = 2 ] && [ -d pruned/checkpoints/step_00000040 ]
echo "hardening: OK"
