"""Inputs for one (case, seed): the same q, k, v, dO on every path (kernel, references).

Values are drawn in float32 on the CPU from a seeded generator, so a case's inputs are the
same on any machine, then rounded to the case dtype once: the references see exactly the rounded
tensors the kernel sees. Timing draws them on the GPU instead (`timing_inputs`): the same
distribution at no CPU cost, where no value has to match another machine's.
"""

from __future__ import annotations

import itertools
import math
import sys
from dataclasses import dataclass

import torch

from gate.attention.bias import make_bias
from gate.attention.kvcache import CacheInputs, make_cache_inputs
from gate.attention.masks import alibi_slopes
from gate.core.cases import Case

# the dtypes tensors are computed in; an fp8 case's q, k, v are handed to the kernel in FP8_TORCH_DTYPES
# (Fp8Inputs) and seen by the references dequantized, in its compute dtype (Case.compute_dtype)
TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
FP8_TORCH_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


@dataclass(frozen=True)
class Fp8Inputs:
    """An fp8 case's q, k, v as the kernel gets them: fp8 (B, N, H, D) with float32 descale
    factors of shape (batch, KV heads), FA3's q_descale/k_descale/v_descale (query heads take their
    KV head's). value = fp8 * descale; the AttnInputs' q, k, v hold exactly those values."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    q_descale: torch.Tensor
    k_descale: torch.Tensor
    v_descale: torch.Tensor


@dataclass(frozen=True)
class AttnInputs:
    """Dense tensors are (batch, seqlen, heads, dim); varlen ones are packed (total, heads, dim)
    with int32 cu_seqlens, as flash-attn's varlen API takes them."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor
    softmax_scale: float
    alibi_slopes: torch.Tensor | None
    cu_seqlens: torch.Tensor | None
    seqlens: tuple[int, ...] | None
    seed: int
    # a kvcache case's cache (q above is the decode step's query), and the learnable
    # sink logits (Hq,) float32 of a case with sinks.
    cache: "CacheInputs | None" = None
    sink: torch.Tensor | None = None
    # the case's custom bias (float in the bias dtype, or bool), None without one.
    bias: torch.Tensor | None = None
    # the keys' cu_seqlens where they differ from the queries' (None: the same)
    cu_seqlens_k: torch.Tensor | None = None
    seqlens_k: tuple[int, ...] | None = None
    # an fp8 case's quantized q, k, v and their descales (q, k, v above: the dequantized values)
    fp8: Fp8Inputs | None = None


# `inputs = "large"`: the typical score size without softcap; past exp's float32 range
# (+-88) at the tails, so a softmax that skips the running max overflows.
LARGE_SCORE_STD = 32.0
# `inputs = "shifted"`: every score is about -SHIFT (q and k share a channel +a / -a): every
# row's LSE sits far below -88, where exp(LSE) underflows float32 (pytorch #196678).
SHIFTED_SCORE = 120.0
# `inputs = "outliers"`: these channels of K and V are this much larger than the others.
OUTLIER_FACTOR = 30.0
OUTLIER_CHANNELS = 2


def _shape_values(case: Case, q, k, v):
    """q, k, v (float32, before rounding) drawn as `case.inputs` says; the scale
    factors are powers of two where they can be, so rounding adds no error of its own."""
    if case.inputs == "large":
        std = case.softcap / 4 if case.softcap else LARGE_SCORE_STD
        q = q * std  # scores scale * q.k have std ~1 for unit-normal q, k
    elif case.inputs == "shifted":
        a = (SHIFTED_SCORE / (case.head_dim**-0.5)) ** 0.5  # scale * a * a = SHIFTED_SCORE
        q, k = q.clone(), k.clone()
        q[..., 0] += a
        k[..., 0] -= a
    elif case.inputs == "outliers":
        k, v = k.clone(), v.clone()
        for t in (k, v):
            channels = torch.linspace(0, t.shape[-1] - 1, OUTLIER_CHANNELS + 2).round().long()[1:-1]
            t[..., channels] *= OUTLIER_FACTOR
    return q, k, v


def offsets(lengths) -> list[int]:
    """Packed start offsets of sequences of `lengths`, on the host: [0, l0, l0 + l1, ...]."""
    return [0, *itertools.accumulate(int(n) for n in lengths)]


def _cu(lengths, device) -> torch.Tensor:
    return torch.tensor(offsets(lengths), dtype=torch.int32, device=device)


def _quantize(t: torch.Tensor, heads_kv: int, fp8: torch.dtype, shift: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 (B, N, H, D) -> (fp8 tensor, float32 descale (B, heads_kv)). Each descale is a power of
    two just above amax / fp8 max, times 2 ** ((b + h + shift) % 3): the descales differ between
    batch elements and heads (a kernel that reads one for all is wrong), and every dequantized
    value fp8 * descale is exact in bf16 (3 or 2 mantissa bits times a power of two)."""
    b, n, h, d = t.shape
    grouped = t.reshape(b, n, heads_kv, h // heads_kv, d)
    amax = grouped.abs().amax(dim=(1, 3, 4)).clamp_min(torch.finfo(torch.float32).tiny)
    spread = (
        torch.arange(b, device=t.device).view(-1, 1) + torch.arange(heads_kv, device=t.device).view(1, -1) + shift
    ) % 3
    descale = torch.exp2(torch.ceil(torch.log2(amax / torch.finfo(fp8).max)) + spread)
    q8 = (grouped / descale.view(b, 1, heads_kv, 1, 1)).to(fp8).reshape(b, n, h, d)
    return q8, descale.float()


def dequantize(t8: torch.Tensor, descale: torch.Tensor) -> torch.Tensor:
    """fp8 (B, N, H, D) times its (B, Hkv) descale, a query head taking its KV head's: float32."""
    b, n, h, d = t8.shape
    hkv = descale.shape[1]
    return (t8.float().reshape(b, n, hkv, h // hkv, d) * descale.view(b, 1, hkv, 1, 1)).reshape(b, n, h, d)


def _fp8_inputs(case: Case, q, k, v) -> tuple[Fp8Inputs, tuple[torch.Tensor, ...]]:
    """The quantized q, k, v of an fp8 case and their dequantized float32 values."""
    fp8 = FP8_TORCH_DTYPES[case.dtype]
    (q8, qs), (k8, ks), (v8, vs) = (_quantize(t, case.heads_kv, fp8, shift) for shift, t in enumerate((q, k, v)))
    values = (dequantize(q8, qs), dequantize(k8, ks), dequantize(v8, vs))
    return Fp8Inputs(q8, k8, v8, qs, ks, vs), values


def make_inputs(case: Case, seed: int, device: str | torch.device, draw_on: str | torch.device = "cpu") -> AttnInputs:
    """The case's inputs for `seed`, drawn on `draw_on` (the CPU: the same values on every machine)
    and placed on `device`."""
    dtype = TORCH_DTYPES[case.compute_dtype]
    gen = torch.Generator(device=draw_on).manual_seed(seed * 1_000_003 + 17)
    if case.entry.varlen is not None:
        total, total_k = sum(case.entry.varlen), sum(case.keys_varlen)
        shapes = [
            (total, case.heads_q, case.head_dim),
            (total_k, case.heads_kv, case.head_dim),
            (total_k, case.heads_kv, case.head_dim_v),
            (total, case.heads_q, case.head_dim_v),
        ]
    else:
        b, nq, nk = case.batch, case.seqlen_q, case.seqlen_k
        shapes = [
            (b, nq, case.heads_q, case.head_dim),
            (b, nk, case.heads_kv, case.head_dim),
            (b, nk, case.heads_kv, case.head_dim_v),
            (b, nq, case.heads_q, case.head_dim_v),
        ]
    q, k, v, dout = (torch.randn(s, generator=gen, dtype=torch.float32, device=gen.device) for s in shapes)
    q, k, v = _shape_values(case, q, k, v)
    if case.layout == "kv_stride0":  # the values one expanded slab can hold (kernel_tensors hands the expand)
        k, v = (t[_stride0_slab(t.dim())].expand_as(t).clone() for t in (k, v))
    fp8 = None
    if case.is_fp8:
        fp8, (q, k, v) = _fp8_inputs(case, q, k, v)
        fp8 = Fp8Inputs(*(t.to(device) for t in (fp8.q, fp8.k, fp8.v, fp8.q_descale, fp8.k_descale, fp8.v_descale)))
    q, k, v, dout = (t.to(device=device, dtype=dtype) for t in (q, k, v, dout))
    cu = _cu(case.entry.varlen, device) if case.entry.varlen is not None else None
    cu_k = _cu(case.entry.varlen_k, device) if case.entry.varlen_k is not None else None
    slopes = alibi_slopes(case.heads_q).to(device) if case.alibi else None
    # drawn after everything else, so the inputs of older cases are unchanged. A sink
    # logit near log(keys) weighs about as much as all keys together: a kernel that drops it is far off.
    cache = make_cache_inputs(case, q, gen, dtype, device) if case.entry.kind == "kvcache" else None
    sink = None
    if case.entry.sinks:
        sink = (
            torch.randn(case.heads_q, generator=gen, device=gen.device)
            + float(torch.tensor(float(case.seqlen_k)).log())
        ).to(device)
    bias = make_bias(case, seed, device, bias_dtype(case))  # its own generator, q/k/v unchanged
    return AttnInputs(
        q=q,
        k=k,
        v=v,
        dout=dout,
        softmax_scale=case.head_dim**-0.5,
        alibi_slopes=slopes,
        cu_seqlens=cu,
        seqlens=case.entry.varlen,
        seed=seed,
        cu_seqlens_k=cu_k,
        seqlens_k=case.entry.varlen_k,
        bias=bias,
        cache=cache,
        sink=sink,
        fp8=fp8,
    )


def timing_inputs(case: Case, device: str | torch.device) -> AttnInputs:
    """Inputs for timing: the case's shapes, layout and regimes, drawn on the GPU where there is
    one. Timing needs the distribution, not the reproducible CPU values the correctness sweep
    draws (a batch-64 decode over an 8k cache took 30 s to draw on a CPU). Where the device draw
    fails they are drawn as the sweep draws them, with a note: a timing never depends on this."""
    if str(device).startswith("cuda"):
        try:
            return make_inputs(case, 0, device, draw_on=device)
        except Exception as exc:  # noqa: BLE001 - any failure of the fast path falls back to the sweep's
            print(
                f"attn-gate: note: {case.id}: timing inputs drawn on the CPU ({type(exc).__name__}: {exc})",
                file=sys.stderr,
            )
    return make_inputs(case, 0, device)


def _stride0_slab(dim: int) -> tuple[slice, ...]:
    """The part of K/V a `kv_stride0` view is expanded from: batch 0 and KV head 0 of a dense
    (B, N, H, D) tensor, KV head 0 of a packed varlen (total, H, D) one."""
    if dim == 4:
        return (slice(0, 1), slice(None), slice(0, 1), slice(None))
    return (slice(None), slice(0, 1), slice(None))


def bias_dtype(case: Case) -> torch.dtype:
    """the dtype of a float bias: the input dtype unless the case asks for fp32."""
    return torch.float32 if case.bias.dtype == "fp32" else TORCH_DTYPES[case.compute_dtype]


@dataclass(frozen=True)
class KernelTensors:
    """What the kernel is handed: q, k, v track gradients (through leaves they are views
    of, under a non-default layout) and dout is the gradient handed to the backward. Values equal
    the AttnInputs' exactly; only strides, offsets and shared storage differ."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_(True)


FAR = 2**31  # element offsets at or past this wrap in int32 arithmetic


def _written_view(t: torch.Tensor, buf: torch.Tensor, strides, grad: bool) -> torch.Tensor:
    """t's values written into `buf` through a view of these strides: the view, whose gradient
    (with `grad`) flows to `buf`, a leaf."""
    view = torch.as_strided(buf, t.shape, strides)
    view.copy_(t.detach())
    if grad:
        buf.requires_grad_(True)
        view = torch.as_strided(buf, t.shape, strides)
    return view


def far_rows(t: torch.Tensor, seq: int, grad: bool) -> torch.Tensor:
    """`t` as a view whose rows (the sequence dim, flattened with the batch dim before it) are
    strided so the last quarter of them start past FAR elements from the view's base. The buffer
    is allocated, not filled (torch.empty: untouched pages cost no memory on a CPU); only the rows
    are written. Feature and head dims keep their dense strides."""
    rows = math.prod(t.shape[: seq + 1])
    row = t.shape[-2] * t.shape[-1]
    stride = max(row, -(-FAR // max(1, (3 * rows) // 4) // 8) * 8 + 8)  # a multiple of 8 (16-byte rows)
    buf = torch.empty((rows - 1) * stride + row, dtype=t.dtype, device=t.device)
    strides = [0] * t.dim()
    strides[-1], strides[-2], strides[seq] = 1, t.shape[-1], stride
    if seq == 1:
        strides[0] = t.shape[1] * stride
    return _written_view(t, buf, strides, grad)


def far_batch(t: torch.Tensor, grad: bool) -> torch.Tensor:
    """`t` (B, N, H, D) as a view whose batch elements are strided so the last one starts past FAR
    elements from the view's base; within an element the layout is dense. The buffer is allocated,
    not filled (as far_rows): only the elements' own rows are written."""
    element = math.prod(t.shape[1:])
    stride = max(element, -(-FAR // (t.shape[0] - 1) // 8) * 8 + 8)  # past FAR/(B-1), a multiple of 8
    buf = torch.empty((t.shape[0] - 1) * stride + element, dtype=t.dtype, device=t.device)
    strides = (stride, t.shape[2] * t.shape[3], t.shape[3], 1)  # each element dense
    return _written_view(t, buf, strides, grad)


def kernel_tensors(case: Case, inputs: AttnInputs) -> KernelTensors:
    """The case's `layout` made real: the kernel receives the VIEW (not a contiguous copy), and
    gradients are taken with respect to that view, so they come back in the view's shape and
    are compared as usual. The seq dim is 1 dense, 0 varlen; the head dim -2; features -1."""
    q, k, v, dout = inputs.q, inputs.k, inputs.v, inputs.dout
    if inputs.fp8 is not None:  # fp8 is forward-only and contiguous: the quantized tensors as they are
        return KernelTensors(inputs.fp8.q, inputs.fp8.k, inputs.fp8.v, dout)
    seq = 0 if inputs.cu_seqlens is not None else 1
    if case.layout == "contiguous":
        return KernelTensors(_leaf(q), _leaf(k), _leaf(v), dout)
    if case.layout == "bhsd_view" or case.layout == "dout_noncontig":

        def transposed(t):  # allocated with heads before the sequence, handed over transposed back
            return t.transpose(seq, -2).contiguous().transpose(seq, -2)

        if case.layout == "dout_noncontig":
            return KernelTensors(_leaf(q), _leaf(k), _leaf(v), transposed(dout))
        bufs = [_leaf(t.transpose(seq, -2).contiguous()) for t in (q, k, v)]
        views = [b.transpose(seq, -2) for b in bufs]
        return KernelTensors(*views, dout)
    if case.layout == "k_sliced":
        d = k.shape[-1]
        pad = 8 + (-d) % 8  # the row stride stays a multiple of 8 elements (16-byte aligned rows)
        shape = list(k.shape)
        shape[seq] += 1
        shape[-1] += pad
        buf = torch.zeros(shape, dtype=k.dtype, device=k.device)
        index = [slice(None)] * k.dim()
        index[seq] = slice(1, None)
        index[-1] = slice(0, d)
        buf[tuple(index)] = k
        buf.requires_grad_(True)
        return KernelTensors(_leaf(q), buf[tuple(index)], _leaf(v), dout)
    if case.layout == "qkv_packed":
        # One buffer (…, max_seq, Hq + 2 Hkv, max_d): q, k, v are head-slices of it (a fused QKV
        # projection's output); q/k lengths or d/dv that differ use the leading part of each dim.
        hq, hkv = q.shape[-2], k.shape[-2]
        shape = list(q.shape)
        shape[seq] = max(q.shape[seq], k.shape[seq])
        shape[-2] = hq + 2 * hkv
        shape[-1] = max(q.shape[-1], v.shape[-1])
        buf = torch.zeros(shape, dtype=q.dtype, device=q.device)
        parts = []
        for t, h0 in ((q, 0), (k, hq), (v, hq + hkv)):
            index = [slice(None)] * t.dim()
            index[seq] = slice(0, t.shape[seq])
            index[-2] = slice(h0, h0 + t.shape[-2])
            index[-1] = slice(0, t.shape[-1])
            buf[tuple(index)] = t
            parts.append(tuple(index))
        buf.requires_grad_(True)
        return KernelTensors(*(buf[i] for i in parts), dout)
    if case.layout == "far_rows":
        return KernelTensors(*(far_rows(t, seq, grad=True) for t in (q, k, v)), far_rows(dout, seq, grad=False))
    if case.layout == "far_batch":
        return KernelTensors(*(far_batch(t, grad=True) for t in (q, k, v)), far_batch(dout, grad=False))
    if case.layout == "kv_stride0":
        # The slab sits in a buffer of K's full size whose other elements are -K: a kernel that
        # reads past a 0 stride as if the tensor were dense gets wrong values, not an out-of-range read.
        views = []
        for t in (k, v):
            slab = _stride0_slab(t.dim())
            buf = (-t).contiguous()
            buf[slab] = t[slab]
            buf.requires_grad_(True)
            views.append(buf[slab].expand(t.shape))
        return KernelTensors(_leaf(q), *views, dout)
    raise ValueError(f"unknown layout {case.layout!r}")
