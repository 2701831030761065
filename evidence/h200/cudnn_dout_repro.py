"""Standalone probe of the SDPA-cuDNN `dout_noncontig` failures of the H200 nightly sweep
(reports/h200/session-2026-12-01c, fanout/sdpa-cudnn-nightly), in plain PyTorch with no attn-gate
code: written after the sweep, run on 2026-12-01d (reports/h200/session-2026-12-01d, call15/cudnn-dout-repro/):
gradients 287-10,944x off whenever dO's strides differ from O's, 1-3.5x when they match.

The sweep (torch 2.11.0+cu130, cuDNN backend) failed dQ/dK/dV by 2-1,000x the bound on all 64 of its
`dout_noncontig` cases that cuDNN ran, all GQA 8/2 at head dims 72 and 128, seqlens 113x203 and
1023x1024, bf16 and fp16, causal or not, whatever the input values. The same shapes with contiguous
dO, or with q/k/v as strided views, passed beside them, and SDPA flash/efficient pass those very
cases. In the pr sweeps several `dout_noncontig` cases passed on cuDNN (MHA, GQA 8/1 and 8/4, head
dims 32/80/104).

What makes the layout special for cuDNN: the gate hands SDPA q/k/v as (B, H, N, D) views of
(B, N, H, D) memory, as flash_attn_func users do, so cuDNN's output O has that stride order
(pytorch #138340), while a `dout_noncontig` dO is (B, H, N, D)-contiguous. Its strides differ from
O's, and cuDNN's backward then "materializes a grad_output with matching strides" (the warning of
pytorch #134001 / #138581; the assert of #176915). This probe runs the same inputs through cuDNN twice,
dO in O's stride order and dO (B, H, N, D)-contiguous, against a float64 math reference, with a bf16
math run as the yardstick, over GQA groups 1/2/4/8 (K/V expanded with repeat_interleave as the gate's
adapter does, so they are contiguous), head dims 32-128 and the sweep's seqlens:

    python3 evidence/h200/cudnn_dout_repro.py        # ~1 min on an H200; OUT= for the JSON

A row whose error ratio (cuDNN error / bf16-math error) is >> 1 only in the mismatched-strides column
puts the failure in cuDNN's handling of a dO whose strides differ from O's, not in the gate.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def grads(backend, q, k, v, dout, causal: bool):
    """out, dq, dk, dv of SDPA on one backend; q/k/v (B, H, N, D) views as the caller built them."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))  # clone keeps the strides
    nq, nk = q.shape[2], k.shape[2]
    mask = None
    if causal:  # bottom-right aligned, as flash_attn_func and the gate's cases
        from torch.nn.attention.bias import causal_lower_right
        mask = causal_lower_right(nq, nk)
    with sdpa_kernel([backend]):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


def inputs(b, nq, nk, h, hkv, d, dtype, seed=0):
    """q (B, H, N, D) view of (B, N, H, D) memory; K/V expanded to H heads (contiguous, as the adapter)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, nq, h, d, device="cuda", dtype=dtype, generator=gen).transpose(1, 2)
    k = torch.randn(b, nk, hkv, d, device="cuda", dtype=dtype, generator=gen).transpose(1, 2)
    v = torch.randn(b, nk, hkv, d, device="cuda", dtype=dtype, generator=gen).transpose(1, 2)
    if hkv != h:
        k, v = k.repeat_interleave(h // hkv, dim=1), v.repeat_interleave(h // hkv, dim=1)
    dout = torch.randn(b, h, nq, d, device="cuda", dtype=dtype, generator=gen)  # (B, H, N, D)-contiguous
    return q, k, v, dout


def row(nq, nk, h, hkv, d, causal, dtype) -> dict:
    q, k, v, dout_bhsd = inputs(2, nq, nk, h, hkv, d, dtype)
    dout_like_o = dout_bhsd.transpose(1, 2).contiguous().transpose(1, 2)  # same values, O's stride order
    gold = grads(SDPBackend.MATH, q.double(), k.double(), v.double(), dout_bhsd.double(), causal)
    low = grads(SDPBackend.MATH, q, k, v, dout_bhsd, causal)
    r = {"nq": nq, "nk": nk, "h": h, "hkv": hkv, "d": d, "causal": causal, "dtype": str(dtype).split(".")[-1]}
    for label, dout in (("dO like O", dout_like_o), ("dO BHSD", dout_bhsd)):
        try:
            got = grads(SDPBackend.CUDNN_ATTENTION, q, k, v, dout, causal)
        except RuntimeError as exc:
            r[label] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
            continue
        r[label] = {name: round((g.double() - ref).abs().max().item() / max((lo.double() - ref).abs().max().item(), 1e-12), 2)
                    for name, g, lo, ref in zip(("out", "dq", "dk", "dv"), got, low, gold)}
    return r


def main() -> None:
    out_dir = Path(os.environ.get("OUT") or "out/h200_cudnn_dout")
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [row(nq, nk, 8, hkv, d, causal, dtype)
            for dtype in (torch.bfloat16, torch.float16)
            for nq, nk in ((113, 203), (1023, 1024), (3, 799))
            for hkv in (8, 4, 2, 1)
            for d in (32, 64, 72, 80, 104, 128)
            for causal in (False, True)
            if not (dtype == torch.float16 and nq == 3)]
    print("cuDNN error / bf16-or-fp16 SDPA-math error, per tensor, dO in O's stride order | dO (B,H,N,D)-contiguous")
    for r in rows:
        cells = []
        for label in ("dO like O", "dO BHSD"):
            v = r[label]
            cells.append(v if isinstance(v, str) else " ".join(f"{n}={v[n]:>7}" for n in ("out", "dq", "dk", "dv")))
        print(f"{r['dtype']} s{r['nq']}x{r['nk']} h{r['h']}/{r['hkv']} d{r['d']:3} causal={r['causal']!s:5} | "
              + " | ".join(cells))
    (out_dir / "cudnn-dout-repro.json").write_text(json.dumps({"schema_version": 1, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
