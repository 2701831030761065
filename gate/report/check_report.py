"""Render a check's verdict: the terminal table and the Markdown summary. Reads findings only;
decides nothing (gate/compare/sweep_rules.py and gate/compare/findings.py decided).

The Markdown is written once and used three ways: $GITHUB_STEP_SUMMARY, the PR comment, and the
artifact; gate/report/comment.py builds it worst first.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

from gate.compare.baselines import Baseline
from gate.compare.diagnosis import Diagnosis
from gate.compare.findings import Severity, Verdict, fmt, worst_first
from gate.core.files import append_step_summary, safe_name
from gate.core.jsonio import write_json_atomic, write_text_atomic
from gate.core.results import Status, SweepResult
from gate.core.warn import warn
from gate.kernels.capabilities import declared_key
from gate.report import terminal_console, wrap_words
from gate.report.comment import Links, _correctness_clause, _speed_clause, pr_comment
from gate.report.failures import check_lines
from gate.report.known import known_groups
from gate.report.plots import plot_ratios
from gate.report.sweep_report import write_sweep_outputs

# the terminal table's rows: the worst findings in full (at 80 columns a row wraps to 2-4 lines);
# the lines under it name the worst MAX_CASE_LINES failing cases, the findings JSON every finding
MAX_ROWS = 10


def fits(console, table) -> bool:
    """Does `table` fit the console with every cell's longest word whole? (rich breaks words only
    when the columns' minimum widths, each its longest word, add up to more than the width)"""
    from rich.measure import Measurement

    # measured unbounded: rich clamps a measurement to the width it is given
    return Measurement.get(console, console.options.update_width(100_000), table).minimum <= console.width


MAX_LINES_PER_ROW = 3  # a row wrapped further reads as a column of single words


def print_table(console, tables) -> bool:
    """The first of `tables` (widest first) that fits without breaking a word and wraps no row past
    MAX_LINES_PER_ROW lines on average, else the fitting one of fewest lines; False when none fits
    (the lines after it say the same, and the report file has everything)."""
    fitting = [t for t in tables if fits(console, t)]
    if not fitting:
        return False
    heights = [len(console.render_lines(t, console.options, pad=False)) for t in fitting]
    # the title, the borders and the header take about 6 lines of any table
    readable = [t for t, h in zip(fitting, heights) if h <= 6 + MAX_LINES_PER_ROW * max(1, t.row_count)]
    console.print(readable[0] if readable else fitting[heights.index(min(heights))])
    return True


def print_known(verdict: Verdict, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    groups = [g for g in known_groups(verdict) if g.known or g.xpass]
    if not groups:
        return

    def table(columns):
        t = Table(title=escape("known failures (declared in [[tool.attn-gate.known_failures]]; not failures)"))
        for col in columns:
            t.add_column(col)
        for g in groups:
            shown = ", ".join(g.cases[:4]) + (f" (+{len(g.cases) - 4})" if len(g.cases) > 4 else "")
            cells = {
                "entry": f"#{g.entry['index']}",
                "KNOWN cases": escape(f"{len(g.cases)}: {shown}" if g.cases else "0"),
                "KNOWN": str(len(g.cases)),
                "XPASS": str(len(g.xpass)),
                "covers": escape(g.covers),
                "reason": escape(g.entry["reason"]),
                "link": escape(g.entry["link"] or "-"),
            }
            t.add_row(*(cells[c] for c in columns))
        return t

    if not print_table(
        console,
        [
            table(("entry", "KNOWN cases", "XPASS", "covers", "reason", "link")),
            table(("entry", "KNOWN", "XPASS", "covers", "reason")),
        ],
    ):
        for g in groups:
            console.print(
                escape(
                    f"known #{g.entry['index']}: {len(g.cases)} KNOWN, {len(g.xpass)} XPASS, covers "
                    f"{g.covers}: {g.entry['reason']}"
                ),
                highlight=False,
            )


def _plain(markdown: str) -> str:
    return markdown.replace("**", "").replace("`", "")


def skipped_by_reason(sweep: SweepResult) -> list[tuple[str, int]]:
    """SKIP rows counted by their reason's first clause, most first."""
    counts: dict[str, int] = {}
    for c in sweep.cases:
        if c.status is Status.SKIP:
            reason = _first_clause(c.reason or "no reason")
            counts[reason] = counts.get(reason, 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def _first_clause(reason: str) -> str:
    """What a SKIP reason says, short; a declared envelope's refusal counts by the key that
    refused it: "declared gqa = false"."""
    key = declared_key(reason)
    return f"declared {key}" if key else reason.split(";")[0].split(": ")[0].strip()[:60]


MAX_CASE_LINES = 20  # failing-case lines in the terminal; the report file lists every one


def rerun_hint(verdict: Verdict, summary_path=None) -> str:
    """The short rerun: `attn-gate check --last-failed` (it reads the kernel, suite, config and
    cases from the findings JSON of this run), with the --out it was written to and --perf where a
    speed finding blocks; the exact --only regex stays in the report file."""
    parts = ["attn-gate", "check", "--last-failed"]
    if summary_path is not None and Path(summary_path).parent != Path("out"):
        parts += ["--out", str(Path(summary_path).parent)]
    if not verdict.speed.passed:
        parts.append("--perf")
    return " ".join(shlex.quote(p) for p in parts)


def summary_lines(verdict: Verdict, found: Diagnosis, sweep: SweepResult, summary_path=None) -> list[str]:
    """The last lines of a check, as pytest ends a run: one line per failing case, worst first
    (`FAIL <case>  dk 14,121x its bound (NaN in dv)`), what they share, the short rerun command,
    where the Markdown report is, the counts in cases and the verdict with its worst case last."""

    failed, blocking = found.failed, found.blocking
    results = {c.case_id: c for c in sweep.cases}
    passed = sum(1 for c in sweep.cases if c.status is Status.PASS and c.case_id not in blocking)
    skipped = skipped_by_reason(sweep)
    counts = [f"{len(failed)} failed"] + (
        [f"{len(blocking) - len(failed)} inconclusive"] if len(blocking) > len(failed) else []
    )
    known = {f.case_id for f in verdict.findings if f.severity is Severity.KNOWN and f.case_id}
    if known:
        counts.append(f"{len(known)} known (declared upstream bugs)")
    counts.append(f"{passed} passed")
    if skipped:
        counts.append(
            f"{sum(n for _, n in skipped)} skipped ("
            + "; ".join(f"{r}: {n}" for r, n in skipped[:4])
            + ("; ..." if len(skipped) > 4 else "")
            + ")"
        )
    lines = []
    case_lines = check_lines(verdict.findings, results)
    lines += [line.text for line in case_lines[:MAX_CASE_LINES]]
    if len(case_lines) > MAX_CASE_LINES:
        lines.append(f"... and {len(case_lines) - MAX_CASE_LINES} more failing cases (every one: the report below)")
    if found.pattern:
        lines.append(f"pattern: {found.pattern}")
    if blocking:
        lines.append(f"rerun: {rerun_hint(verdict, summary_path)}")
    if summary_path is not None:
        lines.append(f"report: {summary_path}")
    lines.append(f"cases: {', '.join(counts)} of {len(sweep.cases)}")
    verdict_text = _plain(_correctness_clause(verdict, sweep))
    if verdict.speed.findings:
        verdict_text += "; " + _plain(_speed_clause(verdict))
    lines.append(f"{'PASS' if verdict.passed else 'FAIL'}: {verdict_text}")
    return lines


def print_check(verdict: Verdict, found: Diagnosis, sweep: SweepResult, console=None, summary_path=None) -> None:
    """The terminal view: what needs a human, the thresholds, then the summary lines (the verdict
    last: it is what a CI log shows at the bottom). Case ids are never cut: the other columns wrap."""
    from rich.markup import escape
    from rich.table import Table

    if console is None:
        console = terminal_console()
    # worst first, as in the PR comment: severity, then the size of the error ratio
    shown = sorted((f for f in verdict.findings if f.severity.blocks or f.severity is Severity.WARN), key=worst_first)
    style = {Severity.FAIL: "bold red", Severity.INCONCLUSIVE: "bold red", Severity.WARN: "yellow"}
    if shown:

        def table(columns):
            t = Table(title=f"{sweep.kernel} / {sweep.suite} against its baseline")
            for col in columns:
                t.add_column(
                    col, no_wrap=col == "case", justify="right" if col in ("baseline", "now", "limit") else "left"
                )
            for f in shown[:MAX_ROWS]:
                cells = {
                    "severity": f"[{style[f.severity]}]{f.severity.value}[/]",
                    "case": f.case_id or "(run)",
                    "rule": f.rule,
                    "metric": f.metric,
                    "baseline": escape(fmt(f.baseline)),
                    "now": escape(fmt(f.current)),
                    "limit": fmt(f.threshold),
                    "what": escape(f.detail),
                }
                t.add_row(*(cells[c] for c in columns))
            return t

        # the widest table that fits with whole words and whole case ids; none on a narrow
        # terminal: the lines below name every failing case, and the report file has the rest
        if print_table(
            console,
            [
                table(("severity", "case", "rule", "metric", "baseline", "now", "limit", "what")),
                table(("severity", "case", "metric", "now", "what")),
                table(("case", "what")),
            ],
        ):
            if len(shown) > MAX_ROWS:
                console.print(f"... and {len(shown) - MAX_ROWS} more in the findings JSON")
        else:
            console.print(
                f"({len(shown)} findings: too wide for {console.width} columns; every one is in "
                f"{summary_path or 'the report'})",
                highlight=False,
            )
    print_known(verdict, console)
    thresholds = "thresholds: " + ", ".join(f"{k}={v:g}" for k, v in verdict.thresholds.items())
    for piece in wrap_words(thresholds, console.width):
        console.print(piece, highlight=False, soft_wrap=True)
    lines = summary_lines(verdict, found, sweep, summary_path)
    color = "green" if verdict.passed else "bold red"
    for i, line in enumerate(lines):
        for piece in wrap_words(line, console.width):
            console.print(
                f"[{color}]{escape(piece)}[/]" if i == len(lines) - 1 else escape(piece),
                highlight=False,
                soft_wrap=True,
            )


# what a check of some cases only (--only, --last-failed) adds to its file names (check-K-S.only.md) where
# the folder holds the whole suite's check: a rerun never overwrites the full report
RERUN_SUFFIX = ".only"


def holds_full_check(out_dir: Path, kernel: str, suite: str) -> bool:
    """Does `out_dir` hold the findings of a check of the whole suite (no --only) of this kernel?"""
    path = Path(out_dir) / f"findings-{safe_name(kernel)}-{suite}.json"
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("context", {}).get("scope", "") is None
    except (OSError, ValueError, AttributeError):
        return False


def render_check(
    verdict: Verdict,
    found: Diagnosis,
    sweep: SweepResult,
    baseline: Baseline,
    out_dir: Path,
    console=None,
    extra_markdown: str = "",
) -> dict[str, Path]:
    """The verdict and its diagnosis (`found`: what the failing cases share), decided already, as
    files in `out_dir` (the sweep, findings JSON, Markdown summary and PR comment, ratio plot), then
    as lines on the console; the files' paths by kind."""
    # a rerun of some cases (--only, --last-failed) writes beside the full run's report, not over it
    suffix = RERUN_SUFFIX if not sweep.scope.whole and holds_full_check(out_dir, sweep.kernel, sweep.suite) else ""
    stem = f"{safe_name(sweep.kernel)}-{sweep.suite}{suffix}"
    summary = pr_comment(
        verdict, found, sweep, baseline, Links.from_env(os.environ), extra_markdown
    )  # before any write
    paths = write_sweep_outputs(sweep, out_dir, suffix)
    paths["findings"] = out_dir / f"findings-{stem}.json"
    write_json_atomic(paths["findings"], verdict.to_dict())
    paths["summary"] = out_dir / f"check-{stem}.md"
    write_text_atomic(paths["summary"], summary)
    paths["comment"] = out_dir / f"comment-{stem}.md"  # the PR comment: the same text, under GitHub's limit
    write_text_atomic(paths["comment"], summary)
    try:
        paths["plot"] = plot_ratios(verdict, sweep, baseline, out_dir / f"ratios-{stem}.png")
    except Exception as exc:  # an artifact, not the verdict: say so and go on
        warn(f"the plot was not drawn ({type(exc).__name__}: {exc})")
    append_step_summary(summary)  # the verdict and its files are written already
    print_check(verdict, found, sweep, console, paths["summary"])
    return paths
