"""Run one case through a kernel and both references; measure every tensor against the rule.

Same inputs and dO on every path; every seed of the case; per tensor the worst seed is kept.
A kernel that raises is an ERROR row, one that returns a wrong shape/dtype or NaN/Inf a FAIL
row: the sweep goes on either way.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from gate.core.cases import Case
from gate.core.config import ToleranceConfig
from gate.attention.inputs import TORCH_DTYPES, AttnInputs, KernelTensors, kernel_tensors, make_inputs
from gate.kernels.base import KernelAdapter, KernelCall, KernelOutput
from gate.kernels.sdpa import NoKernel
from gate.attention.kvcache import expected_cache, gather_dense
from gate.attention.reference import AttnOptions, AttnResult, DecodeResult, attention_reference, decode_reference
from gate.core.results import ALL_TENSORS, CaseResult, Status, TensorError
from gate.correctness.tolerance import BANDS, LSE_APPROX_FLOOR, error_bound, error_ratio, rounding_floor


class BadOutput(Exception):
    """The kernel returned something that is not a valid answer (shape, dtype, NaN/Inf)."""


# issue #9: the LSE is a float32 tensor in every kernel, computed from scores of the rounded
# inputs accumulated in float32. Its yardstick P is therefore the reference computed in float32
# (not in the input dtype, whose bf16 scores made the bound ~0.06 nats and let a 1e-3 bias pass),
# its rounding floor is float32's, and its mult is the fp32 one (ToleranceConfig.fp32_factor).
LSE_YARDSTICK_DTYPE = "fp32"


def measure(name: str, kernel: torch.Tensor, gold: torch.Tensor, low: torch.Tensor, dtype: str, mult: float, seed: int,
            floor_dtype: str | None = None, floor_extra: float = 0.0) -> TensorError:
    """One tensor's errors. For the LSE only rows with at least one allowed key are compared
    (a fully masked row's LSE is a convention: -inf here, +inf in flash-attn). `floor_dtype`:
    the dtype whose rounding makes the floor (default: the input dtype); `floor_extra` is added
    to the floor (the LSE's allowance for approximate exp/log, tolerance.LSE_APPROX_FLOOR)."""
    k, g, p = kernel.double(), gold.double(), low.double()
    if name == "lse":
        keep = torch.isfinite(g)
        k, g, p = k[keep], g[keep], p[keep]
    if g.numel() == 0:
        empty_floor = rounding_floor(0.0, floor_dtype or dtype) + floor_extra
        return TensorError(name, 0.0, 0.0, 0.0, empty_floor, mult, empty_floor, 0.0, (), *BANDS[dtype], True, seed)
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
    floor_dtype = floor_dtype or dtype
    gd = g.to(TORCH_DTYPES[floor_dtype])
    floor = rounding_floor(2.0 * float(((gd + 0.3) - 0.3 - gd).abs().max()), floor_dtype) + floor_extra
    bound = error_bound(pt_err, floor, mult)
    atol, rtol = BANDS[dtype]
    band_ok = bool((diff <= atol + rtol * g.abs()).all())
    return TensorError(name, max_err, mean_err, pt_err, floor, mult, bound, error_ratio(max_err, bound), worst, atol, rtol, band_ok, seed)


def leaf_call(case: Case, inputs: AttnInputs, deterministic: bool = False, tensors: KernelTensors | None = None) -> KernelCall:
    """The call the kernel gets: q, k, v in the case's layout (issue #9: views, never contiguous
    copies, unless the layout is the default), tracking gradients; a custom bias (issue #16) is its
    own leaf, with grad when the case asks; so are the sink logits (issue #10). A decode case
    (issue #10) gets its cache instead (decode_call)."""
    if inputs.cache is not None:
        return decode_call(case, inputs)
    t = tensors if tensors is not None else kernel_tensors(case, inputs)
    opts = options(case, inputs)
    if inputs.bias is not None:
        opts = dataclasses.replace(opts, bias=inputs.bias.detach().clone().requires_grad_(case.bias_grad))
    sink = None if inputs.sink is None else inputs.sink.detach().clone().requires_grad_(True)
    return KernelCall(
        q=t.q, k=t.k, v=t.v, opts=opts, cu_seqlens=inputs.cu_seqlens,
        max_seqlen=max(case.varlen) if case.varlen else 0, seqlens=case.varlen, deterministic=deterministic, seed=inputs.seed,
        cu_seqlens_k=inputs.cu_seqlens_k, max_seqlen_k=max(case.varlen_k) if case.varlen_k else 0, seqlens_k=case.varlen_k,
        sink=sink,
    )


def decode_call(case: Case, inputs: AttnInputs) -> KernelCall:
    """A decode call on clones of the cache: the kernel may write into them, the inputs stay as drawn."""
    cache = inputs.cache
    mine = dataclasses.replace(cache, k_cache=cache.k_cache.clone(), v_cache=cache.v_cache.clone())
    return KernelCall(q=cache.q.detach().clone(), k=mine.k_cache, v=mine.v_cache, opts=options(case, inputs),
                      seed=inputs.seed, cache=mine, sink=None if inputs.sink is None else inputs.sink.detach().clone())


def options(case: Case, inputs: AttnInputs) -> AttnOptions:
    return AttnOptions(softmax_scale=inputs.softmax_scale, causal=case.causal, window=case.window,
                       softcap=case.softcap, alibi_slopes=inputs.alibi_slopes, dropout_p=case.dropout_p,
                       bias=inputs.bias)


def is_forward_only(adapter: KernelAdapter, case: Case) -> bool:
    """Decode cases, and every case of a kernel declared forward-only (backward = false)."""
    return case.forward_only or not adapter.capabilities().backward


def grad_names(adapter: KernelAdapter, case: Case, inputs: AttnInputs) -> tuple[str, ...]:
    """The gradients run_kernel returns, in order: dq, dk, dv, then dbias when the case's bias
    requires grad (issue #16), then dsink when the case has sinks and the adapter declares their
    gradient (issue #10)."""
    return (("dq", "dk", "dv") + (("dbias",) if case.bias_grad else ())
            + (("dsink",) if inputs.sink is not None and adapter.capabilities().sink_grad else ()))


def run_kernel(adapter: KernelAdapter, case: Case, inputs: AttnInputs, deterministic: bool = False):
    """Forward + backward once: (KernelOutput, grads), outputs validated; grads are (dq, dk, dv),
    then dbias with bias_grad (issue #16), then dsink with sinks where the adapter declares a sink
    gradient (issue #10): `grad_names` says which. Forward-only (see is_forward_only): (KernelOutput, None)."""
    tensors = None if inputs.cache is not None else kernel_tensors(case, inputs)
    call = leaf_call(case, inputs, deterministic, tensors)
    result = adapter(call)
    if not isinstance(result, KernelOutput):
        raise BadOutput(f"adapter returned {type(result).__name__}, not KernelOutput")
    if call.cache is not None and result.cache is None:
        result = dataclasses.replace(result, cache=(call.cache.k_cache, call.cache.v_cache))
    expected = tuple(inputs.dout.shape)
    if tuple(result.out.shape) != expected:
        raise BadOutput(f"out has shape {tuple(result.out.shape)}, expected {expected}")
    if result.out.dtype != inputs.q.dtype:
        raise BadOutput(f"out has dtype {result.out.dtype}, expected {inputs.q.dtype}")
    if not torch.isfinite(result.out).all():
        raise BadOutput("out contains NaN/Inf")
    if is_forward_only(adapter, case):
        return result, None
    if not result.out.requires_grad:
        raise BadOutput("out has no autograd graph back to q, k, v (detached, or computed under no_grad)")
    # allow_unused: an output that ignores k is a wrong answer (FAIL "dk is missing"), not a crash.
    leaves, refs = (call.q, call.k, call.v), (inputs.q, inputs.k, inputs.v)
    if case.bias_grad:  # issue #16: dBias must flow back to the bias the kernel was given
        leaves, refs = leaves + (call.opts.bias,), refs + (call.opts.bias,)
    if call.sink is not None and adapter.capabilities().sink_grad:  # issue #10
        leaves, refs = leaves + (call.sink,), refs + (call.sink,)
    names = grad_names(adapter, case, inputs)
    grads = torch.autograd.grad(result.out, leaves, tensors.dout, allow_unused=True)
    for name, grad, ref in zip(names, grads, refs):
        if grad is None:
            if name == "dbias":
                raise BadOutput("dbias is missing: the bias got no gradient (detached, or not part of the graph)")
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
    varlen = dict(cu_seqlens=inputs.cu_seqlens, cu_seqlens_k=inputs.cu_seqlens_k, dropout_keep=keep, sink=inputs.sink)
    gold = attention_reference(*args, torch.float64, **varlen)
    low = attention_reference(*args, TORCH_DTYPES[case.dtype], **varlen)
    return gold, low


def decode_references(case: Case, inputs: AttnInputs) -> tuple[DecodeResult, DecodeResult, tuple[torch.Tensor, torch.Tensor]]:
    """(golden, low-precision, expected (k_cache, v_cache) after the call) for a decode case: the
    references read dense K/V gathered from the expected cache, never the kernel's."""
    k_after, v_after = expected_cache(inputs.cache)
    dense = gather_dense(inputs.cache, k_after, v_after)
    opts = options(case, inputs)
    gold = decode_reference(inputs.cache.q, dense, opts, torch.float64, inputs.sink)
    low = decode_reference(inputs.cache.q, dense, opts, TORCH_DTYPES[case.dtype], inputs.sink)
    return gold, low, (k_after, v_after)


def measure_exact(name: str, kernel: torch.Tensor, expected: torch.Tensor, dtype: str, seed: int) -> TensorError:
    """A copy (the cache after an append) must be exact: bound = the smallest rounding floor, so
    any slot written wrongly, or not at all, is a ratio far above 1."""
    diff = (kernel.double() - expected.double()).abs()
    if tuple(kernel.shape) != tuple(expected.shape):
        raise BadOutput(f"{name} has shape {tuple(kernel.shape)}, expected {tuple(expected.shape)}")
    max_err = float(diff.max()) if diff.numel() else 0.0
    flat = int(diff.flatten().argmax()) if diff.numel() else 0
    worst = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape)) if diff.numel() else ()
    bound = rounding_floor(0.0, dtype)
    atol, rtol = BANDS[dtype]
    return TensorError(name, max_err, float(diff.mean()) if diff.numel() else 0.0, 0.0, bound, 1.0, bound,
                       error_ratio(max_err, bound), worst, atol, rtol, max_err == 0.0, seed)


# issue #9: from this many keys on, a CUDA run notes the float64 reference's peak memory in the row
# (the nightly 65,537 / 131,072-key cases: the reference runs in query chunks to fit).
NOTE_REFERENCE_PEAK_FROM_KEYS = 65536


def _references_noting_peak(case: Case, inputs: AttnInputs, keep, device: str, notes: list[str]):
    if case.seqlen_k < NOTE_REFERENCE_PEAK_FROM_KEYS or not str(device).startswith("cuda"):
        return references(case, inputs, keep)
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    gold, low = references(case, inputs, keep)
    peak = torch.cuda.max_memory_allocated() - before
    notes.append(f"references (float64 and {case.dtype}) peak {peak / 2**30:.2f} GiB on the GPU, query-chunked")
    return gold, low


def lse_yardstick(case: Case, inputs: AttnInputs, keep, low: AttnResult | DecodeResult) -> torch.Tensor:
    """The LSE as a kernel computes it (issue #9): the reference in float32 on the rounded inputs
    (a decode case's, issue #10: on the K/V gathered from the expected cache, as decode_references)."""
    if TORCH_DTYPES[case.dtype] == TORCH_DTYPES[LSE_YARDSTICK_DTYPE]:
        return low.lse
    if inputs.cache is not None:
        dense = gather_dense(inputs.cache, *expected_cache(inputs.cache))
        return decode_reference(inputs.cache.q, dense, options(case, inputs), TORCH_DTYPES[LSE_YARDSTICK_DTYPE], inputs.sink).lse
    varlen = dict(cu_seqlens=inputs.cu_seqlens, cu_seqlens_k=inputs.cu_seqlens_k, dropout_keep=keep, sink=inputs.sink)
    return attention_reference(inputs.q, inputs.k, inputs.v, inputs.dout, options(case, inputs),
                               TORCH_DTYPES[LSE_YARDSTICK_DTYPE], **varlen).lse


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
    reason = adapter.unsupported_reason(case, device)
    if reason:
        return CaseResult(case=case, status=Status.SKIP, reason=reason)
    worst: dict[str, TensorError] = {}
    notes = []
    forward_only = is_forward_only(adapter, case)
    if forward_only:  # said on the row, so a reader never takes a forward-only pass for a full one
        notes.append("forward-only: judged on out, lse" + (" and the cache after the call" if case.forward_only else "")
                     + "; no gradients")
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
            if case.entry == "kvcache":
                gold, low, (k_after, v_after) = decode_references(case, inputs)
                call_cache = kout.cache  # run_kernel filled it from the call when the adapter wrote in place
                if call_cache is None:
                    raise BadOutput("the adapter returned no cache for a decode call")
                worst_exact = {"k_cache": measure_exact("k_cache", call_cache[0].detach(), k_after, case.dtype, seed),
                               "v_cache": measure_exact("v_cache", call_cache[1].detach(), v_after, case.dtype, seed)}
                for name, err in worst_exact.items():
                    if name not in worst or not err.ratio <= worst[name].ratio:
                        worst[name] = err
            else:
                gold, low = _references_noting_peak(case, inputs, kout.dropout_keep, device, notes)
            measured = {"out": kout.out}
            if grads is not None:  # dq, dk, dv, then dbias (issue #16) and dsink (issue #10) as grad_names says
                measured.update(zip(grad_names(adapter, case, inputs), grads))
            if kout.lse is not None:
                if tuple(kout.lse.shape) != tuple(gold.lse.shape):
                    return CaseResult(case=case, status=Status.FAIL, seconds=time.perf_counter() - start,
                                      reason=f"seed {seed}: lse has shape {tuple(kout.lse.shape)}, expected {tuple(gold.lse.shape)}")
                measured["lse"] = kout.lse
            elif adapter.capabilities().returns_lse:
                notes.append("lse not exposed for this case")
            elif forward_only:
                notes.append("lse not returned: judged on out alone")
            if case.sinks and not forward_only and not adapter.capabilities().sink_grad:
                notes.append("dsink not judged: the adapter declares no sink gradient")
            for name, tensor in measured.items():
                if name == "lse":
                    err = measure(name, tensor.detach(), gold.lse, lse_yardstick(case, inputs, kout.dropout_keep, low), case.dtype,
                                  tol.mult(name, LSE_YARDSTICK_DTYPE), seed, floor_dtype=LSE_YARDSTICK_DTYPE,
                                  floor_extra=LSE_APPROX_FLOOR)
                else:
                    err = measure(name, tensor.detach(), getattr(gold, name), getattr(low, name), case.dtype,
                                  tol.mult(name, case.dtype), seed)
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
    tensors = tuple(worst[n] for n in ALL_TENSORS if n in worst)
    bad = [t for t in tensors if not t.passed]
    failed_checks = [c for c in checks if c.passed is False]
    if bad or failed_checks:
        why = [f"{t.tensor} error {t.max_err:.3g} > bound {t.bound:.3g} (ratio {t.ratio:.2f}, seed {t.seed})" for t in bad]
        why += [f"{c.name}: {c.detail}" for c in failed_checks]
        return CaseResult(case=case, status=Status.FAIL, reason="; ".join(why), tensors=tensors, checks=checks,
                          seconds=time.perf_counter() - start, forward_only=forward_only)
    return CaseResult(case=case, status=Status.PASS, reason="; ".join(dict.fromkeys(notes)), tensors=tensors, checks=checks,
                      seconds=time.perf_counter() - start, forward_only=forward_only)

