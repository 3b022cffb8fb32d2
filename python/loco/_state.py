"""What an elastic loco.torch member hands a joiner and compares at join (python/loco/torch.py):
the inner optimizer's state as bytes without pickle, and what identifies the model and the
optimizer beyond their tensors' shapes."""

import hashlib
import json
import struct

import torch as _torch

from loco import _loco

# An optimizer's state_dict as bytes without pickle (what an elastic joiner receives comes from
# a peer: decoding it runs no code): a JSON tree of dicts, lists, tuples and plain values whose
# tensors point into the raw bytes that follow it.
_DTYPES = {str(t): t for t in (_torch.float32, _torch.float64, _torch.float16, _torch.bfloat16, _torch.int64,
                               _torch.int32, _torch.int16, _torch.int8, _torch.uint8, _torch.bool)}


def pack_state(obj):
    """obj (dicts keyed by plain values, lists, tuples, None, bool, int, float, str and tensors) as bytes."""
    chunks, at = [], [0]

    def enc(x):
        if isinstance(x, _torch.Tensor):
            t = x.detach().to("cpu").contiguous()
            if str(t.dtype) not in _DTYPES:
                raise _loco.Error(f"the inner optimizer's state holds a {t.dtype} tensor, which loco cannot send")
            raw = t.view(-1).view(_torch.uint8).numpy().tobytes() if t.numel() else b""
            chunks.append(raw)
            at[0] += len(raw)
            return {"T": [at[0] - len(raw), len(raw), str(t.dtype), list(t.shape)]}
        if isinstance(x, dict):
            if not all(k is None or isinstance(k, (bool, int, float, str)) for k in x):
                raise _loco.Error("the inner optimizer's state has a key that is not a number or a string, "
                                  "which loco cannot send")
            return {"d": [[enc(k), enc(v)] for k, v in x.items()]}
        if isinstance(x, (list, tuple)):
            return {"l" if isinstance(x, list) else "t": [enc(v) for v in x]}
        if x is None or isinstance(x, (bool, int, float, str)):
            return {"v": x}
        raise _loco.Error(f"the inner optimizer's state holds a {type(x).__name__}, which loco cannot send")

    head = json.dumps(enc(obj)).encode()
    return struct.pack("<Q", len(head)) + head + b"".join(chunks)


def unpack_state(data):
    """The object pack_state encoded; every size and type checked (the bytes may be hostile)."""
    data = bytes(data)
    if len(data) < 8:
        raise _loco.Error("the inner optimizer state received is corrupt (too short)")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise _loco.Error("the inner optimizer state received is corrupt (header size)")
    try:
        tree = json.loads(data[8:8 + n])
    except (ValueError, RecursionError) as e:  # RecursionError: nested deeper than the parser goes
        raise _loco.Error(f"the inner optimizer state received is corrupt ({type(e).__name__}: {e})") from None
    raw = memoryview(data)[8 + n:]

    def dec(x, depth=0):
        if depth > 64 or not isinstance(x, dict) or len(x) != 1:
            raise _loco.Error("the inner optimizer state received is corrupt (structure)")
        (kind, v), = x.items()
        if kind == "v" and (v is None or isinstance(v, (bool, int, float, str))):
            return v
        if kind in ("l", "t") and isinstance(v, list):
            out = [dec(e, depth + 1) for e in v]
            return out if kind == "l" else tuple(out)
        if kind == "d" and isinstance(v, list) and all(isinstance(e, list) and len(e) == 2 for e in v):
            # Keys are plain values (an optimizer's are parameter indices and names).
            if not all(isinstance(k, dict) and list(k) == ["v"] for k, _ in v):
                raise _loco.Error("the inner optimizer state received is corrupt (a key that is not a plain value)")
            return {dec(k, depth + 1): dec(e, depth + 1) for k, e in v}
        if kind == "T" and isinstance(v, list) and len(v) == 4:
            off, size, dtype, shape = v
            whole = lambda x: isinstance(x, int) and not isinstance(x, bool)  # noqa: E731
            ok = (whole(off) and whole(size) and dtype in _DTYPES and isinstance(shape, list) and len(shape) <= 64
                  and all(whole(d) and 0 <= d < 1 << 62 for d in shape) and 0 <= off <= len(raw) - size and size >= 0)
            if ok:
                dt = _DTYPES[dtype]
                numel = 1
                for d in shape:
                    numel *= d
                ok = numel * _torch.tensor([], dtype=dt).element_size() == size
            if not ok:
                raise _loco.Error("the inner optimizer state received is corrupt (a tensor's extent)")
            if size == 0:
                return _torch.zeros(shape, dtype=dt)
            return _torch.frombuffer(bytearray(raw[off:off + size]), dtype=dt).reshape(shape)
        raise _loco.Error("the inner optimizer state received is corrupt (structure)")

    return dec(tree)


def _digest(text):
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _scalars(obj, skip=()):
    """The plain settings an object holds (numbers, strings, bools, tuples of them), as text."""
    out = []
    for k, v in sorted(vars(obj).items()):
        if k.startswith("_") or k in skip:
            continue
        if isinstance(v, (bool, int, float, str)) or (isinstance(v, tuple) and all(
                isinstance(e, (bool, int, float, str)) for e in v)):
            out.append(f"{k}={v!r}")
    return ",".join(out)


_FROZEN_PIECE = 1 << 23  # values summed at a time: |bits| < 2^31 times weights <= 128, exact in int64


def frozen_digest(model):
    """The values of the model's frozen parameters (requires_grad False, e.g. a pretrained base
    under adapters), as a digest: loco neither sends nor averages them, so the members must start
    from the same ones. Each tensor's bits as integers, weighted by their position within pieces
    of 2^23 values and summed on its device (exact in any order: the same sum on the CPU and on a
    GPU, one wait for the device per tensor), then BLAKE2b over the names, dtypes, shapes and
    sums."""
    frozen = [(name, p) for name, p in model.named_parameters() if not p.requires_grad]
    longest = min(_FROZEN_PIECE, max((p.numel() for _, p in frozen), default=0))
    lines, work = [], {}  # device -> (an int64 piece to convert into, the positions' weights)
    with _torch.no_grad():
        for name, p in frozen:
            flat = p.detach().reshape(-1)
            size = flat.element_size()
            bits = flat.view(_torch.uint8 if size == 1 else _torch.int16 if size == 2 else _torch.int32)
            if bits.device not in work:  # made once: new memory's first touch is what costs on a CPU
                positions = _torch.arange(longest, dtype=_torch.int64, device=bits.device)
                work[bits.device] = (_torch.empty_like(positions), positions.bitwise_and_(127).add_(1))
            buf, weight = work[bits.device]
            total = _torch.zeros((), dtype=_torch.int64, device=bits.device)
            for i in range(0, bits.numel(), _FROZEN_PIECE):
                part = bits[i:i + _FROZEN_PIECE]
                n = part.numel()
                total += buf[:n].copy_(part).mul_(weight[:n]).sum()
            lines.append(f"{name}:{p.dtype}:{tuple(p.shape)}:{int(total)}")
    return f"{len(lines)} tensors, {_digest(chr(10).join(lines))}" if lines else "none"


# Parameter-group entries members may hold apart: the learning rate (a schedule moves it) and how
# the step is computed rather than what (a GPU member's fused kernels, a CPU member's loop).
_NOT_COMPARED = ("params", "lr", "initial_lr", "foreach", "fused", "capturable", "differentiable")


def identity(model, opt):
    """What the members must share beyond the parameters' names and shapes, compared when a
    member joins an elastic run and when the members of a fixed world start: the model's
    architecture (a Hugging Face model's config; else its modules' classes and plain settings,
    e.g. a head count that leaves every shape as it is), the inner optimizer's kind and settings
    (its learning rate aside, which a schedule moves, and its implementation flags: fused,
    foreach, ...) and the frozen parameters' values."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "to_dict"):
        d = {k: v for k, v in config.to_dict().items() if k not in ("_name_or_path", "transformers_version", "torch_dtype")}
        arch = type(model).__name__ + " " + json.dumps(d, sort_keys=True, default=str)
    else:
        arch = ";".join(f"{name}:{type(m).__name__}({_scalars(m, skip=('training',))})"
                        for name, m in model.named_modules())
    opts = opt if isinstance(opt, (list, tuple)) else [opt]
    groups = []
    for o in opts:
        for g in getattr(o, "param_groups", []):
            groups.append(",".join(f"{k}={v!r}" for k, v in sorted(g.items())
                                   if k not in _NOT_COMPARED and isinstance(v, (bool, int, float, str, tuple))))
        groups.append("/")  # where one optimizer's groups end
    kinds = " + ".join(type(o).__name__ for o in opts)
    return {"model architecture": f"{type(model).__name__}, {_digest(arch)}",
            "inner optimizer": f"{kinds}, {_digest('|'.join(groups))}",
            "frozen parameters": frozen_digest(model)}


class InnerState:
    """What an elastic member's session calls: the inner optimizers' state for a joiner (one
    optimizer's state_dict, or a list of them for several), and installing it in one."""

    def __init__(self, opts):
        self._opts = list(opts) if isinstance(opts, (list, tuple)) else [opts]

    def save_inner(self):
        states = [o.state_dict() for o in self._opts]
        return pack_state(states[0] if len(states) == 1 else states)

    def load_inner(self, data):
        state = unpack_state(data)
        if len(self._opts) > 1:
            if not isinstance(state, list) or len(state) != len(self._opts):
                raise _loco.Error(f"the inner optimizer state received does not fit this member's {len(self._opts)} "
                                  "optimizers; the members must use the same optimizers")
        else:
            state = [state]
        for opt, one in zip(self._opts, state):  # all checked before any is installed
            _check_one(opt, one)
        for opt, one in zip(self._opts, state):
            _load_one(opt, one)


def _check_one(opt, state):
    """One optimizer's state received from a peer, checked before anything is installed."""
    bad = []

    def finite(x, where):
        if isinstance(x, _torch.Tensor):
            if x.is_floating_point() and not bool(_torch.isfinite(x).all()):
                bad.append(where)
        elif isinstance(x, dict):
            for k, v in x.items():
                finite(v, f"{where}[{k!r}]")
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                finite(v, f"{where}[{i}]")
        elif isinstance(x, float) and (x != x or abs(x) == float("inf")):
            bad.append(where)

    finite(state, "state")
    if bad:  # a member whose optimizer state went wrong must not hand it on
        raise _loco.Error(f"the inner optimizer state received holds non-finite values ({', '.join(bad[:3])}"
                          f"{', ...' if len(bad) > 3 else ''}); refusing it")
    # torch takes another optimizer's state without a word and fails at its next step: the
    # parameter groups must have this optimizer's settings and sizes.
    mine = opt.state_dict()["param_groups"]
    theirs = state.get("param_groups") if isinstance(state, dict) else None
    shape = lambda gs: [(sorted(k for k in g if k != "params"), len(g.get("params", []))) for g in gs]
    if not isinstance(theirs, list) or not all(isinstance(g, dict) for g in theirs) or shape(theirs) != shape(mine):
        raise _loco.Error("the inner optimizer state received does not fit this member's optimizer (its "
                          f"parameter groups differ: {type(opt).__name__} here); the members must use "
                          "one kind of optimizer with the same settings")


def _load_one(opt, state):
    try:
        opt.load_state_dict(state)
    except (KeyError, ValueError, TypeError) as e:
        raise _loco.Error(f"the inner optimizer state received does not fit this member's optimizer "
                          f"({type(e).__name__}: {e})") from None
