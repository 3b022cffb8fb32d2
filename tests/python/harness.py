"""What the Python layer's in-process tests share: checks that print and record, loco.torch runs
with the members as threads of this process (loco.inprocess), and expected errors."""
import threading

import torch

import loco
import loco.torch
from llama_torch import inner_step, make_model, make_opt, max_diff, opt_step, opt_zero, params_of

TOL = 1e-6
failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failures.append(what)


def run_members(M, fn):
    """fn(r, endpoint) in M threads, the members of one in-process world; their results, in
    order. A member's error aborts its endpoint (so that the others stop waiting on it) and is
    raised here."""
    endpoints = loco.inprocess(M)
    out, errors = [None] * M, []

    def body(r):
        try:
            torch.set_num_threads(1)
            out[r] = fn(r, endpoints[r])
        except Exception as e:  # reported by the main thread
            errors.append(f"replica {r}: {e}")
            endpoints[r].abort(str(e))

    threads = [threading.Thread(target=body, args=(r,)) for r in range(M)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError("; ".join(errors))
    return out


def run_loco(method, M, steps, clip=None, inspect=None, skip=(), prepare=None, opt_of=None, **kwargs):
    """Each of M threads trains its own model (initialized with its own seed: wrap() starts every
    replica from replica 0's parameters) with loco.torch; returns per member (params, eval
    params, metrics, report), and with inspect, the list of what inspect(t, model, opt, sync)
    returned at each step t, called after the optimizer's step (the gradients still there) and
    before sync.step(). skip: the (replica, step) pairs whose optimizer step is left out (as a
    GradScaler skips one), sync.step() called all the same. prepare(model): applied to each
    member's model before its optimizer is made (e.g. freezing parameters). opt_of(model): the
    inner optimizer, or a list of them (default make_opt)."""
    models = [make_model(r) for r in range(M)]  # here: torch's seed is global to the process
    for m in models if prepare is not None else []:
        prepare(m)

    def member(r, endpoint):
        model, seen = models[r], []
        opt = (opt_of or make_opt)(model)
        sync = loco.torch.wrap(model, opt, method, endpoint=endpoint, **kwargs)
        for t in range(steps):
            inner_step(model, opt, r, t)
            if clip is not None:  # the averaged gradients clipped, as loco train does
                sync.sync_gradients()
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            if (r, t) not in skip:
                opt_step(opt)
            if inspect is not None:
                seen.append(inspect(t, model, opt, sync))
            opt_zero(opt)
            sync.step()
        out = (params_of(model), list(sync.eval_parameters().values()), sync.metrics(), sync.report())
        sync.close()
        return out + ((seen,) if inspect is not None else ())

    return run_members(M, member)


def compare(name, got, ref, tol=TOL):
    worst = max(max_diff(g[0], r) for g, r in zip(got, ref))
    check(worst <= tol, f"{name}: replicas' parameters within {tol} of the plain-torch reference (max diff {worst:.2e})")


def expect_error(what, pattern, fn):
    try:
        fn()
    except loco.Error as e:
        check(pattern in str(e), f"{what}: '{e}'")
        return
    except Exception as e:
        check(False, f"{what}: raised {type(e).__name__}: {e}")
        return
    check(False, f"{what}: no error")
