"""How much device work loco.torch's hooks queue on the training loop's thread: one member of
Streaming DiLoCo (a fragment per block, fp4-e3m0, tau 1, H = --inner-steps) with its outer state
on the model's device (or, --outer-device cpu, on the host), the device path taken on CPU tensors (LOCO_TORCH_AS_DEVICE=1, set here),
and the tensor operations the loop's thread dispatches in each sync.step() counted (a torch
dispatch mode on that thread: each one is a kernel launch, or a view, on a GPU). On a GPU a
loop that reads its loss every step cannot hide what its hooks queue beyond what the device still
has to run, so these counts are what a sync step adds on the host.

The elementwise work runs in pieces (python/loco/_outer.py, CHUNK: 2^24 values); --pieces sets
the piece size so that a block's fragment takes as many pieces as one of the 0.85B model of
docs/results/torch-gpu.md does (3), whatever the model's size here.

    PYTHONPATH=build/python python3 bench/loop_ops.py
"""
import argparse
import collections
import os
import statistics
import sys
import threading

os.environ["LOCO_TORCH_AS_DEVICE"] = "1"
import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import loco  # noqa: E402
import loco.torch  # noqa: E402
from loco import _outer  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from llama import Llama  # noqa: E402

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--hidden", type=int, default=64)
p.add_argument("--layers", type=int, default=4)
p.add_argument("--mlp", type=int, default=172)
p.add_argument("--vocab", type=int, default=512)
p.add_argument("--inner-steps", type=int, default=8)
p.add_argument("--pieces", type=int, default=3, help="pieces of a block's fragment (0: CHUNK as it is)")
p.add_argument("--outer-device", default="model", choices=["model", "cpu"],
               help="where the outer state lives (cpu: on the host, the outer step and codecs in C++)")
args = p.parse_args()

VIEWS = {"slice", "view", "as_strided", "select", "detach", "alias", "_reshape_alias", "unsqueeze", "t"}


class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.thread, self.ops = threading.get_ident(), collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if threading.get_ident() == self.thread:
            self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


torch.manual_seed(0)
model = Llama(args.vocab, d=args.hidden, layers=args.layers, heads=4, f=args.mlp)
block = sum(p.numel() for n, p in model.named_parameters() if n.startswith("layers.0."))
if args.pieces > 0:
    _outer.CHUNK = -(-block // args.pieces // 128) * 128
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
sync = loco.torch.wrap(model, opt, "streaming", endpoint=loco.inprocess(1)[0], inner_steps=args.inner_steps,
                       fragment_blocks=1, codec="fp4-e3m0", tau=1, outer_device=args.outer_device)
x = torch.randint(0, args.vocab, (2, 33))
H = args.inner_steps
rows = []
for step in range(1, 3 * H + 1):
    loss = model.loss(x[:, :-1], x[:, 1:])
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    starts = len(sync._core.outer_starts())
    with Count() as c:
        sync.step()
    if step > 2 * H:  # the third round: every fragment's sync and merge in steady state
        rows.append((step, starts, sum(c.ops.values()), sum(v for k, v in c.ops.items() if k not in VIEWS)))
sync.close()
print(f"loco {getattr(loco, '__file__', '?')}; outer state on {args.outer_device}; model {sum(p.numel() for p in model.parameters())} parameters, "
      f"a block {block}, pieces of {_outer.CHUNK} values; H = {H}, steps {2 * H + 1} to {3 * H}")
print("step  syncs started  ops on the loop's thread  of them not views")
for r in rows:
    print(f"{r[0]:4d}  {r[1]:13d}  {r[2]:24d}  {r[3]:16d}")
busy = [r for r in rows if r[2] > 0]
if busy:
    print(f"steps with work: {len(busy)}, ops per such step: median {statistics.median(r[2] for r in busy):.0f}, "
          f"max {max(r[2] for r in busy)} (not views: median {statistics.median(r[3] for r in busy):.0f})")
