"""Run the perf cases of a suite: candidate vs anchor through the timing engine -> PerfResult.

The anchor is another adapter (default `[tool.attn-gate.perf] anchor`, e.g. sdpa-cudnn; on a
CPU-only machine `cpu_anchor`, e.g. sdpa-math) or "matmul", a dense matmul of equal FLOPs (then
1 / speed_ratio is the kernel's efficiency against the chip's GEMM rate). A case the candidate or
the anchor cannot run is a SKIP row with the reason; a crash is an ERROR row; the run goes on.

Also here: the judging step of a speed check (`judge_perf`): compare each pass with the
baseline, re-measure suspected regressions with `confirm_rounds`, return the judgements. It fails
closed: a case the baseline timed that is skipped now or absent from the run (within --only) is
INCONCLUSIVE, and a run that judged nothing at all is one run-wide INCONCLUSIVE judgement.

Format history:
  1  first version. A row's status is written "OK" (timed), "SKIP" or "ERROR"; in memory it is
     the Status enum, "OK" being Status.PASS.
  2  each row's `case` in the case dict's schema 2 (nested parts, gate/core/cases.py);
     `migrate_perf` turns version 1's flat case dicts into it.
  3  `scope`: the --only regex the run was filtered with (null for the whole suite), a field of
     its own; earlier versions kept it as a note ("filtered with --only 'REGEX'"), which
     `migrate_perf` turns into the field.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import gc
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gate.core.cases import Case, Suite
from gate.core.config import Config, PerfConfig
from gate.core.errors import UserError, first_line
from gate.core.files import safe_name
from gate.core.identity import Environment, Scope
from gate.core.jsonio import bad_field, checked_kernel, checked_name, measured_float, read_record, write_json_atomic
from gate.core.results import Status, migrate_rows, scope_of_notes
from gate.speed.entries import MAX_ROUNDS, entry_host
from gate.speed.rule import PerfJudgement, PerfRules, PerfSeverity, RatioEstimate, judge
from gate.speed.timing import PASSES, KernelWorkload, MatmulWorkload, PassTiming, TimingPlan, TimingRun, time_pair

SCHEMA_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)  # migrate_perf turns each older one into the current layout
MATMUL = "matmul"
# A perf row's status as perf files spell it: a timed case is "OK" (timing judges nothing, so not "PASS").
PERF_LABELS = {Status.PASS: "OK", Status.SKIP: "SKIP", Status.ERROR: "ERROR"}


def perf_status(value: Status | str) -> Status:
    """A perf row's status from the enum or its file spelling; FAIL and unknown words are refused."""
    if isinstance(value, Status) and value in PERF_LABELS:
        return value
    for status, label in PERF_LABELS.items():
        if value == label and isinstance(value, str):
            return status
    raise ValueError(f"perf status {value!r} is not one of {', '.join(PERF_LABELS.values())}")


@dataclass(frozen=True)
class PerfCaseResult:
    """One case: status OK / SKIP / ERROR, and the raw timing run (everything else is derived).
    `anchor` is what this case was timed against: the run's anchor, or the config's
    `anchor_fallback` where the anchor cannot run the case ("" in files written before it existed:
    the run's anchor)."""

    case: Case
    status: Status  # PASS: timed; SKIP; ERROR (a string in its file spelling is taken too)
    reason: str = ""
    timing: TimingRun | None = None
    anchor: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", perf_status(self.status))

    @property
    def case_id(self) -> str:
        return self.case.id

    @property
    def label(self) -> str:
        """The status as perf files and tables spell it (OK, SKIP, ERROR)."""
        return PERF_LABELS[self.status]

    @property
    def measured(self) -> bool:
        return self.status is Status.PASS and self.timing is not None

    def pass_timing(self, pass_: str) -> PassTiming | None:
        return self.timing.pass_timing(pass_) if self.timing is not None else None

    def estimate(self, pass_: str) -> RatioEstimate | None:
        p = self.pass_timing(pass_)
        return p.estimate() if p is not None else None

    def tflops(self, pass_: str, who: str = "candidate") -> float:
        p = self.pass_timing(pass_)
        if p is None:
            return math.nan
        ms = p.candidate_median_ms if who == "candidate" else p.anchor_median_ms
        return self.case.flops(pass_) / (ms * 1e-3) / 1e12

    @property
    def throttled(self) -> bool:
        return self.timing is not None and self.timing.throttled

    def kv_gbps(self, who: str = "candidate") -> float:
        """Achieved GB/s of K/V read in the forward (Case.kv_bytes over the median time): for decode,
        against the chip's memory bandwidth (H200: ~4.8 TB/s)."""
        p = self.pass_timing("fwd")
        if p is None:
            return math.nan
        ms = p.candidate_median_ms if who == "candidate" else p.anchor_median_ms
        return self.case.kv_bytes() / (ms * 1e-3) / 1e9

    def summary(self) -> dict[str, Any]:
        """Derived numbers for readers of the JSON (never read back: recomputed from `timing`)."""
        out: dict[str, Any] = {}
        for p in PASSES:
            t = self.pass_timing(p)
            if t is None:
                continue
            lo, hi = t.ratio_ci
            out[p] = {
                "speed_ratio": t.speed_ratio,
                "ci95": [lo, hi],
                "noise": t.noise,
                "spread": t.spread,
                "rounds": t.rounds,
                "candidate_ms": t.candidate_median_ms,
                "anchor_ms": t.anchor_median_ms,
                "candidate_tflops": self.tflops(p),
                "anchor_tflops": self.tflops(p, "anchor"),
            }
        if self.case.entry.kind == "kvcache" and "fwd" in out:  # a decode step is bound by reading K/V
            out["fwd"]["candidate_kv_gbps"] = self.kv_gbps()
        if self.timing is not None:
            out["peak_mem_mb"] = self.timing.peak_mem_mb
            out["throttled"] = self.throttled
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "case_id": self.case_id,
            "case": self.case.to_dict(),
            "status": self.label,
            "reason": self.reason,
            "anchor": self.anchor,
            "summary": self.summary(),
            "timing": None if self.timing is None else self.timing.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PerfCaseResult":
        timing = d.get("timing")
        if timing is not None:
            _raw_samples(timing)
        row = cls(
            case=Case.from_dict(d["case"]),
            status=d["status"],
            reason=d.get("reason", ""),
            timing=None if timing is None else TimingRun.from_dict(timing),
            anchor=d.get("anchor", ""),
        )
        if d.get("case_id") != row.case.id:
            raise ValueError(f"case_id {str(d.get('case_id'))[:80]!r} is not the id of its case ({row.case.id})")
        if not isinstance(row.reason, str) or not isinstance(row.anchor, str):
            raise TypeError(f"{row.case_id}: reason and anchor must be strings")
        if row.status is Status.PASS:
            if row.timing is None:
                raise ValueError(f"{row.case_id}: status OK without timing (a timed row carries its samples)")
            check_timing(row.timing, row.case_id)
        return row

    def anchor_or(self, run_anchor: str) -> str:
        """The anchor this case was timed against (`run_anchor` when the row does not say)."""
        return self.anchor or run_anchor

    def fell_back(self, run_anchor: str) -> bool:
        """Whether this case was timed against the anchor fallback, not the run's anchor."""
        return self.anchor_or(run_anchor) != run_anchor


@dataclass(frozen=True)
class PerfResult:
    kernel: str
    anchor: str
    suite: str
    device: str
    environment: dict[str, Any]
    plan: TimingPlan
    cases: tuple[PerfCaseResult, ...]
    started_at: str
    wall_s: float
    schema_version: int = SCHEMA_VERSION
    notes: tuple[str, ...] = field(default_factory=tuple)
    scope: Scope = field(default_factory=Scope)  # the --only filter the run was timed with

    def case(self, case_id: str) -> PerfCaseResult | None:
        return next((c for c in self.cases if c.case_id == case_id), None)

    @property
    def env(self) -> Environment:
        """The environment record, typed."""
        return Environment.from_dict(self.environment)

    @property
    def host(self) -> str:
        """The digest of the host that timed the run (gate/core/environment.py host_id); '' unknown
        (a file from before hosts were recorded, or merged from several hosts)."""
        return self.env.host or ""

    @property
    def any_error(self) -> bool:
        return any(c.status is Status.ERROR for c in self.cases)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "kind": "attn-gate perf",
            "kernel": self.kernel,
            "anchor": self.anchor,
            "suite": self.suite,
            "device": self.device,
            "environment": self.environment,
            "plan": self.plan.to_dict(),
            "started_at": self.started_at,
            "wall_s": round(self.wall_s, 2),
            "notes": list(self.notes),
            "scope": self.scope.only,
            "cases": [c.to_dict() for c in self.cases],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PerfResult":
        """Every field a judgement uses, checked (type, range, consistency): a file that would be
        judged on something other than what it claims is refused, never judged."""
        checked_kernel(d["kernel"], "kernel")
        checked_name(d["suite"], "suite")
        if not isinstance(d["anchor"], str) or not isinstance(d["started_at"], str):
            raise TypeError("anchor and started_at must be strings")
        if not isinstance(d["environment"], dict) or not isinstance(d["cases"], list):
            raise TypeError("environment must be an object and cases a list")
        if d["device"] not in ("cpu", "cuda"):
            raise ValueError(f"device = {str(d['device'])[:40]!r} must be 'cpu' or 'cuda'")
        if d["environment"].get("device", d["device"]) != d["device"]:
            raise ValueError(
                f"device = {d['device']!r} but environment.device = {d['environment']['device']!r}: "
                f"the file contradicts itself"
            )
        notes = d.get("notes", [])
        if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
            raise TypeError("notes must be a list of strings")
        if not d["cases"]:
            raise ValueError("cases = []: the file holds no perf case, so nothing was timed")
        scope = d.get("scope")
        if scope is not None and not isinstance(scope, str):
            raise TypeError(f"scope = {str(scope)[:200]!r} must be a regular expression (a string) or null")
        try:
            Scope(scope).pattern
        except ValueError as exc:
            raise ValueError(f"scope = {str(scope)[:200]!r} {exc}") from None
        plan = checked_plan(d["plan"], "plan")
        cases = []
        for i, row in enumerate(d["cases"]):
            try:
                case = PerfCaseResult.from_dict(row)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise ValueError(f"cases[{i}]: {bad_field(exc)}") from None
            if case.measured:
                passes = tuple(p.pass_ for p in case.timing.passes)
                if not set(passes) <= set(plan.passes):
                    raise ValueError(
                        f"cases[{i}] ({case.case_id}): times passes {list(passes)} but the run's plan has "
                        f"{list(plan.passes)}"
                    )
            cases.append(case)
        ids = [c.case_id for c in cases]
        twice = next((cid for cid in ids if ids.count(cid) > 1), None)
        if twice:
            raise ValueError(f"case {twice} appears twice in cases")
        return cls(
            kernel=d["kernel"],
            anchor=d["anchor"],
            suite=d["suite"],
            device=d["device"],
            environment=d["environment"],
            plan=plan,
            cases=tuple(cases),
            started_at=d["started_at"],
            wall_s=measured_float(d["wall_s"], "wall_s", 1e7),
            notes=tuple(notes),
            scope=Scope(scope),
        )

    def write(self, path: Path) -> None:
        write_json_atomic(path, self.to_dict())

    @classmethod
    def read(cls, path: Path) -> "PerfResult":
        return read_record(
            path,
            kind="perf results",
            schema_version=READABLE_VERSIONS,
            from_dict=lambda d: cls.from_dict(migrate_perf(d)),
            file_kind="attn-gate perf",
            fix="regenerate it with `attn-gate perf`",
        )


# A timed call of a millisecond-scale kernel: beyond these no measurement (an hour per call, a
# millionfold scale) is meant; zero, negative or NaN would make a ratio 0, negative, inf or NaN.
MAX_CALL_MS = 3.6e6
MAX_ANCHOR_SCALE = 1e6
MAX_CALLS = 100  # as calls_per_round


def checked_plan(value: Any, field: str) -> TimingPlan:
    """A stored TimingPlan: counts within the config's ranges, passes a non-empty subset of PASSES."""
    if not isinstance(value, dict):
        raise TypeError(f"{field} must be an object")
    for key, top in (("rounds", MAX_ROUNDS), ("calls_per_round", MAX_CALLS)):
        n = value.get(key)
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= top:
            raise ValueError(f"{field}.{key} = {str(n)[:40]} must be an integer in [1, {top}]")
    passes = value.get("passes")
    if (
        not isinstance(passes, list)
        or not passes
        or any(p not in PASSES for p in passes)
        or len(set(passes)) != len(passes)
    ):
        raise ValueError(
            f"{field}.passes = {str(passes)[:60]} must be a non-empty list of distinct passes from {list(PASSES)}"
        )
    return TimingPlan.from_dict(value)


def _raw_samples(timing: Any) -> None:
    """Samples as the file holds them: JSON numbers (true, "5" or null would be read as 1.0, 5.0 or
    refused by float() further down; none of them is a time a run wrote)."""
    if not isinstance(timing, dict) or not isinstance(timing.get("passes"), list):
        raise TypeError("timing must be an object with a list of passes")
    for p in timing["passes"]:
        for who in ("candidate_ms", "anchor_ms"):
            rounds = p.get(who) if isinstance(p, dict) else None
            if not isinstance(rounds, list) or not all(isinstance(r, list) for r in rounds):
                raise TypeError(f"timing pass {str(p)[:40]}: {who} must be a list of rounds, each a list of ms")
            bad = next(
                (
                    x
                    for r in rounds
                    for x in r
                    if isinstance(x, bool) or not isinstance(x, (int, float)) and x not in ("nan", "inf", "-inf")
                ),
                None,
            )
            if bad is not None:
                raise TypeError(f"timing pass {p.get('pass')!r}: {who} holds {str(bad)[:40]!r}, not a number of ms")
        scale = p.get("anchor_scale", 1.0)
        if isinstance(scale, bool) or not isinstance(scale, (int, float, str)):
            raise TypeError(f"timing pass {p.get('pass')!r}: anchor_scale = {str(scale)[:40]!r} is not a number")


def check_timing(run: TimingRun, case_id: str) -> None:
    """A timed row's samples: what every speed ratio is computed from. Refused: a pass not of
    PASSES or twice, no round, candidate and anchor of different round counts, an empty round, a
    sample or anchor scale that is zero, negative, NaN or absurdly large."""
    checked_plan(run.plan.to_dict(), f"{case_id}: timing.plan")
    names = [p.pass_ for p in run.passes]
    if not names:
        raise ValueError(f"{case_id}: timing.passes = []: a timed row times at least one pass")
    if any(n not in PASSES for n in names) or len(set(names)) != len(names):
        raise ValueError(f"{case_id}: timing.passes {names} must be distinct passes from {list(PASSES)}")
    for p in run.passes:
        where = f"{case_id}: timing pass {p.pass_}"
        if not 1 <= p.rounds <= MAX_ROUNDS or len(p.anchor_ms) != p.rounds:
            raise ValueError(
                f"{where}: {p.rounds} candidate and {len(p.anchor_ms)} anchor rounds; both must be the "
                f"same number in [1, {MAX_ROUNDS}]"
            )
        for who, rounds in (("candidate_ms", p.candidate_ms), ("anchor_ms", p.anchor_ms)):
            for r in rounds:
                if not 1 <= len(r) <= MAX_CALLS:
                    raise ValueError(f"{where}: {who} has a round of {len(r)} calls (must be 1 to {MAX_CALLS})")
                bad = next((x for x in r if not 0 < x <= MAX_CALL_MS), None)  # NaN fails too
                if bad is not None or any(math.isnan(x) for x in r):
                    raise ValueError(
                        f"{where}: {who} holds {bad!r}; a timed call is a number of ms in (0, {MAX_CALL_MS:g}]"
                    )
        if not 0 < p.anchor_scale <= MAX_ANCHOR_SCALE:
            raise ValueError(f"{where}: anchor_scale = {p.anchor_scale!r} must be in (0, {MAX_ANCHOR_SCALE:g}]")


def migrate_perf(payload: dict[str, Any]) -> dict[str, Any]:
    """An older layout as the current one: 1 -> 2 writes each row's case in the current case schema;
    2 -> 3 moves the --only note into `scope`."""
    if payload.get("schema_version") == 1:
        payload = {**payload, "schema_version": 2, "cases": migrate_rows(payload.get("cases"))}
    if payload.get("schema_version") == 2:
        scope, kept = scope_of_notes(payload.get("notes", []))
        payload = {**payload, "schema_version": 3, "notes": kept, "scope": scope}
    return payload


# --------------------------------------------------------------------------------------------
# Measuring


def resolve_anchor(name: str | None, config: PerfConfig, device: str) -> str:
    return name or config.anchor_for(device)


_ANCHORS: dict = {}


def anchor_adapter(name: str):
    """The anchor's adapter, one per process: a new one per case would throw away what it caches
    (Flex's compiled function and block masks: a recompile per case)."""
    from gate.kernels.registry import get_adapter

    if name not in _ANCHORS:
        _ANCHORS[name] = get_adapter(name)
    return _ANCHORS[name]


def case_anchor(anchor_name: str, config: PerfConfig, case: Case, device: str) -> str:
    """The anchor a case is timed against: `anchor_name`, or `config.anchor_fallback` where that
    anchor is available but cannot run the case (seen on the H200: the cuDNN anchor refuses head dim
    256, so the pr suite's d256 perf cases were never timed). Deterministic, so a baseline and the
    check that reads it pick the same anchor for a case; the row records it."""
    if anchor_name == MATMUL or not config.anchor_fallback:
        return anchor_name
    anchor = anchor_adapter(anchor_name)
    if anchor.unavailable_reason() is None and anchor.unsupported_reason(case, device):
        return config.anchor_fallback
    return anchor_name


def _workloads(adapter, anchor_name: str, case: Case, device: str):
    from gate.attention.inputs import timing_inputs

    if anchor_name == MATMUL:
        return KernelWorkload(adapter, case, device), MatmulWorkload(case, device), None
    anchor = anchor_adapter(anchor_name)
    why = anchor.unavailable_reason() or anchor.unsupported_reason(case, device)
    if why:
        return None, None, f"anchor {anchor_name} cannot run this case: {why}"
    inputs = timing_inputs(case, device)  # drawn once, shared: both kernels see the same values
    return KernelWorkload(adapter, case, device, inputs), KernelWorkload(anchor, case, device, inputs), None


def measure_case(adapter, anchor_name: str, case: Case, device: str, plan: TimingPlan) -> PerfCaseResult:
    """Time one case; never raises for a kernel problem (SKIP / ERROR rows)."""
    from gate.kernels.base import NoKernel

    why = adapter.unsupported_reason(case, device)
    if why:
        return PerfCaseResult(case=case, status=Status.SKIP, reason=why, anchor=anchor_name)
    if case.forward_only or not adapter.capabilities().backward:  # decode / inference kernels
        if "fwd" not in plan.passes:
            return PerfCaseResult(
                case=case, status=Status.SKIP, reason="forward-only: no backward to time", anchor=anchor_name
            )
        plan = dataclasses.replace(plan, passes=("fwd",))
    try:
        cand, anchor, why = _workloads(adapter, anchor_name, case, device)
        if why:
            return PerfCaseResult(case=case, status=Status.SKIP, reason=why, anchor=anchor_name)

        run = time_pair(cand, anchor, plan, device)
    except NoKernel as exc:
        return PerfCaseResult(case=case, status=Status.SKIP, reason=str(exc), anchor=anchor_name)
    except KeyboardInterrupt:  # the user stops the run: not the kernel's fault, not a row
        raise
    except BaseException as exc:  # a crashing kernel is a row, not a dead run (SystemExit too: sys.exit() in a kernel)
        return PerfCaseResult(case=case, status=Status.ERROR, reason=first_line(exc), anchor=anchor_name)
    finally:
        _release(device)
    return PerfCaseResult(case=case, status=Status.PASS, timing=run, anchor=anchor_name)


def _release(device: str) -> None:
    """The timed workloads' tensors collected, then their blocks given back (between timed cases)."""
    if device == "cuda":
        from gate.core.environment import release_cached_gpu_memory

        gc.collect()
        release_cached_gpu_memory(device)


def perf_cases_in(suite: Suite, only: str | None = None) -> tuple[Case, ...]:
    """The suite's perf cases within --only (a bad regex is a UserError, not a traceback)."""
    return Scope.of_only(only).select(suite.perf_cases)


def no_perf_case_reason(suite: Suite, only: str | None) -> str:
    if only is None or not perf_cases_in(suite):
        return f"suite {suite.name!r} has no perf cases; mark some with perf = [true] in its matrix"
    return f"--only {only!r} matches no perf case of suite {suite.name!r}"


def perf_cases(suite_name: str, config: Config, only: str | None = None) -> tuple[Case, ...]:
    suite = config.suite(suite_name)
    cases = perf_cases_in(suite, only)
    if not cases:
        raise UserError(no_perf_case_reason(suite, only))
    return cases


@dataclass(frozen=True)
class PerfTarget:
    """What one speed run times, resolved once (from a run plan, or by `attn-gate perf` and the asv
    benchmark): the kernel by name, the suite and the --only scope that choose its perf cases, the
    device, the anchor (resolved, never None) and the perf settings."""

    kernel: str
    suite: Suite
    device: str
    anchor: str
    perf: PerfConfig
    scope: Scope = Scope()

    @classmethod
    def of(
        cls,
        kernel: str,
        suite: Suite,
        perf: PerfConfig,
        device: str | None = None,
        anchor: str | None = None,
        only: str | None = None,
    ) -> "PerfTarget":
        """Defaults filled in: the machine's device, the config's anchor for it; --only checked."""
        from gate.core.environment import default_device

        device = device or default_device()
        return cls(kernel, suite, device, resolve_anchor(anchor, perf, device), perf, Scope.of_only(only or None))

    @property
    def cases(self) -> tuple[Case, ...]:
        """The suite's perf cases within the scope (empty when there are none: the caller decides)."""
        return self.scope.select(self.suite.perf_cases)


def in_process_measure(adapter, kernel: str, device: str) -> tuple[Callable, str]:
    """A `measure` (case, anchor, plan) -> PerfCaseResult that times `kernel` (its adapter, as the
    command resolved it) in this process, and the kernel's version."""
    missing = adapter.unavailable_reason()
    if missing:
        raise UserError(f"kernel {kernel!r} is unavailable here: {missing}")

    def measure(case, anchor_name, plan):
        return measure_case(adapter, anchor_name, case, device, plan)

    return measure, adapter.version()


def run_perf(
    target: PerfTarget,
    measure: Callable,
    kernel_version: str | None = None,
    rounds: int | None = None,
    progress: Callable[[str], None] | None = None,
    passes: tuple[str, ...] = PASSES,
) -> PerfResult:
    """The target's perf cases timed through `measure` (case, anchor, plan) -> PerfCaseResult: in
    this process (in_process_measure) or in a worker (gate/workflow/isolation.py: this process then
    never imports the kernel); `kernel_version` is what that process reported. `rounds` None: the
    config's."""
    from gate.core.environment import describe, host_id

    device, anchor_name = target.device, target.anchor
    if anchor_name != MATMUL:
        missing = anchor_adapter(anchor_name).unavailable_reason()
        if missing:
            raise UserError(
                f"--anchor {anchor_name!r} is unavailable here: {missing}; pick another "
                f"(attn-gate kernels) or 'matmul', or set [tool.attn-gate.perf] anchor"
            )
    cases = target.cases
    if not cases:
        raise UserError(no_perf_case_reason(target.suite, target.scope.only))
    plan = TimingPlan.from_config(target.perf, rounds=rounds, passes=passes)
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    results = []
    for case in cases:
        results.append(measure(case, case_anchor(anchor_name, target.perf, case, device), plan))
        if progress:
            progress(f"{results[-1].label:5} {case.id} {results[-1].reason}")
    env = describe(device, target.kernel, kernel_version or "")
    env["anchor"] = anchor_name
    env["host"] = host_id(device)  # only here: the speed rule's limit depends on it (gate/speed/rule.py)
    notes = ("CPU timings (perf_counter, no L2 flush): history only, not a gate",) if device != "cuda" else ()
    return PerfResult(
        kernel=target.kernel,
        anchor=anchor_name,
        suite=target.suite.name,
        device=device,
        environment=env,
        plan=plan,
        cases=tuple(results),
        started_at=started,
        wall_s=time.perf_counter() - t0,
        notes=notes,
        scope=target.scope,
    )


def run_perf_here(
    target: PerfTarget,
    adapter,
    rounds: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> PerfResult:
    """run_perf with the kernel's adapter timed in this process (`attn-gate perf`, the asv benchmark)."""
    measure, version = in_process_measure(adapter, target.kernel, target.device)
    return run_perf(target, measure, version, rounds, progress)


def write_perf_outputs(result: PerfResult, out_dir: Path) -> Path:
    path = Path(out_dir) / f"perf-{safe_name(result.kernel)}-{result.suite}.json"
    result.write(path)
    return path


# --------------------------------------------------------------------------------------------
# Baseline entries and judging


def baseline_entry(c: PerfCaseResult, anchor: str, host: str) -> dict[str, Any] | None:
    """What a baseline keeps for one case: per pass the ratio median, its noise, the rounds and
    the per-round ratios (rounded: readable diffs), the anchor it was measured against (the
    row's own, a fallback included; `anchor`, the run's, for a row that does not say) and the
    `host` that timed it (the run's host digest, '' unknown). A pass recorded on purpose (above
    max_noise_pct, or unable to pass against itself) carries `"noisy": true` (`mark_noisy`)."""
    if not c.measured:
        return None
    entry: dict[str, Any] = {"anchor": c.anchor_or(anchor), "host": host}
    for p in PASSES:
        est = c.estimate(p)
        if est is not None:
            entry[p] = {
                "median": round(est.median, 6),
                "noise": round(est.noise, 6),
                "n": est.n,
                "samples": [round(x, 6) for x in est.samples],
            }
    return entry


def noisy_passes(section: dict[str, Any], config: PerfConfig) -> list[tuple[str, str, float]]:
    """(case id, pass, noise band) of every pass of a speed section whose noise band (noise_k x
    the median's standard error) exceeds max_noise_pct, noisiest first."""
    out = []
    for case_id, entry in section.items():
        for p in _timed_passes(entry, PASSES):
            band = config.noise_k * float(entry[p]["noise"])
            if not band <= config.max_noise_pct / 100:  # NaN noise is noisy too
                out.append((case_id, p, band))
    return sorted(out, key=lambda t: -t[2] if math.isfinite(t[2]) else -math.inf)


def unresolvable_passes(section: dict[str, Any], config: PerfConfig, device: str) -> list[PerfJudgement]:
    """`judge`'s verdict on every pass of a speed section that fails against itself (its own rounds as
    the run), the widest interval first: an unchanged kernel would be INCONCLUSIVE against such a
    pass on every check (a transient in some rounds, a bimodal launch, too few rounds)."""
    rules = PerfRules.from_config(config, device)
    out = []
    for case_id, entry in section.items():
        for p in _timed_passes(entry, PASSES):
            est = RatioEstimate.from_dict(entry[p])
            against_itself = judge(case_id, p, est, est, rules)
            if against_itself.severity is not PerfSeverity.OK:
                out.append(against_itself)
    return sorted(out, key=lambda j: -j.ci_high if math.isfinite(j.ci_high) else -math.inf)


def mark_noisy(section: dict[str, Any], noisy: list[tuple[str, str, float]]) -> dict[str, Any]:
    """The section with `"noisy": true` on each listed pass (recorded on purpose: --accept-noisy)."""
    out = {cid: dict(entry) if isinstance(entry, dict) else entry for cid, entry in section.items()}
    for case_id, p, _ in noisy:
        out[case_id][p] = {**out[case_id][p], "noisy": True}
    return out


def baseline_estimate(entry: dict[str, Any] | None, pass_: str) -> RatioEstimate | None:
    if not entry or pass_ not in entry:
        return None
    return RatioEstimate.from_dict(entry[pass_])


def _inconclusive(case_id: str, pass_: str, message: str) -> PerfJudgement:
    return PerfJudgement(case_id=case_id, pass_=pass_, severity=PerfSeverity.INCONCLUSIVE, message=message)


def _timed_passes(entry: Any, passes: tuple[str, ...]) -> tuple[str, ...]:
    """The passes a baseline entry holds a speed ratio for (none for a missing or odd entry)."""
    return tuple(p for p in passes if isinstance(entry, dict) and p in entry)


def unmatched_baseline_judgements(
    baseline_perf: dict[str, Any] | None, run_case_ids: set[str], only: str | None, passes: tuple[str, ...]
) -> tuple[PerfJudgement, ...]:
    """INCONCLUSIVE for every baseline speed ratio within --only that the run has no case for:
    a perf case that disappeared (renamed, perf flag dropped) is not judged, so it cannot pass."""

    scope = Scope.of_only(only)
    return tuple(
        _inconclusive(
            case_id,
            p,
            "the baseline has a speed ratio for this case but this run has no such perf case: "
            "refresh the baseline's speed section (`attn-gate baseline update --perf`) on purpose",
        )
        for case_id, entry in sorted((baseline_perf or {}).items())
        if case_id not in run_case_ids and scope.admits(case_id)
        for p in _timed_passes(entry, passes)
    )


def nothing_judged(result: PerfResult) -> PerfJudgement:
    """The one run-wide judgement when no case was judged: nothing judged is not a pass."""
    why = "; ".join(f"{c.case_id}: {c.label} {c.reason}".strip() for c in result.cases[:3])
    more = f" (and {len(result.cases) - 3} more)" if len(result.cases) > 3 else ""
    return _inconclusive(
        "",
        "all",
        f"speed not judged: none of the {len(result.cases)} perf cases was timed against a "
        f"baseline speed ratio ({why}{more})",
    )


# Passes this short move with the host, not only with the kernel: on the H200, SDPA flash's seqlen-512
# forward passes (23-38 us) read 3.6-6.6% slower against a baseline recorded a day earlier on another
# host, kernel and timing code unchanged, while every pass of 0.1 ms or more moved at most +1.8% (one
# +3.4% inside its noise allowance). Such a FAIL stays a FAIL (fail
# closed); its message says so, so a maintainer looks at the runner before the kernel.
SHORT_PASS_MS = 0.1


def _short_pass_note(c: PerfCaseResult, pass_: str) -> str:
    t = c.pass_timing(pass_) if c.measured else None
    ms = None if t is None else t.candidate_median_ms
    if ms is None or not ms < SHORT_PASS_MS:
        return ""
    return (
        f"; a {ms * 1000:.0f} us pass: passes under {SHORT_PASS_MS * 1000:.0f} us also move between hosts (up to "
        f"+6.6% seen on an H200): if the runner's host changed since the baseline, re-record the baseline there"
    )


def judge_perf(
    result: PerfResult,
    baseline_perf: dict[str, Any],
    config: PerfConfig,
    remeasure: Callable[[Case, str, int], RatioEstimate | None] | None = None,
    only: str | None = None,
) -> tuple[PerfJudgement, ...]:
    """One judgement per measured case and pass. A suspected regression is re-measured with
    `confirm_rounds` through `remeasure(case, pass_, rounds)` (None or confirm_rounds 0: no confirm,
    the suspicion stands as a FAIL). Fail closed: a case skipped now that the baseline timed, a
    baseline speed ratio within `only` (the run's --only) that the run has no case for, and a run
    that judged nothing at all are INCONCLUSIVE. Never returns an empty tuple."""
    rules = PerfRules.from_config(config, result.device)
    out = []
    for c in result.cases:
        entry = (baseline_perf or {}).get(c.case_id)
        if c.status is Status.SKIP:  # skipped then and now: nothing to compare; timed then, skipped now: not judged
            out += [
                _inconclusive(
                    c.case_id,
                    p,
                    f"skipped now ({c.reason}) but the baseline has a speed ratio for it: "
                    f"not judged; make it run again, or refresh the baseline on purpose",
                )
                for p in _timed_passes(entry, result.plan.passes)
            ]
            continue
        # a forward-only case was timed forward only: judged on the passes it has
        timed = tuple(p for p in result.plan.passes if not c.measured or c.pass_timing(p) is not None)
        if c.measured:  # a pass the baseline times and this row does not is not judged, so it cannot pass
            out += [
                _inconclusive(
                    c.case_id,
                    p,
                    f"the baseline has a speed ratio for pass {p} but this run did not time "
                    f"it: not judged; time it again, or refresh the baseline on purpose",
                )
                for p in _timed_passes(entry, PASSES)
                if p not in timed
            ]
        for p in timed:
            base = baseline_estimate(entry, p)
            anchor = c.anchor_or(result.anchor)
            if c.measured and entry is not None and entry.get("anchor") not in (None, anchor):
                # (an unmeasured row is judged below as "not measured: <why>", whatever its anchor)
                out.append(
                    _inconclusive(
                        c.case_id,
                        p,
                        f"baseline was measured against anchor {entry.get('anchor')!r}, this run against "
                        f"{anchor!r}: refresh the baseline on purpose (`attn-gate baseline update`), or set "
                        f"[tool.attn-gate.perf] anchor / anchor_fallback back to what it was",
                    )
                )
                continue
            current = c.estimate(p) if c.measured else None
            here = rules.across_hosts(entry_host(entry), result.host)
            j = judge(c.case_id, p, base, current, here)
            if j.wants_remeasure and remeasure is not None and config.confirm_rounds > 0:
                j = judge(c.case_id, p, base, current, here, confirm=remeasure(c.case, p, config.confirm_rounds))
            if c.status is Status.ERROR and not c.measured:
                j = PerfJudgement(case_id=c.case_id, pass_=p, severity=j.severity, message=f"not measured: {c.reason}")
            elif j.severity is PerfSeverity.FAIL:
                j = dataclasses.replace(j, message=j.message + _short_pass_note(c, p))
            out.append(j)
    out += unmatched_baseline_judgements(baseline_perf, {c.case_id for c in result.cases}, only, result.plan.passes)
    return tuple(out) or (nothing_judged(result),)


def remeasure_with(target: PerfTarget, measure: Callable) -> Callable[[Case, str, int], RatioEstimate | None]:
    """A `remeasure` for judge_perf: times one pass of one case of `target` again with more rounds,
    through `measure` as run_perf did (in this process or in a worker)."""

    def remeasure(case: Case, pass_: str, rounds: int) -> RatioEstimate | None:
        plan = TimingPlan.from_config(target.perf, rounds=rounds, passes=(pass_,))
        used = case_anchor(
            target.anchor, target.perf, case, target.device
        )  # the anchor the case was first timed against
        c = measure(case, used, plan)
        return c.estimate(pass_) if c.measured else None

    return remeasure
