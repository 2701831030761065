"""Render a check's verdict: the terminal table and the Markdown summary. Reads findings only;
decides nothing (gate/compare/sweep_rules.py and gate/compare/findings.py decided).

The Markdown is written once and used three ways: $GITHUB_STEP_SUMMARY, the PR comment, and the
artifact. Its first line says PASS/FAIL and why; then only the findings that need a human
(blocking, then warnings); everything else (thresholds, every case's ratios against the baseline,
informational findings, the environment) is folded in <details>.
"""

from __future__ import annotations

from gate.compare.baselines import Baseline
from gate.compare.findings import Finding, Severity, Verdict, fmt
from gate.core.results import SweepResult, shown_tensors

MAX_ROWS = 60  # per top table; the findings JSON always has everything
MAX_DETAIL_ROWS = 600  # GitHub comments are capped at 65536 characters


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _findings_table(findings: list[Finding] | tuple[Finding, ...], limit: int) -> list[str]:
    lines = ["| severity | case | rule | metric | baseline | now | limit | what |", "|---|---|---|---|---|---|---|---|"]
    for f in list(findings)[:limit]:
        case = f"`{f.case_id}`" if f.case_id else "(run)"
        lines.append(f"| {f.severity.value} | {case} | {f.rule} | {f.metric} | {_cell(fmt(f.baseline))} | {_cell(fmt(f.current))} "
                     f"| {fmt(f.threshold)} | {_cell(f.detail)} |")
    if len(findings) > limit:
        lines.append(f"\n... and {len(findings) - limit} more in the findings JSON.")
    return lines


THRESHOLD_MEANING = {
    "tolerance_ratio": "FAIL when a tensor's error / bound exceeds this",
    "headroom_factor": "FAIL when a ratio grows by more than this factor ...",
    "headroom_step": "... and by more than this absolute step (also the noise floor of the improvement WARN)",
    "improvement_factor": "WARN (refresh the baseline) when a ratio shrinks by this factor or more",
}


def thresholds_table(verdict: Verdict) -> list[str]:
    lines = ["| threshold | value | meaning |", "|---|---|---|"]
    for key, value in verdict.thresholds.items():
        lines.append(f"| `{key}` | {value:g} | {THRESHOLD_MEANING.get(key, '')} |")
    return lines


def _ratio_cells(sweep: SweepResult, baseline: Baseline) -> list[str]:
    names = shown_tensors(sweep.cases)
    lines = ["| case | status (baseline) | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for c in sweep.cases[:MAX_DETAIL_ROWS]:
        base = baseline.correctness.get(c.case_id)
        cells = []
        for name in names:
            t = c.tensor(name)
            b = base.tensors.get(name) if base else None
            now = "-" if t is None else f"{t.ratio:.2f}"
            cells.append(now if b is None else f"{now} ({b.ratio:.2f})")
        status = c.status.value + (f" ({base.status.value})" if base else " (new)")
        lines.append(f"| `{c.case_id}` | {status} | " + " | ".join(cells) + " |")
    removed = sorted(set(baseline.correctness) - {c.case_id for c in sweep.cases})
    if removed:
        lines.append(f"\nIn the baseline, not in this run: {', '.join(f'`{c}`' for c in removed[:50])}"
                     + (" ..." if len(removed) > 50 else ""))
    return lines


def _details(summary: str, body: list[str]) -> list[str]:
    return ["<details>", f"<summary>{summary}</summary>", "", *body, "", "</details>", ""]


def markdown_summary(verdict: Verdict, sweep: SweepResult, baseline: Baseline) -> str:
    ctx = verdict.context
    blocking = [f for f in verdict.findings if f.severity.blocks]
    warns = list(verdict.of(Severity.WARN))
    infos = list(verdict.of(Severity.INFO))
    lines = [
        f"## attn-gate check: {'PASS' if verdict.passed else 'FAIL'}",
        "",
        f"**{_cell(verdict.headline)}**",
        "",
        f"`{sweep.kernel}` on suite `{sweep.suite}` (GPU class `{baseline.gpu_class}`) against `{ctx.get('baseline', '?')}` "
        f"(measured {baseline.measured_at}); this run started {sweep.started_at}, {len(sweep.cases)} cases"
        + (f", filtered with `--only {ctx['scope']}`" if ctx.get("scope") else "") + ".",
        "",
    ]
    if blocking:
        lines += [f"### Failing ({len(blocking)})", "", *_findings_table(blocking, MAX_ROWS), ""]
    if warns:
        lines += [f"### Warnings ({len(warns)}): passing, but look", "", *_findings_table(warns, MAX_ROWS), ""]
    counts = ", ".join(f"{n} {k}" for k, n in verdict.counts.items() if n)
    lines += _details("Thresholds (<code>[tool.attn-gate.verdict]</code>)", thresholds_table(verdict))
    lines += _details(f"All cases: error ratio now (baseline); findings: {counts}", _ratio_cells(sweep, baseline))
    if infos:
        lines += _details(f"Information ({len(infos)})", _findings_table(infos, MAX_DETAIL_ROWS))
    env_rows = ["| key | baseline | now |", "|---|---|---|"]
    for key in sorted(set(baseline.environment) | {k for k in sweep.environment if k in baseline.environment}):
        env_rows.append(f"| {key} | {_cell(baseline.environment.get(key, '-'))} | {_cell(sweep.environment.get(key, '-'))} |")
    lines += _details("Environment", env_rows)
    return "\n".join(lines).rstrip() + "\n"


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
    shown = [f for f in verdict.findings if f.severity.blocks or f.severity is Severity.WARN]
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
