"""Standalone reproduction of the two cuDNN failures of the H200 bias sweep (issue #16), in plain
PyTorch with no attn-gate code, so they can be reported upstream or ruled out as ours.

Produces a printed table (and `cudnn-bias-repro.json` in $OUT, default out/h200_cudnn_bias) for
reports/h200/: per shape, whether SDPA's cuDNN backend returns non-finite values where the math
backend (float32 accumulation) returns finite ones.

    python3 evidence/h200/cudnn_bias_repro.py        # seconds on an H200

  1. out NaN/Inf with an fp32 attn_mask and bf16/fp16 q/k/v (reports/h200/session-2026-11-30b/bias:
     every `bias.*.fp32` case; the class of pytorch PR #191612, cuDNN reading an fp32 mask as bf16);
  2. dQ NaN/Inf when a boolean mask empties whole rows (`bias.bool_empty_rows`; the class of
     pytorch #196678), forward finite.
Written after the sweep; run on 2026-12-01 (reports/h200/session-2026-12-01, bias/cudnn-bias-repro.log): both failures
reproduce.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def attention(backend, q, k, v, mask):
    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def finite(t: torch.Tensor | None) -> bool:
    return t is not None and bool(torch.isfinite(t).all())


def run(label: str, dtype: torch.dtype, mask: torch.Tensor, shape=(2, 8, 1088, 128)) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, generator=gen).requires_grad_() for _ in range(3))
    row = {"case": label, "dtype": str(dtype), "mask_dtype": str(mask.dtype)}
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("math", SDPBackend.MATH)):
        try:
            out = attention(backend, q, k, v, mask)
            dq, = torch.autograd.grad(out, (q,), torch.ones_like(out))
            row[name] = {"out_finite": finite(out), "dq_finite": finite(dq)}
        except RuntimeError as exc:  # a backend that refuses the call: say so, it is not a NaN
            row[name] = {"error": str(exc).splitlines()[0][:160]}
    return row


def main() -> int:
    out_dir = Path(os.environ.get("OUT") or "out/h200_cudnn_bias")
    out_dir.mkdir(parents=True, exist_ok=True)
    b, h, n = 2, 8, 1088
    gen = torch.Generator(device="cuda").manual_seed(1)
    bias = 16.0 * torch.randn((b, h, n, n), device="cuda", generator=gen)  # tens, like a relative-position bias
    empty = torch.rand((b, h, n, n), device="cuda", generator=gen) < 0.3
    empty |= torch.eye(n, dtype=torch.bool, device="cuda")
    empty[:, :, ::5, :] = False  # every 5th query row sees no key
    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        rows.append(run("fp32 bias", dtype, bias))
        rows.append(run("bias in the input dtype", dtype, bias.to(dtype)))
    rows.append(run("bool mask, every 5th row empty", torch.bfloat16, empty))
    (out_dir / "cudnn-bias-repro.json").write_text(json.dumps({"schema_version": 1, "rows": rows}, indent=1))
    for r in rows:
        print(f"{r['case']:<34} {r['dtype']:<15} cudnn {r['cudnn']}  math {r['math']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
