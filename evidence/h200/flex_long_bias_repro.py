"""Standalone probe of FlexAttention's illegal memory access at 65,537 keys with a bias (H200,
2026-12-01e), in plain PyTorch with no attn-gate code: written after the sweep, NOT YET RUN on the GPU
(the session's device time was spent).

The flex nightly of 2026-12-01e (reports/h200/session-2026-12-01e) ERRORed both
`bf16-b1-h2-s65537-d64[-causal]-bias.broadcast_1` cases with "CUDA error: an illegal memory access".
FlexAttention reads that bias through a score_mod that captures a (1, 1, S, S) tensor, so the
generated Triton kernels index it at q_idx * S + kv_idx. At S = 65,537 that flat index passes
2**31 - 1, the class of pytorch #190857 (flex backward faults once a flattened K/V offset exceeds
INT32_MAX; fixed by 64-bit offsets). The gate's fa4 and sdpa-cudnn pass the same cases.

The probe needs no float64 reference: a bias constant along each row (bias[q, kv] = q % 7) leaves
softmax unchanged, so out and dQ/dK/dV must equal those of the same call without a score_mod, up to
fp32 rounding; a wrong (wrapped) read mixes other rows' values into a row and changes them, and a
negative one faults. It runs S = 46,340 (S*S < 2**31), 46,341 (S*S > 2**31) and 65,537, causal or
not, each in a process of its own with CUDA_LAUNCH_BLOCKING=1 (a fault poisons the context and is
then reported by the call that made it: forward or backward):

    python3 evidence/h200/flex_long_bias_repro.py        # compiles per size; ~10 GB of GPU memory
    REPRO_SIZES=64,65 REPRO_DEVICE=cpu python3 evidence/h200/flex_long_bias_repro.py   # rehearsal

Expected if the gate's ERRORs are FlexAttention's: the 46,340 rows agree, the rows past 2**31
elements fault or differ.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

DEVICE = os.environ.get("REPRO_DEVICE", "cuda")
SIZES = [int(s) for s in os.environ.get("REPRO_SIZES", "46340,46341,65537").split(",")]
VARIANTS = [(s, causal) for s in SIZES for causal in (False, True)]


def run(seqlen: int, causal: bool) -> dict:
    heads, head_dim, dtype = 2, 64, torch.bfloat16
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    q, k, v = (torch.randn(1, heads, seqlen, head_dim, device=DEVICE, dtype=dtype, generator=gen) for _ in range(3))
    dout = torch.randn(1, heads, seqlen, head_dim, device=DEVICE, dtype=dtype, generator=gen)
    rows = torch.arange(seqlen, device=DEVICE) % 7
    bias = rows.to(dtype)[:, None].expand(seqlen, seqlen).contiguous().view(1, 1, seqlen, seqlen)

    def add_bias(score, b, h, q_idx, kv_idx):
        return score + bias[0, 0, q_idx, kv_idx]

    block_mask = None
    if causal:
        block_mask = create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None, seqlen, seqlen,
                                       device=DEVICE)
    compiled = torch.compile(flex_attention, dynamic=False)
    row = {"seqlen": seqlen, "causal": causal, "flat_bias_elements": seqlen * seqlen,
           "past_int32": seqlen * seqlen > 2**31 - 1}
    results = {}
    grads = DEVICE != "cpu"  # flex has no backward on the CPU: the rehearsal checks the forward only
    for label, mod in (("plain", None), ("bias", add_bias)):
        leaves = [t.clone().requires_grad_(grads) for t in (q, k, v)]
        phase = f"{label} forward"
        try:
            out = compiled(*leaves, score_mod=mod, block_mask=block_mask)
            torch.cuda.synchronize() if DEVICE == "cuda" else None
            phase = f"{label} backward"
            if grads:
                out.backward(dout)
                torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - a fault is the row's finding
            row["error"] = f"{phase}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            return row
        results[label] = [out.detach().float()] + ([t.grad.float() for t in leaves] if grads else [])
    for name, plain, biased in zip(("out", "dq", "dk", "dv"), results["plain"], results["bias"]):
        row[f"{name}_max_diff"] = float((plain - biased).abs().max())
        row[f"{name}_finite"] = bool(torch.isfinite(biased).all())
    return row


def main() -> None:
    if len(sys.argv) > 1:
        print("ROW " + json.dumps(run(*VARIANTS[int(sys.argv[1])])))
        return
    out_dir = Path(os.environ.get("OUT") or "out/h200_flex_long_bias")
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (seqlen, causal) in enumerate(VARIANTS):
        try:
            proc = subprocess.run([sys.executable, __file__, str(i)], capture_output=True, text=True, timeout=300,
                                  env={**os.environ, "CUDA_LAUNCH_BLOCKING": "1"})
        except subprocess.TimeoutExpired:
            rows.append({"seqlen": seqlen, "causal": causal, "error": "timed out after 300 s"})
            continue
        found = [ln[4:] for ln in proc.stdout.splitlines() if ln.startswith("ROW ")]
        rows.append(json.loads(found[0]) if found else
                    {"seqlen": seqlen, "causal": causal,
                     "error": f"exit {proc.returncode}: " + " | ".join(proc.stderr.strip().splitlines()[-3:])[:400]})
    print("flex_attention, bias[q, kv] = q % 7 (softmax-invariant) vs no score_mod: max |difference|")
    for r in rows:
        head = f"S={r['seqlen']:6} {'causal' if r['causal'] else 'full  '}"
        if "error" in r:
            print(f"{head} {r['error']}")
        else:
            print(head + " " + " ".join(f"{n}={r[f'{n}_max_diff']:.3g}" for n in ("out", "dq", "dk", "dv")
                                        if f"{n}_max_diff" in r))
    (out_dir / "flex-long-bias-repro.json").write_text(json.dumps({"schema_version": 1, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
