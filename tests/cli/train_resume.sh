#!/usr/bin/env bash
# Resume == uninterrupted (bitwise), also after a checkpoint torn mid-write; the trained
# checkpoint loads in the PyTorch oracle; data prepare -> train -> generate -> plot works;
# gradient accumulation == one big batch; --resume of a finished run touches nothing, and
# --resume with --set is refused.
set -euo pipefail
loco=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
py=/usr/bin/python3
rm -rf "$work" && mkdir -p "$work/text" && cd "$work"

# Generated text: two documents of pseudo-sentences (deterministic).
$py "$here/../tools/make_text.py" text 2 1500 3
"$loco" data prepare --input text --tokenizer bytes --val-fraction 0.1 --out data > prep.txt
grep -q "unigram entropy" prep.txt
sets=(--set data.train=data/train.tok --set data.val=data/val.tok)

# Uninterrupted run.
"$loco" train --config "$root/configs/tiny.toml" "${sets[@]}" --set train.out_dir=full --quiet > /dev/null
# Gradient accumulation: micro-batches of 1 and 2 windows == the whole batch of 4. At step 1 the
# runs share their parameters, so the logged loss and gradient norm (before clipping) agree to
# float rounding: this catches a wrong scaling of the accumulated gradient or a micro-batch left
# out. The 40-step runs then agree to a tolerance: AdamW divides each entry's update by that
# entry's own gradient scale, so entries whose gradient is near zero take lr-sized steps that
# rounding can turn; measured on a 2-core AMD EPYC, micro-batches of 1 window: parameters 2.6e-4
# apart (max-abs difference over max-abs, per tensor) after 5 steps, 1.1e-4 after 40; logged
# metrics at most 5.2e-5 apart; step 1 3.3e-9.
"$loco" train --config "$root/configs/tiny.toml" "${sets[@]}" --set train.log_interval=1 \
  --set train.out_dir=batch4 --quiet > /dev/null
for m in 1 2; do
  "$loco" train --config "$root/configs/tiny.toml" "${sets[@]}" --set train.log_interval=1 \
    --set train.micro_batch_size=$m --set train.out_dir=micro$m --quiet > /dev/null
  $py "$here/../tools/params_close.py" micro$m/checkpoints/step_00000040/model.safetensors \
    batch4/checkpoints/step_00000040/model.safetensors 1e-3
  $py - micro$m/metrics.jsonl batch4/metrics.jsonl <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p) if '"train_loss"' in l] for p in sys.argv[1:3])
assert len(a) == len(b) == 40 and a[0]["step"] == b[0]["step"] == 1, "a training record per step expected"
diff = lambda x, y, k: abs(x[k] - y[k]) / abs(y[k])
first = max(diff(a[0], b[0], k) for k in ("train_loss", "grad_norm"))
worst = max(diff(x, y, k) for x, y in zip(a, b) for k in ("train_loss", "grad_norm"))
print(f"metrics: step 1 relative difference {first:.2e}, worst over 40 steps {worst:.2e}")
sys.exit(0 if first < 1e-6 and worst < 1e-4 else 1)
PY
done
"$loco" train --config "$root/configs/tiny.toml" "${sets[@]}" --set train.micro_batch_size=3 --quiet \
  > /dev/null 2> micro_err.txt && { echo "FAIL: micro_batch_size 3 of batch 4 accepted"; exit 1; }
grep -q "train.micro_batch_size (3) must divide data.batch_size (4)" micro_err.txt
# Interrupted at 20 (--until), a torn checkpoint of step 40 left behind, then resumed.
"$loco" train --config "$root/configs/tiny.toml" "${sets[@]}" --set train.out_dir=split --until 20 --quiet > /dev/null
[ "$(cat split/checkpoints/latest)" = step_00000020 ]
mkdir -p split/checkpoints/step_00000040.tmp
head -c 1000 full/checkpoints/step_00000040/model.safetensors > split/checkpoints/step_00000040.tmp/model.safetensors
# So are records cut short as a crash or a full disk leaves them (the writers append whole
# lines): the readers leave them out, the resume's rewrite and the next append remove them.
printf '{"bytes_sent":0,"comm_wait":0.01,"grad_n' >> split/metrics.jsonl
printf '{"time":"2026-11-30T00:1' >> split/invocations.jsonl
"$loco" report split --out split-report.html > /dev/null
"$loco" train --resume split --quiet > /dev/null
cmp full/checkpoints/step_00000040/model.safetensors split/checkpoints/step_00000040/model.safetensors
# Each invocation is recorded: the start and the resume, with loco's version, command and host.
$py - split/invocations.jsonl "$loco" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert [l["resume"] for l in lines] == [False, True], lines
assert "--until 20" in lines[0]["command"] and "--resume split" in lines[1]["command"], lines
for l in lines:
    assert l["loco"].startswith("0.1") and l["host"] and l["cpu"] and l["precision"] == "fp32", l
PY
# Training state: identical tensors (bitwise) and metadata, except the wall-clock time.
$py - full/checkpoints/step_00000040/state.safetensors split/checkpoints/step_00000040/state.safetensors <<'PY'
import json, struct, sys
def load(p):
    raw = open(p, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    h = json.loads(raw[8:8 + n])
    meta = h.pop("__metadata__")
    meta.pop("elapsed_seconds")
    meta.pop("loco.file_checksum")  # covers the whole file, elapsed time included
    return h, meta, raw[8 + n:]
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a == b, "training states differ"
PY
# The metrics after resuming are those of the uninterrupted run (timings excepted).
strip_time() { $py -c "import json,sys; [print(json.dumps({k: v for k, v in json.loads(l).items() if k not in ('time', 'comm_wait')})) for l in open(sys.argv[1])]" "$1"; }
diff <(strip_time full/metrics.jsonl) <(strip_time split/metrics.jsonl)

# A truncated file in the latest checkpoint of an unfinished run is reported, not loaded; so is
# one with garbage appended (the run state is 216 bytes: "truncating" it to 5000 appends zeros).
"$loco" train --config "$root/configs/tiny.toml" "${sets[@]}" --set train.out_dir=half --until 20 --quiet > /dev/null
cp -r half torn && truncate -s 5000 torn/checkpoints/step_00000020/replica-0.safetensors
if "$loco" train --resume torn --quiet 2> err.txt; then echo "FAIL: torn checkpoint accepted"; exit 1; fi
grep -q "truncated" err.txt
cp -r half padded && truncate -s 5000 padded/checkpoints/step_00000020/state.safetensors
if "$loco" train --resume padded --quiet 2> err.txt; then echo "FAIL: padded checkpoint accepted"; exit 1; fi
grep -q "belong to no tensor" err.txt

# The trained checkpoint loads in the PyTorch oracle and matches loco's gradients.
"$loco" grad --checkpoint full/checkpoints/step_00000040 --data data/val.tok --seq-len 32 --windows 4 \
  --out grads.safetensors > /dev/null
$py "$root/tests/oracle/llama_oracle.py" grad --checkpoint full/checkpoints/step_00000040 --data data/val.tok \
  --seq-len 32 --windows 4 --grads grads.safetensors --tol 1e-4

# Training reduced the loss; generate and plot run.
$py - full/metrics.jsonl <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
first, last = recs[0]["train_loss"], recs[-1]["train_loss"]
assert last < first - 0.5, (first, last)
assert "val_loss" in recs[-1]
PY
"$loco" generate --checkpoint full/checkpoints/step_00000040 --prompt "The cat" --max-tokens 20 --seed 1 > gen.txt
grep -q "^The cat" gen.txt
# The run directory stands for its latest checkpoint, and a checkpoint copied elsewhere carries
# its tokenizer: all three give the same text.
"$loco" generate --checkpoint full --prompt "The cat" --max-tokens 20 --seed 1 > gen-run.txt
cp -r full/checkpoints/step_00000040 alone
"$loco" generate --checkpoint alone --prompt "The cat" --max-tokens 20 --seed 1 > gen-alone.txt
cmp gen.txt gen-run.txt
cmp gen.txt gen-alone.txt
"$loco" plot full split --out loss.svg > /dev/null
grep -q "<svg" loss.svg
# --resume of a finished run says so and leaves every file of it as it was (bytes and times).
snapshot() { find full -type f -printf '%p %s %T@\n' | sort; find full -type f -exec sha256sum {} + | sort; }
snapshot > full.before
"$loco" train --resume full > again.txt
grep -q "the run is complete" again.txt
snapshot > full.after
cmp full.before full.after
# --resume with --set is refused in one line naming the key, and changes nothing.
if "$loco" train --resume full --set train.steps=80 2> err.txt; then exit 1; fi
[ "$(wc -l < err.txt)" -eq 1 ] && grep -q "^loco: error: .*--set train.steps=80" err.txt
snapshot > full.after
cmp full.before full.after
# A run whose config.toml predates train.matmul_library (its products ran through OpenBLAS) is
# continued through OpenBLAS; a new run records the library auto chose.
"$loco" train --config "$root/configs/tiny.toml" "${sets[@]}" --set train.out_dir=old --until 20 --quiet > /dev/null
tail -n 1 old/invocations.jsonl | grep -q '"matmul_library":"\(oneDNN\|OpenBLAS\)"'
sed -i '/matmul_library/d' old/config.toml
"$loco" train --resume old --quiet > /dev/null
tail -n 1 old/invocations.jsonl | grep -q '"matmul_library":"OpenBLAS"'

# A resume on other data than the checkpoint's (the files replaced since) is refused in one line
# naming both, and changes nothing; with the files put back it resumes.
mkdir -p text2 && $py "$here/../tools/make_text.py" text2 2 1500 7
"$loco" data prepare --input text2 --tokenizer bytes --val-fraction 0.1 --out data2 > /dev/null
cp -r half redata && cp data/train.tok train.bak && cp data2/train.tok data/train.tok
snap() { find redata -type f -printf '%p %s %T@\n' | sort; }
snap > redata.before
if "$loco" train --resume redata --quiet 2> err.txt; then echo "FAIL: a resume on other data accepted"; exit 1; fi
[ "$(wc -l < err.txt)" -eq 1 ] && grep -q "the run's data changed since this checkpoint (it trained on data.train .* tokens, blake2b" err.txt
snap > redata.after
cmp redata.before redata.after
cp train.bak data/train.tok
"$loco" train --resume redata --quiet > /dev/null
cmp full/checkpoints/step_00000040/model.safetensors redata/checkpoints/step_00000040/model.safetensors

echo "train_resume: OK"
