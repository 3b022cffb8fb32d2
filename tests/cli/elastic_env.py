#!/usr/bin/python3
"""What the elastic tests share (imported by elastic_test.py and elastic_partial.py): tiny token
files in WORK_DIR, a Redis server on a free loopback port (password-protected, given through
LOCO_REDIS_PASSWORD), a run secret in LOCO_RUN_SECRET, and helpers that start workers with
`loco train --join`, wait for them and read what they wrote.
Usage of the importing script: SCRIPT LOCO WORK_DIR"""
import json, math, os, shutil, signal, subprocess, sys, time

loco, work = os.path.abspath(sys.argv[1]), sys.argv[2]
here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
os.chdir(work)
for name, n, seed in (("train.tok", 20000, 5), ("val.tok", 3000, 6)):
    subprocess.run([sys.executable, f"{root}/tests/tools/make_tokens.py", name, "256", str(n), str(seed)], check=True)

sys.path.insert(0, f"{root}/tests/tools")
from redis_server import start_redis  # noqa: E402

redis, port, PASSWORD = start_redis()
procs = []


def cleanup():
    for p in procs:
        if p.poll() is None:
            p.kill()
    redis.kill()


BASE = [loco, "train", "--config", f"{root}/configs/tiny.toml", "--set", "data.train=train.tok", "--set",
        "data.val=val.tok", "--set", "algorithm=diloco", "--quiet", "--set", "train.checkpoint_interval=0"]
SECRET = "run-secret-" + os.urandom(12).hex()
ENV = dict(os.environ, LOCO_REDIS_PASSWORD=PASSWORD, LOCO_RUN_SECRET=SECRET)


def fail(msg):
    cleanup()
    sys.exit("FAIL: " + msg)


def start(run, name, out, extra):
    args = BASE + extra + ["--set", f"train.out_dir={out}", "--set", "elastic.address=127.0.0.1",
                           "--join", f"redis://127.0.0.1:{port}/{run}", "--worker", name]
    p = subprocess.Popen(args, env=ENV, stdout=open(f"{out}-{name}.log", "w"), stderr=subprocess.STDOUT)
    procs.append(p)
    return p


def wait_all(ps, names, out, limit=120):
    deadline = time.time() + limit
    for p, n in zip(ps, names):
        try:
            rc = p.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            fail(f"{out}/{n} still running after {limit} s:\n" + open(f"{out}-{n}.log").read())
        if rc != 0:
            fail(f"{out}/{n} exited {rc}:\n" + open(f"{out}-{n}.log").read())


def step_of(path):
    try:
        lines = open(path).read().splitlines()
        return json.loads(lines[-1])["step"] if lines else 0
    except (OSError, ValueError, KeyError, IndexError):
        return 0


def wait_step(path, step, limit=60):
    deadline = time.time() + limit
    while step_of(path) < step:
        if time.time() > deadline:
            fail(f"{path} did not reach step {step}")
        time.sleep(0.01)


def wait_dropped(path, limit=30):
    """Until the worker whose metrics are at `path` has logged a member leaving."""
    deadline = time.time() + limit
    while "left" not in open(path).read():
        if time.time() > deadline:
            fail(f"{path}: no member was dropped within {limit} s")
        time.sleep(0.02)


def kill_then_join(out, args, victim, kill_step):
    """Workers w0-w3; kill -9 `victim` past `kill_step`; once the others dropped it, a new worker
    "late" joins; waits for all to finish and returns the survivors' names."""
    names = ["w0", "w1", "w2", "w3"]
    ps = [start(out, n, out, args + ["--set", "elastic.min_workers=4"]) for n in names]
    wait_step(f"{out}/{victim}/metrics.jsonl", kill_step)
    k = names.index(victim)
    ps[k].send_signal(signal.SIGKILL)
    ps[k].wait()
    survivors = [n for n in names if n != victim]
    wait_dropped(f"{out}/{survivors[0]}/metrics.jsonl")
    wait_all([p for j, p in enumerate(ps) if j != k] + [start(out, "late", out, args)], survivors + ["late"], out)
    return survivors


def elastic(out, name):
    s = json.load(open(f"{out}/{name}/summary.json"))
    return s, s["workers"][0]["elastic"]


def rounds_by_number(out, names):
    """round -> (contributors, crc) from every worker, checking that they agree."""
    seen = {}
    for n in names:
        for r in elastic(out, n)[1]["rounds"]:
            if "contributors" not in r:
                continue
            key = r["round"]
            val = (tuple(r["contributors"]), r["params_crc32c"])
            if key in seen and seen[key] != val:
                fail(f"{out}: workers disagree on round {key}: {seen[key]} vs {val}")
            seen[key] = val
    return seen


def model_bytes(path):
    return open(path, "rb").read()


def writer_model(out, names, step=12):
    """The model written by the run's first member (lowest id); the others must have written none."""
    first = min(names, key=lambda n: elastic(out, n)[1]["member_ids"][0])
    for n in names:
        has = os.path.exists(f"{out}/{n}/checkpoints/step_{step:08d}/model.safetensors")
        if has != (n == first):
            fail(f"{out}/{n}: {'wrote' if has else 'did not write'} a model checkpoint (the writer is {first})")
    return model_bytes(f"{out}/{first}/checkpoints/step_{step:08d}/model.safetensors"), first


def redis_cli(*args):
    """One command to the test's Redis; its output."""
    return subprocess.run(["redis-cli", "-p", str(port), *args], env=dict(os.environ, REDISCLI_AUTH=PASSWORD),
                          check=True, capture_output=True, text=True, timeout=10).stdout


def redis_json(*args):
    """One command to the test's Redis; its reply decoded from redis-cli's JSON (values that hold
    a newline, as sealed entries do, intact)."""
    out = subprocess.run(["redis-cli", "-p", str(port), "--json", *args], env=dict(os.environ, REDISCLI_AUTH=PASSWORD),
                         check=True, capture_output=True, text=True, timeout=10).stdout
    return json.loads(out)


def val_loss(path):
    return json.load(open(path))["final_val_loss"]


def inprocess_loss(args, out, replicas=3):
    """The final validation loss of the same run in-process with `replicas` replicas (into `out`)."""
    subprocess.run(BASE + args + ["--set", f"distributed.replicas={replicas}", "--set", f"train.out_dir={out}",
                                  "--set", "distributed.backend=inprocess"], check=True, stdout=subprocess.DEVNULL)
    return val_loss(f"{out}/summary.json")


def expect_close(what, loss, ref, within=0.1):
    """Fails unless `loss` is finite and within `within` (relative) of the reference `ref`."""
    if not math.isfinite(loss) or abs(loss - ref) > within * ref:
        fail(f"{what}: final val loss {loss}, not within {within:.0%} of the reference's {ref}")
