"""loco.torch's outer state on the model's device (outer_device="model"; python/loco/_outer.py),
checked on CPU tensors through the device path (LOCO_TORCH_AS_DEVICE=1): its codecs give the C++
codecs' bytes and decoded values, its outer step the C++ outer step's bits, and a run with it
equals the same run with the outer state on the host bit for bit, also when the members differ
in where they keep it; inner steps copy nothing, a sync copies only its encoded bytes;
checkpoints have the host path's format. Run by ctest as python.outer; with LOCO_TEST_DEVICE=cuda
(scripts/gpu-session.sh) the same checks run on a GPU."""
import copy
import os
import sys
import tempfile

import numpy as np
import torch

import loco
import loco.torch
from harness import check, expect_error, failures, run_members
from llama_torch import DEVICE, inner_step, make_model, make_opt, max_diff, params_of
from loco import _loco
import loco._outer as _outer
from loco._outer import Codec

os.environ["LOCO_TORCH_AS_DEVICE"] = "1"
torch.set_num_threads(1)


def bits(x):
    return np.asarray(x, dtype=np.float32).view(np.uint32)


# 1. The codecs: the C++ codec's bytes and decoded values, bit for bit, over values of every
# magnitude (zeros of both signs, subnormals, near the largest float), ties between grid points
# (rounded to the even code), blocks that do not divide n and odd blocks (a 4-bit block's last
# byte holds one value).
g = torch.Generator().manual_seed(0)
ties = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -5.0, 1 / 128, 3 / 256, 448.0, 13.0, -0.0])
worst = []
for name in ("bf16", "fp8", "fp4-e3m0", "fp4-e2m1", "int8"):
    bad = 0
    for block in (128, 7, 2, 1):
        for n in (0, 1, 5, 15, 300, 1000):
            x = torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g) * 3)
            if n >= 15:
                x[:15] = ties
            if n >= 300:
                x[100:105] = torch.tensor([0.0, -0.0, 1e-40, 3e38, -1e-30])
            dec, ref = _loco.codec_roundtrip(name, x.numpy(), "nearest", block, 0)
            c = Codec(name, block)
            enc = c.encode(x.to(DEVICE))
            acc = torch.zeros(n, device=DEVICE)
            c.decode_add(enc, acc)
            bad += (enc.cpu().numpy().tobytes() != ref) + (not np.array_equal(bits(acc.cpu()), bits(dec)))
    check(bad == 0, f"codec {name}: the torch encode/decode give the C++ codec's bytes and values "
                    f"(4 block sizes x 6 lengths; {bad} differ)")

# Every grid point and every midpoint between two (a tie), each also one float below and above,
# with either sign, in blocks scaled by powers of two from 2^-140 to 2^119 (each block's largest
# magnitude the grid's top, so the points keep their place): the C++ codec's bytes and values.
for name in ("fp8", "fp4-e3m0", "fp4-e2m1"):
    grid = torch.tensor(_outer._GRIDS[name][0]())
    pts = torch.cat([(grid[:-1] + grid[1:]) / 2, grid])
    n = 128 * 400
    v = pts[torch.randint(0, pts.numel(), (n,), generator=g)]
    v = torch.where(torch.rand(n, generator=g) < 0.5, -v, v)
    side = torch.randint(-1, 2, (n,), generator=g)
    v = torch.where(side == 0, v, torch.nextafter(v, side.float() * float("inf")))
    xb = v.view(-1, 128)
    xb[:, 0] = grid[-1]
    xb *= torch.pow(2.0, torch.randint(-140, 120, (xb.shape[0], 1), generator=g).float())
    dec, ref = _loco.codec_roundtrip(name, v.numpy(), "nearest", 128, 0)
    c = Codec(name, 128)
    enc = c.encode(v.to(DEVICE))
    acc = torch.zeros(n, device=DEVICE)
    c.decode_add(enc, acc)
    check(enc.cpu().numpy().tobytes() == ref and np.array_equal(bits(acc.cpu()), bits(dec)),
          f"codec {name}: grid points, ties and their neighbours in blocks scaled 2^-140..2^119: the C++ "
          "codec's bytes and values")

# The same in pieces (python/loco/_outer.py's CHUNK, here a few blocks): the whole's bytes.
chunk, _outer.CHUNK = _outer.CHUNK, 300
x = torch.randn(5000, generator=g)
for name in ("bf16", "fp8", "fp4-e2m1", "int8"):
    for block in (128, 7):
        dec, ref = _loco.codec_roundtrip(name, x.numpy(), "nearest", block, 0)
        c = Codec(name, block)
        enc = c.encode(x.to(DEVICE))
        acc = torch.zeros(5000, device=DEVICE)
        c.decode_add(enc, acc)
        check(enc.cpu().numpy().tobytes() == ref and np.array_equal(bits(acc.cpu()), bits(dec)),
              f"codec {name}, block {block}, encoded and decoded in pieces of {c._per()} values: the C++ codec's")
_outer.CHUNK = chunk

# 2. The outer step: the C++ outer_sgd_step's bits (with and without Nesterov).
for nesterov in (True, False):
    theta = torch.randn(10000, generator=g)
    mom = torch.randn(10000, generator=g)
    avg = theta + torch.randn(10000, generator=g) * 1e-3
    t_ref, m_ref = theta.numpy().copy(), mom.numpy().copy()
    _loco.outer_step(t_ref, m_ref, avg.numpy(), 0.7, 0.9, nesterov)

    t, m = theta.to(DEVICE), mom.to(DEVICE)
    _outer.outer_sgd_step(t, m, avg.to(DEVICE), 0.9, 0.7, nesterov)
    check(np.array_equal(bits(t.cpu()), bits(t_ref)) and np.array_equal(bits(m.cpu()), bits(m_ref)),
          f"outer step (nesterov={nesterov}): the C++ outer step's bits")


# 3. Runs: the outer state on the device equals it on the host, bit for bit.
def train(method, M, steps, where, make=make_model, **kw):
    """M members (threads); where[r]: member r's outer_device; make(r): member r's model. Returns
    per member (parameters, eval parameters, metrics after step 1, metrics at the end, report)."""
    models = [make(r) for r in range(M)]

    def member(r, endpoint):
        model = models[r]
        opt = make_opt(model)
        sync = loco.torch.wrap(model, opt, method, endpoint=endpoint, outer_device=where[r], **kw)
        first = None
        for t in range(steps):
            inner_step(model, opt, r, t)
            opt.step()
            opt.zero_grad()
            sync.step()
            if t == 0:
                first = sync.metrics()
        last = sync.metrics()
        out = (params_of(model), list(sync.eval_parameters().values()), first, last, sync.report())
        sync.close()
        return out

    return run_members(M, member)


def same(a, b):
    return max(max(max_diff(x, y) for x, y in zip(p[0] + p[1], q[0] + q[1])) for p, q in zip(a, b))


cases = [
    ("diloco, 1 member", "diloco", 1, 9, dict(inner_steps=4, outer_lr=0.7, outer_momentum=0.9, train_steps=9)),
    ("diloco, 2 members", "diloco", 2, 9, dict(inner_steps=4, outer_lr=0.7, outer_momentum=0.9, train_steps=9)),
    ("diloco, 2 members, 2 data-parallel steps first", "diloco", 2, 9,
     dict(inner_steps=3, outer_start_step=2, train_steps=9)),
    ("diloco, 2 members, partial updates (2 slices)", "diloco", 2, 9,
     dict(inner_steps=4, partial_slices=2, train_steps=9)),
    ("streaming fp32, 1 member, tau 1", "streaming", 1, 14,
     dict(inner_steps=6, fragment_blocks=1, tau=1, alpha=0.5, train_steps=14)),
    ("streaming fp4-e3m0, 2 members, tau 1", "streaming", 2, 14,
     dict(inner_steps=6, fragment_blocks=1, tau=1, alpha=0.5, codec="fp4-e3m0", train_steps=14)),
    ("streaming fp8, 3 members (reduce-scatter), tau 2", "streaming", 3, 14,
     dict(inner_steps=6, fragment_blocks=1, tau=2, alpha=0.5, codec="fp8", train_steps=14)),
    ("streaming int8, 2 members, tau 0", "streaming", 2, 10,
     dict(inner_steps=4, fragment_blocks=1, tau=0, alpha=0.0, codec="int8", block=32, train_steps=10)),
    ("streaming bf16, 1 member, tau 1", "streaming", 1, 14,
     dict(inner_steps=6, fragment_blocks=2, tau=1, alpha=0.5, codec="bf16", train_steps=14)),
    ("streaming fp32, 2 members, tau 1", "streaming", 2, 14,
     dict(inner_steps=6, fragment_blocks=1, tau=1, alpha=0.5, train_steps=14)),
    ("streaming fp32, 2 members, tau 1, partial updates (2 slices)", "streaming", 2, 14,
     dict(inner_steps=6, fragment_blocks=1, tau=1, alpha=0.5, partial_slices=2, train_steps=14)),
]
for what, method, M, steps, kw in cases:
    host = train(method, M, steps, ["cpu"] * M, **kw)
    _outer.CHUNK = 1000 if "2 members" in what else chunk  # the outer step in pieces too
    dev = train(method, M, steps, ["model"] * M, **kw)
    _outer.CHUNK = chunk
    d = same(host, dev)
    check(d == 0, f"{what}: outer state on the device == on the host, parameters and eval parameters "
                  f"(max diff {d:.1e})")
    check(all(x[4]["outer_device"].split(":")[0] == DEVICE.type for x in dev) and
          all(x[4]["outer_device"] == "host" for x in host),
          f"{what}: report says where the outer state lives")
    if M > 1:
        mixed = train(method, M, steps, ["model" if r % 2 == 0 else "cpu" for r in range(M)], **kw)
        d = same(host, mixed)
        check(d == 0, f"{what}: members with the outer state on the device and on the host train together "
                      f"(equal to all on the host; max diff {d:.1e})")
    if "tau 2" in what:  # H 6, fragments at offsets 0, 2, 4: each sync from step 8 on starts as one merges
        n = dev[0][3]["syncs_in_background"]
        check(n == 4, f"{what}: the 4 syncs before the last step start in the background, those starting at "
                      f"the step that merges another too ({n})")
    if method == "diloco":
        a, b = host[0][3], dev[0][3]
        check(abs(a["outer_delta_norm"] - b["outer_delta_norm"]) <= 1e-6 * a["outer_delta_norm"] and
              abs(a["replica_delta_norm"] - b["replica_delta_norm"]) <= 1e-6 * a["replica_delta_norm"],
              f"{what}: the rounds' norms as on the host ({b['outer_delta_norm']:.6g} vs {a['outer_delta_norm']:.6g})")

# The outer state offloaded to a file (a sync reads the fragment's outer state packed) equals it in
# memory (read where it is kept, range by range), bit for bit, with fragments of several ranges:
# 4 blocks, fragments of 2, strided (fragment 0 is blocks 0 and 2).
def four_blocks(r):
    return make_model(r, layers=4)


kw = dict(inner_steps=6, fragment_blocks=2, tau=1, alpha=0.5, codec="fp4-e3m0", train_steps=14)
mem = train("streaming", 2, 14, ["cpu"] * 2, make=four_blocks, **kw)
with tempfile.TemporaryDirectory() as run_dir:  # the scratch files are the run directory's
    off = train("streaming", 2, 14, ["cpu"] * 2, make=four_blocks, offload_outer=True, out_dir=run_dir, **kw)
    left = sorted(os.listdir(run_dir))
check(left == ["config.toml", "lock"], f"the offloaded outer state's scratch files (in out_dir) are removed at close "
                                       f"({left} left)")
alone = four_blocks(0)
expect_error("offload_outer without out_dir", "pass out_dir",
             lambda: loco.torch.wrap(alone, make_opt(alone), "streaming", endpoint=loco.inprocess(1)[0],
                                     offload_outer=True, **kw))
d = same(mem, off)
check(d == 0 and off[0][4]["outer_state_offloaded"] and not mem[0][4]["outer_state_offloaded"],
      f"streaming fp4-e3m0, 2 members, fragments of two ranges: the outer state offloaded == in memory "
      f"(max diff {d:.1e})")

# 4. What crosses: nothing on inner steps; at a sync, a codec's encoded bytes (out, and every
# member's back), fp32 with one member nothing. Counted from step 1 on (wrap() copies the model
# once into loco's buffer, whatever the outer state).
n = sum(p.numel() for p in make_model(0).parameters())
out = train("diloco", 1, 9, ["model"], inner_steps=4, train_steps=9)[0]
moved = out[3]["host_device_bytes"] - out[2]["host_device_bytes"]
check(moved == 0, f"diloco, 1 member, outer state on the device: 0 bytes crossed in 3 rounds ({moved})")
out = train("diloco", 1, 9, ["cpu"], inner_steps=4, train_steps=9)[0]
moved = out[3]["host_device_bytes"] - out[2]["host_device_bytes"]
check(moved == 3 * 2 * 4 * n, f"diloco, 1 member, outer state on the host: the model both ways per round "
                              f"({moved} bytes = 3 x 2 x 4 x {n})")
kw = dict(inner_steps=6, fragment_blocks=0, tau=1, alpha=0.5, codec="fp4-e3m0", train_steps=12)
for M in (1, 2):
    outs = train("streaming", M, 12, ["model"] * M, **kw)
    moved = outs[0][3]["host_device_bytes"] - outs[0][2]["host_device_bytes"]
    want = 2 * (1 + M) * _loco.codec_bytes("fp4-e3m0", n, 128)  # 2 syncs: own payload out, M back
    check(moved == want, f"streaming fp4, {M} member(s), outer state on the device: 2 syncs moved {moved} bytes "
                         f"= 2 x (1 + {M}) x encoded ({want}; fp32 both ways would be {2 * 2 * 4 * n})")

# 4b. Where a sync's device work is queued: with tau >= 1 the loop's thread queues only what
# reads or writes the model at the step (the outer gradient theta - params, the outer step and the
# merge); the encoding and the decoding of the payloads are queued by the background thread while
# the loop trains. Counted per thread by a dispatch mode on the loop's sync.step() (a blocking
# sync, tau 0, is the control: its codec work is on the loop's thread).
import threading
from torch.utils._python_dispatch import TorchDispatchMode

CODEC_OPS = {"searchsorted", "frexp", "bitwise_and", "bitwise_or", "__rshift__", "__lshift__", "index"}


class LoopOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.thread, self.ops = threading.get_ident(), {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if threading.get_ident() == self.thread:
            name = func.overloadpacket.__name__
            self.ops[name] = self.ops.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def loop_ops(tau, steps=14):
    """The ops the loop's thread dispatched in sync.step() (every step but the last), and the
    syncs started."""
    def member(r, endpoint):
        model = make_model(0)
        opt = make_opt(model)
        sync = loco.torch.wrap(model, opt, "streaming", endpoint=endpoint, outer_device="model", codec="fp4-e3m0",
                               inner_steps=6, fragment_blocks=1, tau=tau, alpha=0.5, train_steps=steps)
        total, syncs = {}, 0
        for t in range(steps - 1):  # the last step applies every sync in flight: not counted
            inner_step(model, opt, 0, t)
            opt.step()
            opt.zero_grad()
            starts = len(sync._core.outer_starts())
            with LoopOps() as mode:
                sync.step()
            syncs += starts
            for k, v in mode.ops.items():
                total[k] = total.get(k, 0) + v
        sync.close()
        return total, syncs
    return run_members(1, member)[0]


for tau in (1, 0):
    ops, syncs = loop_ops(tau)
    codec = sum(v for k, v in ops.items() if k in CODEC_OPS)
    what = (f"streaming fp4, tau {tau}, outer state on the device: {syncs} syncs, the loop's thread dispatched "
            f"{sum(ops.values())} ops in sync.step(), {codec} of the codec's")
    check(syncs > 0 and (codec == 0 if tau else codec > 0),
          what + (" (none: encoded and decoded on the background thread)" if tau else
                  " (a blocking sync encodes and decodes on the loop's thread)"))

# 5. Checkpoints: the state_dict of a run with the outer state on the device has the host path's
# entries and values (a sync in flight included), and a run stopped mid-sync and resumed from
# them, on the device or on the host, equals the uninterrupted run bit for bit.
kw = dict(inner_steps=6, fragment_blocks=1, tau=2, alpha=0.5, codec="fp4-e3m0", train_steps=14)


def stopped(where, steps=7):
    models = [make_model(r) for r in range(2)]  # made here: torch's seed is global to the process

    def member(r, endpoint):
        model = models[r]
        opt = make_opt(model)
        sync = loco.torch.wrap(model, opt, "streaming", endpoint=endpoint, outer_device=where, **kw)
        for t in range(steps):
            inner_step(model, opt, r, t)
            opt.step()
            opt.zero_grad()
            sync.step()
        saved = ({k: v.clone() for k, v in model.state_dict().items()}, opt.state_dict(), sync.state_dict())
        sync.close()
        return saved
    return run_members(2, member)


def resumed(saved, where):
    models = [make_model(7 + r) for r in range(2)]

    def member(r, endpoint):
        model = models[r]
        opt = make_opt(model)
        sync = loco.torch.wrap(model, opt, "streaming", endpoint=endpoint, outer_device=where, **kw)
        model.load_state_dict(saved[r][0])
        # torch >= 2 keeps the loaded state's tensors (a shallow copy): each resume from the
        # same saved state gets its own, or the second would start from the first's moments.
        opt.load_state_dict(copy.deepcopy(saved[r][1]))
        sync.load_state_dict(saved[r][2])
        for t in range(7, 14):
            inner_step(model, opt, r, t)
            opt.step()
            opt.zero_grad()
            sync.step()
        out = params_of(model)
        sync.close()
        return out
    return run_members(2, member)


on_host, on_dev = stopped("cpu"), stopped("model")
a, b = on_host[0][2]["loco"], on_dev[0][2]["loco"]
pending = on_host[0][2]["loco"]["__meta__"].get("pending", "")
keys_equal = sorted(a) == sorted(b) and a["__meta__"] == b["__meta__"]
vals_equal = all(not isinstance(a[k], torch.Tensor) or torch.equal(a[k], b[k]) for k in a)
check(pending != "" and keys_equal and vals_equal,
      f"state_dict with the outer state on the device == on the host (syncs in flight: {pending!r}; "
      f"{len(a)} entries)")
full = train("streaming", 2, 14, ["model"] * 2, **kw)
for where in ("model", "cpu"):
    again = resumed(on_dev, where)
    d = max(max_diff(f[0], g) for f, g in zip(full, again))
    check(d == 0, f"stopped mid-sync with the outer state on the device, resumed with outer_device={where!r}: "
                  f"== uninterrupted (max diff {d:.1e})")

# 6. Bad calls.
def wrap_one(method, **kw):
    model = make_model(0)
    sync = loco.torch.wrap(model, make_opt(model), method, endpoint=loco.inprocess(1)[0], **kw)
    rep = sync.report()
    sync.close()
    return rep


expect_error("outer_device with data-parallel", "applies to diloco and streaming",
             lambda: wrap_one("ddp", outer_device="model"))
expect_error("outer_device with stochastic rounding", "stochastic",
             lambda: wrap_one("streaming", outer_device="model", codec="fp4-e3m0", rounding="stochastic"))
expect_error("outer_device with topk", "host only", lambda: wrap_one("streaming", outer_device="model", codec="topk"))
expect_error("outer_device with screening", "outer.screen",
             lambda: wrap_one("diloco", outer_device="model", outer_screen="on"))
expect_error("outer_device naming another device", "model's device", lambda: wrap_one("diloco", outer_device="meta"))
if DEVICE.type == "cpu":
    os.environ["LOCO_TORCH_AS_DEVICE"] = "0"
    expect_error("outer_device for a model on the CPU path", "on the CPU",
                 lambda: wrap_one("diloco", outer_device="model"))
    os.environ["LOCO_TORCH_AS_DEVICE"] = "1"


def nan_run():
    def member(r, endpoint):
        model = make_model(0)
        opt = make_opt(model)
        sync = loco.torch.wrap(model, opt, "streaming", endpoint=endpoint, outer_device="model", codec="fp4-e3m0",
                               inner_steps=2, fragment_blocks=0, tau=1)
        try:
            for t in range(3):
                inner_step(model, opt, 0, t)
                opt.step()
                opt.zero_grad()
                with torch.no_grad():
                    next(model.parameters())[0, 0] = float("nan")
                sync.step()
            sync.metrics()
        finally:
            sync.close()
    run_members(1, member)


try:
    nan_run()
    check(False, "a non-finite outer gradient: no error")
except RuntimeError as e:
    check("non-finite" in str(e), f"a non-finite outer gradient is refused: '{e}'")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
