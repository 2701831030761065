"""Render speed results and speed judgements: a terminal table, Markdown rows, the ratio plot.
Reads PerfResult / PerfJudgement only; decides nothing (gate/speed/rule.py decided)."""

from __future__ import annotations

import math
from pathlib import Path

from gate.speed.runs import PerfResult
from gate.speed.rule import PerfJudgement


def _f(x: float, spec: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def perf_rows(result: PerfResult) -> list[list[str]]:
    rows = []
    for c in result.cases:
        if not c.measured:
            rows.append([c.case_id, c.status, "", "", "", "", "", "", c.reason])
            continue
        for p in result.plan.passes:
            t = c.pass_timing(p)
            if t is None:  # a forward-only case (issue #10) has no backward timing
                continue
            lo, hi = t.ratio_ci
            mem = c.timing.peak_mem_mb.get("candidate", math.nan)
            flags = "THROTTLED" if c.throttled else ""
            if t.spread > 0.1:
                flags = (flags + " noisy").strip()
            rows.append([c.case_id, p, _f(t.candidate_median_ms), _f(t.anchor_median_ms), _f(t.speed_ratio, ".4f"),
                         f"[{_f(lo, '.4f')}, {_f(hi, '.4f')}]", f"{_f(t.noise * 100, '.2f')}%",
                         f"{_f(c.tflops(p), '.1f')} / {_f(c.tflops(p, 'anchor'), '.1f')}"
                         # issue #10: a decode step is memory-bound: achieved GB/s of K/V read (H200 ~4800)
                         + (f"; K/V {_f(c.kv_gbps(), '.0f')} / {_f(c.kv_gbps('anchor'), '.0f')} GB/s" if c.case.entry == "kvcache" else ""),
                         f"{_f(mem, '.0f')} {flags}".strip()])
    return rows


HEADER = ["case", "pass", "ms", "anchor ms", "speed ratio", "95% CI", "noise", "TFLOP/s (kernel/anchor)", "peak MiB / flags"]
# Decode cases (issue #10) add "; K/V <kernel> / <anchor> GB/s" to the TFLOP/s cell.


def print_perf_table(result: PerfResult, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=f"{result.kernel} vs {result.anchor} / {result.suite} ({result.device}, "
                        f"{result.plan.rounds} rounds x {result.plan.calls_per_round} calls): speed ratio = kernel / anchor time")
    for h in HEADER:
        table.add_column(h, justify="left" if h in ("case", "pass") else "right")
    for row in perf_rows(result):
        table.add_row(*row)
    console.print(table)
    for note in result.notes:
        console.print(f"note: {note}")


def perf_markdown(result: PerfResult) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in perf_rows(result)]
    return "\n".join(lines) + "\n"


def plot_speed_ratios(judgements: tuple[PerfJudgement, ...], title: str, path: Path) -> Path:
    """Per case and pass: speed ratio now vs baseline (as change %), with the FAIL threshold."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    js = [j for j in judgements if math.isfinite(j.change)]
    labels = [f"{j.case_id} {j.pass_}" for j in js]
    fig = Figure(figsize=(max(7.0, 0.45 * len(js) + 3), 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    xs = list(range(len(js)))
    colors = ["#d62728" if j.severity.blocks else "#ff7f0e" if j.severity.value == "WARN" else "#2ca02c" for j in js]
    ax.bar(xs, [j.change * 100 for j in js], color=colors, zorder=2, label="change of speed ratio vs baseline (%)")
    ax.scatter(xs, [j.threshold * 100 for j in js], marker="_", s=300, color="black", zorder=3,
               label="FAIL threshold: max(regression_pct, k x noise)")
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("speed ratio now / baseline - 1 (%)  (up = slower)")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    from gate.core.jsonio import save_figure_atomic

    return save_figure_atomic(fig, path)
