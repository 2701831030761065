"""Reference attention, forward and analytic backward, written out step by step.

Two uses, one function:
  * the golden reference: compute_dtype=float64 on the kernel's own rounded inputs;
  * the low-precision reference: the same math in the input dtype. Its error against golden is
    what "the PyTorch implementation" loses to rounding, the yardstick of the tolerance rule.

Queries are processed in chunks so the score matrix never exceeds a fixed number of elements:
16k-32k sequences fit on one GPU. The backward is the closed form (no autograd), so dK and dV
accumulate across chunks:
    P = softmax(S),  O = (P * Z) V            (Z = keep / (1 - p) under dropout, else 1)
    dV = (P * Z)^T dO,  dP = (dO V^T) * Z,  dS = P * (dP - rowsum(P * dP))
    dQ = dS K * scale,  dK = dS^T Q * scale   (times 1 - tanh^2 under softcap)

Learnable sinks: one logit t_h per query head joins every row's softmax denominator
as a column with no value: P = exp(S) / (sum exp(S) + exp(t)), LSE = log(sum exp(S) + exp(t)),
O = P V. The sink column has dP = 0, so dS keeps its form and
    dsink_h = -sum over rows of exp(t_h - LSE) * rowsum(dO * O).
Decode: `decode_reference` gathers each batch element's dense K/V from the expected
cache (gate.attention.kvcache.gather_dense) and runs the same dense math, forward only.

A custom bias (gate/attention/bias.py) is added to the scaled, capped scores before the
masks (a boolean one masks instead), exactly: in float64 for the golden reference; in the low-
precision one with PyTorch's type promotion (bf16 scores + an fp32 bias are an fp32 sum, so the
yardstick does not round away the precision a kernel must keep; P goes back to the input dtype
after the softmax). dBias = dS (before the softcap factor) summed over the bias's broadcast dims.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch

from gate.attention.bias import reduce_to_bias_shape
from gate.attention.masks import alibi_bias, allowed_mask
from gate.core.cases import first_visible_key


@contextmanager
def default_matmul_precision() -> Iterator[None]:
    """Full-precision float32 matmuls and fp32 accumulation of fp16 ones while a reference runs,
    whatever the kernel's package set: TF32 or bf16 passes for float32 (on CUDA, or oneDNN on a
    CPU with bf16) and fp16 accumulation would loosen the bound of every such case. Restored after.
    The reduced-precision-reduction flags are left as set: torch's public getter loses their split-K
    half, so they could not be put back (exact reductions only tighten the yardstick)."""
    cuda = torch.backends.cuda.matmul
    fp16_accumulation = getattr(cuda, "allow_fp16_accumulation", None)  # torch 2.7+
    # torch 2.9+ keeps float32 precision per backend; reading it through the older API raises
    # once a program has set it through the newer one
    spaces = (cuda, torch.backends.mkldnn.matmul) if hasattr(torch.backends, "fp32_precision") else ()
    if spaces:
        inherited = torch.backends.fp32_precision
        # a backend that reads as the global value may be inheriting it (torch does not say which):
        # put back as inheriting, which reads the same now
        saved = ["none" if space.fp32_precision == inherited else space.fp32_precision for space in spaces]
    else:
        saved = torch.get_float32_matmul_precision()
    try:
        if fp16_accumulation is not None:
            cuda.allow_fp16_accumulation = False
        if spaces:
            for space in spaces:
                space.fp32_precision = "ieee"
        else:
            torch.set_float32_matmul_precision("highest")
        yield
    finally:
        if fp16_accumulation is not None:
            cuda.allow_fp16_accumulation = fp16_accumulation
        if spaces:
            for space, was in zip(spaces, saved):
                space.fp32_precision = was
        else:
            torch.set_float32_matmul_precision(saved)


# Elements in one chunk's score matrix: 2**25 float64 values are 256 MiB per live temporary.
CHUNK_ELEMENTS = 2**25

# Hopper's fp8 tensor cores add each 32-product step into an accumulator of 13 fraction bits, not
# 23 (DeepSeek-V3 report 3.3.2): an fp8 kernel's scores and LSE carry that rounding (tolerance.md).
FP8_MMA_K = 32
FP8_ACCUMULATOR_FRACTION_BITS = 13


def _truncate_fraction(x: torch.Tensor, bits: int) -> torch.Tensor:
    """x with its significand cut to `bits` fraction bits, toward zero."""
    mantissa, exponent = torch.frexp(x)  # mantissa in [0.5, 1): one leading bit, then the fraction
    scale = float(2 ** (bits + 1))
    return torch.ldexp(torch.trunc(mantissa * scale) / scale, exponent)


def fp8_mma(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b in float32 as an fp8 tensor core accumulates it: FP8_MMA_K products at a time, each
    partial sum added into an accumulator truncated to FP8_ACCUMULATOR_FRACTION_BITS."""
    a, b = a.float(), b.float()
    acc = None
    for k0 in range(0, a.shape[-1], FP8_MMA_K):
        part = a[..., k0 : k0 + FP8_MMA_K] @ b[..., k0 : k0 + FP8_MMA_K, :]
        acc = _truncate_fraction(part if acc is None else acc + part, FP8_ACCUMULATOR_FRACTION_BITS)
    return acc


@dataclass(frozen=True)
class AttnOptions:
    softmax_scale: float
    causal: bool = False
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    alibi_slopes: torch.Tensor | None = None
    dropout_p: float = 0.0
    # a custom float bias or boolean mask broadcastable to (B, Hq, Nq, Nk), or None.
    bias: torch.Tensor | None = None


@dataclass(frozen=True)
class AttnResult:
    """out/dq/dk/dv in the layout of the inputs; lse is (batch, heads, seqlen_q) dense or
    (heads, total_q) varlen, float32 or wider, -inf on fully masked rows."""

    out: torch.Tensor
    lse: torch.Tensor
    dq: torch.Tensor | None  # None from a forward-only reference (backward=False)
    dk: torch.Tensor | None
    dv: torch.Tensor | None
    dsink: torch.Tensor | None = None  # (Hq,) with sinks
    dbias: torch.Tensor | None = None  # only for a float bias, in the bias's own shape

    def tensors(self) -> dict[str, torch.Tensor]:
        named = {
            "out": self.out,
            "lse": self.lse,
            "dq": self.dq,
            "dk": self.dk,
            "dv": self.dv,
            "dsink": self.dsink,
            "dbias": self.dbias,
        }
        return {name: t for name, t in named.items() if t is not None}


def _dense(
    q,
    k,
    v,
    dout,
    opts: AttnOptions,
    cd: torch.dtype,
    keep: torch.Tensor | None,
    sink: torch.Tensor | None = None,
    backward: bool = True,
    p_round: torch.dtype | None = None,
    fp8_scores: bool = False,
) -> AttnResult:
    """`backward` False: out and lse only (dq/dk/dv/dsink/dbias None), for a forward-only caller
    (a decode step, the float32 LSE yardstick) that would throw the gradients away. `p_round`: the
    dtype the probabilities are rounded to before P @ V (an fp8 kernel's second GEMM).
    `fp8_scores`: Q K^T accumulated as an fp8 tensor core does (fp8_mma)."""
    b, nq, hq, d = q.shape
    _, nk, hkv, dv_dim = v.shape
    group = hq // hkv
    qh = q.to(cd).transpose(1, 2)  # B, Hq, Nq, D
    kh = k.to(cd).transpose(1, 2).repeat_interleave(group, dim=1)  # B, Hq, Nk, D
    vh = v.to(cd).transpose(1, 2).repeat_interleave(group, dim=1)
    doh = dout.to(cd).transpose(1, 2) if backward else None
    lse_dtype = torch.float64 if cd == torch.float64 else torch.float32
    out = torch.empty(b, hq, nq, dv_dim, dtype=cd, device=q.device)
    lse = torch.empty(b, hq, nq, dtype=lse_dtype, device=q.device)
    if backward:
        dq = torch.empty(b, hq, nq, d, dtype=cd, device=q.device)
        dk = torch.zeros(b, hq, nk, d, dtype=cd, device=q.device)
        dvv = torch.zeros(b, hq, nk, dv_dim, dtype=cd, device=q.device)
    dsink = torch.zeros(hq, dtype=cd, device=q.device) if sink is not None and backward else None
    sink_col = None if sink is None else sink.to(cd).view(1, hq, 1, 1)
    scale = opts.softmax_scale
    rescale = 1.0 / (1.0 - opts.dropout_p) if opts.dropout_p else 1.0
    chunk = max(1, CHUNK_ELEMENTS // max(1, b * hq * nk))
    bias = opts.bias
    float_bias = bias is not None and bias.dtype != torch.bool
    dbias = torch.zeros(bias.shape, dtype=cd, device=q.device) if float_bias and backward else None
    for r0 in range(0, nq, chunk):
        r1 = min(nq, r0 + chunk)
        rows = torch.arange(r0, r1, device=q.device)
        qk = (
            fp8_mma(qh[:, :, r0:r1], kh.transpose(-1, -2)).to(cd)
            if fp8_scores
            else qh[:, :, r0:r1] @ kh.transpose(-1, -2)
        )
        s = qk * scale
        tanh = None
        if opts.softcap:
            tanh = torch.tanh(s / opts.softcap)
            s = tanh * opts.softcap
        if opts.alibi_slopes is not None:
            # In float64: -slope * distance is inexact in float32 for non-dyadic slopes (16+ heads).
            s = s + alibi_bias(opts.alibi_slopes.to(torch.float64), rows, nq, nk).to(cd)
        if bias is not None:
            s = _add_bias(s, bias[:, :, r0:r1], cd)
        allowed = allowed_mask(rows, nq, nk, opts.causal, opts.window)
        if allowed is not None:
            s = s.masked_fill(~allowed, float("-inf"))
        row_max = s.amax(dim=-1, keepdim=True)
        if sink_col is not None:  # the sink is one more column of the softmax (with no value)
            row_max = torch.maximum(row_max, sink_col.expand_as(row_max))
        safe_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
        unnorm = torch.exp(s - safe_max)
        denom = unnorm.sum(dim=-1, keepdim=True)
        if sink_col is not None:
            denom = denom + torch.exp(sink_col - safe_max)
        empty = denom == 0
        p = torch.where(empty, torch.zeros_like(unnorm), unnorm / torch.where(empty, torch.ones_like(denom), denom))
        lse[:, :, r0:r1] = (
            (safe_max + torch.log(denom)).squeeze(-1).to(lse_dtype).masked_fill(empty.squeeze(-1), float("-inf"))
        )
        p = p.to(cd)  # back to the input dtype if a wider bias promoted the scores
        if p_round is not None:  # FA3's fp8 forward multiplies P in e4m3 by V: its own tests' yardstick
            p = p.to(p_round).to(cd)
        pz = p if keep is None else p * keep[:, :, r0:r1].to(cd) * rescale
        out[:, :, r0:r1] = pz @ vh
        if not backward:
            continue
        dpz = doh[:, :, r0:r1] @ vh.transpose(-1, -2)
        dp = dpz if keep is None else dpz * keep[:, :, r0:r1].to(cd) * rescale
        delta = (p * dp).sum(dim=-1, keepdim=True)  # = rowsum(dO * O)
        ds = p * (dp - delta)
        if sink_col is not None:
            p_sink = torch.exp(sink_col - lse[:, :, r0:r1].unsqueeze(-1).to(cd))
            dsink -= (p_sink * delta).sum(dim=(0, 2, 3))
        if dbias is not None:  # the bias is added after the softcap
            dbias[:, :, r0:r1] = reduce_to_bias_shape(ds, tuple(bias.shape))
        if tanh is not None:
            ds = ds * (1 - tanh * tanh)
        dq[:, :, r0:r1] = (ds @ kh) * scale
        dk += (ds.transpose(-1, -2) @ qh[:, :, r0:r1]) * scale
        dvv += pz.transpose(-1, -2) @ doh[:, :, r0:r1]
    if not backward:
        return AttnResult(out=out.transpose(1, 2), lse=lse, dq=None, dk=None, dv=None)
    dk = dk.view(b, hkv, group, nk, d).sum(dim=2)
    dvv = dvv.view(b, hkv, group, nk, dv_dim).sum(dim=2)
    return AttnResult(
        out=out.transpose(1, 2),
        lse=lse,
        dq=dq.transpose(1, 2),
        dk=dk.transpose(1, 2),
        dv=dvv.transpose(1, 2),
        dsink=dsink,
        dbias=dbias,
    )


def _add_bias(s: torch.Tensor, bias: torch.Tensor, cd: torch.dtype) -> torch.Tensor:
    """scores plus a float bias (type-promoted, as PyTorch adds them), or masked by a bool one."""
    if bias.dtype == torch.bool:
        return s.masked_fill(~bias, float("-inf"))
    if cd == torch.float64:
        return s + bias.to(torch.float64)
    return s.to(torch.promote_types(cd, bias.dtype)) + bias


@default_matmul_precision()
def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    opts: AttnOptions,
    compute_dtype: torch.dtype,
    *,
    cu_seqlens: torch.Tensor | None = None,
    dropout_keep: torch.Tensor | list[torch.Tensor] | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    sink: torch.Tensor | None = None,
    backward: bool = True,
    p_round: torch.dtype | None = None,
    fp8_scores: bool = False,
) -> AttnResult:
    """Forward + backward in `compute_dtype`; outputs returned in that dtype (`backward` False:
    forward only, gradients None).

    Dense: q (B, Nq, Hq, D), k (B, Nk, Hkv, D), v (B, Nk, Hkv, Dv), dropout_keep (B, Hq, Nq, Nk).
    Varlen: packed (total, H, D) with cu_seqlens; dropout_keep a list of (1, Hq, n, n) per sequence.
    cu_seqlens_k: the keys' offsets where they differ from the queries' (bottom-right
    alignment within each sequence).
    """
    if cu_seqlens is None:
        return _dense(q, k, v, dout, opts, compute_dtype, dropout_keep, sink, backward, p_round, fp8_scores)
    offsets = cu_seqlens.tolist()
    keys = (cu_seqlens_k if cu_seqlens_k is not None else cu_seqlens).tolist()
    hq = q.shape[1]
    lse_dtype = torch.float64 if compute_dtype == torch.float64 else torch.float32
    out = torch.zeros(q.shape[0], hq, v.shape[-1], dtype=compute_dtype, device=q.device)
    lse = torch.full((hq, q.shape[0]), float("-inf"), dtype=lse_dtype, device=q.device)
    if backward:
        dq = torch.zeros(q.shape, dtype=compute_dtype, device=q.device)
        dk = torch.zeros(k.shape, dtype=compute_dtype, device=q.device)
        dv = torch.zeros(v.shape, dtype=compute_dtype, device=q.device)
    dsink = None if sink is None or not backward else torch.zeros(hq, dtype=compute_dtype, device=q.device)
    bias = opts.bias  # packed (1, H or 1, total_q, total_k): each sequence reads its own block
    float_bias = bias is not None and bias.dtype != torch.bool
    dbias = torch.zeros(bias.shape, dtype=compute_dtype, device=q.device) if float_bias and backward else None
    for i, (a, z, ka, kz) in enumerate(zip(offsets[:-1], offsets[1:], keys[:-1], keys[1:])):
        if z == a:
            continue
        keep = None if dropout_keep is None else dropout_keep[i]
        seq_opts = opts if bias is None else replace(opts, bias=bias[:, :, a:z, ka:kz])
        part = _dense(
            q[a:z][None],
            k[ka:kz][None],
            v[ka:kz][None],
            dout[a:z][None] if backward else None,
            seq_opts,
            compute_dtype,
            keep,
            sink,
            backward,
            p_round,
            fp8_scores,
        )
        out[a:z] = part.out[0]
        lse[:, a:z] = part.lse[0]
        if not backward:
            continue
        dq[a:z], dk[ka:kz], dv[ka:kz] = part.dq[0], part.dk[0], part.dv[0]
        if dsink is not None:
            dsink += part.dsink
        if dbias is not None:
            dbias[:, :, a:z, ka:kz] = part.dbias
    if not backward:
        return AttnResult(out=out, lse=lse, dq=None, dk=None, dv=None)
    return AttnResult(out=out, lse=lse, dq=dq, dk=dk, dv=dv, dsink=dsink, dbias=dbias)


@dataclass(frozen=True)
class DecodeResult:
    """A decode step's answer: out (B, Nq, Hq, Dv) and lse (B, Hq, Nq); -inf where a row sees no key."""

    out: torch.Tensor
    lse: torch.Tensor


@default_matmul_precision()
def decode_reference(
    q: torch.Tensor,
    dense_kv: list[tuple[torch.Tensor, torch.Tensor]],
    opts: AttnOptions,
    compute_dtype: torch.dtype,
    sink: torch.Tensor | None = None,
) -> DecodeResult:
    """Forward of a decode step: batch element b's queries against its own gathered (L_b, Hkv, D)
    keys and values, bottom-right aligned (query i sits at key position L_b - Nq + i), from the
    first key a query may see (`first_visible_key`) on."""
    b, nq, hq, _ = q.shape
    dv_dim = dense_kv[0][1].shape[-1]
    lse_dtype = torch.float64 if compute_dtype == torch.float64 else torch.float32
    out = torch.zeros(b, nq, hq, dv_dim, dtype=compute_dtype, device=q.device)
    lse = torch.full((b, hq, nq), float("-inf"), dtype=lse_dtype, device=q.device)
    for i, (kb, vb) in enumerate(dense_kv):
        # keys before the first one any query sees are never read (bottom-right alignment is kept
        # by a cut on the left): a cache may hold NaN there (nan_before_window)
        first = first_visible_key(nq, kb.shape[0], opts.window)
        kb, vb = kb[first:], vb[first:]
        if kb.shape[0] == 0:
            if sink is not None:  # no key: the sink alone is the denominator, out stays 0
                lse[i] = sink.to(lse_dtype).view(hq, 1).expand(hq, nq)
            continue
        part = _dense(q[i : i + 1], kb[None], vb[None], None, opts, compute_dtype, None, sink, backward=False)
        out[i], lse[i] = part.out[0], part.lse[0]
    return DecodeResult(out=out, lse=lse)
