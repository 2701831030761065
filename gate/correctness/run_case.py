"""Run one case through a kernel and both references; measure every tensor against the rule.

Same inputs and dO on every path; every seed of the case; per tensor the worst seed is kept.
A kernel that raises is an ERROR row, one that returns a wrong shape/dtype or NaN/Inf a FAIL
row: the sweep goes on either way.
"""

from __future__ import annotations

import time

import torch

from gate.core.cases import Case
from gate.core.config import ToleranceConfig
from gate.attention.inputs import TORCH_DTYPES, AttnInputs, make_inputs
from gate.kernels.base import KernelAdapter, KernelCall, KernelOutput
from gate.kernels.sdpa import NoKernel
from gate.attention.reference import AttnOptions, AttnResult, attention_reference
from gate.core.results import CaseResult, Status, TensorError
from gate.correctness.tolerance import BANDS, error_bound, error_ratio, rounding_floor


class BadOutput(Exception):
    """The kernel returned something that is not a valid answer (shape, dtype, NaN/Inf)."""


def measure(name: str, kernel: torch.Tensor, gold: torch.Tensor, low: torch.Tensor, dtype: str, mult: float, seed: int) -> TensorError:
    """One tensor's errors. For the LSE only rows with at least one allowed key are compared
    (a fully masked row's LSE is a convention: -inf here, +inf in flash-attn)."""
    k, g, p = kernel.double(), gold.double(), low.double()
    if name == "lse":
        keep = torch.isfinite(g)
        k, g, p = k[keep], g[keep], p[keep]
    if g.numel() == 0:
        return TensorError(name, 0.0, 0.0, 0.0, rounding_floor(0.0, dtype), mult, rounding_floor(0.0, dtype), 0.0, (), *BANDS[dtype], True, seed)
    diff = (k - g).abs()
    nan = torch.isnan(diff)
    if nan.any():
        flat = int(nan.flatten().nonzero()[0])
        max_err = float("nan")
    else:
        flat = int(diff.flatten().argmax())
        max_err = float(diff.flatten()[flat])
    worst = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape)) if name != "lse" else (flat,)
    mean_err = float(diff.mean())
    pt_err = float((p - g).abs().max())
    gd = g.to(TORCH_DTYPES[dtype])
    floor = rounding_floor(2.0 * float(((gd + 0.3) - 0.3 - gd).abs().max()), dtype)
    bound = error_bound(pt_err, floor, mult)
    atol, rtol = BANDS[dtype]
    band_ok = bool((diff <= atol + rtol * g.abs()).all())
    return TensorError(name, max_err, mean_err, pt_err, floor, mult, bound, error_ratio(max_err, bound), worst, atol, rtol, band_ok, seed)


def leaf_call(case: Case, inputs: AttnInputs, deterministic: bool = False) -> KernelCall:
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (inputs.q, inputs.k, inputs.v))
    return KernelCall(
        q=q, k=k, v=v, opts=options(case, inputs), cu_seqlens=inputs.cu_seqlens,
        max_seqlen=max(case.varlen) if case.varlen else 0, seqlens=case.varlen, deterministic=deterministic, seed=inputs.seed,
    )


def options(case: Case, inputs: AttnInputs) -> AttnOptions:
    return AttnOptions(softmax_scale=inputs.softmax_scale, causal=case.causal, window=case.window,
                       softcap=case.softcap, alibi_slopes=inputs.alibi_slopes, dropout_p=case.dropout_p)


def run_kernel(adapter: KernelAdapter, case: Case, inputs: AttnInputs, deterministic: bool = False):
    """Forward + backward once: (KernelOutput, (dq, dk, dv)), outputs validated."""
    result, grads = kernel_pass(adapter, case, inputs, deterministic)
    validate_outputs(inputs, result.out, grads)
    return result, grads


def kernel_pass(adapter: KernelAdapter, case: Case, inputs: AttnInputs, deterministic: bool = False):
    """Forward + backward once, as the kernel returns them: (KernelOutput, (dq, dk, dv)); a grad is
    None where out does not depend on that input. Only what autograd needs is checked here; the
    values are judged by `validate_outputs` and `measure` (in the gate's own process when the
    kernel runs in a worker, gate/workflow/isolation.py)."""
    call = leaf_call(case, inputs, deterministic)
    result = adapter(call)
    if not isinstance(result, KernelOutput):
        raise BadOutput(f"adapter returned {type(result).__name__}, not KernelOutput")
    if not isinstance(result.out, torch.Tensor):
        raise BadOutput(f"out is a {type(result.out).__name__}, not a tensor")
    if tuple(result.out.shape) != tuple(inputs.dout.shape):
        raise BadOutput(f"out has shape {tuple(result.out.shape)}, expected {tuple(inputs.dout.shape)}")
    if not result.out.requires_grad:
        raise BadOutput("out has no autograd graph back to q, k, v (detached, or computed under no_grad)")
    # allow_unused: an output that ignores k is a wrong answer (FAIL "dk is missing"), not a crash.
    grads = torch.autograd.grad(result.out, (call.q, call.k, call.v), inputs.dout.to(result.out.dtype), allow_unused=True)
    return result, grads


def validate_outputs(inputs: AttnInputs, out: torch.Tensor, grads) -> None:
    """A wrong shape or dtype, NaN/Inf or a missing grad is a BadOutput (a FAIL row)."""
    expected = tuple(inputs.dout.shape)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
        raise BadOutput(f"out has shape {tuple(getattr(out, 'shape', ()))}, expected {expected}")
    if out.dtype != inputs.q.dtype:
        raise BadOutput(f"out has dtype {out.dtype}, expected {inputs.q.dtype}")
    if not torch.isfinite(out).all():
        raise BadOutput("out contains NaN/Inf")
    for name, grad, ref in zip(("dq", "dk", "dv"), grads, (inputs.q, inputs.k, inputs.v)):
        if grad is None:
            raise BadOutput(f"{name} is missing: out does not depend on {name[1:]}")
        if not isinstance(grad, torch.Tensor) or tuple(grad.shape) != tuple(ref.shape):
            raise BadOutput(f"{name} has shape {tuple(getattr(grad, 'shape', ()))}, expected {tuple(ref.shape)}")
        if not torch.isfinite(grad).all():
            raise BadOutput(f"{name} contains NaN/Inf")


def references(case: Case, inputs: AttnInputs, keep) -> tuple[AttnResult, AttnResult]:
    """(golden float64, low-precision in the input dtype) on the same rounded inputs."""
    opts = options(case, inputs)
    args = (inputs.q, inputs.k, inputs.v, inputs.dout, opts)
    gold = attention_reference(*args, torch.float64, cu_seqlens=inputs.cu_seqlens, dropout_keep=keep)
    low = attention_reference(*args, TORCH_DTYPES[case.dtype], cu_seqlens=inputs.cu_seqlens, dropout_keep=keep)
    return gold, low


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def measure_seed(case: Case, inputs: AttnInputs, out, lse, grads, dropout_keep, tol: ToleranceConfig,
                 worst: dict[str, TensorError], notes: list[str], returns_lse: bool) -> str | None:
    """Judge one seed's raw kernel outputs against both references (computed here, from `inputs`):
    update `worst` per tensor and return a FAIL reason, or None. Raises BadOutput on an invalid answer."""
    validate_outputs(inputs, out, grads)
    if case.dropout_p and dropout_keep is None:
        raise BadOutput("the kernel ran with dropout but exposed no dropout mask")
    gold, low = references(case, inputs, dropout_keep)
    measured = {"out": out, "dq": grads[0], "dk": grads[1], "dv": grads[2]}
    if lse is not None:
        if tuple(lse.shape) != tuple(gold.lse.shape):
            return f"seed {inputs.seed}: lse has shape {tuple(lse.shape)}, expected {tuple(gold.lse.shape)}"
        measured["lse"] = lse
    elif returns_lse:
        notes.append("lse not exposed for this case")
    for name, tensor in measured.items():
        err = measure(name, tensor.detach(), getattr(gold, name), getattr(low, name), case.dtype, tol.mult(name, case.dtype), inputs.seed)
        if name not in worst or not err.ratio <= worst[name].ratio:
            worst[name] = err
    return None


def verdict_row(case: Case, worst: dict[str, TensorError], checks, notes, seconds: float) -> CaseResult:
    """PASS or FAIL from the measured tensors and the checks' results."""
    tensors = tuple(worst[n] for n in ("out", "lse", "dq", "dk", "dv") if n in worst)
    bad = [t for t in tensors if not t.passed]
    failed_checks = [c for c in checks if c.passed is False]
    if bad or failed_checks:
        why = [f"{t.tensor} error {t.max_err:.3g} > bound {t.bound:.3g} (ratio {t.ratio:.2f}, seed {t.seed})" for t in bad]
        why += [f"{c.name}: {c.detail}" for c in failed_checks]
        return CaseResult(case=case, status=Status.FAIL, reason="; ".join(why), tensors=tensors, checks=checks, seconds=seconds)
    return CaseResult(case=case, status=Status.PASS, reason="; ".join(sorted(set(notes))), tensors=tensors, checks=checks,
                      seconds=seconds)


def run_case(adapter: KernelAdapter, case: Case, device: str, tol: ToleranceConfig, extra_checks=()) -> CaseResult:
    """Measure `case` on every seed, in this process. `extra_checks` are callables (adapter, case, device) ->
    tuple[CheckResult] run after the error measurement (determinism, dropout statistics...).

    The isolated path (gate/workflow/isolation.py) runs `kernel_pass` in a worker and the same
    `measure_seed` / `verdict_row` here."""
    start = time.perf_counter()
    reason = adapter.capabilities().unsupported_reason(case, device)
    if reason:
        return CaseResult(case=case, status=Status.SKIP, reason=reason)
    worst: dict[str, TensorError] = {}
    notes: list[str] = []
    try:
        adapter.prepare(case)
        for seed in case.seeds:
            inputs = make_inputs(case, seed, device)
            try:
                kout, grads = kernel_pass(adapter, case, inputs)
                fail = measure_seed(case, inputs, kout.out, kout.lse, grads, kout.dropout_keep, tol, worst, notes,
                                    adapter.capabilities().returns_lse)
            except NoKernel as exc:
                return CaseResult(case=case, status=Status.SKIP, reason=str(exc), seconds=time.perf_counter() - start)
            except BadOutput as exc:
                return CaseResult(case=case, status=Status.FAIL, reason=f"seed {seed}: {exc}", seconds=time.perf_counter() - start)
            if fail:
                return CaseResult(case=case, status=Status.FAIL, reason=fail, seconds=time.perf_counter() - start)
            del kout, grads, inputs
        checks = tuple(c for check in extra_checks for c in check(adapter, case, device))
    except BadOutput as exc:
        return CaseResult(case=case, status=Status.FAIL, reason=str(exc), seconds=time.perf_counter() - start)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a crashing kernel is a row, not a dead run (sys.exit in a kernel too)
        return CaseResult(case=case, status=Status.ERROR, reason=first_line(exc), seconds=time.perf_counter() - start,
                          checks=())
    return verdict_row(case, worst, checks, notes, time.perf_counter() - start)
