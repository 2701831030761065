"""Findings and the verdict reduced from them: the one currency between rules and renderers.

A rule (gate/compare/sweep_rules.py for correctness, the perf verdict of the timing engine for speed) looks at
a current measurement and its baseline and returns `Finding`s; `decide()` reduces any list of
findings to a `Verdict` (PASS/FAIL, exit code, the headline). Renderers (gate/report/check_report.py,
gate/report/plots.py) only read findings: decide first, render after.

Plugging in another rule family (e.g. speed ratios):

    findings = compare_correctness(baseline, sweep, cfg) + my_perf_findings(baseline.perf, run, perf_cfg)
    verdict = decide(findings, {**correctness_thresholds(cfg), **my_perf_thresholds(perf_cfg)})

A Finding is
    rule       the `Rule` that spoke (tolerance, headroom, speed ...)
    severity   FAIL (the gate fails), INCONCLUSIVE (could not judge: the gate fails closed, re-measure),
               WARN (passes; a maintainer should look), KNOWN (a failure declared in
               [[tool.attn-gate.known_failures]]: listed apart, does not fail), INFO, OK (checked, fine)
    case_id    Case.id, or "" for a run-wide finding (environment drift, nothing measured)
    subject    what was judged: a `Subject` (quantity, item), e.g. (ratio, dk), (status), (env, torch),
               (speed_ratio, fwd); written as its `metric` "<quantity>:<item>" in the findings JSON
    baseline, current   the two values compared (float, str for versions/statuses, None when absent)
    threshold  the limit the rule applied (None when the rule has no number)
    message    one line a human can act on; says both numbers
    entry      the index of the known_failures declaration the finding is about (KNOWN, XPASS), or None
    advice     an `Advice` the message ends with (refresh the baseline), or None; `statement` is the
               message before it, so `temper` can take the advice back without reading the text

`Severity.blocks` is the one place that says which severities fail the gate (FAIL, INCONCLUSIVE):
a measurement that cannot decide never passes silently.

Format history of the findings JSON (`Verdict.to_dict`):
  1  first version.
  2  severity KNOWN, `entry` on each finding, context `known_failures` (the declarations that
     applied to the run: index, reason, link, cases, tensors, strict).
  3  the context holds the run's whole key: `suite_hash` and `tolerance` (the multipliers)
     beside `kernel`, `suite` and `gpu_class`.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from gate.core.errors import EXIT_FAIL, EXIT_PASS
from gate.core.identity import RunKey, Scope

SCHEMA_VERSION = 3

Value = float | str | None


class Severity(str, enum.Enum):
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"
    WARN = "WARN"
    KNOWN = "KNOWN"
    INFO = "INFO"
    OK = "OK"

    @property
    def rank(self) -> int:
        """Higher is worse: sort findings worst first."""
        return {"FAIL": 5, "INCONCLUSIVE": 4, "WARN": 3, "KNOWN": 2, "INFO": 1, "OK": 0}[self.value]

    @property
    def blocks(self) -> bool:
        """Does a finding of this severity fail the gate? (fail closed on INCONCLUSIVE)"""
        return self in (Severity.FAIL, Severity.INCONCLUSIVE)


class Rule(enum.StrEnum):
    """Every rule that speaks a finding; its value is the name the reports and the JSON print."""

    TOLERANCE = "tolerance"
    MEAN_ERROR = "mean_error"
    STATUS = "status"
    HEADROOM = "headroom"
    IMPROVEMENT = "improvement"
    NEW_CASE = "new_case"
    REMOVED_CASE = "removed_case"
    NEWLY_SKIPPED = "newly_skipped"
    NEWLY_MEASURED = "newly_measured"
    FIXED = "fixed"
    SKIPPED = "skipped"
    TENSOR_DROPPED = "tensor_dropped"
    TENSOR_ADDED = "tensor_added"
    INCOMPLETE_PASS = "incomplete_pass"
    ENV_DRIFT = "env_drift"
    ENV_INFO = "env_info"
    NOTHING_MEASURED = "nothing_measured"
    OUT_OF_SCOPE = "out_of_scope"
    WITHIN = "within"
    XPASS = "xpass"
    KNOWN_VERSION = "known_version"
    KNOWN_UNUSED = "known_unused"
    SPEED = "speed"


class Quantity(enum.StrEnum):
    RATIO = "ratio"  # a tensor's error / bound (item: the tensor, or "worst")
    MEAN_RATIO = "mean_ratio"  # a tensor's mean error / mean bound (item: the tensor)
    STATUS = "status"  # a case's status, or the run's
    ENV = "env"  # an environment key (item: the key)
    SPEED_RATIO = "speed_ratio"  # kernel time / anchor time (item: the pass, or "all")


@dataclass(frozen=True)
class Subject:
    """What a finding judged: a quantity and, where the quantity has several, which one."""

    quantity: Quantity
    item: str = ""

    @classmethod
    def ratio(cls, tensor: str) -> "Subject":
        return cls(Quantity.RATIO, tensor)

    @classmethod
    def mean_ratio(cls, tensor: str) -> "Subject":
        return cls(Quantity.MEAN_RATIO, tensor)

    @classmethod
    def env(cls, key: str) -> "Subject":
        return cls(Quantity.ENV, key)

    @classmethod
    def speed(cls, pass_: str) -> "Subject":
        return cls(Quantity.SPEED_RATIO, pass_)

    @property
    def name(self) -> str:
        """The item, or the quantity of a subject without one: what a table row names."""
        return self.item or self.quantity.value

    def __str__(self) -> str:
        return f"{self.quantity.value}:{self.item}" if self.item else self.quantity.value

    @classmethod
    def parse(cls, metric: str) -> "Subject":
        """The subject a findings file wrote as its metric; only the file reader calls this."""
        quantity, _, item = metric.partition(":")
        return cls(Quantity(quantity), item)


STATUS = Subject(Quantity.STATUS)


class Half(enum.StrEnum):
    """The two halves of a verdict, each decided and reported on its own."""

    CORRECTNESS = "correctness"
    SPEED = "speed"


class Advice(enum.Enum):
    REFRESH_BASELINE = "refresh the baseline"  # wrong while the run fails, or when the environment moved


@dataclass(frozen=True)
class Finding:
    rule: Rule
    severity: Severity
    case_id: str
    subject: Subject
    baseline: Value
    current: Value
    threshold: float | None
    message: str
    entry: int | None = None
    advice: Advice | None = None
    statement: str = ""  # the message before its advice ("" without advice)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rule", Rule(self.rule))
        if not isinstance(self.subject, Subject):
            raise TypeError(f"subject must be a Subject, not {type(self.subject).__name__}")
        if self.advice is not None and not (self.statement and self.message.startswith(self.statement)):
            raise ValueError(f"a finding with advice states its message first: {self.message!r}")

    @property
    def metric(self) -> str:
        """The subject as the findings JSON and the tables write it: "ratio:dk", "status"."""
        return str(self.subject)

    @property
    def half(self) -> Half:
        return (
            Half.SPEED if self.rule is Rule.SPEED or self.subject.quantity is Quantity.SPEED_RATIO else Half.CORRECTNESS
        )

    @property
    def unadvised(self) -> str:
        """The message without its advice."""
        return self.statement if self.advice is not None else self.message

    @property
    def detail(self) -> str:
        """The message without the leading case id (for tables that show the case in a column)."""
        for prefix in (f"{self.case_id}: ", f"{self.case_id} "):
            if self.case_id and self.message.startswith(prefix):
                return self.message[len(prefix) :]
        return self.message

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule.value,
            "severity": self.severity.value,
            "case_id": self.case_id,
            "metric": self.metric,
            "baseline": self.baseline,
            "current": self.current,
            "threshold": self.threshold,
            "message": self.message,
            "entry": self.entry,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Finding":
        """A finding as a findings file holds it: its message whole, its advice not apart."""
        return cls(
            rule=Rule(d["rule"]),
            severity=Severity(d["severity"]),
            case_id=d["case_id"],
            subject=Subject.parse(d["metric"]),
            baseline=d["baseline"],
            current=d["current"],
            threshold=d["threshold"],
            message=d["message"],
            entry=d.get("entry"),
        )


# the run's key as the context's mapping and the findings JSON spell it: flat, beside the rest
KEY_FIELDS = ("kernel", "suite", "suite_hash", "tolerance", "gpu_class")
NO_KEY = RunKey("", "", "", (), "")


@dataclass(frozen=True)
class CheckContext(Mapping):
    """What a verdict was about, for its reports: the run's key (the baseline's too: a check judges
    only a comparable one), the baseline and how they were chosen. Typed fields; also read as a
    mapping (`ctx["kernel"]`, `ctx.get("scope")`), as the renderers and the findings JSON do, with
    the key's fields flat beside the rest: there the scope is its regex (None: the whole suite) and
    the tolerance its multipliers by name."""

    key: RunKey = NO_KEY
    baseline: str = ""  # the baseline file compared with
    baseline_measured_at: str = ""
    run_started_at: str = ""
    config: str = ""  # the config file's path, or "defaults"
    scope: Scope = Scope()  # the cases the run covers (--only)
    baseline_option: str | None = None  # --baseline as given (None: the default path)
    measured: int | None = None  # cases with measured tensors
    cases: int | None = None  # cases in the run
    known_failures: tuple[dict[str, Any], ...] = ()  # the known_failures declarations that applied

    def __post_init__(self) -> None:
        if not isinstance(self.scope, Scope):  # a regex string here would be written as if it were none
            raise TypeError(f"scope = {self.scope!r} must be a Scope (Scope(regex), or Scope() for the whole suite)")
        if not isinstance(self.key, RunKey):
            raise TypeError(f"key = {self.key!r} must be a RunKey")

    @classmethod
    def of(cls, **values: Any) -> "CheckContext":
        """From the flat names the mapping and the findings JSON use (kernel, suite, suite_hash,
        tolerance, gpu_class beside the other fields; the scope as a Scope or its regex); an unknown
        name is a TypeError."""
        parts = {name: values.pop(name) for name in KEY_FIELDS if name in values}
        if "scope" in values and not isinstance(values["scope"], Scope):
            values["scope"] = Scope(values["scope"])
        if "known_failures" in values:
            values["known_failures"] = tuple(values["known_failures"])
        key = RunKey.of(
            str(parts.get("kernel", "")),
            str(parts.get("suite", "")),
            str(parts.get("suite_hash", "")),
            dict(parts.get("tolerance") or {}),
            str(parts.get("gpu_class", "")),
        )
        return cls(key=key, **values)

    @property
    def kernel(self) -> str:
        return self.key.kernel

    @property
    def suite(self) -> str:
        return self.key.suite

    @property
    def gpu_class(self) -> str:
        return self.key.gpu_class

    def __getitem__(self, name: str) -> Any:
        if name not in self._keys():
            raise KeyError(name)
        if name in KEY_FIELDS:
            return self.key.multipliers if name == "tolerance" else getattr(self.key, name)
        value = getattr(self, name)
        return value.only if isinstance(value, Scope) else value

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    @classmethod
    def _keys(cls) -> tuple[str, ...]:
        return KEY_FIELDS + tuple(f.name for f in fields(cls) if f.name != "key")

    def to_dict(self) -> dict[str, Any]:
        return {name: self[name] for name in self._keys()}


@dataclass(frozen=True)
class HalfVerdict:
    """One half of a verdict (correctness or speed): its findings and what they decide. Reports
    read its severity and case sets; none re-decides them."""

    half: Half
    findings: tuple[Finding, ...]

    @property
    def blocking(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity.blocks)

    @property
    def passed(self) -> bool:
        return not self.blocking

    @property
    def severity(self) -> Severity:
        """FAIL when a finding fails, INCONCLUSIVE when one only could not judge, else OK."""
        if any(f.severity is Severity.FAIL for f in self.blocking):
            return Severity.FAIL
        return Severity.INCONCLUSIVE if self.blocking else Severity.OK

    @property
    def failed_cases(self) -> frozenset[str]:
        return frozenset(f.case_id for f in self.blocking if f.case_id and f.severity is Severity.FAIL)

    @property
    def inconclusive_cases(self) -> frozenset[str]:
        """Cases that block without failing (fail closed, but not counted as failures)."""
        return frozenset(f.case_id for f in self.blocking if f.case_id) - self.failed_cases


@dataclass(frozen=True)
class Verdict:
    """The reduction of findings: passed iff no FAIL. `thresholds` are what the rules applied,
    printed in every report so a reader can check the decision."""

    findings: tuple[Finding, ...]
    thresholds: dict[str, float] = field(default_factory=dict)
    context: CheckContext = field(default_factory=CheckContext)

    @property
    def passed(self) -> bool:
        return not any(f.severity.blocks for f in self.findings)

    @property
    def exit_code(self) -> int:
        return EXIT_PASS if self.passed else EXIT_FAIL

    def half(self, half: Half) -> HalfVerdict:
        return HalfVerdict(half, tuple(f for f in self.findings if f.half is half))

    @property
    def correctness(self) -> HalfVerdict:
        return self.half(Half.CORRECTNESS)

    @property
    def speed(self) -> HalfVerdict:
        return self.half(Half.SPEED)

    def of(self, severity: Severity) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity is severity)

    @property
    def counts(self) -> dict[str, int]:
        c = Counter(f.severity.value for f in self.findings)
        return {s.value: c.get(s.value, 0) for s in Severity}

    @property
    def headline(self) -> str:
        """The top line of every report: PASS/FAIL and why, in one sentence."""
        fails = tuple(f for f in self.findings if f.severity.blocks)
        warns = self.of(Severity.WARN)
        if fails:
            cases = sorted({f.case_id for f in fails if f.case_id})
            first = min(fails, key=worst_first)
            where = f" in {len(cases)} case{'s' * (len(cases) != 1)}" if cases else ""
            more = f" (and {len(fails) - 1} more)" if len(fails) > 1 else ""
            kind = "failing" if any(f.severity is Severity.FAIL for f in fails) else "inconclusive"
            return f"FAIL: {len(fails)} {kind} finding{'s' * (len(fails) != 1)}{where}: {first.message}{more}"
        tail = f"; {len(warns)} warning{'s' * (len(warns) != 1)} to review" if warns else ""
        known = sorted({f.case_id for f in self.of(Severity.KNOWN)})
        if known:
            tail = f" except {len(known)} known failure{'s' * (len(known) != 1)} (declared upstream bugs){tail}"
        measured = self.context.measured
        what = f"{measured} cases measured, all" if measured is not None else "all cases"
        return f"PASS: {what} within their bounds and baseline{tail}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": "attn-gate findings",
            "verdict": "PASS" if self.passed else "FAIL",
            "exit_code": self.exit_code,
            "headline": self.headline,
            "counts": self.counts,
            "thresholds": self.thresholds,
            "context": self.context.to_dict(),
            "findings": [f.to_dict() for f in self.findings],
        }


def worst_first(f: Finding) -> tuple:
    """Severity, then size: the headline names the largest error ratio, not the first id."""
    size = (
        f.current
        if isinstance(f.current, float) and f.subject.quantity is Quantity.RATIO and not math.isnan(f.current)
        else 0.0
    )
    return (-f.severity.rank, -size, f.case_id, f.metric)


def sort_key(f: Finding) -> tuple:
    return (-f.severity.rank, f.case_id, f.metric, f.rule)


# Ratio changes that may follow from the machine rather than the kernel.
RATIO_CHANGE_RULES = (Rule.IMPROVEMENT, Rule.SPEED)


def advised(statement: str, advice: str) -> dict[str, Any]:
    """The message fields of a finding that advises refreshing the baseline: `advice` is the text
    that follows the statement in the message (its punctuation included)."""
    return {"message": statement + advice, "statement": statement, "advice": Advice.REFRESH_BASELINE}


def temper(findings: list[Finding] | tuple[Finding, ...]) -> list[Finding]:
    """Advice that would be wrong in context, taken back:

    - a run that fails never advises refreshing the baseline: refreshing would record the failure.
      Such WARNs become INFO and lose the advice;
    - a ratio that moved while the environment changed (another CPU model, torch, driver...) is
      INFO naming the change, not a WARN to refresh: the kernel may not have changed at all.
    FAIL and INCONCLUSIVE are never softened (fail closed)."""
    failing = any(f.severity.blocks for f in findings)
    env_changes = [
        f"{f.subject.item} {fmt(f.baseline)} -> {fmt(f.current)}"
        for f in findings
        if f.subject.quantity is Quantity.ENV
        and f.severity in (Severity.WARN, Severity.INFO)
        and f.baseline is not None
    ]
    out = []
    for f in findings:
        if f.severity is Severity.WARN and f.case_id and f.rule in RATIO_CHANGE_RULES and env_changes:
            f = replace(
                f,
                severity=Severity.INFO,
                message=f.unadvised
                + f"; coincides with an environment change ({', '.join(env_changes[:3])}), so it may not be the kernel",
                advice=None,
                statement="",
            )
        elif f.severity is Severity.WARN and failing and f.advice is Advice.REFRESH_BASELINE:
            f = replace(
                f,
                severity=Severity.INFO,
                message=f.statement + " (the run fails: do not refresh the baseline now)",
                advice=None,
                statement="",
            )
        out.append(f)
    return out


def decide(
    findings: list[Finding] | tuple[Finding, ...],
    thresholds: dict[str, float] | None = None,
    context: CheckContext | Mapping[str, Any] | None = None,
) -> Verdict:
    """Any findings from any rule family -> the Verdict (worst first, stable order), after `temper`.
    A plain mapping as `context` must use CheckContext's keys (an unknown key is a TypeError)."""
    if not isinstance(context, CheckContext):
        context = CheckContext.of(**dict(context or {}))
    return Verdict(
        findings=tuple(sorted(temper(findings), key=sort_key)), thresholds=dict(thresholds or {}), context=context
    )


def fmt(value: Value) -> str:
    """A value as the reports print it: ratios to 3 digits, strings as they are, '-' for absent."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.3g}" if abs(value) < 1e-3 and value != 0 else f"{value:.3f}".rstrip("0").rstrip(".") or "0"
    return str(value)


FINDINGS_KIND = "attn-gate findings"


def rerun_case_ids(payload: Any) -> list[str]:
    """The cases a findings file (`Verdict.to_dict`, as `check` writes it) says failed or were
    inconclusive: what `check --last-failed` reruns. Every field it uses is checked first (kind,
    findings, each finding's severity and case_id), so a damaged file is refused, never read as
    "nothing failed". A ValueError names the field."""
    if not isinstance(payload, dict) or payload.get("kind") != FINDINGS_KIND:
        raise ValueError(
            f"kind = {str(payload.get('kind') if isinstance(payload, dict) else None)[:40]!r} is not {FINDINGS_KIND!r}"
        )
    findings = payload.get("findings")
    if not isinstance(findings, list):
        raise ValueError("findings must be a list")
    failed = set()
    for i, f in enumerate(findings):
        if not isinstance(f, dict):
            raise ValueError(f"findings[{i}] must be an object")
        severity, case_id = f.get("severity"), f.get("case_id")
        if not isinstance(severity, str) or severity not in {s.value for s in Severity}:
            raise ValueError(
                f"findings[{i}].severity = {str(severity)[:40]!r} is not one of {', '.join(s.value for s in Severity)}"
            )
        if not isinstance(case_id, str):
            raise ValueError(
                f'findings[{i}].case_id = {str(case_id)[:40]!r} must be a string ("" for a run-wide finding)'
            )
        if case_id and severity in (Severity.FAIL.value, Severity.INCONCLUSIVE.value):
            failed.add(case_id)
    return sorted(failed)
