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
    call = leaf_call(case, inputs, deterministic)
    result = adapter(call)
    if not isinstance(result, KernelOutput):
        raise BadOutput(f"adapter returned {type(result).__name__}, not KernelOutput")
    expected = tuple(inputs.dout.shape)
    if tuple(result.out.shape) != expected:
        raise BadOutput(f"out has shape {tuple(result.out.shape)}, expected {expected}")
    if result.out.dtype != inputs.q.dtype:
        raise BadOutput(f"out has dtype {result.out.dtype}, expected {inputs.q.dtype}")
    if not torch.isfinite(result.out).all():
        raise BadOutput("out contains NaN/Inf")
    if not result.out.requires_grad:
        raise BadOutput("out has no autograd graph back to q, k, v (detached, or computed under no_grad)")
    # allow_unused: an output that ignores k is a wrong answer (FAIL "dk is missing"), not a crash.
    grads = torch.autograd.grad(result.out, (call.q, call.k, call.v), inputs.dout, allow_unused=True)
    for name, grad, ref in zip(("dq", "dk", "dv"), grads, (inputs.q, inputs.k, inputs.v)):
        if grad is None:
            raise BadOutput(f"{name} is missing: out does not depend on {name[1:]}")
        if tuple(grad.shape) != tuple(ref.shape):
            raise BadOutput(f"{name} has shape {None if grad is None else tuple(grad.shape)}, expected {tuple(ref.shape)}")
        if not torch.isfinite(grad).all():
            raise BadOutput(f"{name} contains NaN/Inf")
    return result, grads


def references(case: Case, inputs: AttnInputs, keep) -> tuple[AttnResult, AttnResult]:
    """(golden float64, low-precision in the input dtype) on the same rounded inputs."""
    opts = options(case, inputs)
    args = (inputs.q, inputs.k, inputs.v, inputs.dout, opts)
    gold = attention_reference(*args, torch.float64, cu_seqlens=inputs.cu_seqlens, dropout_keep=keep)
    low = attention_reference(*args, TORCH_DTYPES[case.dtype], cu_seqlens=inputs.cu_seqlens, dropout_keep=keep)
    return gold, low


def traceback_tail(exc: BaseException, lines: int = 12) -> str:
    """The last frames of a crash and the error itself: enough to see where the kernel raised,
    short enough that a report can quote it (#15)."""
    import traceback

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip().splitlines()
    if len(text) > lines + 1:
        text = [text[0], "  ...", *text[-lines:]]
    return "\n".join(text)[-2000:]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def run_case(adapter: KernelAdapter, case: Case, device: str, tol: ToleranceConfig, extra_checks=()) -> CaseResult:
    """Measure `case` on every seed. `extra_checks` are callables (adapter, case, device) ->
    tuple[CheckResult] run after the error measurement (determinism, dropout statistics...)."""
    start = time.perf_counter()
    reason = adapter.capabilities().unsupported_reason(case, device)
    if reason:
        return CaseResult(case=case, status=Status.SKIP, reason=reason)
    worst: dict[str, TensorError] = {}
    notes = []
    try:
        adapter.prepare(case)
        for seed in case.seeds:
            inputs = make_inputs(case, seed, device)
            try:
                kout, grads = run_kernel(adapter, case, inputs)
            except NoKernel as exc:
                return CaseResult(case=case, status=Status.SKIP, reason=str(exc), seconds=time.perf_counter() - start)
            except BadOutput as exc:
                return CaseResult(case=case, status=Status.FAIL, reason=f"seed {seed}: {exc}", seconds=time.perf_counter() - start)
            if case.dropout_p and kout.dropout_keep is None:
                raise BadOutput("the kernel ran with dropout but exposed no dropout mask")
            gold, low = references(case, inputs, kout.dropout_keep)
            measured = {"out": kout.out, "dq": grads[0], "dk": grads[1], "dv": grads[2]}
            if kout.lse is not None:
                if tuple(kout.lse.shape) != tuple(gold.lse.shape):
                    return CaseResult(case=case, status=Status.FAIL, seconds=time.perf_counter() - start,
                                      reason=f"seed {seed}: lse has shape {tuple(kout.lse.shape)}, expected {tuple(gold.lse.shape)}")
                measured["lse"] = kout.lse
            elif adapter.capabilities().returns_lse:
                notes.append("lse not exposed for this case")
            for name, tensor in measured.items():
                err = measure(name, tensor.detach(), getattr(gold, name), getattr(low, name), case.dtype, tol.mult(name, case.dtype), seed)
                if name not in worst or not err.ratio <= worst[name].ratio:
                    worst[name] = err
            del kout, grads, gold, low, inputs
        checks = tuple(c for check in extra_checks for c in check(adapter, case, device))
    except BadOutput as exc:
        return CaseResult(case=case, status=Status.FAIL, reason=str(exc), seconds=time.perf_counter() - start)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a crashing kernel is a row, not a dead run (sys.exit in a kernel too)
        return CaseResult(case=case, status=Status.ERROR, reason=_first_line(exc), seconds=time.perf_counter() - start,
                          checks=(), traceback=traceback_tail(exc))
    tensors = tuple(worst[n] for n in ("out", "lse", "dq", "dk", "dv") if n in worst)
    bad = [t for t in tensors if not t.passed]
    failed_checks = [c for c in checks if c.passed is False]
    if bad or failed_checks:
        why = [f"{t.tensor} error {t.max_err:.3g} > bound {t.bound:.3g} (ratio {t.ratio:.2f}, seed {t.seed})" for t in bad]
        why += [f"{c.name}: {c.detail}" for c in failed_checks]
        return CaseResult(case=case, status=Status.FAIL, reason="; ".join(why), tensors=tensors, checks=checks,
                          seconds=time.perf_counter() - start)
    return CaseResult(case=case, status=Status.PASS, reason="; ".join(sorted(set(notes))), tensors=tensors, checks=checks,
                      seconds=time.perf_counter() - start)

