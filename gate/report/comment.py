"""The PR comment of `attn-gate check`, worst first: what a maintainer reads in ten seconds.

    1. one verdict line (GitHub alert syntax) that names correctness AND speed;
    2. what the failing cases share (dtype, causal, window, head dim ...) and a copy-paste command
       that reruns exactly them (`--only` with an exact regex);
    3. a short table of the worst findings: one row per case (its worst tensor, x bound now vs the
       baseline) and per speed pass (baseline -> now -> change -> limit), worst first;
    4. identical errors grouped, with the traceback tail of one of them;
    5. links: the run's artifacts, the asv graphs of regressed speed passes, the baseline's commit;
    6. everything else folded in <details>, the whole under GitHub's 65,536-character limit.

Pure rendering: reads the Verdict (gate/compare decided), the sweep, the baseline and the links
the workflow gathered; decides nothing.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from typing import Any, Callable, Mapping
from urllib.parse import quote

from gate.compare.baselines import Baseline, env_values
from gate.compare.diagnosis import Diagnosis
from gate.compare.findings import Finding, Half, Rule, Severity, Verdict, fmt
from gate.core.cases import exact_regex
from gate.core.config import SETTINGS
from gate.core.results import CaseResult, Status, SweepResult, shown_tensors
from gate.report.known import known_groups

COMMENT_LIMIT = 65_536  # GitHub's maximum comment body (characters)
RERUN_LIMIT = 4_000  # a longer rerun command is no copy-paste command: the suite is rerun instead
SPEED_ROWS = 100  # every pass of a pr-sized speed suite (33 cases, <= 66 passes) is shown; more are in the JSON
BUDGET = 60_000  # what this comment may use: room for the workflow's own header and footer
TOP_ROWS = 15  # rows of the worst-findings table; the rest is folded
ASV_BENCHMARK = "bench_attention.AttentionSpeed.track_{pass_}_speed_ratio"  # benchmarks/bench_attention.py


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _short(text: str, limit: int = 160) -> str:
    """A table cell's worth of a message: its first sentence, cut at `limit`, never leaving a
    code span open (an odd backtick would swallow the rest of the table)."""
    text = _cell(text)
    head = text.split(". ", 1)[0].split("; ", 1)[0] if len(text) > limit else text
    if len(head) > limit:
        head = head[: limit - 3].rstrip() + "..."
    return head.replace("`", "") if head.count("`") % 2 else head


def _num(value: float) -> str:
    """3 significant digits, thousands separated: 0.152, 48.8, 665, 895,596."""
    if math.isnan(value):
        return "nan"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _x(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{_num(value)} x"


# ---------------------------------------------------------------- links


@dataclass(frozen=True)
class Links:
    """Where a reader goes next. Each is optional; absent ones are not printed."""

    artifacts: str = ""  # the workflow run's page (its artifacts: sweep/findings JSON, plots)
    asv: str = ""  # the published asv site (its index.html folder)
    repository: str = ""  # https://github.com/OWNER/REPO, to link a commit

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Links":
        server, repo, run = (
            env.get("GITHUB_SERVER_URL", ""),
            env.get("GITHUB_REPOSITORY", ""),
            env.get("GITHUB_RUN_ID", ""),
        )
        repository = f"{server}/{repo}" if server and repo else ""
        return cls(
            artifacts=f"{repository}/actions/runs/{run}#artifacts" if repository and run else "",
            asv=env.get("ATTN_GATE_ASV_URL", "").rstrip("/"),
            repository=repository,
        )

    def commit(self, sha: str) -> str:
        """Each commit a baseline names, linked; a baseline joined from two runs names both."""
        if not sha:
            return "unknown (a baseline written before attn-gate recorded commits)"
        shown = []
        for m in re.finditer(r"([0-9a-f]{7,40})(\+dirty)?(?: \(([^)]*)\))?", sha):
            plain, dirty, what = m.groups()
            link = f"[`{plain[:12]}`]({self.repository}/commit/{plain})" if self.repository else f"`{plain[:12]}`"
            shown.append(link + (" (with uncommitted changes)" if dirty else "") + (f" ({what})" if what else ""))
        return "; ".join(shown) if shown else f"`{sha[:40]}`"

    def asv_graph(self, case_id: str, pass_: str, kernel: str = "") -> str:
        """asv's graph page of one speed ratio; its parameters are kernel, anchor and case."""
        if not self.asv:
            return ""
        kernel_param = f"p-kernel={quote(repr(kernel))}&" if kernel else ""
        return f"{self.asv}/#{ASV_BENCHMARK.format(pass_=pass_)}?{kernel_param}p-case={quote(repr(case_id))}"


# ---------------------------------------------------------------- rerun command


def rerun_command(context: Mapping[str, Any], device: str, case_ids: list[str] | None) -> str:
    """`case_ids` None: the whole suite."""
    parts = [
        "attn-gate",
        "check",
        "--kernel",
        str(context.get("kernel")),
        "--suite",
        str(context.get("suite")),
        "--device",
        device,
    ]
    if context.get("baseline_option"):
        parts += ["--baseline", str(context["baseline_option"])]
    config = context.get("config")
    if config and config not in ("defaults", "pyproject.toml"):
        parts += ["--config", str(config)]
    if case_ids is not None:
        parts += ["--only", exact_regex(case_ids)]
    return " ".join(shlex.quote(p) for p in parts)


# ---------------------------------------------------------------- the rows


@dataclass(frozen=True)
class Row:
    rank: int  # severity rank (higher is worse)
    magnitude: float  # within a severity: larger is worse
    cells: tuple[str, ...]


HEADER = ("", "case", "what", "baseline", "now", "change", "limit")


def _case_rows(verdict: Verdict, sweep: SweepResult, baseline: Baseline, severities: set[Severity]) -> list[Row]:
    by_case: dict[str, list[Finding]] = {}
    for f in verdict.findings:
        if f.case_id and f.severity in severities and f.half is Half.CORRECTNESS:
            by_case.setdefault(f.case_id, []).append(f)
    results = {c.case_id: c for c in sweep.cases}
    rows = []
    for cid, fs in by_case.items():
        worst = max(fs, key=lambda f: f.severity.rank)
        c = results.get(cid)
        base = baseline.correctness.get(cid)
        if c is not None and c.status is Status.ERROR:
            continue  # errors are grouped below, with their traceback
        biased = [f for f in fs if f.rule is Rule.MEAN_ERROR]
        if biased and c is not None and all(t.ratio <= 1.0 for t in c.tensors):
            # within every max bound: the row is the mean rule's (the max ratios would read as passing)
            mean = max(biased, key=lambda f: f.current)
            rows.append(
                Row(
                    mean.severity.rank,
                    mean.current,
                    (
                        mean.severity.value,
                        f"`{cid}`",
                        f"{mean.subject.item} mean error / mean bound ({c.status.value})",
                        "-",
                        _x(mean.current),
                        "-",
                        "1 x",
                    ),
                )
            )
            continue
        if c is not None and c.tensors:
            t = max(c.tensors, key=lambda t: -1.0 if math.isnan(t.ratio) else t.ratio)
            magnitude = math.inf if math.isnan(t.ratio) else t.ratio
            b = base.tensors.get(t.tensor) if base else None
            change = (
                f"{_num(t.ratio / b.ratio)}x"
                if b is not None and 0 < b.ratio < math.inf and math.isfinite(t.ratio)
                else "-"
            )
            what = f"{t.tensor} error / bound" + ("" if c.status is Status.PASS else f" ({c.status.value})")
            if worst.rule is Rule.HEADROOM:
                what += ": headroom regression"
            rows.append(
                Row(
                    worst.severity.rank,
                    magnitude,
                    (
                        worst.severity.value,
                        f"`{cid}`",
                        what,
                        _x(b.ratio) if b else "-",
                        _x(t.ratio),
                        change,
                        "1 x" if worst.rule is not Rule.HEADROOM else _x(worst.threshold),
                    ),
                )
            )
        else:
            rows.append(
                Row(
                    worst.severity.rank,
                    0.0,
                    (
                        worst.severity.value,
                        f"`{cid}`",
                        _short(worst.detail),
                        fmt(worst.baseline),
                        fmt(worst.current),
                        "-",
                        "-",
                    ),
                )
            )
    return rows


def _speed_rows(verdict: Verdict, links: Links, severities: set[Severity] | None) -> list[Row]:
    kernel = str(verdict.context.get("kernel", ""))
    rows = []
    for f in verdict.findings:
        if f.half is not Half.SPEED or (severities is not None and f.severity not in severities):
            continue
        pass_ = f.subject.item or "?"
        base, now = f.baseline, f.current
        if isinstance(base, float) and isinstance(now, float) and base > 0:
            change = now / base - 1
            limit = f"{(f.threshold / base - 1) * 100:+.2f}%" if isinstance(f.threshold, float) else "-"
            cells = (
                f.severity.value,
                f"`{f.case_id}` {pass_}" if f.case_id else f"(run) {pass_}",
                "speed ratio (kernel/anchor time)",
                f"{base:.4g}",
                f"{now:.4g}",
                f"**{change * 100:+.2f}%**" if f.severity.blocks else f"{change * 100:+.2f}%",
                limit,
            )
            graph = links.asv_graph(f.case_id, pass_, kernel) if f.case_id and f.severity is not Severity.OK else ""
            if graph:
                cells = cells[:2] + (f"[{cells[2]}]({graph})",) + cells[3:]
            rows.append(Row(f.severity.rank, change, cells))
        else:
            rows.append(
                Row(
                    f.severity.rank,
                    0.0,
                    (
                        f.severity.value,
                        f"`{f.case_id}` {pass_}" if f.case_id else "(run)",
                        _short(f.message),
                        fmt(base),
                        fmt(now),
                        "-",
                        "-",
                    ),
                )
            )
    return rows


def _table(rows: list[Row], limit: int) -> list[str]:
    rows = sorted(rows, key=lambda r: (-r.rank, -r.magnitude, r.cells[1]))
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r.cells) + " |" for r in rows[:limit]]
    if len(rows) > limit:
        lines.append(f"\n{len(rows) - limit} more rows are folded below (and all are in the findings JSON).")
    return lines


# ---------------------------------------------------------------- known failures


def _known_section(verdict: Verdict) -> list[str]:
    """Each declaration that covered a case or now passes: its reason, its upstream link, its cases."""

    groups = [g for g in known_groups(verdict) if g.known or g.xpass]
    if not groups:
        return []
    lines = [
        "### Known failures",
        "",
        "Declared in `[[tool.attn-gate.known_failures]]`: upstream bugs the gate lives with. KNOWN rows do not fail "
        "the check; a failure on anything a declaration does not cover still does.",
        "",
    ]
    for g in groups:
        e = g.entry
        ids = ", ".join(f"`{c}`" for c in g.cases[:8]) + (f" and {len(g.cases) - 8} more" if len(g.cases) > 8 else "")
        what = f"KNOWN in {len(g.cases)} case{'s' * (len(g.cases) != 1)} ({ids})" if g.cases else "KNOWN in no case"
        xpass = ""
        if g.xpass:
            how = "FAIL, strict" if e.get("strict") else "WARN"
            xpass = (
                f"; **XPASS** ({how}) in {len(g.xpass)}: "
                + ", ".join(f"`{f.case_id}`" for f in g.xpass[:8])
                + (" ..." if len(g.xpass) > 8 else "")
                + (" (delete the entry if the fix landed)" if not g.cases else "")
            )
        upstream = f" ([upstream]({e['link']}))" if e["link"] else ""
        lines.append(f"- **#{e['index']}** {_cell(e['reason'])}{upstream}: {what}, covers {_cell(g.covers)}{xpass}")
    return lines + [""]


# ---------------------------------------------------------------- errors


def error_groups(sweep: SweepResult) -> list[tuple[str, list[CaseResult]]]:
    """ERROR rows grouped by their message, largest group first."""
    groups: dict[str, list[CaseResult]] = {}
    for c in sweep.cases:
        if c.status is Status.ERROR:
            groups.setdefault(c.reason or "no message", []).append(c)
    return sorted(groups.items(), key=lambda kv: -len(kv[1]))


def _errors(sweep: SweepResult) -> list[str]:
    lines = []
    for reason, cases in error_groups(sweep):
        ids = ", ".join(f"`{c.case_id}`" for c in cases[:8]) + (f" and {len(cases) - 8} more" if len(cases) > 8 else "")
        lines += [f"**{len(cases)} case{'s' * (len(cases) != 1)} raised** `{_cell(reason)[:200]}`: {ids}", ""]
        tail = next((c.traceback for c in cases if c.traceback), "")
        lines += (
            ["```text", tail[-1500:], "```", ""]
            if tail
            else ["(no traceback recorded: the results file predates traceback tails)", ""]
        )
    return lines


# ---------------------------------------------------------------- the verdict line


def _correctness_clause(verdict: Verdict, sweep: SweepResult) -> str:
    half = verdict.correctness
    blocking = half.blocking
    measured = sum(1 for c in sweep.cases if c.status is not Status.SKIP)
    known = {f.case_id for f in verdict.of(Severity.KNOWN)}
    if half.passed and known:
        return (
            f"correctness **PASS** ({measured} of {len(sweep.cases)} cases measured, all within bounds and baseline "
            f"except {len(known)} KNOWN: declared upstream bugs, see Known failures)"
        )
    if half.passed:
        return f"correctness **PASS** ({measured} of {len(sweep.cases)} cases measured, all within bounds and baseline)"
    failed, inconclusive = half.failed_cases, half.inconclusive_cases
    cases = failed | inconclusive
    worst = max(
        (c for c in sweep.cases if c.case_id in cases and c.tensors),
        key=lambda c: math.inf if math.isnan(c.worst_ratio) else c.worst_ratio,
        default=None,
    )
    errors = sum(1 for c in sweep.cases if c.case_id in cases and c.status is Status.ERROR)
    kind = half.severity.value
    counted = failed if half.severity is Severity.FAIL else inconclusive
    what = (
        f"correctness **{kind}** in {len(counted)} of {len(sweep.cases)} cases"
        if counted
        else f"correctness **{kind}**"
    )
    details = []
    if half.severity is Severity.FAIL and inconclusive:  # fail closed, but not counted as failures: say what they are
        details.append(f"{len(inconclusive)} more INCONCLUSIVE")
    if worst is not None:
        t = max(worst.tensors, key=lambda t: -1.0 if math.isnan(t.ratio) else t.ratio)
        details.append(f"worst `{worst.case_id}`: {t.tensor} at {_x(t.ratio)} its bound")
    if errors:
        details.append(f"{errors} raised an error")
    if not cases:
        details.append(_cell(blocking[0].message)[:160])
    return what + (f" ({'; '.join(details)})" if details else "")


def _speed_clause(verdict: Verdict) -> str:
    half = verdict.speed
    speed = half.findings
    if not speed:
        return "speed not timed (`--perf` times it; on by default on a GPU)"
    judged = [f for f in speed if isinstance(f.baseline, float) and isinstance(f.current, float) and f.baseline > 0]
    blocking = half.blocking
    if blocking:
        worst = max(judged, key=lambda f: f.current / f.baseline, default=None) if judged else None
        tail = (
            f"; worst `{worst.case_id}` {worst.subject.name} {(worst.current / worst.baseline - 1) * 100:+.2f}%"
            if worst is not None
            else f"; {_cell(blocking[0].message)[:120]}"
        )
        return f"speed **{half.severity.value}** in {len(blocking)} of {len(speed)} passes{tail}"
    if not judged:
        message = _cell(speed[0].message).rstrip(".")
        return message if message.startswith("speed") else f"speed not judged: {message}"
    worst = max(judged, key=lambda f: f.current / f.baseline)
    known = sum(1 for f in speed if f.severity is Severity.KNOWN)  # untimed: a declared bug raised
    return (
        f"speed **PASS** ({len(judged)} passes{f', {known} KNOWN (not timed)' if known else ''}; largest change "
        f"`{worst.case_id}` {worst.subject.name} {(worst.current / worst.baseline - 1) * 100:+.2f}%)"
    )


def verdict_line(verdict: Verdict, sweep: SweepResult) -> list[str]:
    alert = "CAUTION" if not verdict.passed else ("WARNING" if verdict.of(Severity.WARN) else "TIP")
    warns = len(verdict.of(Severity.WARN))
    tail = f"; {warns} warning{'s' * (warns != 1)} to look at" if warns else ""
    return [
        f"> [!{alert}]",
        f"> **{'PASS' if verdict.passed else 'FAIL'}**: {_correctness_clause(verdict, sweep)}; {_speed_clause(verdict)}{tail}.",
    ]


# ---------------------------------------------------------------- the comment


# The one threshold that is no setting: the tolerance rule's own bound. Every other threshold's
# meaning is its setting's declaration (gate/core/config.py), as docs/configuration.md prints it.
FIXED_MEANING = {"tolerance_ratio": "FAIL when a tensor's error / bound exceeds this"}


def threshold_meaning(key: str) -> str:
    """A threshold's meaning: the declaration of the verdict or perf setting of that name."""
    if key in FIXED_MEANING:
        return FIXED_MEANING[key]
    declared = SETTINGS.get(f"verdict.{key}") or SETTINGS.get(f"perf.{key}")
    return declared.meaning if declared is not None else ""


def thresholds_table(verdict: Verdict) -> list[str]:
    lines = ["| threshold | value | meaning |", "|---|---|---|"]
    for key, value in verdict.thresholds.items():
        lines.append(f"| `{key}` | {value:g} | {threshold_meaning(key)} |")
    return lines


def _details(summary: str, body: list[str]) -> list[str]:
    return ["<details>", f"<summary>{summary}</summary>", "", *body, "", "</details>", ""]


def _all_findings(findings: list[Finding]) -> list[str]:
    lines = ["| severity | case | rule | metric | baseline | now | limit | what |", "|---|---|---|---|---|---|---|---|"]
    for f in findings:
        lines.append(
            f"| {f.severity.value} | {f'`{f.case_id}`' if f.case_id else '(run)'} | {f.rule} | {f.metric} | "
            f"{_cell(fmt(f.baseline))} | {_cell(fmt(f.current))} | {fmt(f.threshold)} | {_cell(f.detail)} |"
        )
    return lines


def _ratio_cells(sweep: SweepResult, baseline: Baseline) -> list[str]:
    names = shown_tensors(sweep.cases)  # dbias, dsink, k_cache, v_cache where a case has them
    lines = ["| case | status (baseline) | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for c in sweep.cases:
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
        lines.append(
            f"\nIn the baseline, not in this run: {', '.join(f'`{c}`' for c in removed[:50])}"
            + (" ..." if len(removed) > 50 else "")
        )
    return lines


def pr_comment(
    verdict: Verdict,
    found: Diagnosis,
    sweep: SweepResult,
    baseline: Baseline,
    links: Links = Links(),
    speed_markdown: str = "",
    budget: int = BUDGET,
) -> str:
    ctx = verdict.context
    device = sweep.env.device
    device = device if device is not None else "cuda" if baseline.gpu_class != "cpu" else "cpu"
    lines = [f"## attn-gate check: {'PASS' if verdict.passed else 'FAIL'}", "", *verdict_line(verdict, sweep), ""]
    lines.append(
        f"`{sweep.kernel}` on suite `{sweep.suite}` ({baseline.gpu_class}), {len(sweep.cases)} cases"
        + (f" filtered with `--only {ctx['scope']}`" if ctx.get("scope") else "")
        + f"; baseline `{ctx.get('baseline', '?')}` measured {baseline.measured_at} at commit {links.commit(baseline.commit)}."
    )
    lines.append("")

    focus = list(found.focus)
    kind = "failing" if found.failed else "inconclusive"  # the focus is the FAIL cases when there are any
    if found.pattern:
        lines += [f"**What the failing cases share:** {found.pattern}.", ""]
    if focus:
        command = rerun_command(ctx, device, focus)
        if len(command) <= RERUN_LIMIT:
            lines += [
                f"**Rerun exactly the {len(focus)} {kind} case{'s' * (len(focus) != 1)}:**",
                "",
                "```sh",
                command,
                "```",
                "",
            ]
        else:  # thousands of ids make no copy-paste command: rerun the suite (the ids are in the findings JSON)
            lines += [
                f"**Rerun** ({len(focus)} {kind} cases, too many to list in `--only`; their ids are in the "
                f"findings JSON):",
                "",
                "```sh",
                rerun_command(ctx, device, None),
                "```",
                "",
            ]

    worst = _case_rows(verdict, sweep, baseline, {Severity.FAIL, Severity.INCONCLUSIVE, Severity.WARN}) + _speed_rows(
        verdict, links, {Severity.FAIL, Severity.INCONCLUSIVE, Severity.WARN}
    )
    for reason, cases in error_groups(sweep):  # one row per distinct error, above the ratios: nothing was measured
        if any(f.severity.blocks for f in verdict.findings if f.case_id in {c.case_id for c in cases}):
            first = f"`{cases[0].case_id}`" + (f" and {len(cases) - 1} more" if len(cases) > 1 else "")
            worst.append(
                Row(
                    Severity.FAIL.rank,
                    math.inf,
                    ("FAIL", first, f"raised {_short(reason, 120)} (see Errors)", "-", "ERROR", "-", "-"),
                )
            )
    if worst:
        lines += ["### Worst findings", "", *_table(worst, TOP_ROWS), ""]
    run_wide = [f for f in verdict.findings if not f.case_id and f.severity.blocks]
    for f in run_wide:
        lines.append(f"- **{f.severity.value}**: {_cell(f.message)}")
    if run_wide:
        lines.append("")
    lines += _known_section(verdict)
    if error_groups(sweep):
        lines += ["### Errors", "", *_errors(sweep)]
    speed_all = _speed_rows(verdict, links, None)
    if speed_all and any(isinstance(f.baseline, float) for f in verdict.speed.findings):
        lines += [
            "### Speed per pass: baseline -> now",
            "",
            "Speed ratio = kernel time / anchor time (lower is faster); change = now / baseline - 1; "
            "limit = the slowdown that fails.",
            "",
            *_table(speed_all, SPEED_ROWS),
            "",
        ]
    link_items = []
    if links.artifacts:
        link_items.append(f"[run artifacts]({links.artifacts}) (sweep and findings JSON, plots)")
    if links.asv:
        link_items.append(f"[speed history (asv)]({links.asv}/)")
    if link_items:
        lines += ["Links: " + " · ".join(link_items), ""]

    head = "\n".join(lines).rstrip() + "\n\n"
    folded: list[tuple[str, Callable[[], list[str]]]] = [
        (
            "All findings, worst first",
            lambda: _all_findings([f for f in verdict.findings if f.severity is not Severity.OK]),
        ),
        (
            "Thresholds (<code>[tool.attn-gate.verdict]</code>, <code>[tool.attn-gate.perf]</code>)",
            lambda: thresholds_table(verdict),
        ),
        ("All cases: error / bound now (baseline)", lambda: _ratio_cells(sweep, baseline)),
        ("Environment: baseline vs now", lambda: _environment(baseline, sweep)),
    ]
    if speed_markdown.strip():
        folded.insert(1, ("Speed measurements (ms, CI, noise, TFLOP/s)", lambda: speed_markdown.strip().splitlines()))
    if len(worst) > TOP_ROWS:
        folded.insert(0, (f"All {len(worst)} rows of the worst-findings table", lambda: _table(worst, len(worst))))
    body = head
    omitted = []
    for title, make in folded:
        block = "\n".join(_details(title, make()))
        if len(body) + len(block) + 300 <= budget:
            body += block + "\n"
        else:
            omitted.append(title)
    if omitted:
        body += (
            f"\n_Left out to stay under GitHub's {COMMENT_LIMIT:,}-character comment limit: {', '.join(omitted)}; "
            f"they are in the findings JSON artifact._\n"
        )
    return body.rstrip() + "\n"


def _environment(baseline: Baseline, sweep: SweepResult) -> list[str]:
    rows = ["| key | baseline | now |", "|---|---|---|"]
    for key in sorted(set(baseline.environment) | {k for k in sweep.environment if k != "git_commit"}):
        b, n = baseline.env.value(key), sweep.env.value(key)
        b, n = "-" if b is None else b, "-" if n is None else n
        mark = (
            ""
            if b == "-" or str(b) == str(n)
            else " (one of the baseline's)"
            if str(n) in env_values(b)
            else " **(changed)**"
        )
        rows.append(f"| {key}{mark} | {_cell(b)} | {_cell(n)} |")
    return rows
