"""The speed rule: pure functions from (baseline ratios, current ratios) to a judgement. No torch.

A speed ratio (candidate time / anchor time, per interleaved round) is compared with the
baseline's by an interval, not a point:

    change   = median(current ratios) / median(baseline ratios) - 1       (what every report shows)
    interval = exp() - 1 of the Mann-Whitney confidence interval (1 - alpha) of the Hodges-Lehmann
               shift of log(current ratios) over log(baseline ratios)
    limit    = regression_pct (cpu_regression_pct where the run was timed on a CPU); where the
               baseline's ratio was timed on another host, or either host is unknown,
               max(that, cross_host_regression_pct): one GPU class drifts a few % between hosts

    FAIL          the whole interval is above +limit   (then re-measured: confirm_rounds)
    OK            the whole interval is at or below +limit
    INCONCLUSIVE  the interval straddles +limit        (then re-measured: confirm_rounds)
    WARN          the whole interval is below -max(improvement_pct, limit) (refresh the baseline)

The interval is the significance gate (it replaces "noise_k x noise", which only bounds what a
baseline may record: max_noise_pct); the limit is the practical size (pyperf's compare_to:
significance AND --min-speed). Log ratios because a slowdown is a factor: the shift of logs is
one number for a 0.9 and a 1.4 ratio alike, and exp() of its interval is the interval of the
factor. A re-measurement with more rounds is the measurement of record for a FAIL (it must
confirm it) or a straddle (it may settle it).

Fail closed: too few rounds, a missing baseline, NaN or infinite per-round ratios, or an
interval that cannot be computed give INCONCLUSIVE, which the gate reports as such and never as a
pass.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass
from typing import Any

from gate.core.config import PerfConfig
from gate.speed import stats as perf_stats

PASSES = ("fwd", "bwd")


class PerfSeverity(str, enum.Enum):
    OK = "OK"
    WARN = "WARN"  # faster beyond improvement_pct (whole interval): refresh the baseline
    FAIL = "FAIL"  # confirmed regression
    INCONCLUSIVE = "INCONCLUSIVE"  # could not judge: fail closed (the gate does not pass)

    @property
    def blocks(self) -> bool:
        return self in (PerfSeverity.FAIL, PerfSeverity.INCONCLUSIVE)


@dataclass(frozen=True)
class RatioEstimate:
    """One measured speed ratio: its median over rounds, the noise of that median, the rounds;
    `noisy`: a baseline recorded on purpose (--accept-noisy) with a noise band above max_noise_pct
    or rounds that cannot pass against themselves."""

    median: float
    noise: float  # relative standard error of the median (0.004 = 0.4%)
    n: int
    samples: tuple[float, ...] = ()  # per-round ratios, when kept (baselines may keep them)
    noisy: bool = False

    @classmethod
    def from_samples(cls, samples) -> "RatioEstimate":
        xs = tuple(float(x) for x in samples)
        return cls(median=perf_stats.median(xs), noise=perf_stats.median_rel_se(xs), n=len(xs), samples=xs)

    def to_dict(self) -> dict[str, Any]:
        out = {"median": self.median, "noise": self.noise, "n": self.n, "samples": list(self.samples)}
        return {**out, "noisy": True} if self.noisy else out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RatioEstimate":
        noisy = d.get("noisy", False)
        if not isinstance(noisy, bool):
            raise TypeError(f"noisy = {noisy!r} must be true or false")
        return cls(
            median=float(d["median"]),
            noise=float(d["noise"]),
            n=int(d["n"]),
            samples=tuple(float(x) for x in d.get("samples", ())),
            noisy=noisy,
        )

    def noise_band(self, noise_k: float) -> float:
        """noise_k x the median's relative standard error: what max_noise_pct bounds in a baseline."""
        return noise_k * self.noise


_DEFAULTS = PerfConfig()  # one source of truth for the thresholds: [tool.attn-gate.perf]'s defaults


class HostMatch(str, enum.Enum):
    """Where a baseline's speed ratio was timed, against this run's host."""

    SAME = "same"
    OTHER = "other"
    UNKNOWN = "unknown"  # either host not recorded (a baseline from before hosts were recorded)

    @classmethod
    def of(cls, baseline_host: str, run_host: str) -> "HostMatch":
        if not baseline_host or not run_host:
            return cls.UNKNOWN
        return cls.SAME if baseline_host == run_host else cls.OTHER


@dataclass(frozen=True)
class PerfRules:
    """The thresholds `judge` applies: the subset of PerfConfig it needs, with the same defaults.
    `regression_pct` is the limit of the device the run was timed on (from_config picks it);
    `limit_pct` the one applied: the larger cross-host one unless both hosts are known and equal."""

    regression_pct: float = _DEFAULTS.regression_pct
    cross_host_regression_pct: float = _DEFAULTS.cross_host_regression_pct
    host: HostMatch = HostMatch.SAME
    noise_k: float = _DEFAULTS.noise_k
    improvement_pct: float = _DEFAULTS.improvement_pct
    alpha: float = _DEFAULTS.alpha
    min_rounds: int = _DEFAULTS.min_rounds
    max_noise_pct: float = _DEFAULTS.max_noise_pct

    @property
    def confidence(self) -> float:
        return 1.0 - self.alpha

    @property
    def limit_pct(self) -> float:
        if self.host is HostMatch.SAME:
            return self.regression_pct
        return max(self.regression_pct, self.cross_host_regression_pct)

    def across_hosts(self, baseline_host: str, run_host: str) -> "PerfRules":
        """These rules for a baseline ratio timed on `baseline_host` and a run on `run_host` ('' unknown)."""
        return dataclasses.replace(self, host=HostMatch.of(baseline_host, run_host))

    @classmethod
    def from_config(cls, perf_config, device: str = "cuda") -> "PerfRules":
        fields = {f: getattr(perf_config, f) for f in cls.__dataclass_fields__ if f != "host"}
        return cls(**{**fields, "regression_pct": perf_config.regression_pct_for(device)})


@dataclass(frozen=True)
class PerfJudgement:
    case_id: str
    pass_: str
    severity: PerfSeverity
    message: str
    baseline: float = math.nan
    current: float = math.nan
    change: float = math.nan  # relative: +0.05 = 5% slower than the baseline (ratio of medians)
    threshold: float = math.nan  # the regression limit, relative
    noise: float = math.nan
    ci_low: float = math.nan  # the change's confidence interval, relative
    ci_high: float = math.nan
    confidence: float = math.nan
    suspected: bool = False  # the first measurement crossed the line: re-measure before failing
    straddles: bool = False  # the interval straddles the limit: a re-measurement may settle it
    confirmed: bool | None = None  # None: no confirm run was made
    first_change: float = math.nan  # the first measurement's change when a confirm run decided
    statement: str = ""  # the message before its advice to refresh the baseline ("" when it gives none)

    @property
    def metric(self) -> str:
        return f"speed_ratio:{self.pass_}"

    @property
    def wants_remeasure(self) -> bool:
        return self.suspected or self.straddles

    def to_dict(self) -> dict[str, Any]:
        return {
            "case_id": self.case_id,
            "pass": self.pass_,
            "metric": self.metric,
            "severity": self.severity.value,
            "message": self.message,
            "baseline": self.baseline,
            "current": self.current,
            "change": self.change,
            "threshold": self.threshold,
            "noise": self.noise,
            "ci": [self.ci_low, self.ci_high],
            "confidence": self.confidence,
            "suspected": self.suspected,
            "straddles": self.straddles,
            "confirmed": self.confirmed,
            "first_change": self.first_change,
        }


def _pct(x: float, digits: int) -> str:
    return f"{x * 100:+.{digits}f}%"


def change_text(change: float, low: float, high: float, confidence: float) -> str:
    if not all(math.isfinite(v) for v in (change, low, high, confidence)):
        return ""
    widest = max(abs(change), abs(low), abs(high))
    digits = 2 if widest < 0.1 else 1 if widest < 1 else 0
    return f"{_pct(change, digits)} [{_pct(low, digits)}, {_pct(high, digits)}] ({confidence * 100:g}% CI)"


def change_interval(current: RatioEstimate, baseline: RatioEstimate, confidence: float) -> tuple[float, float]:
    """(low, high): the confidence interval of the change of current over baseline, relative (NaN
    where there is none).

    Two samples of per-round ratios: the Mann-Whitney interval of the Hodges-Lehmann shift of their
    logs. A baseline that kept only its median: the order-statistic interval of the current median
    against that median taken as exact (it leaves out the baseline's own noise)."""
    cur = [math.log(x) for x in current.samples]
    if baseline.samples:
        _, lo, hi = perf_stats.shift_ci(cur, [math.log(x) for x in baseline.samples], confidence)
    else:
        ref = math.log(baseline.median)
        lo, hi = perf_stats.median_ci(cur, confidence)
        lo, hi = lo - ref, hi - ref
    return math.expm1(lo), math.expm1(hi)


def _not_a_ratio(est: RatioEstimate) -> str:
    """Why an estimate cannot be judged ('' when it can): a median that is not a positive number,
    or per-round ratios that are not all finite and positive (no log, no rank of a NaN)."""
    if not math.isfinite(est.median) or est.median <= 0:
        return f"median {est.median!r} is not a positive number"
    bad = sum(1 for x in est.samples if not (math.isfinite(x) and x > 0))
    if bad:
        return f"{bad} of {len(est.samples)} per-round ratios are NaN, infinite or not positive"
    return ""


def _noisy_note(baseline: RatioEstimate, rules: PerfRules) -> str:
    if not baseline.noisy:
        return ""
    reach = change_interval(baseline, baseline, rules.confidence)[1]  # judge has checked its rounds
    against_itself = f"; its own rounds reach {_pct(reach, 2)} against themselves" if math.isfinite(reach) else ""
    band = baseline.noise_band(rules.noise_k) * 100
    return (
        f"; the baseline's speed ratio was recorded as noisy (noise band {band:.1f}%, max_noise_pct "
        f"{rules.max_noise_pct:g}%{against_itself}): re-record it with more rounds or on a quieter machine to "
        f"narrow the interval"
    )


def _host_note(rules: PerfRules) -> str:
    if rules.limit_pct == rules.regression_pct:
        return ""
    where = "baseline timed on another host" if rules.host is HostMatch.OTHER else "baseline's host unknown"
    return (
        f"; {where}: limit {rules.limit_pct:g}%; re-record the speed section on this "
        f"runner (`attn-gate baseline update --perf`) for the {rules.regression_pct:g}% limit"
    )


def judge(
    case_id: str,
    pass_: str,
    baseline: RatioEstimate | None,
    current: RatioEstimate | None,
    rules: PerfRules,
    confirm: RatioEstimate | None = None,
) -> PerfJudgement:
    """Judge one speed ratio. Call once; when the result `wants_remeasure` (a FAIL to confirm, or
    a straddle to settle), re-measure with more rounds and call again with `confirm=`: the confirm
    measurement is then the one of record (a FAIL must be confirmed by it to stand)."""
    base = dict(case_id=case_id, pass_=pass_)
    if baseline is None:
        return PerfJudgement(
            **base,
            severity=PerfSeverity.INCONCLUSIVE,
            message="no speed baseline for this case: run `attn-gate baseline update` on this GPU class",
        )
    bad_baseline = _not_a_ratio(baseline)
    if bad_baseline:
        return PerfJudgement(
            **base,
            severity=PerfSeverity.INCONCLUSIVE,
            message=f"the baseline's speed ratio is unusable ({bad_baseline}): re-record it with "
            f"`attn-gate baseline update --perf` on this GPU class",
        )
    if current is None or not math.isfinite(current.median) or current.median <= 0:
        return PerfJudgement(
            **base,
            severity=PerfSeverity.INCONCLUSIVE,
            baseline=baseline.median,
            message="no valid measurement (the kernel or its anchor did not run)",
        )
    values: dict[str, Any] = dict(baseline=baseline.median, current=current.median)
    bad_current = _not_a_ratio(current)
    if bad_current:
        return PerfJudgement(
            **base,
            **values,
            severity=PerfSeverity.INCONCLUSIVE,
            message=f"this run's speed ratio is unusable ({bad_current}): re-run on a quiet machine",
        )
    if current.n < rules.min_rounds or baseline.n < rules.min_rounds or len(current.samples) < rules.min_rounds:
        return PerfJudgement(
            **base,
            **values,
            severity=PerfSeverity.INCONCLUSIVE,
            message=f"too few rounds ({current.n} now, {baseline.n} in the baseline; need {rules.min_rounds})",
        )
    change = current.median / baseline.median - 1.0
    low, high = change_interval(current, baseline, rules.confidence)
    limit = rules.limit_pct / 100
    values.update(
        change=change,
        noise=math.hypot(current.noise, baseline.noise),
        threshold=limit,
        ci_low=low,
        ci_high=high,
        confidence=rules.confidence,
    )
    notes = _noisy_note(baseline, rules) + _host_note(rules)
    if not (math.isfinite(low) and math.isfinite(high)):
        return PerfJudgement(
            **base,
            **values,
            severity=PerfSeverity.INCONCLUSIVE,
            message=f"{pass_} {_pct(change, 2)}: no {rules.confidence * 100:g}% confidence interval "
            f"from {current.n} and {baseline.n} rounds; re-run with more rounds{notes}",
        )
    first = f"{pass_} {change_text(change, low, high, rules.confidence)}"
    if confirm is not None:
        again = judge(case_id, pass_, baseline, confirm, rules)
        if again.severity is PerfSeverity.FAIL and low > limit:
            return PerfJudgement(
                **{
                    **again.__dict__,
                    "suspected": True,
                    "confirmed": True,
                    "first_change": change,
                    "message": f"{again.message.replace('; not yet confirmed', '')}, confirmed by a "
                    f"{confirm.n}-round re-run (first {first})",
                }
            )
        # a straddle re-measured: the re-run, with more rounds, is the measurement of record
        return PerfJudgement(
            **{
                **again.__dict__,
                "suspected": low > limit,
                "confirmed": False if low > limit else None,
                "first_change": change,
                "message": f"{again.message.replace('; not yet confirmed', '')} (a {confirm.n}-round "
                f"re-run; first {first})",
            }
        )
    if low > limit:
        return PerfJudgement(
            **base,
            **values,
            severity=PerfSeverity.FAIL,
            suspected=True,
            message=f"{first}: slower, the whole interval above the {rules.limit_pct:g}% limit; "
            f"not yet confirmed{notes}",
        )
    if high <= limit:
        # an improvement is news only beyond what would count as a regression here (a CPU's 25%)
        faster = max(rules.improvement_pct, rules.limit_pct)
        if high < -faster / 100:
            statement = f"{first}: faster, the whole interval below -{faster:g}%"
            return PerfJudgement(
                **base,
                **values,
                severity=PerfSeverity.WARN,
                message=f"{statement}: refresh the baseline, and check the kernel still does all its work{notes}",
                statement=statement,
            )
        return PerfJudgement(
            **base,
            **values,
            severity=PerfSeverity.OK,
            message=f"{first}: within the {rules.limit_pct:g}% limit{notes}",
        )
    return PerfJudgement(
        **base,
        **values,
        severity=PerfSeverity.INCONCLUSIVE,
        straddles=True,
        message=f"{first}: the interval straddles the {rules.limit_pct:g}% limit; re-run with more "
        f"rounds (`rounds`) or on a quieter machine{notes}",
    )
