"""Render a check's verdict: the terminal table and the Markdown summary. Reads findings only;
decides nothing (gate/compare/sweep_rules.py and gate/compare/findings.py decided).

The Markdown is written once and used three ways: $GITHUB_STEP_SUMMARY, the PR comment, and the
artifact; gate/report/comment.py builds it worst first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gate.compare.findings import Finding, Severity, Verdict, fmt, worst_first
from gate.core.results import SweepResult
from gate.report import terminal_console

MAX_ROWS = 60  # terminal table rows; the findings JSON always has everything


@dataclass(frozen=True)
class KnownGroup:
    """One known_failures declaration that applied to the run, with what it covered and what passes now."""

    entry: dict[str, Any]  # verdict.context["known_failures"] item: index, reason, link, cases, tensors ...
    known: tuple[Finding, ...]  # KNOWN findings it covered
    xpass: tuple[Finding, ...]  # its cases that pass now

    @property
    def cases(self) -> list[str]:
        return sorted({f.case_id for f in self.known})

    @property
    def covers(self) -> str:
        return ", ".join(self.entry.get("tensors") or ["any failure"])


def known_groups(verdict: Verdict) -> list[KnownGroup]:
    """The declarations that applied, in file order, each with its KNOWN and XPASS findings."""
    groups = []
    for entry in verdict.context.get("known_failures") or []:
        mine = [f for f in verdict.findings if f.entry == entry["index"]]
        groups.append(KnownGroup(entry, tuple(f for f in mine if f.severity is Severity.KNOWN),
                                 tuple(f for f in mine if f.rule == "xpass")))
    return groups


def print_known(verdict: Verdict, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    groups = [g for g in known_groups(verdict) if g.known or g.xpass]
    if not groups:
        return
    table = Table(title=escape("known failures (declared in [[tool.attn-gate.known_failures]]; not failures)"))
    for col in ("entry", "KNOWN cases", "XPASS", "covers", "reason", "link"):
        table.add_column(col, overflow="fold")
    for g in groups:
        shown = ", ".join(g.cases[:4]) + (f" (+{len(g.cases) - 4})" if len(g.cases) > 4 else "")
        table.add_row(f"#{g.entry['index']}", escape(f"{len(g.cases)}: {shown}" if g.cases else "0"), str(len(g.xpass)),
                      escape(g.covers), escape(g.entry["reason"]), escape(g.entry["link"]))
    console.print(table)


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
    print_known(verdict, console)
    console.print("thresholds: " + ", ".join(f"{k}={v:g}" for k, v in verdict.thresholds.items()), highlight=False)
    console.print("findings: " + ", ".join(f"{n} {k}" for k, n in verdict.counts.items() if n), highlight=False)
    color = "green" if verdict.passed else "bold red"
    console.print(f"[{color}]{escape(verdict.headline)}[/]", highlight=False)
