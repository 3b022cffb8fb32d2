"""fp16 training with torch's GradScaler under loco.torch: the scaler skips the optimizer's step
when the gradients hold an Inf or a NaN, and sync.step() ends that step like any other.

On the device LOCO_TEST_DEVICE names (default cuda when there is one), two in-process members,
fp16 autocast, each with its own GradScaler starting at a scale that overflows (2^24, so that
the first steps are skipped):
- DiLoCo equals plain-torch DiLoCo with the same scalers and loco.outer_step as its outer step
  (loco's own bits) to 1e-6 (0 on the H200), and the same with torch's SGD with Nesterov momentum
  to 1e-4: the two outer steps round apart by about 1e-7, which fp16 training then carries up
  (1.76e-5 on the H200 after 12 steps; 4.8e-7 with autocast off); each member's count of skipped
  steps (metrics' inner_steps_skipped) is its scaler's;
- data-parallel with sync.sync_gradients() before scaler.step() (docs/python.md): both members
  skip the same steps and stay equal.
torch 1.13's GradScaler works on CUDA only: elsewhere this says so and exits 0 (python.torch
checks skipped steps on the CPU with steps the loop leaves out). Run by scripts/gpu-session.sh.
"""
import os
import sys

import torch

dev = torch.device(os.environ.get("LOCO_TEST_DEVICE", "cuda" if torch.cuda.is_available() else "cpu"))
if dev.type != "cuda":
    print(f"skipped: torch's GradScaler needs CUDA here (device {dev})")
    sys.exit(0)
os.environ.setdefault("LOCO_TEST_DEVICE", str(dev))  # llama_torch's models and batches there too

import loco  # noqa: E402
import loco.torch  # noqa: E402
from harness import check, compare, failures, run_members  # noqa: E402
from llama_torch import _outer, _replicas, batch, make_model, make_opt, max_diff, params_of  # noqa: E402

M, STEPS, H, SCALE = 2, 12, 4, 2.0 ** 24


def train_step(model, opt, scaler, r, t, sync=None):
    """One fp16 step of replica r; whether its scaler skipped the optimizer's step."""
    x, y = batch(r, t)
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model.loss(x, y)
    scaler.scale(loss).backward()
    if sync is not None:
        sync.sync_gradients()  # data-parallel: every member unscales and checks the same averaged gradients
    before = scaler.get_scale()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    return scaler.get_scale() < before


def member(method):
    models = [make_model(r) for r in range(M)]  # here: torch's seed is global to the process

    def run(r, endpoint):
        model, scaler = models[r], torch.cuda.amp.GradScaler(init_scale=SCALE)
        opt = make_opt(model)
        sync = loco.torch.wrap(model, opt, method, endpoint=endpoint, inner_steps=H, outer_lr=0.7,
                               outer_momentum=0.9)
        skipped = 0
        for t in range(STEPS):
            skipped += train_step(model, opt, scaler, r, t, sync if method == "ddp" else None)
            sync.step()
        out = (params_of(model), skipped, sync.metrics()["inner_steps_skipped"])
        sync.close()
        return out

    return run


def reference(loco_outer):
    """Plain-torch DiLoCo with the same scalers; its outer step torch's SGD with Nesterov momentum,
    or (loco_outer) loco.outer_step on host copies, the bits of loco's own outer step."""
    models, opts = _replicas(M)
    scalers = [torch.cuda.amp.GradScaler(init_scale=SCALE) for _ in range(M)]
    outer, outer_opt = _outer(models[0], 0.7, 0.9)
    theta = [o.detach().cpu().clone() for o in outer]
    momentum = [torch.zeros_like(t) for t in theta]
    skipped = [0] * M
    for t in range(STEPS):
        for r in range(M):
            skipped[r] += train_step(models[r], opts[r], scalers[r], r, t)
        if (t + 1) % H == 0:
            with torch.no_grad():
                for i, o in enumerate(outer):
                    avg = sum(list(m.parameters())[i] for m in models) / M
                    if loco_outer:
                        loco.outer_step(theta[i], momentum[i], avg.cpu(), 0.7, 0.9)
                        o.copy_(theta[i])
                    else:
                        o.grad = o.detach() - avg
            if not loco_outer:
                outer_opt.step()
            with torch.no_grad():
                for m in models:
                    for p, o in zip(m.parameters(), outer):
                        p.copy_(o)
    return [params_of(m) for m in models], skipped


got = run_members(M, member("diloco"))
ref, ref_skipped = reference(False)
compare("diloco, fp16 with GradScaler, the reference's outer step loco.outer_step", got, reference(True)[0])
compare("diloco, fp16 with GradScaler, the reference's outer step torch's SGD", got, ref, tol=1e-4)
counts = [(g[1], g[2]) for g in got]
check(all(s > 0 and s == n for s, n in counts) and [s for s, _ in counts] == ref_skipped,
      f"diloco: each member's skipped steps (scaler, loco's metrics) {counts}, the reference's {ref_skipped}")

got = run_members(M, member("ddp"))
apart = max_diff(got[0][0], got[1][0])
finite = all(bool(torch.isfinite(p).all()) for g in got for p in g[0])
check(apart == 0 and finite and got[0][1] == got[1][1] > 0 and all(g[1] == g[2] for g in got),
      f"ddp, sync_gradients before the scaler: the members equal (max diff {apart:.1e}, finite {finite}), "
      f"the same steps skipped {[(g[1], g[2]) for g in got]}")

print(f"amp_scaler: {'FAILED' if failures else 'OK'}")
sys.exit(1 if failures else 0)
