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
from gate.core.results import SweepResult

COLORS = {"blocks": "#d62728", "WARN": "#ff7f0e", "fine": "#2ca02c"}


def plot_ratios(verdict: Verdict, sweep: SweepResult, baseline: Baseline, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    factor = verdict.thresholds.get("headroom_factor", math.nan)
    step = verdict.thresholds.get("headroom_step", math.nan)
    worst_severity: dict[str, Severity] = {}
    for f in verdict.findings:
        if f.case_id and (f.case_id not in worst_severity or f.severity.rank > worst_severity[f.case_id].rank):
            worst_severity[f.case_id] = f.severity
    ids = [c.case_id for c in sweep.cases]
    xs = range(len(ids))
    now = [c.worst_ratio if c.tensors else math.nan for c in sweep.cases]
    base = []
    for cid in ids:
        b = baseline.correctness.get(cid)
        base.append(max((t.ratio for t in b.tensors.values()), default=math.nan) if b else math.nan)
    colors = []
    for cid in ids:
        sev = worst_severity.get(cid, Severity.OK)
        colors.append(COLORS["blocks"] if sev.blocks else COLORS["WARN"] if sev is Severity.WARN else COLORS["fine"])

    fig = Figure(figsize=(max(10.0, 0.26 * len(ids) + 2), 5.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    shown_now = [min(r, 2.0) if math.isfinite(r) else (2.0 if r == math.inf else math.nan) for r in now]
    ax.scatter(xs, shown_now, c=colors, s=28, zorder=3, label="worst ratio now (red FAIL, orange WARN)")
    ax.scatter(xs, base, facecolors="none", edgecolors="black", s=46, zorder=2, label="worst ratio in baseline")
    limits = [max(b * factor, b + step) if math.isfinite(b) else math.nan for b in base]
    ax.scatter(xs, [min(v, 2.0) for v in limits], marker="_", color="grey", s=90, zorder=1,
               label=f"headroom limit (x{factor:g} and +{step:g})")
    skipped = [i for i, c in enumerate(sweep.cases) if not c.tensors]
    if skipped:
        ax.scatter(skipped, [0.0] * len(skipped), marker="x", color="grey", s=30, zorder=3, label="not measured (skip/error)")
    ax.axhline(1.0, color=COLORS["blocks"], linestyle="--", linewidth=1, label="bound (ratio 1)")
    ax.set_ylim(0, max(1.15, min(2.05, max((r for r in shown_now if math.isfinite(r)), default=1.0) + 0.1)))
    ax.set_xticks(list(xs))
    ax.set_xticklabels(ids, rotation=90, fontsize=6)
    ax.set_ylabel("error / bound (worst tensor, worst seed)")
    verdict_word = "PASS" if verdict.passed else "FAIL"
    ax.set_title(f"{sweep.kernel} / {sweep.suite} on {baseline.gpu_class}: {verdict_word} (ratios above 2 drawn at 2)", fontsize=10, pad=36)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.04), ncol=3, frameon=False)
    fig.tight_layout()
    from gate.core.jsonio import save_figure_atomic

    return save_figure_atomic(fig, path)
