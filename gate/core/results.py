"""Results of a sweep: frozen dataclasses, serialised to schema-versioned JSON.

Identity (Case) is kept apart from data (errors, statuses); headroom and worst ratios are
derived properties, never stored twice.

Format history:
  1  first version.
  2  `scope`: the --only regex the run was filtered with (null for the whole suite), a field of
     its own; version 1 kept it as a note ("filtered with --only 'REGEX'"), which
     `migrate_results` turns into the field.
"""

from __future__ import annotations

import ast
import enum
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gate.core.cases import Case
from gate.core.jsonio import as_float, checked_name, measured_float, read_record, write_json_atomic

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)  # migrate_results turns each older one into the current layout
# The tensors every table shows, in report order (lse where the kernel exposes it).
TENSORS = ("out", "lse", "dq", "dk", "dv")
# Tensors only some cases measure, shown only where a case has them: dbias for a case
# whose bias requires grad; the sink logits' gradient (cases with sinks), and the cache
# contents after a decode call (judged exact). Kept apart so tables that show the usual
# five stay as they were.
EXTRA_TENSORS = ("dbias", "dsink", "k_cache", "v_cache")
# Every tensor a case may measure, in report order.
ALL_TENSORS = TENSORS + EXTRA_TENSORS


def shown_tensors(cases) -> tuple[str, ...]:
    """Columns for a table of these CaseResults: the usual five, plus the extra ones any case has."""
    return TENSORS + tuple(t for t in EXTRA_TENSORS if any(c.tensor(t) is not None for c in cases))


class Status(str, enum.Enum):
    PASS = "PASS"
    FAIL = "FAIL"  # measured and out of bounds (or wrong shape/dtype, NaN/Inf)
    ERROR = "ERROR"  # the kernel raised
    SKIP = "SKIP"  # the kernel cannot run this case (reason given)

    @property
    def failed(self) -> bool:
        return self in (Status.FAIL, Status.ERROR)


@dataclass(frozen=True)
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

    @property
    def headroom(self) -> float:
        return 1.0 - self.ratio

    @property
    def passed(self) -> bool:
        return self.ratio <= 1.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["worst_index"] = list(self.worst_index)
        return data

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TensorError":
        floats = ("max_err", "mean_err", "pt_err", "floor", "mult", "bound", "ratio", "band_atol", "band_rtol")
        # a stored NaN, inf, negative or absurd number would switch the headroom rule off: refused
        # (no upper limit here: a broken kernel's FAIL row may carry any finite error)
        data = {k: (measured_float(d[k], f"{d.get('tensor', '?')}.{k}", math.inf) if k in floats else d[k]) for k in d}
        data["worst_index"] = tuple(d["worst_index"])
        return cls(**data)


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
        return cls(name=d["name"], passed=d["passed"], value=as_float(d["value"]), limit=as_float(d["limit"]), detail=d.get("detail", ""))


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
            "case_id": self.case_id, "case": self.case.to_dict(), "status": self.status.value, "reason": self.reason,
            "tensors": {t.tensor: t.to_dict() for t in self.tensors},
            "checks": [c.to_dict() for c in self.checks], "seconds": round(self.seconds, 3),
            **({"forward_only": True} if self.forward_only else {}),
            **({"traceback": self.traceback} if self.traceback else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CaseResult":
        return cls(
            case=Case.from_dict(d["case"]), status=Status(d["status"]), reason=d.get("reason", ""),
            tensors=tuple(TensorError.from_dict(t) for t in d.get("tensors", {}).values()),
            checks=tuple(CheckResult.from_dict(c) for c in d.get("checks", [])), seconds=float(d.get("seconds", 0.0)),
            forward_only=bool(d.get("forward_only", False)),
            traceback=str(d.get("traceback", "")),
        )


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
    scope: str | None = None  # the --only regex the run was filtered with; None: the whole suite

    def count(self, status: Status) -> int:
        return sum(1 for c in self.cases if c.status is status)

    @property
    def passed(self) -> bool:
        return not any(c.status.failed for c in self.cases) and any(c.status is Status.PASS for c in self.cases)

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
                "dtype": case.dtype, "causal": case.causal, "pass": c.status is Status.PASS,
            }
            for tensor, key in (("out", "fwd_max_abs"), ("dq", "dq_max_abs"), ("dk", "dk_max_abs"), ("dv", "dv_max_abs")):
                t = c.tensor(tensor)
                row[key] = None if t is None else t.max_err
            first = c.tensors[0] if c.tensors else None
            row["atol"], row["rtol"] = (first.band_atol, first.band_rtol) if first else (None, None)
            row["within_band"] = all(t.band_ok for t in c.tensors) if c.tensors else None
            rows.append(row)
        return rows

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version, "kind": "attn-gate sweep", "kernel": self.kernel, "suite": self.suite,
            "suite_hash": self.suite_hash, "environment": self.environment, "tolerance": self.tolerance,
            "started_at": self.started_at, "wall_s": round(self.wall_s, 2), "notes": list(self.notes),
            "scope": self.scope, "summary": {s.value: self.count(s) for s in Status},
            "cases": [c.to_dict() for c in self.cases], "harness_report": self.harness_report(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SweepResult":
        if not isinstance(d["environment"], dict) or not isinstance(d["cases"], list) or not isinstance(d["kernel"], str):
            raise TypeError("environment must be an object, cases a list and kernel a string")
        checked_name(d["suite"], "suite")
        checked_name(d["environment"].get("gpu_class", "unknown"), "environment.gpu_class")  # becomes a folder name
        return cls(
            kernel=d["kernel"], suite=d["suite"], suite_hash=d["suite_hash"], environment=d["environment"],
            cases=tuple(CaseResult.from_dict(c) for c in d["cases"]), tolerance=d["tolerance"],
            started_at=d["started_at"], wall_s=float(d["wall_s"]), notes=tuple(d.get("notes", [])),
            scope=d.get("scope"),
        )

    def write(self, path: Path) -> None:
        write_json_atomic(path, self.to_dict())

    @classmethod
    def read(cls, path: Path) -> "SweepResult":
        return read_record(path, kind="sweep results", schema_version=READABLE_VERSIONS,
                           from_dict=lambda d: cls.from_dict(migrate_results(d)), fix="regenerate it with `attn-gate sweep`")


SCOPE_NOTE = re.compile(r"filtered with --only (.+)")


def migrate_results(payload: dict[str, Any]) -> dict[str, Any]:
    """An older layout as the current one: 1 -> 2 moves the --only note into `scope`."""
    if payload.get("schema_version") == 1:
        notes = payload.get("notes", [])
        if not isinstance(notes, list):
            raise TypeError("notes must be a list of strings")
        scope, kept = None, []
        for note in notes:
            m = SCOPE_NOTE.fullmatch(note) if isinstance(note, str) else None
            if m is None:
                kept.append(note)
                continue
            try:  # version 1 wrote the regex with repr()
                scope = ast.literal_eval(m.group(1))
            except (ValueError, SyntaxError, RecursionError, MemoryError):
                scope = m.group(1)
            scope = str(scope)
        payload = {**payload, "schema_version": 2, "notes": kept, "scope": scope}
    return payload
