"""Inputs for one (case, seed): the same q, k, v, dO on every path (kernel, references).

Values are drawn in float32 on the CPU from a seeded generator, so a case's inputs are the
same on any machine, then rounded to the case dtype once: the references see exactly the rounded
tensors the kernel sees.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gate.core.cases import Case
from gate.attention.bias import make_bias
from gate.attention.masks import alibi_slopes

TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


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
    # issue #16: the case's custom bias (float in the bias dtype, or bool), None without one.
    bias: torch.Tensor | None = None



def make_inputs(case: Case, seed: int, device: str | torch.device) -> AttnInputs:
    dtype = TORCH_DTYPES[case.dtype]
    gen = torch.Generator(device="cpu").manual_seed(seed * 1_000_003 + 17)
    if case.varlen is not None:
        total = sum(case.varlen)
        shapes = [(total, case.heads_q, case.head_dim), (total, case.heads_kv, case.head_dim),
                  (total, case.heads_kv, case.head_dim_v), (total, case.heads_q, case.head_dim_v)]
    else:
        b, nq, nk = case.batch, case.seqlen_q, case.seqlen_k
        shapes = [(b, nq, case.heads_q, case.head_dim), (b, nk, case.heads_kv, case.head_dim),
                  (b, nk, case.heads_kv, case.head_dim_v), (b, nq, case.heads_q, case.head_dim_v)]
    q, k, v, dout = (torch.randn(s, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype) for s in shapes)
    cu = None
    if case.varlen is not None:
        offsets = [0]
        for n in case.varlen:
            offsets.append(offsets[-1] + n)
        cu = torch.tensor(offsets, dtype=torch.int32, device=device)
    slopes = alibi_slopes(case.heads_q).to(device) if case.alibi else None
    bias = make_bias(case, seed, device, bias_dtype(case))  # issue #16: its own generator, q/k/v unchanged
    return AttnInputs(q=q, k=k, v=v, dout=dout, softmax_scale=case.head_dim ** -0.5,
                      alibi_slopes=slopes, cu_seqlens=cu, seqlens=case.varlen, seed=seed, bias=bias)


def bias_dtype(case: Case) -> torch.dtype:
    """issue #16: the dtype of a float bias: the input dtype unless the case asks for fp32."""
    return torch.float32 if case.bias_dtype == "fp32" else TORCH_DTYPES[case.dtype]
