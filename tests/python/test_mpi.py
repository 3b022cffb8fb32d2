"""Under mpirun -np 2: loco.torch's DiLoCo and Streaming DiLoCo across MPI processes equal the
same methods written with torch.distributed (gloo) and torch.optim.SGD with Nesterov, in the
same processes. Run by ctest as python.mpi."""
import os
import sys

import torch
import torch.distributed as dist

import loco
import loco.torch
from llama_torch import batch, inner_step, make_model, make_opt, max_diff, params_of

TOL = 1e-6
H, STEPS, OUTER_LR, MOMENTUM = 4, 12, 0.7, 0.9


def loco_run(method, **kw):
    model = make_model(rank)  # each rank its own init: wrap() starts every replica from rank 0's
    opt = make_opt(model)
    sync = loco.torch.wrap(model, opt, method, inner_steps=H, outer_lr=OUTER_LR, outer_momentum=MOMENTUM, **kw)
    for t in range(STEPS):
        inner_step(model, opt, rank, t)
        opt.step()
        opt.zero_grad()
        sync.step()
    out = params_of(model), sync.metrics()
    sync.close()
    return out


def reference(fragments, offsets):
    """DiLoCo (one fragment, offset 0) or Streaming DiLoCo with tau = 0, alpha = 0, with gloo."""
    model = make_model(0)
    opt = make_opt(model)
    outer = [torch.nn.Parameter(p.detach().clone()) for p in model.parameters()]
    outer_opt = torch.optim.SGD(outer, lr=OUTER_LR, momentum=MOMENTUM, nesterov=True)
    ps = list(model.parameters())
    for done in range(1, STEPS + 1):
        inner_step(model, opt, rank, done - 1)
        opt.step()
        opt.zero_grad()
        for frag, off in zip(fragments, offsets):
            if done > off and (done - off) % H == 0:
                for o in outer:
                    o.grad = None
                for i in frag:
                    avg = ps[i].detach().clone()
                    dist.all_reduce(avg)
                    avg /= size
                    outer[i].grad = outer[i].detach() - avg
                outer_opt.step()
                with torch.no_grad():
                    for i in frag:
                        ps[i].copy_(outer[i])
    return params_of(model)


torch.set_num_threads(1)
ep = loco.init()
rank, size = ep.rank, ep.size
assert size == 2, "run under mpirun -np 2"
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
dist.init_process_group("gloo", rank=rank, world_size=size)

failures = 0
got, metrics = loco_run("diloco")
d = max_diff(got, reference([list(range(len(got)))], [0]))
ok = d <= TOL and metrics["bytes_sent"] > 0
print(f"rank {rank}: diloco over MPI vs torch.distributed: max diff {d:.2e}, sent {metrics['bytes_sent']} B "
      f"{'ok' if ok else 'FAIL'}", flush=True)
failures += not ok

names = [n for n, _ in make_model(0).named_parameters()]
frag = [[i for i, n in enumerate(names) if n.startswith("layers.0.")],
        [i for i, n in enumerate(names) if n.startswith("layers.1.")],
        [i for i, n in enumerate(names) if not n.startswith("layers.")]]
got, _ = loco_run("streaming", fragment_blocks=1, tau=0, alpha=0.0)
d = max_diff(got, reference(frag, [0, 1, 2]))  # offsets j floor(4 / 3)
ok = d <= TOL
print(f"rank {rank}: streaming over MPI vs torch.distributed: max diff {d:.2e} {'ok' if ok else 'FAIL'}", flush=True)
failures += not ok

# A member that is a node of several GPUs: each rank's model inside torch's DDP (the two ranks one
# node's processes, their gradients averaged in backward by gloo) and loco's DiLoCo across the
# same ranks. wrap() takes the DDP module (its parameters named module.*); the result equals DDP
# with the same outer steps written in torch.
def ddp_inside(use_loco):
    model = make_model(0)
    model.forward = model.loss
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = make_opt(model)
    sync = loco.torch.wrap(ddp, opt, "diloco", inner_steps=H, outer_lr=OUTER_LR, outer_momentum=MOMENTUM) \
        if use_loco else None
    outer = [torch.nn.Parameter(p.detach().clone()) for p in model.parameters()]
    outer_opt = torch.optim.SGD(outer, lr=OUTER_LR, momentum=MOMENTUM, nesterov=True)
    for t in range(STEPS):
        ddp(*batch(rank, t)).backward()
        opt.step()
        opt.zero_grad()
        if use_loco:
            sync.step()
        elif (t + 1) % H == 0:
            for o, p in zip(outer, model.parameters()):
                avg = p.detach().clone()
                dist.all_reduce(avg)
                o.grad = o.detach() - avg / size
            outer_opt.step()
            with torch.no_grad():
                for o, p in zip(outer, model.parameters()):
                    p.copy_(o)
    if use_loco:
        sync.close()
    return params_of(model)


d = max_diff(ddp_inside(True), ddp_inside(False))
ok = d <= TOL
print(f"rank {rank}: diloco around torch DDP vs DDP with torch's outer steps: max diff {d:.2e} "
      f"{'ok' if ok else 'FAIL'}", flush=True)
failures += not ok

# loco.init() without threads= gives loco 1 compute thread; wrap() of a model on a GPU (its
# policy, called here: no GPU in CI) raises that to half the host's cores, once.
before = loco._loco.threads()
loco._threads_for_device()
after = loco._loco.threads()
loco._loco.set_threads(3)
loco._threads_for_device()
ok = before == 1 and after == max(1, (os.cpu_count() or 2) // 2) and loco._loco.threads() == 3
print(f"rank {rank}: loco's threads after init {before}, for a GPU model {after}, then kept at "
      f"{loco._loco.threads()} {'ok' if ok else 'FAIL'}", flush=True)
failures += not ok

dist.destroy_process_group()
sys.exit(1 if failures else 0)
