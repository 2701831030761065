"""Render a check's verdict: the terminal table and the Markdown summary. Reads findings only;
decides nothing (gate/compare/sweep_rules.py and gate/compare/findings.py decided).

The Markdown is written once and used three ways: $GITHUB_STEP_SUMMARY, the PR comment, and the
artifact; gate/report/comment.py builds it worst first (#15).
"""

from __future__ import annotations

from gate.compare.baselines import Baseline
from gate.compare.findings import Severity, Verdict, fmt, worst_first
from gate.core.results import SweepResult

MAX_ROWS = 60  # terminal table rows; the findings JSON always has everything


def markdown_summary(verdict: Verdict, sweep: SweepResult, baseline: Baseline, links=None, speed_markdown: str = "") -> str:
    """The summary and PR comment: worst first, everything else folded (gate/report/comment.py)."""
    from gate.report.comment import Links, pr_comment

    return pr_comment(verdict, sweep, baseline, links or Links(), speed_markdown)


def print_check(verdict: Verdict, sweep: SweepResult, console=None) -> None:
    """The terminal view: what needs a human, the thresholds, the headline last (it is what a CI
    log shows at the bottom)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    if console is None:
        console = Console()
        if not console.is_terminal:  # a CI log: rich would fold everything to 80 columns
            console = Console(width=200)
    # worst first, as in the PR comment: severity, then the size of the error ratio (#15)
    shown = sorted((f for f in verdict.findings if f.severity.blocks or f.severity is Severity.WARN), key=worst_first)
    style = {Severity.FAIL: "bold red", Severity.INCONCLUSIVE: "bold red", Severity.WARN: "yellow"}
    if shown:
        table = Table(title=f"{sweep.kernel} / {sweep.suite} against its baseline")
        for col in ("severity", "case", "rule", "metric", "baseline", "now", "limit", "what"):
            table.add_column(col, overflow="fold", justify="right" if col in ("baseline", "now", "limit") else "left")
        for f in shown[:MAX_ROWS]:
            table.add_row(f"[{style[f.severity]}]{f.severity.value}[/]", f.case_id or "(run)", f.rule, f.metric,
                          escape(fmt(f.baseline)), escape(fmt(f.current)), fmt(f.threshold), escape(f.detail))
        console.print(table)
        if len(shown) > MAX_ROWS:
            console.print(f"... and {len(shown) - MAX_ROWS} more in the findings JSON")
    console.print("thresholds: " + ", ".join(f"{k}={v:g}" for k, v in verdict.thresholds.items()), highlight=False)
    console.print("findings: " + ", ".join(f"{n} {k}" for k, n in verdict.counts.items() if n), highlight=False)
    color = "green" if verdict.passed else "bold red"
    console.print(f"[{color}]{escape(verdict.headline)}[/]", highlight=False)
