"""Render speed results and speed judgements: a terminal table, Markdown rows, the ratio plot.
Reads PerfResult / PerfJudgement only; decides nothing (gate/speed/rule.py decided)."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

from gate.core.config import PerfConfig
from gate.core.jsonio import save_figure_atomic
from gate.report import terminal_console, wrap_words
from gate.speed.rule import PerfJudgement
from gate.speed.runs import PerfResult


def _f(x: float, spec: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def perf_rows(result: PerfResult) -> list[list[str]]:
    rows = []
    for c in result.cases:
        if not c.measured:
            rows.append([c.case_id, c.label, "", "", "", "", "", "", c.reason])
            continue
        for p in result.plan.passes:
            t = c.pass_timing(p)
            if t is None:  # a forward-only case has no backward timing
                continue
            lo, hi = t.ratio_ci
            mem = c.timing.peak_mem_mb.get("candidate", math.nan)
            flags = "THROTTLED" if c.throttled else ""
            if c.fell_back(result.anchor):
                flags = (flags + f" vs {c.anchor}").strip()
            if t.spread > 0.1:
                flags = (flags + " noisy").strip()
            rows.append(
                [
                    c.case_id,
                    p,
                    _f(t.candidate_median_ms),
                    _f(t.anchor_median_ms),
                    _f(t.speed_ratio, ".4f"),
                    f"[{_f(lo, '.4f')}, {_f(hi, '.4f')}]",
                    f"{_f(t.noise * 100, '.2f')}%",
                    f"{_f(c.tflops(p), '.1f')} / {_f(c.tflops(p, 'anchor'), '.1f')}"
                    # a decode step is memory-bound: achieved GB/s of K/V read (H200 ~4800)
                    + (
                        f"; K/V {_f(c.kv_gbps(), '.0f')} / {_f(c.kv_gbps('anchor'), '.0f')} GB/s"
                        if c.case.entry.kind == "kvcache"
                        else ""
                    ),
                    f"{_f(mem, '.0f')} {flags}".strip(),
                ]
            )
    return rows


HEADER = [
    "case",
    "pass",
    "ms",
    "anchor ms",
    "speed ratio",
    "95% CI",
    "noise",
    "TFLOP/s (kernel/anchor)",
    "peak MiB / flags",
]
# Decode cases add "; K/V <kernel> / <anchor> GB/s" to the TFLOP/s cell.


# what a narrow terminal leaves out, first to last: the ratio, its interval, the noise and the flags stay
OPTIONAL = ("TFLOP/s (kernel/anchor)", "anchor ms", "ms")
CASE, CI, LAST = 0, HEADER.index("95% CI"), len(HEADER) - 1
MIN_CASE = 16  # a case id folds down to this; a terminal narrower still crops the table's right side
MIN_REASON = 20  # an unmeasured case's reason wraps at words in at least this width


def column_layout(rows: list[list[str]], width: int) -> dict[int, int]:
    """Column of HEADER -> its width, for a table `width` wide with every number whole: the
    optional columns leave in OPTIONAL's order until the rest fits, then the interval wraps at its
    comma, then the case id folds. Room left widens the headers, then the last column (flags, or
    an unmeasured case's reason, which may always wrap)."""
    least = {i: column_width(rows, i) for i in range(len(HEADER))}

    def spare() -> int:
        return width - table_width(least)

    for name in OPTIONAL:
        if spare() >= 0:
            break
        del least[HEADER.index(name)]
    if spare() < 0:
        least[CI] = max([len("95%"), *(len(w) for r in rows for w in r[CI].split())])
    if spare() < 0:
        least[CASE] = min(least[CASE], max(MIN_CASE, least[CASE] + spare()))
    for i in least:
        least[i] += max(0, min(len(HEADER[i]) - least[i], spare()))
    least[LAST] += max(0, min(max((len(r[LAST]) for r in rows), default=0) - least[LAST], spare()))
    return least


def table_width(widths: dict[int, int]) -> int:
    return sum(w + 3 for w in widths.values()) + 1  # a cell's padding and its border


def column_width(rows: list[list[str]], i: int) -> int:
    """The narrowest column `i` may be: its widest cell or its header's longest word; the last
    column holds the measured rows' flags whole and an unmeasured row's reason at words."""
    words = max(map(len, HEADER[i].split()))
    if i != LAST:
        return max([words, *(len(r[i]) for r in rows)])
    reason = max((len(w) for r in rows if not r[2] for w in r[i].split()), default=0)
    return max([words, min(reason, MIN_REASON), *(len(r[i]) for r in rows if r[2])])


def print_perf_table(result: PerfResult, console=None) -> None:
    from rich.table import Table

    if console is None:
        console = terminal_console()
    rows = perf_rows(result)
    widths = column_layout(rows, console.width)
    # wider than the terminal only where even a folded case id leaves no room: the table keeps its
    # widths and the terminal crops its right side, rather than rich cutting every number
    total = table_width(widths)
    table = Table(
        title=f"{result.kernel} vs {result.anchor} / {result.suite} ({result.device}, "
        f"{result.plan.rounds} rounds x {result.plan.calls_per_round} calls): speed ratio = kernel / anchor time",
        width=total if total > console.width else None,
    )
    for i, width in widths.items():
        # fixed widths: rich would otherwise shrink a column below its numbers
        header = HEADER[i] if len(HEADER[i]) <= width else "\n".join(textwrap.wrap(HEADER[i], width))
        folds = i == LAST or width < column_width(rows, i)
        table.add_column(header, justify="left" if i <= 1 else "right", width=width, no_wrap=not folds, overflow="fold")
    for row in rows:
        table.add_row(*(row[i] for i in widths))
    console.print(table, crop=True)
    left_out = [h for i, h in enumerate(HEADER) if i not in widths]
    if left_out:
        note = f"note: {console.width} columns leave out {', '.join(left_out)} (a wider terminal shows them)"
        for piece in wrap_words(note, console.width):
            console.print(piece, highlight=False, soft_wrap=True)
    for note in result.notes + ((f"filtered with --only {result.scope.only!r}",) if not result.scope.whole else ()):
        console.print(f"note: {note}")


def perf_markdown(result: PerfResult) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in perf_rows(result)]
    return "\n".join(lines) + "\n"


def rule_sentence(cfg: PerfConfig, device: str) -> str:
    """The speed rule with this run's numbers, for the report."""
    limit = cfg.regression_pct_for(device)
    cross = (
        f" (+{cfg.cross_host_regression_pct:g}% where the baseline's ratio was timed on another host or an unknown one)"
    )
    return (
        f"Each change of a ratio against the baseline comes with its {(1 - cfg.alpha) * 100:g}% confidence interval "
        f"(Hodges-Lehmann, Mann-Whitney): FAIL when the whole interval is above +{limit:g}%"
        f"{' (cpu_regression_pct: timed on a CPU)' if device != 'cuda' else ''}"
        f"{cross if cfg.cross_host_regression_pct > limit else ''}, OK when it is at or below, "
        f"INCONCLUSIVE (fails closed) when it straddles or when there are too few rounds; WARN when the whole "
        f"interval is faster than -{cfg.improvement_pct:g}%."
    )


def speed_section(result: PerfResult, cfg: PerfConfig, device: str, from_files: int = 0) -> str:
    """The check report's speed section: the rule with this run's numbers, then the timings.
    `from_files`: the timings were read from that many perf files (no confirm re-run is possible)."""
    if from_files:
        title = f"### Speed: `{result.kernel}` against anchor `{result.anchor}`, timings from {from_files} perf file(s)"
        rerun = " A file cannot be re-measured, so a FAIL from it is INCONCLUSIVE (fails closed) until a fresh check confirms it."
    else:
        title = (
            f"### Speed: `{result.kernel}` against anchor `{result.anchor}` "
            "(speed ratio = kernel time / anchor time; lower is faster)"
        )
        rerun = (
            f" A FAIL or a straddle is re-measured with {cfg.confirm_rounds} rounds, "
            "and that re-run decides (a FAIL must be confirmed by it)."
        )
    return "\n".join(["", title, "", rule_sentence(cfg, device) + rerun, "", perf_markdown(result)])


def not_timed_section(why: str) -> str:
    """The speed section of a check that timed nothing."""
    return f"\n### Speed\n\nNot timed: {why}.\n"


def plot_speed_ratios(judgements: tuple[PerfJudgement, ...], title: str, path: Path) -> Path:
    """One row per case and pass: the change of the speed ratio against the baseline (%), with its
    confidence interval (Hodges-Lehmann, Mann-Whitney) as error bars, and the
    slowdown that fails (the threshold) marked. Slower is red, faster green; legend outside."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    js = [j for j in judgements if math.isfinite(j.change)]
    js.sort(key=lambda j: j.change)  # the largest slowdown ends on top
    labels = [f"{j.case_id}  {j.pass_}" for j in js]
    fig = Figure(figsize=(11.0, 1.8 + 0.32 * max(len(js), 1)), dpi=150)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ys = list(range(len(js)))
    for y, j in zip(ys, js):
        slower = j.change > 0
        color = (
            "#d62728"
            if j.severity.blocks or (slower and j.severity.value != "OK")
            else "#e377c2"
            if slower
            else "#2ca02c"
        )
        has_ci = math.isfinite(j.ci_low) and math.isfinite(j.ci_high)
        below, above = ((j.change - j.ci_low) * 100, (j.ci_high - j.change) * 100) if has_ci else (0.0, 0.0)
        ax.errorbar(
            [j.change * 100],
            [y],
            xerr=[[below], [above]],
            fmt="o",
            color=color,
            ecolor=color,
            elinewidth=1.5,
            capsize=4,
            markersize=6,
            zorder=3,
        )
    thresholds = [j.threshold * 100 if math.isfinite(j.threshold) else math.nan for j in js]
    ax.scatter(thresholds, ys, marker="|", s=220, color="black", zorder=2)
    ax.axvline(0.0, color="grey", linewidth=0.8)
    # legend entries drawn once, outside the data
    ax.errorbar([], [], xerr=[], fmt="o", color="#d62728", label="slower, flagged (FAIL / INCONCLUSIVE / WARN)")
    ax.errorbar([], [], xerr=[], fmt="o", color="#e377c2", label="slower, within the threshold")
    ax.errorbar([], [], xerr=[], fmt="o", color="#2ca02c", label="faster")
    ax.scatter(
        [], [], marker="|", s=220, color="black", label="regression limit: FAIL when the whole interval is past it"
    )
    ax.plot([], [], color="grey", label="error bar: the change's confidence interval")
    ax.set_yticks(ys)
    ax.set_yticklabels(labels, fontsize=8, family="monospace")
    ax.set_ylim(-0.7, max(len(js), 1) - 0.3)
    ax.set_xlabel("change of the speed ratio (kernel time / anchor time) vs baseline, %   (right = slower)")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()

    return save_figure_atomic(fig, path, bbox_inches="tight")
