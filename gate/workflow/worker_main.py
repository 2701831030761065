"""The kernel's process: `python -m gate.workflow.worker_main`, started and fed by gate/workflow/isolation.py.

It imports the kernel under test, runs each case's forward and backward on every seed and sends
the kernel's raw outputs (out, lse, dq, dk, dv, dbias, dsink, dropout mask, a decode call's cache) back through a temp file
(torch.save of CPU tensors); it never judges them. The errors, the bounds and the verdict are
computed in the gate's own process, which never imports the kernel: a kernel that patches the
measurement here, changes directory or ends this process changes nothing that is judged.

Protocol: one JSON request per line on stdin, one JSON reply per line on the file descriptor
that was stdout at start. stdout itself is pointed at stderr before the kernel is imported, so a
kernel's prints cannot corrupt the replies (and end up in the stderr tail of an ERROR row).
Depth checks (probes: determinism, dropout statistics) run here and send their CheckResults.

The process dies with the gate (PR_SET_PDEATHSIG on Linux), and it ends itself after a case that
changed its state (grad mode, default dtype, a torch function patched): `state_fingerprint`
before and after the case differ, the reply asks for a restart, so a later case never runs in a
process a kernel broke.
"""

from __future__ import annotations

import json
import os
import sys
import time


def die_with_parent() -> None:
    """SIGKILL when the gate's thread that started this process ends (Linux); where the call is not
    available the gate's SIGTERM handler and its process-group kill still end this process."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    parent = os.environ.get("ATTN_GATE_PARENT_PID")
    if parent and os.getppid() != int(parent):  # the gate died before the request took effect
        os._exit(1)


# Where a kernel reaches for process-wide state: the functions of these namespaces (by identity).
_WATCHED = ("torch", "torch.nn.functional", "torch.autograd", "torch.Tensor")
# What torch replaces itself on a lazy import (torch._dynamo wraps torch.manual_seed): not a kernel's doing
_TORCH_REWRAPS = {("torch", "manual_seed")}


def state_fingerprint() -> tuple:
    """What a kernel could change in this process that would make a later case measure wrongly."""
    import importlib

    import torch

    funcs = []
    for name in _WATCHED:
        space = torch.Tensor if name == "torch.Tensor" else importlib.import_module(name)
        for attr, value in sorted(vars(space).items()):
            if callable(value) and not isinstance(value, type) and not attr.startswith("__") \
                    and (name, attr) not in _TORCH_REWRAPS:
                funcs.append((name, attr, id(value)))
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), torch.get_default_dtype(),
            torch.are_deterministic_algorithms_enabled(), tuple(funcs))


def state_change(before: tuple, after: tuple) -> str | None:
    """The first difference, in words, or None."""
    labels = ("grad mode", "inference mode", "the default dtype", "deterministic algorithms")
    for label, was, now in zip(labels, before[:4], after[:4]):
        if was != now:
            return f"{label} was {was}, now {now}"
    was = {(space, attr): ident for space, attr, ident in before[4]}
    for space, attr, ident in after[4]:
        if (space, attr) in was and was[(space, attr)] != ident:
            return f"{space}.{attr} was replaced"
    return None


def _send(channel, payload: dict) -> None:
    channel.write(json.dumps(payload) + "\n")
    channel.flush()


def _cuda_failed(text: str) -> bool:
    """An error that leaves the CUDA context unusable: this worker must not run another case."""
    return any(s in text for s in ("CUDA error", "illegal memory access", "AcceleratorError", "device-side assert",
                                   "CUBLAS_STATUS", "cudaError", "unspecified launch failure"))


def run_one(adapter, request: dict, device: str) -> dict:
    import torch

    from gate.attention.inputs import make_inputs
    from gate.core.cases import Case
    from gate.correctness.probes.registry import checks_for
    from gate.core.errors import first_line
    from gate.correctness.run_case import BadOutput, grad_names, kernel_pass, traceback_tail
    from gate.kernels.sdpa import NoKernel

    case = Case.from_dict(request["case"])
    start = time.perf_counter()
    reason = adapter.unsupported_reason(case, device)  # a kernel family answers per entry point
    if reason:
        return {"status": "SKIP", "reason": reason}
    seeds = []
    try:
        adapter.prepare(case)
        for seed in case.seeds:
            inputs = make_inputs(case, seed, device)
            try:
                kout, grads = kernel_pass(adapter, case, inputs)
            except NoKernel as exc:
                return {"status": "SKIP", "reason": str(exc)}
            except BadOutput as exc:
                return {"status": "FAIL", "reason": f"seed {seed}: {exc}"}

            def cpu(t):  # a tensor, or a list of them (varlen dropout keeps one mask per sequence)
                if isinstance(t, (list, tuple)):
                    return [cpu(x) for x in t]
                return None if t is None else t.detach().to("cpu").clone()

            # the grads run_case measures: dq, dk, dv (w.r.t. the layout views the kernel got),
            # dbias w.r.t. the bias leaf rebuilt here from the case (bias_grad cases) and dsink
            #; none for a forward-only run; a decode call's cache after the call
            entry = {"seed": seed, "out": cpu(kout.out), "lse": cpu(kout.lse), "dropout_keep": cpu(kout.dropout_keep),
                     "cache": None if kout.cache is None else [cpu(kout.cache[0]), cpu(kout.cache[1])]}
            if grads is not None:
                entry.update({name: cpu(grad) for name, grad in zip(grad_names(adapter, case, inputs), grads)})
            seeds.append(entry)
            del kout, grads, inputs
        checks = [c.to_dict() for check in checks_for(case, tuple(request.get("checks", ()))) for c in check(adapter, case, device)]
        if device == "cuda":
            torch.cuda.synchronize()  # an asynchronous fault belongs to this case, not to the next
    except BadOutput as exc:
        return {"status": "FAIL", "reason": str(exc)}
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a raising kernel (sys.exit too) is an ERROR row; the worker is replaced after a CUDA fault
        text = first_line(exc)
        return {"status": "ERROR", "reason": text, "traceback": traceback_tail(exc),
                "restart": device == "cuda" and _cuda_failed(f"{type(exc).__name__} {exc}")}
    torch.save({"seeds": seeds}, request["file"])
    return {"status": "RAN", "checks": checks, "seconds": time.perf_counter() - start}


def run_perf_case(adapter, request: dict, device: str) -> dict:
    """Time one case against the anchor (gate/speed/runs.py measure_case) and send the raw timing."""
    from gate.core.cases import Case
    from gate.speed.runs import measure_case
    from gate.speed.timing import TimingPlan

    result = measure_case(adapter, request["anchor"], Case.from_dict(request["case"]), device,
                          TimingPlan.from_dict(request["plan"]))
    return {"status": "PERF", "result": result.to_dict(), "restart": result.status == "ERROR" and device == "cuda"}


def main() -> int:
    import faulthandler

    die_with_parent()
    faulthandler.enable()  # a segfault or abort prints the Python stack to stderr: the ERROR row's tail shows it
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # the kernel's prints go to stderr, never into the replies
    sys.stdout = sys.stderr
    cwd = os.getcwd()
    hello = json.loads(sys.stdin.readline() or "{}")
    device = hello.get("device", "cpu")
    try:
        from gate.core.errors import UserError
        from gate.kernels.registry import get_adapter

        if hello.get("family"):  # a kernel family of the gate's config, its entry points imported here
            from gate.core.config import KernelFamily
            from gate.kernels.user import FamilyAdapter

            adapter = FamilyAdapter(KernelFamily(**hello["family"]))
        else:
            adapter = get_adapter(hello["kernel"])
        caps = adapter.capabilities()
        _send(channel, {"op": "hello", "version": adapter.version(), "devices": list(caps.devices),
                        "unavailable": adapter.unavailable_reason(), "notes": list(caps.notes),
                        "returns_lse": caps.returns_lse, "sink_grad": caps.sink_grad, "backward": caps.backward})
    except UserError as exc:
        _send(channel, {"op": "hello", "user_error": str(exc)})
        return 0
    for line in sys.stdin:
        request = json.loads(line)
        before = state_fingerprint()
        reply = run_perf_case(adapter, request, device) if request.get("op") == "perf_case" else run_one(adapter, request, device)
        if os.getcwd() != cwd:  # a kernel that moves the process is wrong, whatever it returned
            reply = {"status": "ERROR", "reason": f"the kernel changed the working directory to {os.getcwd()}", "restart": True}
        changed = state_change(before, state_fingerprint())
        if changed:  # this case's own reply stands (it is judged in the gate); no later case runs here
            reply = {**reply, "restart": True}
            print(f"attn-gate worker: the kernel changed this process's state ({changed}); restarting", file=sys.stderr)
        _send(channel, reply)
        if reply.get("restart"):
            return 0
        if request.get("op") != "perf_case":  # a timed case keeps its loop's allocations warm
            from gate.core.environment import release_cached_gpu_memory

            try:
                release_cached_gpu_memory(device)
            except Exception:  # a CUDA fault the case left pending: this process's CUDA state is gone, start afresh
                return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
