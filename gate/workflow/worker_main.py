"""The kernel's process: `python -m gate.workflow.worker_main`, started and fed by gate/workflow/isolation.py.

It imports the kernel under test, runs each case's forward and backward on every seed and sends
the kernel's raw outputs (out, lse, dq, dk, dv, dbias, dsink, dropout mask, a decode call's cache) back through a temp file
(torch.save of CPU tensors); it never judges them. The errors, the bounds and the verdict are
computed in the gate's own process, which never imports the kernel: a kernel that patches the
measurement here, changes directory or ends this process changes nothing that is judged.

Protocol: one JSON request per line on stdin, one JSON reply per line on the file descriptor
that was stdout at start. stdout itself is pointed at stderr before the kernel is imported, so a
kernel's prints cannot corrupt the replies (and end up in the stderr tail of an ERROR row).
Each request carries an `id` that its reply echoes: a line a kernel writes to the reply pipe
itself is no answer (the gate makes the case an ERROR and replaces this process). The loop holds
its own functions, json's and stdin as locals taken before the kernel is imported, so a kernel
that replaces them in this module (`sys.modules['__main__']`) changes nothing the loop calls.
Depth checks (probes: determinism, dropout statistics) run here and send their CheckResults.

The process dies with the gate (PR_SET_PDEATHSIG on Linux), and it ends itself after a case that
changed its state (grad mode, default dtype, a torch function patched): `state_fingerprint`
before and after the case differ, the reply asks for a restart, so a later case never runs in a
process a kernel broke. A replaced attribute of the gate's own code here (this module, json,
gate.*: functions, classes and their dunders, rebound constants), of torch.Tensor (its operators
`__matmul__`, `__truediv__` ...) or of the autograd engine makes the case itself an ERROR: its
reply was made by, or passed through, code the kernel rewrote.

It is the subreaper of everything the kernel starts (PR_SET_CHILD_SUBREAPER): an orphan, even one
in a session of its own with an empty environment, stays its descendant, so `process_tree`
finds it; this process kills its tree before it exits, the gate kills it when it ends the worker.
"""

from __future__ import annotations

import ctypes
import faulthandler
import importlib
import json
import os
import signal
import sys
import time
import types

from gate.core.cases import Case
from gate.core.config import KernelFamily
from gate.core.errors import UserError
from gate.correctness.probes.registry import checks_for
from gate.speed.runs import measure_case
from gate.speed.timing import TimingPlan


def die_with_parent() -> None:
    """SIGKILL when the gate's thread that started this process ends (Linux); where the call is not
    available the gate's SIGTERM handler and its process-group kill still end this process."""
    if not sys.platform.startswith("linux"):
        return

    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    parent = os.environ.get("ATTN_GATE_PARENT_PID")
    if parent and os.getppid() != int(parent):  # the gate died before the request took effect
        os._exit(1)


def enable_subreaper() -> None:
    """Orphans of this process's descendants reparent to it, not to init (Linux)."""
    if not sys.platform.startswith("linux"):
        return

    PR_SET_CHILD_SUBREAPER = 36
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        return


def process_tree(root: int, prune: tuple[int, ...] = ()) -> list[int]:
    """Every live descendant of `root` (Linux: /proc parent links), children before grandchildren;
    none of the processes in `prune` or below them."""
    children: dict[int, list[int]] = {}
    try:
        entries = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return []
    for name in entries:
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields and fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found and child not in prune:
                found.append(child)
                todo.append(child)
    return found


def kill_tree(root: int, spare: tuple[int, ...] = ()) -> None:
    """SIGKILL every descendant of `root` but the processes in `spare` and theirs, stopped first
    (round after round until no new one appears), so that none forks a process the kill would miss."""

    stopped: list[int] = []
    for _ in range(20):
        fresh = [pid for pid in process_tree(root, spare) if pid not in stopped]
        if not fresh:
            break
        for pid in fresh:
            try:
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                pass
        stopped += fresh
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


# Where a kernel reaches for process-wide state: the functions of these namespaces (by identity).
_WATCHED = ("torch", "torch.nn.functional", "torch.autograd")  # with torch.Tensor and the autograd engine
# What torch replaces itself on a lazy import (torch._dynamo wraps torch.manual_seed): not a kernel's doing
_TORCH_REWRAPS = {("torch", "manual_seed")}
# The gate's own code in this process: this module (run as __main__), json, and every gate.* module
_OWN_MODULES = ("__main__", "json", "json.decoder", "json.encoder")


# The fingerprint is taken twice per case, so it stays cheap: its lists are compared as dicts (no
# order kept) and a class is read through its MRO's dicts, not one attribute lookup at a time.
def _functions(space_name: str, space) -> list[tuple[str, str, int]]:
    return [
        (space_name, attr, id(value))
        for attr, value in list(vars(space).items())
        if (callable(value) or isinstance(value, (staticmethod, classmethod, property)))
        and not isinstance(value, type)
        and not attr.startswith("__")
    ]


def _own_functions() -> list[tuple[str, str, int]]:
    """The gate's own modules here: every module-level name (functions, classes, constants: a
    rebound constant changes what a later case computes too) and every attribute of the classes
    they define, dunders included (`__post_init__`, `__init__`)."""
    funcs = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name in _OWN_MODULES or name == "gate" or name.startswith("gate.")):
            continue
        names = list(vars(module).items())
        if name in _OWN_MODULES:
            funcs += _functions(name, module)
        else:
            funcs += [
                (name, attr, id(value))
                for attr, value in names
                if not attr.startswith("__") and not isinstance(value, types.ModuleType)
            ]
        for cls_name, value in names:
            if isinstance(value, type) and getattr(value, "__module__", None) == module.__name__:
                funcs += [
                    (f"{name}.{cls_name}", attr, id(v))
                    for attr, v in list(vars(value).items())
                    if attr not in ("__dict__", "__weakref__", "__doc__")
                ]
    return funcs


def _class_attributes(space_name: str, cls: type) -> list[tuple[str, str, int]]:
    """Every attribute a class resolves (its MRO's, dunders included), by identity of the stored
    object: `torch.Tensor.__matmul__ = f` sets a new one where the C base's was found before."""
    resolved: dict[str, object] = {}
    for klass in reversed(cls.__mro__):  # a class's own entry overrides its bases', as lookup finds it
        resolved.update(vars(klass))
    return [
        (space_name, attr, id(v)) for attr, v in resolved.items() if attr not in ("__dict__", "__weakref__", "__doc__")
    ]


def _autograd_engine() -> list[tuple[str, str, int]]:
    """The autograd engine as Python reaches it: the engine object `backward` and `grad` run on,
    the functions of torch.autograd's graph and function modules, and the Function class."""
    import torch.autograd.function as function
    import torch.autograd.graph as graph
    from torch.autograd.variable import Variable

    found = [("torch.autograd.variable.Variable", "_execution_engine", id(Variable._execution_engine))]
    found += _functions("torch.autograd.graph", graph) + _functions("torch.autograd.function", function)
    return found + _class_attributes("torch.autograd.Function", function.Function)


def state_fingerprint() -> tuple:
    """What a kernel could change in this process that would make a later case measure wrongly:
    torch's process state and functions, then the gate's own functions (index 5)."""

    import torch

    funcs = []
    for name in _WATCHED:
        space = importlib.import_module(name)
        funcs += [f for f in _functions(name, space) if (f[0], f[1]) not in _TORCH_REWRAPS]
    funcs += _class_attributes("torch.Tensor", torch.Tensor) + _autograd_engine()
    return (
        torch.is_grad_enabled(),
        torch.is_inference_mode_enabled(),
        torch.get_default_dtype(),
        torch.are_deterministic_algorithms_enabled(),
        tuple(funcs),
        tuple(_own_functions()),
    )


def _replaced(before: tuple, after: tuple) -> str | None:
    was = {(space, attr): ident for space, attr, ident in before}
    for space, attr, ident in after:
        if (space, attr) in was and was[(space, attr)] != ident:
            return f"{space}.{attr} was replaced"
    return None


def state_change(before: tuple, after: tuple) -> str | None:
    """The first difference, in words, or None."""
    labels = ("grad mode", "inference mode", "the default dtype", "deterministic algorithms")
    for label, was, now in zip(labels, before[:4], after[:4]):
        if was != now:
            return f"{label} was {was}, now {now}"
    return _replaced(before[4], after[4]) or own_change(before, after)


# Spaces whose replacement makes the case's own reply untrusted (its outputs went through them to
# the gate: detach, to, clone, torch.save's pickling of tensors), besides the gate's own code.
_REPLY_PATHS = (
    "torch.Tensor",
    "torch.autograd.variable.Variable",
    "torch.autograd.graph",
    "torch.autograd.function",
    "torch.autograd.Function",
)


def own_change(before: tuple, after: tuple) -> str | None:
    """A replaced function of the gate's own code, of torch.Tensor or of the autograd engine: the
    case's reply was made by code the kernel rewrote, so it is not to be trusted."""
    reply_path = [f for f in before[4] if f[0] in _REPLY_PATHS]
    return _replaced(before[5], after[5]) or _replaced(reply_path, after[4])


def _send(channel, payload: dict, dumps=json.dumps) -> None:
    channel.write(dumps(payload) + "\n")  # one write: a reply is never split around a kernel's line
    channel.flush()


def _cuda_failed(text: str) -> bool:
    """An error that leaves the CUDA context unusable: this worker must not run another case."""
    return any(
        s in text
        for s in (
            "CUDA error",
            "illegal memory access",
            "AcceleratorError",
            "device-side assert",
            "CUBLAS_STATUS",
            "cudaError",
            "unspecified launch failure",
        )
    )


def _cuda_sound() -> bool:
    """No CUDA fault is pending: a kernel that raised its own error after a launch that faulted
    leaves the fault to the next synchronisation, which must not be the next case's."""
    import torch

    if not torch.cuda.is_initialized():
        return True  # nothing was launched
    try:
        torch.cuda.synchronize()
    except Exception:
        return False
    return True


def ended_reply(ended, device: str, kept: bool = False) -> dict:
    """The reply for a case that ended early (run_case.Ended); an ERROR asks for a fresh worker
    after a CUDA fault named in the error, or, where the gate would keep this worker after a raise
    (`kept`: the probe), one left pending (elsewhere an ERROR ends the worker anyway, and waiting
    on a launch that never finishes would turn the raise into a timeout)."""
    reply = {"status": ended.status.value, "reason": ended.reason}
    if ended.status.value == "ERROR":
        faulted = device == "cuda" and (_cuda_failed(ended.exception) or (kept and not _cuda_sound()))
        reply.update(traceback=ended.traceback, restart=faulted)
    return reply


def _on_cpu(t):
    """A tensor, or a list of them (varlen dropout keeps one mask per sequence), copied to the CPU."""
    if isinstance(t, (list, tuple)):
        return [_on_cpu(x) for x in t]
    return None if t is None else t.detach().to("cpu").clone()


def run_one(adapter, request: dict, device: str) -> dict:
    """The kernel's side of one case (run_case.run_seeds, the loop the gate's own process runs
    in-process too) with a step that keeps each seed's raw outputs, on the CPU, for the gate to
    judge; the reply says how the case ended when it ended early."""
    import torch

    from gate.correctness.run_case import Ended, grad_names, kernel_outputs, run_seeds

    case = Case.from_dict(request["case"])
    start = time.perf_counter()
    reason = adapter.unsupported_reason(case, device)  # a kernel family answers per entry point
    if reason:
        return {"status": "SKIP", "reason": reason}

    def step(inputs) -> dict:
        # dq, dk, dv (w.r.t. the layout views the kernel got), dbias w.r.t. the bias leaf rebuilt
        # here from the case (bias_grad cases) and dsink; none for a forward-only run
        raw = kernel_outputs(adapter, case, inputs)
        return raw.to_payload(grad_names(adapter, case, inputs), _on_cpu)

    ran = run_seeds(adapter, case, device, step, checks_for(case, tuple(request.get("checks", ()))))
    if isinstance(ran, Ended):
        return ended_reply(ran, device, bool(request.get("keep_after_raise")))
    seeds, checks = ran
    torch.save({"seeds": seeds}, request["file"])
    return {"status": "RAN", "checks": [c.to_dict() for c in checks], "seconds": time.perf_counter() - start}


def triage(adapter, request: dict, device: str) -> dict:
    """The reason the adapter gives for each case it does not support (run_one's first question),
    for many cases at once: nothing is generated or run."""
    skips = {}
    for data in request["cases"]:
        case = Case.from_dict(data)
        reason = adapter.unsupported_reason(case, device)
        if reason:
            skips[case.id] = reason
    return {"status": "TRIAGED", "skips": skips}


def run_perf_case(adapter, request: dict, device: str) -> dict:
    """Time one case against the anchor (gate/speed/runs.py measure_case) and send the raw timing."""

    result = measure_case(
        adapter, request["anchor"], Case.from_dict(request["case"]), device, TimingPlan.from_dict(request["plan"])
    )
    return {"status": "PERF", "result": result.to_dict(), "restart": result.status == "ERROR" and device == "cuda"}


def main() -> int:
    try:
        return _serve()
    finally:
        kill_tree(os.getpid())  # what the kernel started (orphans too: this process is their subreaper)


def _serve() -> int:
    die_with_parent()
    enable_subreaper()
    faulthandler.enable()  # a segfault or abort prints the Python stack to stderr: the ERROR row's tail shows it
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # the kernel's prints go to stderr, never into the replies
    sys.stdout = sys.stderr
    # taken before any kernel code runs: a kernel that replaces them in this module or in json
    # changes nothing this loop calls (the fingerprint then makes its case an ERROR)
    stdin, dumps, loads, getcwd = sys.stdin, json.dumps, json.loads, os.getcwd
    send, fingerprint, changes, own = _send, state_fingerprint, state_change, own_change
    one_case, perf_case, triage_cases = run_one, run_perf_case, triage
    cwd = getcwd()
    hello = loads(stdin.readline() or "{}")
    device = hello.get("device", "cpu")
    hello_id = hello.get("id")
    try:
        from gate.kernels.registry import get_adapter

        if hello.get("family"):  # a kernel family of the gate's config, its entry points imported here
            from gate.kernels.user import family_adapter_of

            adapter = family_adapter_of(KernelFamily(**hello["family"]))
        else:
            adapter = get_adapter(hello["kernel"])
        caps = adapter.capabilities()
        send(
            channel,
            {
                "op": "hello",
                "id": hello_id,
                "version": adapter.version(),
                "devices": list(caps.devices),
                "unavailable": adapter.unavailable_reason(),
                "notes": list(caps.notes),
                "returns_lse": caps.returns_lse,
                "sink_grad": caps.sink_grad,
                "backward": caps.backward,
            },
            dumps,
        )
    except UserError as exc:
        send(channel, {"op": "hello", "id": hello_id, "user_error": str(exc)}, dumps)
        return 0
    # the gate's modules a case runs, imported now: the fingerprint then covers them from the first case
    import gate.attention.inputs  # noqa: F401
    import gate.correctness.run_case  # noqa: F401

    for line in stdin:
        request = loads(line)
        before = fingerprint()
        op = request.get("op")
        reply = (
            perf_case(adapter, request, device)
            if op == "perf_case"
            else triage_cases(adapter, request, device)
            if op == "triage"
            else one_case(adapter, request, device)
        )
        if getcwd() != cwd:  # a kernel that moves the process is wrong, whatever it returned
            reply = {
                "status": "ERROR",
                "reason": f"the kernel changed the working directory to {getcwd()}",
                "restart": True,
            }
        after = fingerprint()
        replaced = own(before, after)
        changed = changes(before, after)
        if replaced:  # the reply came from code the kernel rewrote: not an answer to judge
            reply = {
                "status": "ERROR",
                "reason": f"the kernel replaced the gate's own code in its worker ({replaced})",
                "restart": True,
            }
        elif changed:  # this case's own reply stands (it is judged in the gate); no later case runs here
            reply = {**reply, "restart": True}
        if changed:
            print(f"attn-gate worker: the kernel changed this process's state ({changed}); restarting", file=sys.stderr)
        send(channel, {**reply, "id": request.get("id")}, dumps)
        if reply.get("restart"):
            return 0
        if op not in ("perf_case", "triage"):  # a timed case keeps its allocations warm; a triage made none
            from gate.core.environment import release_cached_gpu_memory

            try:
                release_cached_gpu_memory(device)
            except Exception:  # a CUDA fault the case left pending: this process's CUDA state is gone, start afresh
                return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
