"""What the standalone H200 probes share (fa4_long_mask_repro, flex_long_bias_repro, cudnn_dout_order_repro):
each variant runs in a process of its own, because a GPU fault poisons the CUDA context and must not decide the
next variant; the child prints its result as one `ROW {json}` line; and a probed row's error is measured one way.
Plain Python and torch tensors only, no attn-gate code (the probes run plain PyTorch and kernels as users do).
"""

from __future__ import annotations

import json
import subprocess

ROW_PREFIX = "ROW "


def emit(row: dict) -> None:
    """The child's result, on the one stdout line the parent looks for."""
    print(ROW_PREFIX + json.dumps(row), flush=True)


def run_variant(argv: list[str], failed: dict, timeout: float, env: dict | None = None):
    """Run one variant's child process: (its row, the finished process). A child that printed no row gives
    `failed` with an 'error' naming its exit code and last stderr lines; one past `timeout` is killed and
    gives `failed` with the timeout (and no process). The process is returned for callers that keep its
    output (generated code, sanitizer findings)."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {**failed, "error": f"timed out after {timeout:.0f} s"}, None
    found = [ln[len(ROW_PREFIX):] for ln in proc.stdout.splitlines() if ln.startswith(ROW_PREFIX)]
    if found:
        return json.loads(found[0]), proc
    return {**failed, "error": f"exit {proc.returncode}: " + " | ".join(proc.stderr.strip().splitlines()[-3:])[:400]}, proc


def row_error(got, ref) -> float | None:
    """max |got - ref| over the row relative to the reference row's largest entry; the absolute error where
    the reference row is exactly zero (dQ of a row that sees one key); None (printed 'non-finite') where the
    kernel's row holds a NaN or inf. `got` a torch tensor in any dtype, `ref` float64."""
    if not bool(got.isfinite().all()):
        return None
    err, size = float((got.double() - ref).abs().max()), float(ref.abs().max())
    return err / size if size > 0 else err


def first_line(exc: Exception) -> str:
    """An exception as one short line: its type and the first line of its message."""
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
