"""Ctrl-C while loco.torch waits for its peers (core/interrupt.h). Python runs signal handlers
only between bytecodes, and loco's waits run with the GIL released: a KeyboardInterrupt was held
back until the network timeout. Now the main thread's waits run the handlers every 50 ms:
- a handler that raises (Python's own for SIGINT) ends the wait: the communication is aborted and
  joined, the KeyboardInterrupt is raised from sync.step(), the peer is told why, and both syncs
  close;
- a handler that raises nothing (one that sets a flag to stop after the step) runs during the
  wait, and the wait goes on to its end.
Two in-process members: the main thread is member 0, member 1 a thread that holds back its step."""
import os
import signal
import sys
import threading
import time

import loco
import loco.torch
from harness import check, failures
from llama_torch import inner_step, make_model, make_opt

TIMEOUT_S = 300  # the network timeout: a wait that ends before it was interrupted, not timed out


def pair(method, **kw):
    """Two members' models, optimizers and syncs (member 1 wrapped on a thread: wrap() agrees the
    settings collectively)."""
    endpoints = loco.inprocess(2, network_timeout=f"{TIMEOUT_S}s")
    models = [make_model(r) for r in range(2)]
    opts = [make_opt(m) for m in models]
    syncs = [None, None]

    def wrap(r):
        syncs[r] = loco.torch.wrap(models[r], opts[r], method, endpoint=endpoints[r], **kw)

    t = threading.Thread(target=wrap, args=(1,))
    t.start()
    wrap(0)
    t.join()
    return models, opts, syncs


def train(model, opt, r, t):
    """Member r's step t up to sync.step()."""
    inner_step(model, opt, r, t)
    opt.step()
    opt.zero_grad()


def diloco_pair():
    """DiLoCo with H = 1, both members' first step taken up to sync.step() (the round's reduction)."""
    models, opts, syncs = pair("diloco", inner_steps=1)
    for r in range(2):
        train(models[r], opts[r], r, 0)
    return syncs


def signal_in(seconds):
    threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT)).start()


# 1. Python's SIGINT handler: KeyboardInterrupt out of the outer step's wait, long before the timeout.
syncs = diloco_pair()
signal_in(0.5)
start = time.monotonic()
try:
    syncs[0].step()  # member 1 has not stepped: the round's all-reduce waits for it
    said = "returned"
except KeyboardInterrupt as e:
    said = f"KeyboardInterrupt {e}"
except Exception as e:
    said = f"{type(e).__name__}: {e}"
took = time.monotonic() - start
check(said.startswith("KeyboardInterrupt") and took < TIMEOUT_S / 2,
      f"SIGINT during the outer step's wait: {said} after {took:.1f} s (network timeout {TIMEOUT_S} s)")
try:
    syncs[1].step()
    peer = "returned"
except loco.Error as e:
    peer = str(e)
check("member 0 was interrupted" in peer, f"the peer's step fails, saying why ({peer})")
for s in syncs:
    s.close()  # both close after the interrupt (raises or hangs otherwise)

# 2. A handler that raises nothing runs during the wait; the step then ends normally. Member 1
#    steps only once the handler has run (or after 60 s): the handler must run while member 0
#    waits for it.
ran = threading.Event()
previous = signal.signal(signal.SIGINT, lambda signum, frame: ran.set())
try:
    syncs = diloco_pair()
    order = []

    def member1():
        order.append("handler ran" if ran.wait(60) else "no handler within 60 s")
        syncs[1].step()

    late = threading.Thread(target=member1)
    late.start()
    signal_in(0.5)
    syncs[0].step()
    late.join()
    check(order == ["handler ran"], f"a handler that raises nothing runs during the wait for the peer, and the "
                                    f"step ends normally ({order})")
    for s in syncs:
        s.close()
finally:
    signal.signal(signal.SIGINT, previous)

# 3. A model on a device (LOCO_TORCH_AS_DEVICE=1: the path of a GPU model, on CPU tensors), with
#    Streaming DiLoCo's syncs started on loco's background thread: the loop waits for that thread
#    (a wait on a Python lock, which the handlers interrupt) while the thread waits for the peer.
#    The interrupt aborts the run's communication, so that the background job ends before the
#    KeyboardInterrupt goes on, and close() does not wait for the network timeout.
os.environ["LOCO_TORCH_AS_DEVICE"] = "1"
models, opts, syncs = pair("streaming", inner_steps=4, fragment_blocks=1, tau=1, codec="fp4-e3m0")
os.environ["LOCO_TORCH_AS_DEVICE"] = "0"


def steps(r, n):
    for t in range(n):
        train(models[r], opts[r], r, t)
        syncs[r].step()


check(syncs[0]._on_device, "member 0 takes the path of a model on a device")
t = threading.Thread(target=steps, args=(1, 2))  # member 1 takes 2 steps, then holds back
t.start()
t.join()
signal_in(1.0)
start = time.monotonic()
try:
    steps(0, 12)  # member 0 goes on until it waits for member 1's syncs
    said = "returned"
except KeyboardInterrupt:
    said = "KeyboardInterrupt"
except Exception as e:
    said = f"{type(e).__name__}: {e}"
took = time.monotonic() - start
start = time.monotonic()
for s in syncs:
    s.close()
closing = time.monotonic() - start
check(said == "KeyboardInterrupt" and took + closing < TIMEOUT_S / 2,
      f"SIGINT while the loop waits for a background sync: {said} after {took:.1f} s, both syncs closed "
      f"{closing:.1f} s later (network timeout {TIMEOUT_S} s)")

print(f"python.interrupt: {'OK' if not failures else f'{len(failures)} FAILED'}")
sys.exit(1 if failures else 0)
