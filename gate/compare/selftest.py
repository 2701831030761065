"""The selftest's record and its decisions: controls, the kill matrix, planted slowdowns.

Pure data and decisions (no torch, no I/O): gate/workflow/selftest.py measures and fills these,
gate/report/selftest_report.py renders them. The exit code is reduced here:

    0  every control passed, every planted correctness bug was killed (a FAIL finding of the real
       check against the in-run baseline), and where slowdowns ran: no A/A false alarm and the
       largest planted slowdown caught in every repetition
    1  otherwise; `problems()` says which control, bug or slowdown, and what would catch it

A bug whose axis is a Case field this attn-gate does not have yet is PENDING: reported, not
counted (no suite can hold such a case yet). A bug whose axis the suite lacks is NOT_EXERCISED:
it survives (exit 1) and the message names the axis; NOT_APPLICABLE when the configured kernel
lacks what the bug needs (an HND-cache bug and a kernel that takes no HND cache): the gap is
reported, not counted, since that kernel cannot have the bug.

Format history (selftest.json):
  1  first version.
  2  bug status NOT_APPLICABLE.
"""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA_VERSION = 2
KIND = "attn-gate selftest"


class BugStatus(str, enum.Enum):
    KILLED = "KILLED"
    SURVIVED = "SURVIVED"  # exercised, and the gate passed it
    NOT_EXERCISED = "NOT_EXERCISED"  # the suite has no case of its axis that the host kernel runs
    NOT_PLANTED = "NOT_PLANTED"  # the wrapper could not plant it in this call form (survives: fail closed)
    PENDING = "PENDING"  # its axis is a Case field this attn-gate does not have yet: not counted
    NOT_APPLICABLE = "NOT_APPLICABLE"  # not exercised, and the configured kernel lacks what it needs: not counted

    @property
    def counts_against(self) -> bool:
        return self in (BugStatus.SURVIVED, BugStatus.NOT_EXERCISED, BugStatus.NOT_PLANTED)

    @property
    def counted(self) -> bool:
        """In the kill matrix's denominator."""
        return self not in (BugStatus.PENDING, BugStatus.NOT_APPLICABLE)


@dataclass(frozen=True)
class ControlOutcome:
    kernel: str
    passed: bool
    cases: int  # measured cases (PASS/FAIL/ERROR) of the control run
    skipped: int
    detail: str  # "" when passed; else the failing rule, case and message
    failing_cases: tuple[str, ...] = ()
    wall_s: float = 0.0


@dataclass(frozen=True)
class BugOutcome:
    name: str
    what: str
    host: str  # the adapter it was planted in: the configured kernel's name, or "tiled"
    axis: str
    status: BugStatus
    rule: str = ""  # the rule of the first FAIL finding (tolerance, status, headroom ...)
    case_id: str = ""
    metric: str = ""
    ratio: float = math.nan  # the finding's current value when numeric, else the case's worst ratio
    baseline: float = math.nan
    message: str = ""  # the finding's message (killed) or why it survived and what would catch it
    cases_run: int = 0
    exercisable: int = 0  # cases of the suite that expose the bug (and the host runs)
    wall_s: float = 0.0

    @property
    def killed(self) -> bool:
        return self.status is BugStatus.KILLED


@dataclass(frozen=True)
class SlowdownTrial:
    pass_: str
    level_pct: float  # nominal planted size; 0 for the A/A control
    rep: int
    severity: str  # the speed rule's verdict (OK / FAIL / INCONCLUSIVE / WARN)
    shift_pct: float  # measured change of the speed ratio against the in-run baseline
    candidate_shift_pct: float  # measured change of the kernel's own time (planted size as timed)
    confirmed: bool | None = None
    message: str = ""


@dataclass(frozen=True)
class SlowdownSection:
    ran: bool
    reason: str = ""  # why not (CPU), or notes (budget)
    case_id: str = ""
    anchor: str = ""
    levels_pct: tuple[float, ...] = ()
    reps_planned: int = 0
    calibration: dict[str, Any] = field(default_factory=dict)  # cycles per ms, pass times, cycles per level
    trials: tuple[SlowdownTrial, ...] = ()
    gating: bool = True  # False for the CPU rehearsal (busy-wait, CPU timings): reported, never the verdict

    def caught_every_rep(self, pass_: str, level: float) -> bool | None:
        ts = [t for t in self.trials if t.pass_ == pass_ and t.level_pct == level]
        return None if not ts else all(t.severity == "FAIL" for t in ts)

    def smallest_caught(self, pass_: str) -> float | None:
        """The smallest level caught in every repetition, with every larger level caught too."""
        best = None
        for level in sorted(self.levels_pct, reverse=True):
            if self.caught_every_rep(pass_, level):
                best = level
            else:
                break
        return best

    def false_alarms(self, pass_: str) -> tuple[int, int]:
        ts = [t for t in self.trials if t.pass_ == pass_ and t.level_pct == 0]
        return sum(1 for t in ts if t.severity == "FAIL"), len(ts)

    def aa_inconclusive(self, pass_: str) -> int:
        """A/A checks judged INCONCLUSIVE: the gate would block an unchanged kernel (fails closed)."""
        return sum(1 for t in self.trials if t.pass_ == pass_ and t.level_pct == 0 and t.severity == "INCONCLUSIVE")

    def median_shift(self, pass_: str, level: float, key: str = "shift_pct") -> float:
        xs = sorted(getattr(t, key) for t in self.trials if t.pass_ == pass_ and t.level_pct == level)
        if not xs:
            return math.nan
        mid = len(xs) // 2
        return xs[mid] if len(xs) % 2 else 0.5 * (xs[mid - 1] + xs[mid])

    def passes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t.pass_ for t in self.trials))


@dataclass(frozen=True)
class SelftestReport:
    kernel: str
    suite: str
    device: str
    environment: dict[str, Any]
    thresholds: dict[str, Any]  # tolerance multipliers and verdict/perf thresholds the run used
    controls: tuple[ControlOutcome, ...] = ()
    bugs: tuple[BugOutcome, ...] = ()
    slowdowns: SlowdownSection = field(default_factory=lambda: SlowdownSection(ran=False, reason="not run yet"))
    started_at: str = ""
    wall_s: float = 0.0
    complete: bool = False  # False in the partial files written as it goes
    notes: tuple[str, ...] = ()
    schema_version: int = SCHEMA_VERSION

    def problems(self) -> list[str]:
        """One line per reason the selftest fails; empty when it passes."""
        out = [f"control {c.kernel} failed: {c.detail}" for c in self.controls if not c.passed]
        if not self.controls:
            out.append("no control ran")
        for b in self.bugs:
            if b.status.counts_against:
                out.append(f"planted bug {b.name} ({b.what}) {b.status.value.lower().replace('_', ' ')}: {b.message}")
        s = self.slowdowns
        if s.ran and s.gating:
            for p in s.passes():
                alarms, n = s.false_alarms(p)
                if alarms:
                    out.append(
                        f"slowdown A/A control: {alarms}/{n} false alarms on {p} (the unchanged kernel failed the speed rule)"
                    )
                if s.aa_inconclusive(p):
                    out.append(
                        f"slowdown A/A control: {s.aa_inconclusive(p)}/{n} INCONCLUSIVE on {p} (too noisy to judge: "
                        f"the gate would block an unchanged kernel)"
                    )
                top = max(s.levels_pct) if s.levels_pct else None
                if top is not None and s.caught_every_rep(p, top) is False:
                    out.append(
                        f"planted {p} slowdown of {top:g}% not caught in every repetition (measured shift "
                        f"{s.median_shift(p, top):+.2f}%): lower [tool.attn-gate.perf] regression_pct or add rounds"
                    )
        if not self.complete:
            out.append("the selftest did not finish")
        return out

    @property
    def exit_code(self) -> int:
        return 0 if not self.problems() else 1

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["kind"] = KIND
        d["passed"] = self.exit_code == 0
        d["problems"] = self.problems()
        for b in d["bugs"]:
            b["status"] = b["status"].value if isinstance(b["status"], BugStatus) else b["status"]
        s = self.slowdowns
        d["slowdowns"]["summary"] = {
            p: {
                "smallest_caught_every_rep_pct": s.smallest_caught(p),
                "false_alarms": list(s.false_alarms(p)),
                "aa_inconclusive": s.aa_inconclusive(p),
                "measured_shift_median_pct": {f"{lv:g}": s.median_shift(p, lv) for lv in s.levels_pct},
            }
            for p in s.passes()
        }
        return _finite(d)


def _finite(x):
    """JSON has no NaN: not-a-number values become null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x
