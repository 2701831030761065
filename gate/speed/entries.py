"""A baseline's speed section (`perf`), as `baseline_entry` (gate/speed/runs.py) writes it and
`judge_perf` reads it, checked before any judgement: pure, no torch, so the baseline's one reader
(gate/compare/baselines.py) validates it with everything else.

    {case_id: {"anchor": str, "host": str, "fwd": {"median", "noise", "n", "samples"}, "bwd": {...}}}

`host`: the short digest of the host that timed the row (gate/core/environment.py host_id); absent in
rows written before hosts were recorded, and '' where the host was unknown: both read as unknown.
"""

from __future__ import annotations

import re
from typing import Any

from gate.core.config import ROUNDS
from gate.core.jsonio import measured_float

PASSES = ("fwd", "bwd")
HOST = re.compile(r"[0-9a-f]{0,64}")  # a hex digest (never a raw serial), '' for unknown
MAX_ROUNDS = ROUNDS  # as [tool.attn-gate.perf] rounds / confirm_rounds


MAX_RATIO = 1e6  # a speed ratio (kernel time / anchor time) beyond this is no measurement
ENTRY_PRECISION = 2e-6  # baseline_entry rounds the median and each sample to 6 decimals


def entry_host(entry: Any) -> str:
    """The host digest a baseline's speed row was timed on ('' unknown)."""
    return str(entry.get("host", "")) if isinstance(entry, dict) else ""


def checked_baseline_perf(perf: Any) -> dict[str, Any] | None:
    """A baseline's speed section, as baseline_entry writes it, checked before any judgement: per
    case an anchor name, the host digest and per pass a median (the median of its samples), a noise, n (the number
    of samples): finite, positive, bounded. A ValueError names the case, pass and field."""
    if perf is None:
        return None
    if not isinstance(perf, dict):
        raise TypeError("perf must be an object keyed by case id, or null")
    for cid, entry in perf.items():
        if not isinstance(entry, dict) or not entry:
            raise ValueError(f"perf[{cid!r}] must be an object with anchor and fwd/bwd")
        unknown = sorted(set(entry) - {"anchor", "host", *PASSES})
        if unknown:
            raise ValueError(
                f"perf[{cid!r}]: unknown key {unknown[0][:40]!r} (known: anchor, host, {', '.join(PASSES)})"
            )
        if not isinstance(entry.get("anchor", ""), str):
            raise TypeError(f"perf[{cid!r}].anchor must be a string")
        host = entry.get("host", "")
        if not isinstance(host, str) or not HOST.fullmatch(host):
            raise ValueError(
                f"perf[{cid!r}].host = {str(host)[:40]!r} must be a lowercase hex digest (or ''): "
                f"re-record the speed section with `attn-gate baseline update --perf`"
            )
        if not any(p in entry for p in PASSES):
            raise ValueError(f"perf[{cid!r}] has no pass ({', '.join(PASSES)}): a speed row without a ratio")
        for p in PASSES:
            if p in entry:
                _check_estimate(entry[p], f"perf[{cid!r}].{p}")
    return perf


def _check_estimate(value: Any, where: str) -> None:
    if not isinstance(value, dict):
        raise TypeError(f"{where} must be an object with median, noise, n, samples")
    median = measured_float(value.get("median"), f"{where}.median", MAX_RATIO)
    noise = measured_float(value.get("noise"), f"{where}.noise", MAX_RATIO)
    n = value.get("n")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_ROUNDS:
        raise ValueError(f"{where}.n = {str(n)[:40]} must be an integer in [1, {MAX_ROUNDS}]")
    if median <= 0 or noise != noise:
        raise ValueError(f"{where}.median = {value.get('median')!r} must be > 0")
    samples = value.get("samples", [])
    if not isinstance(samples, list) or len(samples) not in (0, n):
        raise ValueError(f"{where}.samples must be a list of n = {n} ratios")
    xs = [measured_float(x, f"{where}.samples[{i}]", MAX_RATIO) for i, x in enumerate(samples)]
    if any(x <= 0 for x in xs):
        raise ValueError(f"{where}.samples must be ratios > 0")
    if xs:
        import statistics

        mid = statistics.median(xs)
        if abs(mid - median) > ENTRY_PRECISION + 1e-6 * mid:
            raise ValueError(f"{where}.median = {median!r} is not the median of its samples ({mid:.6g})")
