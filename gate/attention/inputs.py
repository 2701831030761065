"""Inputs for one (case, seed): the same q, k, v, dO on every path (kernel, references).

Values are drawn in float32 on the CPU from a seeded generator, so a case's inputs are the
same on any machine, then rounded to the case dtype once: the references see exactly the rounded
tensors the kernel sees.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gate.core.cases import Case
from gate.attention.kvcache import CacheInputs, make_cache_inputs
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
    # issue #10: a kvcache case's cache (q above is the decode step's query), and the learnable
    # sink logits (Hq,) float32 of a case with sinks.
    cache: "CacheInputs | None" = None
    sink: torch.Tensor | None = None



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
    # issue #10: drawn after everything else, so the inputs of older cases are unchanged. A sink
    # logit near log(keys) weighs about as much as all keys together: a kernel that drops it is far off.
    cache = make_cache_inputs(case, q, gen, dtype, device) if case.entry == "kvcache" else None
    sink = None
    if case.sinks:
        sink = (torch.randn(case.heads_q, generator=gen) + float(torch.tensor(float(case.seqlen_k)).log())).to(device)
    return AttnInputs(q=q, k=k, v=v, dout=dout, softmax_scale=case.head_dim ** -0.5,
                      alibi_slopes=slopes, cu_seqlens=cu, seqlens=case.varlen, seed=seed, cache=cache, sink=sink)
