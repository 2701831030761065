"""Standalone reproduction of the FA4 failure of the H200 bias probe (issue #16), in plain PyTorch
and FA4 with no attn-gate code, so it can be reported upstream or ruled out as ours.

The probe (reports/h200/session-2026-12-01/fa4-bias) found `bf16-b2-h8/2-s1024-d64-win256.0-bias.dense`
FAIL with dQ NaN/Inf, while the same score_mod passed without a window and GQA, and a window +
GQA case passed through mask_mod. This runs FA4's flash_attn_func with a score_mod that adds a
dense bias read from aux_tensors (the same read as gate/kernels/fa4_mods.py) over four variants -
GQA or not, window (256, 0) or not - plus the window + GQA case with a zero bias and without any
score_mod, and prints whether out / dq / dk / dv are finite.

    PYTHONPATH=<FA4 site> python3 evidence/h200/fa4_window_bias_repro.py    # seconds on an H200 (compiles)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import cutlass
import cutlass.cute as cute
from flash_attn.cute import flash_attn_func


@cute.jit
def add_bias(score, batch_idx, head_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
    bias = aux_tensors[0]
    value = cute.make_rmem_tensor(1, bias.element_type)
    value[0] = bias[batch_idx[0], head_idx[0], q_idx[0], kv_idx[0]]
    return score + value.load().to(cutlass.Float32)


@cute.jit
def pass_grad(grad, score, batch_idx, head_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
    return grad


def run(label: str, hkv: int, window, bias_scale: float | None) -> dict:
    b, s, h, d = 2, 1024, 8, 64
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    k = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    v = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    kwargs = {"causal": False, "window_size": window}
    if bias_scale is not None:
        bias = torch.randn(b, h, s, s, device="cuda", dtype=torch.bfloat16, generator=gen) * bias_scale
        kwargs.update(score_mod=add_bias, score_mod_bwd=pass_grad, aux_tensors=[bias])
    row = {"case": label, "hkv": hkv, "window": list(window), "bias_scale": bias_scale}
    phase = "forward"
    try:
        out = flash_attn_func(q, k, v, **kwargs)
        out = out[0] if isinstance(out, tuple) else out
        torch.cuda.synchronize()
        phase = "backward"
        out.backward(torch.randn_like(out))
        torch.cuda.synchronize()
        row.update({name: bool(torch.isfinite(t).all()) for name, t in
                    (("out", out), ("dq", q.grad), ("dk", k.grad), ("dv", v.grad))})
        row["dq_nonfinite"] = int((~torch.isfinite(q.grad)).sum())
    except Exception as exc:  # noqa: BLE001 - a refusal is a row
        row["error"] = f"{phase}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return row


VARIANTS = [
    ("MHA, no window, bias", 8, (None, None), 2.0),
    ("GQA 8/2, no window, bias", 2, (None, None), 2.0),
    ("MHA, window (256, 0), bias", 8, (256, 0), 2.0),
    ("GQA 8/2, window (256, 0), bias", 2, (256, 0), 2.0),
    ("GQA 8/2, window (256, 0), zero bias", 2, (256, 0), 0.0),
    ("GQA 8/2, window (256, 0), no score_mod", 2, (256, 0), None),
]


def main() -> None:
    """Each variant in a process of its own (an illegal memory access poisons the CUDA context);
    CUDA_LAUNCH_BLOCKING=1 so a fault is reported by the call that made it (forward or backward)."""
    import subprocess
    import sys

    if len(sys.argv) > 1:
        print("ROW " + json.dumps(run(*VARIANTS[int(sys.argv[1])])))
        return
    out_dir = Path(os.environ.get("OUT") or "out/h200_fa4_window_bias")
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, variant in enumerate(VARIANTS):
        proc = subprocess.run([sys.executable, __file__, str(i)], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "CUDA_LAUNCH_BLOCKING": "1"})
        found = [ln[4:] for ln in proc.stdout.splitlines() if ln.startswith("ROW ")]
        rows.append(json.loads(found[0]) if found else
                    {"case": variant[0], "error": f"exit {proc.returncode}: " + " | ".join(proc.stderr.strip().splitlines()[-3:])[:400]})
    for r in rows:
        print(f"{r['case']:42} {r.get('error') or {k: r[k] for k in ('out', 'dq', 'dk', 'dv', 'dq_nonfinite')}}")
    (out_dir / "fa4-window-bias-repro.json").write_text(json.dumps({"schema_version": 1, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
