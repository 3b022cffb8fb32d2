"""A model on a device (python/loco/torch.py's GPU path): the copies between its tensors and
the method's page-locked host buffers, data-parallel's gradient copies made as backward
produces the gradients, and the thread that runs a sync's work while the loop goes on."""
import collections
import contextlib
import functools
import queue
import threading
import time

import torch as _torch


class Clock:
    """Seconds spent by phase, for metrics(): where the time of loco's hooks goes on the loop's
    thread and on the background thread (perf_counter; a phase may hold others, e.g. copies
    waited for within a merge)."""

    def __init__(self):
        self.seconds = collections.defaultdict(float)
        self._lock = threading.Lock()

    def add(self, phase, seconds):
        with self._lock:
            self.seconds[phase] += seconds

    def timed(self, phase, f, *args):
        """f(*args), its seconds added to phase."""
        t0 = time.perf_counter()
        try:
            return f(*args)
        finally:
            self.add(phase, time.perf_counter() - t0)

    def snapshot(self):
        with self._lock:
            return dict(self.seconds)


class Background:
    """One thread that runs a method's hooks in the order given, while the training loop goes on
    (the hooks release Python's lock). The first error is raised by the next join()."""

    def __init__(self, clock, abort):
        self._jobs = queue.Queue()
        self._thread = None
        self._error = None
        self._clock = clock  # "busy": the seconds its jobs ran
        self._abort = abort  # ends the run's communication (an interrupted join)

    def submit(self, job):
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="loco.torch sync", daemon=True)
            self._thread.start()
        self._jobs.put(job)

    def _run(self):
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                if self._error is None:
                    self._clock.timed("busy", job)
            except BaseException as e:  # raised again by join() on the loop's thread
                self._error = e
            finally:
                self._jobs.task_done()

    def join(self):
        """Waits for every job submitted; raises the first error of one. Interrupted while it
        waits (Ctrl-C: Python's waits on locks run the signal handlers), it aborts the run's
        communication, so that a job waiting for the peers ends at once, and waits for the jobs
        before the interrupt goes on: nothing of the sync runs on behind the loop's back (close()
        would otherwise wait for it until the network timeout)."""
        if self._thread is not None:
            try:
                self._jobs.join()
            except BaseException:
                self._abort()
                self._jobs.join()
                raise
        if self._error is not None:
            raise self._error

    def stop(self):
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None


class Copier:
    """Copies between a model's device tensor and the method's host buffer, counted. On CUDA the
    copies run on the current stream (after the work that produced the values, before the work
    that reads them); the host waits only for what it is about to read (an event), and an event
    marks when the host buffer is free again after copies from it.

    Every stream and event is the model's device's, whatever device is current: a loop may train
    a model on cuda:1 with cuda:0 current (torch runs each operation on its tensors' device, but
    an event recorded on the current device's stream would order nothing of the model's work)."""

    def __init__(self, device, clock=None):
        self._device = device
        self.cuda = device.type == "cuda"
        self._side = None  # the stream of the copies aside (made at its first use)
        self._aside_reads = None  # event: the copies aside out of the model's tensors are done
        self.bytes = 0
        self._clock = clock or Clock()  # "copies_waiting": the host waiting for copies (an event)
        self._from_host = None  # event: the last copies out of the host buffers are done
        self._read = []         # the host address ranges those copies read

    def _event(self):
        """An event marking the work queued so far on the model's device's current stream."""
        ev = _torch.cuda.Event()
        ev.record(_torch.cuda.current_stream(self._device))
        return ev

    def event(self):
        """An event marking the work queued so far on the current stream (None off CUDA)."""
        return self._event() if self.cuda else None

    def stream(self):
        """The current stream of the model's device (None off CUDA): where another thread's work
        goes with on()."""
        return _torch.cuda.current_stream(self._device) if self.cuda else None

    def on(self, stream):
        """Context: this thread's device work queued on `stream` (the training loop's, taken by
        stream() on the loop's thread), after what the loop queued before handing it over; a
        thread of its own starts on the default stream (and device 0: the context makes the
        stream's device current too)."""
        return _torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()

    def after(self, event):
        """Context: this thread's device work queued on loco's stream, after `event` (recorded on
        the training stream by the loop's thread: the work that made what it reads), so that it
        runs beside the training steps queued meanwhile instead of between them. Tensors it reads
        that were made on the training stream must be passed to read_aside(); those it makes and
        the training stream reads, to read_by(). Off CUDA: nothing."""
        if not self.cuda:
            return contextlib.nullcontext()
        side = self._side_stream()
        if event is not None:
            side.wait_event(event)
        return _torch.cuda.stream(side)

    def read_aside(self, t):
        """t (made on the training stream) is read by work on loco's stream: its memory is not
        handed to new work before that work is done, even once t is dropped."""
        if self.cuda:
            t.record_stream(self._side_stream())

    def read_by(self, t, stream):
        """t (made on loco's stream) is read by work on `stream`: the same, for that work."""
        if self.cuda:
            t.record_stream(stream)

    def device(self):
        """Context: the model's device current (CUDA), for what takes the current device, such as
        page-locking host memory (else a context is made on device 0 for it)."""
        return _torch.cuda.device(self._device) if self.cuda else contextlib.nullcontext()

    def host_free(self, pairs=None):
        """Before the host buffers are written (by the method or by copies into them). With
        pairs (host view, ...): before only those views are written, which waits only when a
        copy out of the host buffers still in flight reads any of them (a copy of one range to
        the device does not hold the loop back from fetching another: the wait would stop the
        host at the GPU's queue)."""
        if self._from_host is None:
            return
        if pairs is not None and not any(_overlaps(self._read, h) for h, _ in pairs):
            return
        self._synchronize(self._from_host)
        self._from_host = None
        self._read = []

    def to_host(self, pairs, wait=True, aside=False):
        """pairs: (host view, device view); the host holds the values when this returns, or, with
        wait=False, once the event returned has completed (None: at once). aside (with
        wait=False, on CUDA): the copies on loco's own stream, after the work queued so far on
        the current one, so that they overlap the work queued after them instead of holding it
        up; the device tensors read must then not be written before before_writes()."""
        self.host_free(pairs)
        aside = aside and not wait and self.cuda and any(d is not None for _, d in pairs)
        if aside:
            side = self._side_stream()
            side.wait_stream(_torch.cuda.current_stream(self._device))
        with _torch.no_grad(), (_torch.cuda.stream(side) if aside else contextlib.nullcontext()):
            for h, d in pairs:
                if d is None:
                    h.zero_()
                else:
                    h.copy_(d, non_blocking=True)
                    self.bytes += h.numel() * h.element_size()
            if not (self.cuda and pairs):
                return None
            ev = self._event()
        if aside:
            self._aside_reads = ev
        if wait:
            self._synchronize(ev)
            return None
        return ev

    def before_writes(self):
        """Before work that writes the model's device tensors is queued on the current stream:
        it waits (on the device) for the copies aside that read them."""
        if self._aside_reads is not None:
            _torch.cuda.current_stream(self._device).wait_event(self._aside_reads)
            self._aside_reads = None

    def _side_stream(self):
        if self._side is None:
            self._side = _torch.cuda.Stream(device=self._device)
        return self._side

    def to_device(self, pairs):
        """pairs: (host view, device view); returns at once on CUDA."""
        if pairs:
            self.before_writes()
        with _torch.no_grad():
            for h, d in pairs:
                d.copy_(h, non_blocking=True)
                self.bytes += h.numel() * h.element_size()
        if self.cuda and pairs:
            self._from_host = self._event()  # after these copies and the earlier ones
            self._read += [_extent(h) for h, _ in pairs]

    def staged_to_device(self, arrays):
        """Host arrays' values laid end to end in a new tensor on the device, counted (on CUDA
        through page-locked memory, so that the copy waits for nothing on the stream). The arrays
        may be freed once this returns."""
        out, n = staged_to_device(arrays, self._device)
        self.bytes += n
        return out

    def host_tensor(self, n):
        """n float32 values on the host to copy to the device (page-locked on CUDA)."""
        with self.device():
            return _torch.empty(n, dtype=_torch.float32, pin_memory=self.cuda)

    def aside_to_device(self, staged):
        """A host tensor's values (host_tensor's) in a new tensor on the device, counted, the copy
        on a stream of its own (CUDA), so that it overlaps the work queued on the current stream
        instead of holding it up. Returns the tensor and an event (None off CUDA): the current
        stream's work that reads the tensor must be queued after ready(event). The tensor is
        allocated for the current stream, and its copy waits for the work queued there so far
        (whatever used its memory before); it is marked as used on loco's stream too, so that
        when it is dropped before ready(event) was queued (a load_state_dict, the last step), its
        memory is not handed to new work before the copy into it is done. `staged` may be freed
        once this returns."""
        if not self.cuda:
            self.bytes += staged.numel() * staged.element_size()
            return staged.to(self._device, copy=True), None
        side = self._side_stream()
        out = _torch.empty(staged.numel(), dtype=staged.dtype, device=self._device)
        side.wait_stream(_torch.cuda.current_stream(self._device))
        with _torch.cuda.stream(side):
            out.copy_(staged, non_blocking=True)
            ev = _torch.cuda.Event()
            ev.record(side)
        out.record_stream(side)
        self.bytes += staged.numel() * staged.element_size()
        return out, ev

    def ready(self, event):
        """The current stream's work queued from now on waits for `event` (on the device: the host
        does not wait)."""
        if event is not None:
            _torch.cuda.current_stream(self._device).wait_event(event)

    def wait(self):
        """Until every copy issued so far on the current stream and on loco's (into the host
        buffers, out of them) is done: a copy aside that nothing waited for (its sync's work
        failed, or closing came first) still writes the host buffer until then."""
        if self.cuda:
            if self._side is not None:
                self._clock.timed("copies_waiting", self._side.synchronize)
            self._synchronize(self._event())

    def _synchronize(self, ev):
        self._clock.timed("copies_waiting", ev.synchronize)


def staged_to_device(arrays, device):
    """A host array's values on `device` (a list's laid end to end), and the bytes copied: on CUDA
    through page-locked memory, so that the copy waits for nothing on the current stream."""
    hosts = [_torch.from_numpy(a) for a in (arrays if isinstance(arrays, list) else [arrays])]
    n = sum(h.numel() * h.element_size() for h in hosts)
    if not hosts:
        return _torch.empty(0, dtype=_torch.uint8, device=device), 0
    if device.type != "cuda":
        return (hosts[0] if len(hosts) == 1 else _torch.cat(hosts)).to(device), n
    with _torch.cuda.device(device):
        return _stage(hosts).to(device, non_blocking=True), n


def _stage(hosts):
    """Host tensors laid end to end in a new page-locked tensor."""
    staged = _torch.empty(sum(h.numel() for h in hosts), dtype=hosts[0].dtype, pin_memory=True)
    at = 0
    for h in hosts:
        staged[at:at + h.numel()].copy_(h)
        at += h.numel()
    return staged


def _extent(t):
    """The host addresses a contiguous view spans: [first byte, past its last)."""
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


def _overlaps(extents, t):
    lo, hi = _extent(t)
    return any(a < hi and lo < b for a, b in extents)


class GradientCopies:
    """Data-parallel on a device: each parameter's gradient is copied to its view of the host
    gradient buffer as soon as backward produces it (a hook on the parameter, the copy queued on
    the stream backward runs on), so that the copies overlap the rest of backward instead of all
    following it. This holds when each gradient is produced once into an empty .grad (the loop
    sets the gradients to None, torch's zero_grad default since 2.0, and runs one backward per
    step); a second backward before the step (accumulation), an existing .grad or a sparse
    gradient makes the step copy every gradient after backward instead, as without hooks."""

    def __init__(self, params, host_views, copier):
        self._params = params
        self._host = host_views
        self._copier = copier
        self._copied = [False] * len(params)
        self._whole = False  # this step's gradients must be copied after backward
        self._handles = [p.register_hook(functools.partial(self._ready, i)) for i, p in enumerate(params)]

    def _ready(self, i, grad):
        if self._copied[i] or self._params[i].grad is not None or grad.is_sparse or grad.layout != _torch.strided:
            self._whole = True
            return None
        self._copier.host_free()  # the previous step's copies out of the buffer are done
        with _torch.no_grad():
            self._host[i].copy_(grad, non_blocking=True)
        self._copier.bytes += grad.numel() * grad.element_size()
        self._copied[i] = True
        return None

    def pending(self):
        """At the step, after backward: the (host view, gradient) pairs still to copy (every one
        when the hooks could not be used) and how many the hooks copied; the step's record reset."""
        todo = list(range(len(self._params))) if self._whole else [i for i, c in enumerate(self._copied) if not c]
        self._copied = [False] * len(self._params)
        self._whole = False
        return [(self._host[i], self._params[i].grad) for i in todo], len(self._params) - len(todo)

    def remove(self):
        for h in self._handles:
            h.remove()
        self._handles = []
