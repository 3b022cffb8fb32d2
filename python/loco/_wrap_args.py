"""What loco.torch.wrap() takes, read before the method starts: its keywords as loco's config
keys, the model's blocks and the projections partial updates slice, and the inner optimizers."""
import numbers
import os
import re

import torch as _torch

from loco import _is_bool, _loco

METHODS = ("ddp", "diloco", "streaming", "noloco")


def as_device():
    """LOCO_TORCH_AS_DEVICE=1: CPU models take the path of GPU ones (read at wrap())."""
    return os.environ.get("LOCO_TORCH_AS_DEVICE", "0") not in ("", "0")


# The config sections a method reads first, so that a keyword means that method's key: NoLoCo's
# outer_lr is noloco.outer_lr, Streaming DiLoCo's inner_steps outer.inner_steps.
# Data-parallel reads no method keys; it takes outer.* ones like DiLoCo, unused, so that one loop
# can pass the same keywords to every method.
_SECTIONS = {"ddp": ["outer"], "diloco": ["outer"], "streaming": ["streaming", "outer"], "noloco": ["noloco"]}


def config_key(name, keys, method):
    """The config key keyword `name` names (rules above)."""
    dotted = name.replace("_", ".", 1)
    own = [f"{sec}.{name}" for sec in _SECTIONS.get(method, []) if f"{sec}.{name}" in keys]
    if own:
        key = own[0]
    elif dotted in keys:
        key = dotted
    else:
        matches = [k for k in keys if k.rsplit(".", 1)[-1] == name]
        if len(matches) == 1:
            key = matches[0]
        elif matches:
            raise _loco.Error(f"keyword {name} is ambiguous: it could be {', '.join(matches)} "
                              f"(write the full key with an underscore for the dot, e.g. {matches[0].replace('.', '_', 1)})")
        else:
            raise _loco.Error(f"unknown keyword {name}: no loco config key {dotted} or ending in .{name} "
                              "(docs/configs.md lists them)")
    return key


def toml(name, value):
    """`value` as a TOML value for `key=value` settings: a bool, a number (NumPy's too), a string
    or a path (os.PathLike)."""
    if _is_bool(value):
        text = "true" if value else "false"
    elif isinstance(value, numbers.Integral):
        text = repr(int(value))
    elif isinstance(value, numbers.Real):
        text = repr(float(value))
    elif isinstance(value, (str, os.PathLike)):
        value = os.fspath(value)
        if not isinstance(value, str):
            raise _loco.Error(f"keyword {name}: a path as text (str or pathlib.Path), got bytes")
        if any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise _loco.Error(f"keyword {name}: {value!r} holds a control character")
        text = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    else:
        raise _loco.Error(f"keyword {name}: expected a number, a string or a bool, got {type(value).__name__}")
    return text


_BLOCK = re.compile(r"^(.*?)\.(\d+)\.")
_MLP = {"gate_proj.weight": "gate", "up_proj.weight": "up", "down_proj.weight": "down"}
_HEADS = {"q_proj.weight": "q", "k_proj.weight": "k", "v_proj.weight": "v"}


def sliced_kind(name, heads):
    """"gate", "up" or "down" for a block's MLP projection named as in Hugging Face's Llama
    (...mlp.gate_proj.weight), with heads also "q", "k" or "v" for its attention projections,
    else ""."""
    kinds = {**_MLP, **_HEADS} if heads else _MLP
    return next((k for suffix, k in kinds.items() if name.endswith(suffix)), "")


def head_settings(model, values):
    """Partial updates of the heads: the head counts, given or from a Hugging Face config."""
    if "model.num_heads" in values:
        return []
    config = getattr(model, "config", None)
    heads = getattr(config, "num_attention_heads", None)
    if not isinstance(heads, int):
        raise _loco.Error('partial_strategy="mlp+heads" slices the attention heads: pass num_heads= (and '
                          "num_kv_heads= with grouped-query attention), or wrap a model with a Hugging Face config")
    kv = getattr(config, "num_key_value_heads", None)
    return [f"model.num_heads={heads}"] + ([f"model.num_kv_heads={kv}"] if isinstance(kv, int) else [])


def auto_blocks(names):
    """Block index of each parameter name: the numbered children of the module list with the
    most of them (model.layers.3.mlp... -> 3); -1 for the rest."""
    counts = {}
    for n in names:
        m = _BLOCK.match(n)
        if m:
            counts.setdefault(m.group(1), set()).add(int(m.group(2)))
    if not counts:
        return [-1] * len(names)
    prefix = max(counts, key=lambda p: (len(counts[p]), -len(p)))
    order = {i: b for b, i in enumerate(sorted(counts[prefix]))}
    out = []
    for n in names:
        m = _BLOCK.match(n)
        out.append(order[int(m.group(2))] if m and m.group(1) == prefix else -1)
    return out


def optimizers(inner_opt):
    """wrap()'s inner_opt as a list: one optimizer, or a list or tuple of them (e.g. Muon for the
    matrices and AdamW for the rest), none holding a parameter another holds."""
    opts = list(inner_opt) if isinstance(inner_opt, (list, tuple)) else [inner_opt]
    if not opts or not all(isinstance(o, _torch.optim.Optimizer) for o in opts):
        kinds = sorted({type(o).__name__ for o in opts})
        raise _loco.Error(f"inner_opt: a torch.optim.Optimizer or a list of them (got {', '.join(kinds) or 'an empty list'})")
    owner = {}
    for k, opt in enumerate(opts):
        for group in opt.param_groups:
            for p in group["params"]:
                if owner.setdefault(id(p), k) != k:
                    raise _loco.Error(f"inner_opt: optimizers {owner[id(p)]} and {k} both hold a parameter "
                                      f"of shape {tuple(p.shape)}; each parameter must have one optimizer")
    return opts
