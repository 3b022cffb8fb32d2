"""loco's training methods around an unchanged PyTorch loop.

    sync = loco.torch.wrap(model, inner_opt, method="diloco", inner_steps=30, outer_lr=0.7)
    for batch in data:
        loss = model(batch); loss.backward(); inner_opt.step(); inner_opt.zero_grad()
        sync.step()

wrap() lays the model's parameters and gradients onto the flat buffers of a C++ Method (torch
tensors that are views of its memory: no copy on CPU) and hooks the inner optimizer's step so
that the method sees the gradients before it (data-parallel averaging happens there). sync.step()
after the optimizer step runs the method's end of step: DiLoCo's outer step every H steps,
Streaming DiLoCo's fragment syncs, NoLoCo's group averaging.

A model on a GPU keeps its parameters there, as views of one flat device tensor of the same
layout as the method's host buffer (page-locked). Before each step's hooks the method says what
they will use (Method.access: the gradients, ranges of parameters read and written); only those
cross, in one copy per range on the current CUDA stream, and a step that uses nothing (every
inner step of DiLoCo, Streaming DiLoCo and NoLoCo) copies nothing and waits for nothing.
LOCO_TORCH_AS_DEVICE=1 runs this path on CPU tensors (the device buffer a CPU tensor of its own),
so that CPU tests check it; metrics()["host_device_bytes"] counts what crossed.

Keyword arguments are loco's config keys (docs/configs.md): first a key of the method's own
sections (NoLoCo: noloco.*; Streaming DiLoCo: streaming.*, then outer.*; DiLoCo and data-parallel, which ignores them: outer.*), so
inner_steps is outer.inner_steps for DiLoCo and noloco.inner_steps for NoLoCo; else the key
with the first underscore written as a dot (outer_lr = outer.lr, train_steps = train.steps);
else the key whose last part it is, where that names one key (codec = outer.codec).
"""
import functools
import json
import time
import tomllib
import types
import weakref

import numpy as _np
import torch as _torch

import loco as _loco_pkg
from loco import _loco
from loco import _partial
from loco._run_dir import (RunDir as _RunDir, described as _described, is_number as _is_number,
                           out_dir_of as _out_dir_of, whole_count as _whole_count)
from loco._device import (Background as _Background, Clock as _Clock, Copier as _Copier,
                          GradientCopies as _GradientCopies)
from loco._outer import DeviceOuter as _DeviceOuter, applied_within as _applied_within, mix as _mix
from loco._state import InnerState as _InnerState, identity as _identity
from loco import _state
from loco._wrap_args import (METHODS, as_device as _as_device, auto_blocks as _auto_blocks, config_key as _config_key,
                             head_settings as _head_settings, optimizers as _optimizers, sliced_kind as _sliced_kind,
                             toml as _toml)

pack_state = _state.pack_state  # public: the inner optimizer's state as bytes, and back (docs/python.md)
unpack_state = _state.unpack_state


class Sync:
    """A training method bound to one model and its inner optimizer (see wrap)."""

    def __init__(self, *args):
        self._rundir = None
        try:
            self._setup(*args)
        except BaseException:
            # What it took, given back at once (an interactive session keeps the failed object
            # alive in its last traceback): out_dir's lock, the endpoint, pinned host memory.
            self._release()
            raise

    def _setup(self, model, inner_opt, method, endpoint, blocks, values, outer_device=None):
        if method not in METHODS:
            raise _loco.Error(f"method must be one of {', '.join(METHODS)}, got {method!r}")
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise _loco.Error("the model has no trainable parameters")
        opts = _optimizers(inner_opt)
        for n, p in named:
            if p.dtype != _torch.float32:
                raise _loco.Error(f"parameter {n} is {p.dtype}; loco's methods keep float32 parameters "
                                  "(train in bf16 with torch.autocast and keep the parameters float32)")
            if p.layout != _torch.strided or p.is_sparse:
                raise _loco.Error(f"parameter {n} is not a dense tensor")
        names = [n for n, _ in named]
        _check_not_wrapped(named, opts)
        if any(isinstance(m, _partial.Sliced) for m in model.modules()):
            raise _loco.Error("this model's projections were sliced by an earlier wrap() with partial updates (its "
                              "parameters are that member's slices): make a new model and load this one's "
                              "state_dict into it (it holds the whole weights), then wrap that")
        self._model_order = names
        if blocks is None:
            block_of = _auto_blocks(names)
        else:
            if isinstance(blocks, (_torch.nn.ModuleList, _torch.nn.Sequential)):
                blocks = list(blocks)
            if not isinstance(blocks, (list, tuple)) or not all(isinstance(m, _torch.nn.Module) for m in blocks):
                kinds = sorted({type(m).__name__ for m in blocks}) if isinstance(blocks, (list, tuple)) else []
                raise _loco.Error(f"blocks: a list of the model's modules, in order (got {type(blocks).__name__}"
                                  f"{' holding ' + ', '.join(kinds) if kinds else ''})")
            mine = {id(p) for _, p in named}
            owner = {}
            for b, module in enumerate(blocks):
                held = [p for p in module.parameters() if id(p) in mine]
                if not held:
                    raise _loco.Error(f"blocks: block {b} ({type(module).__name__}) holds none of the model's parameters")
                for p in held:
                    if id(p) in owner:
                        raise _loco.Error(f"blocks: block {b} shares parameters with block {owner[id(p)]}")
                    owner[id(p)] = b
            block_of = [owner.get(id(p), -1) for _, p in named]
        num_blocks = max(block_of) + 1
        order = sorted(range(len(named)), key=lambda i: (block_of[i], i))
        self._model = model
        self._opts = opts
        self._names = [names[i] for i in order]
        self._params = [named[i][1] for i in order]
        self._shapes = [p.shape for p in self._params]
        # Partial updates slice the MLP's hidden units: rows of gate_proj and up_proj (f x d) and
        # columns of down_proj (d x f), which loco lays transposed so that every slice is a row
        # block of the flat buffer (the parameter is then a transposed view of it); with
        # mlp+heads also the rows of whole heads of q_proj, k_proj and v_proj.
        slices = values.get("partial.slices", (None, 1))[1]
        partial = isinstance(slices, int) and slices > 1  # other values: the config's checks refuse them
        heads = partial and values.get("partial.strategy", (None, "mlp"))[1] == "mlp+heads"
        self._mlp = [(_sliced_kind(names[i], heads) if partial and block_of[i] >= 0 and named[i][1].dim() == 2
                      else "") for i in order]
        # Each member's slices become parameters of their own (_partial.py): checked before the
        # method starts, rewritten once the parameters live in loco's buffers.
        self._linears = {i: _partial.linear_of(model, self._names[i], self._params[i])
                         for i, kind in enumerate(self._mlp) if kind}
        for opt in opts:
            _partial.check_optimizer_fresh(opt, [self._params[i] for i in self._linears])
        tensors = []
        for i, kind in zip(order, self._mlp):
            p = named[i][1]
            rows = p.shape[0] if p.dim() >= 1 else 1
            cols = int(p.numel() // max(rows, 1))
            if kind == "down":
                rows, cols = cols, rows
            tensors.append(_loco.Tensor(names[i], block_of[i], int(rows), int(cols), kind))
        elastic = bool(endpoint.worker)
        if elastic and "train.steps" not in values:
            raise _loco.Error("an elastic run needs train_steps= (where the run ends: members finish and "
                              "joiners stop waiting there)")
        settings = [f"{key}={_toml(k, v)}" for key, (k, v) in values.items()]
        if heads:
            settings += _head_settings(model, values)
        if "train.steps" not in values:
            settings.append("train.steps=4611686018427387904")  # no last step: rounds end every H steps
        out_dir = _out_dir_of(values, endpoint)
        if out_dir is not None and not elastic and endpoint.rank == 0:  # the member that writes it, before any change
            self._rundir = _RunDir(out_dir)
        self._device = self._params[0].device
        if any(p.device != self._device for p in self._params):
            raise _loco.Error("the model's parameters are on more than one device")
        # On a device (or as if, LOCO_TORCH_AS_DEVICE=1) the parameters stay there; else they
        # become views of the method's buffer.
        self._on_device = self._device.type != "cpu" or _as_device()
        if self._device.type != "cpu":
            _loco_pkg._threads_for_device()
        held = self._outer_device(outer_device, method)
        # The method's gradient buffer: a CPU model's gradients live in it (but with partial
        # updates, torch's own, only for what this member trains); a device model's cross to it
        # only for a method that reads them. Unused, it is never allocated.
        self._core = _loco.Method(endpoint, [f'algorithm="{method}"'] + settings, tensors, num_blocks,
                                  _InnerState(opts) if elastic else None,
                                  _identity(model, opts),
                                  host_gradients=not self._on_device and not partial)
        if held:
            try:
                self._core.hold_outer()
            except _loco.Error:
                if outer_device is not None:  # asked for: refused, saying why
                    raise
                held = False  # the default: this run's settings need the host (the core said why)
        # Streaming DiLoCo's merges with alpha on a device, the outer state on the host: mixed on
        # the device (_merge_on_device), so that a merge neither copies the model's fragment to
        # the host nor waits for the device.
        config = tomllib.loads(self._core.config_toml())  # the run's resolved configuration
        self._train_steps = int(config["train"]["steps"])
        self._closed = False
        self._alpha = None
        self._merged = {}  # fragment -> its synchronized values on the device and their copy's event
        self._prepared = None  # event: the syncs decoded ahead of their merge on loco's stream (outer on the device)
        if self._on_device and not held and self._core.mix_merges_elsewhere():
            self._alpha = float(config["streaming"]["alpha"])
            self._segments = self._core.outer_segments()
        self.method = method
        self.rank = self._core.rank
        self.size = self._core.size
        self._flat = _torch.from_numpy(self._core.params())
        grads = self._core.grads()
        self._gflat = _torch.from_numpy(grads) if grads.size else None
        self._slices = []
        at = 0
        for p in self._params:
            self._slices.append((at, at + p.numel()))
            at += p.numel()
        self._partial = bool(partial)
        self._gbuf = self._gflat
        # Where the hooks' time goes, by phase: on the loop's thread and on the background's
        # (metrics()'s loop_seconds and background_seconds).
        self._clock, self._bg_clock = _Clock(), _Clock()
        self._copier = _Copier(self._device, self._clock)
        self._bg = _Background(  # a device model's sync starts, run while the loop goes on
            self._bg_clock, abort=lambda: endpoint.abort(f"member {endpoint.rank} was interrupted"))
        self._quiet_until = 0     # steps before it use nothing: their hooks are queued behind them
        self._background_syncs = 0
        self._pinned = []
        self._grad_copies = None  # data-parallel on a device: gradients copied as backward makes them
        self._copied_in_backward = 0
        if self._on_device:
            self._device_layout()
        with _torch.no_grad():
            if self._on_device:
                self._copier.to_host([(self._flat, self._dflat)])
            else:
                for i, p in enumerate(self._params):
                    self._as_param(self._flat, i).copy_(p.detach())
        self._core.broadcast_params()  # every replica starts from member 0's parameters
        with _torch.no_grad():
            if not self._on_device:
                for i, p in enumerate(self._params):
                    p.data = self._as_param(self._flat, i)
                    if self._gbuf is not None:
                        p.grad = self._as_param(self._gbuf, i)
        if self._partial:
            self._slice_modules(opts)
        self._ids = [id(p) for p in self._params]
        self._core.start(False)  # elastic: waits for the run's start, or joins it (its state, its step)
        if self._on_device and (self.size > 1 or elastic):  # member 0's parameters, or the run's
            self._copier.to_device([(self._flat, self._dflat)])
        self._outer = None
        if held:  # the outer state starts from the replicas' common parameters, on their device
            self._outer = _DeviceOuter(self._core, self._dflat, config, method)
        self._done = self._core.step
        self._synced = False
        self._stepped = set()  # the optimizers (their ids) whose step ran since the last sync.step()
        self._skipped = 0  # steps without an inner optimizer step (a GradScaler's skipped steps)
        self._out_dir = out_dir
        self._t0 = time.monotonic()
        self._tokens = 0
        self._losses = []
        self._last = None  # the last metrics record
        if out_dir is not None and self.rank == 0:
            if elastic:  # its rank known only now
                self._rundir = _RunDir(out_dir)
            self._rundir.write_config(self._core.config_toml())
        self._original_steps = [opt.step for opt in opts]
        self._held = [self]  # what the optimizers' hooks reach the sync through; close() empties it
        self._hooks = [self._hooked_step(opt, opt.step) for opt in opts]
        for opt, hooked in zip(opts, self._hooks):
            opt.step = hooked
        self._wrapped = [p for _, p in named]  # the model's parameters as the user holds them
        for p in self._wrapped:
            _WRAPPED[id(p)] = p
        self._changed_by_load = None  # the first tensor a model.load_state_dict() changed since wrap()
        self._load_hooks = self._watch_loads() if method != "ddp" else []  # until sync.load_state_dict()

    def _check_open(self, what, advice="wrap the model again to go on"):
        if self._closed:
            raise _loco.Error(f"{what} after close(): this sync has ended ({advice})")

    def _hooked_step(self, opt, original):
        """An inner optimizer's step, the method's gradient hook run first once per step (with
        several optimizers, before the first one's step: every one sees the same gradients).
        A method bound to opt, as the step it replaces: a learning-rate scheduler made after
        wrap() wraps it as it wraps an optimizer's own (torch reads its __self__ and __func__).
        It reaches the sync through self._held, which close() empties: the hook then passes the
        call on (under a scheduler's wrapper, which close() cannot take off) and holds nothing of
        the sync; until then the optimizer keeps the sync (and its communication) alive."""
        held = self._held
        key = id(opt)

        @functools.wraps(original)  # keeps what a learning-rate scheduler made before marked on it
        def step(_opt, *args, **kwargs):
            sync = held[0]
            if sync is not None:
                if key in sync._stepped:  # the method would count one step where the optimizer took two
                    raise _loco.Error("the inner optimizer's step ran twice without sync.step() between: call "
                                      "sync.step() after every optimizer step (loco's methods count steps there: "
                                      "data-parallel would not average the second step's gradients, and the syncs "
                                      "would fall behind the optimizer's steps)")
                sync._stepped.add(key)
                if not sync._synced:
                    sync.sync_gradients()
                sync._copier.before_writes()  # a sync's start may still be copying the parameters aside
            return original(*args, **kwargs)

        step._loco_sync = weakref.ref(self)  # a wrapper made later copies it: _check_not_wrapped reads it
        return types.MethodType(step, opt)

    def _watch_loads(self):
        """The DiLoCo family keeps outer parameters, set at wrap(), that model.load_state_dict()
        does not change: loaded into the model after wrap() alone, new weights would be pulled
        back towards them at the next sync. A hook before each load into a module holding
        trained tensors notes the first one the load changes; the next step refuses to go on.
        sync.load_state_dict() ends the watch (a resume loads both, in either order)."""
        held = self._held
        trained = {id(p) for p in self._params}

        def before_load(module, state, prefix, *_):
            sync = held[0]
            if sync is None or sync._changed_by_load is not None:
                return
            names = ["weight"] if isinstance(module, _partial.Sliced) else []  # the whole, of which it trains a slice
            names += [n for n, p in module._parameters.items() if p is not None and id(p) in trained]
            for n in names:
                given, current = state.get(prefix + n), getattr(module, n)
                if isinstance(given, _torch.Tensor) and given.shape == current.shape:
                    with _torch.no_grad():
                        same = _torch.equal(current, given.to(device=current.device, dtype=current.dtype))
                    if not same:
                        sync._changed_by_load = prefix + n
                        return

        def register(m):  # public since torch 2.0 (the module first), private with_module=True in 1.13
            public = getattr(m, "register_load_state_dict_pre_hook", None)
            return public(before_load) if public else m._register_load_state_dict_pre_hook(before_load, with_module=True)

        return [register(m) for m in self._model.modules()
                if isinstance(m, _partial.Sliced) or any(id(p) in trained for p in m._parameters.values())]

    def _unwatch_loads(self):
        while getattr(self, "_load_hooks", None):
            self._load_hooks.pop().remove()

    def _outer_device(self, outer_device, method):
        """Whether the outer state lives on the model's device (wrap's outer_device)."""
        if outer_device is None:  # the default: on the device of a device model, for the methods that can
            outer_device = "model" if self._device.type != "cpu" and method in ("diloco", "streaming") else "cpu"
        if outer_device == "cpu":
            return False
        if method not in ("diloco", "streaming"):
            raise _loco.Error(f"outer_device={outer_device!r}: {method} keeps its state on the host "
                              "(outer_device applies to diloco and streaming)")
        if outer_device != "model":
            try:
                want = _torch.device(outer_device)
            except (RuntimeError, TypeError) as e:
                raise _loco.Error(f"outer_device={outer_device!r}: not a device (\"cpu\", \"model\" or the model's "
                                  f"device, {self._device}): {e}") from None
            if want.type != self._device.type or (want.index is not None and want.index != self._device.index):
                raise _loco.Error(f"outer_device={outer_device!r}: the outer state lives on the host (\"cpu\") or "
                                  f"on the model's device ({self._device}, or \"model\")")
        if not self._on_device:
            raise _loco.Error("outer_device: the model's parameters are on the CPU, where they are the method's "
                              "own buffers; outer_device=\"model\" is for a model on a device (or "
                              "LOCO_TORCH_AS_DEVICE=1)")
        return True

    def _device_layout(self):
        """The parameters become views of one flat tensor on their device, laid out as the
        method's host buffer, so that a range of the model is one copy. The host buffers are
        page-locked on CUDA."""
        total = self._flat.numel()
        with _torch.no_grad():
            self._dflat = _torch.empty(total, dtype=_torch.float32, device=self._device)
            for i, p in enumerate(self._params):
                view = self._as_param(self._dflat, i)
                view.copy_(p.detach())
                p.data = view
        self._data_ptrs = [p.data_ptr() for p in self._params]
        if self._device.type == "cuda":  # page-locked, so that the copies run at full speed, asynchronously
            with self._copier.device():
                for buf in (self._flat, self._gbuf):
                    if buf is not None and buf.numel():
                        rc = _torch.cuda.cudart().cudaHostRegister(buf.data_ptr(), buf.numel() * buf.element_size(), 0)
                        if int(rc) == 0:  # else the copies go through pageable memory: slower, still right
                            self._pinned.append(buf.data_ptr())

    def _ranges(self, ranges):
        """(host view, device view) of each (begin, end) range of the flat buffers."""
        return [(self._flat[lo:hi], self._dflat[lo:hi]) for lo, hi in ranges]

    # -- the hooks --------------------------------------------------------------------------
    def _check_parameters(self):
        if self._changed_by_load is not None:
            raise _loco.Error(
                f"model.load_state_dict() changed {self._changed_by_load} after wrap(): {self.method} keeps outer "
                "parameters, set at wrap(), and its next sync would pull the model back towards them. Load the "
                "model's weights before wrap() (wrap() starts every member from member 0's); to resume, also load "
                "the sync's state saved with them (sync.load_state_dict()); to evaluate the outer parameters, load "
                "sync.eval_parameters() into another model, or after the last step")
        current = [id(p) for n, p in self._model.named_parameters() if p.requires_grad]
        if sorted(current) != sorted(self._ids):
            raise _loco.Error("the model's trainable parameters changed since loco.torch.wrap "
                              "(added, removed or frozen); wrap the model again")
        if self._on_device and [p.data_ptr() for p in self._params] != self._data_ptrs:
            raise _loco.Error("the model's parameters were moved or replaced since loco.torch.wrap "
                              "(e.g. model.to() or a new .data); wrap the model again")

    def _slice_modules(self, opts):
        """Partial updates: each sliced projection's module rewritten so that this member's rows
        of it (gate, up; columns of down) are the parameter it trains, a view of the same buffer
        as the rest of the weight; the inner optimizers pointed at the new parameters."""
        storage = self._dflat if self._on_device else self._flat
        trained = [tuple(r) for r in self._core.trainable_ranges]
        new_of = {}
        for i, module in self._linears.items():
            a, b = self._slices[i]
            down = self._mlp[i] == "down"  # laid transposed: its columns are rows of the buffer
            cols = self._shapes[i][0] if down else self._shapes[i][1]
            lo, hi = next(((max(t0, a), min(t1, b)) for t0, t1 in trained if t0 < b and t1 > a), (a, a))
            rows = storage[lo:hi].view((hi - lo) // cols, cols)
            old = self._params[i]
            self._params[i] = _partial.slice_linear(module, self._as_param(storage, i), rows.t() if down else rows,
                                                    1 if down else 0, (lo - a) // cols, (hi - a) // cols)
            new_of[id(old)] = self._params[i]
        for opt in opts:
            _partial.repoint_optimizer(opt, new_of)
        if self._on_device:
            self._data_ptrs = [p.data_ptr() for p in self._params]

    def _as_param(self, flat, i):
        """Parameter i's entries of a flat buffer, shaped as the parameter (a transposed view for
        a down projection laid transposed)."""
        a, b = self._slices[i]
        shape = self._shapes[i]
        if self._mlp[i] == "down":
            return flat[a:b].view(shape[1], shape[0]).t()
        return flat[a:b].view(shape)

    def _gather_grads(self):
        """Makes the gradient buffer hold this step's gradients (a missing one as zeros)."""
        with _torch.no_grad():
            for i, p in enumerate(self._params):
                view = self._as_param(self._gbuf, i)
                g = p.grad
                if g is None:
                    view.zero_()
                elif g.data_ptr() != view.data_ptr() or g.stride() != view.stride():
                    if g.is_sparse:
                        raise _loco.Error("sparse gradients are not supported")
                    view.copy_(g.detach())
                    p.grad = view

    def _device_gradients(self, gradients):
        """The method's gradient hook for a model on a device: the gradients cross to the host
        and back only when the method uses them this step."""
        if not gradients:
            if self._grad_copies is not None:  # no longer (DiLoCo after outer.start_step): no hooks
                self._grad_copies.remove()
                self._grad_copies = None
            self._core.on_gradients()
            return
        for p in self._params:
            if p.grad is not None and p.grad.is_sparse:
                raise _loco.Error("sparse gradients are not supported")
        if self._grad_copies is None:
            self._grad_copies = _GradientCopies(self._params, [self._as_param(self._gbuf, i)
                                                               for i in range(len(self._params))], self._copier)
            pending = [(self._as_param(self._gbuf, i), p.grad) for i, p in enumerate(self._params)]
        else:
            pending, copied = self._grad_copies.pending()  # those the hooks did not copy during backward
            self._copied_in_backward += copied
        self._copier.to_host(pending)  # waits for its copies, and the hooks' before them on the stream
        if not pending:
            self._copier.wait()  # the hooks' copies alone
        self._core.on_gradients()
        self._copier.to_device([(self._as_param(self._gbuf, i), p.grad) for i, p in enumerate(self._params)
                                if p.grad is not None])

    def sync_gradients(self):
        """The method's gradient hook (data-parallel: the gradients averaged over the replicas).
        The inner optimizer's step runs it when it has not run since the last step; call it
        yourself after backward to clip the averaged gradients, as `loco train` does:
        loss.backward(); sync.sync_gradients(); clip_grad_norm_(...); inner_opt.step()."""
        self._check_open("sync_gradients()")
        if self._synced:
            raise _loco.Error("sync_gradients() was called twice before the optimizer's step")
        self._clock.timed("hooks", self._sync_gradients)

    def _sync_gradients(self):
        self._check_parameters()
        clock = self._clock
        if self._on_device:
            if self._quiet():
                self._bg.submit(self._core.on_gradients)
            else:
                clock.timed("waiting_background", self._bg.join)
                clock.timed("core", self._device_gradients, self._core.access()[0])
            self._synced = True
            return
        if self._gbuf is None:  # partial updates: the method reads no gradients
            self._core.on_gradients()
            self._synced = True
            return
        self._gather_grads()
        self._core.on_gradients()
        with _torch.no_grad():  # gradients that are not views of the buffer (staged ones) get its values
            for i, p in enumerate(self._params):
                view = self._as_param(self._gbuf, i)
                if p.grad is not None and p.grad.data_ptr() != view.data_ptr():
                    p.grad.copy_(view)
        self._synced = True

    def step(self, loss=None, tokens=None):
        """After the inner optimizer's step: the method's end of step (outer steps, syncs).
        With out_dir, pass this member's loss (a float) and its tokens of the step: every
        log_interval steps the members' mean loss, bytes and waits go to out_dir/metrics.jsonl
        (every member must pass them at the same steps). A step whose optimizer step was skipped
        (a GradScaler's) is a step too: call sync.step() after it as after any other."""
        self._check_open("sync.step()")
        if self._done >= self._train_steps:
            raise _loco.Error(f"sync.step() past train_steps = {self._train_steps}: the run ended at its last step "
                              "(its final syncs); wrap with a larger train_steps to train longer")
        record = self._out_dir is not None and loss is not None
        # Checked where they are used (a run directory), before the step: reading a tensor's value
        # waits for the device, which a step without a record must not do.
        if record and not _is_number(loss):
            raise _loco.Error(f"sync.step(): loss is this step's loss, a number or a one-element tensor (got "
                              f"{_described(loss)})")
        if record and tokens is not None and not _whole_count(tokens):
            raise _loco.Error(f"sync.step(): tokens is the number of tokens of this step, a non-negative integer "
                              f"(got {tokens!r})")
        if not self._stepped:
            self._clock.timed("hooks", self._without_inner_step)
        self._stepped.clear()
        self._synced = False
        self._clock.timed("hooks", self._step_hooks)
        if record:
            self._losses.append(float(loss))
            self._tokens += int(tokens or 0)
            if self._done % self._core.log_interval == 0:
                self._record()

    def _without_inner_step(self):
        """A step whose inner optimizer step did not run: a GradScaler skipped it (fp16 gradients
        holding an Inf or a NaN), or the loop left it out. The method's step goes on (its schedule
        counts steps, the same on every member), its gradient hook run here if it has not run. A
        step whose gradients the method combines across the members (data-parallel, DiLoCo's
        steps before outer.start_step) is refused unless they were combined (sync_gradients())
        before the optimizer's step was skipped: each member would otherwise decide on its own
        gradients, and a member that stepped would have averaged in those that were skipped."""
        if not self._synced:
            if not self._quiet():
                self._clock.timed("waiting_background", self._bg.join)
                if self._core.access()[0]:
                    raise _loco.Error(
                        "sync.step() without an inner optimizer step at a step whose gradients the method averages "
                        f"({self.method}): call sync.sync_gradients() after backward and before deciding to skip "
                        "the step (with a GradScaler: before scaler.unscale_() or scaler.step()), so that every "
                        "member decides on the same averaged gradients; or call inner_opt.step()")
            self._sync_gradients()
        self._skipped += 1

    def _step_hooks(self):
        if self._on_device:
            self._device_step()
        else:
            self._clock.timed("core", self._core.after_step)
            self._done = self._core.step

    def _quiet(self):
        """Whether the coming step uses nothing and comes behind a sync started in the background
        (its hooks are then queued behind it)."""
        return self._done + 1 < self._quiet_until

    def _device_step(self):
        """The method's end of step for a model on a device. A step that only reads parameters
        (a Streaming DiLoCo sync starting, its merge tau >= 1 steps later) copies them to the host
        and leaves the rest (waiting for the copy, packing, encoding, starting the reduction) to
        the background thread, with the hooks of the steps that use nothing after it; the loop
        waits for it at the next step that uses something. Other steps run here."""
        done = self._done + 1
        if self._quiet():
            self._bg.submit(self._core.after_step)
            self._done = done
            return
        clock = self._clock
        clock.timed("waiting_background", self._bg.join)
        clock.timed("merge", self._merge_first)
        if self._outer is not None:
            self._held_step(done)
            return
        _, reads, writes = self._core.access()
        if reads and not writes:
            t0 = time.perf_counter()
            quiet = self._core.quiet_until()
            ready = self._copier.to_host(self._ranges(reads), wait=False, aside=True)
            core, bg_clock, copier = self._core, self._bg_clock, self._copier
            stream = copier.stream()  # the training stream: the background queues its copies there too

            def start_sync():
                if ready is not None:
                    bg_clock.timed("copies_waiting", ready.synchronize)
                core.after_step()
                self._take_synced(stream)  # its reduction waited for and its outer step, here too

            self._bg.submit(start_sync)
            self._background_syncs += 1
            self._quiet_until = quiet
            self._done = done
            clock.add("start", time.perf_counter() - t0)
            return
        clock.timed("core", self._on_host, reads, writes, self._core.after_step)
        self._done = self._core.step

    def _on_host(self, reads, writes, hook):
        """hook() (the core's part of a step) over the host buffer: the ranges it reads copied
        there first, those it writes copied back after."""
        if reads or writes:
            self._copier.to_host(self._ranges(reads))
            self._copier.host_free()
        hook()
        self._copier.to_device(self._ranges(writes))
        if writes:  # syncs applied here (the last step) were written by the core: copies taken before are stale
            self._merged.clear()

    def _merge_first(self):
        """The syncs merged at this step (Streaming DiLoCo, tau >= 1 steps after they started),
        applied before the rest of the step, so that a sync starting at the same step can run in
        the background like any other."""
        _, reads, writes = self._core.merge_access()
        if not writes:
            return
        self._copier.before_writes()
        if self._outer is not None:
            self._core.merge_step()
            self._apply_outer_results()
            return
        if reads:  # every method with merges lets the caller mix them (Algorithm::mix_merges_elsewhere)
            raise _loco.Error("internal: a merge reads the model; only the caller mixes merges on a device")
        self._merge_on_device(writes)

    def _take_synced(self, stream):
        """The syncs in flight prepared (their reduction waited for, their outer step taken, the
        synchronized values written into a page-locked buffer each by the same pass), and those
        values copied to the device ahead of their merge (on a stream of loco's own, after the
        work queued on `stream`, the training stream), which then only mixes them in
        (_merge_on_device)."""
        core, copier = self._core, self._copier
        hosts = {j: copier.host_tensor(sum(e - b for b, e, _, _ in self._segments[j])) for j in core.merges_ahead()}
        core.prepare_merges({j: h.numpy() for j, h in hosts.items()})
        with copier.on(stream):
            for r in core.peek_outer_results():
                j = r["fragment"]
                self._merged[j] = copier.aside_to_device(hosts.pop(j))

    def _merge_on_device(self, writes):
        """The merges due, with the outer state on the host and the model on a device: each
        fragment merged from its synchronized values, on the device since the background thread
        took them (_take_synced), mixed with the model's own values where the core mixes them (as
        the C++ merge mixes them on the host, the same bits), copied over them elsewhere. A sync
        not taken so (one restored from a checkpoint and merged before any sync starts) is taken
        here first. Nothing of the model crosses to the host and nothing waits for the device."""
        due = [j for j, segs in enumerate(self._segments) if segs and _applied_within(segs, writes)]
        if any(j not in self._merged for j in due):
            self._take_synced(self._copier.stream())
        self._core.merge_step()
        with _torch.no_grad():
            for j in due:
                synced, copied = self._merged.pop(j)
                self._copier.ready(copied)
                for b, e, at, trained in self._segments[j]:
                    local, theirs = self._dflat[b:e], synced[at:at + e - b]
                    if trained and self._alpha != 0:
                        _mix(local, theirs, self._alpha, spend=True)
                    else:
                        local.copy_(theirs)

    def _apply_outer_results(self):
        """The syncs the core completed, applied to the outer state on the device (after the
        decoding done ahead on loco's stream)."""
        self._copier.ready(self._prepared)
        self._prepared = None
        for r in self._core.take_outer_results():
            if r["in_params"]:  # DiLoCo in fp32 with others: the average in the (page-locked) host buffer
                avg = _torch.empty_like(self._dflat)
                self._copier.to_device([(self._flat, avg)])
                r["avg"] = avg
            self._outer.apply(r, self._dflat)

    def _held_step(self, done):
        """_device_step with the outer state on the device: a sync's start takes the fragment's
        outer gradient here, in the training stream's order; the rest (fp32: the parameters the
        core averages cross, as on the host path; a codec: its encoding, of which only the bytes
        cross) is queued with the core's communication on the background thread when nothing is
        applied at this step, with the syncs completed meanwhile decoded there ahead of their
        merge (so that the loop's thread queues little device work at a sync); the completed
        syncs the core hands back at their merge are applied here."""
        core, outer, clock, copier = self._core, self._outer, self._clock, self._copier
        t0 = time.perf_counter()
        _, reads, writes = core.access()
        starts = core.outer_starts()
        deltas = {}
        for j in starts:
            if outer.codec is None and (self.size > 1 or outer.applied_within(j, writes)):
                continue  # the core reads the parameters (reads), or the sync ends at this step
            delta = outer.start(j, self._dflat)
            if delta is not None:
                deltas[j] = delta
        ready = copier.to_host(self._ranges(reads), wait=False) if reads else None
        stream = copier.stream()  # the training stream
        background = bool(starts) and not writes
        # In the background, the device work (encode, decode) goes on loco's stream after the
        # training stream's work so far (its outer gradients), beside the steps queued after it.
        started = copier.event() if background else None
        clock.add("start", time.perf_counter() - t0)
        on = self._bg_clock if background else clock  # the thread begin() runs on

        def begin():
            with copier.after(started) if background else copier.on(stream):
                for d in deltas.values():
                    copier.read_aside(d)
                payloads = {j: outer.encode(d, self._host_bytes) for j, d in deltas.items()}
                encoded = copier.event() if payloads else None
            deltas.clear()
            for ev in (ready, encoded):
                if ev is not None:
                    on.timed("copies_waiting", ev.synchronize)
            for j, (bufs, finite) in payloads.items():
                if not bool(finite[0]):
                    raise _loco.Error(f"the outer gradient of fragment {j} contains a non-finite value; refusing "
                                      "to encode it")
                core.provide_outer(j, [b.numpy() for b in bufs])
            core.after_step()
            if background:
                core.prepare_merges()  # its reduction waited for (and the payloads checked) here too
                with copier.after(None):  # after `started` still: loco's stream waited for it above
                    prepared = [t for r in core.peek_outer_results() for t in outer.prepare(r)]
                    if prepared:
                        for t in prepared:
                            copier.read_by(t, stream)
                        self._prepared = copier.event()  # the merges' work waits for it

        if background:  # applied tau >= 1 steps later: the communication starts in the background
            quiet = core.quiet_until()
            self._bg.submit(begin)
            self._background_syncs += 1
            self._quiet_until = quiet
            self._done = done
            return
        clock.timed("core", begin)
        clock.timed("apply", self._apply_outer_results)
        self._done = core.step

    def _host_bytes(self, n):
        """A host buffer for n bytes crossing from the device (page-locked on CUDA)."""
        with self._copier.device():
            return _torch.empty(n, dtype=_torch.uint8, pin_memory=self._device.type == "cuda")

    def _record(self, val_loss=float("nan")):
        # A record without new steps (finish's) repeats the last training loss, as loco train's does.
        self._bg.join()
        self._outer_norms()
        if self._losses:
            mean = sum(self._losses) / len(self._losses)
        else:  # a non-finite loss was written as null
            mean = self._last["train_loss"] if self._last and self._last["train_loss"] is not None else float("nan")
        self._losses = []
        rec = self._core.record(mean, self._tokens, val_loss, time.monotonic() - self._t0)
        self._last = json.loads(rec)
        if self._rundir is not None:
            self._rundir.append_record(rec)

    def finish(self, val_loss=None):
        """Ends the run's records (out_dir): a last metrics record with the validation loss, if
        given, and summary.json (every member's traffic, waits and compute utilization, as `loco
        train` writes them; `loco report` and `loco compare` read the directory). Collective."""
        if self._out_dir is None:
            raise _loco.Error("finish() writes the run directory: pass out_dir to wrap()")
        self._check_open("finish()", "finish the run first (it is collective), then close")
        if val_loss is not None and not _is_number(val_loss):
            raise _loco.Error(f"finish(): val_loss is a number or a one-element tensor (got {_described(val_loss)})")
        self._bg.join()
        val = float("nan") if val_loss is None else float(val_loss)
        if self._losses or val_loss is not None or self._last is None:
            self._record(val)
        seconds = time.monotonic() - self._t0
        workers = [json.loads(w) for w in self._core.worker_summaries(seconds)]
        if self._rundir is not None:
            # The members sharing the data: the world, or an elastic member's last round.
            summary = {"algorithm": self.method, "backend": "python", "replicas": self.data_share[1],
                       "stages": 1,
                       "steps": self._core.step, "tokens": self._last["tokens"], "seconds": seconds,
                       "final_train_loss": self._last["train_loss"], "final_val_loss": -1 if val_loss is None else val,
                       "workers": workers}
            self._rundir.write_summary(json.dumps(summary, indent=1) + "\n")

    # -- what a loop may want ----------------------------------------------------------------
    @property
    def steps_done(self):
        """Inner steps the run has done. An elastic member that joins (or rejoins after being
        dropped) continues from the run's step, so loop on it: while sync.steps_done < total."""
        return self._done

    @property
    def data_share(self):
        """(slot, members): which share of the data this member reads now. A fixed world:
        (rank, size). An elastic run: this member's place among the members of the last round,
        which changes as members come and go (read it every step)."""
        return tuple(self._core.data_share)

    def eval_parameters(self):
        """{name: tensor} of the parameters to evaluate or save (DiLoCo: the outer parameters),
        the same on every replica. Every member must call it at the same step."""
        outer = self._outer
        if outer is not None and outer.eval_outer and self._done >= outer.start_step:
            self._bg.join()
            flat = outer.theta.cpu()
        else:
            self._whole_to_host()
            flat = _torch.from_numpy(self._core.eval_params())
        out = {n: self._as_param(flat, i).clone(memory_format=_torch.contiguous_format)
               for i, n in enumerate(self._names)}
        return {n: out[n] for n in self._model_order}

    def metrics(self):
        """This member's traffic, waits and the method's own fields (metrics.jsonl's names), and
        host_device_bytes: bytes copied between the model's tensors and loco's host buffers since
        wrap() (0 for a CPU model, whose parameters are views of them), syncs_in_background:
        the steps whose end (a sync starting) ran on loco's thread while the loop went on, and
        gradients_copied_in_backward: data-parallel on a device, the gradients copied to the host
        by the parameters' hooks as backward produced them (the others after backward), and
        inner_steps_skipped: the steps whose inner optimizer step did not run (a GradScaler's).

        loop_seconds: where the time of loco's hooks on the loop's thread went since wrap(), by
        phase: hooks (all of it: sync.step() and the gradient hook in the optimizer's step),
        within it waiting_background (for the sync work of an earlier step), merge (applying the
        syncs due: Streaming DiLoCo's merges), start (a sync's start handed to the background:
        its copies and, with the outer state on the device, its encoding queued), core (the C++
        method's hooks run on the loop: DiLoCo's round, data-parallel's gradients, a CPU model's
        every hook), apply (completed syncs applied to an outer state on the device) and
        copies_waiting (waiting for copies between the device and the host, within the others).
        background_seconds: busy (the background thread's sync work) and, within it,
        copies_waiting. On a GPU the hooks' seconds are the host's: work they queue on the GPU
        runs there later."""
        self._bg.join()
        self._outer_norms()
        out = json.loads(self._core.metrics())
        out["host_device_bytes"] = self._copier.bytes + (self._outer.bytes if self._outer is not None else 0)
        out["syncs_in_background"] = self._background_syncs
        out["gradients_copied_in_backward"] = self._copied_in_backward
        out["inner_steps_skipped"] = self._skipped
        out["loop_seconds"] = self._clock.snapshot()
        out["background_seconds"] = self._bg_clock.snapshot()
        return out

    def report(self):
        """The method's accounting (outer-state bytes, ...) and this member's traffic by
        operation (traffic.by_operation: bytes and messages of each kind of exchange)."""
        self._bg.join()
        out = json.loads(self._core.report())
        out["outer_device"] = str(self._outer.device) if self._outer is not None else "host"
        if self._outer is not None:
            out["outer_state_bytes"] = self._outer.state_bytes()
        return out

    def _outer_norms(self):
        """DiLoCo with the outer state on the device: the last round's norms, for the records."""
        if self._outer is not None and self._outer.norms is not None:
            self._core.set_outer_norms(*(float(x) for x in self._outer.norms))
            self._outer.norms = None

    def state_dict(self):
        """The method's state (outer parameters, momentum, step); the model and the inner
        optimizer have their own state_dicts."""
        self._whole_to_host()
        state = self._core.state()
        if self._outer is not None:  # the same entries as the host path's
            state = self._outer.save(state)
        return {"loco": {k: (v if not isinstance(v, _np.ndarray) else _torch.from_numpy(v.copy()))
                         for k, v in state.items()},
                "method": self.method, "names": list(self._names)}

    def load_state_dict(self, state):
        self._check_open("load_state_dict()")
        if not isinstance(state, dict) or not isinstance(state.get("loco"), dict):
            raise _loco.Error("not a state from Sync.state_dict(): a dict whose 'loco' entry is a dict")
        if state.get("method") != self.method:
            raise _loco.Error(f"the state is of method {state.get('method')!r}, this sync runs {self.method!r}")
        if state.get("names") != self._names:
            raise _loco.Error("the state was saved for a model with other parameters")
        core = {k: (v.numpy() if isinstance(v, _torch.Tensor) else v) for k, v in state["loco"].items()}
        self._bg.join()
        # Refused here, or by the core before it changes anything: the method as it was.
        outer = self._outer.check(core) if self._outer is not None else None
        self._core.load_state(core)
        if outer is not None:
            self._copier.ready(self._prepared)  # nothing of loco's stream reads the outer state as it is written
            self._prepared = None
            self._outer.load(outer)
        self._merged.clear()
        self._done = self._core.step
        self._quiet_until = 0
        self._unwatch_loads()  # the model's weights, loaded before or after, go with this state
        self._changed_by_load = None

    def _whole_to_host(self):
        """Before a method reads what it may hold only in part (evaluation, state): the model's
        current parameters on the host."""
        self._bg.join()
        if self._on_device:
            self._copier.to_host(self._ranges([(0, self._flat.numel())]))

    def close(self):
        """Ends communication and gives the optimizer its own step back. Call it when done: until
        then the optimizer's wrapped step keeps this object (and its communication) alive."""
        self._closed = True
        self._held[0] = None
        for opt, original, hooked in zip(self._opts, self._original_steps, self._hooks):
            if opt.step is hooked:  # else a scheduler wrapped it since: the hook now passes the call on
                opt.step = original
        for p in self._wrapped:
            if _WRAPPED.get(id(p)) is p:
                del _WRAPPED[id(p)]
        self._release()

    def _release(self):
        """What the sync holds, given back in order (close(), or a wrap() that failed part way, when
        only some of it was made): out_dir's lock, the background thread, the gradient hooks,
        communication, then the copies in flight before the host buffers they use are unpinned."""
        if self._rundir is not None:
            self._rundir.release()
        if hasattr(self, "_bg"):
            try:
                self._bg.join()  # its error, if any, was the loop's to see; closing goes on
            except Exception:
                pass
            self._bg.stop()
        if getattr(self, "_grad_copies", None) is not None:
            self._grad_copies.remove()
            self._grad_copies = None
        self._unwatch_loads()
        if hasattr(self, "_core"):
            self._core.close()
        if hasattr(self, "_copier"):
            self._copier.wait()       # no copy may still write or read a buffer about to be unregistered
            self._copier.host_free()
            with self._copier.device():
                while getattr(self, "_pinned", None):
                    _torch.cuda.cudart().cudaHostUnregister(self._pinned.pop())


_WRAPPED = weakref.WeakValueDictionary()  # id -> a parameter of a model wrapped and not closed


def _hooked_by_open_sync(opt):
    """Whether opt's step (or the step under a scheduler's wrapper) is the hook of a sync not closed."""
    sync = getattr(opt.step, "_loco_sync", None)
    sync = sync() if isinstance(sync, weakref.ref) else None
    return sync is not None and not sync._closed


def _check_not_wrapped(named, opts):
    """A model or optimizer that a sync not closed holds, and an optimizer that trains a parameter
    outside the model (loco would never synchronize it: the members would drift apart unsaid), are
    refused."""
    if any(_WRAPPED.get(id(p)) is p for _, p in named) or any(_hooked_by_open_sync(o) for o in opts):
        raise _loco.Error("this model or optimizer is already wrapped by a loco sync that is not closed: close() "
                          "it before wrapping again")
    mine = {id(p) for _, p in named}
    for k, opt in enumerate(opts):
        for group in opt.param_groups:
            for p in group["params"]:
                if p.requires_grad and id(p) not in mine:
                    raise _loco.Error(f"inner_opt{'' if len(opts) == 1 else f' {k}'} trains a parameter of shape "
                                      f"{tuple(p.shape)} that is not among the model's: loco synchronizes the model's "
                                      "parameters only (wrap a module that holds them all)")


def wrap(model, inner_opt, method="diloco", *, endpoint=None, blocks=None, outer_device=None, **config):
    """Binds `method` ("ddp", "diloco", "streaming", "noloco") to `model` trained by `inner_opt`
    (a torch optimizer, or a list of them, e.g. Muon for the matrices and AdamW for the rest, each
    parameter in one: the method's gradient hook runs before the first one's step of a step).

    endpoint: this member's loco Endpoint (default: loco.init()'s). blocks: a list of modules
    whose parameters form the model's blocks, in order (Streaming DiLoCo's fragments are made
    of blocks); default: the numbered children of the model's largest module list (e.g.
    model.layers.0, model.layers.1, ...). Every other keyword is a loco config key (see the
    module's doc), e.g. inner_steps=30, outer_lr=0.7, outer_momentum=0.9, codec="fp4-e3m0",
    tau=1, alpha=0.5, fragment_blocks=1, train_steps=N (the last step then ends every round,
    as in `loco train`), out_dir="runs/x" (a run directory `loco report` reads: see
    Sync.step and Sync.finish), log_interval=10.

    outer_device (DiLoCo and Streaming DiLoCo): where the outer parameters and momentum live.
    "model" (or the model's device, e.g. "cuda"): as tensors beside the model; a sync encodes the
    outer gradient there and only its bytes cross to the host, the outer step runs there (8 bytes
    per parameter of device memory). "cpu": in loco's host memory, where the outer step runs. The
    default is "model" for a model on a GPU (the fast one: the host's outer step over a large
    model costs seconds per round) when the run's settings allow it (not with outer.screen,
    outer.aggregate, outer.fault, stochastic rounding, the random-drop and topk codecs,
    streaming.offload_outer or an elastic run), else "cpu"."""
    if endpoint is None:
        endpoint = _loco_pkg.endpoint()
    keys = set(_loco.config_keys())
    values = {_config_key(k, keys, method): (k, v) for k, v in config.items()}  # key -> (keyword, value)
    return Sync(model, inner_opt, method, endpoint, blocks, values, outer_device)
