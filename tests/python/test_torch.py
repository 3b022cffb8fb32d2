"""loco.torch against plain-torch references of the same methods (llama_torch.py), with the
replicas as threads of this process (loco.inprocess), and its errors. Run by ctest as
python.torch; `python3 tests/python/test_torch.py` with PYTHONPATH=build/python."""
import copy
import os
import sys
import tempfile
import threading
import time

import torch

import loco
import loco.torch
from harness import TOL, check, compare, expect_error, failures, run_loco, run_members
from llama_torch import (inner_step, make_model, make_opt, max_diff, params_of, reference_ddp, reference_diloco,
                         reference_noloco, reference_streaming)

torch.set_num_threads(1)

# Data-parallel: gradients averaged before each step.
got = run_loco("ddp", 2, 6)
compare("ddp", got, reference_ddp(2, 6))
got = run_loco("ddp", 2, 6, clip=0.5)
compare("ddp, sync_gradients then clipping", got, reference_ddp(2, 6, clip=0.5))

# DiLoCo: 3 rounds of H = 4.
got = run_loco("diloco", 2, 12, inner_steps=4, outer_lr=0.7, outer_momentum=0.9)
ref, ref_outer = reference_diloco(2, 12, 4, 0.7, 0.9)
compare("diloco", got, ref)
worst = max(max_diff(g[1], ref_outer) for g in got)
check(worst <= TOL, f"diloco: eval parameters are the outer parameters (max diff {worst:.2e})")
check(got[0][2].get("outer_delta_norm", 0) > 0, "diloco: metrics carry the outer-gradient norm")

# Streaming DiLoCo, fp32: fragments block 0, block 1, the rest (strided, one block each);
# H = 6 so offsets 0, 2, 4; tau = 1 overlap merged with alpha = 0.5.
model = make_model(0)
names = [n for n, _ in model.named_parameters()]
frag = [[i for i, n in enumerate(names) if n.startswith("layers.0.")],
        [i for i, n in enumerate(names) if n.startswith("layers.1.")],
        [i for i, n in enumerate(names) if not n.startswith("layers.")]]
got = run_loco("streaming", 2, 18, inner_steps=6, outer_lr=0.7, outer_momentum=0.9, fragment_blocks=1, tau=1,
               alpha=0.5)
compare("streaming fp32 tau 1", got, reference_streaming(2, 18, 6, 0.7, 0.9, frag, 1, 0.5))

# The path of a model on a GPU (its parameters stay on the device; only what a step's hooks use
# crosses to the host), run on CPU tensors with LOCO_TORCH_AS_DEVICE=1: the same results as the
# references, and host_device_bytes as the methods' schedules say.
os.environ["LOCO_TORCH_AS_DEVICE"] = "1"
try:
    m = make_model(0)
    s = loco.torch.wrap(m, make_opt(m), endpoint=loco.inprocess(1)[0])
    flat = s._flat
    own = all(not (flat.data_ptr() <= p.data_ptr() < flat.data_ptr() + flat.numel() * 4) for p in m.parameters())
    check(s._on_device and own, "device path: the parameters are not views of the method's host buffer")
    check(s._gbuf is None and s._core.grads().size == 0, "device path, diloco: no host buffer for gradients")
    s.close()
    compare("device path ddp, sync_gradients then clipping", run_loco("ddp", 2, 6, clip=0.5),
            reference_ddp(2, 6, clip=0.5))
    got = run_loco("diloco", 2, 12, inner_steps=4, outer_lr=0.7, outer_momentum=0.9)
    compare("device path diloco", got, reference_diloco(2, 12, 4, 0.7, 0.9)[0])
    got = run_loco("streaming", 2, 18, inner_steps=6, outer_lr=0.7, outer_momentum=0.9, fragment_blocks=1, tau=1,
                   alpha=0.5)
    compare("device path streaming fp32 tau 1", got, reference_streaming(2, 18, 6, 0.7, 0.9, frag, 1, 0.5))
    # Streaming fp4: each sync starts on loco's thread while the next steps run (with H = 12 and
    # tau 2, the step between a start and its merge queues its hooks behind it; with H = 6 and tau
    # 2, each sync from step 8 on starts at the step that merges the one before: the merge is
    # applied first, the start still goes to the background); the same bits as the CPU path,
    # whose parameters are the method's own buffer.
    for H, tau, steps, background in ((6, 1, 20, 7), (12, 2, 30, 5), (6, 2, 20, 7)):
        kw = dict(inner_steps=H, fragment_blocks=1, codec="fp4-e3m0", tau=tau, alpha=0.5, train_steps=steps)
        got = run_loco("streaming", 2, steps, **kw)
        del os.environ["LOCO_TORCH_AS_DEVICE"]
        cpu = run_loco("streaming", 2, steps, **kw)
        os.environ["LOCO_TORCH_AS_DEVICE"] = "1"
        worst = max(max_diff(g[0], c[0]) for g, c in zip(got, cpu))
        n = got[0][2]["syncs_in_background"]
        check(worst == 0 and n == background and cpu[0][2]["syncs_in_background"] == 0,
              f"device path streaming fp4 H {H} tau {tau}: equal to the CPU path (max diff {worst:.1e}), "
              f"{n} syncs started in the background (expected {background})")
    groups = lambda k: loco._loco.noloco_groups(4, 2, 0, k)
    got = run_loco("noloco", 4, 12, inner_steps=4, outer_lr=0.7, momentum=0.5, pull=0.3, seed=0)
    compare("device path noloco", got, reference_noloco(4, 12, 4, 0.7, 0.5, 0.3, groups))

    # Bytes per step: nothing on inner steps; at a sync the ranges read and written.
    def bytes_per_step(method, M, steps, **kw):
        models = [make_model(r) for r in range(M)]  # torch's seed is global to the process

        def member(r, endpoint):
            model, opt = models[r], make_opt(models[r])
            sync = loco.torch.wrap(model, opt, method, endpoint=endpoint, **kw)
            seen = [sync.metrics()["host_device_bytes"]]
            for t in range(steps):
                inner_step(model, opt, r, t)
                opt.step()
                opt.zero_grad()
                sync.step()
                seen.append(sync.metrics()["host_device_bytes"])
            sync.close()
            return seen[0], [b - a for a, b in zip(seen, seen[1:])]

        return run_members(M, member)

    model_bytes = sum(p.numel() for p in make_model(0).parameters()) * 4
    frag_bytes = [sum(list(make_model(0).parameters())[i].numel() for i in f) * 4 for f in frag]
    wrap1_bytes, steps = bytes_per_step("diloco", 1, 9, inner_steps=4)[0]
    check(wrap1_bytes == model_bytes, f"device path: wrap() of one member copies the model to the host once "
                                      f"({wrap1_bytes} bytes, model {model_bytes})")
    want = [2 * model_bytes if t % 4 == 0 else 0 for t in range(1, 10)]
    check(steps == want, f"device path diloco H = 4: bytes per step {steps} (the model there and back at a round)")
    wrap2_bytes, steps = bytes_per_step("diloco", 2, 4, inner_steps=4)[0]
    check(wrap2_bytes == 2 * model_bytes, f"device path: wrap() of 2 members copies the model there and back "
                                          f"(member 0's) ({wrap2_bytes} bytes)")
    # Streaming, H = 6, fragments at offsets 0, 2, 4, tau 1: a sync reads its fragment at t, and
    # its synchronized values come back once, on the background thread during step t + 1 (counted
    # with step t: metrics() waits for that thread), ahead of the merge at t + 1, which moves
    # nothing (with alpha 0.5 they are mixed on the device with the model's own values, which do
    # not cross to the host).
    for alpha in (0.5, 0.0):
        _, steps = bytes_per_step("streaming", 2, 14, inner_steps=6, fragment_blocks=1, tau=1, alpha=alpha)[0]
        want = [0] * 14
        for j, start in ((0, 6), (1, 8), (2, 10), (0, 12), (1, 14)):
            want[start - 1] += 2 * frag_bytes[j]
        check(steps == want, f"device path streaming tau 1 alpha {alpha}: bytes per step {steps} == {want}")
    _, steps = bytes_per_step("ddp", 1, 3)[0]
    check(steps == [0, 0, 0], f"device path ddp, one member: no copies ({steps})")
    _, steps = bytes_per_step("ddp", 2, 3)[0]
    check(steps == [2 * model_bytes] * 3, f"device path ddp, 2 members: the gradients there and back ({steps})")

    # Data-parallel with the gradients set to None between steps: each gradient is copied to the
    # host by its parameter's hook as backward produces it (from the second step on; the first
    # registers the hooks), with the reference's results. Two backward passes before a step
    # (accumulation) copy every gradient after backward instead, with the CPU path's results.
    def ddp_loop(accumulate):
        models = [make_model(r) for r in range(2)]

        def member(r, endpoint):
            model, opt = models[r], make_opt(models[r])
            sync = loco.torch.wrap(model, opt, "ddp", endpoint=endpoint)
            for t in range(4):
                inner_step(model, opt, r, t)
                if accumulate:
                    inner_step(model, opt, r, 100 + t)
                opt.step()
                opt.zero_grad(set_to_none=True)
                sync.step()
            out = (params_of(model), sync.metrics())
            sync.close()
            return out

        return run_members(2, member)

    tensors = len(list(make_model(0).parameters()))
    got = ddp_loop(False)
    worst = max(max_diff(g[0], r) for g, r in zip(got, reference_ddp(2, 4)))
    copied = [g[1]["gradients_copied_in_backward"] for g in got]
    check(worst == 0 and copied == [3 * tensors] * 2,
          f"device path ddp, gradients set to None: {copied} gradients copied by hooks during backward "
          f"(3 steps x {tensors}), the reference's parameters (max diff {worst:.1e})")
    got = ddp_loop(True)
    del os.environ["LOCO_TORCH_AS_DEVICE"]
    cpu = ddp_loop(True)
    os.environ["LOCO_TORCH_AS_DEVICE"] = "1"
    worst = max(max_diff(g[0], c[0]) for g, c in zip(got, cpu))
    copied = [g[1]["gradients_copied_in_backward"] for g in got]
    check(worst == 0 and copied == [0, 0], f"device path ddp, two backward passes per step: copied after backward "
                                           f"({copied} by hooks), equal to the CPU path (max diff {worst:.1e})")
finally:
    os.environ.pop("LOCO_TORCH_AS_DEVICE", None)

# The outer optimizer on its own (loco.outer_step) equals torch.optim.SGD with Nesterov momentum.
g = torch.Generator().manual_seed(3)
theta, avg = torch.randn(1000, generator=g), torch.randn(1000, generator=g)
ref = torch.nn.Parameter(theta.clone())
sgd = torch.optim.SGD([ref], lr=0.7, momentum=0.9, nesterov=True)
mom = torch.zeros(1000)
worst = 0.0
for k in range(3):
    a = avg + 0.1 * k
    with torch.no_grad():
        ref.grad = ref.detach() - a
    sgd.step()
    loco.outer_step(theta, mom, a, 0.7, 0.9)
    worst = max(worst, (theta - ref.detach()).abs().max().item())
check(worst <= 1e-6, f"outer_step: 3 steps equal torch.optim.SGD (Nesterov 0.9) within 1e-6 (max diff {worst:.2e})")
try:
    loco.outer_step(theta.double(), mom, avg, 0.7, 0.9)
    msg = "accepted"
except TypeError:
    msg = "TypeError"
check(msg == "TypeError", f"outer_step refuses a float64 theta it would have to copy ({msg})")
expect_error("outer_step theta given as momentum", "two of them share memory",
             lambda: loco.outer_step(theta, theta, avg, 0.7, 0.9))
expect_error("outer_step avg overlapping theta", "two of them share memory",
             lambda: loco.outer_step(theta, mom, theta, 0.7, 0.9))

# The fragments the reference used are loco's plan (blocks 0 and 1, then the rest; offsets 0, 2, 4).
plan = loco._loco.plan_fragments(2, 1, "strided", 6)
check([(f["blocks"], f["nonblock"], f["offset"]) for f in plan] == [([0], False, 0), ([1], False, 2), ([], True, 4)],
      f"streaming: the reference's fragments are loco's plan {plan}")

# The link model: at 10 Mbit/s a DiLoCo round's ring all-reduce of 86,656 bytes of parameters
# between 2 replicas sends each member's two halves one after the other, so it takes at least
# one half's wire time (a conservative bound).
ends = loco.inprocess(2, network_bandwidth="10Mbit")
def linked(r, out):
    model = make_model(0)
    opt = make_opt(model)
    sync = loco.torch.wrap(model, opt, "diloco", endpoint=ends[r], inner_steps=2)
    for t in range(2):
        inner_step(model, opt, r, t)
        opt.step()
        opt.zero_grad()
        sync.step()
    out[r] = sync.metrics()
    sync.close()
res = [None, None]
threads = [threading.Thread(target=linked, args=(r, res)) for r in range(2)]
[t.start() for t in threads]
[t.join() for t in threads]
wire = 86656 / 2 * 8 / 10e6
check(res[0]["outer_sync_s"] >= wire, f"link model: a round at 10 Mbit/s took {res[0]['outer_sync_s']:.3f} s "
      f">= its wire time {wire:.3f} s")

# Streaming DiLoCo with fp4 outer gradients: bytes sent equal the codec's formula (2 replicas:
# each sends its encoded fragment to the other at each of its syncs).
# With train_steps the last step ends every fragment's round, as `loco train` does: fragment 0
# syncs at 6 and 12, fragments 1 and 2 at 8 and 10 and take a final sync at 12.
got = run_loco("streaming", 2, 12, inner_steps=6, fragment_blocks=1, codec="fp4-e3m0", tau=1, train_steps=12)
sizes = [sum(list(model.parameters())[i].numel() for i in f) for f in frag]
syncs = {0: [6, 12], 1: [8, 12], 2: [10, 12]}
expect = sum(loco._loco.codec_bytes("fp4-e3m0", sizes[j]) * len(s) for j, s in syncs.items())
ops = got[0][3]["traffic"]["by_operation"]
# the start's parameters and the members' fingerprints (compared before it) aside
sent = sum(v["bytes_sent"] for k, v in ops.items() if k not in ("broadcast", "fingerprint"))
check(sent == expect, f"streaming fp4: bytes sent {sent} == the fp4 formula {expect}")

# NoLoCo: 4 replicas in random groups of 2 (loco's partition, exposed as noloco_groups).
groups = lambda k: loco._loco.noloco_groups(4, 2, 0, k)
got = run_loco("noloco", 4, 12, inner_steps=4, outer_lr=0.7, momentum=0.5, pull=0.3, seed=0)
compare("noloco", got, reference_noloco(4, 12, 4, 0.7, 0.5, 0.3, groups))
check(len({tuple(g) for k in (1, 2, 3) for g in groups(k)}) > 2, "noloco: the groups change between rounds")
perms = [loco.route_permutation(4, 7, step, mb, 0) for step in range(3) for mb in range(2)]
check(all(sorted(p) == [0, 1, 2, 3] for p in perms) and len({tuple(p) for p in perms}) > 1
      and perms[0] == loco.route_permutation(4, 7, 0, 0, 0),
      f"noloco routing: permutations of the replicas, the same for the same (seed, step, microbatch), varying ({perms[:3]})")

# Bad calls give clear errors.
def wrap1(model, **kw):
    return loco.torch.wrap(model, make_opt(model), endpoint=loco.inprocess(1)[0], **kw)


expect_error("wrap before init", "loco.init() has not been called", lambda: loco.torch.wrap(make_model(0), None))
expect_error("bf16 parameters", "loco's methods keep float32 parameters", lambda: wrap1(make_model(0).to(torch.bfloat16)))
expect_error("unknown keyword", "unknown keyword outer_lrr", lambda: wrap1(make_model(0), outer_lrr=0.1))
expect_error("unknown method", "method must be one of", lambda: wrap1(make_model(0), method="fsdp"))
expect_error("bad value", "outer.momentum", lambda: wrap1(make_model(0), outer_momentum=2.0))
# loco.init's threads checked before the world is made (a refused init can be called again).
for threads in ("4", 2.5, 0, True, 2000):
    expect_error(f"init with threads={threads!r}", "loco.init: threads is a whole number in [1, 1024]",
                 lambda: loco.init(threads=threads))
expect_error("network_tcp as text", "network_tcp is True or False (got 'false')",
             lambda: loco.inprocess(2, network_tcp="false"))  # bool("false") is True: TCP emulated unasked
# Keyword values as a loop computes them: NumPy numbers and pathlib paths are taken; an out_dir
# that is not a path (an int made a directory '123' in the working directory) or holds a control
# character (torch's ValueError from makedirs) is refused.
import numpy as np
import pathlib
with tempfile.TemporaryDirectory() as d:
    for kw in (dict(inner_steps=np.int64(3), outer_lr=np.float32(0.5)), dict(out_dir=pathlib.Path(d) / "run")):
        try:
            wrap1(make_model(0), **kw).close()
            took = "taken"
        except Exception as e:
            took = f"{type(e).__name__}: {e}"
        check(took == "taken", f"keywords {sorted(kw)} of types {[type(v).__name__ for v in kw.values()]}: {took}")
    check(os.path.isdir(os.path.join(d, "run")), "out_dir as a pathlib.Path made that directory")
expect_error("out_dir as a number", "out_dir: a directory's path (str or pathlib.Path), got int",
             lambda: wrap1(make_model(0), out_dir=123))
expect_error("out_dir with a NUL", "holds a control character", lambda: wrap1(make_model(0), out_dir="runs/a\x00b"))


def changed_parameters():
    model = make_model(0)
    opt = make_opt(model)
    sync = loco.torch.wrap(model, opt, endpoint=loco.inprocess(1)[0])
    model.extra = torch.nn.Parameter(torch.zeros(3))
    inner_step(model, opt, 0, 0)
    opt.step()  # refused here: the hook compares the model's parameters with those wrapped
    sync.step()


expect_error("parameters changed", "trainable parameters changed", changed_parameters)


# A world's network settings are bounded as loco train's: a timeout of 0 s (every wait failing at
# once) or beyond a week (a deadline past the clock's range), a latency beyond an hour.
expect_error("network_timeout 0s", "network.timeout: must be more than 0 and at most a week",
             lambda: loco.inprocess(2, network_timeout="0s"))
expect_error("network_timeout 1e300s", "network.timeout: must be more than 0 and at most a week",
             lambda: loco.inprocess(2, network_timeout="1e300s"))
expect_error("network_latency 1e9s", "network.latency: must be at most an hour",
             lambda: loco.inprocess(2, network_latency="1e9s"))
expect_error("a world of 2.5 members", "size is a whole number of members", lambda: loco.inprocess(2.5))


def two_methods_on_one_endpoint():
    ep = loco.inprocess(1)[0]
    m1, m2 = make_model(0), make_model(1)
    s1 = loco.torch.wrap(m1, make_opt(m1), endpoint=ep)
    try:
        loco.torch.wrap(m2, make_opt(m2), endpoint=ep)
    finally:
        s1.close()


expect_error("two models on one endpoint", "already runs a training method", two_methods_on_one_endpoint)


# A model, or an optimizer, that a sync not closed holds is refused by a second wrap (on another
# endpoint: both syncs would step it); once that sync is closed it can be wrapped again. An
# optimizer training a parameter outside the model is refused (nothing would synchronize it).
def wrap_twice(second_model):
    m = make_model(0)
    opt = make_opt(m)
    first = loco.torch.wrap(m, opt, endpoint=loco.inprocess(1)[0])
    try:
        other = make_model(1)
        loco.torch.wrap(m if second_model == "same" else other, make_opt(m) if second_model == "same" else opt,
                        endpoint=loco.inprocess(1)[0])
        said = "accepted"
    except loco.Error as e:
        said = str(e)
    first.close()
    loco.torch.wrap(m, opt, endpoint=loco.inprocess(1)[0]).close()  # raises if still refused
    return said


for which in ("same", "other"):
    said = wrap_twice(which)
    check("already wrapped by a loco sync that is not closed" in said,
          f"a second wrap ({'the same model' if which == 'same' else 'the same optimizer'}) while the first is open "
          f"is refused ({said}); after close() they wrap again")


def with_scheduler(made):
    """DiLoCo (H = 3) over 7 steps with a StepLR scheduler made before wrap() or after it (torch
    wraps the optimizer's step again, reading its __self__ and __func__): the parameters, the
    rates and what torch warned; then, after close(), one more step and a wrap of the same model
    and optimizer (refused while the first sync was open)."""
    import warnings
    m = make_model(0)
    opt = make_opt(m)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        sched = torch.optim.lr_scheduler.StepLR(opt, 2, 0.5) if made == "before" else None
        sync = loco.torch.wrap(m, opt, endpoint=loco.inprocess(1)[0], inner_steps=3)
        sched = sched or torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)
        rates = []
        for t in range(7):
            inner_step(m, opt, 0, t)
            opt.step()
            sched.step()
            opt.zero_grad()
            sync.step()
            rates.append(opt.param_groups[0]["lr"])
        try:
            loco.torch.wrap(make_model(1), opt, endpoint=loco.inprocess(1)[0])
            refused = "accepted"
        except loco.Error as e:
            refused = str(e)
        params = params_of(m)
        sync.close()
        import gc
        import weakref
        gc.disable()  # freed by its count of references: nothing the optimizer holds keeps it
        gone = weakref.ref(sync)
        del sync
        freed = gone() is None
        gc.enable()
        inner_step(m, opt, 0, 7)
        opt.step()  # the optimizer's own step (under the scheduler's wrapper: the hook passes through)
        sched.step()
        opt.zero_grad()
        again = loco.torch.wrap(m, opt, endpoint=loco.inprocess(1)[0])
        again.close()
    said = [str(w.message) for w in warned if "lr_scheduler" in str(w.message) or "optimizer.step()" in str(w.message)]
    return params, rates + [opt.param_groups[0]["lr"]], opt._step_count, said, refused, freed


before, after = with_scheduler("before"), with_scheduler("after")
check(after[1] == before[1] == [1e-2 * 0.5 ** ((t + 1) // 2) for t in range(8)] and after[2] == before[2] == 8,
      f"a learning-rate scheduler made after wrap(): the rates and the optimizer's step count as one made before "
      f"({after[1][-1]:.2e}, {after[2]} steps)")
check(max_diff(after[0], before[0]) == 0, "a learning-rate scheduler made after wrap(): the same parameters")
check(not after[3] and not before[3], f"a learning-rate scheduler before or after wrap(): torch warned nothing "
      f"({after[3] + before[3]})")
check(after[5] and before[5], "a closed sync is freed once its last reference goes, with a scheduler made after "
      "wrap() or before it (the optimizer's hook keeps nothing of it; the offloaded outer state's scratch files "
      "are removed then)")
check("already wrapped by a loco sync that is not closed" in after[4],
      f"an optimizer under a scheduler made after wrap() is refused by a second wrap while the sync is open "
      f"({after[4]}); after close() it wraps again")


def forgot_sync_step(method):
    """Two optimizer steps without sync.step() between (the loop forgot it): data-parallel would
    not average the second step's gradients, and the methods' syncs would fall behind."""
    m = make_model(0)
    opt = make_opt(m)
    sync = loco.torch.wrap(m, opt, method, endpoint=loco.inprocess(1)[0])
    inner_step(m, opt, 0, 0)
    opt.step()
    before = params_of(m)
    inner_step(m, opt, 0, 1)
    try:
        opt.step()
        said = "accepted"
    except loco.Error as e:
        said = str(e)
    kept = max_diff(params_of(m), before) == 0
    sync.close()
    return said, kept


for method in ("ddp", "diloco"):
    said, kept = forgot_sync_step(method)
    check("ran twice without sync.step() between" in said and kept,
          f"{method}: a second optimizer step without sync.step() is refused before it changes the parameters "
          f"({said}; unchanged: {kept})")


def foreign_parameter():
    m = make_model(0)
    extra = torch.nn.Parameter(torch.zeros(3))
    loco.torch.wrap(m, torch.optim.AdamW(list(m.parameters()) + [extra]), endpoint=loco.inprocess(1)[0])


expect_error("an optimizer training a parameter outside the model", "trains a parameter of shape (3,) that is not "
             "among the model's", foreign_parameter)
ep = loco.inprocess(1)[0]
try:
    loco.torch.wrap(make_model(0), make_opt(make_model(0)), endpoint=ep, outer_momentum=5.0)
except loco.Error:
    pass
m = make_model(0)
try:
    loco.torch.wrap(m, make_opt(m), endpoint=ep).close()
    reused = "yes"
except loco.Error as e:
    reused = str(e)
check(reused == "yes", f"an endpoint whose wrap failed can be used again ({reused})")

# An out_dir that holds a run, or that cannot be made, is refused before wrap() changes anything:
# the model keeps its own tensors, and the endpoint and the model can be wrapped again.
with tempfile.TemporaryDirectory() as d:
    os.makedirs(d + "/held")
    open(d + "/held/metrics.jsonl", "w").close()
    open(d + "/file", "w").close()
    for out_dir, want in ((d + "/held", "already holds a run"), (d + "/file/run", "cannot make the run directory")):
        ep = loco.inprocess(1)[0]
        m = make_model(0)
        before = [p.data_ptr() for p in m.parameters()]
        expect_error(f"out_dir {out_dir[len(d):]}", want,
                     lambda: loco.torch.wrap(m, make_opt(m), "diloco", endpoint=ep, out_dir=out_dir))
        kept = before == [p.data_ptr() for p in m.parameters()]
        try:
            loco.torch.wrap(m, make_opt(m), "diloco", endpoint=ep).close()
            again = "yes"
        except loco.Error as e:
            again = str(e)
        check(kept and again == "yes", f"out_dir {out_dir[len(d):]} refused: the model's tensors kept ({kept}), the "
                                       f"endpoint and model wrapped again ({again})")
    # A run directory in use (locked by a sync, as loco train locks its own) is refused to
    # another run until that sync is closed.
    first_model, second_model = make_model(0), make_model(1)
    first = loco.torch.wrap(first_model, make_opt(first_model), "diloco", endpoint=loco.inprocess(1)[0],
                            out_dir=d + "/busy")
    expect_error("an out_dir another sync holds", f"{d}/busy is in use by another run (process {os.getpid()})",
                 lambda: loco.torch.wrap(second_model, make_opt(second_model), "diloco",
                                         endpoint=loco.inprocess(1)[0], out_dir=d + "/busy"))
    first.close()
    loco.torch.wrap(second_model, make_opt(second_model), "diloco", endpoint=loco.inprocess(1)[0],
                    out_dir=d + "/busy").close()  # raises if still held
    # A wrap that fails after taking out_dir (here outer_device, checked after it; Streaming
    # DiLoCo's offload refused by the method already made) gives it back at once, though its
    # traceback keeps the failed object alive (as an interactive session's last traceback does).
    kept = []
    for method, kw in (("diloco", dict(outer_device="cuda:7")),
                       ("streaming", dict(outer_device="model", offload_outer=True, inner_steps=2))):
        ep = loco.inprocess(1)[0]
        try:
            loco.torch.wrap(second_model, make_opt(second_model), method, endpoint=ep, out_dir=d + "/failed", **kw)
        except loco.Error as e:
            kept.append(e.__traceback__)
        try:
            loco.torch.wrap(second_model, make_opt(second_model), method, endpoint=ep, out_dir=d + "/failed").close()
            again = "yes"
        except loco.Error as e:
            again = str(e)
        check(len(kept) == 1 + (method == "streaming") and again == "yes",
              f"{method}: a failed wrap gives out_dir and the endpoint back at once ({again})")


def collected_after_close_frees_nothing():
    # A sync closed, its endpoint taken by a second one, then the first collected: the
    # endpoint must stay taken.
    import gc
    ep = loco.inprocess(1)[0]
    m1, m2, m3 = make_model(0), make_model(1), make_model(2)
    o1 = make_opt(m1)
    first = loco.torch.wrap(m1, o1, endpoint=ep)
    first.close()
    second = loco.torch.wrap(m2, make_opt(m2), endpoint=ep)
    del first, o1, m1  # the model too: its parameters are views of the method's buffer
    gc.collect()
    try:
        loco.torch.wrap(m3, make_opt(m3), endpoint=ep)
    finally:
        second.close()


expect_error("an old sync collected after close leaves its successor's endpoint taken", "already runs a training method",
             collected_after_close_frees_nothing)


# Tied weights (one parameter in two modules) are one parameter of the method, on both paths.
# Frozen parameters (requires_grad False: a pretrained base under adapters) are not the method's:
# DiLoCo with the embedding, q_proj, k_proj and the head frozen (the same values on every member,
# as a loaded base) equals the reference with them frozen, which keep their values, on both paths;
# the method's buffer holds the trained parameters only. Members must start from the same frozen
# values, settings and inner optimizer: otherwise every member is refused at wrap(), the
# difference named (before, they trained on without a word).
FROZEN = ("embed_tokens.weight", "q_proj.weight", "k_proj.weight", "lm_head.weight")
base = make_model(0)


def frozen_base(m):
    for (n, p), b in zip(m.named_parameters(), base.parameters()):
        if n.endswith(FROZEN):
            p.requires_grad_(False)
            p.data.copy_(b)


def trained_count(m):
    return sum(p.numel() for p in m.parameters() if p.requires_grad)


def tied(m):  # the head's weight is the embedding's (one parameter in two modules)
    m.lm_head.weight = m.embed_tokens.weight


ref_frozen = reference_diloco(2, 12, 4, 0.7, 0.9, prepare=frozen_base)[0]
ref_tied = reference_diloco(2, 12, 4, 0.7, 0.9, prepare=tied)[0]
start = [v.clone() for v in params_of(base)]
for path in ("", "device path "):
    if path:
        os.environ["LOCO_TORCH_AS_DEVICE"] = "1"
    try:
        sizes = []
        got = run_loco("diloco", 2, 12, inner_steps=4, outer_lr=0.7, outer_momentum=0.9, prepare=frozen_base,
                       inspect=lambda t, model, opt, sync: sync._flat.numel() if t == 0 else None)
        compare(f"{path}diloco with frozen parameters", got, ref_frozen)
        compare(f"{path}diloco with tied embedding and head",
                run_loco("diloco", 2, 12, inner_steps=4, outer_lr=0.7, outer_momentum=0.9, prepare=tied), ref_tied)
        names = list(base.state_dict())
        kept = all(bool((g[0][i] == start[i]).all()) for g in got for i, n in enumerate(names) if n.endswith(FROZEN))
        m = make_model(0)
        frozen_base(m)
        held = got[0][4][0]
        check(kept and held == trained_count(m) < sum(p.numel() for p in m.parameters()),
              f"{path}diloco with frozen parameters: they keep their values ({kept}); the method holds the "
              f"{trained_count(m)} trained values ({held})")
    finally:
        os.environ.pop("LOCO_TORCH_AS_DEVICE", None)


def differing(what, **per_member):
    """Two members wrapping with what differs between them (per_member[key]: their two values of a
    wrap keyword, or of 'frozen', 'weight_decay' or 'foreach'); the error every member raises."""
    models = [make_model(0), make_model(0)]
    for r, m in enumerate(models):
        frozen_base(m)
        if "frozen" in per_member:
            with torch.no_grad():
                m.embed_tokens.weight.add_(per_member["frozen"][r])

    def member(r, endpoint):
        model = models[r]
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=per_member.get("weight_decay", (0.1, 0.1))[r],
                                foreach=per_member.get("foreach", (None, None))[r])
        kw = {k: v[r] for k, v in per_member.items() if k not in ("frozen", "weight_decay", "foreach")}
        loco.torch.wrap(model, opt, "diloco", endpoint=endpoint, inner_steps=4, **kw).close()

    try:
        run_members(2, member)
    except RuntimeError as e:
        return str(e)
    return "no error"


for what, kw, named in (("frozen parameters", {"frozen": (0.0, 1e-3)}, "frozen parameters: member 1 "),
                        ("settings", {"outer_lr": (0.7, 0.5)}, "outer.lr: member 1 0.5, member 0 0.7"),
                        ("inner optimizer", {"weight_decay": (0.1, 0.0)}, "inner optimizer: member 1 AdamW")):
    said = differing(what, **kw)
    check(said.count("they differ from member 0's") == 2 and named in said,
          f"members with other {what} are refused on every member, the difference named ({said[:300]})")
check(differing("nothing") == "no error", "members that share everything start")
check(differing("foreach", foreach=(True, False)) == "no error",
      "members whose optimizers differ in how they compute the step (foreach) start")


# Several inner optimizers (e.g. Muon for the matrices, AdamW for the rest): AdamW for the
# matrices and SGD with momentum for the norms' vectors. DiLoCo equals the reference with the same
# two, on both paths; data-parallel too, its gradients averaged once a step (the bytes of a run
# with one optimizer); an elastic joiner's state holds both (InnerState); a parameter in two
# optimizers, or something that is not an optimizer, is refused.
def two_opts(m):
    mats = [p for p in m.parameters() if p.dim() == 2]
    vecs = [p for p in m.parameters() if p.dim() != 2]
    return [torch.optim.AdamW(mats, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1),
            torch.optim.SGD(vecs, lr=0.05, momentum=0.9)]


for path in ("", "device path "):
    if path:
        os.environ["LOCO_TORCH_AS_DEVICE"] = "1"
    try:
        got = run_loco("diloco", 2, 12, inner_steps=4, outer_lr=0.7, outer_momentum=0.9, opt_of=two_opts)
        compare(f"{path}diloco, two inner optimizers", got,
                reference_diloco(2, 12, 4, 0.7, 0.9, opt_of=two_opts)[0])
        got = run_loco("ddp", 2, 6, clip=0.5, opt_of=two_opts)
        compare(f"{path}ddp, two inner optimizers", got, reference_ddp(2, 6, clip=0.5, opt_of=two_opts))
        one = run_loco("ddp", 2, 6, clip=0.5)
        sent = [sum(v["bytes_sent"] for k, v in g[0][3]["traffic"]["by_operation"].items() if k != "fingerprint")
                for g in (got, one)]  # the fingerprints name the optimizers
        check(sent[0] == sent[1] > 0, f"{path}ddp, two inner optimizers: the gradients averaged once a step "
                                      f"({sent[0]} bytes sent, {sent[1]} with one optimizer)")
    finally:
        os.environ.pop("LOCO_TORCH_AS_DEVICE", None)

def partial_two_opts(r, endpoint):
    m = make_model(0)
    opts = two_opts(m)
    loco.torch.wrap(m, opts, endpoint=endpoint, partial_slices=2).close()
    held = [{id(p) for g in o.param_groups for p in g["params"]} for o in opts]
    sliced = {id(mod.weight_slice) for mod in m.modules() if hasattr(mod, "weight_slice")}
    return len(sliced), bool(sliced) and sliced <= held[0] and held[0] | held[1] == {id(p) for p in m.parameters()}


got = run_members(2, partial_two_opts)
check(all(ok for _, ok in got), f"partial updates, two inner optimizers: the one holding the MLPs now holds "
                                f"their slices ({[n for n, _ in got]}), both together the model's parameters")

from loco._state import InnerState  # noqa: E402

trained = make_model(0)
opts = two_opts(trained)
for t in range(2):
    inner_step(trained, None, 0, t)
    for o in opts:
        o.step()
        o.zero_grad()
fresh = two_opts(make_model(1))
InnerState(fresh).load_inner(InnerState(opts).save_inner())
same = all(str(a.state_dict()) == str(b.state_dict()) for a, b in zip(opts, fresh))
check(same, "two inner optimizers: a joiner's state holds both, installed as sent")
expect_error("one optimizer's state for two", "does not fit this member's 2 optimizers",
             lambda: InnerState(two_opts(make_model(1))).load_inner(InnerState(opts[0]).save_inner()))


def shared_parameter():
    m = make_model(0)
    opts = two_opts(m)
    opts[1].add_param_group({"params": [m.lm_head.weight]})
    loco.torch.wrap(m, opts, endpoint=loco.inprocess(1)[0])


expect_error("a parameter in two optimizers", "both hold a parameter of shape (64, 32)", shared_parameter)
expect_error("not an optimizer", "a torch.optim.Optimizer or a list of them (got str)",
             lambda: loco.torch.wrap(make_model(0), ["sgd"], endpoint=loco.inprocess(1)[0]))


# A step whose optimizer step was skipped (as a GradScaler skips one whose fp16 gradients hold an
# Inf or a NaN) is a step of the method all the same, on both paths: DiLoCo members skipping
# different steps (one the last of a round) equal the reference that skips them; data-parallel
# members that averaged their gradients (sync_gradients) and skip the same step equal theirs;
# data-parallel members that skip without having averaged are refused, saying what to do.
SKIP = {(0, 2), (0, 5), (1, 7), (1, 11)}
ref_skip = reference_diloco(2, 12, 4, 0.7, 0.9, skip=SKIP)[0]
apart = max(max_diff(a, b) for a, b in zip(ref_skip, reference_diloco(2, 12, 4, 0.7, 0.9)[0]))
check(apart > 1e-3, f"skipped steps: the reference that skips differs from the one that does not ({apart:.2e})")
for path in ("", "device path "):
    if path:
        os.environ["LOCO_TORCH_AS_DEVICE"] = "1"
    try:
        got = run_loco("diloco", 2, 12, inner_steps=4, outer_lr=0.7, outer_momentum=0.9, skip=SKIP)
        compare(f"{path}diloco, optimizer steps skipped", got, ref_skip)
        counted = [g[2]["inner_steps_skipped"] for g in got]
        check(counted == [2, 2], f"{path}diloco: metrics count each member's skipped steps ({counted})")
        # tau 2: a step between a sync's start and its merge (7, 9: on the device path its hooks
        # queue behind the sync's background work), a merge's and a start's (8, 10)
        skip = {(0, 7), (0, 10), (1, 8), (1, 9)}
        got = run_loco("streaming", 2, 18, inner_steps=6, outer_lr=0.7, outer_momentum=0.9, fragment_blocks=1,
                       tau=2, alpha=0.5, skip=skip)
        compare(f"{path}streaming fp32 tau 2, optimizer steps skipped", got,
                reference_streaming(2, 18, 6, 0.7, 0.9, frag, 2, 0.5, skip=skip))
        if path:
            check(got[0][2]["syncs_in_background"] > 0, f"{path}streaming tau 2: syncs ran in the background "
                                                        f"({got[0][2]['syncs_in_background']})")
        got = run_loco("ddp", 2, 6, clip=0.5, skip={(0, 3), (1, 3)})
        compare(f"{path}ddp, sync_gradients then a step skipped", got, reference_ddp(2, 6, clip=0.5, skip={3}))
        try:
            run_loco("ddp", 2, 4, skip={(0, 1), (1, 1)})
            check(False, f"{path}ddp: a skipped step without sync_gradients: no error")
        except RuntimeError as e:
            check(str(e).count("call sync.sync_gradients() after backward") == 2,
                  f"{path}ddp: a skipped step without sync_gradients is refused on every member ({e})")
    finally:
        os.environ.pop("LOCO_TORCH_AS_DEVICE", None)


def stepped(sync_kw, step_kw=None, steps=1, close=False):
    """A DiLoCo sync of the test model: `steps` steps, then one more with step_kw (closed first
    with close)."""
    model = make_model(0)
    opt = make_opt(model)
    sync = loco.torch.wrap(model, opt, endpoint=loco.inprocess(1)[0], **sync_kw)
    try:
        for t in range(steps + 1):
            if t == steps and close:
                sync.close()
            inner_step(model, opt, 0, t)
            opt.step()
            opt.zero_grad()
            sync.step(**(step_kw if t == steps and step_kw else {}))
    finally:
        sync.close()


# The helper functions refuse sizes that would take the machine's memory (or wrap around).
expect_error("plan of 10^9 blocks", "plan_fragments needs blocks in [1, 100000]",
             lambda: loco._loco.plan_fragments(10 ** 9, 1, "strided", 10))
expect_error("groups of 10^9 replicas", "noloco_groups needs replicas in [1, 2^20]",
             lambda: loco._loco.noloco_groups(10 ** 9, 2, 1, 1))
expect_error("routes of 10^9 replicas", "route_permutation needs replicas in [1, 2^20]",
             lambda: loco._loco.route_permutation(10 ** 9, 1, 0, 0, 0))
expect_error("bytes of 2^62 values", "a value count must be in [0, 2^50]",
             lambda: loco._loco.codec_bytes("fp4-e3m0", 2 ** 62, 1))
expect_error("an infinite outer lr", "outer_step: needs a finite lr > 0",
             lambda: loco._loco.outer_step(torch.zeros(3).numpy(), torch.zeros(3).numpy(), torch.ones(3).numpy(),
                                           float("inf"), 0.9))

blocks_of = make_model(0).layers
expect_error("blocks not modules", "blocks: a list of the model's modules, in order (got list holding int)",
             lambda: stepped({"blocks": [1, 2]}))
expect_error("a module as blocks", "blocks: a list of the model's modules, in order (got Embedding)",
             lambda: stepped({"blocks": make_model(0).embed_tokens}))
expect_error("another model's block", "blocks: block 0 (Block) holds none of the model's parameters",
             lambda: stepped({"blocks": [blocks_of[0]]}))
with tempfile.TemporaryDirectory() as d:  # loss and tokens are used (and checked) with a run directory
    expect_error("negative tokens", "tokens is the number of tokens of this step, a non-negative integer (got -5)",
                 lambda: stepped({"out_dir": d + "/a"}, {"loss": 1.0, "tokens": -5}))
    expect_error("tokens as text", "a non-negative integer (got '64')",
                 lambda: stepped({"out_dir": d + "/b"}, {"loss": 1.0, "tokens": "64"}))
    expect_error("loss as text", "loss is this step's loss, a number or a one-element tensor (got str)",
                 lambda: stepped({"out_dir": d + "/c"}, {"loss": "1.0"}))
    expect_error("a per-token loss", "a number or a one-element tensor (got a tensor of shape (2, 3))",
                 lambda: stepped({"out_dir": d + "/d"}, {"loss": torch.ones(2, 3)}))
expect_error("a step past train_steps", "sync.step() past train_steps = 3", lambda: stepped({"train_steps": 3}, steps=3))
expect_error("a step after close", "sync.step() after close()", lambda: stepped({}, close=True))
# After close() the state and the parameters can still be read; nothing can be synchronized or
# loaded (data-parallel's gradient sync reached the shut-down communicator, an internal error that
# then failed every later call).
for method in ("ddp", "diloco"):
    model = make_model(0)
    opt = make_opt(model)
    sync = loco.torch.wrap(model, opt, method, endpoint=loco.inprocess(1)[0])
    inner_step(model, opt, 0, 0)
    opt.step()
    sync.step()
    sync.close()
    expect_error(f"{method}: gradients synchronized after close", "sync_gradients() after close()",
                 sync.sync_gradients)
    expect_error(f"{method}: a state loaded after close", "load_state_dict() after close()",
                 lambda: sync.load_state_dict(sync.state_dict()))
    check(len(list(sync.eval_parameters())) == len(list(model.parameters())),
          f"{method}: the state and the parameters are read after close")

# A non-finite loss is recorded (as null) and finish() still writes the run directory.
import json
with tempfile.TemporaryDirectory() as d:
    model = make_model(0)
    opt = make_opt(model)
    sync = loco.torch.wrap(model, opt, "diloco", endpoint=loco.inprocess(1)[0], out_dir=d + "/run", log_interval=1)
    inner_step(model, opt, 0, 0)
    opt.step()
    sync.step(float("nan"), 64)
    try:
        sync.finish(val_loss=2.0)
        summary = json.load(open(d + "/run/summary.json"))
        msg = f"summary written, final train loss {summary['final_train_loss']}"
    except Exception as e:
        msg = f"{type(e).__name__}: {e}"
    expect_error("val_loss as text", "finish(): val_loss is a number or a one-element tensor (got str)",
                 lambda: sync.finish(val_loss="2.0"))
    sync.close()
    expect_error("finish after close", "finish() after close()", lambda: sync.finish())
    nulls = [json.loads(line)["train_loss"] for line in open(d + "/run/metrics.jsonl")][:1]
check(msg.startswith("summary written") and nulls == [None],
      f"finish() after a NaN loss: {msg}; its record's train_loss {nulls} (null, as loco report reads it)")

# State: a DiLoCo run stopped after 6 steps and resumed from state_dicts ends as the full run.
saved6 = []  # the model's, the optimizer's and the sync's states at step 6


def diloco_resumed():
    ep = loco.inprocess(1)[0]
    model = make_model(0)
    opt = make_opt(model)
    sync = loco.torch.wrap(model, opt, "diloco", endpoint=ep, inner_steps=4, outer_lr=0.7)
    for t in range(6):
        inner_step(model, opt, 0, t)
        opt.step()
        opt.zero_grad()
        sync.step()
    saved = ({k: v.clone() for k, v in model.state_dict().items()}, copy.deepcopy(opt.state_dict()), sync.state_dict())
    saved6.extend(copy.deepcopy(saved))
    sync.close()
    model2 = make_model(5)
    model2.load_state_dict(saved[0])
    opt2 = make_opt(model2)
    sync2 = loco.torch.wrap(model2, opt2, "diloco", endpoint=loco.inprocess(1)[0], inner_steps=4, outer_lr=0.7)
    opt2.load_state_dict(saved[1])
    sync2.load_state_dict(saved[2])
    for t in range(6, 12):
        inner_step(model2, opt2, 0, t)
        opt2.step()
        opt2.zero_grad()
        sync2.step()
    return params_of(model2)


full = run_loco("diloco", 1, 12, inner_steps=4, outer_lr=0.7)[0][0]
resumed = diloco_resumed()
d = max_diff(full, resumed)
check(d == 0, f"diloco: stopped at step 6 and resumed from state_dicts == uninterrupted (max diff {d:.1e})")

# model.load_state_dict() after wrap(): the DiLoCo family's outer parameters stay those of
# wrap(), so new weights loaded alone would be pulled back towards them at the next sync (a
# round with inner lr 0 moved loaded weights by 0.2). The next step refuses, before the optimizer
# changes anything; a load that changes nothing (the outer parameters at a round's end), a
# resume that also loads the sync's state (in either order) and data-parallel go on.
def loaded_after_wrap(method, load, **kw):
    def member(r, endpoint):
        model = make_model(0)
        opt = make_opt(model)
        sync = loco.torch.wrap(model, opt, method, endpoint=endpoint, inner_steps=2, **kw)
        try:
            for t in range(2):
                inner_step(model, opt, r, t)
                opt.step()
                opt.zero_grad()
                sync.step()
            load(model, sync)
            before = params_of(model)
            inner_step(model, opt, r, 2)
            try:
                opt.step()
            except loco.Error as e:
                return str(e), max_diff(before, params_of(model))
            sync.step()
            return "went on", None
        finally:
            sync.close()

    return run_members(2, member)[0]


def load_changed(key):
    """Loads a state whose entry `key` differs from the model's (the rest its own)."""
    def load(model, sync):
        state = model.state_dict()
        state[key] = state[key] + 1
        model.load_state_dict(state)
    return load


other = {k: v.clone() for k, v in make_model(3).state_dict().items()}
try:
    for path in ("", "device path "):
        os.environ["LOCO_TORCH_AS_DEVICE"] = "1" if path else "0"
        for method, load, kw in (("diloco", lambda m, s: m.load_state_dict(other), {}),
                                 ("streaming", lambda m, s: m.load_state_dict(other), {}),
                                 ("noloco", load_changed("layers.1.q_proj.weight"), {}),
                                 ("diloco", load_changed("layers.1.down_proj.weight"), {"partial_slices": 2})):
            what = f"{path}{method}{', partial updates' if kw else ''}"
            msg, moved = loaded_after_wrap(method, load, **kw)
            check("model.load_state_dict() changed" in msg and "after wrap()" in msg and moved == 0,
                  f"{what}: weights loaded after wrap() alone are refused at the next step, unchanged ({msg[:110]})")
        msg, _ = loaded_after_wrap("diloco", lambda m, s: m.load_state_dict(s.eval_parameters(), strict=False))
        check(msg == "went on", f"{path}diloco: the outer parameters loaded at a round's end change nothing ({msg[:90]})")
        msg, _ = loaded_after_wrap("ddp", lambda m, s: m.load_state_dict(other))
        check(msg == "went on", f"{path}ddp: weights loaded after wrap() (no outer state) ({msg[:90]})")
finally:
    os.environ.pop("LOCO_TORCH_AS_DEVICE", None)


def resumed_sync_first():
    model = make_model(5)
    opt = make_opt(model)
    sync = loco.torch.wrap(model, opt, "diloco", endpoint=loco.inprocess(1)[0], inner_steps=4, outer_lr=0.7)
    sync.load_state_dict(saved6[2])
    model.load_state_dict(saved6[0])
    opt.load_state_dict(copy.deepcopy(saved6[1]))
    for t in range(6, 12):
        inner_step(model, opt, 0, t)
        opt.step()
        opt.zero_grad()
        sync.step()
    sync.close()
    return params_of(model)


d = max_diff(full, resumed_sync_first())
check(d == 0, f"diloco: resumed with the sync's state loaded first, then the model's == uninterrupted (max diff {d:.1e})")

# A state from a file is checked before anything is changed: a non-finite value, a step that is
# not an integer, metadata or an entry of the wrong kind are refused with loco.Error, and the
# method goes on as before (a refused state does not leave it failed, nor its outer state changed:
# on the device path too, where the outer parameters live in loco.torch).
def hostile_states(as_device):
    os.environ["LOCO_TORCH_AS_DEVICE"] = "1" if as_device else "0"
    model = make_model(0)
    opt = make_opt(model)
    sync = loco.torch.wrap(model, opt, "diloco", endpoint=loco.inprocess(1)[0], inner_steps=2,
                           outer_device="model" if as_device else "cpu")
    for t in range(3):
        inner_step(model, opt, 0, t)
        opt.step()
        opt.zero_grad()
        sync.step()
    good = sync.state_dict()

    def doubled_then(spoil):
        def both(s):
            s["loco"]["outer.params"].mul_(2)
            spoil(s)
        return both

    cases = {
        "a NaN": lambda s: s["loco"]["outer.params"].__setitem__(3, float("nan")),
        "an Inf": lambda s: s["loco"]["outer.momentum"].__setitem__(0, float("inf")),
        "a step of text": doubled_then(lambda s: s["loco"].__setitem__("__step__", "2")),
        "a boolean step": doubled_then(lambda s: s["loco"].__setitem__("__step__", True)),
        "metadata not a dict": doubled_then(lambda s: s["loco"].__setitem__("__meta__", [1])),
        "no loco entry": lambda s: s.pop("loco"),
        "not a dict": None,
    }
    said = {}
    for name, spoil in cases.items():
        bad = copy.deepcopy(good)
        if spoil is None:
            bad = [bad]
        else:
            spoil(bad)
        try:
            sync.load_state_dict(bad)
            said[name] = "accepted"
        except loco.Error as e:
            said[name] = str(e)
    after = sync.state_dict()["loco"]
    same = all(torch.equal(after[k], good["loco"][k]) for k in ("outer.params", "outer.momentum"))
    inner_step(model, opt, 0, 3)
    opt.step()
    opt.zero_grad()
    sync.step()  # still usable: a round
    sync.close()
    os.environ["LOCO_TORCH_AS_DEVICE"] = "1"
    return said, same


expect = {"a NaN": "holds a non-finite value (nan) at index 3", "an Inf": "holds a non-finite value (inf) at index 0",
          "a step of text": "__step__ is str, not an integer", "a boolean step": "__step__ is bool, not an integer",
          "metadata not a dict": "__meta__ is not a dict", "no loco entry": "not a state from Sync.state_dict()",
          "not a dict": "not a state from Sync.state_dict()"}
for as_device in (False, True):
    said, same = hostile_states(as_device)
    path = "device path, outer state on the model" if as_device else "host path"
    check(all(expect[k] in said[k] for k in expect) and same,
          f"{path}: load_state_dict refuses hostile states, the outer state unchanged ({same}), the method goes on: "
          f"{said}")

# A state holding entries the method does not read (another method's or configuration's, or
# edited) is refused, naming them, not loaded with them dropped: an extra entry; a Streaming DiLoCo
# sync's average with no sync in flight. The same state without them loads, on the host path and
# with the outer state on the model (loco.torch takes the outer parameters and momentum there).
def unread_entries(method, as_device, spoil, **kw):
    os.environ["LOCO_TORCH_AS_DEVICE"] = "1" if as_device else "0"
    said = []
    for attempt in ("spoiled", "as saved"):
        model = make_model(0)
        opt = make_opt(model)
        sync = loco.torch.wrap(model, opt, method, endpoint=loco.inprocess(1)[0], inner_steps=4,
                               outer_device="model" if as_device else "cpu", **kw)
        if attempt == "spoiled":
            for t in range(4):  # a whole round: no sync in flight
                inner_step(model, opt, 0, t)
                opt.step()
                opt.zero_grad()
                sync.step()
            good = sync.state_dict()
            bad = copy.deepcopy(good)
            spoil(bad["loco"])
            try:
                sync.load_state_dict(bad)
                said.append("accepted")
            except loco.Error as e:
                said.append(str(e))
        else:
            sync.load_state_dict(good)
            said.append(sync.steps_done)
        sync.close()
    os.environ["LOCO_TORCH_AS_DEVICE"] = "1"
    return said


def idle_fragment(state):
    """A fragment whose sync is not in flight in this state."""
    pending = {int(j) for j in state["__meta__"].get("pending", "").split(",") if j}
    return min(set(range(len(pending) + 1)) - pending)


extra = lambda s: s.__setitem__("extra.key", torch.zeros(3))  # noqa: E731
streaming = dict(fragment_blocks=1, tau=1, codec="fp4-e3m0")
for method, as_device, spoil, unread, kw in [
        ("diloco", False, extra, "extra.key", {}), ("diloco", True, extra, "extra.key", {}),
        ("streaming", True, extra, "extra.key", streaming),
        ("streaming", False, lambda s: s.__setitem__(f"pending.{idle_fragment(s)}.avg", torch.zeros(5)),
         "pending.", streaming)]:
    said = unread_entries(method, as_device, spoil, **kw)
    check(f"the state holds tensor(s) this run does not read: {unread}" in str(said[0]) and said[1] == 4,
          f"{method}, {'device path, outer state on the model' if as_device else 'host path'}: a state with "
          f"{unread} is refused, the state as saved loads: {said}")

# The device path's copies (loco._device.Copier) with CUDA's events stood in for: copying a range
# to the host waits for the copies to the device still in flight only when they read a range it
# writes (a fragment fetched while another is on its way to the device does not stop the host
# at the GPU's queue); host_free() without ranges always waits.
from loco._device import Copier  # noqa: E402


class FakeEvent:
    waits = 0

    def synchronize(self):
        FakeEvent.waits += 1
        time.sleep(0.002)


copier = Copier(torch.device("cpu"))
copier.cuda = True  # its events are FakeEvent's
copier._event = FakeEvent
host, dev = torch.zeros(100), torch.arange(100.0)
copier.to_device([(host[0:40], dev[0:40])])
copier.to_host([(host[40:100], dev[40:100])], wait=False)
apart = FakeEvent.waits
copier.to_host([(host[30:50], dev[30:50])], wait=False)
overlapping = FakeEvent.waits - apart
copier.to_host([(host[0:10], dev[0:10])], wait=False)
after = FakeEvent.waits - apart - overlapping
copier.to_device([(host[60:70], dev[60:70])])
copier.host_free()
check((apart, overlapping, after, FakeEvent.waits - apart - overlapping - after) == (0, 1, 0, 1),
      f"device path: a copy to the host waits for copies to the device only where they read what it writes "
      f"(waits: apart {apart}, overlapping {overlapping}, after the wait {after}, host_free() "
      f"{FakeEvent.waits - apart - overlapping - after})")
waited = copier._clock.snapshot().get("copies_waiting", 0)
check(waited >= 0.002 * FakeEvent.waits, f"device path: the copies' waits are counted ({waited:.4f} s for "
                                         f"{FakeEvent.waits} waits of at least 2 ms)")


# Copies aside (CUDA streams stood in for, each call logged): a copy of the parameters to the host
# at a sync's start runs on loco's stream after the work queued on the training stream; the
# training stream waits for it (on the device) before the next work that writes the parameters,
# once; the synchronized values come to the device on loco's stream, and the merge waits for them.
# Every stream and event is asked for on the model's device, never the current one (a model on
# cuda:1 with cuda:0 current): a call that leaves the device out is logged as such.
log = []
MODEL_DEVICE = torch.device("cpu")  # the copier's; a CUDA device in real use


class FakeStream:
    def __init__(self, name="loco", device=None):
        self.name = name

    def wait_stream(self, other):
        log.append(f"{self.name} waits for {other.name}")

    def wait_event(self, ev):
        log.append(f"{self.name} waits for event {ev.at}")

    def synchronize(self):
        log.append(f"host waits for {self.name}")


class LoggedEvent:
    def record(self, stream=None):
        if stream is None:
            log.append("event on the current device's stream")
        self.at = (stream or current[-1]).name
        log.append(f"event on {self.at}")

    def synchronize(self):
        log.append(f"host waits for event {self.at}")


class Within:
    def __init__(self, stream):
        self.stream = stream

    def __enter__(self):
        current.append(self.stream)

    def __exit__(self, *exc):
        current.pop()


current = [FakeStream("training")]
saved = {k: getattr(torch.cuda, k) for k in ("Stream", "Event", "stream", "current_stream")}
saved_record = torch.Tensor.record_stream
torch.cuda.Stream, torch.cuda.Event, torch.cuda.stream = FakeStream, LoggedEvent, Within



def current_stream(device=None):
    if device != MODEL_DEVICE:
        log.append(f"current stream of device {device}")
    return current[-1]


torch.cuda.current_stream = current_stream
torch.Tensor.record_stream = lambda t, stream: log.append(f"tensor of {t.numel()} used on {stream.name}")
try:
    copier = Copier(MODEL_DEVICE)
    copier.cuda = True
    host, dev = torch.zeros(100), torch.arange(100.0)
    ev = copier.to_host([(host[0:50], dev[0:50])], wait=False, aside=True)
    copied = bool((host[0:50] == dev[0:50]).all())
    copier.before_writes()
    copier.before_writes()  # once
    values, arrived = copier.aside_to_device(dev[50:].clone())
    arrived_right = bool((values == torch.arange(50.0, 100.0)).all())
    copier.ready(arrived)
    copier.to_host([(host[0:10], dev[0:10])], wait=False, aside=True)
    copier.to_device([(host[50:60], dev[50:60])])
    want = ["loco waits for training", "event on loco", "training waits for event loco",
            "loco waits for training", "event on loco", "tensor of 50 used on loco", "training waits for event loco",
            "loco waits for training", "event on loco", "training waits for event loco", "event on training"]
    check(log == want and copied and ev is not None and arrived_right,
          f"device path: copies aside on loco's stream, after the training stream's work, waited for by it "
          f"before the parameters are written, once; the values' tensor marked as used on loco's stream; "
          f"streams and events of the model's device ({log})")
    # Closing waits for the copies on both streams before the host buffers are unregistered, also
    # for a copy aside nothing waited for (its sync's background work failed first).
    del log[:]
    copier.to_host([(host[0:10], dev[0:10])], wait=False, aside=True)
    copier.wait()
    check(log[-3:] == ["host waits for loco", "event on training", "host waits for event training"]
          and copier.stream() is current[-1] and not any("device" in line for line in log),
          f"device path: waiting for the copies covers loco's stream and the training stream, of the model's "
          f"device ({log})")
finally:
    for k, v in saved.items():
        setattr(torch.cuda, k, v)
    torch.Tensor.record_stream = saved_record

# ... and a run takes them so: with the outer state on the host, every copy aside at a sync's
# start is followed by before_writes() before the next optimizer step's own work and before a merge.
order = []
model = make_model(0)
opt = make_opt(model)
os.environ["LOCO_TORCH_AS_DEVICE"] = "1"
sync = loco.torch.wrap(model, opt, "streaming", endpoint=loco.inprocess(1)[0], inner_steps=6, fragment_blocks=1,
                       tau=1, alpha=0.5, outer_device="cpu")
os.environ["LOCO_TORCH_AS_DEVICE"] = "0"
to_host, before = sync._copier.to_host, sync._copier.before_writes
sync._copier.to_host = lambda pairs, wait=True, aside=False: (order.append("aside" if aside else "copy"),
                                                               to_host(pairs, wait, aside))[1]
sync._copier.before_writes = lambda: (order.append("before writes"), before())[1]
for t in range(14):
    inner_step(model, opt, 0, t)
    opt.step()
    order.append("step")
    opt.zero_grad()
    sync.step()
sync.close()
asides = [i for i, x in enumerate(order) if x == "aside"]
check(asides and all("before writes" in order[i + 1:order.index("step", i + 1)] for i in asides if "step" in order[i + 1:]),
      f"device path: each copy aside ({len(asides)}) is followed by before_writes() before the next optimizer step")


# ... and with the outer state on the device: a sync started in the background encodes on loco's
# stream after an event the loop recorded on the training stream at the start (so that the
# encode runs beside the steps queued after it, and the host waits for loco's stream only), the
# outer gradient marked as read there; the syncs decoded ahead of their merge there too, each
# average marked as read by the training stream, which waits for loco's stream before the merge
# applies them. CUDA's streams stood in for with a current stream per thread, as CUDA's; the run
# equals the same run without them, bit for bit.
class ThreadStreams(threading.local):
    def __init__(self):
        self.current = [FakeStream("training")]


per_thread = ThreadStreams()


class ThreadWithin(Within):
    def __enter__(self):
        per_thread.current.append(self.stream)

    def __exit__(self, *exc):
        per_thread.current.pop()


class ThreadEvent(LoggedEvent):
    def record(self, stream=None):
        self.at = (stream or per_thread.current[-1]).name
        log.append(f"{threading.current_thread().name}: event on {self.at}")

    def synchronize(self):
        log.append(f"{threading.current_thread().name}: host waits for event {self.at}")


def held_streaming(fake):
    model = make_model(0)
    opt = make_opt(model)
    os.environ["LOCO_TORCH_AS_DEVICE"] = "1"
    sync = loco.torch.wrap(model, opt, "streaming", endpoint=loco.inprocess(1)[0], inner_steps=6, fragment_blocks=1,
                           tau=1, alpha=0.5, codec="fp4-e3m0", outer_device="model")
    os.environ["LOCO_TORCH_AS_DEVICE"] = "0"
    if fake:
        sync._copier.cuda = True
        apply = sync._outer.apply
        sync._outer.apply = lambda r, flat: (log.append(f"apply {r['fragment']}"), apply(r, flat))[1]
    for t in range(14):
        inner_step(model, opt, 0, t)
        opt.step()
        opt.zero_grad()
        sync.step()
    starts = sync.metrics()["syncs_in_background"]
    sync.close()
    return params_of(model), starts


saved = {k: getattr(torch.cuda, k) for k in ("Stream", "Event", "stream", "current_stream", "device")}
del log[:]
torch.cuda.Stream, torch.cuda.Event, torch.cuda.stream = FakeStream, ThreadEvent, ThreadWithin
torch.cuda.device = lambda device: ThreadWithin(per_thread.current[-1])  # the model's device current: no stream change
torch.cuda.current_stream = lambda device=None: per_thread.current[-1]
torch.Tensor.record_stream = lambda t, stream: log.append(f"tensor of {t.numel()} used on {stream.name}")
try:
    faked, starts = held_streaming(True)
finally:
    for k, v in saved.items():
        setattr(torch.cuda, k, v)
    torch.Tensor.record_stream = saved_record
plain, _ = held_streaming(False)
bg = [line for line in log if line.startswith("loco.torch sync")]
waits = [line for line in bg if "host waits" in line]
applied = [i for i, line in enumerate(log) if line.startswith("apply")]
prepared_before = all(
    any(log[k] == "training waits for event loco" for k in range(max((j for j in range(i) if "event on loco" in log[j]),
                                                                    default=i), i)) for i in applied)
check(starts > 0 and log.count("loco waits for event training") == starts
      and waits and all(line.endswith("event loco") for line in waits)
      and sum("used on loco" in line for line in log) >= starts
      and sum("used on training" in line for line in log) >= len(applied) > 0 and prepared_before
      and all(torch.equal(a, b) for a, b in zip(faked, plain)),
      f"device path, outer state on the device: {starts} syncs started in the background encode and decode on "
      f"loco's stream after the training stream's event, their tensors marked for the other stream, each merge "
      f"after loco's stream; the run equals it without stood-in streams ({log[:14]} ...)")

# Where the hooks' time goes (metrics' loop_seconds and background_seconds), with the method's
# hooks slowed by 10 ms each: a merge's time in the loop's merge phase, a sync start's hook on the
# background thread, the other steps' hooks in core; every phase within the hooks' whole, the
# hooks within the loop's time around them.
class SlowCore:
    def __init__(self, core):
        self._core = core

    def __getattr__(self, name):
        return getattr(self._core, name)

    def merge_step(self):
        time.sleep(0.01)
        return self._core.merge_step()

    def after_step(self):
        time.sleep(0.01)
        return self._core.after_step()


def timed_run(method, steps, **kw):
    model = make_model(0)
    opt = make_opt(model)
    sync = loco.torch.wrap(model, opt, method, endpoint=loco.inprocess(1)[0], **kw)
    sync._core = SlowCore(sync._core)
    around = 0.0
    for t in range(steps):
        inner_step(model, opt, 0, t)
        t0 = time.perf_counter()
        opt.step()
        sync.step()
        around += time.perf_counter() - t0
        opt.zero_grad()
    m = sync.metrics()
    sync.close()
    return m, around


os.environ["LOCO_TORCH_AS_DEVICE"] = "1"
try:
    # H = 6, tau 1, 14 steps: syncs start at steps 6, 8, 10, 12 and 14 (in the background), merge
    # at 7, 9, 11 and 13; the other 9 steps' hooks run on the loop.
    for outer in ("cpu", "model"):
        m, around = timed_run("streaming", 14, inner_steps=6, fragment_blocks=1, tau=1, codec="fp4-e3m0",
                              outer_device=outer)
        loop, bg = m["loop_seconds"], m["background_seconds"]
        inner = {k: round(v, 4) for k, v in loop.items() if k not in ("hooks", "copies_waiting")}
        check(loop["hooks"] <= around and sum(inner.values()) <= loop["hooks"] + 1e-3
              and inner.get("merge", 0) >= 0.04 and inner.get("core", 0) >= 0.09 and bg.get("busy", 0) >= 0.05
              and m["syncs_in_background"] == 5,
              f"device path streaming, outer state on {outer}: the hooks' {loop['hooks']:.4f} s within the "
              f"loop's {around:.4f} s, its phases {inner} within them (merge at least 4 x 10 ms, core 9 x 10 ms), "
              f"the background busy {bg.get('busy', 0):.4f} s over {m['syncs_in_background']} syncs (at least "
              f"5 x 10 ms)")
    m, around = timed_run("diloco", 8, inner_steps=4, outer_device="cpu")
    loop = m["loop_seconds"]
    check(m["background_seconds"] == {} and 0.08 <= loop.get("core", 0) <= loop["hooks"] <= around,
          f"device path diloco: its hooks on the loop ({loop.get('core', 0):.4f} s of {loop['hooks']:.4f} s, at "
          f"least 8 x 10 ms), nothing in the background")
finally:
    del os.environ["LOCO_TORCH_AS_DEVICE"]

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("python.torch: OK")
