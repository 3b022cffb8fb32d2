"""loco: low-communication training (DiLoCo, Streaming DiLoCo, NoLoCo, data-parallel) for
models loco does not define, with the same C++ communicators, codecs and algorithms as the
`loco` program. `loco.torch` wraps a PyTorch training loop; see docs/python.md.

    loco.init()        # under mpirun: the MPI world; otherwise a world of one process
    sync = loco.torch.wrap(model, inner_opt, method="diloco", inner_steps=30, outer_lr=0.7)
"""
import atexit as _atexit
import numbers as _numbers
import os as _os

from . import _loco

Error = _loco.Error
Endpoint = _loco.Endpoint
codec_roundtrip = _loco.codec_roundtrip
noloco_groups = _loco.noloco_groups
route_permutation = _loco.route_permutation


def outer_step(theta, momentum, avg, lr, momentum_coef, nesterov=True):
    """DiLoCo's outer optimizer, in place on float32 CPU tensors or arrays of one size: delta =
    theta - avg (avg: the replicas' mean parameters), SGD with (Nesterov) momentum on delta, as
    every loco method takes it (PyTorch's convention: torch.optim.SGD with theta.grad = delta)."""
    as_np = [t.numpy() if hasattr(t, "numpy") and not hasattr(t, "__array_interface__") else t
             for t in (theta, momentum, avg)]
    _loco.outer_step(*as_np, float(lr), float(momentum_coef), bool(nesterov))
config_keys = _loco.config_keys

_endpoint = None
_threads_chosen = True  # False after loco.init() without threads=: wrap() of a model on a device picks them


def _device_threads():
    """loco's compute threads beside a model on a GPU: half the host's cores. A model on a GPU
    leaves the cores to loco's host work (a sync's outer gradient, codec, outer step and merge),
    but not all of them: the loop's own thread, which launches the device's work, and the data
    loading keep the rest (with every core busy in loco's work beside the steps, the loop's thread
    would wait for a core, and the device for it)."""
    return max(1, (_os.cpu_count() or 2) // 2)


def _threads_for_device():
    """Unless loco.init() was given threads=, _device_threads()."""
    global _threads_chosen
    if not _threads_chosen:
        _loco.set_threads(_device_threads())
        _threads_chosen = True


def _under_mpirun():
    return any(k in _os.environ for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"))


def init(url=None, *, worker=None, network_bandwidth="inf", network_latency="0ms", network_tcp=False,
         network_timeout="60s", threads=None):
    """Joins this process's world and makes it the default for `loco.torch.wrap`.

    url: None for mpirun's world when launched by mpirun, else a world of one process;
    "mpi" to require MPI; "redis://HOST:PORT/RUN" for an elastic run (as `loco train --join`),
    with worker=NAME: workers come and go, and the method's rounds are among the members of
    their moment (docs/elastic.md; the password and the run secret come from
    elastic.password_file / elastic.secret_file given to wrap(), or $LOCO_REDIS_PASSWORD and
    $LOCO_RUN_SECRET). The network_* arguments are loco's config keys network.bandwidth,
    network.latency, network.tcp and network.timeout: the link model every message crosses
    (e.g. "1Gbit", "20ms"), and how long any wait on a peer may last. threads: loco's compute
    threads for its outer steps (default 1, the model's own threads being torch's; half the
    host's cores once a model on a GPU is wrapped, whose loop leaves them idle).
    Returns the Endpoint (rank, size)."""
    global _endpoint
    if _endpoint is not None:
        raise Error("loco.init was already called in this process")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, _numbers.Integral)
                                or not 1 <= threads <= 1024):
        raise Error(f"loco.init: threads is a whole number in [1, 1024] (got {threads!r})")
    link = _link(network_bandwidth, network_latency, network_tcp, network_timeout)
    if url is None:
        url = "mpi" if _under_mpirun() else "local"
    if url == "mpi":
        _endpoint = _loco.mpi_world(**link)
        _atexit.register(_loco.finalize_mpi)
    elif url == "local":
        _endpoint = _loco.inprocess_world(1, **link)[0]
    elif isinstance(url, str) and url.startswith("redis://"):
        if worker is None:
            raise Error("loco.init(redis://...) needs worker=NAME (this worker's name in the run)")
        _endpoint = _loco.elastic_world(url, str(worker), **link)
    else:
        raise Error(f"loco.init: unknown world {url!r} (expected None, 'mpi', 'local' or 'redis://HOST:PORT/RUN')")
    global _threads_chosen
    _loco.set_threads(1 if threads is None else int(threads))
    _threads_chosen = threads is not None
    return _endpoint


def inprocess(size, *, network_bandwidth="inf", network_latency="0ms", network_tcp=False, network_timeout="60s"):
    """Endpoints of `size` members inside this process, one per thread (for tests and
    experiments on one machine): pass one to each thread's `loco.torch.wrap(..., endpoint=e)`."""
    if isinstance(size, bool) or not isinstance(size, _numbers.Integral):
        raise _loco.Error(f"loco.inprocess: size is a whole number of members (got {size!r})")
    return _loco.inprocess_world(int(size), **_link(network_bandwidth, network_latency, network_tcp, network_timeout))


def _is_bool(x):
    """True or False, NumPy's bool_ included (not a string such as "false", which bool() reads as
    True)."""
    return isinstance(x, bool) or (type(x).__module__ == "numpy" and type(x).__name__ == "bool_")


def _link(bandwidth, latency, tcp, timeout):
    """The link model's settings (checked by the core as config values), network_tcp a bool: a
    string such as "false" would read as true."""
    if not _is_bool(tcp):
        raise Error(f"network_tcp is True or False (got {tcp!r})")
    return dict(bandwidth=str(bandwidth), latency=str(latency), tcp=bool(tcp), timeout=str(timeout))


def endpoint():
    """The endpoint of `loco.init`; an error before it was called."""
    if _endpoint is None:
        raise Error("loco.init() has not been called (call it once before wrapping a model)")
    return _endpoint


def rank():
    return endpoint().rank


def world_size():
    return endpoint().size
