"""Standalone probe of FlexAttention's compile ERRORs in the H200 sweeps, in plain PyTorch with no
attn-gate code: written after the 2026-12-01d recheck, run on 2026-12-01e (reports/h200/session-2026-12-01e,
call15/): all six shapes fail alike with either mask_mod, the control compiles.

Of the 52 flex pr rows that ERRORed in 2026-12-01c's shared-GPU sweep, 15 ran again in 2026-12-01d
with four small processes on the GPU (reports/h200/session-2026-12-01d, recheck/): 12 ERRORed the
same way (11 Inductor `NoValidChoicesError` "No choices exist for backend", 1 "No valid triton
configs ... out of resource" for shared memory), 3 passed (those had been out-of-memory). So these
compile failures are not memory pressure. Open: are they FlexAttention's, for any caller, or do they
follow from how the gate's adapter (gate/kernels/flex.py) writes its mask: a mask_mod reading its
diagonal offset and window sides from captured device tensors (so a new case changes values, not the
traced program)?

This runs each shape twice through `torch.compile(flex_attention, dynamic=False)`, forward and
backward: once with a causal mask_mod in plain Python integers, once with the offset read from a
captured tensor as the adapter does, and prints whether each compiles (and the error's first line):

    python3 evidence/h200/flex_compile_repro.py        # a few minutes of compiling; OUT= for the JSON

Both variants failing puts the ERROR in FlexAttention (compare pytorch #146260: NoValidChoicesError
in flex backward, and #133254 / #180278 for the shared-memory limit); only the captured one failing
puts it in the adapter's way of calling it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

# (label, batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, causal, dtype): rows of the recheck
SHAPES = [
    ("bf16-b2-h16/4-s97-d64-causal", 2, 16, 4, 97, 97, 64, True, torch.bfloat16),
    ("fp16-b2-h16/4-s97-d128-causal", 2, 16, 4, 97, 97, 128, True, torch.float16),
    ("fp16-b2-h8/4-s127-d104-causal", 2, 8, 4, 127, 127, 104, True, torch.float16),
    ("fp16-b2-h8/2-s127-d59-causal", 2, 8, 2, 127, 127, 59, True, torch.float16),
    ("bf16-b4-h32/1-s16x4096-d128-causal", 4, 32, 1, 16, 4096, 128, True, torch.bfloat16),
    ("bf16-b2-h8/2-s113x203-d256", 2, 8, 2, 113, 203, 256, False, torch.bfloat16),
    ("bf16-b2-h16/4-s128-d64-causal (control)", 2, 16, 4, 128, 128, 64, True, torch.bfloat16),
]


def attempt(fn, q, k, v, mask_mod, nq, nk) -> str:
    try:
        block_mask = create_block_mask(mask_mod, None, None, nq, nk, device="cuda") if mask_mod else None
        q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
        out = fn(q, k, v, block_mask=block_mask, enable_gqa=q.shape[1] != k.shape[1])
        out.backward(torch.randn_like(out))
        torch.cuda.synchronize()
        return "ok"
    except Exception as exc:  # the point is which error, if any
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}"


def main() -> None:
    out_dir = Path(os.environ.get("OUT") or "out/h200_flex_compile")
    out_dir.mkdir(parents=True, exist_ok=True)
    fn = torch.compile(flex_attention, dynamic=False)
    rows = []
    for label, b, hq, hkv, nq, nk, d, causal, dtype in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(b, hq, nq, d, device="cuda", dtype=dtype, generator=gen)
        k, v = (torch.randn(b, hkv, nk, d, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
        offset = torch.tensor(nk - nq, device="cuda")
        plain = captured = None
        if causal:
            def plain(bi, h, qi, ki, _o=nk - nq):  # bottom-right causal, the offset a Python int
                return ki <= qi + _o

            def captured(bi, h, qi, ki):  # the same, the offset read from a captured device tensor
                return ki <= qi + offset
        r = {"case": label, "plain mask_mod": attempt(fn, q, k, v, plain, nq, nk),
             "captured-tensor mask_mod": attempt(fn, q, k, v, captured, nq, nk) if causal else "(no mask)"}
        rows.append(r)
        print(f"{label:42} plain: {r['plain mask_mod']:60.60} | captured: {r['captured-tensor mask_mod']:.60}")
    (out_dir / "flex-compile-repro.json").write_text(json.dumps({"schema_version": 1, "torch": torch.__version__,
                                                                "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
