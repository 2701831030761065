"""The speed rule: pure functions from (baseline ratio, current ratio) to a judgement. No torch.

A speed ratio (candidate time / anchor time, median over interleaved rounds) FAILS only when

    change    = current / baseline - 1
    noise     = sqrt(noise_current^2 + noise_baseline^2)       relative standard errors of the medians
    threshold = max(regression_pct / 100, noise_k * noise)
    change > threshold  AND  the shift is significant (one-sided test, p < alpha)

and a re-measurement with more rounds (confirm) says the same. Two thresholds on purpose
(pyperf's compare_to: significance AND --min-speed): a significant 0.5% drift is not a
regression, and a large change inside the noise is not proof of one.

Fail closed: too few rounds, a noise band wider than max_noise_pct, a missing baseline, NaN or
infinite per-round ratios, or a test that cannot be computed give INCONCLUSIVE, which the gate
reports as such and never as a pass. An improvement beyond improvement_pct that is significant
is a WARN (refresh the baseline, or the kernel skipped work).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

from gate.speed import stats as perf_stats
from gate.core.config import PerfConfig

PASSES = ("fwd", "bwd")


class PerfSeverity(str, enum.Enum):
    OK = "OK"
    WARN = "WARN"  # significant improvement beyond improvement_pct: refresh the baseline
    FAIL = "FAIL"  # confirmed regression
    INCONCLUSIVE = "INCONCLUSIVE"  # could not judge: fail closed (the gate does not pass)

    @property
    def blocks(self) -> bool:
        return self in (PerfSeverity.FAIL, PerfSeverity.INCONCLUSIVE)


@dataclass(frozen=True)
class RatioEstimate:
    """One measured speed ratio: its median over rounds, the noise of that median, the rounds."""

    median: float
    noise: float  # relative standard error of the median (0.004 = 0.4%)
    n: int
    samples: tuple[float, ...] = ()  # per-round ratios, when kept (baselines may keep them)

    @classmethod
    def from_samples(cls, samples) -> "RatioEstimate":
        xs = tuple(float(x) for x in samples)
        return cls(median=perf_stats.median(xs), noise=perf_stats.median_rel_se(xs), n=len(xs), samples=xs)

    def to_dict(self) -> dict[str, Any]:
        return {"median": self.median, "noise": self.noise, "n": self.n, "samples": list(self.samples)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RatioEstimate":
        return cls(median=float(d["median"]), noise=float(d["noise"]), n=int(d["n"]),
                   samples=tuple(float(x) for x in d.get("samples", ())))


_DEFAULTS = PerfConfig()  # one source of truth for the thresholds: [tool.attn-gate.perf]'s defaults


@dataclass(frozen=True)
class PerfRules:
    """The thresholds `judge` applies: the subset of PerfConfig it needs, with the same defaults."""

    regression_pct: float = _DEFAULTS.regression_pct
    noise_k: float = _DEFAULTS.noise_k
    improvement_pct: float = _DEFAULTS.improvement_pct
    alpha: float = _DEFAULTS.alpha
    min_rounds: int = _DEFAULTS.min_rounds
    max_noise_pct: float = _DEFAULTS.max_noise_pct

    @classmethod
    def from_config(cls, perf_config) -> "PerfRules":
        return cls(**{f: getattr(perf_config, f) for f in cls.__dataclass_fields__})


@dataclass(frozen=True)
class PerfJudgement:
    case_id: str
    pass_: str
    severity: PerfSeverity
    message: str
    baseline: float = math.nan
    current: float = math.nan
    change: float = math.nan  # relative: +0.05 = 5% slower than the baseline
    threshold: float = math.nan
    noise: float = math.nan
    p_value: float = math.nan
    suspected: bool = False  # the first measurement crossed the line: re-measure before failing
    confirmed: bool | None = None  # None: no confirm run was made
    first_change: float = math.nan  # the first measurement's change when a confirm run decided

    @property
    def metric(self) -> str:
        return f"speed_ratio:{self.pass_}"

    def to_dict(self) -> dict[str, Any]:
        return {"case_id": self.case_id, "pass": self.pass_, "metric": self.metric, "severity": self.severity.value,
                "message": self.message, "baseline": self.baseline, "current": self.current, "change": self.change,
                "threshold": self.threshold, "noise": self.noise, "p_value": self.p_value, "suspected": self.suspected,
                "confirmed": self.confirmed, "first_change": self.first_change}


def _p_value(current: RatioEstimate, baseline: RatioEstimate, alternative: str) -> float:
    if len(baseline.samples) >= 3 and len(current.samples) >= 3:
        return perf_stats.mann_whitney(current.samples, baseline.samples, alternative)
    if current.samples:
        return perf_stats.sign_test(current.samples, baseline.median, alternative)
    return math.nan


def _not_a_ratio(est: RatioEstimate) -> str:
    """Why an estimate cannot be judged ('' when it can): a median that is not a positive number,
    or per-round ratios that are not all finite (a NaN would make the rank test meaningless)."""
    if not math.isfinite(est.median) or est.median <= 0:
        return f"median {est.median!r} is not a positive number"
    bad = sum(1 for x in est.samples if not math.isfinite(x))
    if bad:
        return f"{bad} of {len(est.samples)} per-round ratios are NaN or infinite"
    return ""


def _pct(x: float) -> str:
    return f"{x * 100:+.2f}%"


def judge(case_id: str, pass_: str, baseline: RatioEstimate | None, current: RatioEstimate | None,
          rules: PerfRules, confirm: RatioEstimate | None = None) -> PerfJudgement:
    """Judge one speed ratio. Call once; when the result is `suspected`, re-measure with more
    rounds and call again with `confirm=`: the confirm measurement is then the one of record."""
    base = dict(case_id=case_id, pass_=pass_)
    if baseline is None:
        return PerfJudgement(**base, severity=PerfSeverity.INCONCLUSIVE,
                             message="no speed baseline for this case: run `attn-gate baseline update` on this GPU class")
    bad_baseline = _not_a_ratio(baseline)
    if bad_baseline:
        return PerfJudgement(**base, severity=PerfSeverity.INCONCLUSIVE,
                             message=f"the baseline's speed ratio is unusable ({bad_baseline}): re-record it with "
                                     f"`attn-gate baseline update --perf` on this GPU class")
    if current is None or not math.isfinite(current.median) or current.median <= 0:
        return PerfJudgement(**base, severity=PerfSeverity.INCONCLUSIVE, baseline=baseline.median,
                             message="no valid measurement (the kernel or its anchor did not run)")
    values = dict(baseline=baseline.median, current=current.median)
    bad_current = _not_a_ratio(current)
    if bad_current:
        return PerfJudgement(**base, **values, severity=PerfSeverity.INCONCLUSIVE,
                             message=f"this run's speed ratio is unusable ({bad_current}): re-run on a quiet GPU")
    if current.n < rules.min_rounds or baseline.n < rules.min_rounds:
        return PerfJudgement(**base, **values, severity=PerfSeverity.INCONCLUSIVE,
                             message=f"too few rounds ({current.n} now, {baseline.n} in the baseline; need {rules.min_rounds})")
    noise = math.hypot(current.noise, baseline.noise)
    change = current.median / baseline.median - 1.0
    values.update(change=change, noise=noise)
    if not math.isfinite(noise) or rules.noise_k * noise > rules.max_noise_pct / 100:
        return PerfJudgement(**base, **values, severity=PerfSeverity.INCONCLUSIVE,
                             message=f"too noisy to judge: {rules.noise_k:g} x noise = {rules.noise_k * noise * 100:.2f}% "
                                     f"> max_noise_pct {rules.max_noise_pct:g}% (change {_pct(change)}); re-run on a quiet GPU")
    threshold = max(rules.regression_pct / 100, rules.noise_k * noise)
    values["threshold"] = threshold
    if change > threshold:
        p = _p_value(current, baseline, "greater")
        if math.isnan(p):
            return PerfJudgement(**base, **values, severity=PerfSeverity.INCONCLUSIVE,
                                 message=f"change {_pct(change)} > threshold {threshold * 100:.2f}% but no significance test was possible")
        values["p_value"] = p
        if p < rules.alpha:
            if confirm is None:
                return PerfJudgement(**base, **values, severity=PerfSeverity.FAIL, suspected=True,
                                     message=f"slower by {_pct(change)} > threshold {threshold * 100:.2f}% (p={p:.2g}); not yet confirmed")
            again = judge(case_id, pass_, baseline, confirm, rules)
            if again.severity is PerfSeverity.FAIL:
                return PerfJudgement(**{**again.__dict__, "suspected": True, "confirmed": True, "first_change": change,
                                        "message": f"slower by {_pct(again.change)} > threshold {again.threshold * 100:.2f}% "
                                                   f"(p={again.p_value:.2g}), confirmed by a re-run (first {_pct(change)})"})
            return PerfJudgement(**{**again.__dict__, "suspected": True, "confirmed": False, "first_change": change,
                                    "message": f"{again.message}; a first run's {_pct(change)} was not confirmed"})
        return PerfJudgement(**base, **values, severity=PerfSeverity.OK,
                             message=f"change {_pct(change)} beyond threshold but not significant (p={p:.2g} >= {rules.alpha:g})")
    if change < -rules.improvement_pct / 100:
        p = _p_value(current, baseline, "less")
        values["p_value"] = p
        if math.isfinite(p) and p < rules.alpha:
            return PerfJudgement(**base, **values, severity=PerfSeverity.WARN,
                                 message=f"faster by {_pct(-change)[1:]} (> {rules.improvement_pct:g}%, p={p:.2g}): "
                                         f"refresh the baseline, and check the kernel still does all its work")
    return PerfJudgement(**base, **values, severity=PerfSeverity.OK,
                         message=f"change {_pct(change)} within threshold {threshold * 100:.2f}%")
