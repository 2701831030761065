"""Render a check's verdict: the terminal table and the Markdown summary. Reads findings only;
decides nothing (gate/compare/sweep_rules.py and gate/compare/findings.py decided).

The Markdown is written once and used three ways: $GITHUB_STEP_SUMMARY, the PR comment, and the
artifact; gate/report/comment.py builds it worst first.
"""

from __future__ import annotations

from gate.compare.findings import Severity, Verdict, fmt, worst_first
from gate.core.results import Status, SweepResult
from gate.report import terminal_console
from gate.report.known import known_groups
from gate.report.comment import RERUN_LIMIT, _correctness_clause, _is_speed, _speed_clause, diagnosis, rerun_command

MAX_ROWS = 60  # terminal table rows; the findings JSON always has everything


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
                      escape(g.covers), escape(g.entry["reason"]), escape(g.entry["link"] or "-"))
    console.print(table)


def _plain(markdown: str) -> str:
    return markdown.replace("**", "").replace("`", "")


def skipped_by_reason(sweep: SweepResult) -> list[tuple[str, int]]:
    """SKIP rows counted by their reason's first clause, most first."""
    counts: dict[str, int] = {}
    for c in sweep.cases:
        if c.status is Status.SKIP:
            reason = (c.reason or "no reason").split(";")[0].split(": ")[0].strip()[:60]
            counts[reason] = counts.get(reason, 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def summary_lines(verdict: Verdict, sweep: SweepResult, summary_path=None) -> list[str]:
    """The last lines of a check, as pytest ends a run: counts in cases, the shared pattern, a
    command that reruns exactly the failing cases, where the Markdown report is, and the verdict
    with its worst case last."""

    failed = sorted({f.case_id for f in verdict.findings if f.severity is Severity.FAIL and f.case_id})
    blocking = sorted({f.case_id for f in verdict.findings if f.severity.blocks and f.case_id})
    focus = failed or blocking
    results = {c.case_id: c for c in sweep.cases}
    passed = sum(1 for c in sweep.cases if c.status is Status.PASS and c.case_id not in blocking)
    skipped = skipped_by_reason(sweep)
    counts = [f"{len(failed)} failed"] + ([f"{len(blocking) - len(failed)} inconclusive"] if len(blocking) > len(failed) else [])
    known = {f.case_id for f in verdict.findings if f.severity is Severity.KNOWN and f.case_id}
    if known:
        counts.append(f"{len(known)} known (declared upstream bugs)")
    counts.append(f"{passed} passed")
    if skipped:
        counts.append(f"{sum(n for _, n in skipped)} skipped (" + "; ".join(f"{r}: {n}" for r, n in skipped[:4])
                      + ("; ..." if len(skipped) > 4 else "") + ")")
    lines = [f"cases: {', '.join(counts)} of {len(sweep.cases)}"]
    if focus:
        passing = [c.case for c in sweep.cases if c.case_id not in set(blocking) and c.status is Status.PASS]
        pattern = diagnosis([results[c] for c in focus if c in results], passing)
        if pattern:
            lines.append(f"pattern: {pattern}")
        device = str(sweep.environment.get("device", "cpu"))
        command = rerun_command(verdict.context, device, focus)
        if len(command) > RERUN_LIMIT:
            command = rerun_command(verdict.context, device, None) + "  # too many cases for --only; or --last-failed"
        lines.append(f"rerun: {command}")
    if summary_path is not None:
        lines.append(f"report: {summary_path}")
    verdict_text = _plain(_correctness_clause(verdict, sweep))
    if any(_is_speed(f) for f in verdict.findings):
        verdict_text += "; " + _plain(_speed_clause(verdict))
    lines.append(f"{'PASS' if verdict.passed else 'FAIL'}: {verdict_text}")
    return lines


def print_check(verdict: Verdict, sweep: SweepResult, console=None, summary_path=None) -> None:
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
        table = Table(title=f"{sweep.kernel} / {sweep.suite} against its baseline")
        for col in ("severity", "case", "rule", "metric", "baseline", "now", "limit", "what"):
            if col == "case":
                table.add_column(col, no_wrap=True, min_width=max(len(f.case_id or "(run)") for f in shown[:MAX_ROWS]))
            else:
                table.add_column(col, overflow="fold", justify="right" if col in ("baseline", "now", "limit") else "left")
        for f in shown[:MAX_ROWS]:
            table.add_row(f"[{style[f.severity]}]{f.severity.value}[/]", f.case_id or "(run)", f.rule, f.metric,
                          escape(fmt(f.baseline)), escape(fmt(f.current)), fmt(f.threshold), escape(f.detail))
        console.print(table)
        if len(shown) > MAX_ROWS:
            console.print(f"... and {len(shown) - MAX_ROWS} more in the findings JSON")
    print_known(verdict, console)
    console.print("thresholds: " + ", ".join(f"{k}={v:g}" for k, v in verdict.thresholds.items()), highlight=False)
    lines = summary_lines(verdict, sweep, summary_path)
    for line in lines[:-1]:
        console.print(escape(line), highlight=False, soft_wrap=True)
    color = "green" if verdict.passed else "bold red"
    console.print(f"[{color}]{escape(lines[-1])}[/]", highlight=False, soft_wrap=True)
