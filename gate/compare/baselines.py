"""Committed baselines: what a kernel measured on one GPU class, one file per (kernel, suite).

    baselines/<gpu-class>/<kernel>-<suite>.json      e.g. baselines/cpu/sdpa-cpu-smoke.json

A baseline is the reviewed memory of the gate: `attn-gate check` compares a fresh run with it,
`attn-gate baseline update` rewrites it on purpose (the diff goes in a reviewed PR). The file is
schema-versioned JSON with sorted keys, ratios rounded to 4 significant digits and cases keyed by
their stable id, so `git diff` of a baseline reads like a changelog.

Layout (schema_version 4):

    kind           "attn-gate baseline"
    kernel, suite, suite_hash, gpu_class
    environment    the fingerprint of the run (FINGERPRINT_KEYS: GPU name and class, driver, CUDA, cuDNN,
                   torch, kernel and kernel_version, attn-gate version ...)
    tolerance      the rule's multipliers the ratios were measured with (a change refuses comparison)
    measured_at    when the sweep behind it started
    commit         the git commit the sweep ran at ('' when unknown; '+dirty' with local changes),
                   so a report can link to the code the baseline was measured with
    correctness    {case_id: {"status": PASS|FAIL|ERROR|SKIP, "reason": str, "case_hash": str,
                              "tensors": {tensor: {"ratio", "max_err", "mean_err", "bound", "pt_err"}}}}
                   case_hash: the measured case's gate.core.cases.case_hash, so that when the suite
                   changes, the rows of cases that did not change can be kept by a filtered update
    perf           null, or the timing engine's section, keyed by case id (gate/speed/entries.py,
                   each row with the `host` that timed it): this module stores and round-trips it
                   untouched; `baseline update` from a correctness run keeps it.

No torch here: a baseline is plain data, read by the pure verdict.

Format history:
  1  first version.
  2  `commit`; cpu_model and cpu_capability in the environment. Version 1 files are read
     (migrated: commit ''); the next `baseline update` writes version 2.
  3  `case_hash` per row. Version 2 files are read with none (their rows cannot outlive a
     change of their suite); the next `baseline update` writes version 3.
  4  `host` per speed row (a digest of the GPU's UUID: gate/core/environment.py host_id). Version 3
     files are read with none (host unknown: judged with cross_host_regression_pct); the next
     `baseline update --perf` writes version 4 with hosts.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gate.compare.comparable import same
from gate.compare.headroom import is_headroom_regression, is_large_improvement
from gate.core.cases import Case, case_hash, exact_regex
from gate.core.errors import UserError
from gate.core.files import safe_name
from gate.core.identity import Environment, RunKey, Scope
from gate.core.jsonio import (
    bad_field,
    checked_kernel,
    checked_name,
    checked_tolerance,
    clean_json,
    measured_float,
    read_json,
    write_json_atomic,
)
from gate.core.results import ALL_TENSORS, GRADIENTS, Status, SweepResult, error_ratio, required_tensors
from gate.speed.entries import checked_baseline_perf

SCHEMA_VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)  # migrate_baseline turns each older one into the current layout
KIND = "attn-gate baseline"
# ratio, max_err and bound are each rounded to 4 significant digits: ratio and max_err / bound agree to ~1e-3
ROUNDED_REL_TOL = 2e-3

# What a baseline remembers of the run's environment (gate.core.environment.describe keys).
FINGERPRINT_KEYS = (
    "device",
    "gpu_name",
    "gpu_class",
    "compute_capability",
    "driver",
    "cuda",
    "cudnn",
    "torch",
    "python",
    "kernel",
    "kernel_version",
    "attn_gate",
    "machine",
    "cpu",
    "cpu_model",
    "cpu_capability",
)


# Environment keys whose change makes ratios less comparable (WARN) or is just worth knowing (INFO).
# `machine` (x86_64 / aarch64) is drift: CPU code paths of another ISA move ratios by up to ~0.14.
# cpu_capability: another torch dispatch level (AVX2 vs AVX512) runs other CPU code, which moved
# a dv ratio 0.246 -> 0.106 on an unchanged kernel. cpu_model is INFO: hosted CI runners change model
# from run to run; it is shown, and a ratio that moved with it is explained by it (findings.temper).
DRIFT_KEYS = (
    "gpu_name",
    "compute_capability",
    "driver",
    "cuda",
    "cudnn",
    "torch",
    "kernel",
    "kernel_version",
    "machine",
    "cpu_capability",
)
INFO_KEYS = ("attn_gate", "python", "cpu", "cpu_model")


def _round(x: float, digits: int = 4) -> float:
    """4 significant digits: far below any threshold, and diffs stay readable."""
    if not math.isfinite(x) or x == 0:
        return x
    return float(f"{x:.{digits}g}")


@dataclass(frozen=True)
class TensorBaseline:
    ratio: float
    max_err: float
    mean_err: float
    bound: float
    pt_err: float

    def to_dict(self) -> dict[str, float]:
        return {k: _round(getattr(self, k)) for k in ("ratio", "max_err", "mean_err", "bound", "pt_err")}

    @classmethod
    def from_dict(cls, d: dict[str, Any], name: str = "?") -> "TensorBaseline":
        # a failing row's error may be inf (results.UNBOUNDED_FIELDS); its status is checked below
        t = cls(
            **{
                k: measured_float(d[k], f"{name}.{k}", math.inf)
                for k in ("ratio", "max_err", "mean_err", "bound", "pt_err")
            }
        )
        # the stored ratio is never trusted over the numbers it comes from (all rounded to 4 digits)
        if not t.bound > 0:
            raise ValueError(f"{name}.bound = {t.bound!r} must be > 0 (the rounding floor is never 0)")
        expected = error_ratio(t.max_err, t.bound)
        if not math.isclose(t.ratio, expected, rel_tol=ROUNDED_REL_TOL, abs_tol=1e-12):
            raise ValueError(f"{name}.ratio = {t.ratio!r} is not max_err / bound = {expected:.4g}")
        return t


@dataclass(frozen=True)
class CaseBaseline:
    status: Status
    reason: str = ""
    tensors: dict[str, TensorBaseline] = field(default_factory=dict)
    case_hash: str | None = None  # None: written before case hashes (schema 2)

    @property
    def measured(self) -> bool:
        return self.status is not Status.SKIP

    def to_dict(self) -> dict[str, Any]:
        row = {
            "status": self.status.value,
            "reason": self.reason,
            "tensors": {name: t.to_dict() for name, t in sorted(self.tensors.items())},
        }
        if self.case_hash is not None:
            row["case_hash"] = self.case_hash
        return row

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CaseBaseline":
        """A row whose status is recomputed from its numbers both ways, as the results reader does
        (CaseResult.check_consistent), and a PASS row that lacks the tensors its case must carry
        is refused. The row keeps no Case: what the row itself shows is checked here (a row with a
        gradient needs them all); what its case adds (dbias, decode) is `Baseline.missing_tensors`."""
        tensors, reason, digest = d.get("tensors", {}), d.get("reason", ""), d.get("case_hash")
        if not isinstance(tensors, dict) or not isinstance(reason, str):
            raise TypeError("tensors must be an object keyed by tensor name and reason a string")
        if "case_hash" in d and not (isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{16}", digest)):
            # a row without a hash leaves the key out (written before hashes existed); null is an edit
            raise ValueError(f"case_hash {str(digest)[:40]!r} is not 16 hex digits")
        unknown = [name for name in tensors if name not in ALL_TENSORS]
        if unknown:
            raise ValueError(f"tensor {unknown[0]!r} is not one of {', '.join(ALL_TENSORS)}")
        case = cls(
            status=Status(d["status"]),
            reason=reason,
            tensors={name: TensorBaseline.from_dict(t, name) for name, t in tensors.items()},
            case_hash=digest,
        )
        over = [name for name, t in case.tensors.items() if not t.ratio <= 1.0]
        if case.status is Status.PASS and over:
            raise ValueError(
                f"status PASS contradicts the row: {', '.join(over)} over the bound "
                f"(ratio {max(case.tensors[n].ratio for n in over):.4g})"
            )
        if case.status is Status.FAIL and case.tensors and not over and not _names_failed_check(reason):
            # a baseline keeps no checks: a failed one survives only in the reason verdict_row wrote
            raise ValueError(
                "status FAIL contradicts the row: every tensor is within its bound and its reason names no failed check"
            )
        if case.status is Status.PASS:
            missing = case.missing_tensors()
            if missing:
                raise ValueError(f"status PASS without {', '.join(missing)}: nothing shows it is within its bounds")
        return case

    def missing_tensors(self, case: Case | None = None) -> tuple[str, ...]:
        """The tensors a PASS row lacks (required_tensors): `case`, the suite's Case of the row, says
        whether its bias trains (dbias) and whether it is forward-only (decode, fp8); without it
        only what the row shows is known. A row with no gradient at all is forward-only (decode, or
        a kernel without backward)."""
        if self.status is not Status.PASS:
            return ()
        forward_only = (case is not None and case.forward_only) or not any(g in self.tensors for g in GRADIENTS)
        bias_grad = case is not None and case.bias.grad
        return tuple(t for t in required_tensors(bias_grad, forward_only) if t not in self.tensors)


# verdict_row's reason for a failed check: "name: detail", joined by "; "
_FAILED_CHECK = re.compile(r"[a-z][a-z0-9_]*: ")


def _names_failed_check(reason: str) -> bool:
    return any(_FAILED_CHECK.match(part) for part in reason.split("; "))


@dataclass(frozen=True)
class Baseline:
    kernel: str
    suite: str
    suite_hash: str
    gpu_class: str
    environment: dict[str, str]
    tolerance: dict[str, float]
    measured_at: str
    correctness: dict[str, CaseBaseline]
    perf: dict[str, Any] | None = None
    schema_version: int = SCHEMA_VERSION
    commit: str = ""  # git commit of the run behind it; '' when unknown

    @property
    def env(self) -> Environment:
        """The environment record, typed."""
        return Environment.from_dict(self.environment)

    @classmethod
    def from_sweep(cls, sweep: SweepResult, perf: dict[str, Any] | None = None) -> "Baseline":
        run = sweep.env
        env = {k: str(run.value(k)) for k in FINGERPRINT_KEYS if run.value(k) is not None}
        cases = {
            c.case_id: CaseBaseline(
                status=c.status,
                reason=c.reason,
                tensors={
                    t.tensor: TensorBaseline(t.ratio, t.max_err, t.mean_err, t.bound, t.pt_err) for t in c.tensors
                },
                case_hash=case_hash(c.case),
            )
            for c in sweep.cases
        }
        return cls(
            kernel=sweep.kernel,
            suite=sweep.suite,
            suite_hash=sweep.suite_hash,
            gpu_class=sweep.env.gpu_class_or_unknown,
            environment=env,
            tolerance=dict(sweep.tolerance),
            measured_at=sweep.started_at,
            correctness=cases,
            perf=perf,
            commit=sweep.env.git_commit or "",
        )

    @property
    def key(self) -> RunKey:
        return RunKey.of(self.kernel, self.suite, self.suite_hash, self.tolerance, self.gpu_class)

    @property
    def failing_cases(self) -> list[str]:
        return sorted(cid for cid, c in self.correctness.items() if c.status.failed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "kind": KIND,
            "kernel": self.kernel,
            "suite": self.suite,
            "suite_hash": self.suite_hash,
            "gpu_class": self.gpu_class,
            "environment": dict(sorted(self.environment.items())),
            "tolerance": self.tolerance,
            "measured_at": self.measured_at,
            "commit": self.commit,
            "correctness": {cid: c.to_dict() for cid, c in sorted(self.correctness.items())},
            "perf": self.perf,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Baseline":
        checked_name(d["suite"], "suite")  # all three become parts of a path
        checked_name(d["gpu_class"], "gpu_class")
        checked_kernel(d["kernel"], "kernel")
        if not isinstance(d["correctness"], dict) or not isinstance(d["environment"], dict):
            raise TypeError("correctness must be an object keyed by case id and environment an object")
        for key in ("suite_hash", "measured_at"):
            if not isinstance(d[key], str):
                raise TypeError(f"{key} = {d[key]!r} must be a string")
        checked_baseline_perf(d.get("perf"))  # what judge_perf reads, checked before any judgement
        correctness = {}
        for cid, c in d["correctness"].items():
            try:
                correctness[cid] = CaseBaseline.from_dict(c)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise ValueError(f"correctness[{cid!r}]: {bad_field(exc)}") from None
        return cls(
            kernel=d["kernel"],
            suite=d["suite"],
            suite_hash=d["suite_hash"],
            gpu_class=d["gpu_class"],
            environment={str(k): str(v) for k, v in d["environment"].items()},
            tolerance=checked_tolerance(d["tolerance"]),
            measured_at=d["measured_at"],
            correctness=correctness,
            perf=d.get("perf"),
            commit=str(d.get("commit", "")),
        )

    def write(self, path: Path) -> None:
        write_json_atomic(path, self.to_dict())


def baseline_path(baselines_dir: str | Path, gpu_class: str, kernel: str, suite: str) -> Path:
    return Path(baselines_dir) / gpu_class / f"{safe_name(kernel)}-{suite}.json"


def migrate_baseline(payload: dict[str, Any]) -> dict[str, Any]:
    """An older layout as the current one: 1 -> 2 adds `commit` ('', not known then); 2 -> 3
    changes nothing present (its rows have no case_hash: unknown, not invented)."""
    if payload.get("schema_version") == 1:
        payload = {**payload, "schema_version": 2, "commit": payload.get("commit", "")}
    if payload.get("schema_version") == 2:
        payload = {**payload, "schema_version": 3}
    if payload.get("schema_version") == 3:
        payload = {**payload, "schema_version": 4}
    return payload


def read_baseline(path: Path) -> Baseline:
    """Read and validate a baseline; every problem is a UserError naming the file and the fix."""
    path = Path(path)
    return parse_baseline(read_json(path, kind="baseline", schema_version=READABLE_VERSIONS), path)


def validate_written(baseline: Baseline, path: Path, cases: Iterable[Case]) -> None:
    """What `baseline update` is about to write, read back through `parse_baseline` first: a
    baseline its own reader would refuse (a ratio that is not max_err / bound, a PASS row over its
    bound), or one with a PASS row lacking a tensor its case (of `cases`, the suite's) needs,
    is never written."""
    try:
        parse_baseline(json.loads(json.dumps(clean_json(baseline.to_dict()), allow_nan=False)), path)
        refuse_incomplete_rows(baseline, cases, path)
    except UserError as exc:
        raise UserError(
            f"refusing to write {exc}".replace(
                "restore it from git or regenerate it with", "fix the run behind it (its results file) and rerun"
            )
        ) from None


def parse_baseline(payload: dict[str, Any], path: Path) -> Baseline:
    """The one reader of a baseline's content (a file's, or one about to be written)."""
    payload = migrate_baseline(payload)
    if payload.get("kind") != KIND:
        raise UserError(
            f"{path}: this is a {payload.get('kind', 'unknown')!r} file, not an {KIND!r} file; "
            f"point to a file under baselines/<gpu-class>/ or create one with `attn-gate baseline update`"
        )
    try:
        baseline = Baseline.from_dict(payload)
    except Exception as exc:  # noqa: BLE001 - whatever a hand-edited file makes the parser raise, never a traceback
        raise _bad_field(path, bad_field(exc)) from None
    recorded = baseline.env.gpu_class
    if recorded is not None and recorded != baseline.gpu_class:
        raise UserError(
            f"{path}: gpu_class {baseline.gpu_class!r} disagrees with its environment's "
            f"{recorded!r} (hand-edited?); restore it from git or regenerate it "
            f"with `attn-gate baseline update`"
        )
    return baseline


def refuse_incomplete_rows(baseline: Baseline, cases: Iterable[Case], path: Path) -> None:
    """A PASS row lacking a tensor its case needs (CaseBaseline.missing_tensors, asked with the
    suite's Case: dbias where the bias trains) is a bad field of the file, as the reader says it."""
    for case in cases:
        row = baseline.correctness.get(case.id)
        missing = row.missing_tensors(case) if row is not None else ()
        if missing:
            problem = ValueError(f"status PASS without {', '.join(missing)}: nothing shows it is within its bounds")
            raise _bad_field(path, bad_field(ValueError(f"correctness[{case.id!r}]: {bad_field(problem)}")))


def _bad_field(path: Path, detail: str) -> UserError:
    return UserError(
        f"{path}: baseline is missing or has a bad field ({detail}); "
        f"restore it from git or regenerate it with `attn-gate baseline update`"
    )


# ---------------------------------------------------------------- the diff a maintainer reviews


@dataclass(frozen=True)
class BaselineDiff:
    """What `baseline update` changes, for a human: moved ratios are the ones the check's own
    rules would have flagged (headroom regression or large improvement); the rest is noise."""

    path: str
    created: bool
    added: tuple[str, ...]
    removed: tuple[str, ...]
    status_changes: tuple[tuple[str, str, str], ...]  # (case, old, new)
    moved: tuple[tuple[str, str, float, float], ...]  # (case, tensor, old ratio, new ratio)
    unchanged: int
    env_changes: tuple[tuple[str, str, str], ...]  # (key, old, new)
    suite_hash_change: tuple[str, str] | None
    kept_out_of_scope: int  # cases kept from the old baseline because the run was filtered
    failing: tuple[str, ...]
    dropped: tuple[tuple[str, str], ...] = ()  # (case, tensor) the old baseline had and the new one lacks

    def markdown(self) -> str:
        lines = [f"### Baseline {'created' if self.created else 'updated'}: `{self.path}`", ""]
        if self.created:
            lines.append(f"New baseline with {self.unchanged + len(self.added)} cases.")
        if self.suite_hash_change:
            lines.append(f"- suite changed: hash `{self.suite_hash_change[0]}` -> `{self.suite_hash_change[1]}`")
        for key, old, new in self.env_changes:
            lines.append(f"- environment `{key}`: {old} -> {new}")
        if not self.created:
            lines.append(
                f"- {len(self.moved)} tensor ratios moved beyond noise, {len(self.status_changes)} statuses changed, "
                f"{len(self.added)} cases added, {len(self.removed)} removed, {self.unchanged} cases unchanged"
            )
        if self.dropped:
            shown = ", ".join(f"`{c}` {t}" for c, t in self.dropped[:10])
            lines.append(
                f"- **{len(self.dropped)} tensors dropped** (in the old baseline, not measured any more, so "
                f"no longer gated): {shown}{' ...' if len(self.dropped) > 10 else ''}"
            )
        if self.kept_out_of_scope:
            lines.append(f"- {self.kept_out_of_scope} cases outside the filtered run kept as they were")
        if self.failing:
            lines.append(
                f"- **{len(self.failing)} cases fail their bounds in this baseline** (each covered by a known_failures "
                f"declaration, which `attn-gate check` reports as KNOWN): "
                + ", ".join(f"`{c}`" for c in self.failing[:10])
            )
        if self.moved:
            lines += ["", "| case | tensor | old ratio | new ratio |", "|---|---|---|---|"]
            lines += [f"| `{c}` | {t} | {o:.3f} | {n:.3f} |" for c, t, o, n in self.moved]
        if self.status_changes:
            lines += ["", "| case | old status | new status |", "|---|---|---|"]
            lines += [f"| `{c}` | {o} | {n} |" for c, o, n in self.status_changes]
        if self.added and not self.created:
            lines += ["", "Added: " + ", ".join(f"`{c}`" for c in self.added)]
        if self.removed:
            lines += ["", "Removed: " + ", ".join(f"`{c}`" for c in self.removed)]
        return "\n".join(lines) + "\n"


def cases_to_rerun(old: Baseline, suite_cases: dict[str, str]) -> list[str]:
    """The ids of `suite_cases` (id -> case_hash, the suite as it is now) that the old baseline has
    no row of the same case for: added or changed since (all of them for rows without a case_hash)."""
    return [cid for cid, digest in suite_cases.items() if not same_case(old.correctness.get(cid), digest)]


def same_case(row: CaseBaseline | None, digest: str | None) -> bool:
    """Whether a baseline row was measured on the case whose case_hash is `digest` (the suite's
    case of that id now): the one test of a row's case_hash, for every reader of a baseline."""
    return row is not None and row.case_hash is not None and row.case_hash == digest


def forged_case_hashes(baseline: Baseline, suite_cases: dict[str, str]) -> list[str]:
    """The rows whose case_hash names another case than the suite's case of that id, in a
    baseline of the suite as defined now (same suite_hash): edited by hand, so refused. Rows
    without a case_hash (written before it existed) cannot be checked and are not refused."""
    return sorted(
        cid
        for cid, row in baseline.correctness.items()
        if row.case_hash is not None and not same_case(row, suite_cases.get(cid))
    )


# Past this many cases to measure, the way out named is a whole run, not an --only of their ids.
MAX_IDS_IN_HINT = 40


def rerun_pattern(old: Baseline, rerun: list[str]) -> str | None:
    """The --only that measures just `rerun` (new or changed cases) and keeps the other rows of
    `old`; None where only a whole run will do (rows without case hashes, or too many ids)."""
    if any(c.case_hash is None for c in old.correctness.values()) or len(rerun) > MAX_IDS_IN_HINT:
        return None
    return exact_regex(rerun)


def remeasure_hint(old: Baseline, suite_cases: dict[str, str], timed: set[str], redo: str, path: Any) -> str:
    """How to bring `old` to the suite as it is now (`suite_cases`: its swept cases' id -> hash;
    `timed`: its timing cases' ids): `baseline carry` when nothing is new or changed, an --only
    of the new and changed cases (with --no-perf when none is timed, so the speed run is not asked
    for cases it has none of), or the whole suite when the rows predate hashes or the ids are many."""
    rerun = cases_to_rerun(old, suite_cases)
    if not rerun:
        return f"`attn-gate baseline carry {path}` (no case is new or changed: nothing to measure)"
    pattern = rerun_pattern(old, rerun)
    if pattern is None:
        return f"`{redo}` ({len(rerun)} cases are new or changed, or the rows predate case hashes: a whole run)"
    no_perf = "" if set(rerun) & timed else " --no-perf"
    return f"`{redo} --only '{pattern}'{no_perf}` (its {len(rerun)} new or changed cases; the other rows are kept)"


def refuse_lacking_cases(old: Baseline, suite_cases: dict[str, str], covered, what: str) -> None:
    """A filtered update of a baseline whose suite changed must measure every new or changed case:
    `covered(case_id)` says whether the run holds (or will hold) it. Refused naming the --only."""
    rerun = cases_to_rerun(old, suite_cases)
    lacking = [cid for cid in rerun if not covered(cid)]
    if lacking:
        pattern = rerun_pattern(old, rerun)
        unhashed = any(c.case_hash is None for c in old.correctness.values())
        raise UserError(
            f"the suite changed since the baseline was made: {len(lacking)} of its cases are new or "
            f"changed{' (or the baseline predates case hashes)' if unhashed else ''} and not in {what} "
            f"({', '.join(lacking[:3])}{' ...' if len(lacking) > 3 else ''}); measure them too: "
            + ("drop --only (a whole run)" if pattern is None else f"--only '{pattern}'")
        )


def timed_perf(perf: dict[str, Any] | None, timed: set[str]) -> dict[str, Any] | None:
    """A speed section without the rows of cases the suite no longer times."""
    return None if perf is None else {cid: entry for cid, entry in perf.items() if cid in timed}


def merge_baseline(
    new: Baseline, old: Baseline | None, scope: Scope, suite_cases: dict[str, str] | None = None
) -> tuple[Baseline, int]:
    """The baseline to write. A run filtered with --only replaces only the cases in its scope;
    the old baseline's other cases are kept (and counted). The perf section is always kept.
    When the suite changed since the old baseline (`suite_cases`: id -> case_hash of the suite
    now), an old row is kept only for a case that is still in the suite and unchanged, and the run
    must hold every case added or changed: else the update is refused with the --only to run."""

    if old is None:
        return new, 0
    kept = {}
    if not scope.whole:
        if not same(new.key, old.key, "tolerance"):
            raise UserError(
                f"the tolerance changed since the baseline was made, so a run filtered with --only {scope.only!r} "
                f"cannot update it piecemeal; update it from a run of the whole suite (drop --only)"
            )
        if not same(new.key, old.key, "suite_hash"):
            if suite_cases is None:
                raise UserError(
                    f"the suite changed since the baseline was made, so a run filtered with --only {scope.only!r} "
                    f"cannot update it piecemeal; update it from a run of the whole suite (drop --only)"
                )
            refuse_lacking_cases(old, suite_cases, lambda cid: cid in new.correctness, "this run")
            old_rows = {cid: c for cid, c in old.correctness.items() if cid in suite_cases}
        else:
            old_rows = old.correctness
        kept = {cid: c for cid, c in old_rows.items() if not scope.admits(cid) and cid not in new.correctness}
    merged = Baseline(
        kernel=new.kernel,
        suite=new.suite,
        suite_hash=new.suite_hash,
        gpu_class=new.gpu_class,
        environment=new.environment,
        tolerance=new.tolerance,
        measured_at=new.measured_at,
        correctness={**kept, **new.correctness},
        perf=new.perf if new.perf is not None else old.perf,
        commit=new.commit,
    )
    return merged, len(kept)


ENV_ALTERNATIVES = " | "  # a widened baseline's environment value: the machines it spans, sorted
WIDEN_KEYS = ("cpu_model",)  # what may differ between the runs a widened baseline merges


def env_values(value: Any) -> set[str]:
    """The values an environment entry of a baseline stands for (one, or a widened baseline's several)."""
    return set(str(value).split(ENV_ALTERNATIVES))


def spans_machines(baseline: Baseline) -> bool:
    return any(len(env_values(baseline.env.value(key) or "")) > 1 for key in WIDEN_KEYS)


def refuse_widen(old: Baseline | None, run: RunKey, environment: dict[str, Any] | None, path: Any) -> None:
    """What --widen needs, checked before a sweep where it can be: a committed baseline of the same
    suite and tolerance, measured with the same software (`environment`: the run's, once known);
    only the machine (WIDEN_KEYS) may differ."""
    if old is None:
        raise UserError(
            f"--widen merges this run into the committed baseline, and there is none at {path}: "
            f"record it first without --widen"
        )
    if not same(run, old.key, "suite_hash", "tolerance"):
        raise UserError(
            f"--widen: {path} was made for another suite or tolerance than this run; a widened baseline "
            f"must hold like with like: update it without --widen first"
        )
    if environment is not None:
        before, now = old.env, Environment.from_dict(environment)
        differ = [
            f"{key} {before.value(key)!r} -> {now.value(key)!r}"
            for key in DRIFT_KEYS
            if str(before.value(key)) != str(now.value(key))
        ]
        if differ:
            raise UserError(
                f"--widen: this run's {', '.join(differ)} differs from {path}; only the machine "
                f"({', '.join(WIDEN_KEYS)}) may: update it without --widen after such a change"
            )


def widen_baseline(new: Baseline, old: Baseline | None, path: Any) -> Baseline:
    """A class's baseline that spans its machines (hosted CI runners of several CPU models, whose BLAS
    paths move fp32 ratios by up to ~1.8x on an unchanged kernel): per tensor, the larger ratio of
    the two, so the headroom rule judges each machine against the worst the class showed. A case
    whose status differs between the machines is refused (a row of one of them would be lost);
    a case of one side only keeps its row. WIDEN_KEYS list every machine seen."""
    refuse_widen(old, new.key, new.environment, path)
    for key in WIDEN_KEYS:  # a span that records no machine would widen the ratios and say nothing of why
        for who, env in (("this run", new.env), (str(path), old.env)):
            if not str(env.value(key) or "").strip() or str(env.value(key)) == "unknown":
                raise UserError(
                    f"--widen: {who} records no {key}, so the machines a widened baseline spans could not "
                    f"be named; widen only with runs that record their {key} (run them with this attn-gate)"
                )
    differ = sorted(
        cid
        for cid, row in new.correctness.items()
        if cid in old.correctness and old.correctness[cid].status is not row.status
    )
    if differ:
        raise UserError(
            f"--widen: {len(differ)} cases differ in status between {path} and this run "
            f"({', '.join(differ[:3])}{', ...' if len(differ) > 3 else ''}): a baseline cannot hold both; "
            f"find out why before widening"
        )
    rows = {**old.correctness, **new.correctness}
    for cid in set(old.correctness) & set(new.correctness):
        before, now = old.correctness[cid].tensors, new.correctness[cid].tensors
        tensors = {
            name: max((t for t in (before.get(name), now.get(name)) if t is not None), key=lambda t: t.ratio)
            for name in set(before) | set(now)
        }
        rows[cid] = replace(new.correctness[cid], tensors=tensors)
    env = {**old.environment, **new.environment}
    for key in WIDEN_KEYS:
        before, now = old.env.value(key), new.env.value(key)
        if before is not None and now is not None:
            env[key] = ENV_ALTERNATIVES.join(sorted(env_values(before) | env_values(now)))
    return replace(new, correctness=rows, environment=env)


def _or_dash(value: Any) -> Any:
    return "-" if value is None else value


def diff_baselines(
    old: Baseline | None,
    new: Baseline,
    path: Path,
    headroom_factor: float,
    headroom_step: float,
    improvement_factor: float,
    kept: int = 0,
) -> BaselineDiff:
    failing = tuple(new.failing_cases)
    if old is None:
        return BaselineDiff(str(path), True, tuple(sorted(new.correctness)), (), (), (), 0, (), None, 0, failing)
    added = tuple(sorted(set(new.correctness) - set(old.correctness)))
    removed = tuple(sorted(set(old.correctness) - set(new.correctness)))
    status_changes, moved, unchanged, dropped = [], [], 0, []
    for cid in sorted(set(old.correctness) & set(new.correctness)):
        o, n = old.correctness[cid], new.correctness[cid]
        changed = False
        if n.status is Status.PASS:  # a FAIL, ERROR or SKIP row has no tensors: its status change says it
            lost = [(cid, t) for t in sorted(set(o.tensors) - set(n.tensors))]
            dropped += lost
            changed = bool(lost)
        if o.status is not n.status:
            status_changes.append((cid, o.status.value, n.status.value))
            changed = True
        for tensor in sorted(set(o.tensors) & set(n.tensors)):
            a, b = o.tensors[tensor].ratio, n.tensors[tensor].ratio
            if is_headroom_regression(a, b, headroom_factor, headroom_step) or is_large_improvement(
                a, b, improvement_factor, headroom_step
            ):
                moved.append((cid, tensor, a, b))
                changed = True
        unchanged += not changed
    before, now = old.env, new.env
    env_changes = tuple(
        (k, _or_dash(before.value(k)), _or_dash(now.value(k)))
        for k in FINGERPRINT_KEYS
        if before.value(k) != now.value(k)
    )
    hash_change = None if same(new.key, old.key, "suite_hash") else (old.suite_hash, new.suite_hash)
    return BaselineDiff(
        str(path),
        False,
        added,
        removed,
        tuple(status_changes),
        tuple(moved),
        unchanged,
        env_changes,
        hash_change,
        kept,
        failing,
        tuple(dropped),
    )


def update_command(kernel: str, suite: str, gpu_class: str) -> str:
    """The exact command that (re)creates a baseline, quoted in every message that needs one."""
    device = " --device cpu" if gpu_class == "cpu" else ""
    return f"attn-gate baseline update --kernel {kernel} --suite {suite}{device}"
