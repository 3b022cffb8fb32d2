"""What the studies of scripts/reproduce.sh share (reproduce.py: the small-batch study; parity.py:
the quality-parity study): training one run resumably into its directory, its record (summary.json,
metrics.jsonl, config.toml and study.json: its command, machine and the wall time of each
invocation), and reading records back for the pages."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def round10(x):
    return max(10, int(x) // 10 * 10)


def machine():
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), model)
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {model}"


def finished_steps(run_dir):
    try:
        with open(os.path.join(run_dir, "summary.json")) as f:
            return json.load(f)["steps"]
    except (OSError, ValueError, KeyError):
        return 0


def has_checkpoint(run_dir):
    d = os.path.join(run_dir, "checkpoints")
    return os.path.isdir(d) and any(e.startswith("step_") for e in os.listdir(d))


def train(args, key, base, target, stoppable=True, note="", may_fail=False):
    """Trains run KEY (loco train command BASE, TARGET steps) to the end of its budget, or to
    args.until when STOPPABLE, resuming it from its checkpoint; copies its record to
    args.records/KEY when it is complete. Returns whether it is complete. A run that fails stops
    the study, unless MAY_FAIL: its record then holds what it wrote, and study.json its exit code
    and last error line ("failed", "error")."""
    record = os.path.join(args.records, key)
    if os.path.exists(os.path.join(record, "study.json")):
        return True
    run_dir = os.path.join(args.out, key)
    study_file = os.path.join(args.out, key + ".study.json")
    study = {"command": [os.path.relpath(base[0]) if os.path.isabs(base[0]) else base[0]] + base[1:],
             "wall_s": [], "machine": machine()}
    if os.path.exists(study_file):
        with open(study_file) as f:
            study["wall_s"] = json.load(f)["wall_s"]
    if args.until and stoppable and args.until < target and finished_steps(run_dir) >= args.until and \
            has_checkpoint(run_dir):
        log(f"{key}: at step {finished_steps(run_dir)} of {target} (--until {args.until})")
        return False
    if has_checkpoint(run_dir):
        with open(os.path.join(run_dir, "config.toml"), "rb") as f:
            started = tomllib.load(f)["train"]["steps"]
        if started != target:
            sys.exit(f"reproduce: {run_dir} was started with {started} steps, not {target}: run with "
                     f"--steps {started}, or remove {run_dir} to start it over")
        cmd = [args.loco, "train", "--resume", run_dir, "--quiet"]
        log(f"{key}: resuming from its latest checkpoint")
    else:
        cmd = base + ["--set", f"train.out_dir={run_dir}", "--overwrite"]
        log(f"{key}: starting ({target} steps{note})")
    if args.until and stoppable and args.until < target:
        cmd += ["--until", str(args.until)]
    os.makedirs(args.out, exist_ok=True)
    start = time.monotonic()
    with open(os.path.join(args.out, key + ".log"), "a") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode
    study["wall_s"].append(round(time.monotonic() - start, 1))
    with open(study_file + ".tmp", "w") as f:
        json.dump(study, f)
    os.replace(study_file + ".tmp", study_file)
    if rc != 0 and not may_fail:
        sys.exit(f"reproduce: {key} failed (exit {rc}); see {os.path.join(args.out, key + '.log')}")
    if rc != 0:
        with open(os.path.join(args.out, key + ".log")) as f:
            errors = [l.strip() for l in f if l.startswith("loco: error")]
        study["failed"], study["error"] = rc, errors[-1] if errors else ""
    done = finished_steps(run_dir)
    if done < target and rc == 0:
        log(f"{key}: stopped at step {done} of {target}")
        return False
    os.makedirs(record + ".tmp", exist_ok=True)
    for f in ("summary.json", "metrics.jsonl", "config.toml"):
        if rc == 0 or os.path.exists(os.path.join(run_dir, f)):
            shutil.copyfile(os.path.join(run_dir, f), os.path.join(record + ".tmp", f))
    study["steps"] = target
    with open(os.path.join(record + ".tmp", "study.json"), "w") as f:
        json.dump(study, f, indent=1)
        f.write("\n")
    shutil.rmtree(record, ignore_errors=True)
    os.replace(record + ".tmp", record)
    if rc != 0:
        log(f"{key}: failed (exit {rc}) as it may: {study['error']}")
        return True
    s = load_record(args.records, key)
    log(f"{key}: done, final val loss {s['final_val_loss']:.4f}, {sum(study['wall_s']):.0f} s")
    return True


def prepare(args, name):
    """Before training: the program must exist and the records directory is made."""
    if not os.access(args.loco, os.X_OK):
        sys.exit(f"{name}: {args.loco} not found; build first (scripts/build.sh)")
    os.makedirs(args.records, exist_ok=True)


def load_record(records, key):
    path = os.path.join(records, key)
    if not os.path.exists(os.path.join(path, "study.json")):
        return None
    s = {}
    if os.path.exists(os.path.join(path, "summary.json")):  # a failed run may have none
        with open(os.path.join(path, "summary.json")) as f:
            s = json.load(f)
    with open(os.path.join(path, "study.json")) as f:
        s["study"] = json.load(f)
    with open(os.path.join(path, "config.toml"), "rb") as f:
        s["config"] = tomllib.load(f)
    return s


def totals(s):
    """Per-worker training bytes sent (mean), largest sync (max) and mean CU, as `loco compare`
    (the synchronizations are comm/stats.cpp's is_sync_traffic)."""
    sent, largest, cu = 0.0, 0.0, 0.0
    sync_ops = ("gradients", "outer_gradients", "outer_progress", "outer_weights")
    for w in s["workers"]:
        sent += w["train_bytes_sent"]
        for op, v in (w.get("by_operation") or {}).items():
            if op in sync_ops:
                largest = max(largest, v.get("largest_instance_bytes_sent", 0))
        cu += w.get("compute_utilization", 0)
    n = len(s["workers"])
    return sent / n, largest, cu / n


def fmt_bytes(b):
    if b == 0:
        return "0"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= scale:
            return f"{b / scale:.3g} {unit}"
    return f"{b:.0f} B"


def pct(x, base):
    return 100.0 * (x / base - 1.0)


def write_page(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    log(f"wrote {path}")


def reading(records, name):
    """The lines of a page's hand-written "Reading" section: NAME beside the records directory
    (nothing when it does not exist)."""
    path = os.path.join(os.path.dirname(records.rstrip("/")), name)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return ["## Reading", ""] + f.read().rstrip("\n").split("\n") + [""]


def arguments(description, name, steps, steps_help, config):
    """The options both studies take; NAME is the study's directory and page name."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--report-only", action="store_true", help="only regenerate the page from the records")
    p.add_argument("--list", action="store_true", help="list the runs and whether each is recorded")
    p.add_argument("--steps", type=int, default=steps, help=steps_help)
    p.add_argument("--config", default=config)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key in every run (repeatable), e.g. data paths")
    p.add_argument("--out", default=f"runs/{name}", help="run directories (checkpoints)")
    p.add_argument("--records", default=f"docs/results/{name}", help="finished runs' records")
    p.add_argument("--page", default=f"docs/results/{name}.md")
    p.add_argument("--loco", default="build/loco")
    return p
