"""loco.torch's out_dir: a run directory as `loco train` writes one (config.toml, metrics.jsonl,
summary.json, a lock), which `loco report` and `loco compare` read; and the checks of what a
loop passes to be recorded there."""
import fcntl
import numbers
import os

import torch as _torch

from loco import _loco


def out_dir_of(values, endpoint):
    """The run directory wrap()'s keywords name (None: no records), checked; an elastic member's
    own below it, as loco train --join's."""
    out_dir = values["train.out_dir"][1] if "train.out_dir" in values else None
    if out_dir is not None and not isinstance(out_dir, (str, os.PathLike)):
        raise _loco.Error(f"out_dir: a directory's path (str or pathlib.Path), got {type(out_dir).__name__}")
    out_dir = None if out_dir is None else os.fspath(out_dir)
    if values.get("streaming.offload_outer", (None, False))[1] is True and out_dir is None:
        # Else the config's default directory, relative to the working directory: two runs
        # started there would share one scratch file.
        raise _loco.Error("offload_outer keeps the outer state in a scratch file in the run directory: pass "
                          "out_dir (a directory of this run's own)")
    if out_dir is not None and endpoint.worker:
        out_dir = os.path.join(out_dir, endpoint.worker)
    return out_dir


class RunDir:
    """The directory the member that writes the records (rank 0) makes for a new run (refused if
    it holds one) and locks for the sync's life, as loco train locks its run directory (RUN/lock,
    flock): another process training there (a loco train, another loco.torch run) is refused."""

    def __init__(self, path):
        self.path = path
        if os.path.exists(os.path.join(path, "metrics.jsonl")):
            raise _loco.Error(f"{path} already holds a run (metrics.jsonl); remove it or choose another out_dir")
        try:
            os.makedirs(path, exist_ok=True)
            lock = open(os.path.join(path, "lock"), "a+")
        except OSError as e:
            raise _loco.Error(f"out_dir={path!r}: cannot make the run directory ({e.strerror or e})") from None
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.seek(0)
            holder = lock.read(32).strip()
            lock.close()
            raise _loco.Error(f"{path} is in use by another run{f' (process {holder})' if holder else ''}; wait "
                              "for it to finish or choose another out_dir") from None
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        self._lock = lock  # held until release() (or until this object is collected)

    def write_config(self, text):
        try:
            self._write_atomic("config.toml", text)
        except OSError as e:
            raise _loco.Error(f"out_dir={self.path!r}: cannot write the run directory ({e.strerror or e})") from None

    def append_record(self, line):
        with open(os.path.join(self.path, "metrics.jsonl"), "a") as f:
            f.write(line + "\n")

    def write_summary(self, text):
        self._write_atomic("summary.json", text)

    def release(self):
        if self._lock is not None:
            self._lock.close()  # releases the directory
            self._lock = None

    def _write_atomic(self, name, text):
        path = os.path.join(self.path, name)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)


def is_number(x):
    """A loss as a loop holds it: a Python or NumPy real number, or a tensor of one element."""
    return isinstance(x, numbers.Real) or (isinstance(x, _torch.Tensor) and x.numel() == 1)


def described(x):
    return f"a tensor of shape {tuple(x.shape)}" if isinstance(x, _torch.Tensor) else type(x).__name__


def whole_count(x):
    """Whether x is a non-negative whole number (an int, a float or a one-value tensor holding one)."""
    if isinstance(x, (bool, str, bytes)):
        return False
    try:
        return bool(int(x) == x) and int(x) >= 0
    except (TypeError, ValueError, RuntimeError):
        return False
