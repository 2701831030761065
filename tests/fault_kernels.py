"""User kernels that attack the process they run in: exit, abort, segfault, hang, move
the working directory, patch the gate's measurement, change process state for later cases,
leave a detached grandchild, delete the gate's temp folder. Each misbehaves on one sequence length
only, so one sweep shows the faulty case as an ERROR row and every other case measured."""

import ctypes
import os
import time

import torch
import torch.nn.functional as F

FAULTS = {17: "exit0", 18: "exit3", 19: "abort", 20: "segfault", 21: "hang", 22: "chdir"}


def _attention(q, k, v, softmax_scale=None, causal=False):
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal,
                                         scale=softmax_scale)
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
    import gate.correctness.run_case as rc
    from gate.core.results import TensorError

    def perfect(name, kernel, gold, low, dtype, mult, seed):
        return TensorError(name, 0.0, 0.0, 0.0, 1e-3, mult, 1e-3, 0.0, (), 1e-2, 1e-2, True, seed)

    rc.measure = perfect
    rc.validate_outputs = lambda *a, **k: None
    rc.measure_seed = lambda *a, **k: None
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
