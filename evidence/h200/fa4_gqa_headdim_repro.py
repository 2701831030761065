"""Standalone reproduction of the FA4 gradient failures of the H200 pr sweep (reports/h200/session-2026-12-01,
sweeps/fa4-1), in plain PyTorch and FA4 with no attn-gate code. Run on 2026-12-01 (third session,
reports/h200/session-2026-12-01c/fa4-gqa-repro/): it reproduces them (dQ 259-658x the bf16 yardstick at
d72/80/104 for MHA and GQA, dK/dV 374-647x under GQA, ~1-2x at d64/128; d104 non-causal: MLIRError).

The sweep (FA4 4.0.0b36, flash_attn.cute, H200) failed dQ/dK/dV by 20-45x the bound on GQA cases with
head dims off the power-of-two grid, e.g. bf16-b2-h8/2-s1000-d80-causal, bf16-b2-h8/2-s257x1000-d{72,80,104}-causal,
bf16-b2-h8/4-s1x339-d80-causal (MHA and GQA cases at d64/d128 passed). That is the class of
flash-attention PR #2896 (FA4 SM90 wrong dQ at head dims 72/104). This script compares FA4's gradients
with float64 math for GQA and MHA at head dims 64, 72, 80, 104, 128, causal and not, and prints the
max abs error of each gradient next to the same error of a bf16 SDPA math run (the yardstick), so a
ratio >> 1 on the GQA off-grid rows and ~1 elsewhere reproduces it without the gate.

    PYTHONPATH=<FA4 site> python3 evidence/h200/fa4_gqa_headdim_repro.py     # ~1 min on an H200 (compiles)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from flash_attn.cute import flash_attn_func


def grads(fn, q, k, v, dout):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


def sdpa(causal, dtype):
    def run(q, k, v):  # (b, s, h, d) in, enable_gqa for hkv < h; bottom-right causal as FA4 aligns it
        qt, kt, vt = (t.transpose(1, 2).to(dtype) for t in (q, k, v))
        nq, nk = qt.shape[2], kt.shape[2]
        mask = None
        if causal:
            mask = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril(diagonal=nk - nq)
        with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
            o = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=kt.shape[1] != qt.shape[1])
        return o.transpose(1, 2).to(q.dtype)
    return run


def row(h, hkv, d, causal, nq=257, nk=1000, b=2) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, nq, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(b, nk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(b, nk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    dout = torch.randn(b, nq, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    gold = grads(sdpa(causal, torch.float64), q.double(), k.double(), v.double(), dout.double())
    low = grads(sdpa(causal, torch.bfloat16), q, k, v, dout)

    def fa4(q_, k_, v_):
        out = flash_attn_func(q_, k_, v_, causal=causal)
        return out[0] if isinstance(out, tuple) else out

    r = {"h": h, "hkv": hkv, "d": d, "causal": causal, "nq": nq, "nk": nk}
    try:
        got = grads(fa4, q, k, v, dout)
    except Exception as exc:  # noqa: BLE001 - a refusal is a row
        r["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        return r
    for name, g, lo, ka in zip(("out", "dq", "dk", "dv"), gold, low, got):
        yard = (lo.double() - g).abs().max().item()
        err = (ka.double() - g).abs().max().item()
        r[name] = round(err / max(yard, 1e-12), 2)
    return r


def main() -> None:
    out_dir = Path(os.environ.get("OUT") or "out/h200_fa4_gqa_headdim")
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [row(8, hkv, d, causal) for hkv in (8, 2) for d in (64, 72, 80, 104, 128) for causal in (False, True)]
    print("FA4 error / bf16 SDPA-math error, per tensor (>> 1: FA4 worse than a plain bf16 computation)")
    for r in rows:
        print(f"h{r['h']}/{r['hkv']} d{r['d']:3} causal={r['causal']!s:5} "
              + (r.get("error") or " ".join(f"{n}={r[n]:>6}" for n in ("out", "dq", "dk", "dv"))))
    (out_dir / "fa4-gqa-headdim-repro.json").write_text(json.dumps({"schema_version": 1, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
