"""Partial parameter updates in loco.torch (docs/partial.md): a member trains one slice of each
sliced projection, so its model is rewritten inside wrap() to hold no gradient, no optimizer
state and no weight-gradient product for the rest.

Each sliced nn.Linear keeps its full `weight`, now a buffer (a view of loco's parameter buffer,
so the outer synchronizations write every entry), and gains `weight_slice`, the parameter that
this member trains: rows [lo, hi) of the weight for a projection whose output units are sliced
(gate/up), columns [lo, hi) for one whose input units are (down), a view of the same memory. The
forward is nn.Linear's product with the whole weight (the same values, under autocast too); the
backward computes the input gradient through the whole weight and the weight gradient of the
slice alone. The module's state_dict still holds `weight` in its original shape, and loading one
fills the slice too."""
import torch as _torch
import torch.nn.functional as _F
from torch import nn as _nn

from loco import _loco


def _autocast_dtype(device_type):
    """The dtype autocast computes a linear layer in on device_type, or None when it is off."""
    try:
        if not _torch.is_autocast_enabled(device_type):
            return None
        return _torch.get_autocast_dtype(device_type)
    except (TypeError, AttributeError):  # torch before 2.4: one function per device type
        if device_type == "cuda":
            return _torch.get_autocast_gpu_dtype() if _torch.is_autocast_enabled() else None
        if device_type == "cpu":
            return _torch.get_autocast_cpu_dtype() if _torch.is_autocast_cpu_enabled() else None
        return None


class _SlicedLinear(_torch.autograd.Function):
    """y = x W^T with W whole (the slice's values are in it: a view of the same memory); the
    gradient of x through W, that of the slice only for its rows (dim 0) or columns (dim 1)."""

    @staticmethod
    def forward(ctx, x, weight, part, dim, lo, hi):
        dtype = _autocast_dtype(x.device.type)
        xc, wc = (x, weight) if dtype is None else (x.to(dtype), weight.to(dtype))
        y = _F.linear(xc, wc)
        # The slice's weight gradient needs the input: all of it for output units, only the
        # slice's input units otherwise (saved as a copy of their own, half the activation).
        kept = xc if dim == 0 else xc[..., lo:hi].contiguous()
        ctx.save_for_backward(kept, wc)
        ctx.dim, ctx.lo, ctx.hi, ctx.x_dtype, ctx.part_dtype = dim, lo, hi, x.dtype, part.dtype
        return y

    @staticmethod
    def backward(ctx, gy):
        kept, wc = ctx.saved_tensors
        gy = gy.to(wc.dtype)
        gx = gpart = None
        if ctx.needs_input_grad[0]:
            gx = _F.linear(gy, wc.t()).to(ctx.x_dtype)  # gy W
        if ctx.needs_input_grad[2]:
            g2 = gy.reshape(-1, gy.shape[-1])
            x2 = kept.reshape(-1, kept.shape[-1])
            if ctx.dim == 0:  # rows [lo, hi): their outputs' gradients times the input
                gpart = g2[:, ctx.lo:ctx.hi].t().mm(x2)
            else:  # columns [lo, hi): the outputs' gradients times those input units, made transposed
                gpart = x2.t().mm(g2).t()  # as the slice is laid (a column-major view): no copy to match it
            gpart = gpart.to(ctx.part_dtype)
        return gx, None, gpart, None, None, None


class Sliced:
    """Mixed into the class of an nn.Linear whose weight this member trains in part."""

    def forward(self, x):
        y = _SlicedLinear.apply(x, self.weight, self.weight_slice, self._loco_dim, self._loco_lo, self._loco_hi)
        return y if self.bias is None else y + self.bias

    def _part_of(self, weight):
        return weight[self._loco_lo:self._loco_hi] if self._loco_dim == 0 else weight[:, self._loco_lo:self._loco_hi]

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination.pop(prefix + "weight_slice", None)  # `weight` holds it, in the original shape
        # A down projection's weight is a transposed view of loco's buffer: saved as a copy laid
        # out as nn.Linear's (safetensors and Hugging Face's save_pretrained refuse other strides).
        if not destination[prefix + "weight"].is_contiguous():
            destination[prefix + "weight"] = destination[prefix + "weight"].contiguous()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        key, part = prefix + "weight", prefix + "weight_slice"
        given = state_dict.get(key)
        added = given is not None and part not in state_dict and tuple(given.shape) == tuple(self.weight.shape)
        if added:
            state_dict[part] = self._part_of(given)
        try:
            super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                          error_msgs)
        finally:
            if added:
                del state_dict[part]
        if given is None and part in missing_keys:
            missing_keys.remove(part)  # reported as `weight`, the key a checkpoint holds


_CLASSES = {}


def _sliced_class(cls):
    if cls not in _CLASSES:
        _CLASSES[cls] = type(cls.__name__, (Sliced, cls), {"__module__": cls.__module__, "__qualname__": cls.__qualname__})
    return _CLASSES[cls]


def linear_of(model, name, param):
    """The nn.Linear whose weight is `param` (named `name`), checked to be one loco can slice."""
    path, _, attr = name.rpartition(".")
    module = model.get_submodule(path) if path else model
    if attr != "weight" or not isinstance(module, _nn.Linear) or module.weight is not param:
        raise _loco.Error(f"partial updates slice {name}, which is not the weight of an nn.Linear "
                          f"(it belongs to a {type(module).__name__})")
    if type(module).forward is not _nn.Linear.forward:
        raise _loco.Error(f"partial updates slice {name}, whose module {type(module).__name__} has a forward of its "
                          "own (loco replaces nn.Linear's)")
    holders = [n for n, m in model.named_modules(remove_duplicate=False)
               if any(p is param for p in m._parameters.values())]
    if len(holders) != 1:
        raise _loco.Error(f"partial updates slice {name}, which is shared by modules {', '.join(holders)}")
    return module


def slice_linear(module, full, part, dim, lo, hi):
    """Rewrites `module` (from linear_of): its weight becomes the buffer `full` (a tensor of the
    weight's shape), its trained units [lo, hi) along dim (0: rows, 1: columns) the parameter
    `part` (a view of the same memory). Returns the new parameter."""
    del module._parameters["weight"]
    module.__class__ = _sliced_class(type(module))
    module.register_buffer("weight", full)
    module.weight_slice = _nn.Parameter(part)
    module._loco_dim, module._loco_lo, module._loco_hi = dim, int(lo), int(hi)
    return module.weight_slice


def check_optimizer_fresh(opt, params):
    """An optimizer about to be pointed at new parameters must hold no state for the old ones."""
    if opt is None:
        return
    ids = {id(p) for p in params}
    if any(id(p) in ids and bool(s) for p, s in opt.state.items()):
        raise _loco.Error("partial updates give the inner optimizer new parameters (each member's slices): call "
                          "loco.torch.wrap() before the optimizer's first step")


def repoint_optimizer(opt, new_of):
    """Points opt's parameter groups at the new parameters (new_of: id(old) -> new)."""
    if opt is None:
        return
    for group in opt.param_groups:
        group["params"] = [new_of.get(id(p), p) for p in group["params"]]


def state_bytes(opt):
    """Bytes of the tensors an optimizer holds as state."""
    total = 0
    for s in opt.state.values():
        for v in s.values():
            if isinstance(v, _torch.Tensor):
                total += v.numel() * v.element_size()
    return total
