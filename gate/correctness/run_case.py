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
from typing import Any

import torch

from gate.attention.inputs import FP8_TORCH_DTYPES, TORCH_DTYPES, AttnInputs, KernelTensors, kernel_tensors, make_inputs
from gate.attention.kvcache import as_nhd, expected_cache, gather_dense, in_layout
from gate.attention.reference import AttnOptions, AttnResult, DecodeResult, attention_reference, decode_reference
from gate.core.cases import Case
from gate.core.config import ToleranceConfig
from gate.core.errors import first_line
from gate.core.results import ALL_TENSORS, CaseResult, Status, TensorError, error_ratio
from gate.correctness.measure import error_part, tensor_error, unravel
from gate.correctness.tolerance import BANDS, rounding_floor, tensor_spec
from gate.kernels.base import KernelAdapter, KernelCall, KernelOutput, NoKernel


class BadOutput(Exception):
    """The kernel returned something that is not a valid answer (shape, dtype, NaN/Inf)."""


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
    """A decode call on clones of the cache, in the layout the case's knobs ask for: the kernel may
    write into them, the inputs stay as drawn."""
    cache = inputs.cache
    mine = in_layout(cache, case.knobs.kv_layout)
    return KernelCall(
        q=cache.q.detach().clone(),
        k=mine.k_cache,
        v=mine.v_cache,
        opts=options(case, inputs),
        seed=inputs.seed,
        cache=mine,
        sink=None if inputs.sink is None else inputs.sink.detach().clone(),
        knobs=case.knobs,
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
    are judged by `validate_outputs` and `judge_seed` (in the gate's own process when the kernel
    runs in a worker, gate/workflow/isolation.py)."""
    tensors = None if inputs.cache is not None else kernel_tensors(case, inputs)
    call = leaf_call(case, inputs, deterministic, tensors)
    result = adapter(call)
    if not isinstance(result, KernelOutput):
        raise BadOutput(f"adapter returned {type(result).__name__}, not KernelOutput")
    if call.cache is not None:  # the cache in the kernel's layout, read as the checks read it (NHD)
        written = result.cache if result.cache is not None else (call.cache.k_cache, call.cache.v_cache)
        result = dataclasses.replace(result, cache=tuple(as_nhd(t, call.cache.kv_layout) for t in written))
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
    if tuple(kernel.shape) != tuple(expected.shape):
        raise BadOutput(f"{name} has shape {tuple(kernel.shape)}, expected {tuple(expected.shape)}")
    diff = (kernel.double() - expected.double()).abs()
    diff = diff.masked_fill(torch.isnan(kernel) & torch.isnan(expected), 0.0)  # a NaN slot left as it was
    diff = torch.nan_to_num(diff, nan=math.inf, posinf=math.inf)  # a NaN slot is infinitely wrong (files hold no NaN)
    max_err = float(diff.max()) if diff.numel() else 0.0
    flat = int(diff.flatten().argmax()) if diff.numel() else 0
    worst = unravel(flat, tuple(diff.shape)) if diff.numel() else ()
    bound = rounding_floor(0.0, dtype)
    atol, rtol = BANDS[dtype]
    mean_err = float(diff.mean()) if diff.numel() else 0.0
    return TensorError(
        tensor=name,
        max_err=max_err,
        mean_err=mean_err,
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
        # an exact tensor is judged by its max; its mean, never above it, gets the same bound
        pt_mean_err=0.0,
        mean_mult=1.0,
        mean_floor=bound,
        mean_bound=bound,
        mean_ratio=error_ratio(mean_err, bound),
    )


# from this many keys on, a CUDA run notes the float64 reference's peak memory in the row
# (the nightly 65,537 / 131,072-key cases: the reference runs in query chunks to fit).
NOTE_REFERENCE_PEAK_FROM_KEYS = 65536


def _references_noting_peak(case: Case, inputs: AttnInputs, keep, device: str):
    """(golden, low-precision, a note of the float64 reference's GPU peak or None)."""
    if case.seqlen_k < NOTE_REFERENCE_PEAK_FROM_KEYS or not str(device).startswith("cuda"):
        return (*references(case, inputs, keep), None)
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    gold, low = references(case, inputs, keep)
    peak = torch.cuda.max_memory_allocated() - before
    return (
        gold,
        low,
        f"references (float64 and {case.compute_dtype}) peak {peak / 2**30:.2f} GiB on the GPU, query-chunked",
    )


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


@dataclass(frozen=True, kw_only=True)
class SeedOutputs:
    """One seed's raw kernel outputs, unjudged, as `kernel_pass` returned them (on any device):
    what a worker sends back and what `judge_seed` reads."""

    seed: int
    out: Any
    lse: Any = None
    grads: tuple | None = None  # in `grad_names` order; None: a forward-only run
    dropout_keep: Any = None  # a mask, or one per sequence (varlen dropout)
    cache: tuple | None = None  # a decode call's (k_cache, v_cache) after the call

    def to_payload(self, names: tuple[str, ...], move=lambda t: t) -> dict:
        """A plain dict for torch.save, the grads under their `names`, each tensor passed
        through `move` (a worker's copy to the CPU)."""
        entry = {
            "seed": self.seed,
            "out": move(self.out),
            "lse": move(self.lse),
            "dropout_keep": move(self.dropout_keep),
            "cache": None if self.cache is None else [move(self.cache[0]), move(self.cache[1])],
        }
        if self.grads is not None:
            entry.update({name: move(grad) for name, grad in zip(names, self.grads)})
        return entry

    @classmethod
    def from_payload(cls, entry: dict, names: tuple[str, ...] | None) -> "SeedOutputs":
        """`names` None: a forward-only run, no grads read; a grad the payload lacks is None
        ("dbias is missing"). A missing out, lse or mask is a KeyError: not a worker's payload."""
        cache = entry.get("cache")
        return cls(
            seed=entry["seed"],
            out=entry["out"],
            lse=entry["lse"],
            grads=None if names is None else tuple(entry.get(name) for name in names),
            dropout_keep=entry["dropout_keep"],
            cache=None if cache is None else tuple(cache),
        )


def kernel_outputs(adapter: KernelAdapter, case: Case, inputs: AttnInputs) -> SeedOutputs:
    """The kernel's forward and backward on one seed's inputs (kernel_pass), as a value."""
    kout, grads = kernel_pass(adapter, case, inputs)
    return SeedOutputs(
        seed=inputs.seed,
        out=kout.out,
        lse=kout.lse,
        grads=None if grads is None else tuple(grads),
        dropout_keep=kout.dropout_keep,
        cache=kout.cache,
    )


@dataclass(frozen=True, kw_only=True)
class SeedJudgement:
    """One seed judged: each measured tensor's errors, the notes for the row, or a FAIL reason
    found before the tensors were measured."""

    errors: tuple[TensorError, ...] = ()
    notes: tuple[str, ...] = ()
    fail: str | None = None


# A dense case whose float64 reference would hold more than REFERENCE_WHOLE_ELEMENTS (32 GiB; every
# built-in case holds less) is judged in groups of batch elements of at most REFERENCE_GROUP_ELEMENTS
# each (8 GiB; one element a group where one alone holds more; each element's attention is its own):
# a batch whose tensors pass 2^31 elements is referenced a group at a time beside the kernel's outputs.
REFERENCE_WHOLE_ELEMENTS = 2**32
REFERENCE_GROUP_ELEMENTS = 2**30


def batch_groups(case: Case) -> list[tuple[int, int]] | None:
    """(first, end) batch elements of each group whose references are computed together, or None:
    one reference for the whole case (small enough; or something shared across the batch: a bias,
    sinks, dropout, fp8 descales; or not a dense batch: varlen, decode)."""
    if (
        case.entry.kind != "dense"
        or case.entry.varlen is not None
        or case.entry.sinks
        or case.has_bias
        or case.dropout_p
        or case.is_fp8
        or case.batch < 2
    ):
        return None
    # per query row: q, dO, out, dQ; per key row: K, V, dK, dV, expanded to the query heads
    per_element = case.heads_q * (case.seqlen_q + case.seqlen_k) * 2 * (case.head_dim + case.head_dim_v)
    if per_element * case.batch <= REFERENCE_WHOLE_ELEMENTS:
        return None
    size = max(1, REFERENCE_GROUP_ELEMENTS // per_element)
    return [(b, min(case.batch, b + size)) for b in range(0, case.batch, size)]


def batch_slice(inputs: AttnInputs, first: int, end: int) -> AttnInputs:
    """The inputs of batch elements first..end-1 of a dense case (ALiBi slopes are per head)."""
    assert inputs.alibi_slopes is None or inputs.alibi_slopes.dim() == 1
    return dataclasses.replace(
        inputs, q=inputs.q[first:end], k=inputs.k[first:end], v=inputs.v[first:end], dout=inputs.dout[first:end]
    )


def _referenced(case: Case, inputs: AttnInputs, groups, gold, low, raw: SeedOutputs):
    """(first, end, inputs, golden, low-precision, dropout mask) of each part the references are
    computed for: the whole batch once (`gold`, `low` computed already), or each group in turn,
    its references dropped before the next group's are computed."""
    if groups is None:
        yield 0, None, inputs, gold, low, raw.dropout_keep
        return
    for first, end in groups:
        part_inputs = batch_slice(inputs, first, end)
        yield first, end, part_inputs, *references(case, part_inputs, None), None


def judge_seed(
    case: Case, inputs: AttnInputs, raw: SeedOutputs, tol: ToleranceConfig, traits: KernelTraits, device: str = "cpu"
) -> SeedJudgement:
    """Judge one seed's raw kernel outputs against the references (computed here, from `inputs`).
    Raises BadOutput on an invalid answer. Measured: out; the grads `grad_names` lists (dbias,
    dsink) unless the run is forward-only; the LSE against its float32 yardstick; for a decode
    case the cache after the call, exact."""
    forward_only = is_forward_only(traits, case)
    names = grad_names(traits, case, inputs)
    validate_outputs(case, inputs, raw.out, None if forward_only else raw.grads, names)
    if case.dropout_p and raw.dropout_keep is None:
        raise BadOutput("the kernel ran with dropout but exposed no dropout mask")
    errors: list[TensorError] = []
    notes: list[str] = []
    if case.entry.kind == "kvcache":
        gold, low, (k_after, v_after) = decode_references(case, inputs)
        if raw.cache is None:
            raise BadOutput("the adapter returned no cache for a decode call")
        errors.append(measure_exact("k_cache", raw.cache[0].detach(), k_after, case.compute_dtype, inputs.seed))
        errors.append(measure_exact("v_cache", raw.cache[1].detach(), v_after, case.compute_dtype, inputs.seed))
    groups = batch_groups(case)
    if groups is not None:  # references per group of batch elements, below
        gold = low = None
        notes.append(f"references computed in {len(groups)} groups of batch elements")
    elif case.entry.kind != "kvcache":
        gold, low, peak = _references_noting_peak(case, inputs, raw.dropout_keep, device)
        notes += [peak] if peak else []
    measured = {"out": raw.out}
    if not forward_only:  # dq, dk, dv, then dbias and dsink as grad_names says
        measured.update(zip(names, raw.grads))
    if raw.lse is not None:
        expected = tuple(gold.lse.shape) if gold is not None else (case.batch, case.heads_q, case.seqlen_q)
        if tuple(raw.lse.shape) != expected:
            return SeedJudgement(fail=f"seed {inputs.seed}: lse has shape {tuple(raw.lse.shape)}, expected {expected}")
        measured["lse"] = raw.lse
    elif traits.returns_lse:
        notes.append("lse not exposed for this case")
    elif forward_only:
        notes.append("lse not returned: judged on out alone")
    if case.entry.sinks and not forward_only and not traits.sink_grad:
        notes.append("dsink not judged: the adapter declares no sink gradient")
    parts: dict[str, list] = {name: [] for name in measured}
    for first, end, part_inputs, part_gold, part_low, keep in _referenced(case, inputs, groups, gold, low, raw):
        for name, tensor in measured.items():
            got = tensor.detach()[first:end]
            low_of = yardstick(name, case, part_inputs, keep, part_low)
            parts[name].append(error_part(name, got, getattr(part_gold, name), low_of, case.compute_dtype, first))
        del part_gold, part_low  # before the next group's references are computed
    for name in measured:
        yardstick_dtype = tensor_spec(name).yardstick_dtype or case.compute_dtype
        errors.append(
            tensor_error(
                name,
                parts[name],
                case.compute_dtype,
                tol.mult(name, yardstick_dtype),
                inputs.seed,
                tol.mean_mult_of(case.dtype, yardstick_dtype),
            )
        )
    return SeedJudgement(errors=tuple(errors), notes=tuple(notes))


def worst_per_tensor(judgements) -> dict[str, TensorError]:
    """Per tensor, a failing seed before a passing one (a seed failing the mean rule alone is not
    hidden by another with a higher max ratio), then the highest ratio (the first of equals; a NaN
    ratio wins)."""
    worst: dict[str, TensorError] = {}
    for judgement in judgements:
        for err in judgement.errors:
            held = worst.get(err.tensor)
            if (
                held is None
                or (held.passed and not err.passed)
                or (held.passed == err.passed and not err.ratio <= held.ratio)
            ):
                worst[err.tensor] = err
    return worst


@dataclass(frozen=True, kw_only=True)
class Ended:
    """A case that ended before its verdict: the row's status, reason and traceback, and for an
    ERROR the exception's type and whole message (a worker looks there for a CUDA fault)."""

    status: Status
    reason: str
    traceback: str = ""
    exception: str = ""

    def row(self, case: Case, seconds: float) -> CaseResult:
        return CaseResult(case=case, status=self.status, reason=self.reason, seconds=seconds, traceback=self.traceback)


def seed_loop(case: Case, device: str, step) -> "list | Ended":
    """The one loop over a case's seeds, for every executor: each seed's inputs drawn, then
    `step(inputs)` (run the kernel, judge its outputs, or both); the values in seed order. The
    first seed whose step raises NoKernel (the adapter refused the call: SKIP) or BadOutput
    (not a valid answer: FAIL), or returns a judgement with a FAIL reason, ends the case."""
    done = []
    for seed in case.seeds:
        inputs = make_inputs(case, seed, device)
        try:
            value = step(inputs)
        except NoKernel as exc:
            return Ended(status=Status.SKIP, reason=str(exc))
        except BadOutput as exc:
            return Ended(status=Status.FAIL, reason=f"seed {seed}: {exc}")
        if isinstance(value, SeedJudgement) and value.fail:
            return Ended(status=Status.FAIL, reason=value.fail)
        done.append(value)
        del inputs, value
    return done


def run_seeds(adapter: KernelAdapter, case: Case, device: str, step, extra_checks=()) -> "tuple[list, tuple] | Ended":
    """The kernel's side of a case, in this process or in a worker: prepare, `seed_loop`, then
    the extra checks (callables (adapter, case, device) -> tuple[CheckResult]). (values, check
    results), or how the case ended: a BadOutput outside the seeds is a FAIL, any other exception
    an ERROR row (a crashing kernel is a row, not a dead run; sys.exit in a kernel too)."""
    try:
        adapter.prepare(case)
        done = seed_loop(case, device, step)
        if isinstance(done, Ended):
            return done
        checks = tuple(c for check in extra_checks for c in check(adapter, case, device))
        if device == "cuda":
            torch.cuda.synchronize()  # an asynchronous fault belongs to this case, not to the next
    except BadOutput as exc:
        return Ended(status=Status.FAIL, reason=str(exc))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        return Ended(
            status=Status.ERROR,
            reason=first_line(exc),
            traceback=traceback_tail(exc),
            exception=f"{type(exc).__name__} {exc}",
        )
    return done, checks


def verdict_row(
    case: Case, worst: dict[str, TensorError], checks, notes, seconds: float, forward_only: bool = False
) -> CaseResult:
    """PASS or FAIL from the measured tensors and the checks' results."""
    tensors = tuple(worst[n] for n in ALL_TENSORS if n in worst)
    bad = [t for t in tensors if not t.passed]
    failed_checks = [c for c in checks if c.passed is False]
    if bad or failed_checks:
        why = [t.failure for t in bad]
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


def judged_row(case: Case, judgements, checks, traits: KernelTraits, seconds: float) -> CaseResult:
    """The row of a case whose every seed was judged: the worst seed per tensor, the notes of
    every seed in order (a forward-only case's first), PASS or FAIL."""
    forward_only = is_forward_only(traits, case)
    notes = [forward_only_note(case)] if forward_only else []
    notes += [note for judgement in judgements for note in judgement.notes]
    return verdict_row(case, worst_per_tensor(judgements), checks, notes, seconds, forward_only)


def run_case(adapter: KernelAdapter, case: Case, device: str, tol: ToleranceConfig, extra_checks=()) -> CaseResult:
    """Measure `case` on every seed, in this process: each seed's kernel outputs judged before
    the next seed runs. `extra_checks` are callables (adapter, case, device) -> tuple[CheckResult]
    run after the error measurement (determinism, dropout statistics...).

    The isolated path (gate/workflow/isolation.py) runs the same `run_seeds` in a worker with a
    step that only keeps the outputs, and the same `seed_loop` of `judge_seed` and `judged_row` here."""
    start = time.perf_counter()
    reason = adapter.unsupported_reason(case, device)
    if reason:
        return CaseResult(case=case, status=Status.SKIP, reason=reason)
    traits = KernelTraits.of(adapter)

    def step(inputs: AttnInputs) -> SeedJudgement:
        return judge_seed(case, inputs, kernel_outputs(adapter, case, inputs), tol, traits, device)

    ran = run_seeds(adapter, case, device, step, extra_checks)
    if isinstance(ran, Ended):
        return ran.row(case, time.perf_counter() - start)
    judgements, checks = ran
    return judged_row(case, judgements, checks, traits, time.perf_counter() - start)
