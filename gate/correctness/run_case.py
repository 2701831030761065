"""Run one case through a kernel and both references; measure every tensor against the rule.

Same inputs and dO on every path; every seed of the case; per tensor the worst seed is kept.
A kernel that raises is an ERROR row, one that returns a wrong shape/dtype or NaN/Inf a FAIL
row: the sweep goes on either way.
"""

from __future__ import annotations

import dataclasses
import math
import time
import traceback
from dataclasses import dataclass

import torch

from gate.attention.inputs import FP8_TORCH_DTYPES, TORCH_DTYPES, AttnInputs, KernelTensors, kernel_tensors, make_inputs
from gate.attention.kvcache import expected_cache, gather_dense
from gate.attention.reference import AttnOptions, AttnResult, DecodeResult, attention_reference, decode_reference
from gate.core.cases import Case
from gate.core.config import ToleranceConfig
from gate.core.errors import first_line
from gate.core.results import ALL_TENSORS, CaseResult, Status, TensorError, error_ratio
from gate.correctness.tolerance import BANDS, error_bound, rounding_floor, tensor_spec
from gate.kernels.base import KernelAdapter, KernelCall, KernelOutput, NoKernel


class BadOutput(Exception):
    """The kernel returned something that is not a valid answer (shape, dtype, NaN/Inf)."""


def measure(
    name: str, kernel: torch.Tensor, gold: torch.Tensor, low: torch.Tensor, dtype: str, mult: float, seed: int
) -> TensorError:
    """One tensor's errors, compared as its spec says (tolerance.SPECS: which elements, the
    dtype of the floor and what is added to it, how the worst element is located)."""
    spec = tensor_spec(name)
    floor_dtype, floor_extra = spec.yardstick_dtype, spec.floor_extra
    k, g, p = kernel.double(), gold.double(), low.double()
    if spec.finite_only:
        keep = torch.isfinite(g)
        k, g, p = k[keep], g[keep], p[keep]
    if g.numel() == 0:
        empty_floor = rounding_floor(0.0, floor_dtype or dtype) + floor_extra
        atol, rtol = BANDS[dtype]
        return TensorError(
            tensor=name,
            max_err=0.0,
            mean_err=0.0,
            pt_err=0.0,
            floor=empty_floor,
            mult=mult,
            bound=empty_floor,
            ratio=0.0,
            worst_index=(),
            band_atol=atol,
            band_rtol=rtol,
            band_ok=True,
            seed=seed,
        )
    diff = (k - g).abs()
    nan = torch.isnan(diff)
    if nan.any():  # a NaN is infinitely wrong, and written so: files hold no NaN a reader must refuse
        flat = int(nan.flatten().nonzero()[0])
        max_err = mean_err = math.inf
    else:
        flat = int(diff.flatten().argmax())
        max_err = float(diff.flatten()[flat])
        mean_err = float(diff.mean())
    worst = (flat,) if spec.flat_index else tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape))
    # a yardstick that broke (NaN) judges nothing: an infinite bound, so the ratio is inf (error_ratio)
    pt_err = float(torch.nan_to_num((p - g).abs(), nan=math.inf).max())
    floor_dtype = floor_dtype or dtype
    gd = g.to(TORCH_DTYPES[floor_dtype])
    floor = rounding_floor(2.0 * float(((gd + 0.3) - 0.3 - gd).abs().max()), floor_dtype) + floor_extra
    bound = error_bound(pt_err, floor, mult)
    atol, rtol = BANDS[dtype]
    band_ok = bool((diff <= atol + rtol * g.abs()).all())
    return TensorError(
        tensor=name,
        max_err=max_err,
        mean_err=mean_err,
        pt_err=pt_err,
        floor=floor,
        mult=mult,
        bound=bound,
        ratio=error_ratio(max_err, bound),
        worst_index=worst,
        band_atol=atol,
        band_rtol=rtol,
        band_ok=band_ok,
        seed=seed,
    )


def leaf_call(
    case: Case, inputs: AttnInputs, deterministic: bool = False, tensors: KernelTensors | None = None
) -> KernelCall:
    """The call the kernel gets: q, k, v in the case's layout (views, never contiguous
    copies, unless the layout is the default), tracking gradients; a custom bias is its
    own leaf, with grad when the case asks; so are the sink logits. A decode case
    gets its cache instead (decode_call)."""
    if inputs.cache is not None:
        return decode_call(case, inputs)
    t = tensors if tensors is not None else kernel_tensors(case, inputs)
    opts = options(case, inputs)
    if inputs.bias is not None:
        opts = dataclasses.replace(opts, bias=inputs.bias.detach().clone().requires_grad_(case.bias.grad))
    sink = None if inputs.sink is None else inputs.sink.detach().clone().requires_grad_(True)
    return KernelCall(
        q=t.q,
        k=t.k,
        v=t.v,
        opts=opts,
        cu_seqlens=inputs.cu_seqlens,
        max_seqlen=max(case.entry.varlen) if case.entry.varlen else 0,
        seqlens=case.entry.varlen,
        deterministic=deterministic,
        seed=inputs.seed,
        cu_seqlens_k=inputs.cu_seqlens_k,
        max_seqlen_k=max(case.entry.varlen_k) if case.entry.varlen_k else 0,
        seqlens_k=case.entry.varlen_k,
        sink=sink,
        descale=None if inputs.fp8 is None else (inputs.fp8.q_descale, inputs.fp8.k_descale, inputs.fp8.v_descale),
    )


def decode_call(case: Case, inputs: AttnInputs) -> KernelCall:
    """A decode call on clones of the cache: the kernel may write into them, the inputs stay as drawn."""
    cache = inputs.cache
    mine = dataclasses.replace(cache, k_cache=cache.k_cache.clone(), v_cache=cache.v_cache.clone())
    return KernelCall(
        q=cache.q.detach().clone(),
        k=mine.k_cache,
        v=mine.v_cache,
        opts=options(case, inputs),
        seed=inputs.seed,
        cache=mine,
        sink=None if inputs.sink is None else inputs.sink.detach().clone(),
    )


def options(case: Case, inputs: AttnInputs) -> AttnOptions:
    return AttnOptions(
        softmax_scale=inputs.softmax_scale,
        causal=case.causal,
        window=case.window,
        softcap=case.softcap,
        alibi_slopes=inputs.alibi_slopes,
        dropout_p=case.dropout_p,
        bias=inputs.bias,
    )


@dataclass(frozen=True)
class KernelTraits:
    """What judging a kernel's raw outputs needs to know about the kernel, from its adapter's
    capabilities: read here, or in the worker's first answer before any case ran (the
    deciding process never imports the kernel, and never takes per-case word from its process)."""

    returns_lse: bool = False
    sink_grad: bool = True  # with sinks, its backward returns dsink
    backward: bool = True  # False = a forward-only (inference) kernel

    @classmethod
    def of(cls, adapter: KernelAdapter) -> "KernelTraits":
        caps = adapter.capabilities()
        return cls(returns_lse=caps.returns_lse, sink_grad=caps.sink_grad, backward=caps.backward)


def _traits(kernel: "KernelAdapter | KernelTraits") -> KernelTraits:
    return kernel if isinstance(kernel, KernelTraits) else KernelTraits.of(kernel)


def is_forward_only(adapter: "KernelAdapter | KernelTraits", case: Case) -> bool:
    """Decode cases, and every case of a kernel declared forward-only (backward = false)."""
    return case.forward_only or not _traits(adapter).backward


def forward_only_note(case: Case) -> str:
    """Said on the row, so a reader never takes a forward-only pass for a full one."""
    return (
        "forward-only: judged on out, lse"
        + (" and the cache after the call" if case.entry.kind == "kvcache" else "")
        + "; no gradients"
    )


def grad_names(adapter: "KernelAdapter | KernelTraits", case: Case, inputs: AttnInputs) -> tuple[str, ...]:
    """The gradients run_kernel returns, in order: dq, dk, dv, then dbias when the case's bias
    requires grad, then dsink when the case has sinks and the adapter declares their
    gradient."""
    return (
        ("dq", "dk", "dv")
        + (("dbias",) if case.bias.grad else ())
        + (("dsink",) if inputs.sink is not None and _traits(adapter).sink_grad else ())
    )


def run_kernel(adapter: KernelAdapter, case: Case, inputs: AttnInputs, deterministic: bool = False):
    """Forward + backward once: (KernelOutput, grads), outputs validated; grads are (dq, dk, dv),
    then dbias with bias_grad, then dsink with sinks where the adapter declares a sink
    gradient: `grad_names` says which. Forward-only (see is_forward_only): (KernelOutput, None)."""
    result, grads = kernel_pass(adapter, case, inputs, deterministic)
    validate_outputs(case, inputs, result.out, grads, grad_names(adapter, case, inputs))
    return result, grads


def kernel_pass(adapter: KernelAdapter, case: Case, inputs: AttnInputs, deterministic: bool = False):
    """Forward + backward once, as the kernel returns them: (KernelOutput, grads in `grad_names`
    order, or None for a forward-only run); a grad is None where out does not depend on that input.
    The kernel gets the case's layout views, its own bias leaf, its own sink
    leaf and, for a decode case, clones of the cache (returned as KernelOutput.cache when
    written in place); the grads are taken w.r.t. those leaves with the layout's dO. Only what
    autograd needs is checked here, plus the cheap checks of out a FAIL row names first; the values
    are judged by `validate_outputs` and `measure_seed` (in the gate's own process when the kernel
    runs in a worker, gate/workflow/isolation.py)."""
    tensors = None if inputs.cache is not None else kernel_tensors(case, inputs)
    call = leaf_call(case, inputs, deterministic, tensors)
    result = adapter(call)
    if not isinstance(result, KernelOutput):
        raise BadOutput(f"adapter returned {type(result).__name__}, not KernelOutput")
    if call.cache is not None and result.cache is None:
        result = dataclasses.replace(result, cache=(call.cache.k_cache, call.cache.v_cache))
    if not isinstance(result.out, torch.Tensor):
        raise BadOutput(f"out is a {type(result.out).__name__}, not a tensor")
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
    leaves = (call.q, call.k, call.v)
    if case.bias.grad:  # dBias must flow back to the bias the kernel was given
        leaves = leaves + (call.opts.bias,)
    if call.sink is not None and adapter.capabilities().sink_grad:
        leaves = leaves + (call.sink,)
    grads = torch.autograd.grad(result.out, leaves, tensors.dout, allow_unused=True)
    return result, grads


def validate_outputs(case: Case, inputs: AttnInputs, out: torch.Tensor, grads, names: tuple[str, ...]) -> None:
    """A wrong shape or dtype, NaN/Inf or a missing grad (each of `names`: dbias with bias_grad,
    dsink with sinks) is a BadOutput (a FAIL row). `grads` None: a forward-only run."""
    expected = tuple(inputs.dout.shape)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
        raise BadOutput(f"out has shape {tuple(getattr(out, 'shape', ()))}, expected {expected}")
    if out.dtype != inputs.q.dtype:
        raise BadOutput(f"out has dtype {out.dtype}, expected {inputs.q.dtype}")
    if not torch.isfinite(out).all():
        raise BadOutput("out contains NaN/Inf")
    if grads is None:
        return
    if len(grads) != len(names):
        raise BadOutput(f"{len(grads)} gradients, expected {len(names)} ({', '.join(names)})")
    for name, grad in zip(names, grads):
        spec = tensor_spec(name)
        ref = getattr(inputs, spec.grad_of)
        if grad is None:
            raise BadOutput(f"{name} is missing: {spec.missing}")
        if not isinstance(grad, torch.Tensor) or tuple(grad.shape) != tuple(ref.shape):
            raise BadOutput(f"{name} has shape {tuple(getattr(grad, 'shape', ()))}, expected {tuple(ref.shape)}")
        if not torch.isfinite(grad).all():
            raise BadOutput(f"{name} contains NaN/Inf")


def references(case: Case, inputs: AttnInputs, keep) -> tuple[AttnResult, AttnResult]:
    """(golden float64, low-precision in the compute dtype) on the same rounded inputs (an fp8
    case's dequantized ones; its low-precision reference is bf16, what its kernel accumulates into,
    with Q K^T accumulated as an fp8 tensor core does)."""
    opts = options(case, inputs)
    args = (inputs.q, inputs.k, inputs.v, inputs.dout, opts)
    varlen = dict(cu_seqlens=inputs.cu_seqlens, cu_seqlens_k=inputs.cu_seqlens_k, dropout_keep=keep, sink=inputs.sink)
    gold = attention_reference(*args, torch.float64, **varlen)
    low = attention_reference(
        *args,
        TORCH_DTYPES[case.compute_dtype],
        p_round=FP8_TORCH_DTYPES.get(case.dtype),
        fp8_scores=case.is_fp8,
        **varlen,
    )
    return gold, low


def decode_references(
    case: Case, inputs: AttnInputs
) -> tuple[DecodeResult, DecodeResult, tuple[torch.Tensor, torch.Tensor]]:
    """(golden, low-precision, expected (k_cache, v_cache) after the call) for a decode case: the
    references read dense K/V gathered from the expected cache, never the kernel's."""
    k_after, v_after = expected_cache(inputs.cache)
    dense = gather_dense(inputs.cache, k_after, v_after)
    opts = options(case, inputs)
    gold = decode_reference(inputs.cache.q, dense, opts, torch.float64, inputs.sink)
    low = decode_reference(inputs.cache.q, dense, opts, TORCH_DTYPES[case.compute_dtype], inputs.sink)
    return gold, low, (k_after, v_after)


def measure_exact(name: str, kernel: torch.Tensor, expected: torch.Tensor, dtype: str, seed: int) -> TensorError:
    """A copy (the cache after an append) must be exact: bound = the smallest rounding floor, so
    any slot written wrongly, or not at all, is a ratio far above 1."""
    diff = (kernel.double() - expected.double()).abs()
    if tuple(kernel.shape) != tuple(expected.shape):
        raise BadOutput(f"{name} has shape {tuple(kernel.shape)}, expected {tuple(expected.shape)}")
    diff = torch.nan_to_num(diff, nan=math.inf, posinf=math.inf)  # a NaN slot is infinitely wrong (files hold no NaN)
    max_err = float(diff.max()) if diff.numel() else 0.0
    flat = int(diff.flatten().argmax()) if diff.numel() else 0
    worst = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape)) if diff.numel() else ()
    bound = rounding_floor(0.0, dtype)
    atol, rtol = BANDS[dtype]
    return TensorError(
        tensor=name,
        max_err=max_err,
        mean_err=float(diff.mean()) if diff.numel() else 0.0,
        pt_err=0.0,
        floor=bound,
        mult=1.0,
        bound=bound,
        ratio=error_ratio(max_err, bound),
        worst_index=worst,
        band_atol=atol,
        band_rtol=rtol,
        band_ok=max_err == 0.0,
        seed=seed,
    )


# from this many keys on, a CUDA run notes the float64 reference's peak memory in the row
# (the nightly 65,537 / 131,072-key cases: the reference runs in query chunks to fit).
NOTE_REFERENCE_PEAK_FROM_KEYS = 65536


def _references_noting_peak(case: Case, inputs: AttnInputs, keep, device: str, notes: list[str]):
    if case.seqlen_k < NOTE_REFERENCE_PEAK_FROM_KEYS or not str(device).startswith("cuda"):
        return references(case, inputs, keep)
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    gold, low = references(case, inputs, keep)
    peak = torch.cuda.max_memory_allocated() - before
    notes.append(f"references (float64 and {case.compute_dtype}) peak {peak / 2**30:.2f} GiB on the GPU, query-chunked")
    return gold, low


def yardstick(name: str, case: Case, inputs: AttnInputs, keep, low: AttnResult | DecodeResult) -> torch.Tensor:
    """P for tensor `name`: the low-precision reference, or, where its spec names another dtype
    (the LSE: float32, as a kernel computes it), the forward reference in that dtype on the same
    rounded inputs (a decode case's on the K/V gathered from the expected cache, as decode_references)."""
    dtype = tensor_spec(name).yardstick_dtype
    if dtype is None or TORCH_DTYPES[case.compute_dtype] == TORCH_DTYPES[dtype]:
        return getattr(low, name)
    if inputs.cache is not None:
        dense = gather_dense(inputs.cache, *expected_cache(inputs.cache))
        return getattr(
            decode_reference(inputs.cache.q, dense, options(case, inputs), TORCH_DTYPES[dtype], inputs.sink), name
        )
    varlen = dict(cu_seqlens=inputs.cu_seqlens, cu_seqlens_k=inputs.cu_seqlens_k, dropout_keep=keep, sink=inputs.sink)
    return getattr(
        attention_reference(
            inputs.q,
            inputs.k,
            inputs.v,
            inputs.dout,
            options(case, inputs),
            TORCH_DTYPES[dtype],
            backward=False,
            fp8_scores=case.is_fp8,
            **varlen,
        ),
        name,
    )


def traceback_tail(exc: BaseException, lines: int = 12) -> str:
    """The last frames of a crash and the error itself: enough to see where the kernel raised,
    short enough that a report can quote it."""

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip().splitlines()
    if len(text) > lines + 1:
        text = [text[0], "  ...", *text[-lines:]]
    return "\n".join(text)[-2000:]


def _keep_worst(worst: dict[str, TensorError], err: TensorError) -> None:
    if err.tensor not in worst or not err.ratio <= worst[err.tensor].ratio:
        worst[err.tensor] = err


def measure_seed(
    case: Case,
    inputs: AttnInputs,
    out,
    lse,
    grads,
    dropout_keep,
    tol: ToleranceConfig,
    worst: dict[str, TensorError],
    notes: list[str],
    traits: KernelTraits,
    device: str = "cpu",
    cache=None,
) -> str | None:
    """Judge one seed's raw kernel outputs against the references (computed here, from `inputs`):
    update `worst` per tensor and return a FAIL reason, or None. Raises BadOutput on an invalid
    answer. Measured: out; the grads `grad_names` lists (dbias, dsink) unless the run is
    forward-only (`grads` None); the LSE against its float32 yardstick; for a decode case the
    cache after the call (`cache` = (k_cache, v_cache)), exact."""
    forward_only = is_forward_only(traits, case)
    validate_outputs(case, inputs, out, None if forward_only else grads, grad_names(traits, case, inputs))
    if case.dropout_p and dropout_keep is None:
        raise BadOutput("the kernel ran with dropout but exposed no dropout mask")
    if case.entry.kind == "kvcache":
        gold, low, (k_after, v_after) = decode_references(case, inputs)
        if cache is None:
            raise BadOutput("the adapter returned no cache for a decode call")
        _keep_worst(worst, measure_exact("k_cache", cache[0].detach(), k_after, case.compute_dtype, inputs.seed))
        _keep_worst(worst, measure_exact("v_cache", cache[1].detach(), v_after, case.compute_dtype, inputs.seed))
    else:
        gold, low = _references_noting_peak(case, inputs, dropout_keep, device, notes)
    measured = {"out": out}
    if not forward_only:  # dq, dk, dv, then dbias and dsink as grad_names says
        measured.update(zip(grad_names(traits, case, inputs), grads))
    if lse is not None:
        if tuple(lse.shape) != tuple(gold.lse.shape):
            return f"seed {inputs.seed}: lse has shape {tuple(lse.shape)}, expected {tuple(gold.lse.shape)}"
        measured["lse"] = lse
    elif traits.returns_lse:
        notes.append("lse not exposed for this case")
    elif forward_only:
        notes.append("lse not returned: judged on out alone")
    if case.entry.sinks and not forward_only and not traits.sink_grad:
        notes.append("dsink not judged: the adapter declares no sink gradient")
    for name, tensor in measured.items():
        mult = tol.mult(name, tensor_spec(name).yardstick_dtype or case.compute_dtype)
        err = measure(
            name,
            tensor.detach(),
            getattr(gold, name),
            yardstick(name, case, inputs, dropout_keep, low),
            case.compute_dtype,
            mult,
            inputs.seed,
        )
        _keep_worst(worst, err)
    return None


def verdict_row(
    case: Case, worst: dict[str, TensorError], checks, notes, seconds: float, forward_only: bool = False
) -> CaseResult:
    """PASS or FAIL from the measured tensors and the checks' results."""
    tensors = tuple(worst[n] for n in ALL_TENSORS if n in worst)
    bad = [t for t in tensors if not t.passed]
    failed_checks = [c for c in checks if c.passed is False]
    if bad or failed_checks:
        why = [
            f"{t.tensor} error {t.max_err:.3g} > bound {t.bound:.3g} (ratio {t.ratio:.2f}, seed {t.seed})" for t in bad
        ]
        why += [f"{c.name}: {c.detail}" for c in failed_checks]
        return CaseResult(
            case=case,
            status=Status.FAIL,
            reason="; ".join(why),
            tensors=tensors,
            checks=checks,
            seconds=seconds,
            forward_only=forward_only,
        )
    return CaseResult(
        case=case,
        status=Status.PASS,
        reason="; ".join(dict.fromkeys(notes)),
        tensors=tensors,
        checks=checks,
        seconds=seconds,
        forward_only=forward_only,
    )


def run_case(adapter: KernelAdapter, case: Case, device: str, tol: ToleranceConfig, extra_checks=()) -> CaseResult:
    """Measure `case` on every seed, in this process. `extra_checks` are callables (adapter, case, device) ->
    tuple[CheckResult] run after the error measurement (determinism, dropout statistics...).

    The isolated path (gate/workflow/isolation.py) runs `kernel_pass` in a worker and the same
    `measure_seed` / `verdict_row` here."""
    start = time.perf_counter()
    reason = adapter.unsupported_reason(case, device)
    if reason:
        return CaseResult(case=case, status=Status.SKIP, reason=reason)
    worst: dict[str, TensorError] = {}
    traits = KernelTraits.of(adapter)
    forward_only = is_forward_only(traits, case)
    notes: list[str] = [forward_only_note(case)] if forward_only else []
    try:
        adapter.prepare(case)
        for seed in case.seeds:
            inputs = make_inputs(case, seed, device)
            try:
                kout, grads = kernel_pass(adapter, case, inputs)
                fail = measure_seed(
                    case,
                    inputs,
                    kout.out,
                    kout.lse,
                    grads,
                    kout.dropout_keep,
                    tol,
                    worst,
                    notes,
                    traits,
                    device,
                    kout.cache,
                )
            except NoKernel as exc:
                return CaseResult(case=case, status=Status.SKIP, reason=str(exc), seconds=time.perf_counter() - start)
            except BadOutput as exc:
                return CaseResult(
                    case=case, status=Status.FAIL, reason=f"seed {seed}: {exc}", seconds=time.perf_counter() - start
                )
            if fail:
                return CaseResult(case=case, status=Status.FAIL, reason=fail, seconds=time.perf_counter() - start)
            del kout, grads, inputs
        checks = tuple(c for check in extra_checks for c in check(adapter, case, device))
    except BadOutput as exc:
        return CaseResult(case=case, status=Status.FAIL, reason=str(exc), seconds=time.perf_counter() - start)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a crashing kernel is a row, not a dead run (sys.exit in a kernel too)
        return CaseResult(
            case=case,
            status=Status.ERROR,
            reason=first_line(exc),
            seconds=time.perf_counter() - start,
            checks=(),
            traceback=traceback_tail(exc),
        )
    return verdict_row(case, worst, checks, notes, time.perf_counter() - start, forward_only)
