"""Does SDPA-cuDNN's wrong backward for a dO whose strides differ from O's depend on what ran before?
NOT YET RUN on a GPU (written in 2026-12-01h with too little device time left to start a machine).

Why: cudnn_dout_repro.py (2026-12-01d) found cuDNN's dQ/dK/dV 287-10,944x off with a (B, H, N, D)-contiguous
dO on every configuration it tried, and the gate's nightly failed all 64 of its sdpa-cudnn `dout_noncontig`
cases. But the pr suite's `dout_noncontig` cases pass on cuDNN (the 10 that 2026-12-01 ran, again on
2026-12-01h, ratios <= 0.3), among them a shape the probe found wrong (fp16 s1023x1024 GQA 8/4 d80
causal). The same adapter code ran both sweeps. What differs: the probe runs each shape with dO in O's
stride order first and the contiguous dO second; the nightly runs each `dout_noncontig` shape after the
same shape's other layouts (full products); the pr suite (pairwise) meets each `dout_noncontig` shape
once, in a fresh shape. So the hypothesis: cuDNN (or SDPA's cache of cuDNN graphs) reuses a backward
built for one dO stride order when handed another of the same shapes.

Each ORDER runs in a process of its own (a fresh cache), on the same inputs, calling cuDNN's backward
with dO in the listed stride orders one after another and printing each call's error ratio (cuDNN's
error against float64 / a bf16-or-fp16 SDPA-math run's, the worst of dQ, dK, dV):

    python3 evidence/h200/cudnn_dout_order_repro.py      # ~1 min on an H200; OUT= for the JSON

Reading it. If every order's first call is right and its second wrong, whichever stride order comes
second, the backward is reused across dO stride orders of one shape: that is what a cache keyed on q/k/v
alone would do (PyTorch's cuDNN attention keys its graphs on q/k/v sizes and strides, read in a stored
copy of MHA.cpp, not necessarily 2.11's), and then the bug is the cache's, not a dO stride order cuDNN
cannot take. If "BHSD" is wrong on a first call, it is not the cache.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend

from cudnn_dout_repro import grads, inputs  # sibling: the same inputs and SDPA calls as the first probe
from repro_child import emit, run_variant  # sibling: one process per variant

CONFIGS = [  # (nq, nk, h, hkv, d, causal, dtype): a nightly FAIL shape, the pr PASS shape the probe found wrong, one more
    (113, 203, 8, 2, 72, False, "bfloat16"),
    (1023, 1024, 8, 4, 80, True, "float16"),
    (3, 799, 8, 4, 64, True, "float16"),  # as the pr's fp16-b2-h8/4-s3x799-d64-causal-dout_noncontig-outliers, which passes
]
RUN_TIMEOUT_S = float(os.environ.get("REPRO_RUN_TIMEOUT_S", "60"))  # one (config, order): seconds on an H200
ORDERS = {
    "BHSD first": ("BHSD", "like O", "BHSD"),
    "like O first": ("like O", "BHSD", "like O"),
}


def run_order(config_index: int, order: str) -> dict:
    nq, nk, h, hkv, d, causal, dtype_name = CONFIGS[config_index]
    dtype = getattr(torch, dtype_name)
    q, k, v, dout_bhsd = inputs(2, nq, nk, h, hkv, d, dtype)
    douts = {"BHSD": dout_bhsd, "like O": dout_bhsd.transpose(1, 2).contiguous().transpose(1, 2)}
    gold = grads(SDPBackend.MATH, q.double(), k.double(), v.double(), dout_bhsd.double(), causal)
    low = grads(SDPBackend.MATH, q, k, v, dout_bhsd, causal)
    steps = []
    for label in ORDERS[order]:
        got = grads(SDPBackend.CUDNN_ATTENTION, q, k, v, douts[label], causal)
        ratios = {name: (g.double() - ref).abs().max().item() / max((lo.double() - ref).abs().max().item(), 1e-12)
                  for name, g, lo, ref in zip(("out", "dq", "dk", "dv"), got, low, gold)}
        steps.append({"dout": label, "worst_grad_ratio": round(max(ratios["dq"], ratios["dk"], ratios["dv"]), 2)})
    return {"config": [nq, nk, h, hkv, d, causal, dtype_name], "order": order, "steps": steps}


def main() -> None:
    if len(sys.argv) == 3:  # one (config, order) in this process
        emit(run_order(int(sys.argv[1]), sys.argv[2]))
        return
    out_dir = Path(os.environ.get("OUT") or "out/h200_cudnn_dout_order")
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(len(CONFIGS)):
        for order in ORDERS:
            row, _ = run_variant([sys.executable, __file__, str(i), order], {"config": list(CONFIGS[i]), "order": order},
                                 RUN_TIMEOUT_S)
            rows.append(row)
            cells = row.get("error") or "  then  ".join(f"{s['dout']}: {s['worst_grad_ratio']}" for s in row["steps"])
            print(f"{' '.join(map(str, row['config']))} | {order:12} | {cells}", flush=True)
            (out_dir / "cudnn-dout-order-repro.json").write_text(json.dumps({"schema_version": 1, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
