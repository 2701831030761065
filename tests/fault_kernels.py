"""User kernels that attack the process they run in: exit, abort, segfault, hang, move
the working directory, patch the gate's measurement, change process state for later cases,
leave a detached grandchild, delete the gate's temp folder, forge a reply line, patch the worker's
own loop, start a process that escapes the group kill. Each misbehaves on one sequence length
only, so one sweep shows the faulty case as an ERROR row and every other case measured."""

import ctypes
import os
import time

import torch
import torch.nn.functional as F

FAULTS = {17: "exit0", 18: "exit3", 19: "abort", 20: "segfault", 21: "hang", 22: "chdir"}


def _attention(q, k, v, softmax_scale=None, causal=False):
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, scale=softmax_scale
    )
    return out.transpose(1, 2)


def fault(mode: str) -> None:
    if mode == "exit0":
        os._exit(0)
    if mode == "exit3":
        os._exit(3)
    if mode == "abort":
        os.abort()
    if mode == "segfault":
        ctypes.string_at(0)
    if mode == "hang":
        time.sleep(3600)
    if mode == "chdir":
        os.chdir("/")


def faulty(q, k, v, softmax_scale=None, causal=False):
    """Correct attention, except on the sequence lengths in FAULTS."""
    mode = FAULTS.get(q.shape[1])
    if mode:
        fault(mode)
    return _attention(q, k, v, softmax_scale, causal)


def by_env(q, k, v, softmax_scale=None, causal=False):
    """Correct attention, except the fault ATTN_GATE_TEST_FAULT names on sequence length
    ATTN_GATE_TEST_FAULT_SEQLEN (default 17); ATTN_GATE_TEST_SLOW=S sleeps S seconds per call."""
    time.sleep(float(os.environ.get("ATTN_GATE_TEST_SLOW", "0")))
    if q.shape[1] == int(os.environ.get("ATTN_GATE_TEST_FAULT_SEQLEN", "17")):
        fault(os.environ.get("ATTN_GATE_TEST_FAULT", ""))
    return _attention(q, k, v, softmax_scale, causal)


def cheats(q, k, v, softmax_scale=None, causal=False):
    """A wrong answer (zeros), after patching every measurement function it can reach in its process
    to report a perfect result: in a worker, none of them is the one that judges."""
    import gate.correctness.measure as measure
    import gate.correctness.run_case as rc
    from gate.core.results import TensorError

    def perfect(name, parts, dtype, mult, seed, mean_mult):
        return TensorError(
            tensor=name,
            max_err=0.0,
            mean_err=0.0,
            pt_err=0.0,
            floor=1e-3,
            mult=mult,
            bound=1e-3,
            ratio=0.0,
            worst_index=(),
            band_atol=1e-2,
            band_rtol=1e-2,
            band_ok=True,
            seed=seed,
            pt_mean_err=0.0,
            mean_mult=mean_mult,
            mean_floor=1e-4,
            mean_bound=1e-4,
            mean_ratio=0.0,
        )

    measure.tensor_error = rc.tensor_error = perfect
    rc.validate_outputs = lambda *a, **k: None
    rc.judge_seed = lambda *a, **k: rc.SeedJudgement()  # a seed judged with nothing measured
    return q * 0 + (k.sum() + v.sum()) * 0


def _illegal_memory_access(t: torch.Tensor) -> None:
    """A store far outside any allocation on the GPU: an illegal memory access (a sticky error that
    poisons the CUDA context of the process). Triton when it imports; else an out-of-bounds index,
    whose device-side assert poisons the context the same way."""
    try:
        import triton
        import triton.language as tl

        @triton.jit
        def _oob(ptr, offset):
            tl.store(ptr + offset, 1.0)

        _oob[(1,)](t, 1 << 38)
    except ImportError:
        t[torch.tensor([1 << 30], device=t.device)] = 1.0
    torch.cuda.synchronize()


def cuda_fault(q, k, v, softmax_scale=None, causal=False):
    """Correct attention (SDPA), except an illegal memory access on sequence length
    ATTN_GATE_TEST_FAULT_SEQLEN (default 257): a GPU run picks its own."""
    if q.is_cuda and q.shape[1] == int(os.environ.get("ATTN_GATE_TEST_FAULT_SEQLEN", "257")):
        _illegal_memory_access(torch.zeros(16, device=q.device, dtype=torch.float32))
    return _attention(q, k, v, softmax_scale, causal)


def grad_off(q, k, v, softmax_scale=None, causal=False):
    """Correct attention; on sequence length 17 it then turns grad mode off for the whole process
    (its own output keeps its graph: this case passes, a later one would have no gradients)."""
    with torch.enable_grad():
        out = _attention(q, k, v, softmax_scale, causal)
    if q.shape[1] == 17:
        torch.set_grad_enabled(False)
    return out


def patches_save(q, k, v, softmax_scale=None, causal=False):
    """Correct attention; on sequence length 17 it replaces torch.save (the worker sends the outputs
    with it) by one that passes this case's outputs and writes zeros from its next call on."""
    if q.shape[1] == 17:
        real, calls = torch.save, []

        def zeros(obj, f, *a, **kw):
            calls.append(1)
            if len(calls) > 1:
                obj = torch.utils._pytree.tree_map(lambda t: t * 0 if isinstance(t, torch.Tensor) else t, obj)
            return real(obj, f, *a, **kw)

        torch.save = zeros
    return _attention(q, k, v, softmax_scale, causal)


def detached_grandchild(q, k, v, softmax_scale=None, causal=False):
    """On sequence length 17: forks a child that leaves the process group (setsid) and sleeps
    holding every inherited descriptor (the reply pipe too), then ends the worker. Its pid goes
    to ATTN_GATE_TEST_PIDFILE, so a test can tell whether it was killed."""
    if q.shape[1] == 17:
        pid = os.fork()
        if pid == 0:
            os.setsid()
            time.sleep(3600)
            os._exit(0)
        with open(os.environ["ATTN_GATE_TEST_PIDFILE"], "w") as fh:
            fh.write(str(pid))
        os._exit(0)
    return _attention(q, k, v, softmax_scale, causal)


def removes_tempdir(q, k, v, softmax_scale=None, causal=False):
    """Correct attention; on sequence length 17 it deletes the gate's temp folder (the worker's
    stderr file is in it, so /proc/self/fd/2 names it): the case's own outputs cannot be written."""
    import shutil

    if q.shape[1] == 17:
        shutil.rmtree(os.path.dirname(os.readlink("/proc/self/fd/2")), ignore_errors=True)
    return _attention(q, k, v, softmax_scale, causal)


def _forge_reply() -> None:
    """A reply line written to every pipe this process may write to: the worker's reply channel is
    one of them (a dup of the stdout it was started with)."""
    line = b'{"status": "RAN", "checks": [], "seconds": 0.0}\n'
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if fd > 2 and os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
                os.write(fd, line)
        except OSError:  # the read end of stdin's pipe, a descriptor closed meanwhile
            pass


def forges_reply(q, k, v, softmax_scale=None, causal=False):
    """Correct attention; on sequence length 17 it first writes a forged reply line to the worker's
    reply pipe, so the worker's real answer would be read as the next case's."""
    if q.shape[1] == 17:
        _forge_reply()
    return _attention(q, k, v, softmax_scale, causal)


def patches_worker_loop(q, k, v, softmax_scale=None, causal=False):
    """Correct attention; on sequence length 17 it replaces the worker's own case function (the
    module run as `python -m gate.workflow.worker_main` is `__main__`) by one that skips every case."""
    import sys

    if q.shape[1] == 17:
        sys.modules["__main__"].run_one = lambda *a, **kw: {"status": "SKIP", "reason": "skipped by the kernel"}
    return _attention(q, k, v, softmax_scale, causal)


def escapes_with_setsid(q, k, v, softmax_scale=None, causal=False):
    """Correct attention; on sequence length 17 it starts `setsid -f env -i sleep S` (S from
    ATTN_GATE_TEST_SLEEP, a unique duration a test finds in /proc/*/cmdline): a new session (the
    process-group kill misses it), an empty environment (the inherited token misses it) and a
    forked-off parent (it is orphaned at once)."""
    import subprocess

    if q.shape[1] == 17:
        seconds = os.environ.get("ATTN_GATE_TEST_SLEEP", "307.713")
        subprocess.run(
            ["setsid", "-f", "env", "-i", "sleep", seconds],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
        )
    return _attention(q, k, v, softmax_scale, causal)


def _matmul_attention(q, k, v, softmax_scale=None, causal=False):
    """Plain attention through Tensor's Python operators (@, /): what a dunder patch reaches."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    scores = (q @ k.transpose(-2, -1)) / (q.shape[-1] ** 0.5 if softmax_scale is None else 1 / softmax_scale)
    if causal:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).triu(
            scores.shape[-1] - scores.shape[-2] + 1
        )
        scores = scores.masked_fill(mask, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v).transpose(1, 2)


def patches_tensor_dunders(q, k, v, softmax_scale=None, causal=False):
    """Correct attention; on sequence length 17 it then makes torch.Tensor's @ and / 1% wrong for
    the rest of the process (a later case computed with them would fail)."""
    out = _matmul_attention(q, k, v, softmax_scale, causal)
    if q.shape[1] == 17:
        matmul, truediv = torch.Tensor.__matmul__, torch.Tensor.__truediv__
        torch.Tensor.__matmul__ = lambda a, b: matmul(a, b) * 1.01
        torch.Tensor.__truediv__ = lambda a, b: truediv(a, b) * 1.01
    return out


def patches_autograd_engine(q, k, v, softmax_scale=None, causal=False):
    """Correct attention; on sequence length 17 it then wraps the autograd engine so that every
    later gradient of the process comes back 1% too large."""
    out = _attention(q, k, v, softmax_scale, causal)
    if q.shape[1] == 17:
        from torch.autograd.variable import Variable

        engine = Variable._execution_engine

        class Skewed:
            def run_backward(self, *args, **kwargs):
                grads = engine.run_backward(*args, **kwargs)
                return tuple(g * 1.01 if isinstance(g, torch.Tensor) else g for g in grads)

            def __getattr__(self, name):
                return getattr(engine, name)

        Variable._execution_engine = Skewed()
    return out


def rebinds_gate_constant(q, k, v, softmax_scale=None, causal=False):
    """Correct attention; on sequence length 17 it then rebinds a constant of the gate's code in its
    process: later fp32 cases draw their inputs in float16 there."""
    out = _attention(q, k, v, softmax_scale, causal)
    if q.shape[1] == 17:
        import gate.attention.inputs as inputs

        inputs.TORCH_DTYPES = {**inputs.TORCH_DTYPES, "fp32": torch.float16}
    return out


def describes_its_process(q, k, v, softmax_scale=None, causal=False):
    """Correct attention; writes what its process looks like to ATTN_GATE_TEST_FACTS (JSON): how a
    forked worker and a fresh interpreter's are compared."""
    import json
    import sys
    import warnings

    facts = {
        "environ": dict(os.environ),
        "cwd": os.getcwd(),
        "path0": sys.path[0],
        "argv0": os.path.basename(sys.argv[0]),
        "own_session": os.getsid(0) == os.getpid(),
        "stdin_fd": sys.stdin.fileno(),
        "warnings": [repr(f) for f in warnings.filters],
        "cuda_initialized": torch.cuda.is_initialized(),
        "grad_enabled": torch.is_grad_enabled(),
        "threads": torch.get_num_threads(),
    }
    with open(os.environ["ATTN_GATE_TEST_FACTS"], "w") as fh:
        json.dump(facts, fh)
    return _attention(q, k, v, softmax_scale, causal)
