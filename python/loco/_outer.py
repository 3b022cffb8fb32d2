"""The outer state on the model's device (loco.torch's outer_device; docs/python.md, "Where the
outer state lives"). DiLoCo's and Streaming DiLoCo's outer parameters and momentum are tensors on
the model's device; a sync encodes the fragment's outer gradient there, and only the encoded
bytes cross to the host; the method's C++ core keeps the schedule and the communication (and the
reduce-scatter's shard sums), and hands back each completed sync, whose payloads are decoded,
averaged and applied here with the outer step.

Every operation is one tensor operation, rounded on its own, in the order of the C++ code
(src/comm/codec.cpp, src/algo/algorithm.cpp's outer_sgd_step, Streaming DiLoCo's merge; those
files are compiled without fused multiply-adds), so a member whose outer state is on a GPU and
one whose outer state is on the host compute the same bits and can train together."""
import torch as _torch

from . import _loco
from ._device import staged_to_device as _staged_to_device

_E3M0 = [0.0] + [2.0 ** (e - 7) for e in range(1, 8)]
_E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _e4m3():
    g = []
    for c in range(127):  # 0x7F is NaN
        e, m = c >> 3, c & 7
        g.append(m * 2.0 ** -9 if e == 0 else (1.0 + m / 8.0) * 2.0 ** (e - 7))
    return g


_GRIDS = {"fp8": (_e4m3, 8), "fp4-e3m0": (lambda: _E3M0, 4), "fp4-e2m1": (lambda: _E2M1, 4)}
FORMATS = ("fp32", "bf16", "int8") + tuple(_GRIDS)


def _pow2(k):
    """2^k as float32 for integer k in [-127, 128] (2^-127 subnormal, 2^128 infinite), exactly."""
    k = k.to(_torch.int32)
    bits = _torch.where(k >= -126, (k + 127) << 23, _torch.full_like(k, 1 << 22))
    bits = _torch.where(k >= 128, _torch.full_like(k, 0x7F800000), bits)
    return bits.view(_torch.float32)


CHUNK = 1 << 24  # entries per piece of the elementwise work (python/loco/_outer.py, DeviceOuter._chunks)


_SCALARS = {}


def _norm(x):
    """The Euclidean norm of a float32 tensor, accumulated in double (one pass, no double copy)."""
    return _torch.linalg.vector_norm(x, dtype=_torch.float64)


def _scalar(x, like):
    """x as a float32 scalar tensor on like's device, made once (making one from a Python number
    copies it to the device, which would wait for the work queued there)."""
    key = (float(x), like.device)
    if key not in _SCALARS:
        _SCALARS[key] = _torch.tensor(x, dtype=_torch.float32, device=like.device)
    return _SCALARS[key]


def applied_within(segments, writes):
    """Whether a fragment of these (begin, end, packed, trained) segments is applied at a step that
    writes these (begin, end) ranges: its first entry lies in one."""
    return any(lo <= segments[0][0] < hi for lo, hi in writes)


def mix(local, synced, alpha, spend=False):
    """Streaming DiLoCo's merge with alpha, in place, as the C++ merge computes it (algo/streaming.cpp):
    local = alpha * local + (1 - alpha) * synced in float32, one rounding per operation. spend:
    synced may be overwritten (no temporary)."""
    a = _scalar(alpha, local)
    keep = _scalar(1.0, local) - a
    taken = synced.mul_(keep) if spend else synced * keep
    local.mul_(a).add_(taken)


def outer_sgd_step(theta, mom, avg, mu, lr, nesterov, theta_out=None, mom_out=None):
    """outer_sgd_step (algo/algorithm.h) on float32 tensors of one size, one rounding per
    operation: the momentum v = mu mom + delta, then theta = avg + (delta - lr (delta + mu v)) with
    Nesterov, avg + (delta - lr v) without; in place, or into theta_out and mom_out (theta_out may
    be avg). Returns delta = theta - avg (theta before the step), a new tensor."""
    mu, lr = _scalar(mu, theta), _scalar(lr, theta)
    delta = theta - avg
    v = mom.mul_(mu) if mom_out is None else _torch.mul(mom, mu, out=mom_out)
    v.add_(delta)
    lr_d = (v * mu).add_(delta).mul_(lr) if nesterov else v * lr
    _torch.sub(delta, lr_d, out=lr_d)
    _torch.add(avg, lr_d, out=theta if theta_out is None else theta_out)
    return delta


class Codec:
    """The outer gradients' codecs with round-to-nearest (comm/codec.h has the bit layouts), on
    tensors of any device; encode() gives the bytes the C++ codec gives, decode_add() adds what
    the C++ codec adds."""

    def __init__(self, name, block=128):
        if name not in FORMATS:
            raise _loco.Error(f"outer_device: outer.codec = {name!r} runs on the host only; on a device: "
                              f"{', '.join(FORMATS)}")
        self.name, self.block = name, int(block)
        self._tables = {}  # (what, device) -> the grid, its midpoints or the codes' signed values

    def bytes(self, n):
        return _loco.codec_bytes(self.name, n, self.block)

    def _grid_on(self, device):
        key = ("grid", device)
        if key not in self._tables:
            self._tables[key] = _torch.tensor(_GRIDS[self.name][0](), dtype=_torch.float32, device=device)
        return self._tables[key]

    def _per(self):
        """Values per piece of encoding or decoding: whole blocks, about CHUNK values (each block
        is encoded on its own, so the pieces' bytes laid end to end are the whole's)."""
        return self.block * max(1, CHUNK // self.block)

    def encode(self, x):
        """x: float32, 1-D, finite (checked by the caller); returns uint8 on x's device."""
        per = self._per()
        if x.numel() <= per:
            return self._encode(x)
        return _torch.cat([self._encode(x[i:i + per]) for i in range(0, x.numel(), per)])

    def decode_add(self, payload, acc):
        """acc += the values of payload (uint8, on acc's device; its size and codes checked by
        the C++ core when it received it)."""
        per, n = self._per(), acc.numel()
        step = self.bytes(per)
        for k, i in enumerate(range(0, n, per)):
            self._decode_add(payload[k * step:k * step + self.bytes(min(per, n - i))], acc[i:i + per])

    def _encode(self, x):
        if self.name == "bf16":
            u = x.view(_torch.int32)
            add = 0x7FFF + ((u >> 16) & 1)
            total = u + add  # int32 arithmetic wraps as the C++ uint32 does (finite inputs)
            r = _torch.where(((total >> 16) & 0x7F80) == 0x7F80, u & -65536, total)
            return (r >> 16).to(_torch.int16).view(_torch.uint8)
        n, b = x.numel(), self.block
        full = n // b
        parts = []
        if full:
            parts.append(self._encode_blocks(x[:full * b].view(full, b)))
        if n - full * b:
            parts.append(self._encode_blocks(x[full * b:].view(1, n - full * b)))
        if not parts:
            return _torch.empty(0, dtype=_torch.uint8, device=x.device)
        return _torch.cat(parts) if len(parts) > 1 else parts[0]

    def _encode_blocks(self, xb):
        """Rows of one length: each row a block, encoded and laid out as the C++ codec does (its
        nearest-rounding paths, GridCodec::encode_nearest8 and encode_nearest_e4m3), in few passes
        over int32 and uint8 tensors: the encode of a Streaming DiLoCo fragment is memory-bound on
        a GPU, and it runs beside the training loop's work."""
        y = xb.abs()
        maxabs = y.amax(1)
        if self.name == "int8":
            scale = maxabs / _scalar(127.0, xb)
            safe = _torch.where(scale > 0, scale, _torch.ones_like(scale))
            q = _torch.where(scale[:, None] > 0, xb / safe[:, None], _torch.zeros_like(xb))
            q = _torch.round(q).clamp_(-127, 127).to(_torch.int8).view(_torch.uint8)
            return _torch.cat([scale[:, None].contiguous().view(_torch.uint8), q], 1).reshape(-1)
        grid = self._grid_on(xb.device)
        bits = _GRIDS[self.name][1]
        t = maxabs / grid[-1]
        m, e = _torch.frexp(t)
        s = _torch.where(m == 0.5, e - 1, e).clamp_(-127, 127)
        s = _torch.where(t <= 0, _torch.full_like(s, -127), s)
        y.mul_(_pow2(-s)[:, None])  # y = |x| / 2^s, exactly as the C++ codec's |x| * (1 / 2^s)
        code = self._nearest8(y) if bits == 4 else self._nearest_e4m3(y)
        code = code.to(_torch.uint8)
        code |= _torch.signbit(xb).to(_torch.uint8) << (bits - 1)
        if bits == 4:
            if code.shape[1] % 2:
                code = _torch.cat([code, _torch.zeros_like(code[:, :1])], 1)
            code = code[:, 0::2] | (code[:, 1::2] << 4)
        return _torch.cat([(s + 127).to(_torch.uint8)[:, None], code], 1).reshape(-1)

    def _nearest8(self, y):
        """The nearest of a grid of 8 (fp4) to each y >= 0, a tie to the even code: the number of
        midpoints below y, plus one at a midpoint above an odd code (encode_nearest8, which says
        why that is the nearest grid value for both grids), in one search (int32): y >= a float m
        is y > the float below m, so the boundaries are the midpoints, those above an odd code
        each replaced by the float below it."""
        return _torch.bucketize(y, self._bounds_on(y.device), out_int32=True)

    @staticmethod
    def _nearest_e4m3(y):
        """E4M3's nearest code to each y >= 0 (at most the grid's top, 448), a tie to the even
        code, from y's bits (encode_nearest_e4m3): below 2^-6, y 2^9 rounded to an integer (2^23
        added and taken away in float32); above, y's bits rounded to 3 mantissa bits, rebiased.
        int32."""
        two23 = _scalar(8388608.0, y)
        sub = y.mul(_scalar(512.0, y)).add_(two23).sub_(two23).to(_torch.int32)
        b = y.view(_torch.int32)
        normal = (b >> 20).bitwise_and_(1).add_(b).add_(0x7FFFF)
        normal >>= 20
        return _torch.where(y < _scalar(0.015625, y), sub, normal.sub_(120 << 3).clamp_(max=126))

    def _bounds_on(self, device):
        """_nearest8's boundaries: the grid's midpoints (each exact in float32, as GridCodec's
        mid_), those between codes k and k + 1 with k odd lowered to the float below them."""
        key = ("bounds", device)
        if key not in self._tables:
            g = self._grid_on(device)
            mids = (g[:-1] + g[1:]) / 2
            odd = _torch.arange(mids.numel(), device=device) % 2 == 1
            self._tables[key] = _torch.where(odd, _torch.nextafter(mids, _torch.full_like(mids, -1.0)), mids)
        return self._tables[key]

    def _signed_on(self, device):
        """Each code's value (its grid value with the code's sign; fp8's NaN codes, never produced,
        0), as GridCodec's signed_."""
        key = ("signed", device)
        if key not in self._tables:
            g = _GRIDS[self.name][0]()
            half = 1 << (_GRIDS[self.name][1] - 1)
            mags = [g[c] if c < len(g) else 0.0 for c in range(half)]
            self._tables[key] = _torch.tensor(mags + [-v for v in mags], dtype=_torch.float32, device=device)
        return self._tables[key]

    def _decode_add(self, payload, acc):
        n, b = acc.numel(), self.block
        if payload.storage_offset() % 2:  # a payload after an odd-sized one: its own, aligned copy
            payload = payload.clone()
        if self.name == "bf16":
            acc += (payload.view(_torch.int16).to(_torch.int32) << 16).view(_torch.float32)
            return
        full = n // b
        per = self.bytes(b) if full else 0
        if full:
            self._decode_blocks(payload[:full * per].view(full, per), acc[:full * b].view(full, b))
        if n - full * b:
            self._decode_blocks(payload[full * per:].view(1, -1), acc[full * b:].view(1, n - full * b))

    def _decode_blocks(self, rows, acc):
        length = acc.shape[1]
        if self.name == "int8":
            scale = rows[:, :4].reshape(-1).clone().view(_torch.float32)[:, None]
            acc += rows[:, 4:].view(_torch.int8).to(_torch.float32) * scale
            return
        scale = _pow2(rows[:, 0].to(_torch.int32) - 127)[:, None]
        data = rows[:, 1:]
        if _GRIDS[self.name][1] == 4:
            code = _torch.stack([data & 0x0F, data >> 4], 2).reshape(data.shape[0], -1)[:, :length]
        else:
            code = data
        # The code's signed grid value times the block's scale, to the bit as the C++ codec's
        # signed_[code] * scale: -(g s) = (-g) s.
        v = self._signed_on(acc.device).index_select(0, code.reshape(-1).to(_torch.int32)).view(code.shape)
        acc += v.mul_(scale)


class DeviceOuter:
    """The outer parameters and momentum of every fragment, on the model's device, in the layout of
    the flat parameter buffer `flat` (the model's parameters are views of it)."""

    def __init__(self, core, flat, config, method):
        """config: the run's resolved configuration (the core's, as parsed TOML)."""
        self._core = core
        self.device = flat.device
        outer = config["outer"]
        self.codec = Codec(outer["codec"], outer["block"]) if outer["codec"] != "fp32" else None
        self._lr, self._mu, self._nesterov = float(outer["lr"]), float(outer["momentum"]), bool(outer["nesterov"])
        self._alpha = float(config["streaming"]["alpha"]) if method == "streaming" else 0.0
        self._diloco = method == "diloco"
        # Where evaluation reads the outer parameters: DiLoCo after its data-parallel steps,
        # Streaming DiLoCo with streaming.eval = "outer" (else the core shares the replicas').
        self.start_step = int(outer["start_step"]) if self._diloco else 0
        self.eval_outer = self._diloco or config["streaming"]["eval"] == "outer"
        self._segments = core.outer_segments()
        with _torch.no_grad():
            self.theta = flat.detach().clone()
            self.momentum = _torch.zeros_like(self.theta)
        self._own = {}      # fragment -> this replica's parameters at its sync's start (one replica, fp32)
        self._ready = {}    # fragment -> its completed sync's average parameters, prepared before its merge
        self.norms = None   # DiLoCo's last round: (||Delta||, ||Delta_m||) as device scalars
        self.bytes = 0      # crossed between the device and the host

    def applied_within(self, j, writes):
        """Whether fragment j is applied at this step (its start lies in a range written)."""
        return applied_within(self._segments[j], writes)

    def state_bytes(self):
        kept = list(self._own.values()) + [t for ts in self._ready.values() for t in ts if t is not None]
        return (self.theta.numel() + self.momentum.numel() + sum(t.numel() for t in kept)) * 4

    def _packed(self, t, j):
        """Fragment j's entries of the flat tensor t, packed in range order (a view when it is one
        range)."""
        segs = self._segments[j]
        if len(segs) == 1:
            return t[segs[0][0]:segs[0][1]]
        return _torch.cat([t[b:e] for b, e, _, _ in segs])

    def _chunks(self, j):
        """Fragment j in pieces of at most CHUNK entries: (begin in the flat buffer, begin packed,
        length, trained). The elementwise work runs piece by piece, so that its temporaries take
        a few times CHUNK x 4 bytes of device memory whatever the fragment's size."""
        for b, e, at, trained in self._segments[j]:
            for lo in range(0, e - b, CHUNK):
                yield b + lo, at + lo, min(CHUNK, e - b - lo), trained

    def start(self, j, flat):
        """Fragment j's sync starts after this step (on the loop's thread, in the training stream's
        order): with a codec its outer gradient theta - params, a new tensor that encode() reads
        (the rest of the start, on the background thread); with fp32 and one replica the
        parameters kept for the sync's end (None)."""
        with _torch.no_grad():
            if self.codec is None:
                self._own[j] = self._packed(flat, j).clone()
                return None
            n = sum(e - b for b, e, _, _ in self._segments[j])
            delta = _torch.empty(n, dtype=_torch.float32, device=self.device)  # Delta_{m,j} = theta - params
            for b, at, length, _ in self._chunks(j):
                _torch.sub(self.theta[b:b + length], flat[b:b + length], out=delta[at:at + length])
            return delta

    def encode(self, delta, pinned):
        """A sync's outer gradient (start's) as the codec's payloads (one, or one per shard),
        encoded here and copied to page-locked host memory (`pinned(size)` makes a buffer). Returns
        the host buffers and a one-byte buffer saying whether the outer gradient was finite, both
        to be read once the copies are done (an event recorded after this)."""
        with _torch.no_grad():
            n = delta.numel()
            shards = self._core.outer_shards
            out = []
            for k in range(shards):
                enc = self.codec.encode(delta[n * k // shards:n * (k + 1) // shards])
                host = pinned(enc.numel())
                host.copy_(enc, non_blocking=True)
                self.bytes += enc.numel()
                out.append(host)
            # A non-finite outer gradient is refused, as the C++ codecs refuse to encode one: the
            # flag travels with the bytes, so the check costs no wait of its own.
            finite = pinned(1)
            finite.copy_(_torch.isfinite(delta).all().to(_torch.uint8).view(1), non_blocking=True)
            return out, finite

    def prepare(self, r):
        """A completed sync ahead of its merge (a dict from the core's peek_outer_results), on the
        background thread: its average parameters on the device and, for Streaming DiLoCo, its
        outer step, kept for apply(). Fragment j's outer parameters and momentum change only at
        its own merge, so theta - the mean outer gradient, and the outer step from there, are
        what apply() would compute then; the new outer parameters overwrite the average's buffer,
        the new momentum takes one of its own, and the merge only copies them in and mixes.
        Returns the tensors kept (the merge's work reads them)."""
        j = r["fragment"]
        with _torch.no_grad():
            if r["avg"] is not None:
                avg = self._to_device(r["avg"])
            else:
                avg = self._decode_mean(r, sum(e - b for b, e, _, _ in self._segments[j]))
                self._theta_minus(j, avg)
            mom = None
            if not (self._diloco or r["take"] or r["own"]):  # DiLoCo's step also gives the round's norms
                mom = _torch.empty_like(avg)
                for b, at, length, _ in self._chunks(j):
                    ahead = avg[at:at + length]
                    outer_sgd_step(self.theta[b:b + length], self.momentum[b:b + length], ahead, self._mu, self._lr,
                                   self._nesterov, theta_out=ahead, mom_out=mom[at:at + length])
        self._ready[j] = (avg, mom)
        return [avg] if mom is None else [avg, mom]

    def _theta_minus(self, j, delta):
        """delta := fragment j's outer parameters - delta, in place (the average parameters)."""
        for b, at, length, _ in self._chunks(j):
            _torch.sub(self.theta[b:b + length], delta[at:at + length], out=delta[at:at + length])

    def apply(self, r, flat):
        """One completed sync (a dict from the core's take_outer_results): the average, the outer
        step, and the merge into (or replacement of) this replica's parameters."""
        j = r["fragment"]
        stepped = None  # the new momentum, with the new outer parameters in avg (prepare())
        with _torch.no_grad():
            if r["take"]:
                self.theta.copy_(flat)
                return
            if r["own"]:  # one replica, fp32: its parameters at the sync's start (now, with tau 0)
                avg = self._own.pop(j, None)
            elif j in self._ready:  # prepared on the background thread (prepare()), its outer step too (stepped)
                avg, stepped = self._ready.pop(j)
            elif isinstance(r["avg"], _torch.Tensor):  # already on the device (the caller copied it)
                avg = r["avg"]
            elif r["avg"] is not None:
                avg = self._to_device(r["avg"])
            else:  # avg = theta - the decoded mean delta, in place
                avg = self._decode_mean(r, sum(e - b for b, e, _, _ in self._segments[j]))
                self._theta_minus(j, avg)
            sq = []
            for b, at, length, trained in self._chunks(j):
                theta, mom, local = self.theta[b:b + length], self.momentum[b:b + length], flat[b:b + length]
                if stepped is not None:
                    theta.copy_(avg[at:at + length])
                    mom.copy_(stepped[at:at + length])
                else:
                    avg_c = local if avg is None else avg[at:at + length]
                    # The round's norms for the records (to float rounding of the C++ DiLoCo's,
                    # which subtracts in double): ||theta - avg|| from the step's delta, ||theta -
                    # local|| the same with one replica (avg is the replica's own parameters).
                    mine = _norm(theta - local) if self._diloco and avg is not None else None
                    delta = outer_sgd_step(theta, mom, avg_c, self._mu, self._lr, self._nesterov)
                    if self._diloco:
                        outer = _norm(delta)
                        sq.append(_torch.stack([outer, outer if mine is None else mine]) ** 2)
                if r["replace"] or not trained or self._alpha == 0:
                    local.copy_(theta)
                else:
                    mix(local, theta, self._alpha)
            if sq:
                self.norms = tuple(_torch.stack(sq).sum(0).sqrt())

    def _to_device(self, arrays):
        """A host array's values on the device, or a list's laid end to end, counted."""
        out, n = _staged_to_device(arrays, self.device)
        self.bytes += n
        return out

    def _decode_mean(self, r, n):
        """The mean outer gradient of the payloads: every replica's decoded and summed in rank
        order, then divided by their count; or (reduce-scatter) each shard's reduced mean."""
        sizes = r["sizes"]
        data = self._to_device(r["payloads"])
        delta = _torch.zeros(n, dtype=_torch.float32, device=self.device)
        at = 0
        if not r["reduce_scatter"]:
            for size in sizes:
                self.codec.decode_add(data[at:at + size], delta)
                at += size
            return delta if len(sizes) == 1 else delta.div_(_scalar(float(len(sizes)), delta))  # x / 1 is x
        shards = len(sizes)
        for k, size in enumerate(sizes):
            self.codec.decode_add(data[at:at + size], delta[n * k // shards:n * (k + 1) // shards])
            at += size
        return delta

    # -- checkpoints -------------------------------------------------------------------------
    def save(self, state):
        """The core's state (held: pending syncs only) completed into the host path's format."""
        meta = state.get("__meta__", {})
        theta = self.theta.cpu()
        for f in [int(x) for x in meta.get("pending", "").split(",") if x]:
            key = f"pending.{f}"
            if key + ".delta" in state:
                state[key + ".avg"] = (self._packed(theta, f) - _torch.from_numpy(state.pop(key + ".delta"))).numpy()
            elif meta.pop(key + ".own", None) is not None:
                state[key + ".avg"] = self._own[f].cpu().numpy()
        state["outer.params"] = theta.numpy()
        state["outer.momentum"] = self.momentum.cpu().numpy()
        return state

    def check(self, state):
        """The outer parameters and momentum of a state to load, refused (loco.Error) unless both
        are there and of the model's size; nothing is changed. (Their values are checked finite
        by the core's load_state, which refuses a state before it changes anything.)"""
        n = self.theta.numel()
        out = []
        for key in ("outer.params", "outer.momentum"):
            if key not in state:
                raise _loco.Error(f"the state has no {key}")
            src = _torch.as_tensor(state[key], dtype=_torch.float32).reshape(-1)
            if src.numel() != n:
                raise _loco.Error(f"the state's {key} has {src.numel()} values, the model {n}")
            out.append(src)
        return out

    def load(self, checked):
        """The outer parameters and momentum check() returned, installed."""
        with _torch.no_grad():
            for src, dst in zip(checked, (self.theta, self.momentum)):
                dst.copy_(src)
        self._own = {}
        self._ready = {}
