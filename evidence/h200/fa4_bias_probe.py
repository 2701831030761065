"""Probe: does FA4's custom bias / mask path (issue #16, gate/kernels/fa4_mods.py) compile and pass on the H200?

Prints a table (no report committed yet: its output is what the first H200 run of the FA4 bias
path says; the rows go to reports/h200/ once they have been read).

    PYTHONPATH=. python3 evidence/h200/fa4_bias_probe.py        # < 150 s; files in $OUT/fa4-bias (or out/fa4-bias)

Runs nine of the pr suite's bias cases through the gate's own path (`python3 -m gate sweep
--kernel fa4 --suite pr --device cuda --only ...`, isolated worker, float64 reference), chosen to
touch every piece of the adapter once: score_mod over a bf16 / fp32 bias, each broadcast pattern
but broadcast_b, causal and Nq != Nk, fp16 inputs with the shifted-logit rows, GQA (pack-GQA head
index) with a window; mask_mod with causal folded in, empty rows, a window folded into a
head-broadcast document mask; and one bias_grad case, which must be SKIPPED (FA4's backward
returns no gradient for an aux tensor) without reaching the kernel. Each config compiles its own
FA4 forward and backward (about 4-7 s each on the H200 in sweep-fa4-pr.json); the sweep is
killed at 140 s and what it finished is read back from the journal.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(os.environ.get("OUT") or "out") / "fa4-bias"
TIMEOUT_S = 140
EXPECTED = {  # case id -> the status it should have
    "bf16-b2-h8-s1088-d128-bias.dense": "PASS",
    "bf16-b2-h8-s257x704-d128-causal-bias.broadcast_h": "PASS",
    "bf16-b2-h8-s1088-d128-causal-bias.broadcast_1.fp32": "PASS",
    "fp16-b2-h8-s1088-d128-bias.shifted_rows.fp32": "PASS",
    "bf16-b2-h8/2-s1024-d64-win256.0-bias.dense": "PASS",
    "bf16-b2-h8-s1088-d128-causal-bias.bool_mask": "PASS",
    "bf16-b2-h8-s257x704-d128-bias.bool_empty_rows": "PASS",
    "bf16-b2-h8/2-s1024-d64-win256.0-bias.document": "PASS",
    "bf16-b2-h8-s1088-d128-bias.dense.grad": "SKIP",
}


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _rows() -> dict[str, dict]:
    """The sweep's rows by case id: its JSON report, or the journal when the sweep was cut off."""
    report = OUT / "sweep-fa4-pr.json"
    if report.is_file():
        return {r["case_id"]: r for r in json.loads(report.read_text())["cases"]}
    rows = {}
    journal = OUT / "journal-fa4-pr.jsonl"
    for line in journal.read_text().splitlines() if journal.is_file() else ():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by the kill
        if isinstance(r, dict) and "case_id" in r:
            rows[r["case_id"]] = r
    return rows


def main() -> int:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    print(f"{gpu}; torch {torch.__version__}; flash-attn-4 {_version('flash-attn-4')}; "
          f"nvidia-cutlass-dsl {_version('nvidia-cutlass-dsl')}", flush=True)
    only = "^(" + "|".join(i.replace(".", r"\.") for i in EXPECTED) + ")$"
    cmd = [sys.executable, "-m", "gate", "sweep", "--kernel", "fa4", "--suite", "pr", "--device", "cuda",
           "--only", only, "--no-progress", "--case-timeout", "90", "--out", str(OUT)]
    print("$ " + shlex.join(cmd), flush=True)
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
        rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-3000:]
    except subprocess.TimeoutExpired as exc:
        rc = "timeout"
        tail = ((exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(errors="replace"))[-3000:]
    wall = time.monotonic() - start
    rows = _rows()
    print(f"\nsweep exit {rc} after {wall:.0f} s; {len(rows)} of {len(EXPECTED)} cases recorded\n")
    print(f"{'case':52} {'expect':6} {'got':6} {'worst':>6}  tensors / reason")
    unexpected = 0
    for case_id, want in EXPECTED.items():
        r = rows.get(case_id)
        got = r["status"] if r else "-"
        tensors = (r or {}).get("tensors") or {}
        worst = max((t["ratio"] for t in tensors.values()), default=float("nan"))
        detail = " ".join(f"{n}:{t['ratio']:.2f}" for n, t in tensors.items()) or ((r or {}).get("reason") or "not run")
        if r and r.get("reason") and tensors:
            detail += f"  | {r['reason']}"
        mark = "" if got == want else "  <-- unexpected"
        unexpected += got != want
        print(f"{case_id:52} {want:6} {got:6} {worst:6.2f}  {detail[:160]}{mark}")
    if unexpected:
        print("\nlast lines of the sweep's output:\n" + tail)
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
