"""docs/results/parity.md (and parity-32k.md), written from the quality-parity study's records alone
(scripts/parity.py), so that --report-only regenerates it byte for byte. Only the section "Reading"
is typed by hand, in NAME-reading.md beside the page."""
import os

import parity as P
import study
from study import fmt_bytes, load_record, pct, totals


class Page:
    def __init__(self, args, runs, complete, grid):
        self.args, self.records = args, args.records
        self.runs, self.complete, self.grid = runs, complete, grid
        self.rec = {r.name: load_record(self.records, r.name) for r in runs}
        self.lines = []

    def w(self, line=""):
        self.lines.append(line)

    def val(self, name):
        r = self.rec.get(name)
        return r["final_val_loss"] if r else None

    def best_of(self, group):
        done = [(self.val(r.name), r) for r in self.runs if r.group == group and self.val(r.name) is not None]
        return min(done, key=lambda x: x[0])[1] if done else None

    def cell(self, name, base):
        v = self.val(name)
        if v is None:
            return "not run yet" if name in self.rec else ""
        return f"{v:.4f}" + (f" ({pct(v, base):+.2f}%)" if base else "")

    def write(self):
        recorded = sum(1 for v in self.rec.values() if v)
        a = self.args
        phase = "" if a.phase == "8k" else f" --phase {a.phase}"
        rec = os.path.basename(self.records.rstrip("/"))
        self.w("# Quality parity: DiLoCo against data-parallel training at 20 tokens per parameter, "
               f"global batch {a.global_batch} windows")
        self.w()
        self.w(f"Written by `scripts/reproduce.sh --study parity{phase}` (scripts/parity.py) from the run records in "
               f"[{rec}/]({rec}/) (summary, metrics, config and command of each run); "
               f"`scripts/reproduce.sh --study parity{phase} --report-only` regenerates this page byte for byte. "
               "Nothing on it is typed by hand except the section \"Reading\" "
               f"([{a.name}-reading.md]({a.name}-reading.md)).")
        self.w()
        self.w(f"Runs recorded: {recorded} of the {len(self.runs)} decided so far" +
               ("" if self.complete else " (the tuning protocol decides the later runs from these results)") + ".")
        self.w()
        dp = self.best_of("dp")
        if not dp:
            return self.finish()
        base = self.val(dp.name)
        self.setup(self.rec[dp.name])
        self.headline(dp, base)
        self.lesson(base)
        self.dp_grid(base)
        for m in sorted(P.REPLICAS):
            self.m_grid(m, base)
        self.diagnoses(base)
        self.extras(dp, base)
        self.claims(base)
        return self.finish()

    def finish(self):
        self.lines += study.reading(self.records, f"{self.args.name}-reading.md")
        return "\n".join(self.lines) + "\n"

    def setup(self, r):
        cfg = r["config"]
        mc, dc, oc = cfg["model"], cfg["data"], cfg["optimizer"]
        params = r["workers"][0].get("trainable_params", 0)
        tokens, steps = r["tokens"], r["steps"]
        per_step = tokens // steps
        wall = sum(sum(x["study"]["wall_s"]) for x in self.rec.values() if x)
        machines = sorted({x["study"].get("machine", "?") for x in self.rec.values() if x})
        self.w("## Setup")
        self.w()
        self.w(f"- Model: {mc['num_layers']} layers, hidden {mc['hidden_size']}, {mc['num_heads']} heads, "
               f"MLP {mc['intermediate_size']}, vocabulary {mc['vocab_size']}, "
               f"{'tied' if mc['tie_embeddings'] else 'untied'} embeddings: {params:,} parameters.")
        ent = r.get("unigram_entropy")
        self.w(f"- Data: `{dc['train']}` (validation `{dc['val']}`, {cfg['train']['eval_windows']} windows of "
               f"{dc['seq_len']} tokens)" + (f"; unigram entropy of the training tokens {ent:.4f} nats" if ent else "") +
               (f"; {r['train_data_tokens']:,} training tokens, of which a run reads "
                f"{r['tokens'] / r['train_data_tokens']:.1%}" if r.get("train_data_tokens") else "") + ".")
        self.w(f"- Budget: {steps} steps of {per_step:,} tokens (a fixed global batch of {per_step // dc['seq_len']} "
               f"windows), {tokens:,} tokens per run, {tokens / params:.1f} tokens per parameter. Per replica and "
               "step: " + ", ".join(f"M={m} {per_step // m:,}" for m in sorted(P.REPLICAS)) + " tokens.")
        self.w(f"- DiLoCo: H = {P.H} inner steps per round ({-(-steps // P.H)} rounds), Nesterov outer momentum, "
               f"inner AdamW (beta2 {oc.get('beta2', 0.95)}, weight decay {oc['weight_decay']}, clip {oc['clip']}) "
               f"with its state kept across rounds. Every run: warmup {oc['warmup_steps']} steps, cosine to a tenth "
               "of the peak lr.")
        self.w(f"- Tuning, the same for every M: data-parallel at inner lr {', '.join(self.grid)} (the grid "
               f"{', '.join(P.GRID_INNER_LR)}, extended by factors of 2 while data-parallel's best was at an end); "
               "DiLoCo at "
               f"data-parallel's best inner lr over outer lr {', '.join(P.GRID_OUTER_LR)} x momentum "
               f"{', '.join(P.GRID_MOMENTUM)}, then at that M's best outer cell over the other inner lrs.")
        self.w(f"- Wall time: {wall / 3600:.2f} h for the recorded runs ({'; '.join(machines)}), summed over the "
               "invocations that finished. Each run's command is in its record's study.json.")
        self.w()

    def headline(self, dp, base):
        self.w("## Best of each method")
        self.w()
        self.w("| method | best run | val loss | vs data-parallel | paper, 35M (Table 4) | target | bytes sent / worker |")
        self.w("|---|---|---|---|---|---|---|")
        sent = totals(self.rec[dp.name])[0]
        self.w(f"| data-parallel | `{dp.name}` | {base:.4f} | | | | {fmt_bytes(sent)} |")
        for m in sorted(P.REPLICAS):
            b = self.best_of(f"m{m}")
            if not b:
                self.w(f"| DiLoCo M={m} | not run yet | | | {P.PAPER_GAP_35M[m]:+.1f}% | | |")
                continue
            v = self.val(b.name)
            target = P.TARGET_GAP.get(m)
            if not self.tuned(m):  # the best so far, not yet the tuned one: no verdict
                met = f"tuning: {self.tuning_done(m)} of {10 + len(self.grid) - 1} runs so far"
            elif target is None:
                met = ""
            else:
                met = f"<= {target:+.0f}%: " + ("met" if pct(v, base) <= target else "NOT met")
            self.w(f"| DiLoCo M={m} | `{b.name}` | {v:.4f} | {pct(v, base):+.2f}% | {P.PAPER_GAP_35M[m]:+.1f}% | "
                   f"{met} | {fmt_bytes(totals(self.rec[b.name])[0])} |")
        self.w()
        seeds = any(r.group == "seed" and self.val(r.name) is not None for r in self.runs)
        self.w("Bytes sent: payload bytes of each method's synchronizations per worker over the run, mean over workers "
               "(data-parallel: one worker with the whole batch sends nothing; with M workers it would all-reduce "
               "its gradients every step). A best run chosen among several cells is favoured by the noise of the "
               "choice; the second-seed runs" +
               (" (section \"Seeds and warm starts\") give" if seeds else ", once recorded, give") +
               " the scale of that noise.")
        self.w()

    def tuning_done(self, m):
        return sum(1 for r in self.runs if r.group == f"m{m}" and self.val(r.name) is not None)

    def tuned(self, m):
        """Whether M's tuning (10 outer cells, then the other inner lrs) is recorded in full."""
        planned = sum(1 for r in self.runs if r.group == f"m{m}")
        return self.tuning_done(m) == planned == 10 + len(self.grid) - 1

    def lesson(self, base):
        """One line, the study in brief, for the demo's closing lines (scripts/demo.sh)."""
        cells = []
        for m in sorted(P.REPLICAS):
            b = self.best_of(f"m{m}")
            if b and self.tuned(m):
                _, olr, mom = b.cell
                cells.append((m, f"M={m} {pct(self.val(b.name), base):+.2f}% (outer lr {olr}, momentum {mom})"))
        if not cells:
            return
        dp = self.rec[self.best_of("dp").name]
        self.w("## Lesson")
        self.w()
        self.w(f"Lesson: at 20 tokens per parameter with a global batch of {dp['tokens'] // dp['steps']:,} tokens, "
               "every method tuned alike, the best DiLoCo run against the best data-parallel one (each M whose "
               "tuning is complete): " + ", ".join(c for _, c in cells) +
               "; Scaling Laws for DiLoCo at 35M parameters: " +
               ", ".join(f"M={m} {P.PAPER_GAP_35M[m]:+.1f}%" for m, _ in cells) + f"; docs/results/{self.args.name}.md")
        self.w()

    def dp_grid(self, base):
        self.w("## Data-parallel, inner learning rate")
        self.w()
        self.w("| inner lr | val loss (vs best) |")
        self.w("|---|---|")
        for lr in self.grid:
            self.w(f"| {lr} | {self.cell(P.dp_run(lr).name, base)} |")
        self.w()

    def m_grid(self, m, base):
        a = [r for r in self.runs if r.group == f"m{m}"]
        if not a:
            return
        lr_a = a[0].cell[0]
        self.w(f"## DiLoCo, M = {m}")
        self.w()
        self.w(f"Outer lr x momentum at inner lr {lr_a} (val loss, vs best data-parallel):")
        self.w()
        self.w("| momentum | " + " | ".join(f"outer lr {o}" for o in P.GRID_OUTER_LR) + " |")
        self.w("|---|" + "---|" * len(P.GRID_OUTER_LR))
        for mom in P.GRID_MOMENTUM:
            cells = [self.cell(P.diloco_run(m, lr_a, o, mom).name, base) for o in P.GRID_OUTER_LR]
            self.w(f"| {mom} | " + " | ".join(cells) + " |")
        self.w()
        b = [r for r in a if r.cell[0] != lr_a]
        if b:
            _, olr, mom = b[0].cell
            self.w(f"Inner lr at the best cell (outer lr {olr}, momentum {mom}):")
            self.w()
            self.w("| inner lr | val loss (vs best data-parallel) |")
            self.w("|---|---|")
            for lr in self.grid:
                self.w(f"| {lr} | {self.cell(P.diloco_run(m, lr, olr, mom).name, base)} |")
            self.w()

    def diagnoses(self, base):
        rows = [r for r in self.runs if r.group == "diag"]
        if not rows:
            return
        m4 = self.best_of("m4")
        self.w("## Diagnoses of M = 4's gap")
        self.w()
        so_far = "" if self.tuned(4) else " so far"
        self.w("| run | what | val loss | vs best data-parallel | vs " +
               (f"the best M=4 run{so_far} (`{m4.name}`)" if m4 else "the best M=4 run (none yet)") +
               " | bytes sent / worker |")
        self.run_rows(rows, base, lambda r: self.val(m4.name) if m4 else None)

    def run_rows(self, rows, base, reference):
        """A table's rows, one per run: its val loss against data-parallel's best and against
        reference(run) (blank when None), and the bytes a worker sent, then a blank line."""
        self.w("|---|---|---|---|---|---|")
        for r in rows:
            v, ref = self.val(r.name), reference(r)
            if v is None:
                self.w(f"| `{r.name}` | {r.label} | not run yet | | | |")
            else:
                self.w(f"| `{r.name}` | {r.label} | {v:.4f} | {pct(v, base):+.2f}% | "
                       f"{'' if ref is None else f'{pct(v, ref):+.2f}%'} | "
                       f"{fmt_bytes(totals(self.rec[r.name])[0])} |")
        self.w()

    def extras(self, dp, base):
        rows = [r for r in self.runs if r.group in ("seed", "warm")]
        if not rows:
            return
        self.w("## Seeds and warm starts")
        self.w()
        self.w("| run | what | val loss | vs best data-parallel | vs the same settings from scratch, seed 0 | "
               "bytes sent / worker |")
        self.run_rows(rows, base, lambda r: self.val(r.name.replace("-seed1", "").split("-warm")[0]))

    def claims(self, base):
        rows = [r for r in self.runs if r.group == "claims"]
        if not rows:
            return
        self.w("## Other claims at the tuned settings")
        self.w()
        self.w("Each run against the run it tests a claim against (its reference); bytes: what a worker sent "
               "over the run, mean over workers (a pipeline's stages send activations and their gradients).")
        self.w()
        self.w("| run | what | val loss | vs best data-parallel | reference | vs reference | bytes sent / worker |")
        self.w("|---|---|---|---|---|---|---|")
        for r in rows:
            v = self.val(r.name)
            ref = f"`{r.ref}`" if r.ref else ""
            if v is None:
                self.w(f"| `{r.name}` | {r.label} | not run yet | | {ref} | | |")
                continue
            rv = self.val(r.ref) if r.ref else None
            self.w(f"| `{r.name}` | {r.label} | {v:.4f} | {pct(v, base):+.2f}% | {ref} | "
                   f"{'' if rv is None else f'{pct(v, rv):+.2f}%'} | {fmt_bytes(totals(self.rec[r.name])[0])} |")
        self.w()


def write(args, plan):
    return Page(args, *plan(args.records, args.steps, args.order, args.claims)).write()
