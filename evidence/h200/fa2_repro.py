"""Standalone reproduction of the FA2 failures of the H200 pr sweep (issue #10,
reports/h200/session-2026-12-01b/fa2), in plain PyTorch + flash_attn with no attn-gate code, so they
can be reported upstream or ruled out as ours. Needs the FA2 build (.fa2: `python3 .fa2/unpack.py`,
then PYTHONPATH=.fa2) or any flash-attn 2.x wheel.

    PYTHONPATH=.fa2 python3 evidence/h200/fa2_repro.py      # seconds on an H200

Two classes, each shown against two float64 references: the documented semantics, and the semantics
the source implies. If the kernel matches the second to rounding and misses the first, the failure
is the kernel's documented-vs-implemented gap, not the gate's reference.

  1. window (left, -1) with seqlen_q > seqlen_k: the docstring says -1 is an infinite window, but
     csrc/flash_attn/flash_api.cpp (set_params_fprop) turns a negative right side into seqlen_k; with
     bottom-right alignment a query row i then sees keys j <= i + sk - sq + sk only, so the first
     sq - 2 sk rows see nothing (out 0) and the rest lose keys. flash-attention issue #895 (open;
     "it's a bug"). Gate case: bf16-b2-h8/2-s1000x257-d128-win128.-1.
  2. causal + ALiBi: csrc/flash_attn/src/mask.h adds slope * col to the scores when the kernel is
     causal (not local), dropping the row constant -slope * (i + sk - sq) of the documented bias
     -slope * |i + sk - sq - j|. out and the gradients are unchanged (softmax is shift-invariant per
     row), but the returned softmax_lse is the logsumexp of shifted scores: off by +slope * (i + sk - sq),
     ~100 nats at row 200 for slope 0.5. LSEs of chunks with different offsets (ring / split-KV
     merging across calls) then combine wrongly. Gate cases: fp16-...-causal-...-alibi-... (lse).
Writes $OUT/fa2-repro.json (default out/h200_fa2_repro) and prints a table.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch


def reference(q, k, v, scale, allowed, bias=None):
    """float64 attention on (b, s, h, d) tensors with a (sq, sk) boolean mask; rows with no key give
    out 0 and LSE -inf. Returns out (b, sq, h, d) and lse (b, h, sq)."""
    qd, kd, vd = (t.double().transpose(1, 2) for t in (q, k, v))
    s = torch.einsum("bhqd,bhkd->bhqk", qd, kd) * scale
    if bias is not None:
        s = s + bias
    s = s.masked_fill(~allowed, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return torch.einsum("bhqk,bhkd->bhqd", p, vd).transpose(1, 2), lse


def bottom_right_window(sq, sk, left, right, device):
    """Keys j allowed for query i: i + sk - sq - left <= j <= i + sk - sq + right (None = unbounded)."""
    i = torch.arange(sq, device=device)[:, None] + sk - sq
    j = torch.arange(sk, device=device)[None, :]
    ok = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left is not None:
        ok &= j >= i - left
    if right is not None:
        ok &= j <= i + right
    return ok


def window_case(fa, dtype) -> dict:
    b, sq, sk, h, d, left = 2, 1000, 257, 8, 128, 128
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, generator=gen)
    k, v = (torch.randn(b, sk, h, d, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    scale = d ** -0.5
    out, lse, _ = fa.flash_attn_func(q, k, v, softmax_scale=scale, window_size=(left, -1), return_attn_probs=True)
    documented = bottom_right_window(sq, sk, left, None, "cuda")
    implied = bottom_right_window(sq, sk, left, sk, "cuda")  # right = seqlen_k (flash_api.cpp)
    rows = {}
    for name, allowed in (("documented (right unbounded)", documented), ("implied (right = seqlen_k)", implied)):
        ref_out, _ = reference(q, k, v, scale, allowed)
        err = (out.double() - ref_out).abs().amax(dim=(0, 2, 3))  # per query row
        rows[name] = {"max_out_error": err.max().item(), "rows_off_by_1e-2": int((err > 1e-2).sum()),
                      "rows_with_no_key": int((~allowed.any(-1)).sum())}
    return {"case": f"window ({left}, -1), sq {sq} > sk {sk}, {dtype}", "kernel_rows_all_zero":
            int((out.abs().amax(dim=(0, 2, 3)) == 0).sum()), **rows}


def alibi_case(fa, dtype, sq, sk) -> dict:
    b, h, d = 2, 8, 64
    gen = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, generator=gen)
    k, v = (torch.randn(b, sk, h, d, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    slopes = torch.tensor([2.0 ** (-8 * (n + 1) / h) for n in range(h)], device="cuda", dtype=torch.float32)
    scale = d ** -0.5
    out, lse, _ = fa.flash_attn_func(q, k, v, softmax_scale=scale, causal=True, alibi_slopes=slopes,
                                     return_attn_probs=True)
    lse = lse[:, :, :sq].double()
    i = torch.arange(sq, device="cuda")[:, None] + sk - sq
    j = torch.arange(sk, device="cuda")[None, :]
    bias = -slopes.double()[None, :, None, None] * (i - j).abs()[None, None]
    allowed = j <= i
    ref_out, ref_lse = reference(q, k, v, scale, allowed, bias)
    seen = allowed.any(-1)  # rows with at least one key
    shift = slopes.double()[None, :, None] * (i[:, 0].double())[None, None, :]  # slope * (i + sk - sq)
    lse_err = (lse - ref_lse)[..., seen]
    return {"case": f"causal + ALiBi, sq {sq} sk {sk}, {dtype}",
            "max_out_error": (out.double() - ref_out)[:, seen].abs().max().item(),
            "max_lse_error_documented": lse_err.abs().max().item(),
            "max_lse_error_after_shift": (lse_err - shift[..., seen]).abs().max().item()}


def main() -> int:
    import flash_attn as fa

    out_dir = Path(os.environ.get("OUT") or "out/h200_fa2_repro")
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {"flash_attn": fa.__version__, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
               "window": [window_case(fa, dt) for dt in (torch.bfloat16, torch.float16)],
               "alibi": [alibi_case(fa, dt, sq, sk) for dt in (torch.bfloat16, torch.float16)
                         for sq, sk in ((113, 203), (1000, 1000))]}
    (out_dir / "fa2-repro.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"flash_attn {results['flash_attn']}, torch {results['torch']}, {results['gpu']}")
    for r in results["window"]:
        print(f"\n{r['case']}: kernel rows entirely 0: {r['kernel_rows_all_zero']}")
        for name in ("documented (right unbounded)", "implied (right = seqlen_k)"):
            x = r[name]
            print(f"  vs {name:30s} max out error {x['max_out_error']:.3g}, rows off by > 1e-2: "
                  f"{x['rows_off_by_1e-2']}, rows with no key in that mask: {x['rows_with_no_key']}")
    print("\ncase | max out error | max LSE error (documented bias) | max LSE error after + slope*(i+sk-sq)")
    for r in results["alibi"]:
        print(f"{r['case']} | {r['max_out_error']:.3g} | {r['max_lse_error_documented']:.4g} | "
              f"{r['max_lse_error_after_shift']:.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
