#!/usr/bin/env python3
"""The quality-parity study (docs/results/parity.md): Scaling Laws for DiLoCo's Table 4 at loco's
scale. Data-parallel training and DiLoCo with M = 1, 2, 4, 8 replicas on one model, 20 tokens per
parameter of the Linux kernel's C sources (scripts/code-data.sh), a fixed global batch and H = 30,
every method with the same tuning budget. Started by scripts/reproduce.sh --study parity [--phase 32k]; see --help and PHASES.

Tuning, the same protocol for every M (the grids are GRID_* below):
  1. data-parallel at every inner learning rate of the grid, the grid extended by a factor of 2
     beyond whichever end holds data-parallel's best (so that its optimum is inside the grid);
  2. for each M, DiLoCo at data-parallel's best inner lr over every outer lr x outer momentum;
  3. then DiLoCo at that M's best outer cell over the grid's other inner lrs.
Each M thus gets 10 runs plus one per other inner lr, as data-parallel gets one per inner lr. Then a second seed of the best data-parallel and
M = 4 runs, and the best M = 4 and M = 8 settings started after data-parallel steps
(outer.start_step), as the DiLoCo paper started from a pretrained model. Four diagnoses of
M = 4's gap (diagnoses() below) run after the first M's tuning. The 32k phase then re-measures
the other methods' claims at the tuned settings (claim_runs() below).

The plan depends on earlier results, so it is computed from the records every time: a run is
named by its settings, trains in RUNS/NAME (resumable from its checkpoints, as every run of
scripts/study.py), and its record in RECORDS/NAME is what the page is written from."""
import argparse
import os
import sys

import parity_page
import study
from study import load_record, log

GRID_INNER_LR = ["1e-3", "2e-3", "4e-3", "8e-3"]  # extended by factors of 2 while data-parallel's best is at an edge
MAX_INNER_LRS = 8
GRID_OUTER_LR = ["0.2", "0.4", "0.6", "0.8", "1.0"]
GRID_MOMENTUM = ["0.9", "0.4"]
REPLICAS = [1, 4, 8, 2]  # the 8k phase's training order: M = 1 (the sharpest test) first
# Two phases of the study, each with its own records and page. "8k", the first: a global batch of
# 64 windows (8,192 tokens), 1,024 tokens per replica at M = 8, 45 outer rounds. "32k": 256
# windows (32,768 tokens), so that each replica gets 4,096 tokens at M = 8 as issue 30 asks; the
# same 20 tokens per parameter then take 337 steps (11 rounds), the warmup the same 5.2% of them
# (the same tokens), and M = 4 trains first (M = 1 already matched data-parallel in the 8k phase).
PHASES = {
    "8k": dict(global_batch=64, steps=1350, order=REPLICAS, sets=[], name="parity", claims=False),
    "32k": dict(global_batch=256, steps=337, order=[4, 8, 1, 2], sets=["optimizer.warmup_steps=18"],
                name="parity-32k", claims=True),
}
H = 30
WARM_FRACTION = 0.2  # outer.start_step of the warm-started runs, as a fraction of the steps
SEED1 = ["train.seed=1", "data.seed=1235"]
# Scaling Laws for DiLoCo (Charles et al., 2025), Table 4, 35M parameters: DiLoCo's loss against
# data-parallel's, each tuned, in percent (docs/diloco.md).
PAPER_GAP_35M = {1: -0.1, 2: 0.7, 4: 2.0, 8: 3.9}
TARGET_GAP = {1: 0.0, 4: 3.0, 8: 6.0}  # the study's targets (issue 30): the paper's shape at our scale


class Run:
    def __init__(self, name, sets, label, group, replicas=1, cell=None, batch_share=None, ref=None):
        self.name, self.sets, self.label, self.group, self.replicas = name, sets, label, group, replicas
        self.cell = cell  # DiLoCo: (inner lr, outer lr, momentum); data-parallel: (inner lr,)
        self.batch_share = batch_share or replicas  # each replica trains on global batch / batch_share
        self.ref = ref  # the run this one is compared with (the claims' table)


def dp_run(lr, seed1=False):
    name = f"dp-lr{lr}" + ("-seed1" if seed1 else "")
    return Run(name, lr_sets(lr) + ["algorithm=ddp"] + (SEED1 if seed1 else []),
               f"data-parallel, inner lr {lr}" + (", seed 1" if seed1 else ""), "seed" if seed1 else "dp",
               cell=(lr,))


def diloco_run(m, lr, olr, mom, seed1=False, warm=0):
    name = f"m{m}-lr{lr}-olr{olr}-mom{mom}" + (f"-warm{warm}" if warm else "") + ("-seed1" if seed1 else "")
    sets = lr_sets(lr) + [f"distributed.replicas={m}", "algorithm=diloco", f"outer.inner_steps={H}",
                          f"outer.lr={olr}", f"outer.momentum={mom}"]
    if warm:
        sets.append(f"outer.start_step={warm}")
    label = (f"DiLoCo M={m}, inner lr {lr}, outer lr {olr}, momentum {mom}" +
             (f", after {warm} data-parallel steps" if warm else "") + (", seed 1" if seed1 else ""))
    return Run(name, sets + (SEED1 if seed1 else []), label, "warm" if warm else "seed" if seed1 else f"m{m}", m,
               cell=(lr, olr, mom))


def diagnoses(lr):
    """Runs that say where DiLoCo M = 4's gap to data-parallel comes from, at data-parallel's best
    inner lr: a lone worker with M = 4's per-replica batch (the DiLoCo paper's baseline: DiLoCo
    should beat it), and M = 4 replicas whose parameters are only averaged (outer lr 1, no
    momentum) every H steps and every step (what is left with no outer optimizer and no
    infrequency: the replicas' own AdamW on a quarter of the batch), and every H steps with
    outer lr 2."""
    lone = Run(f"diag-lone-quarter-batch-lr{lr}", lr_sets(lr) + ["algorithm=ddp"],
               f"a lone worker with M=4's per-replica batch (a quarter of the global batch), inner lr {lr}",
               "diag", cell=(lr,), batch_share=4)
    avg = [Run(f"diag-m4-average-h{h}-lr{lr}",
               lr_sets(lr) + ["distributed.replicas=4", "algorithm=diloco", f"outer.inner_steps={h}",
                              "outer.lr=1.0", "outer.momentum=0"],
               f"M=4 parameter averaging every {f'{h} steps' if h > 1 else 'step'} (outer lr 1, momentum 0), inner lr {lr}",
               "diag", 4, cell=(lr, "1.0", "0")) for h in (H, 1)]
    # The averaged replicas move as far as one of them; outer lr 2 doubles that move (the same step
    # in the direction the replicas agree on as an outer lr of 0.2 with momentum 0.9 reaches in
    # steady state), without momentum's memory of earlier rounds.
    double = Run(f"diag-m4-olr2-mom0-h{H}-lr{lr}",
                 lr_sets(lr) + ["distributed.replicas=4", "algorithm=diloco", f"outer.inner_steps={H}",
                                "outer.lr=2.0", "outer.momentum=0"],
                 f"M=4, outer lr 2, momentum 0 every {H} steps (the averaged replicas' move doubled), inner lr {lr}",
                 "diag", 4, cell=(lr, "2.0", "0"))
    return [lone] + avg + [double]


def claim_runs(best4, best8, dp_lr):
    """Issue 30's other claims, re-measured at the tuned settings (the best M = 4 cell; partial
    updates at the best M = 8 cell): Streaming DiLoCo with fp32 outer gradients (4 fragments of
    one block) against DiLoCo, and with fp4 ones, all-gathered (quantized once, as the paper) and
    reduce-scattered, against fp32; partial updates with M = 8, each node training 1/2 and 1/4 of
    the MLPs (4 and 2 nodes per slice), against DiLoCo M = 8; NoLoCo against DiLoCo with
    momentum of its family (heavy-ball: outer.nesterov = false, the same beta and alpha); and
    protocol models (k = 12 of the 96 numbers per token of configs/parity.toml) against the
    uncompressed 2-stage pipeline, both data-parallel on one replica with an untied head, which
    protocol models need."""
    lr, olr, mom = best4.cell
    outer = [f"outer.inner_steps={H}", f"outer.lr={olr}", f"outer.momentum={mom}"]
    at4 = f"inner lr {lr}, outer lr {olr}, momentum {mom}"
    stream = lr_sets(lr) + ["distributed.replicas=4", "algorithm=streaming", "streaming.fragment_blocks=1"] + outer
    runs = [Run("c-streaming4-fp32", stream, f"Streaming DiLoCo M=4, fp32, 4 fragments of one block, {at4}", "claims",
                4, cell=best4.cell, ref=best4.name)]
    for reduce in ("all-gather", "reduce-scatter"):
        runs.append(Run(f"c-streaming4-fp4-{reduce}", stream + ["outer.codec=fp4-e3m0", f"outer.reduce={reduce}"],
                        f"the same with fp4 (e3m0) outer gradients, {reduce}", "claims", 4, cell=best4.cell,
                        ref="c-streaming4-fp32"))
    lr8, olr8, mom8 = best8.cell
    for slices, share in ((2, "1/2"), (4, "1/4")):
        runs.append(Run(f"c-partial8-slices{slices}",
                        diloco_run(8, lr8, olr8, mom8).sets + [f"partial.slices={slices}"],
                        f"DiLoCo M=8, each node trains {share} of the MLPs ({8 // slices} nodes per slice), "
                        f"inner lr {lr8}, outer lr {olr8}, momentum {mom8}", "claims", 8, cell=best8.cell,
                        ref=best8.name))
    runs.append(Run("c-streaming4-fp32-paper-outer", lr_sets(lr) + ["distributed.replicas=4", "algorithm=streaming",
                                                             "streaming.fragment_blocks=1",
                                                             f"outer.inner_steps={H}", "outer.lr=0.4",
                                                             "outer.momentum=0.9"],
                    f"Streaming DiLoCo M=4, fp32, at the Streaming DiLoCo paper's outer lr 0.4 and momentum 0.9, "
                    f"inner lr {lr}", "claims", 4, cell=best4.cell, ref="c-streaming4-fp32"))
    runs.append(Run("c-diloco4-heavyball", diloco_run(4, lr, olr, mom).sets + ["outer.nesterov=false"],
                    f"DiLoCo M=4 with heavy-ball outer momentum (not Nesterov), {at4}", "claims", 4, cell=best4.cell,
                    ref=best4.name))
    runs.append(Run("c-noloco4", lr_sets(lr) + ["distributed.replicas=4", "algorithm=noloco",
                                                f"noloco.inner_steps={H}", f"noloco.outer_lr={olr}",
                                                f"noloco.momentum={mom}"],
                    f"NoLoCo M=4 (groups of 2, heavy-ball beta {olr}, alpha {mom}, pull = beta), inner lr {lr}",
                    "claims", 4, cell=best4.cell, ref="c-diloco4-heavyball"))
    pipe = lr_sets(dp_lr) + ["algorithm=ddp", "model.tie_embeddings=false", "pipeline.stages=2",
                             "pipeline.microbatches=4"]
    runs.append(Run("c-pipeline2", pipe, f"data-parallel as a 2-stage pipeline (4 microbatches), untied head, "
                                         f"inner lr {dp_lr}", "claims", cell=(dp_lr,), ref=None))
    runs.append(Run("c-protocol2-k12", pipe + ["protocol.rank=12"],
                    "the same with protocol models: 12 numbers per token cross the stage boundary instead of "
                    "the hidden size's",
                    "claims", cell=(dp_lr,), ref="c-pipeline2"))
    return runs


def lr_sets(lr):
    # The schedule's floor follows the peak: cosine from lr to lr / 10.
    return [f"optimizer.lr={lr}", f"optimizer.min_lr={float(lr) / 10:g}"]


def val(records, name):
    r = load_record(records, name)
    return r["final_val_loss"] if r else None


def best(records, runs):
    """The run of RUNS with the lowest final validation loss, or None unless all are recorded."""
    vals = [(val(records, r.name), r) for r in runs]
    if any(v is None for v, _ in vals):
        return None
    return min(vals, key=lambda x: x[0])[1]


def lr_name(x):
    """1e-3, 1.6e-2: the shortest mantissa, exponent without padding."""
    m, e = f"{x:.1e}".split("e")
    return f"{m.rstrip('0').rstrip('.')}e{int(e)}"


def inner_grid(records):
    """The inner-lr grid as far as the records decide it, and whether data-parallel's runs over
    it are all recorded (its best then lies inside it, or the grid has MAX_INNER_LRS values)."""
    grid = list(GRID_INNER_LR)
    while True:
        b = best(records, [dp_run(lr) for lr in grid])
        if not b or len(grid) >= MAX_INNER_LRS:
            return grid, b is not None
        if b.cell[0] == grid[-1]:
            grid.append(lr_name(float(grid[-1]) * 2))
        elif b.cell[0] == grid[0]:
            grid.insert(0, lr_name(float(grid[0]) / 2))
        else:
            return grid, True


def plan(records, steps, order=REPLICAS, claims=False):
    """Every run of the study in training order, as far as the records decide it: the runs after a
    choice that needs unrecorded results are not listed yet (the returned flag says so), and the
    inner-lr grid."""
    grid, decided = inner_grid(records)
    runs = [dp_run(lr) for lr in grid]
    if not decided:
        return runs, False, grid
    best_dp = best(records, runs)
    dp_lr = best_dp.cell[0]
    best_m = {}
    for i, m in enumerate(order):
        if i == 1:  # after the first M's tuning
            runs += diagnoses(dp_lr)
        stage_a = [diloco_run(m, dp_lr, olr, mom) for mom in GRID_MOMENTUM for olr in GRID_OUTER_LR]
        runs += stage_a
        best_a = best(records, stage_a)
        if not best_a:
            return runs, False, grid
        _, olr, mom = best_a.cell
        stage_b = [diloco_run(m, lr, olr, mom) for lr in grid if lr != dp_lr]
        runs += stage_b
        best_m[m] = best(records, stage_a + stage_b)
        if not best_m[m]:
            return runs, False, grid
    runs.append(dp_run(dp_lr, seed1=True))
    runs.append(diloco_run(4, *best_m[4].cell, seed1=True))
    warm = max(1, int(steps * WARM_FRACTION))
    for m in (4, 8):
        runs.append(diloco_run(m, *best_m[m].cell, warm=warm))
    if claims:
        runs += claim_runs(best_m[4], best_m[8], dp_lr)
    return runs, True, grid


def command(args, run):
    windows = args.global_batch // run.batch_share
    cmd = [args.loco, "train", "--config", args.config, "--quiet"]
    # fp32 products through OpenBLAS in every run: the library of the study's first runs, before
    # train.matmul_library existed (auto would pick oneDNN on AVX-512 CPUs: other rounding).
    for s in [f"data.batch_size={windows}", f"train.steps={args.steps}", "train.keep_checkpoints=1",
              "train.matmul_library=openblas",
              f"train.eval_interval={study.round10(args.steps / 9)}",
              f"train.checkpoint_interval={study.round10(args.steps / 9)}"] + run.sets + args.set:
        cmd += ["--set", s]
    return cmd


def check_args(args):
    for m in REPLICAS:
        if args.global_batch % m:
            sys.exit(f"parity: --global-batch {args.global_batch} must be divisible by every M ({REPLICAS})")


def arguments():
    """The command line, with the defaults of the phase it names (--phase, default 8k)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--phase", choices=sorted(PHASES), default="8k")
    ph = PHASES[pre.parse_known_args()[0].phase]
    p = study.arguments("Run the quality-parity study (resumable) and write its page.", ph["name"], ph["steps"],
                        "steps per run (default: 20.4 tokens per parameter of configs/parity.toml's model at the "
                        "phase's global batch: 1350 for 8k, 337 for 32k)", "configs/parity.toml")
    p.add_argument("--phase", choices=sorted(PHASES), default="8k",
                   help="8k: a global batch of 64 windows of 128 tokens (docs/results/parity.md); 32k: 256 windows, "
                        "4,096 tokens per replica at M = 8 (docs/results/parity-32k.md)")
    p.add_argument("--until", type=int, default=0, help="stop the current run at this step (continue later)")
    p.add_argument("--max-runs", type=int, default=0, help="train at most this many runs, then write the page")
    p.add_argument("--global-batch", type=int, default=ph["global_batch"],
                   help="windows per step over all replicas (default: 64 for 8k, 256 for 32k)")
    args = p.parse_args()
    args.order, args.set, args.claims = ph["order"], ph["sets"] + args.set, ph["claims"]
    args.name = os.path.splitext(os.path.basename(args.page))[0]
    return args


def main():
    args = arguments()
    if args.list:
        runs, complete, _ = plan(args.records, args.steps, args.order, args.claims)
        for r in runs:
            print(f"{r.name:34s} {r.group:6s} {'recorded' if load_record(args.records, r.name) else 'pending':9s} "
                  f"{r.label}")
        if not complete:
            print("(later runs depend on the results of these)")
        return
    if not args.report_only:
        check_args(args)
        study.prepare(args, "parity")
        trained = 0
        while True:
            runs, complete, _ = plan(args.records, args.steps, args.order, args.claims)
            todo = [r for r in runs if not load_record(args.records, r.name)]
            if not todo or (args.max_runs and trained >= args.max_runs):
                break
            run = todo[0]
            log(f"run {len(runs) - len(todo) + 1} of {len(runs)}{'' if complete else '+'}: {run.name}")
            if not study.train(args, run.name, command(args, run), args.steps):
                log("stopped before the end of the budget (--until): run again without --until to finish")
                break
            trained += 1
            study.write_page(args.page, parity_page.write(args, plan))  # the page always shows every record
        if not todo and complete:
            log("every run finished")
    study.write_page(args.page, parity_page.write(args, plan))


if __name__ == "__main__":
    main()
