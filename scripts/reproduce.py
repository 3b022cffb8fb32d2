#!/usr/bin/env python3
"""The reproduction study (docs/results/reproduction.md): every method on one model, one data set
and one token budget, long enough that the methods are trained, then each paper's claim next to
its measurement. Started by scripts/reproduce.sh, which fetches the data; see --help.

The study is a list of runs (PLAN). Each run trains in RUNS/NAME with --until/--resume, so a
killed study continues run by run from the last checkpoint. A finished run's record
(summary.json, metrics.jsonl, config.toml and study.json: its command and the wall time of each
invocation) is copied to RECORDS/NAME; the page is written from the records alone, so
--report-only regenerates it byte for byte."""
import os
import subprocess
import sys

import study
from study import fmt_bytes, load_record, log, pct, round10, totals

M = 4  # replicas in the main runs
BATCH = 4  # windows of seq_len tokens per replica and step

STREAM = ["algorithm=streaming", "outer.inner_steps=20", "streaming.fragment_blocks=3", "streaming.pattern=strided",
          "streaming.tau=1", "streaming.alpha=0.5", "outer.lr=0.4", "outer.momentum=0.9"]
SEED1 = ["train.seed=1", "data.seed=1235"]
PP2 = [f"distributed.replicas={M}", "pipeline.stages=2", "pipeline.microbatches=2"]
# Protocol models keep the embedding apart from the unembedding (docs/protocol.md): both pipeline runs untie them.
PIPE4 = ["distributed.replicas=1", f"data.batch_size={M * BATCH}", "pipeline.stages=4", "pipeline.microbatches=4",
         "model.tie_embeddings=false", "algorithm=ddp"]


def diloco(h, lr):
    # The papers' momentum, which this study ran with (loco's default is the parity study's 0.4).
    return ["algorithm=diloco", f"outer.inner_steps={h}", f"outer.lr={lr}", "outer.momentum=0.9"]


# name, settings (over the common ones), label, group, steps of its compute-utilization run over
# the emulated link (0: none; one outer round is not enough to see the steady state, so two).
PLAN = [
    ("ddp", ["algorithm=ddp"], "DDP", "main", 20),
    ("diloco-h20-lr0.7", diloco(20, 0.7), "DiLoCo H=20, outer lr 0.7 (DiLoCo paper)", "main", 40),
    ("diloco-h20-lr0.4", diloco(20, 0.4), "DiLoCo H=20, outer lr 0.4 (Streaming DiLoCo paper)", "main", 0),
    ("diloco-h50-lr0.7", diloco(50, 0.7), "DiLoCo H=50, outer lr 0.7", "main", 100),
    ("streaming-fp32", STREAM + ["outer.codec=fp32"], "Streaming DiLoCo fp32, H=20, tau 1, alpha 0.5, lr 0.4",
     "main", 40),
    ("streaming-fp4", STREAM + ["outer.codec=fp4-e3m0"], "Streaming DiLoCo fp4 (E3M0), otherwise as fp32", "main", 40),
    ("partial-mlp-1of2", diloco(20, 0.7) + ["partial.slices=2", "partial.strategy=mlp"],
     "Partial updates, 1/2 of the MLPs per node (DiLoCo H=20, lr 0.7)", "main", 40),
    ("partial-mlp-1of4", diloco(20, 0.7) + ["partial.slices=4", "partial.strategy=mlp"],
     "Partial updates, 1/4 of the MLPs per node (DiLoCo H=20, lr 0.7)", "main", 40),
    ("noloco-dp", ["algorithm=noloco", "noloco.inner_steps=50"], "NoLoCo, DP only, H=50 (paper settings)", "main",
     100),
    ("diloco-pp2", PP2 + diloco(50, 0.7), "DiLoCo H=50, lr 0.7, DP 4 x PP 2", "main", 100),
    ("noloco-pp2", PP2 + ["algorithm=noloco", "noloco.inner_steps=50", "noloco.routing=random"],
     "NoLoCo H=50, DP 4 x PP 2, random routing", "main", 100),
    ("pipeline4", PIPE4, "Pipeline, 4 stages, uncompressed (1 replica, untied embeddings)", "main", 20),
    ("protocol4-k32", PIPE4 + ["protocol.rank=32"], "Protocol models, 4 stages, k=32 (otherwise as pipeline)",
     "main", 20),
    ("ddp-seed1", ["algorithm=ddp"] + SEED1, "DDP, seed 1", "seed", 0),
    ("diloco-h20-lr0.4-seed1", diloco(20, 0.4) + SEED1, "DiLoCo H=20, lr 0.4, seed 1", "seed", 0),
    ("streaming-fp4-seed1", STREAM + ["outer.codec=fp4-e3m0"] + SEED1, "Streaming fp4, seed 1", "seed", 0),
    ("single", ["distributed.replicas=1", "algorithm=ddp"], "One worker alone at the per-replica batch", "reference",
     0),
    ("diloco-h20-lr1", diloco(20, 1.0), "DiLoCo H=20, outer lr 1.0", "grid", 0),
    ("diloco-h50-lr0.4", diloco(50, 0.4), "DiLoCo H=50, outer lr 0.4", "grid", 0),
    ("diloco-h50-lr1", diloco(50, 1.0), "DiLoCo H=50, outer lr 1.0", "grid", 0),
    ("diloco-h20-avg", ["algorithm=diloco", "outer.inner_steps=20", "outer.lr=1", "outer.momentum=0"],
     "Parameter averaging every 20 steps (DiLoCo H=20, lr 1, momentum 0: FedAvg)", "diagnosis", 0),
    ("diloco-h1-avg", ["algorithm=diloco", "outer.inner_steps=1", "outer.lr=1", "outer.momentum=0"],
     "Parameter averaging after every step (DiLoCo H=1, lr 1, momentum 0)", "diagnosis", 0),
    ("diloco-h5-lr0.7", diloco(5, 0.7), "DiLoCo H=5, outer lr 0.7", "diagnosis", 0),
]
# The order in which the runs train: the comparisons the page leans on most come first, so an
# interrupted study has its most informative rows.
ORDER = ["ddp", "diloco-h20-lr0.7", "single", "diloco-h20-lr0.4", "streaming-fp4", "streaming-fp32",
         "diloco-h20-avg", "ddp-seed1", "diloco-h20-lr0.4-seed1", "streaming-fp4-seed1", "diloco-h50-lr0.7",
         "noloco-dp", "partial-mlp-1of2", "partial-mlp-1of4", "diloco-h1-avg", "diloco-h5-lr0.7", "diloco-h20-lr1",
         "diloco-h50-lr0.4",
         "diloco-h50-lr1", "pipeline4", "protocol4-k32", "diloco-pp2", "noloco-pp2"]
assert sorted(ORDER) == sorted(p[0] for p in PLAN)
BY_NAME = {p[0]: p for p in PLAN}
LINK = ["network.bandwidth=100Mbit", "network.latency=30ms"]


def common(args, steps):
    return ["--config", args.config, "--set", f"distributed.replicas={M}", "--set", f"data.batch_size={BATCH}",
            "--set", f"train.steps={steps}", "--set", "train.keep_checkpoints=1", "--quiet"] + \
        [x for kv in args.set for x in ("--set", kv)]


def command(args, name, cu):
    """The loco train command of run NAME (or of its compute-utilization run), and its steps."""
    _, settings, _, _, cu_steps = BY_NAME[name]
    steps = min(cu_steps, args.steps) if cu else args.steps
    sets = (["train.eval_interval=0", "train.checkpoint_interval=0"] + LINK if cu else
            [f"train.eval_interval={round10(args.steps / 10)}", f"train.checkpoint_interval={round10(args.steps / 5)}"])
    cmd = [args.loco, "train"] + common(args, steps)
    for s in settings + sets:
        cmd += ["--set", s]
    return cmd, steps


def train(args, name, cu):
    """Trains one run (or its compute-utilization run) to the end of its budget or to --until."""
    base, target = command(args, name, cu)
    return study.train(args, ("cu-" if cu else "") + name, base, target, stoppable=not cu,
                       note=", 100 Mbit/s, 30 ms link" if cu else "")


# ---------------------------------------------------------------------------------------------
# The page, from the records only.

class Page:
    def __init__(self, records):
        self.records = records
        self.runs = {p[0]: load_record(records, p[0]) for p in PLAN}
        self.cu = {p[0]: load_record(records, "cu-" + p[0]) for p in PLAN if p[4]}
        self.lines = []

    def val(self, name):
        r = self.runs.get(name)
        return r["final_val_loss"] if r else None

    def w(self, line=""):
        self.lines.append(line)

    def gap(self, name, base="ddp"):
        a, b = self.val(name), self.val(base)
        return None if a is None or b is None else pct(a, b)

    def noise(self):
        """The largest difference between seeds 0 and 1 of one method, in percent of seed 0."""
        spreads = [abs(pct(self.val(s1), self.val(s0))) for s0, s1 in
                   (("ddp", "ddp-seed1"), ("diloco-h20-lr0.4", "diloco-h20-lr0.4-seed1"),
                    ("streaming-fp4", "streaming-fp4-seed1")) if self.val(s0) and self.val(s1)]
        return max(spreads) if spreads else None

    def compare(self, a, b):
        """'a is X% above/below b', with whether that exceeds the seed spread."""
        va, vb = self.val(a), self.val(b)
        if va is None or vb is None:
            return "not measured yet"
        d = pct(va, vb)
        n = self.noise()
        word = "above" if d > 0 else "below"
        text = f"{va:.4f} vs {vb:.4f}: {abs(d):.2f}% {word}"
        if n is None:
            return text + " (no seed spread measured yet)"
        return text + (f", within the seed spread ({n:.2f}%)" if abs(d) <= n else
                       f", more than the seed spread ({n:.2f}%)")

    def write(self):
        ddp = self.runs.get("ddp")
        cfg = ddp["config"] if ddp else None
        self.w("# Reproduction study: every method on one model, one budget")
        self.w()
        self.w("Written by `scripts/reproduce.sh` from the run records in "
               "[reproduction/](reproduction/) (summary, metrics, config and command of each run); "
               "`scripts/reproduce.sh --report-only` regenerates this page byte for byte. "
               "Nothing on it is typed by hand except the section \"Reading\", which is kept in "
               "[reproduction-reading.md](reproduction-reading.md).")
        self.w()
        done = [p[0] for p in PLAN if self.runs[p[0]]]
        self.w(f"Runs recorded: {len(done)} of {len(PLAN)} long runs, "
               f"{sum(1 for v in self.cu.values() if v)} of {len(self.cu)} compute-utilization runs.")
        missing = [p[0] for p in PLAN if not self.runs[p[0]]]
        if missing:
            self.w(f"Not run yet: {', '.join(missing)}.")
        self.w()
        if cfg:
            self.setup(ddp, cfg)
        self.main_table()
        self.seeds()
        self.references()
        self.claims()
        self.lesson()
        self.lines += study.reading(self.records, "reproduction-reading.md")
        return "\n".join(self.lines) + "\n"

    def setup(self, ddp, cfg):
        mc, dc = cfg["model"], cfg["data"]
        steps = ddp["steps"]
        tokens = ddp["tokens"]
        wall = sum(sum(r["study"]["wall_s"]) for r in list(self.runs.values()) + list(self.cu.values()) if r)
        params = ddp["workers"][0].get("trainable_params", 0)
        ent = ddp.get("unigram_entropy")
        self.w("## Setup")
        self.w()
        self.w(f"- Model: {mc['num_layers']} layers, hidden {mc['hidden_size']}, {mc['num_heads']} heads, "
               f"MLP {mc['intermediate_size']}, vocabulary {mc['vocab_size']}, {params:,} parameters "
               f"({'tied' if mc['tie_embeddings'] else 'untied'} embeddings; the pipeline runs untie them).")
        self.w(f"- Data: `{dc['train']}` (validation `{dc['val']}`, {cfg['train']['eval_windows']} windows of "
               f"{dc['seq_len']} tokens).")
        self.w(f"- Budget: {steps} steps of {M} x {BATCH} x {dc['seq_len']} = {tokens // steps:,} tokens, "
               f"{tokens:,} tokens per run (the pipeline runs: 1 replica x {M * BATCH} windows, the same tokens; "
               f"the lone worker: {BATCH} windows per step, a quarter of the tokens). "
               f"Inner AdamW lr {cfg['optimizer']['lr']} (warmup {cfg['optimizer']['warmup_steps']}, cosine to "
               f"{cfg['optimizer']['min_lr']}), the same for every method.")
        self.w(f"- Seeds: 0 (initialization `train.seed`, data order `data.seed` {dc['seed']}) for every run; "
               f"seed 1 (data seed 1235) as well for DDP, DiLoCo H=20 lr 0.4 and Streaming fp4.")
        if ent:
            below = ent - ddp["final_val_loss"]
            self.w(f"- Unigram entropy of the training tokens: {ent:.4f} nats. DDP ends {below:.3f} nats below it "
                   f"(the study asks for at least 1.5: {'met' if below >= 1.5 else 'NOT met'}).")
        machines = sorted({r["study"].get("machine", "?") for r in list(self.runs.values()) +
                           list(self.cu.values()) if r})
        self.w(f"- Wall time: {wall / 3600:.2f} h for all recorded runs ({'; '.join(machines)}), summed over "
               "the invocations that finished (a run interrupted and resumed counts its finished "
               "invocations only). Each run's command is in its record's study.json.")
        self.w("- Compute utilization (CU): from a separate short run of each method over an emulated "
               "100 Mbit/s, 30 ms link (the in-process link model; DDP and the pipelines 20 steps, the others two "
               "outer rounds), since the long runs train without a link model.")
        self.w()

    def main_table(self):
        self.w("## Methods at equal tokens")
        self.w()
        self.w("| run | method | val loss | vs DDP | bytes sent / worker | largest sync | CU at 100 Mbit/s, 30 ms |")
        self.w("|---|---|---|---|---|---|---|")
        cu_of = {"diloco-h20-lr0.4": "diloco-h20-lr0.7"}
        for name, _, label, group, _ in PLAN:
            if group != "main":
                continue
            r = self.runs[name]
            if not r:
                self.w(f"| {name} | {label} | not run yet | | | | |")
                continue
            sent, largest, _ = totals(r)
            c = self.cu.get(cu_of.get(name, name))
            cu = f"{100 * totals(c)[2]:.1f}%" if c else "not run yet"
            base = "pipeline4" if name == "protocol4-k32" else "ddp"
            g = self.gap(name, base)
            vs = "" if name == "ddp" else (f"{g:+.2f}%" + (" (vs pipeline4)" if base != "ddp" else "")
                                         if g is not None else "")
            self.w(f"| {name} | {label} | {r['final_val_loss']:.4f} | {vs} | {fmt_bytes(sent)} | "
                   f"{fmt_bytes(largest)} | {cu} |")
        self.w()
        self.w("Bytes sent: payload bytes of the method's traffic per worker over the whole run, mean over "
               "workers; largest sync: most bytes one worker sent in one synchronization (as `loco compare`).")
        self.w()
        self.w("![loss against tokens (all replicas' tokens)](reproduction-loss.png)")
        self.w()
        self.w("![loss against step (the lone worker's steps have a quarter of the tokens)](reproduction-loss-steps.png)")
        self.w()

    def seeds(self):
        self.w("## Seed spread")
        self.w()
        self.w("| method | seed 0 | seed 1 | difference |")
        self.w("|---|---|---|---|")
        for s0, s1, label in (("ddp", "ddp-seed1", "DDP"), ("diloco-h20-lr0.4", "diloco-h20-lr0.4-seed1",
                                                              "DiLoCo H=20, lr 0.4"),
                              ("streaming-fp4", "streaming-fp4-seed1", "Streaming fp4")):
            a, b = self.val(s0), self.val(s1)
            if a is None or b is None:
                cell = lambda v: "not run yet" if v is None else f"{v:.4f}"
                self.w(f"| {label} | {cell(a)} | {cell(b)} | |")
            else:
                self.w(f"| {label} | {a:.4f} | {b:.4f} | {abs(pct(b, a)):.2f}% |")
        n = self.noise()
        self.w()
        if n is not None:
            self.w(f"Below, a difference of at most {n:.2f}% (the largest of these) is called within the seed "
                   "spread: two seeds only, so this is a rough scale, not a confidence interval.")
            self.w()

    def references(self):
        self.w("## References and DiLoCo's sensitivity")
        self.w()
        s, d = self.val("single"), self.val("ddp")
        if s is not None and d is not None:
            self.w(f"One worker alone, {BATCH} windows per step, the same number of steps: {s:.4f} "
                   f"({pct(s, d):+.2f}% vs DDP; it sees a quarter of the tokens).")
            self.w()
        self.w("DiLoCo, M = 4, outer momentum 0.9 (Nesterov), every cell of the grid:")
        self.w()
        lrs = ("0.4", "0.7", "1")
        self.w("| H | " + " | ".join(f"outer lr {lr}" for lr in lrs) + " |")
        self.w("|---|" + "---|" * len(lrs))
        for h in (20, 50):
            cells = []
            for lr in lrs:
                v = self.val(f"diloco-h{h}-lr{lr}")
                cells.append("not run yet" if v is None else f"{v:.4f} ({pct(v, d):+.2f}%)" if d else f"{v:.4f}")
            self.w(f"| {h} | " + " | ".join(cells) + " |")
        self.w()
        for name, _, label, group, _ in PLAN:
            v = self.val(name)
            if group == "diagnosis" and v is not None and d is not None:
                self.w(f"- Diagnosis, {label}: {v:.4f} ({pct(v, d):+.2f}% vs DDP).")
        self.w()

    def claims(self):
        self.w("## The papers' claims, next to loco's measurements")
        self.w()
        self.w("| claim (spec) | measured |")
        self.w("|---|---|")
        rows = [
            ("Streaming DiLoCo with fp4 outer gradients matches fp32 (02-streaming)", "streaming-fp4", "streaming-fp32"),
            ("... and matches DiLoCo at the same outer lr 0.4 (02-streaming)", "streaming-fp4", "diloco-h20-lr0.4"),
            ("Partial updates with 1/4 of the MLPs match DiLoCo (03-partial; loco: 1 node per slice, "
             "the paper 8)", "partial-mlp-1of4", "diloco-h20-lr0.7"),
            ("Partial updates with 1/2 of the MLPs beat DiLoCo at equal tokens (03-partial; loco: 2 nodes per "
             "slice, the paper 16)", "partial-mlp-1of2", "diloco-h20-lr0.7"),
            ("NoLoCo is within a few percent of DiLoCo, DP only (04-noloco)", "noloco-dp", "diloco-h50-lr0.7"),
            ("NoLoCo is within a few percent of DiLoCo, DP x PP with random routing (04-noloco)", "noloco-pp2",
             "diloco-pp2"),
            ("Protocol-model compression loses nothing against the uncompressed pipeline (05-protocol)",
             "protocol4-k32", "pipeline4"),
            ("DiLoCo beats one worker at the per-replica batch (01-diloco)", "diloco-h20-lr0.7", "single"),
            ("DiLoCo approaches DDP at equal tokens (01-diloco)", "diloco-h20-lr0.7", "ddp"),
        ]
        for claim, a, b in rows:
            self.w(f"| {claim} | `{a}` vs `{b}`: {self.compare(a, b)} |")
        self.w()

    def lesson(self):
        d = self.val("ddp")
        parts = []
        for name, label in (("diloco-h20-lr0.7", "DiLoCo H=20"), ("streaming-fp4", "Streaming fp4"),
                            ("noloco-dp", "NoLoCo"), ("single", "a lone worker")):
            g = self.gap(name)
            if g is not None:
                parts.append(f"{label} {g:+.1f}%")
        n = self.noise()
        if d is None or not parts:
            return
        r = self.runs["ddp"]
        self.w("## Lesson")
        self.w()
        self.w(f"Lesson: after {r['steps']} steps ({r['tokens']:,} tokens), validation loss against DDP's "
               f"{d:.3f}: " + ", ".join(parts) + (f" (seed spread {n:.1f}%)" if n is not None else "") +
               "; docs/results/reproduction.md")
        self.w()


def plot(args):
    names = [n for n in ("ddp", "diloco-h20-lr0.7", "streaming-fp4", "noloco-dp", "single")
             if load_record(args.records, n)]
    if not names or not os.path.exists(args.loco):
        return
    for x, suffix in (("tokens", ""), ("step", "-steps")):
        out = os.path.join(os.path.dirname(args.page), f"reproduction-loss{suffix}.png")
        subprocess.run([args.loco, "plot"] + [os.path.join(args.records, n) for n in names] + ["--out", out, "--x", x],
                       check=True, stdout=subprocess.DEVNULL)


def report(args):
    study.write_page(args.page, Page(args.records).write())
    plot(args)


def main():
    p = study.arguments("Run the reproduction study (resumable) and write its page.", "reproduction", 1000,
                        "steps per run (default 1000)", "configs/small.toml")
    p.add_argument("--until", type=int, default=0, help="stop every unfinished run at this step (continue later)")
    p.add_argument("--only", default="", help="comma-separated run names (default: all; --list shows them)")
    args = p.parse_args()
    names = [n for n in args.only.split(",") if n] if args.only else ORDER
    for n in names:
        if n not in BY_NAME:
            sys.exit(f"reproduce: no run named {n!r}; the runs are: {', '.join(BY_NAME)}")
    if args.list:
        for name, _, label, group, cu in PLAN:
            have = "recorded" if load_record(args.records, name) else "pending"
            print(f"{name:24s} {group:10s} {have:9s} {label}")
        return
    if not args.report_only:
        study.prepare(args, "reproduce")
        # The compute-utilization runs last: they measure time, so they should have the machine to
        # themselves (start nothing else while they run).
        jobs = [(n, False) for n in names] + [(n, True) for n in names if BY_NAME[n][4]]
        complete = True
        for i, (n, cu) in enumerate(jobs):
            log(f"run {i + 1} of {len(jobs)}: {'cu-' if cu else ''}{n}")
            complete &= train(args, n, cu)
        log("every run finished" if complete else "stopped before the end of the budget (--until): run again "
            "without --until to finish")
    report(args)


if __name__ == "__main__":
    main()
