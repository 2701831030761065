"""The selftest's kill matrix as Markdown: reads a SelftestReport, decides nothing."""

from __future__ import annotations

import math

from gate.compare.selftest import SelftestReport
from gate.core.identity import Environment


def _num(x, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.{digits}g}"


def _or(value: str | None, default: str) -> str:
    return default if value is None else value


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


REFERENCE = (
    "tiled"  # gate/kernels/tiled.py: the built-in kernel the gate plants bugs in where a user kernel cannot host them
)


def headline_parts(r: SelftestReport) -> list[str]:
    """What the selftest showed, kept apart by whose code the bugs were planted in: the gate's own
    teeth (bugs planted in the built-in reference kernel, `tiled`) say nothing about the user's
    kernel; the control and the bugs planted in the user's kernel do."""
    counted = [b for b in r.bugs if b.status.counted]
    own = [b for b in counted if b.host == REFERENCE and r.kernel != REFERENCE]
    theirs = [b for b in counted if b not in own]
    parts = []
    if own:
        parts.append(
            f"gate self-check: {sum(b.killed for b in own)}/{len(own)} planted bugs killed in the built-in "
            f"reference kernel ({REFERENCE}): the gate's own teeth, not a finding about {r.kernel}"
        )
    control = next((c for c in r.controls if c.kernel == r.kernel), None)
    against = (
        [f"control {'PASS' if control.passed else 'FAIL'} ({control.cases} cases measured twice)"] if control else []
    )
    if theirs:
        against.append(f"{sum(b.killed for b in theirs)}/{len(theirs)} planted bugs killed in {r.kernel} itself")
    elif counted:
        against.append(f"no planted bug ran inside {r.kernel}")
    if against:
        parts.append(f"against {r.kernel}: " + "; ".join(against))
    return parts


def selftest_markdown(r: SelftestReport) -> str:
    problems = r.problems()
    headline = "PASS" if not problems else ("INCOMPLETE" if not r.complete else "FAIL")
    env = Environment.from_dict(r.environment)
    tol = r.thresholds.get("tolerance", {})
    ver = r.thresholds.get("verdict", {})
    lines = [
        f"## attn-gate selftest: {headline}",
        "",
        f"`{r.kernel}` on suite `{r.suite}`, device `{r.device}` ({_or(env.gpu_name, '?')}, torch {_or(env.torch, '?')}); "
        f"started {r.started_at}, wall {r.wall_s:.0f} s. Every judgement below is the real gate path (sweep -> check "
        f"against a baseline made in this run -> findings), with this config's thresholds: tolerance mult "
        + ", ".join(f"{k.removeprefix('mult_')} {v:g}" for k, v in tol.items())
        + f"; headroom x{ver.get('headroom_factor', '?')} and +{ver.get('headroom_step', '?')}.",
        "",
    ]
    lines += [f"- {_cell(p)}" for p in headline_parts(r)] + [""]
    if problems:
        lines += ["**Problems:**", ""] + [f"- {_cell(p)}" for p in problems] + [""]
    lines += [
        "### Controls (must pass: a false failure is the worst thing a gate can do)",
        "",
        "| kernel | result | cases measured | skipped | detail | s |",
        "|---|---|---|---|---|---|",
    ]
    for c in r.controls:
        lines.append(
            f"| `{c.kernel}` | {'PASS' if c.passed else '**FAIL**'} | {c.cases} | {c.skipped} | "
            f"{_cell(c.detail) or '-'} | {c.wall_s:.1f} |"
        )
    killed = sum(1 for b in r.bugs if b.killed)
    counted = sum(1 for b in r.bugs if b.status.counted)
    lines += [
        "",
        f"### Kill matrix: {killed} of {counted} planted correctness bugs killed",
        "",
        "| planted bug | planted in | killed? | by rule | on case | metric | ratio (baseline) | cases run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for b in r.bugs:
        status = {
            "KILLED": "yes",
            "SURVIVED": "**SURVIVED**",
            "NOT_EXERCISED": "**not exercised**",
            "NOT_PLANTED": "**not planted**",
            "PENDING": "pending",
            "NOT_APPLICABLE": "not applicable",
        }[b.status.value]
        ratio = f"{_num(b.ratio)} ({_num(b.baseline)})" if b.case_id else "-"
        lines.append(
            f"| `{b.name}`: {_cell(b.what)} | `{b.host}` | {status} | {b.rule or '-'} | "
            f"{f'`{b.case_id}`' if b.case_id else '-'} | {b.metric or '-'} | {ratio} | {b.cases_run}/{b.exercisable} |"
        )
    notes = [b for b in r.bugs if not b.killed]
    if notes:
        lines += ["", "Not killed:", ""] + [f"- `{b.name}` ({b.axis}): {_cell(b.message)}" for b in notes]
    s = r.slowdowns
    lines += ["", "### Planted slowdowns", ""]
    if not s.ran:
        lines.append(s.reason)
    else:
        cal = s.calibration
        if not s.gating:
            lines += [
                "_CPU rehearsal (busy-wait delay, CPU timings): checks the plumbing, measures nothing about GPUs; "
                "not part of the verdict._",
                "",
            ]
        lines += [
            f"Case `{s.case_id}` against anchor `{s.anchor}`; {len({t.rep for t in s.trials})} repetitions "
            f"(planned {s.reps_planned}). Calibration: {cal.get('method', '')}; "
            f"{_num(cal.get('cycles_per_ms'), 6)} cycles/ms; pass times "
            + ", ".join(f"{p} {_num(ms, 4)} ms" for p, ms in cal.get("pass_ms", {}).items())
            + "."
            + (f" {s.reason}." if s.reason else ""),
            "",
            "| pass | smallest caught in every rep | A/A false alarms | "
            + " | ".join(f"+{lv:g}%: caught, measured shift" for lv in s.levels_pct)
            + " |",
            "|---|---|---|" + "---|" * len(s.levels_pct),
        ]
        for p in s.passes():
            alarms, n = s.false_alarms(p)
            smallest = s.smallest_caught(p)
            cells = []
            for lv in s.levels_pct:
                ts = [t for t in s.trials if t.pass_ == p and t.level_pct == lv]
                caught = sum(1 for t in ts if t.severity == "FAIL")
                unsure = sum(1 for t in ts if t.severity == "INCONCLUSIVE")
                cells.append(
                    f"{caught}/{len(ts)}{f' ({unsure} inconclusive)' if unsure else ''}, "
                    f"{s.median_shift(p, lv):+.2f}% (kernel {s.median_shift(p, lv, 'candidate_shift_pct'):+.2f}%)"
                    if ts
                    else "-"
                )
            unsure = s.aa_inconclusive(p)
            lines.append(
                f"| {p} | {'-' if smallest is None else f'+{smallest:g}%'} | {alarms}/{n}"
                f"{f' ({unsure} inconclusive)' if unsure else ''} | " + " | ".join(cells) + " |"
            )
        lines += [
            "",
            "Measured shift: the speed ratio's change against the in-run speed baseline (what the rule judged); "
            "kernel: the kernel's own time change. The planted delay is one extra kernel, so it can measure "
            "above its nominal size on short passes.",
        ]
    if not r.complete:
        lines += ["", "_Partial: the selftest is still running or was cut short._"]
    return "\n".join(lines) + "\n"


def selftest_table(r: SelftestReport) -> str:
    """A short plain-text table for the console and CI logs."""
    rows = [f"{'planted bug':30} {'in':12} {'result':14} {'rule':10} {'ratio':>9}  case"]
    for b in r.bugs:
        rows.append(
            f"{b.name:30} {b.host[:12]:12} {b.status.value:14} {b.rule or '-':10} {_num(b.ratio):>9}  {b.case_id or '-'}"
        )
    s = r.slowdowns
    if s.ran:
        for p in s.passes():
            smallest = s.smallest_caught(p)
            alarms, n = s.false_alarms(p)
            rows.append(
                f"slowdown {p}: smallest caught in every rep {'-' if smallest is None else f'+{smallest:g}%'}; "
                f"A/A false alarms {alarms}/{n}" + ("" if s.gating else " (CPU rehearsal, not a gate)")
            )
    else:
        rows.append(f"slowdowns: {s.reason}")
    return "\n".join(rows)
