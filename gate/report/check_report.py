"""Render a check's verdict: the terminal table and the Markdown summary. Reads findings only;
decides nothing (gate/compare/sweep_rules.py and gate/compare/findings.py decided).

The Markdown is written once and used three ways: $GITHUB_STEP_SUMMARY, the PR comment, and the
artifact; gate/report/comment.py builds it worst first.
"""

from __future__ import annotations

from gate.compare.findings import Severity, Verdict, fmt, worst_first
from gate.core.results import SweepResult
from gate.report import terminal_console

MAX_ROWS = 60  # terminal table rows; the findings JSON always has everything


def print_check(verdict: Verdict, sweep: SweepResult, console=None) -> None:
    """The terminal view: what needs a human, the thresholds, the headline last (it is what a CI
    log shows at the bottom)."""
    from rich.markup import escape
    from rich.table import Table

    if console is None:
        console = terminal_console()
    # worst first, as in the PR comment: severity, then the size of the error ratio
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
