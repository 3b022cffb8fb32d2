"""loco.torch's partial parameter updates: each member's slices of the MLP projections become
parameters of their own (python/loco/_partial.py), against the masked plain-torch reference, on
the CPU path and the device path (LOCO_TORCH_AS_DEVICE=1), with what the rewrite saves: no
gradient and no optimizer state for the frozen slices. Run by ctest as python.partial."""
import copy
import os
import sys

import torch

import loco
import loco.torch
from harness import TOL, check, compare, expect_error, failures, run_loco, run_members
from llama_torch import (batch, inner_step, make_model, make_opt, max_diff, params_of, reference_diloco,
                         reference_partial)
from loco import _partial

torch.set_num_threads(1)
MLP = ("gate_proj.weight", "up_proj.weight", "down_proj.weight")
NAMES = [n for n, _ in make_model(0).named_parameters()]
SHAPES = {n: p.shape for n, p in make_model(0).named_parameters()}
SLICED = sum(p.numel() for n, p in make_model(0).named_parameters() if n.endswith(MLP))
TOTAL = sum(p.numel() for p in make_model(0).parameters())

# 1. The rewritten module computes what nn.Linear computes: the same loss (its product is
# nn.Linear's, with the whole weight), every input gradient and the slice's weight gradient to
# float rounding (the slice's product is a part of the whole one), in float32 and under autocast.
full = make_model(0)
cut = copy.deepcopy(full)
for name, m in list(cut.named_modules()):
    kind = name.rsplit(".", 1)[-1]
    if kind + ".weight" in MLP:
        dim = 1 if kind == "down_proj" else 0
        w = m.weight.detach().clone()
        f = w.shape[dim]
        lo, hi = f // 4, f // 2  # a middle slice: frozen units on both sides
        _partial.slice_linear(m, w, w[:, lo:hi] if dim else w[lo:hi], dim, lo, hi)
x, y = batch(0, 0)


def losses_and_gradients(autocast):
    for m in (full, cut):
        m.zero_grad(set_to_none=True)
    with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16, enabled=autocast):
        la, lb = full.loss(x, y), cut.loss(x, y)
    la.backward()
    lb.backward()
    worst = 0.0
    ref = dict(full.named_parameters())
    for n, p in cut.named_parameters():
        g = ref[n.replace("weight_slice", "weight")].grad
        if n.endswith("weight_slice"):
            f = g.shape[1] if "down_proj" in n else g.shape[0]
            g = g[:, f // 4:f // 2] if "down_proj" in n else g[f // 4:f // 2]
        worst = max(worst, float((g - p.grad).abs().max() / g.abs().max()))
    return float(la), float(lb), worst


# The slice's weight gradient is a product of another shape than nn.Linear's whole one, which a
# BLAS may sum in another order: measured 0 (the same bits) on an Intel Xeon, in float32 and under
# bf16 autocast. Held to 1e-5 and, with bf16's 8-bit mantissas (2^-9 relative per rounding, over
# two layers), to 5e-2: far below what a wrong slice or a missing term gives (of the order of 1;
# the former forward, split in two or three products, was 8.2e-3 off under autocast).
for autocast, tol in ((False, 1e-5), (True, 5e-2)):
    la, lb, worst = losses_and_gradients(autocast)
    check(la == lb and worst <= tol,
          f"sliced projections{', bf16 autocast' if autocast else ''}: loss {la:.6f} vs {lb:.6f} (the same bits), "
          f"gradients within {worst:.1e} of the largest (relative) of nn.Linear's")
frozen = [m for m in cut.modules() if hasattr(m, "weight_slice")]
check(len(frozen) == 6 and all(m.weight.grad is None and not m.weight.requires_grad for m in frozen),
      "sliced projections: the frozen weight is a buffer without a gradient")
sd = cut.state_dict()
check(list(sd) == list(full.state_dict()) and all(sd[n].shape == SHAPES[n] for n in NAMES),
      "sliced projections: the state_dict has the original keys and shapes")
fresh = make_model(3)
cut.load_state_dict(fresh.state_dict())
m = cut.layers[1].down_proj
check(torch.equal(m.weight, fresh.layers[1].down_proj.weight) and torch.equal(m.weight_slice, m.weight[:, 12:24])
      and max_diff(params_of(cut), params_of(fresh)) == 0, "sliced projections: load_state_dict fills the slice too")

# A model sliced by an earlier wrap (closed or not) holds only that member's slices as parameters:
# wrapped again, its members' different slices would be averaged as one. Refused; a new model
# loaded from its state_dict (the whole weights) wraps.
expect_error("a sliced model wrapped again", "sliced by an earlier wrap() with partial updates",
             lambda: loco.torch.wrap(cut, make_opt(cut), "diloco", endpoint=loco.inprocess(1)[0]))
again = make_model(4)
again.load_state_dict(cut.state_dict())
loco.torch.wrap(again, make_opt(again), "diloco", endpoint=loco.inprocess(1)[0]).close()
check(max_diff(params_of(again), params_of(fresh)) == 0, "a new model loaded from a sliced one's state_dict wraps")


# 2. Equal to the reference (masked gradients, AdamW undone outside the slice, each entry averaged
# over the members that train it), on the CPU path and on the device path.
def savings(t, model, opt, sync):
    """What a member holds after a step, and host_device_bytes so far."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    grads = [p.grad for p in trainable if p.grad is not None]
    slices = [p for n, p in model.named_parameters() if n.endswith("weight_slice")]
    return {"entries": sum(p.numel() for p in trainable), "tensors": len(trainable),
            "grad_entries": sum(g.numel() for g in grads),
            "state": _partial.state_bytes(opt), "step_bytes": opt.state[trainable[0]]["step"].element_size()
            * opt.state[trainable[0]]["step"].numel(),
            "opt_params": sum(p.numel() for g in opt.param_groups for p in g["params"]),
            "slices_in_opt": all(any(p is q for g in opt.param_groups for q in g["params"]) for p in slices),
            "bytes": sync.metrics()["host_device_bytes"]}


def run_path(device, *args, **kwargs):
    """run_loco on the CPU path, or on the device path (LOCO_TORCH_AS_DEVICE=1)."""
    if device:
        os.environ["LOCO_TORCH_AS_DEVICE"] = "1"
    try:
        return run_loco(*args, **kwargs)
    finally:
        os.environ.pop("LOCO_TORCH_AS_DEVICE", None)


for device in (False, True):
    where = "device path" if device else "CPU path"
    # 2 members: each slice has one trainer and the shared entries a mean of 2, summed alike by both.
    got = run_path(device, "diloco", 2, 8, inspect=savings, inner_steps=4, outer_lr=0.7, outer_momentum=0.9,
                   partial_slices=2)
    ref, ref_outer = reference_partial(2, 8, 4, 0.7, 0.9, 2)
    compare(f"{where}, partial (2 slices, 2 members)", got, ref)
    worst = max(max_diff(g[1], ref_outer) for g in got)
    check(worst <= TOL, f"{where}, partial: eval parameters are the outer parameters (max diff {worst:.2e})")
    # 4 members, 2 per slice: loco's ring all-reduce adds 4 float32 values in another order than
    # the reference's sum, which alone moves DiLoCo without slices by about 1e-6 here (measured
    # below); held to 4e-6.
    compare(f"{where}, partial (2 slices, 4 members)",
            run_path(device, "diloco", 4, 8, inner_steps=4, outer_lr=0.7, outer_momentum=0.9, partial_slices=2),
            reference_partial(4, 8, 4, 0.7, 0.9, 2)[0], tol=4e-6)
    s = got[0][4][-1]
    if device:
        # Inner steps copy nothing; a round's end copies what the method reads and writes back the
        # whole model (the outer parameters, frozen slices included).
        cum = [x["bytes"] for x in got[0][4]] + [got[0][2]["host_device_bytes"]]  # before each sync.step
        per_step = [b - a for a, b in zip(cum, cum[1:])]
        inner = [b for k, b in enumerate(per_step) if (k + 1) % 4]
        check(all(b == 0 for b in inner) and all(per_step[k] > 0 for k in (3, 7)),
              f"{where}, partial: bytes per step {per_step} (nothing on inner steps)")
        continue
    full_run = run_loco("diloco", 2, 8, inspect=savings, inner_steps=4, outer_lr=0.7, outer_momentum=0.9)[0][4][-1]
    plain = run_loco("diloco", 4, 8, inner_steps=4, outer_lr=0.7, outer_momentum=0.9)
    order = max(max_diff(g[0], r) for g, r in zip(plain, reference_diloco(4, 8, 4, 0.7, 0.9)[0]))
    check(order <= 4e-6, f"DiLoCo without slices, 4 members: {order:.2e} from its reference (the all-reduce's order)")
    apart = max_diff(ref[0], reference_diloco(2, 8, 4, 0.7, 0.9)[0][0])
    check(apart > 1e-3, f"partial: differs from DiLoCo without slices ({apart:.2e}), so the slicing is what was tested")
    check(got[0][2]["bytes_sent"] > 0, f"partial: members exchanged their slices ({got[0][2]['bytes_sent']} bytes)")
    # 3. What the rewrite saves: a member trains the shared entries and 1/2 of the MLPs' and holds
    # gradients and AdamW state (two float32 moments per entry and a step counter per tensor) for
    # those alone.
    expected = TOTAL - SLICED // 2
    formula = 8 * expected + s["tensors"] * s["step_bytes"]
    check(s["entries"] == expected and s["grad_entries"] == expected and s["opt_params"] == expected
          and s["slices_in_opt"], f"partial: trainable entries {s['entries']}, with gradients {s['grad_entries']}, "
                                  f"in the optimizer {s['opt_params']} == shared + sliced / 2 = {expected} "
                                  f"(whole model {TOTAL})")
    check(s["state"] == formula and full_run["state"] == 8 * TOTAL + full_run["tensors"] * full_run["step_bytes"],
          f"partial: optimizer state {s['state']} bytes == 8 x {expected} + {s['tensors']} step counters "
          f"({formula}); DiLoCo without slices {full_run['state']} ({s['state'] / full_run['state']:.3f}x)")


# 4. mlp+heads: member k also trains the q, k and v rows of heads [n h/N, (n+1) h/N) (the test
# model: 4 heads, as many key/value heads); o_proj stays shared.
HEADS = ("q_proj.weight", "k_proj.weight", "v_proj.weight")
QKV = sum(p.numel() for n, p in make_model(0).named_parameters() if n.endswith(HEADS))
for device in (False, True):
    where = "device path" if device else "CPU path"
    got = run_path(device, "diloco", 2, 8, inspect=savings, inner_steps=4, outer_lr=0.7, outer_momentum=0.9,
                   partial_slices=2, partial_strategy="mlp+heads", num_heads=4)
    ref, ref_outer = reference_partial(2, 8, 4, 0.7, 0.9, 2, heads=True)
    compare(f"{where}, partial mlp+heads (2 slices, 2 members)", got, ref)
    s = got[0][4][-1]
    expected = TOTAL - (SLICED + QKV) // 2
    check(s["entries"] == expected and s["grad_entries"] == expected and s["opt_params"] == expected,
          f"{where}, partial mlp+heads: trainable entries {s['entries']} (with gradients {s['grad_entries']}) == "
          f"shared + (MLPs + q, k, v) / 2 = {expected}")
mlp_only, _ = reference_partial(2, 8, 4, 0.7, 0.9, 2)
apart = max_diff(ref[0], mlp_only[0])
check(apart > 1e-3, f"partial mlp+heads: differs from mlp only ({apart:.2e}), so the heads' slicing is what was tested")

# 5. Checkpoints: 2 members stopped after 6 steps (mid-round, H = 4), their model, optimizer and
# method state_dicts saved, then wrapped again around other models and loaded (after wrap(): the
# optimizer then holds the slices, and loading the model's state_dict fills them): the same
# parameters as the uninterrupted run, bit for bit, on both paths.
def resumed(device):
    kw = dict(inner_steps=4, outer_lr=0.7, outer_momentum=0.9, partial_slices=2)

    def train(model, opt, sync, r, steps):
        for t in steps:
            inner_step(model, opt, r, t)
            opt.step()
            opt.zero_grad()
            sync.step()

    # The models made here: torch's seed is global to the process, not to a thread.
    models = [make_model(r) for r in range(2)] + [make_model(7 + r) for r in range(2)]

    def first(r, endpoint):
        model = models[r]
        opt = make_opt(model)
        sync = loco.torch.wrap(model, opt, "diloco", endpoint=endpoint, **kw)
        train(model, opt, sync, r, range(6))
        sd, outer = model.state_dict(), sync.eval_parameters()
        # Laid out as nn.Linear's (a down projection is a transposed view of loco's buffer):
        # safetensors and Hugging Face's save_pretrained take no other strides.
        laid = all(v.is_contiguous() for v in list(sd.values()) + list(outer.values()))
        saved = ({k: v.clone() for k, v in sd.items()}, opt.state_dict(), sync.state_dict(), laid)
        sync.close()
        return saved

    def second(r, endpoint):
        model = models[2 + r]
        opt = make_opt(model)
        sync = loco.torch.wrap(model, opt, "diloco", endpoint=endpoint, **kw)
        model.load_state_dict(saved[r][0])
        # torch >= 2 keeps the loaded state's tensors (a shallow copy): each resume from the
        # same saved state gets its own, or the second would start from the first's moments.
        opt.load_state_dict(copy.deepcopy(saved[r][1]))
        sync.load_state_dict(saved[r][2])
        train(model, opt, sync, r, range(6, 12))
        out = params_of(model)
        sync.close()
        return out

    if device:
        os.environ["LOCO_TORCH_AS_DEVICE"] = "1"
    try:
        saved = run_members(2, first)
        check(all(s[3] for s in saved), f"{'device' if device else 'CPU'} path, partial: the model's state_dict and "
              "eval_parameters() are contiguous tensors")
        return run_members(2, second)
    finally:
        os.environ.pop("LOCO_TORCH_AS_DEVICE", None)


for device in (False, True):
    where = "device path" if device else "CPU path"
    full = run_path(device, "diloco", 2, 12, inner_steps=4, outer_lr=0.7, outer_momentum=0.9, partial_slices=2)
    again = resumed(device)
    d = max(max_diff(f[0], g) for f, g in zip(full, again))
    check(d == 0, f"{where}, partial: stopped at step 6 and resumed from state_dicts == uninterrupted (max diff {d:.1e})")

# Streaming DiLoCo with partial updates (a fragment per block, tau 1): the device path equals the
# CPU path bit for bit.
kw = dict(inner_steps=6, fragment_blocks=1, tau=1, alpha=0.5, partial_slices=2, train_steps=14)
d = max(max_diff(a[0], b[0]) for a, b in zip(run_path(False, "streaming", 2, 14, **kw),
                                              run_path(True, "streaming", 2, 14, **kw)))
check(d == 0, f"streaming with partial updates: the device path equals the CPU path (max diff {d:.1e})")

# 6. Bad calls give clear errors.
def stepped_before_wrap():
    model = make_model(0)
    opt = make_opt(model)
    model.loss(*batch(0, 0)).backward()
    opt.step()
    loco.torch.wrap(model, opt, "diloco", endpoint=loco.inprocess(2)[0], partial_slices=2)


class NotLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(48, 32))

    def forward(self, x):
        return x @ self.weight.t()


def not_a_linear():
    model = make_model(0)
    model.layers[0].gate_proj = NotLinear()
    loco.torch.wrap(model, make_opt(model), "diloco", endpoint=loco.inprocess(2)[0], partial_slices=2)


expect_error("partial, optimizer stepped before wrap()", "before the optimizer's first step", stepped_before_wrap)
expect_error("partial, a gate_proj that is not an nn.Linear", "not the weight of an nn.Linear", not_a_linear)
expect_error("partial mlp+heads without head counts", "pass num_heads=",
             lambda: loco.torch.wrap(m := make_model(0), make_opt(m), "diloco", endpoint=loco.inprocess(2)[0],
                                     partial_slices=2, partial_strategy="mlp+heads"))
expect_error("partial mlp+heads, a head count that does not fit q_proj", "model.num_heads must divide",
             lambda: loco.torch.wrap(m := make_model(0), make_opt(m), "diloco", endpoint=loco.inprocess(2)[0],
                                     partial_slices=2, partial_strategy="mlp+heads", num_heads=6))
expect_error("partial without an MLP", "no parameter named like",
             lambda: loco.torch.wrap(m := torch.nn.Sequential(torch.nn.Linear(4, 4)), make_opt(m), "diloco",
                                     endpoint=loco.inprocess(2)[0], partial_slices=2))

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("python.partial: OK")
