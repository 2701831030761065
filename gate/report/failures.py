"""The failing cases of a run as a person reads them: one line per case in pytest's short-summary
style, worst first (`FAIL <case>  dk 14,121x its bound (NaN in dv)`, `FAIL <case>  out mean error
2.5x its mean bound`), and the failing rows
grouped by the case axis they share (input regime, layout, dtype, head dim ...) with counts.

Rendering only: reads results rows (and, for a check, its findings); decides nothing. The group-by
is pandas' over the case axes of every row of the run, so each count is of cases, never of findings.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gate.compare.diagnosis import NO_ANSWER
from gate.compare.findings import Finding, Rule, Severity, fmt
from gate.compare.known import UNATTRIBUTED, failures_of
from gate.core.cases import Case
from gate.core.config import ERROR_NAME, supports_table
from gate.core.results import CaseResult, Status
from gate.report import wrap_lines

# run_case's refusal of an output it could not measure, as the line says it
_SEED = re.compile(r"^seed \d+: ")
_NAN = re.compile(r"^(?P<name>[a-z_]+) contains NaN/Inf")


def ratio_text(value: float) -> str:
    """14,121 / 8.1 / 1.44: three significant digits, thousands separated."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _first_line(reason: str) -> str:
    return _SEED.sub("", (reason or "").strip().splitlines()[0] if reason and reason.strip() else "")


def _nan_in(reason: str) -> str | None:
    """The output run_case refused for holding NaN/Inf ('seed 0: dv contains NaN/Inf' -> 'dv')."""
    m = _NAN.match(_first_line(reason))
    return m.group("name") if m else None


def reason_words(reason: str) -> str:
    """A row's reason as the line's parenthesis: 'seed 0: dv contains NaN/Inf' -> 'NaN in dv'."""
    nan = _nan_in(reason)
    if nan:
        return f"NaN in {nan}"
    first = _first_line(reason)
    return first[:100] + ("..." if len(first) > 100 else "")


def nan_names(row: CaseResult) -> set[str]:
    """The tensors of a row that came back NaN: measured with a NaN error, or refused unmeasured
    because they held NaN/Inf."""
    names = {t.tensor for t in row.tensors if math.isnan(t.ratio)}
    nan = _nan_in(row.reason) if not row.tensors else None
    return names | ({nan} if nan else set())


@dataclass(frozen=True)
class FailLine:
    """One failing case: its label (FAIL, ERROR, INCONCLUSIVE), what failed worst and why."""

    label: str
    case_id: str
    what: str
    why: str = ""
    size: float = 0.0  # sorts worst first: the worst ratio (inf for NaN, an error, an unmeasured row)

    @property
    def text(self) -> str:
        return f"{self.label} {self.case_id}  {self.what}" + (
            f" ({self.why})" if self.why and self.why != self.what else ""
        )


def row_line(row: CaseResult) -> FailLine:
    """The line of a failing results row: its worst tensor against its bound, the reason beside."""
    if row.status is Status.ERROR:
        # an ERROR row is a raise, a crash or a hang: its reason says which
        return FailLine("ERROR", row.case_id, "no answer from the kernel", reason_words(row.reason), math.inf)
    over = [t for t in row.tensors if not t.ratio <= 1.0]
    # within the max bound, over the mean bound: a bias the max hides, worst mean ratio first
    biased = sorted((t for t in row.tensors if t.ratio <= 1.0 and not t.within_mean), key=lambda t: -t.mean_ratio)
    mean_words = [f"{t.tensor} mean error {ratio_text(t.mean_ratio)}x its mean bound" for t in biased]
    if not over and biased:
        checks = [f"{c.name} check failed" for c in row.checks if c.passed is False]
        return FailLine("FAIL", row.case_id, mean_words[0], ", ".join(mean_words[1:] + checks), biased[0].mean_ratio)
    if over:
        # the worst finite ratio leads; a NaN is named beside it ("dk 14,121x its bound (NaN in dv)")
        finite = sorted((t for t in over if not math.isnan(t.ratio)), key=lambda t: (-t.ratio, t.tensor))
        nan = [f"NaN in {t.tensor}" for t in sorted(over, key=lambda t: t.tensor) if math.isnan(t.ratio)]
        checks = [f"{c.name} check failed" for c in row.checks if c.passed is False]
        if finite:
            what = f"{finite[0].tensor} {ratio_text(finite[0].ratio)}x its bound"
            others = [f"{t.tensor} {ratio_text(t.ratio)}x" for t in finite[1:]]
        else:
            what, nan, others = nan[0], nan[1:], []
        size = math.inf if len(finite) < len(over) else finite[0].ratio
        return FailLine("FAIL", row.case_id, what, ", ".join(nan + others + mean_words + checks), size)
    names = sorted(failures_of(row) - {UNATTRIBUTED})
    checks = [c.name for c in row.checks if c.passed is False]
    if checks:
        return FailLine("FAIL", row.case_id, f"{', '.join(checks)} check failed", reason_words(row.reason), math.inf)
    why = reason_words(row.reason)
    what = why if why.startswith("NaN in") else f"{names[0]} not measured" if names else "not measured"
    return FailLine("FAIL", row.case_id, what, why, math.inf)


def finding_what(f: Finding) -> tuple[str, float]:
    """A blocking finding of a case whose row did not fail (a headroom regression, a case not
    validated any more, a speed pass): its quantity and both numbers, shortly."""
    if f.rule is Rule.HEADROOM and isinstance(f.current, float):
        return f"{f.subject.item} {fmt(f.baseline)} -> {fmt(f.current)} of its bound (headroom)", f.current
    detail = f.detail.split("; ")[0]
    return detail, f.current if isinstance(f.current, float) and not math.isnan(f.current) else 0.0


def check_lines(findings: Iterable[Finding], rows: Mapping[str, CaseResult]) -> list[FailLine]:
    """One line per case with a blocking finding of a check, worst first (FAIL before
    INCONCLUSIVE, then the size of its worst ratio)."""
    by_case: dict[str, list[Finding]] = {}
    for f in findings:
        if f.severity.blocks and f.case_id:
            by_case.setdefault(f.case_id, []).append(f)
    lines = []
    for cid, mine in by_case.items():
        label = "FAIL" if any(f.severity is Severity.FAIL for f in mine) else "INCONCLUSIVE"
        row = rows.get(cid)
        if row is not None and row.status.failed and label == "FAIL":
            line = row_line(row)
        else:
            worst = max(mine, key=lambda f: finding_what(f)[1])
            what, size = finding_what(worst)
            line = FailLine(label, cid, what, "", size)
        lines.append(line)  # an ERROR row keeps its label, as pytest's short summary does
    return sorted(lines, key=lambda x: (x.label == "INCONCLUSIVE", -x.size, x.case_id))


def worst_first(lines: Iterable[FailLine]) -> list[FailLine]:
    return sorted(lines, key=lambda x: (-x.size, x.case_id))


# ---------------------------------------------------------------- grouped by a case axis

# The case axes a failure is grouped by, in the order a tie is broken: the input regime and the
# layout first (what a kernel's numerics and addressing care about), then the shape's.
AXES = ("inputs", "layout", "dtype", "head dim", "causal", "window", "GQA group", "seqlen_q", "seqlen_k", "entry point")


def _axes(row: CaseResult) -> dict[str, object]:
    c = row.case
    return {
        "inputs": c.inputs,
        "layout": c.layout,
        "dtype": c.dtype,
        "head dim": c.head_dim,
        "causal": "causal" if c.causal else "not causal",
        "window": "windowed" if c.has_window else "no window",
        "GQA group": c.heads_q // max(1, c.heads_kv),
        "seqlen_q": c.seqlen_q,
        "seqlen_k": c.seqlen_k,
        "entry point": c.entry_point,
    }


def _value_words(axis: str, value: object) -> str:
    if axis == "inputs":
        return f"{value} inputs"
    if axis in ("layout", "entry point", "head dim", "GQA group", "seqlen_q", "seqlen_k"):
        return f"{axis} {value}"
    return str(value)


@dataclass(frozen=True)
class FailGroup:
    """Failing cases that share one value of an axis and fail on the same names."""

    axis: str
    value: str  # as read: "shifted inputs", "head dim 192"
    names: tuple[str, ...]  # what they fail on (tensors, checks, "error")
    cases: tuple[str, ...]
    of_value: int  # cases of the run with that value (failing or not)
    worst: FailLine

    @property
    def text(self) -> str:
        n = len(self.cases)
        share = (
            f"every case with {self.value} fails ({self.of_value})"
            if n == self.of_value
            else f"{n} of the {self.of_value} cases with {self.value}"
        )
        on = ", ".join(NO_ANSWER if x == ERROR_NAME else x for x in self.names)
        what = f"give{'s' * (n == 1)} {NO_ANSWER}" if self.names == (ERROR_NAME,) else f"fail{'s' * (n == 1)} on {on}"
        return f"{n} case{'s' * (n != 1)} with {self.value} {what}: {share}; worst {self.worst.case_id}"


def group_failures(rows: list[CaseResult], failing: Mapping[str, Iterable[str]]) -> list[FailGroup]:
    """The failing rows (`failing`: case id -> the names it failed on) grouped by the one axis that
    separates them best from the passing rows (the fewest passing cases share their values, in the
    fewest groups), then by what they fail on; most cases first."""
    import pandas as pd

    if not failing:
        return []
    frame = pd.DataFrame(
        [{**_axes(r), "case": r.case_id, "failing": r.case_id in failing} for r in rows if r.status is not Status.SKIP]
    )
    if frame.empty:
        return []
    bad = frame[frame["failing"]]
    n_passing, n_failing = int((~frame["failing"]).sum()), len(bad)
    best = None
    for rank, axis in enumerate(AXES):
        values = set(bad[axis])
        passing_alike = int(((~frame["failing"]) & frame[axis].isin(values)).sum())
        # the share of passing cases that have the failing values, plus a cost per extra group: one
        # value that only failing cases have is best; an axis of many values explains little
        score = (passing_alike / n_passing if n_passing else 0.0) + (len(values) - 1) / n_failing
        if best is None or (score, rank) < best[0]:
            best = ((score, rank), axis)
    axis = best[1]
    names = {cid: tuple(sorted(set(n) - {UNATTRIBUTED})) or ("?",) for cid, n in failing.items()}
    frame["names"] = [names.get(cid, ()) for cid in frame["case"]]
    totals = frame.groupby(axis)["case"].count()
    lines = {r.case_id: row_line(r) for r in rows if r.case_id in failing}
    groups = []
    for (value, fails_on), part in frame[frame["failing"]].groupby([axis, "names"], sort=False):
        cases = tuple(sorted(part["case"]))
        worst = worst_first(lines[c] for c in cases)[0]
        groups.append(FailGroup(axis, _value_words(axis, value), tuple(fails_on), cases, int(totals[value]), worst))
    return sorted(groups, key=lambda g: (-len(g.cases), -g.worst.size, g.value))


# ---------------------------------------------------------------- a refused first baseline

MAX_LINES = 10  # failing-case lines in a refusal; the validation note lists every one


def block_reasons(
    groups: list[FailGroup],
    shared: Mapping[tuple[str, ...], str] | None = None,
    nan: Mapping[tuple[str, ...], set[str]] | None = None,
) -> dict[tuple[str, ...], str]:
    """A reason per set of failed names, from what its cases share: the printed block's reason says
    what was seen, and the user edits it to say why. `shared`: names -> the trait those cases
    alone have ("fully masked rows"), said instead of the values of their groups; `nan`: names ->
    those that came back NaN in every case of the set, said as such rather than "past the bound"."""
    values: dict[tuple[str, ...], list[str]] = {}
    for g in groups:
        values.setdefault(g.names, []).append(g.value)
    where = {names: " and ".join(v[:3]) + (" ..." if len(v) > 3 else "") for names, v in values.items()}
    where.update(shared or {})
    return {names: f"{_failed_on(names, (nan or {}).get(names, set()))} on {w}" for names, w in where.items()}


def _failed_on(names: tuple[str, ...], nan: set[str] | frozenset[str] = frozenset()) -> str:
    """'dq, dk past the bound', 'NaN in out', 'no answer from the kernel' (an ERROR row: a raise,
    crash or hang, where no tensor was measured), or several of them."""
    measured = [n for n in names if n != ERROR_NAME]
    said = [f"NaN in {', '.join(n for n in measured if n in nan)}"] if nan & set(measured) else []
    said += [f"{', '.join(rest)} past the bound"] if (rest := [n for n in measured if n not in nan]) else []
    return " and ".join(said + (["no answer from the kernel"] if ERROR_NAME in names else []))


@dataclass(frozen=True)
class Refusal:
    """Why a run is not recorded as a baseline, and the three ways forward."""

    lines: tuple[FailLine, ...]  # every failing case no declaration covers, worst first
    pattern: str  # what they share (gate.compare.diagnosis.diagnosis)
    groups: tuple[FailGroup, ...]
    block: str  # the [[tool.attn-gate.known_failures]] blocks that declare exactly them
    measured: int  # cases of the run that are not SKIP
    # the envelope key that SKIPs every failing case and no passing one ("gqa = false"), "" when none does
    narrowing: str = ""

    def text(
        self,
        path: object,
        kernel: str,
        redo: str,
        config_source: str,
        note: object | None,
        own_kernel: bool,
        width: int | None = None,
        reuse: object | None = None,
    ) -> str:
        """The refusal, its prose wrapped at whole words to `width` (None: not wrapped); the
        declaration at its end never is, so that it works as pasted. `reuse`: the saved run that
        `--known` may record from instead of running the suite again (None: it must run again)."""
        n = len(self.lines)
        out = [
            f"attn-gate: refusing to write {path}: {n} of {self.measured} measured case{'s' * (self.measured != 1)} fail"
            f"{'s' * (n == 1)} and no known_failures declaration covers {'it' if n == 1 else 'them'}:"
        ]
        out += [f"  {line.text}" for line in self.lines[:MAX_LINES]]
        if n > MAX_LINES:
            out.append(f"  ... and {n - MAX_LINES} more" + (f" (every one, with its reason: {note})" if note else ""))
        if self.pattern:
            out.append(f"what they share: {self.pattern}")
        if len(self.groups) > 1:
            out.append("by group:")
            out += [f"  {g.text}" for g in self.groups[:6]]
        if note and n <= MAX_LINES:
            out.append(f"every reason and ratio: {note}")
        where = config_source if config_source != "defaults" else "pyproject.toml"
        link_note = "" if own_kernel else "; `link` is required: the upstream issue, https://..."
        again = f" --from-results {shlex.quote(str(reuse))}" if reuse is not None else ""
        known = f'{redo}{again} --known "WHY"' + ("" if own_kernel else " --link https://UPSTREAM/ISSUE")
        ways = [f"fix the kernel, then rerun `{redo}`;"]
        if own_kernel:  # a built-in kernel's envelope is attn-gate's own: no table of its name is read
            what = (
                f"`{self.narrowing}` (every failing case needs it, no passing case does)"
                if self.narrowing
                else "what it supports"
            )
            ways.append(
                f"narrow the envelope: if the kernel does not support these cases, declare {what} in "
                f"{supports_table(kernel)} so they SKIP with that reason;"
            )
        ways.append(
            f"record them as known failures: `{known}` appends the declaration below to {where} and "
            f"writes the baseline; or paste it there yourself (edit the reason to say why{link_note}) and rerun `{redo}`:"
        )
        out += ["the way forward, one of:", *(f"  {i}. {way}" for i, way in enumerate(ways, 1))]
        if width is not None:
            out = wrap_lines(out, width, step=4)
        return "\n".join(out + ["", self.block.rstrip("\n")])


def refusal(
    rows: list[CaseResult],
    undeclared: list[tuple[str, list[str]]],
    kernel: str,
    reason: str = "",
    link: str = "",
    kept_passing: list[Case] = (),
    suite_cases: list[Case] = (),
) -> Refusal:
    """The refusal of `rows`' undeclared failures. `kept_passing`: passing cases outside `rows` the
    baseline keeps; `suite_cases`: every case of the suite, to choose the narrowest envelope key."""
    from gate.compare.diagnosis import diagnosis, separating_feature, what_separates
    from gate.compare.known import by_failed_names, declaration_blocks

    failing = {cid: names for cid, names in undeclared}
    by_id = {r.case_id: r for r in rows}
    lines = worst_first(row_line(by_id[cid]) for cid in failing)
    passing = [r.case for r in rows if r.status is Status.PASS and r.case_id not in failing]
    pattern = diagnosis([by_id[cid] for cid in failing], passing, {cid: set(n) for cid, n in failing.items()})
    groups = group_failures(rows, failing)
    if reason:
        reasons = {names: reason for names in by_failed_names(failing)}
    else:
        by_names = by_failed_names(failing)
        shared = {
            names: trait
            for names, cids in by_names.items()
            if (trait := what_separates([by_id[c].case for c in cids], passing))
        }
        nan = {names: set(names).intersection(*(nan_names(by_id[c]) for c in cids)) for names, cids in by_names.items()}
        reasons = block_reasons(groups, shared, nan)
    block = declaration_blocks(kernel, failing, reasons, link)
    measured = sum(1 for r in rows if r.status is not Status.SKIP)
    everyone = list(suite_cases) or [r.case for r in rows]
    feature = separating_feature([by_id[cid].case for cid in failing], [*passing, *kept_passing], everyone)
    narrowing = f"{feature.value} = false" if feature is not None else ""
    return Refusal(tuple(lines), pattern, tuple(groups), block, measured, narrowing)
