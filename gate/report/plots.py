"""The check's picture: per case, the worst error ratio now against the baseline's, the bound
(ratio 1) and the headroom-regression limit. Reads findings and results; decides nothing.

Drawn with matplotlib's Agg canvas directly (no pyplot, no global backend state), so it works on a
headless runner and inside a test process alike.
"""

from __future__ import annotations

import math
from pathlib import Path

from gate.compare.baselines import Baseline
from gate.compare.findings import Severity, Verdict
from gate.core.jsonio import save_figure_atomic
from gate.core.results import SweepResult

COLORS = {"blocks": "#d62728", "WARN": "#ff7f0e", "KNOWN": "#9467bd", "fine": "#2ca02c"}
MAX_CASES = 40  # the worst N cases; a plot of hundreds of cases is unreadable (the tables have them all)
DPI = 150


def _worst_ratio(tensors) -> float:
    values = [t for t in tensors if not math.isnan(t)]
    return max(values) if values else math.nan


def plot_ratios(
    verdict: Verdict, sweep: SweepResult, baseline: Baseline, path: Path, max_cases: int = MAX_CASES
) -> Path:
    """One row per case (the worst `max_cases`, worst at the top): the worst error / bound now
    (filled, coloured by finding) and in the baseline (hollow), on a log axis so 1.2x, 15x and
    665x stay apart; the bound (1) and each case's headroom limit marked; legend outside the data."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    factor = verdict.thresholds.get("headroom_factor", math.nan)
    step = verdict.thresholds.get("headroom_step", math.nan)
    worst_severity: dict[str, Severity] = {}
    for f in verdict.findings:
        if f.case_id and (f.case_id not in worst_severity or f.severity.rank > worst_severity[f.case_id].rank):
            worst_severity[f.case_id] = f.severity
    rows = []
    for c in sweep.cases:
        b = baseline.correctness.get(c.case_id)
        base = _worst_ratio([t.ratio for t in b.tensors.values()]) if b else math.nan
        now = c.worst_ratio if c.tensors else math.nan
        sev = worst_severity.get(c.case_id, Severity.OK)
        rows.append((c.case_id, now, base, sev, c.status.value))
    # worst first: blocking findings, then warnings, then by ratio; unmeasured cases last
    rows.sort(
        key=lambda r: (
            -r[3].rank if r[3].blocks or r[3] is Severity.WARN else 0,
            -(r[1] if math.isfinite(r[1]) else (math.inf if r[1] == math.inf else -1.0)),
        )
    )
    hidden = max(0, len(rows) - max_cases)
    rows = rows[:max_cases][::-1]  # matplotlib draws y from the bottom: the worst ends on top
    ys = list(range(len(rows)))
    floor = 1e-3  # ratios below are drawn at the floor (log axis)
    now = [max(r[1], floor) if math.isfinite(r[1]) else math.nan for r in rows]
    base = [max(r[2], floor) if math.isfinite(r[2]) else math.nan for r in rows]
    colors = [
        COLORS["blocks"]
        if r[3].blocks
        else COLORS["WARN"]
        if r[3] is Severity.WARN
        else COLORS["KNOWN"]
        if r[3] is Severity.KNOWN
        else COLORS["fine"]
        for r in rows
    ]

    fig = Figure(figsize=(12.0, 1.6 + 0.27 * len(rows)), dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for y, n, b in zip(ys, now, base):
        if math.isfinite(n) and math.isfinite(b):
            ax.plot([b, n], [y, y], color="#bbbbbb", linewidth=1, zorder=1)
    ax.scatter(
        base,
        ys,
        facecolors="none",
        edgecolors="black",
        linewidths=1.2,
        s=80,
        zorder=4,
        label="baseline (worst tensor): ring",
    )
    ax.scatter(
        now,
        ys,
        c=colors,
        s=22,
        zorder=3,
        label="now: dot; red fails, orange warns, purple known (declared), green passes",
    )
    limits = [max(r[2] * factor, r[2] + step) if math.isfinite(r[2]) else math.nan for r in rows]
    ax.scatter(
        limits, ys, marker="|", color="grey", s=80, zorder=1, label=f"headroom limit (x{factor:g} and +{step:g})"
    )
    missing = [y for y, r in zip(ys, rows) if math.isnan(r[1])]
    if missing:
        ax.scatter(
            [floor] * len(missing),
            missing,
            marker="x",
            color="grey",
            s=30,
            zorder=3,
            label="not measured (skipped or raised)",
        )
    ax.axvline(1.0, color=COLORS["blocks"], linestyle="--", linewidth=1, label="bound: error / bound = 1")
    ax.set_xscale("log")
    finite = [v for v in now + base + limits if math.isfinite(v)]
    right = max([2.0] + [v * 1.5 for v in finite])
    ax.set_xlim(min([floor * 0.8] + [v * 0.7 for v in finite]), right)
    infinite = [(y, c) for y, r, c in zip(ys, rows, colors) if r[1] == math.inf]
    if infinite:  # an infinite error (NaN or inf in the output): at the right edge, in its severity's colour
        ax.scatter(
            [right / 1.2] * len(infinite),
            [y for y, _ in infinite],
            c=[c for _, c in infinite],
            marker=">",
            s=40,
            zorder=3,
            label="now: infinite error (NaN/inf)",
        )
    ax.set_yticks(ys)
    ax.set_yticklabels([f"{r[0]}  [{r[4]}]" if r[4] != "PASS" else r[0] for r in rows], fontsize=8, family="monospace")
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set_xlabel(f"error / bound of the worst tensor (log scale; <= 1 passes; below {floor:g} drawn at {floor:g})")
    verdict_word = "PASS" if verdict.passed else "FAIL"
    shown = f"the {len(rows)} worst of {len(rows) + hidden} cases" if hidden else f"all {len(rows)} cases"
    ax.set_title(f"{sweep.kernel} / {sweep.suite} on {baseline.gpu_class}: {verdict_word} ({shown})", fontsize=10)
    ax.grid(axis="x", which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()

    return save_figure_atomic(fig, path, bbox_inches="tight")
