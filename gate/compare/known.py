"""Known failures: upstream bugs declared in [[tool.attn-gate.known_failures]], pytest's xfail for kernels.

Pure decision code (no torch, no I/O): the correctness findings of a run, its results rows and the
declarations in; findings out. A declaration (gate.core.config.KnownFailure) applies to a run when
its `kernel` fnmatch pattern matches the kernel name and, with `versions`, the kernel_version the
run's environment recorded satisfies the PEP 440 specifier. It then covers, in each case whose id
its `cases` regex matches, the failures it names in `tensors` (all of them without `tensors`).

What a row failed on, by name (`failures_of`): each tensor whose ratio or mean ratio is above 1 or not a number,
each check that failed, "error" for an ERROR row. A FAIL row without ratios (a NaN, a wrong shape:
the kernel's output was refused before it was measured) names the tensor its reason names, or
"?" when none does: only a declaration without `tensors` covers that.

The rules, each one decision (tables in tests/test_known_failures.py):

    KNOWN   rule_known       a tolerance or mean_error FAIL on a covered tensor; a status FAIL whose every failure
                             is covered. Not blocking; listed apart with the reason and the link.
                             A failure on a name the declaration does not cover stays FAIL, and so
                             do the headroom rule's findings (a covered case that got worse
                             elsewhere still fails).
    WARN    rule_xpass       a declared case that passes what its declaration covers: name the
                             entry to delete (or to narrow); FAIL under `strict = true`
    INFO    rule_version     a declaration for this kernel whose `versions` exclude the run's kernel
                             version (or cannot be compared with it): not applied, so its failures fail
    INFO    rule_unused      a declaration for this kernel that matches no case of this run (another
                             suite's cases, or filtered out with --only)
    exit 2  refuse_unmatched a declaration for this kernel whose `cases` match no case of any suite:
                             a typo must not hide a bug. Declarations for other kernels are not
                             checked against a run.

`baseline update` records a failing row only when `undeclared_failures` finds none.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

from gate.compare.findings import STATUS, Finding, Rule, Severity, Subject
from gate.core.config import ERROR_NAME, KnownFailure
from gate.core.errors import UserError

if TYPE_CHECKING:
    from gate.core.results import CaseResult, SweepResult

UNATTRIBUTED = "?"  # a FAIL row whose reason names no tensor
# run_case's refusals of an output it could not measure (gate/correctness/run_case.py: BadOutput)
_REFUSED = re.compile(r"^(?:seed \d+: )?(?P<name>[a-z_]+) (?:contains NaN/Inf|has shape|has dtype|is missing|is a )")
TABLE = "[[tool.attn-gate.known_failures]]"


def kernel_matches(entry: KnownFailure, kernel: str) -> bool:
    return fnmatchcase(kernel, entry.kernel)


def version_applies(entry: KnownFailure, version: str) -> bool:
    """A version that cannot be compared (absent, "unknown") does not apply: its failures fail."""
    if entry.versions is None:
        return True
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:  # a nightly or dev build of an affected release carries the bug too
        return SpecifierSet(entry.versions, prereleases=True).contains(Version(version))
    except (InvalidVersion, ValueError):  # a version of 5,000 digits is a ValueError, not InvalidVersion
        return False


def row_failures(
    status: str, ratios: Mapping[str, float], failed_checks: Iterable[str], reason: str = ""
) -> frozenset[str]:
    """What one results row failed on, by name (see the module docstring); empty for PASS and SKIP."""
    if status == "ERROR":
        return frozenset({ERROR_NAME})
    if status != "FAIL":
        return frozenset()
    names = {t for t, r in ratios.items() if not r <= 1.0} | set(failed_checks)  # NaN compares False: a failure
    if names:
        return frozenset(names)
    m = _REFUSED.match(reason)
    return frozenset({m.group("name") if m else UNATTRIBUTED})


def failures_of(c: "CaseResult") -> frozenset[str]:
    return row_failures(
        c.status.value,
        # the ratio of the rule a tensor fails: its mean ratio where it fails the mean rule
        {t.tensor: t.ratio if t.within_mean else t.mean_ratio for t in c.tensors},
        [ch.name for ch in c.checks if ch.passed is False],
        c.reason,
    )


def coverage(failures: Iterable[str], entries: Iterable[KnownFailure]) -> dict[str, KnownFailure]:
    """Each failure a declaration covers -> the first declaration (in file order) that covers it."""
    ordered = sorted(entries, key=lambda e: e.index)
    out = {}
    for name in sorted(failures):
        entry = next((e for e in ordered if e.covers(name)), None)
        if entry is not None:
            out[name] = entry
    return out


def rule_known(
    f: Finding, failures: frozenset[str], covered: Mapping[str, KnownFailure], unmeasured: bool = False
) -> Finding | None:
    """A FAIL finding the declarations cover, as KNOWN; None when it stays what it is. `unmeasured`:
    the row's output was refused before any tensor was measured (a NaN, a wrong shape), which the
    message says: what else is wrong with that case is not known while it fails this way."""
    if f.severity is not Severity.FAIL:
        return None
    if f.rule in (Rule.TOLERANCE, Rule.MEAN_ERROR):
        entry = covered.get(f.subject.item)
    elif f.rule is Rule.STATUS and failures and set(failures) <= set(covered):
        entry = covered[min(failures)]
    else:
        return None
    if entry is None:
        return None
    return as_known(f, entry, " (its other tensors are not measured while it fails this way)" if unmeasured else "")


def as_known(f: Finding, entry: KnownFailure, note: str = "") -> Finding:
    """`f` as KNOWN under `entry`: its index, and its name and link after the message."""
    tail = f" [KNOWN: {entry.name}{', ' + entry.link if entry.link else ''}]{note}"
    return replace(f, severity=Severity.KNOWN, entry=entry.index, message=f.message + tail)


def rule_xpass(
    entry: KnownFailure,
    case_id: str,
    status: str,
    failures: frozenset[str],
    measured: Iterable[str],
    still_failing: int,
    matched: int,
) -> Finding | None:
    """A declared case that passes what its declaration covers. `still_failing` of the `matched` cases
    of this run the entry declares still fail: the advice is to delete the entry when none does."""
    if status == "SKIP" or any(entry.covers(n) for n in failures):
        return None
    if status == "ERROR" or UNATTRIBUTED in failures:
        return None  # nothing measured: whether the declared tensors pass is unknown
    named = [t for t in entry.tensors or () if t != ERROR_NAME]
    if status == "FAIL" and any(t not in set(measured) for t in named):
        return None
    what = f" on {', '.join(entry.tensors)}" if entry.tensors else ""
    if still_failing:
        advice = (
            f"narrow its cases or tensors ({still_failing} of the {matched} cases it declares in this run still fail)"
        )
    else:
        landed = (
            f"the upstream fix seems to have landed ({entry.link})" if entry.link else "the fix seems to have landed"
        )
        advice = f"{landed}: delete the entry from {entry.source}"
    severity = Severity.FAIL if entry.strict else Severity.WARN
    strict = " (strict = true: a failure)" if entry.strict else ""
    return Finding(
        Rule.XPASS,
        severity,
        case_id,
        STATUS,
        "KNOWN",
        status,
        None,
        f"{case_id}: XPASS: passes{what} now but is declared by {entry.name}{strict}; {advice}",
        entry=entry.index,
    )


def rule_version(entry: KnownFailure, version: str) -> Finding | None:
    if version_applies(entry, version):
        return None
    return Finding(
        Rule.KNOWN_VERSION,
        Severity.INFO,
        "",
        Subject.env("kernel_version"),
        entry.versions,
        version or None,
        None,
        f"{entry.name} is declared for versions {entry.versions!r}; the kernel is {version or 'of unknown version'}"
        f", so it is not applied (those cases are judged as any other)",
        entry=entry.index,
    )


def rule_unused(entry: KnownFailure, matched: int) -> Finding | None:
    if matched:
        return None
    return Finding(
        Rule.KNOWN_UNUSED,
        Severity.INFO,
        "",
        STATUS,
        None,
        None,
        None,
        f"{entry.name}: cases = {entry.cases!r} matches no case of this run (another suite's, or filtered out)",
        entry=entry.index,
    )


def for_kernel(entries: Iterable[KnownFailure], kernel: str, version: str | None = None) -> list[KnownFailure]:
    """The declarations that apply to a run of `kernel` (and, when given, of that kernel version)."""
    return [e for e in entries if kernel_matches(e, kernel) and (version is None or version_applies(e, version))]


def refuse_unmatched(entries: Iterable[KnownFailure], kernel: str, suites: Mapping[str, Iterable[str]]) -> None:
    """A declaration for `kernel` whose cases match no case id of any suite (name -> case ids) is a
    usage error, asked before the sweep: a typo in `cases` would otherwise hide nothing and say nothing,
    and the bug it meant would fail unexplained, or a real new failure would hide behind a broad fix."""
    ids = {name: list(cids) for name, cids in suites.items()}
    for entry in for_kernel(entries, kernel):
        if not any(entry.pattern.search(cid) for cids in ids.values() for cid in cids):
            raise UserError(
                f"{entry.source} {TABLE} #{entry.index}: cases = {entry.cases!r} matches no case of "
                f"suite {' or '.join(sorted(ids))} for kernel {kernel!r} (reason: {entry.reason}); fix the "
                f"pattern (`attn-gate suites --cases` prints every case id) or delete the entry"
            )


def apply_known(
    findings: Iterable[Finding], sweep: "SweepResult", entries: Iterable[KnownFailure]
) -> tuple[list[Finding], list[dict[str, Any]]]:
    """The run's correctness findings with covered FAILs turned KNOWN, plus XPASS and INFO findings;
    and the declarations that applied (for the reports: index, reason, link ...)."""
    findings = list(findings)
    version = sweep.env.kernel_version or ""
    mine = for_kernel(entries, sweep.kernel)
    extra = [f for f in (rule_version(e, version) for e in mine) if f]
    applied = [e for e in mine if version_applies(e, version)]
    if not applied:
        return findings + extra, []
    rows = {c.case_id: c for c in sweep.cases}
    failures = {cid: failures_of(c) for cid, c in rows.items()}
    matched = {e.index: [cid for cid in rows if e.pattern.search(cid)] for e in applied}
    covered = {cid: coverage(failures[cid], [e for e in applied if cid in matched[e.index]]) for cid in rows}
    unmeasured = {cid for cid, c in rows.items() if c.status.value == "FAIL" and not c.tensors}
    out = [
        rule_known(f, failures.get(f.case_id, frozenset()), covered.get(f.case_id, {}), f.case_id in unmeasured) or f
        for f in findings
    ]
    for e in applied:
        cids = matched[e.index]
        failing = sum(1 for cid in cids if any(e.covers(n) for n in failures[cid]))
        extra += [f for f in (rule_unused(e, len(cids)),) if f]
        extra += [
            f
            for f in (
                rule_xpass(
                    e,
                    cid,
                    rows[cid].status.value,
                    failures[cid],
                    [t.tensor for t in rows[cid].tensors],
                    failing,
                    len(cids),
                )
                for cid in cids
            )
            if f
        ]
    context = [
        {
            "index": e.index,
            "kernel": e.kernel,
            "cases": e.cases,
            "tensors": list(e.tensors) if e.tensors else None,
            "versions": e.versions,
            "strict": e.strict,
            "reason": e.reason,
            "link": e.link,
            "source": e.source,
        }
        for e in applied
    ]
    return out + extra, context


def apply_known_to_speed(
    findings: Iterable[Finding], errored: Iterable[str], kernel: str, version: str, entries: Iterable[KnownFailure]
) -> list[Finding]:
    """Speed findings with an untimed pass turned KNOWN where the case raised when timed and when
    swept (its id in `errored`) and a declaration for the kernel covers that case's error: the
    upstream bug it names keeps the case from running at all, and the correctness half reports the
    sweep's row under the same declaration. A pass that was timed is judged as always."""
    mine = for_kernel(entries, kernel, version)
    covered = {cid: coverage({ERROR_NAME}, [e for e in mine if e.pattern.search(cid)]) for cid in set(errored)}
    return [
        as_known(f, covered[f.case_id][ERROR_NAME])
        if f.severity is Severity.INCONCLUSIVE and ERROR_NAME in covered.get(f.case_id, {})
        else f
        for f in findings
    ]


def undeclared_failures(sweep: "SweepResult", entries: Iterable[KnownFailure]) -> list[tuple[str, list[str]]]:
    """(case id, the failures no declaration covers) for each failing row: what `baseline update`
    refuses to record."""
    applied = for_kernel(entries, sweep.kernel, sweep.env.kernel_version or "")
    return [(c.case_id, left) for c in sweep.cases if (left := uncovered(c, applied))]


def uncovered(c: "CaseResult", applied: Sequence[KnownFailure]) -> list[str]:
    """What row `c` failed on that none of `applied` (declarations that apply to its run) covers."""
    failures = failures_of(c)
    if not failures:
        return []
    return sorted(failures - set(coverage(failures, [e for e in applied if e.pattern.search(c.case_id)])))


def declared_known(c: "CaseResult", applied: Sequence[KnownFailure]) -> bool:
    """A failing row whose every failure a declaration covers: `check` will call it KNOWN unless
    the baseline's headroom rule fails it (a sweep alone still fails it)."""
    return bool(failures_of(c)) and not uncovered(c, applied)


def _toml_basic(text: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's)."""
    import json

    return json.dumps(text, ensure_ascii=False)


def by_failed_names(failing: Mapping[str, Iterable[str]]) -> dict[tuple[str, ...], list[str]]:
    """Case ids grouped by the set of names they fail on (sorted): one declaration block each."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for cid, names in failing.items():
        groups.setdefault(tuple(sorted(set(names))), []).append(cid)
    return groups


def declaration_blocks(
    kernel: str, failing: Mapping[str, Iterable[str]], reasons: Mapping[tuple[str, ...], str], link: str = ""
) -> str:
    """[[tool.attn-gate.known_failures]] blocks that declare exactly `failing` (case id -> the
    names it fails on), one block per set of names: `cases` the exact ids (a new failure elsewhere
    still fails), `tensors` the names (a new failure of another tensor in those cases still fails).
    `reasons`: names -> the block's reason. Empty `link`: the key is left out (valid only for the
    project's own kernel, gate.core.config.own_kernel)."""
    from gate.core.cases import exact_regex

    blocks = []
    for names, cids in sorted(by_failed_names(failing).items(), key=lambda kv: (-len(kv[1]), kv[0])):
        lines = [TABLE, f"kernel = {_toml_basic(kernel)}", f"cases = '{exact_regex(cids)}'"]
        if UNATTRIBUTED not in names:  # a row whose reason names nothing: only "any failure" covers it
            lines.append("tensors = [" + ", ".join(_toml_basic(n) for n in names) + "]")
        lines.append(f"reason = {_toml_basic(reasons.get(names) or 'recorded with the first baseline')}")
        if link:
            lines.append(f"link = {_toml_basic(link)}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"
