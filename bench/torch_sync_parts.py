"""Where a Streaming DiLoCo sync's device work goes, with the outer state on the model's device
(python/loco/_outer.py): each part timed on its own over one fragment of --n values, in the
order a sync runs them: the start (the outer gradient theta - params), the encode and its
finiteness flag, the decode of the members' payloads into their mean and the average parameters
(theta - mean), the outer step, and at the merge the new outer state copied in and mixed into
the model's parameters. With tau >= 1 the start and the merge run on the training stream, the
rest on loco's own stream beside the training steps (python/loco/torch.py); each line says
which. bench/torch_gpu.py measures what a sync adds to the steps (docs/results/torch-gpu.md).

    python3 bench/torch_sync_parts.py --device cuda            # a 0.85B Llama block's fragment
    python3 bench/torch_sync_parts.py --n 4000000 --repeat 3   # on the CPU, in seconds

Prints each part's milliseconds (median of --repeat, after one untimed run) and their sum."""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "python"))
from loco import _outer  # noqa: E402
from device_timer import median_seconds  # noqa: E402

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--device", default="cpu")
p.add_argument("--n", type=int, default=0,
               help="values in the fragment (default: 44,052,480 on a GPU, a block of bench/torch_gpu.py's "
                    "0.85B Llama; 4,000,000 on the CPU)")
p.add_argument("--codecs", default="fp4-e3m0,fp4-e2m1,fp8,int8,bf16")
p.add_argument("--members", type=int, default=1, help="payloads decoded at the merge (one per member)")
p.add_argument("--repeat", type=int, default=5)
args = p.parse_args()
device = torch.device(args.device)
cuda = device.type == "cuda"
n = args.n or (44_052_480 if cuda else 4_000_000)
if not cuda:
    torch.set_num_threads(max(1, os.cpu_count() or 1))


g = torch.Generator().manual_seed(0)
params = (torch.randn(n, generator=g) * 0.02).to(device)
theta = params + (torch.randn(n, generator=g) * 1e-3).to(device)
mom = torch.zeros(n, device=device)
local = params.clone()
print(f"device {device} ({torch.cuda.get_device_name(device) if cuda else 'CPU'}), torch {torch.__version__}, "
      f"fragment {n:,} values, {args.members} member(s)' payloads")


def decode_mean(codec, payload):
    """The members' payloads decoded, summed and divided by their count, as DeviceOuter does."""
    acc = torch.zeros(n, device=device)
    for _ in range(args.members):
        codec.decode_add(payload, acc)
    return acc if args.members == 1 else acc.div_(args.members)


with torch.no_grad():
    for name in args.codecs.split(","):
        codec = _outer.Codec(name) if name != "fp32" else None
        delta = theta - params
        payload = codec.encode(delta) if codec else None
        # (label, on the training stream?, the work)
        parts = [("start: theta - params", True, lambda: theta - params)]
        if codec:
            parts += [
                ("encode", False, lambda: codec.encode(delta)),
                ("finite flag", False, lambda: torch.isfinite(delta).all()),
                ("decode: the mean outer gradient", False, lambda: decode_mean(codec, payload)),
                ("theta - mean", False, lambda: theta - delta),
            ]
        avg = theta - delta
        th, mo, new_mom = theta.clone(), mom.clone(), torch.empty_like(mom)
        parts += [
            ("outer step (Nesterov), ahead", False,
             lambda: _outer.outer_sgd_step(th, mo, avg, 0.9, 0.7, True, theta_out=th, mom_out=new_mom)),
            ("merge: the new outer state in", True, lambda: (th.copy_(avg), mo.copy_(new_mom))),
            ("merge: mix with alpha 0.5", True, lambda: _outer.mix(local, th, 0.5)),
        ]
        totals = {True: 0.0, False: 0.0}
        print(f"\n{name}:")
        for label, training, f in parts:
            s = median_seconds(f, device, args.repeat)
            totals[training] += s
            print(f"  {label:<34} {s * 1e3:9.3f} ms  {'training stream' if training else 'loco stream (background)'}")
        print(f"  {'a sync in all':<34} {sum(totals.values()) * 1e3:9.3f} ms, of which on the training stream "
              f"{totals[True] * 1e3:.3f} ms")
