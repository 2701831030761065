"""Standalone probe of the SDPA mem-efficient FAILs at 65,537 keys with a bias (H200, 2026-12-01d), in
plain PyTorch with no attn-gate code: written after the sweep, run on 2026-12-01e
(reports/h200/session-2026-12-01e, call15/): agreement to bf16 rounding up to S = 65,536, every query row from
~2**32 / S on wrong at 65,537 and 70,000, as expected below.

The nightly recheck of 2026-12-01d (reports/h200/session-2026-12-01d, recheck/) ran the three
`bf16-b1-h2-s65537-d64-*bias*` cases of sdpa-efficient alone for the first time (the shared-GPU sweep
of 2026-12-01c ran out of memory on them) and all three FAILed: out 6.8-24x its bound, dQ up to 8e8x.
The same backend passes 65,537 and 131,072 keys without a bias. That is the class of pytorch #162588
(mem-efficient silently wrong once S > 65536 with an attn_mask; a step exactly at 2**16) and the
fixes proposed in pytorch PR #186075 / #187225: the forward kernel offsets the bias by
`query_start * bias_strideM` in 32-bit arithmetic, which wraps once num_queries * num_keys > 2**32.

The probe needs no float64 reference at 65k x 65k: a boolean mask equal to the causal mask must give
what `is_causal=True` gives (that path builds no bias pointer), bit for bit up to the kernel's own
summation order. So for each S it runs mem-efficient twice, with the mask and with is_causal, the
same dO into both backwards, and prints the largest difference of out/dQ/dK/dV and the first query
row whose output differs by more than 1e-2:

    python3 evidence/h200/efficient_65537_bias_repro.py      # ~1 min, ~15 GB of GPU memory; OUT= for the JSON

Expected if the gate's FAILs are the kernel's: differences at bf16 rounding for S <= 65536 and large
from S = 65537 on, the first bad row near 2**32 / S.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def run(q, k, v, dout, mask=None):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


def row(s: int, d: int = 64, heads: int = 2, dtype=torch.bfloat16) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(1, heads, s, d, device="cuda", dtype=dtype, generator=gen) for _ in range(4))
    idx = torch.arange(s, device="cuda")
    mask = idx[:, None] >= idx[None, :]  # (S, S) bool, the causal mask spelled out: 4.3 GB at 65,537
    del idx
    with_mask = run(q, k, v, dout, mask)
    del mask
    torch.cuda.empty_cache()
    causal = run(q, k, v, dout)
    diffs = {name: (a.float() - b.float()).abs().max().item()
             for name, a, b in zip(("out", "dq", "dk", "dv"), with_mask, causal)}
    bad_rows = ((with_mask[0].float() - causal[0].float()).abs().amax(dim=(0, 1, 3)) > 1e-2).nonzero()
    first = int(bad_rows[0]) if len(bad_rows) else None
    return {"seqlen": s, "head_dim": d, "heads": heads, "dtype": str(dtype).split(".")[-1], "max_abs_diff": diffs,
            "first_bad_row": first, "rows_over_1e-2": int(len(bad_rows)), "2**32/S": 2**32 // s}


def main() -> None:
    out_dir = Path(os.environ.get("OUT") or "out/h200_efficient_65537")
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    print("mem-efficient, attn_mask == causal mask vs is_causal=True: max |difference| per tensor")
    for s in (4096, 65536, 65537, 70000):
        r = row(s)
        rows.append(r)
        m = r["max_abs_diff"]
        print(f"S={s:6} " + " ".join(f"{n}={m[n]:.3g}" for n in ("out", "dq", "dk", "dv"))
              + f" | first output row off by >1e-2: {r['first_bad_row']} ({r['rows_over_1e-2']} rows; 2**32/S = {r['2**32/S']})")
        torch.cuda.empty_cache()
    (out_dir / "efficient-65537-repro.json").write_text(json.dumps({"schema_version": 1, "torch": torch.__version__,
                                                                   "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
