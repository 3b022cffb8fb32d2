"""The Python layer's tests' model (examples/llama.py, small), batches, and reference implementations of
loco's methods written in plain torch (torch.optim.SGD with Nesterov for the outer step), to
which loco.torch's runs are compared."""
import os

import torch
from torch import nn

from llama import Llama  # examples/llama.py

VOCAB, SEQ, BATCH = 64, 16, 4
# LOCO_TEST_DEVICE=cuda puts the tests' models and batches on a GPU (scripts/gpu-session.sh runs
# test_partial.py so, with deterministic kernels); the default is the CPU.
DEVICE = torch.device(os.environ.get("LOCO_TEST_DEVICE", "cpu"))
if DEVICE.type == "cuda":
    torch.use_deterministic_algorithms(True)  # the embedding's backward adds atomically otherwise


def make_model(seed, layers=2):
    torch.manual_seed(seed)
    return Llama(VOCAB, d=32, layers=layers, heads=4, f=48).to(DEVICE)


def make_opt(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)


def opt_step(opt):
    """opt.step(), for one optimizer or a list of them."""
    for o in opt if isinstance(opt, list) else [opt]:
        o.step()


def opt_zero(opt):
    for o in opt if isinstance(opt, list) else [opt]:
        o.zero_grad()


def batch(replica, step):
    """Replica `replica`'s batch of step `step` (its own data)."""
    g = torch.Generator().manual_seed(1000 * replica + step)
    t = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g).to(DEVICE)
    return t[:, :-1], t[:, 1:]


def inner_step(model, opt, replica, step):
    x, y = batch(replica, step)
    loss = model.loss(x, y)
    loss.backward()
    return loss


def params_of(model):
    """The model's weights in their original shapes and order (its state_dict: a module that
    loco.torch's partial updates rewrote holds its weight as a buffer there, the slice it trains
    as a parameter of its own)."""
    return [v.detach().clone() for v in model.state_dict().values()]


def reference_ddp(M, steps, clip=None, skip=(), opt_of=None):
    """One model per replica, gradients averaged (then clipped to norm `clip`) before each AdamW
    step (opt_of(model): another optimizer, or a list of them); no optimizer step at the steps in
    skip."""
    models, opts = _replicas(M, opt_of=opt_of)
    for t in range(steps):
        for r in range(M):
            inner_step(models[r], opts[r], r, t)
        with torch.no_grad():
            for ps in zip(*(m.parameters() for m in models)):
                mean = sum(p.grad for p in ps) / M
                for p in ps:
                    p.grad.copy_(mean)
        if clip is not None:
            for m in models:
                torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
        for o in opts:
            if t not in skip:
                opt_step(o)
            opt_zero(o)
    return [params_of(m) for m in models]


def _replicas(M, seed=0, prepare=None, opt_of=None):
    """M replicas from one initialization (make_model(seed), then prepare(model)), each with its
    own AdamW (or opt_of(model))."""
    models = [make_model(seed) for _ in range(M)]
    for m in models if prepare is not None else []:
        prepare(m)
    return models, [(opt_of or make_opt)(m) for m in models]


def _inner_steps(models, opts, step, skip=()):
    """Step `step` of every replica on its own data (its optimizer step left out where (replica,
    step) is in skip)."""
    for r, (m, o) in enumerate(zip(models, opts)):
        inner_step(m, o, r, step)
        if (r, step) not in skip:
            opt_step(o)
        opt_zero(o)


def _outer(model0, lr, momentum, nesterov=True):
    outer = [nn.Parameter(p.detach().clone()) for p in model0.parameters()]
    return outer, torch.optim.SGD(outer, lr=lr, momentum=momentum, nesterov=nesterov)


def reference_diloco(M, steps, H, outer_lr, outer_momentum, seed=0, skip=(), prepare=None, opt_of=None):
    """DiLoCo: every H steps the outer gradient theta - mean(theta_m) takes an SGD step with
    Nesterov momentum, and every replica restarts from the outer parameters. skip: (replica,
    step) pairs without an optimizer step; prepare: as _replicas' (frozen parameters keep their
    values: their outer gradient is 0); opt_of: as _replicas'."""
    models, opts = _replicas(M, seed, prepare, opt_of)
    outer, outer_opt = _outer(models[0], outer_lr, outer_momentum)
    for t in range(steps):
        _inner_steps(models, opts, t, skip)
        if (t + 1) % H == 0:
            with torch.no_grad():
                for i, o in enumerate(outer):
                    avg = sum(list(m.parameters())[i] for m in models) / M
                    o.grad = o.detach() - avg
            outer_opt.step()
            with torch.no_grad():
                for m in models:
                    for p, o in zip(m.parameters(), outer):
                        p.copy_(o)
    return [params_of(m) for m in models], [o.detach().clone() for o in outer]


SLICED_HEADS = ("q_proj.weight", "k_proj.weight", "v_proj.weight")


def _slice_mask(name, p, n, N, heads=False):
    """True where slice n of N trains parameter `name` (docs/partial.md, MLP strategy): rows
    [n f/N, (n+1) f/N) of gate_proj and up_proj (f x d), the same columns of down_proj (d x f);
    with heads also the rows of heads [n h/N, (n+1) h/N) of q_proj, k_proj and v_proj (the test
    model has as many key/value heads as query heads, so these are rows [n d/N, (n+1) d/N));
    everything else on every slice."""
    mask = torch.ones_like(p, dtype=torch.bool)
    if heads and name.endswith(SLICED_HEADS):
        rows = p.shape[0]
        mask.zero_()
        mask[n * rows // N:(n + 1) * rows // N] = True
    elif name.endswith(("gate_proj.weight", "up_proj.weight", "down_proj.weight")):
        f = p.shape[1] if name.endswith("down_proj.weight") else p.shape[0]
        lo, hi = n * f // N, (n + 1) * f // N
        mask.zero_()
        if name.endswith("down_proj.weight"):
            mask[:, lo:hi] = True
        else:
            mask[lo:hi] = True
    return mask


def reference_partial(M, steps, H, outer_lr, outer_momentum, N, heads=False):
    """DiLoCo with partial parameter updates: replica k trains slice k mod N only (its gradients
    elsewhere zeroed, and AdamW's step undone there: those entries change only at the outer
    step); every H steps an entry's outer gradient is theta minus the mean over the replicas
    that train it. (loco's sliced projections compute nn.Linear's products.)"""
    models, opts = _replicas(M)
    names = [n for n, _ in models[0].named_parameters()]
    masks = [[_slice_mask(n, p, r % N, N, heads) for n, p in m.named_parameters()] for r, m in enumerate(models)]
    outer, outer_opt = _outer(models[0], outer_lr, outer_momentum)
    for t in range(steps):
        for r, (m, o) in enumerate(zip(models, opts)):
            inner_step(m, o, r, t)
            with torch.no_grad():
                kept = []
                for p, mask in zip(m.parameters(), masks[r]):
                    p.grad[~mask] = 0
                    kept.append(p.detach().clone())
            o.step()
            o.zero_grad()
            with torch.no_grad():
                for p, mask, old in zip(m.parameters(), masks[r], kept):
                    p[~mask] = old[~mask]
        if (t + 1) % H == 0:
            with torch.no_grad():
                for i, o in enumerate(outer):
                    total = sum(list(m.parameters())[i] * masks[r][i] for r, m in enumerate(models))
                    count = sum(masks[r][i].float() for r in range(M))
                    o.grad = o.detach() - total / count
            outer_opt.step()
            with torch.no_grad():
                for m in models:
                    for p, o in zip(m.parameters(), outer):
                        p.copy_(o)
    assert len(names) == len(outer)
    return [params_of(m) for m in models], [o.detach().clone() for o in outer]


def reference_streaming(M, steps, H, outer_lr, outer_momentum, fragments, tau, alpha, skip=()):
    """Streaming DiLoCo: fragment j (a list of parameter indices) syncs at steps offset_j + kH
    (offset_j = j floor(H / F)); its outer step is taken on the replicas' mean when the sync
    starts, and merged tau steps later as alpha local + (1 - alpha) outer. skip: (replica, step)
    pairs without an optimizer step."""
    models, opts = _replicas(M)
    outer, outer_opt = _outer(models[0], outer_lr, outer_momentum)
    F = len(fragments)
    offsets = [j * (H // F) for j in range(F)]
    pending = []
    for done in range(1, steps + 1):
        _inner_steps(models, opts, done - 1, skip)
        for j, frag in enumerate(fragments):
            if done > offsets[j] and (done - offsets[j]) % H == 0:
                with torch.no_grad():
                    for o in outer:
                        o.grad = None
                    for i in frag:
                        avg = sum(list(m.parameters())[i] for m in models) / M
                        outer[i].grad = outer[i].detach() - avg
                outer_opt.step()  # parameters without a gradient are left alone
                pending.append((done + tau, frag, [outer[i].detach().clone() for i in frag]))
        for at, frag, values in [p for p in pending if p[0] == done]:
            with torch.no_grad():
                for m in models:
                    ps = list(m.parameters())
                    for i, v in zip(frag, values):
                        ps[i].copy_(alpha * ps[i] + (1 - alpha) * v)
        pending = [p for p in pending if p[0] != done]
    return [params_of(m) for m in models]


def reference_noloco(M, steps, H, beta, alpha, gamma, groups_of):
    """NoLoCo: every H steps, within each group of the round (groups_of(k), loco's partition):
    d_j = theta_j - phi_j; delta_i = alpha delta_i + beta mean(d) - gamma (phi_i - mean(phi));
    phi_i += delta_i; theta_i = phi_i."""
    models, opts = _replicas(M)
    phi = [params_of(models[0]) for _ in range(M)]
    delta = [[torch.zeros_like(p) for p in phi[0]] for _ in range(M)]
    for t in range(steps):
        _inner_steps(models, opts, t)
        if (t + 1) % H == 0:
            k = (t + 1) // H
            theta = [params_of(m) for m in models]
            new_phi = [None] * M
            for group in groups_of(k):
                for i in group:
                    out = []
                    for n in range(len(phi[i])):
                        mean_d = sum(theta[j][n] - phi[j][n] for j in group) / len(group)
                        mean_phi = sum(phi[j][n] for j in group) / len(group)
                        delta[i][n] = alpha * delta[i][n] + beta * mean_d - gamma * (phi[i][n] - mean_phi)
                        out.append(phi[i][n] + delta[i][n])
                    new_phi[i] = out
            phi = new_phi
            with torch.no_grad():
                for r in range(M):
                    for p, v in zip(models[r].parameters(), phi[r]):
                        p.copy_(v)
    return [params_of(m) for m in models]


def max_diff(a, b):
    """The largest difference of two lists of tensors, on the host (eval_parameters() gives host
    tensors, a model on a GPU its own)."""
    return max(float((x.detach().cpu() - y.detach().cpu()).abs().max()) for x, y in zip(a, b))
