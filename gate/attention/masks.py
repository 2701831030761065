"""Which (query, key) pairs may attend, and the ALiBi bias: flash-attn's conventions, in one place.

Alignment is bottom-right, as in flash-attn: with seqlen_q != seqlen_k, query row i sits at key
position i + seqlen_k - seqlen_q. Causal is the window (-1, 0). A row with no allowed key is
"fully masked": its output is 0 and its gradient contributions are 0.
"""

from __future__ import annotations

import math

import torch


def effective_window(causal: bool, window: tuple[int, int]) -> tuple[int, int]:
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right


def allowed_mask(
    rows: torch.Tensor, seqlen_q: int, seqlen_k: int, causal: bool, window: tuple[int, int]
) -> torch.Tensor | None:
    """Bool (len(rows), seqlen_k): True where query `rows[i]` may see key j; None when all may."""
    left, right = effective_window(causal, window)
    if left < 0 and right < 0:
        return None
    cols = torch.arange(seqlen_k, device=rows.device)
    diag = (rows + seqlen_k - seqlen_q).unsqueeze(-1)  # key position aligned with each query
    allowed = torch.ones(rows.numel(), seqlen_k, dtype=torch.bool, device=rows.device)
    if right >= 0:
        allowed &= cols <= diag + right
    if left >= 0:
        allowed &= cols >= diag - left
    return allowed


def alibi_slopes(heads: int) -> torch.Tensor:
    """The ALiBi paper's geometric slopes (float32, one per query head)."""

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(heads).is_integer():
        slopes = power_of_two(heads)
    else:
        closest = 2 ** math.floor(math.log2(heads))
        slopes = power_of_two(closest) + power_of_two(2 * closest)[0::2][: heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(slopes: torch.Tensor, rows: torch.Tensor, seqlen_q: int, seqlen_k: int) -> torch.Tensor:
    """(H, len(rows), seqlen_k): -slope * |i + seqlen_k - seqlen_q - j|, flash-attn's form."""
    cols = torch.arange(seqlen_k, device=rows.device)
    dist = (rows.unsqueeze(-1) + seqlen_k - seqlen_q - cols).abs()
    return -slopes.to(rows.device).view(-1, 1, 1) * dist.unsqueeze(0)


def dense_bias(
    heads: int,
    seqlen_q: int,
    seqlen_k: int,
    causal: bool,
    window: tuple[int, int],
    slopes: torch.Tensor | None,
    device: torch.device,
    dtype: torch.dtype,
) -> torch.Tensor | None:
    """Additive mask (1 or H, Nq, Nk) with -inf for disallowed pairs plus ALiBi: for kernels that
    only take a bias (SDPA's attn_mask, the custom-bias path). None when nothing is masked."""
    rows = torch.arange(seqlen_q, device=device)
    allowed = allowed_mask(rows, seqlen_q, seqlen_k, causal, window)
    if allowed is None and slopes is None:
        return None
    bias = torch.zeros(1, seqlen_q, seqlen_k, device=device, dtype=torch.float32)
    if slopes is not None:
        bias = bias + alibi_bias(slopes.float(), rows, seqlen_q, seqlen_k)
    if allowed is not None:
        bias = bias.masked_fill(~allowed, float("-inf"))
    return bias.to(dtype)
