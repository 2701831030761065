"""Results of a sweep: frozen dataclasses, serialised to schema-versioned JSON.

Identity (Case) is kept apart from data (errors, statuses); headroom and worst ratios are
derived properties, never stored twice.

Format history:
  1  first version.
  2  `scope`: the --only regex the run was filtered with (null for the whole suite), a field of
     its own; version 1 kept it as a note ("filtered with --only 'REGEX'"), which
     `migrate_results` turns into the field.
  3  each row's `case` in the case dict's schema 2 (nested parts with their own schema_version,
     gate/core/cases.py); `migrate_results` turns version 2's flat case dicts into it.
  4  each tensor's mean-error rule: `pt_mean_err` (the in-dtype reference's mean error),
     `mean_mult`, `mean_floor`, `mean_bound`, `mean_ratio`. Version 3 did not record the reference's
     mean: `migrate_results` writes the five as null, such a tensor is read but not judged by the
     mean rule, and every command that judges or records rows (check --results, baseline update
     --from-results, merge) refuses the file: re-run the sweep.
"""

from __future__ import annotations

import ast
import enum
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gate.core.cases import Case, migrate_case
from gate.core.identity import Environment, RunKey, Scope
from gate.core.jsonio import (
    as_float,
    checked_kernel,
    checked_name,
    checked_tolerance,
    measured_float,
    read_record,
    write_json_atomic,
)

SCHEMA_VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)  # migrate_results turns each older one into the current layout
# The tensors every table shows, in report order (lse where the kernel exposes it).
TENSORS = ("out", "lse", "dq", "dk", "dv")
# Tensors only some cases measure, shown only where a case has them: dbias for a case
# whose bias requires grad; the sink logits' gradient (cases with sinks), and the cache
# contents after a decode call (judged exact). Kept apart so tables that show the usual
# five stay as they were.
EXTRA_TENSORS = ("dbias", "dsink", "k_cache", "v_cache")
# Every tensor a case may measure, in report order.
ALL_TENSORS = TENSORS + EXTRA_TENSORS
# run_case measures these for every case it passes (lse only where the kernel exposes it).
REQUIRED_TENSORS = ("out", "dq", "dk", "dv")
FORWARD_ONLY_REQUIRED = ("out",)  # forward-only rows (CaseResult.forward_only)
GRADIENTS = ("dq", "dk", "dv", "dbias", "dsink")
# Read back, a row's own numbers must agree to this relative precision (files keep full floats).
REL_TOL = 1e-6
MAX_ERROR = 1e300  # the rule's own numbers (floor, mult, bands): beyond this they are no float64 measurement
MAX_SECONDS = 1e7  # about four months: a longer case or run is no measurement
# A kernel's error may be infinite (an LSE of inf where the reference is finite; a NaN is written
# as an infinite error) and so may the yardstick's (the low-precision reference overflowed): such a
# row is a FAIL, its ratio inf. The rule's own numbers (floor, mult, bands) stay finite.
UNBOUNDED_FIELDS = ("max_err", "mean_err", "pt_err", "bound", "ratio", "pt_mean_err", "mean_bound", "mean_ratio")
# The mean-error rule's numbers: all recorded, or all null (a row written before the rule).
MEAN_FIELDS = ("pt_mean_err", "mean_mult", "mean_floor", "mean_bound", "mean_ratio")


def error_ratio(err: float, bound: float) -> float:
    """err / bound; NaN error is infinitely bad (a NaN must never compare as passing).

    Fail closed when the yardstick itself broke: a NaN or infinite bound (the low-precision
    reference overflowed) judges nothing, so the ratio is inf, never NaN (a NaN ratio would lose
    every max() over seeds) and never 0 (an inf bound would pass anything)."""
    if math.isnan(err) or math.isnan(bound) or math.isinf(bound):
        return math.inf
    if bound <= 0:
        return 0.0 if err == 0 else math.inf
    return err / bound


def _plain_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**63


def _number(value: Any, field: str) -> float:
    """A check's value or limit: a number, possibly NaN/inf as stored by jsonio ('nan', 'inf')."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{field} = {value!r} is not a number")
    number = as_float(value)
    if math.isfinite(number) and abs(number) > MAX_ERROR:
        raise ValueError(f"{field} = {value!r} is out of range")
    return number


def shown_tensors(cases) -> tuple[str, ...]:
    """Columns for a table of these CaseResults: the usual five, plus the extra ones any case has."""
    return TENSORS + tuple(t for t in EXTRA_TENSORS if any(c.tensor(t) is not None for c in cases))


def required_tensors(bias_grad: bool, forward_only: bool = False) -> tuple[str, ...]:
    """The tensors a PASS row must carry: a case whose bias requires grad measures dbias for every
    PASS too; a forward-only row (decode, or a kernel declared backward = false) has no gradients:
    out only. Every reader of a row (results, baselines) asks this one rule."""
    if forward_only:
        return FORWARD_ONLY_REQUIRED
    return REQUIRED_TENSORS + (("dbias",) if bias_grad else ())


class Status(str, enum.Enum):
    PASS = "PASS"
    FAIL = "FAIL"  # measured and out of bounds (or wrong shape/dtype, NaN/Inf)
    ERROR = "ERROR"  # the kernel raised
    SKIP = "SKIP"  # the kernel cannot run this case (reason given)

    @property
    def failed(self) -> bool:
        return self in (Status.FAIL, Status.ERROR)


@dataclass(frozen=True, kw_only=True)
class TensorError:
    tensor: str
    max_err: float
    mean_err: float
    pt_err: float
    floor: float
    mult: float
    bound: float
    ratio: float
    worst_index: tuple[int, ...]
    band_atol: float
    band_rtol: float
    band_ok: bool
    seed: int
    # the mean-error rule (gate/correctness/tolerance.py); None: recorded before it, not judged by it
    pt_mean_err: float | None = None
    mean_mult: float | None = None
    mean_floor: float | None = None
    mean_bound: float | None = None
    mean_ratio: float | None = None

    @property
    def headroom(self) -> float:
        return 1.0 - self.ratio

    @property
    def mean_judged(self) -> bool:
        return self.mean_ratio is not None

    @property
    def within_max(self) -> bool:
        return self.ratio <= 1.0

    @property
    def within_mean(self) -> bool:
        """Within the mean bound; a tensor recorded before the mean rule is not judged by it here
        (the commands that judge stored rows refuse such a file: `unjudged_by_mean`)."""
        return self.mean_ratio is None or self.mean_ratio <= 1.0

    @property
    def passed(self) -> bool:
        return self.within_max and self.within_mean

    @property
    def failure(self) -> str:
        """Why the tensor fails, one clause per rule it breaks ("" when it passes): a row's reason."""
        why = []
        if not self.within_max:
            why.append(f"{self.tensor} error {self.max_err:.3g} > bound {self.bound:.3g} (ratio {self.ratio:.2f}")
        if not self.within_mean:
            why.append(
                f"{self.tensor} mean error {self.mean_err:.3g} > mean bound {self.mean_bound:.3g} "
                f"(mean ratio {self.mean_ratio:.2f}"
            )
        return "; ".join(f"{w}, seed {self.seed})" for w in why)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["worst_index"] = list(self.worst_index)
        return data

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TensorError":
        floats = ("max_err", "mean_err", "pt_err", "floor", "mult", "bound", "ratio", "band_atol", "band_rtol")
        # a stored NaN, negative or absurd number would switch the headroom rule off: refused; an
        # error may be inf (UNBOUNDED_FIELDS), and the ratio is then recomputed as inf (a FAIL)
        name = d.get("tensor")
        if name not in ALL_TENSORS:
            raise ValueError(f"tensor = {name!r} is not one of {', '.join(ALL_TENSORS)}")
        missing = [k for k in MEAN_FIELDS if k not in d]
        if missing:
            raise ValueError(f"{name}.{missing[0]} is missing (null where the row predates the mean-error rule)")
        unrecorded = [d[k] is None for k in MEAN_FIELDS]
        if any(unrecorded) and not all(unrecorded):
            raise ValueError(f"{name}: {', '.join(MEAN_FIELDS)} must be all numbers or all null")
        data = {
            k: (
                measured_float(d[k], f"{name}.{k}", math.inf if k in UNBOUNDED_FIELDS else MAX_ERROR)
                if k in floats or (k in MEAN_FIELDS and d[k] is not None)
                else d[k]
            )
            for k in d
        }
        index = d["worst_index"]
        if not isinstance(index, list) or len(index) > 8 or not all(_plain_int(i) for i in index):
            raise ValueError(f"{name}.worst_index = {index!r} is not a short list of indices")
        if not isinstance(d["band_ok"], bool) or not _plain_int(d["seed"]):
            raise ValueError(f"{name}.band_ok must be true/false and {name}.seed an integer")
        data["worst_index"] = tuple(index)
        error = cls(**data)
        error.check_consistent()
        return error

    def check_consistent(self) -> None:
        """The row's own numbers must agree: a bound > 0 that is mult x pt_err + floor, and a ratio
        that is max_err / bound. A stored ratio is never trusted over the numbers it comes from."""
        t = self.tensor
        if not self.bound > 0:
            raise ValueError(f"{t}.bound = {self.bound!r} must be > 0 (the rounding floor is never 0)")
        expected_bound = self.mult * self.pt_err + self.floor
        if not math.isclose(self.bound, expected_bound, rel_tol=REL_TOL, abs_tol=1e-300):
            raise ValueError(f"{t}.bound = {self.bound!r} is not mult x pt_err + floor = {expected_bound!r}")
        expected_ratio = error_ratio(self.max_err, self.bound)
        if not math.isclose(self.ratio, expected_ratio, rel_tol=REL_TOL, abs_tol=1e-300):
            raise ValueError(f"{t}.ratio = {self.ratio!r} is not max_err / bound = {expected_ratio!r}")
        if not self.mean_judged:
            return
        if not self.mean_floor > 0 or not self.mean_mult > 0:
            raise ValueError(f"{t}.mean_floor and .mean_mult must be > 0 (a zero mean bound judges nothing)")
        expected_bound = self.mean_mult * self.pt_mean_err + self.mean_floor
        if not math.isclose(self.mean_bound, expected_bound, rel_tol=REL_TOL, abs_tol=1e-300):
            raise ValueError(
                f"{t}.mean_bound = {self.mean_bound!r} is not mean_mult x pt_mean_err + mean_floor = {expected_bound!r}"
            )
        expected_ratio = error_ratio(self.mean_err, self.mean_bound)
        if not math.isclose(self.mean_ratio, expected_ratio, rel_tol=REL_TOL, abs_tol=1e-300):
            raise ValueError(f"{t}.mean_ratio = {self.mean_ratio!r} is not mean_err / mean_bound = {expected_ratio!r}")


@dataclass(frozen=True)
class CheckResult:
    """A check beyond the error ratio (determinism, dropout statistics, batch invariance...).
    passed None means informational (measured, not judged)."""

    name: str
    passed: bool | None
    value: float
    limit: float
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CheckResult":
        name, passed, detail = d["name"], d["passed"], d.get("detail", "")
        if not isinstance(name, str) or not isinstance(detail, str):
            raise ValueError(f"checks[].name and .detail must be strings, not {name!r} and {type(detail).__name__}")
        if passed is not None and not isinstance(passed, bool):
            raise ValueError(f"checks[{name}].passed = {passed!r} must be true, false or null")
        return cls(
            name=name,
            passed=passed,
            value=_number(d["value"], f"checks[{name}].value"),
            limit=_number(d["limit"], f"checks[{name}].limit"),
            detail=detail,
        )


@dataclass(frozen=True)
class CaseResult:
    case: Case
    status: Status
    reason: str = ""
    tensors: tuple[TensorError, ...] = ()
    checks: tuple[CheckResult, ...] = ()
    seconds: float = 0.0
    forward_only: bool = False  # judged without gradients (decode, or a kernel declared backward = false)
    # the last lines of the traceback of an ERROR row, so a report can show where it raised;
    # written only when set (older files and other rows are unchanged)
    traceback: str = ""

    @property
    def case_id(self) -> str:
        return self.case.id

    @property
    def worst_ratio(self) -> float:
        return max((t.ratio for t in self.tensors), default=math.nan)

    def tensor(self, name: str) -> TensorError | None:
        return next((t for t in self.tensors if t.tensor == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "case_id": self.case_id,
            "case": self.case.to_dict(),
            "status": self.status.value,
            "reason": self.reason,
            "tensors": {t.tensor: t.to_dict() for t in self.tensors},
            "checks": [c.to_dict() for c in self.checks],
            "seconds": round(self.seconds, 3),
            **({"forward_only": True} if self.forward_only else {}),
            **({"traceback": self.traceback} if self.traceback else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CaseResult":
        """A row as read from a file, its status recomputed from its tensors and checks: a row
        that contradicts itself is refused (ValueError naming the case and the field)."""
        case = Case.from_dict(d["case"])
        where = f"case {case.id}"
        try:
            tensors, checks = d.get("tensors", {}), d.get("checks", [])
            if not isinstance(tensors, dict) or not isinstance(checks, list):
                raise ValueError("tensors must be an object keyed by tensor name and checks a list")
            for key, value in (("reason", d.get("reason", "")), ("traceback", d.get("traceback", ""))):
                if not isinstance(value, str):
                    raise ValueError(f"{key} must be a string, not {type(value).__name__}")
            if not isinstance(d.get("forward_only", False), bool):
                raise ValueError(f"forward_only = {d['forward_only']!r} must be true or false")
            if d.get("case_id", case.id) != case.id:
                raise ValueError(f"case_id {d['case_id']!r} is not the id of its case ({case.id})")
            errors = tuple(TensorError.from_dict(t) for t in tensors.values())
            if [t.tensor for t in errors] != list(tensors):
                raise ValueError("a tensor is stored under another tensor's name")
            result = cls(
                case=case,
                status=Status(d["status"]),
                reason=d.get("reason", ""),
                tensors=errors,
                checks=tuple(CheckResult.from_dict(c) for c in checks),
                seconds=measured_float(d.get("seconds", 0.0), "seconds", MAX_SECONDS),
                forward_only=d.get("forward_only", False),
                traceback=d.get("traceback", ""),
            )
            result.check_consistent()
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise ValueError(f"{where}: {exc}") from None
        return result

    def check_consistent(self) -> None:
        """The stored status must be the one the row's own numbers give: PASS only with every
        tensor within its bound and no failed check; FAIL with measured tensors only when one is
        out of bounds or a check failed (a FAIL without tensors is an invalid answer: its reason)."""
        over = [t for t in self.tensors if not t.passed]
        failed = [c.name for c in self.checks if c.passed is False]
        if self.status is Status.PASS and (over or failed):
            what = (
                f"{', '.join(t.tensor for t in over)} over the bound ("
                + (
                    f"ratio {max(t.ratio for t in self.tensors):.4g}"
                    if not over[0].within_max
                    else f"mean ratio {over[0].mean_ratio:.4g}"
                )
                + ")"
                if over
                else f"the {', '.join(failed)} check failed"
            )
            raise ValueError(f"status PASS contradicts the row: {what}")
        if self.status is Status.FAIL and self.tensors and not over and not failed:
            raise ValueError("status FAIL contradicts the row: every tensor is within its bound and no check failed")


@dataclass(frozen=True)
class SweepResult:
    kernel: str
    suite: str
    suite_hash: str
    environment: dict[str, Any]
    cases: tuple[CaseResult, ...]
    tolerance: dict[str, float]
    started_at: str
    wall_s: float
    schema_version: int = SCHEMA_VERSION
    notes: tuple[str, ...] = field(default_factory=tuple)
    scope: Scope = Scope()  # the cases of the suite the run covers (--only); on disk its regex or null

    def count(self, status: Status) -> int:
        return sum(1 for c in self.cases if c.status is status)

    @property
    def key(self) -> RunKey:
        """What the run may be compared with (gate/compare/comparable.py compares two keys)."""
        return RunKey.of(self.kernel, self.suite, self.suite_hash, self.tolerance, self.env.gpu_class_or_unknown)

    @property
    def env(self) -> Environment:
        """The environment record, typed."""
        return Environment.from_dict(self.environment)

    @property
    def passed(self) -> bool:
        return not any(c.status.failed for c in self.cases) and any(c.status is Status.PASS for c in self.cases)

    @property
    def unjudged_by_mean(self) -> tuple[str, ...]:
        """The cases holding a tensor recorded before the mean-error rule (results version 3):
        their PASS says nothing about a bias under the max bound."""
        return tuple(c.case_id for c in self.cases if any(not t.mean_judged for t in c.tensors))

    def harness_report(self) -> list[dict[str, Any]]:
        """The seed lecture's harness_report.json rows: one per measured case, bands as information."""
        rows = []
        for c in self.cases:
            if c.status is Status.SKIP:
                continue
            case = c.case
            row = {
                "name": c.case_id,
                "shape": [case.batch, case.heads_q, case.seqlen_q, case.head_dim],
                "dtype": case.dtype,
                "causal": case.causal,
                "pass": c.status is Status.PASS,
            }
            for tensor, key in (
                ("out", "fwd_max_abs"),
                ("dq", "dq_max_abs"),
                ("dk", "dk_max_abs"),
                ("dv", "dv_max_abs"),
            ):
                t = c.tensor(tensor)
                row[key] = None if t is None else t.max_err
            first = c.tensors[0] if c.tensors else None
            row["atol"], row["rtol"] = (first.band_atol, first.band_rtol) if first else (None, None)
            row["within_band"] = all(t.band_ok for t in c.tensors) if c.tensors else None
            rows.append(row)
        return rows

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "kind": "attn-gate sweep",
            "kernel": self.kernel,
            "suite": self.suite,
            "suite_hash": self.suite_hash,
            "environment": self.environment,
            "tolerance": self.tolerance,
            "started_at": self.started_at,
            "wall_s": round(self.wall_s, 2),
            "notes": list(self.notes),
            "scope": self.scope.only,
            "summary": {s.value: self.count(s) for s in Status},
            "cases": [c.to_dict() for c in self.cases],
            "harness_report": self.harness_report(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SweepResult":
        if (
            not isinstance(d["environment"], dict)
            or not isinstance(d["cases"], list)
            or not isinstance(d["kernel"], str)
        ):
            raise TypeError("environment must be an object, cases a list and kernel a string")
        checked_name(d["suite"], "suite")
        checked_name(d["environment"].get("gpu_class", "unknown"), "environment.gpu_class")  # becomes a folder name
        checked_kernel(d["kernel"], "kernel")
        for key in ("suite_hash", "started_at"):
            if not isinstance(d[key], str):
                raise TypeError(f"{key} = {d[key]!r} must be a string")
        notes = d.get("notes", [])
        if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
            raise TypeError("notes must be a list of strings")
        if not d["cases"]:  # a sweep runs at least one case (--only matching none is refused): nothing to judge
            raise ValueError("cases = []: the file holds no case, so nothing was measured")
        sweep = cls(
            kernel=d["kernel"],
            suite=d["suite"],
            suite_hash=d["suite_hash"],
            environment=d["environment"],
            cases=tuple(CaseResult.from_dict(c) for c in d["cases"]),
            tolerance=checked_tolerance(d["tolerance"]),
            started_at=d["started_at"],
            wall_s=measured_float(d["wall_s"], "wall_s", MAX_SECONDS),
            notes=tuple(notes),
            scope=scope_of_field(d.get("scope")),
        )
        sweep.check_scope()
        return sweep

    def check_scope(self) -> None:
        """A scope is a regex that every case of the run matches: one that excludes the run's own
        cases would take them (and every baseline case) out of the comparison."""
        outside = [c.case_id for c in self.cases if not self.scope.admits(c.case_id)]
        if outside:
            raise ValueError(
                f"scope = {self.scope.only!r} excludes the file's own case {outside[0]}"
                f"{f' (and {len(outside) - 1} more)' if len(outside) > 1 else ''}"
            )

    def write(self, path: Path) -> None:
        write_json_atomic(path, self.to_dict())

    @classmethod
    def read(cls, path: Path) -> "SweepResult":
        return read_record(
            path,
            kind="sweep results",
            schema_version=READABLE_VERSIONS,
            from_dict=lambda d: cls.from_dict(migrate_results(d)),
            file_kind="attn-gate sweep",
            fix="regenerate it with `attn-gate sweep`",
        )


SCOPE_NOTE = re.compile(r"filtered with --only (.+)")


def scope_of_field(raw: Any) -> Scope:
    """A results file's `scope` field as a value: a regular expression (bounded, so that matching
    it cannot hang) or null for the whole suite."""
    if raw is None:
        return Scope()
    if not isinstance(raw, str) or len(raw) > 100_000:
        raise ValueError(f"scope = {raw!r} must be a regular expression (a string) or null")
    try:
        Scope(raw).pattern
    except ValueError as exc:
        raise ValueError(f"scope = {raw[:200]!r} {exc}") from None
    return Scope(raw)


def scope_of_notes(notes: Any) -> tuple[str | None, list[Any]]:
    """The --only regex an older file kept as a note ("filtered with --only 'REGEX'"), and the
    other notes: what its `scope` field holds now (results version 2, perf version 3)."""
    if not isinstance(notes, list):
        raise TypeError("notes must be a list of strings")
    scope, kept = None, []
    for note in notes:
        m = SCOPE_NOTE.fullmatch(note) if isinstance(note, str) else None
        if m is None:
            kept.append(note)
            continue
        try:  # the regex was written with repr()
            scope = ast.literal_eval(m.group(1))
        except (ValueError, SyntaxError, RecursionError, MemoryError):
            scope = m.group(1)
        scope = str(scope)
    return scope, kept


def migrate_results(payload: dict[str, Any]) -> dict[str, Any]:
    """An older layout as the current one: 1 -> 2 moves the --only note into `scope`; 2 -> 3
    writes each row's case in the current case schema."""
    if payload.get("schema_version") == 1:
        scope, kept = scope_of_notes(payload.get("notes", []))
        payload = {**payload, "schema_version": 2, "notes": kept, "scope": scope}
    if payload.get("schema_version") == 2:
        payload = {**payload, "schema_version": 3, "cases": migrate_rows(payload.get("cases"))}
    if payload.get("schema_version") == 3:
        rows = payload.get("cases")
        rows = [_unjudged_by_mean(r) for r in rows] if isinstance(rows, list) else rows
        payload = {**payload, "schema_version": 4, "cases": rows}
    return payload


def _unjudged_by_mean(row: Any) -> Any:
    """A version 3 row with its tensors' mean-rule fields null: not recorded, so not judged."""
    tensors = row.get("tensors") if isinstance(row, dict) else None
    if not isinstance(tensors, dict) or not all(isinstance(t, dict) for t in tensors.values()):
        return row  # from_dict names what is wrong with it
    return {**row, "tensors": {n: {**t, **dict.fromkeys(MEAN_FIELDS)} for n, t in tensors.items()}}


def migrate_rows(rows: Any) -> list[Any]:
    """Rows (results or perf) with their `case` in the current case schema."""
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise TypeError("cases must be a list of objects")
    return [{**r, "case": migrate_case(r["case"])} if "case" in r else r for r in rows]
