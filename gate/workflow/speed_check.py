"""Speed inside `attn-gate check` and `attn-gate baseline update`: small steps, no CLI.

    check:            perf cases -> engine (candidate vs anchor) -> judge each pass against the
                      baseline's perf section (suspects re-measured with confirm_rounds) ->
                      Findings (metric "speed_ratio:fwd|bwd") joined with correctness in one verdict
    baseline update:  perf cases -> engine with confirm_rounds rounds -> the baseline's perf section
                      {case_id: {"anchor", "fwd": {median, noise, n, samples}, "bwd": {...}}}

Default: speed is gated on a GPU and not on a CPU-only machine (CPU timings on a shared CI box
are history, not evidence); `--perf` / `--no-perf` override.

When speed is wanted but cannot be timed, the report says so instead of going quiet:
  --only with no perf case in scope    INFO (nothing of speed to check there), unless the baseline
                                       has speed ratios within that scope: INCONCLUSIVE
  check --results FILE on a GPU class  WARN: the run is re-judged, but its speed half was not
                                       checked; the headline must not read as a full gate pass
  check --results FILE --perf-results  speed judged from `attn-gate perf` files by the same rule;
                                       a file cannot be re-measured, so a suspected regression is
                                       INCONCLUSIVE (fails closed, never PASS), not a confirmed FAIL
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gate.compare.baselines import Baseline
from gate.compare.findings import Advice, Finding, Rule, Severity, Subject
from gate.compare.known import apply_known_to_speed
from gate.core.config import Config, PerfConfig
from gate.core.errors import UserError
from gate.core.files import safe_name
from gate.core.identity import Environment, Scope
from gate.core.results import Status, SweepResult
from gate.core.warn import warn
from gate.report.speed_report import not_timed_section, plot_speed_ratios, speed_section
from gate.speed.rule import PASSES, PerfJudgement, PerfSeverity
from gate.speed.runs import (
    PerfResult,
    PerfTarget,
    baseline_entry,
    judge_perf,
    mark_noisy,
    no_perf_case_reason,
    noisy_passes,
    nothing_judged,
    remeasure_with,
    run_perf,
    unmatched_baseline_judgements,
    unresolvable_passes,
    write_perf_outputs,
)
from gate.workflow.isolation import PerfWorker
from gate.workflow.plan import FreshSweep, RunPlan, SavedSweep
from gate.workflow.progress import Progress
from gate.workflow.shards import expected_cost

RULE = Rule.SPEED


def perf_wanted(flag: bool | None, device: str) -> bool:
    return flag if flag is not None else device == "cuda"


def perf_findings(judgements: tuple[PerfJudgement, ...]) -> list[Finding]:
    """One Finding per case and pass. threshold is the speed ratio above which it fails."""
    out = []
    for j in judgements:
        limit = j.baseline * (1 + j.threshold) if j.threshold == j.threshold and j.baseline == j.baseline else None
        out.append(
            Finding(
                rule=RULE,
                severity=Severity(j.severity.value),
                case_id=j.case_id,
                subject=Subject.speed(j.pass_),
                baseline=None if j.baseline != j.baseline else round(j.baseline, 4),
                current=None if j.current != j.current else round(j.current, 4),
                threshold=None if limit is None else round(limit, 4),
                message=j.message,
                advice=Advice.REFRESH_BASELINE if j.statement else None,
                statement=j.statement,
            )
        )
    return out


def perf_thresholds(cfg: PerfConfig) -> dict[str, float]:
    return {
        "regression_pct": cfg.regression_pct,
        "cpu_regression_pct": cfg.cpu_regression_pct,
        "cross_host_regression_pct": cfg.cross_host_regression_pct,
        "noise_k": cfg.noise_k,
        "alpha": cfg.alpha,
        "improvement_pct": cfg.improvement_pct,
        "max_noise_pct": cfg.max_noise_pct,
        "min_rounds": float(cfg.min_rounds),
        "rounds": float(cfg.rounds),
        "confirm_rounds": float(cfg.confirm_rounds),
    }


def not_checked(message: str, severity: Severity) -> Finding:
    """A run-wide speed finding for speed that was wanted and not timed."""
    return Finding(
        rule=RULE,
        severity=severity,
        case_id="",
        subject=Subject.speed("all"),
        baseline=None,
        current=None,
        threshold=None,
        message=message,
    )


def results_file_findings(perf: bool | None, device: str) -> list[Finding]:
    """`check --results FILE`: speed needs a fresh run, so where it would have been gated (a GPU
    class, or --perf) say that it was not. WARN, not INCONCLUSIVE: re-judging a saved run is a
    deliberate choice and its correctness verdict stands; not INFO: the PASS headline must show
    that half of a GPU gate was not run."""
    if not perf_wanted(perf, device):
        return []
    return [
        not_checked(
            "speed not checked: correctness read from a results file (--results); speed needs a fresh "
            "`attn-gate check` on this GPU class",
            Severity.WARN,
        )
    ]


@dataclass(frozen=True)
class PerfCheck:
    result: PerfResult | None  # None: no perf case in scope, nothing was timed
    judgements: tuple[PerfJudgement, ...]
    findings: list[Finding]
    thresholds: dict[str, float]
    paths: dict[str, Path] = field(default_factory=dict)
    markdown: str = ""


def run_perf_check(plan: RunPlan, baseline_perf: dict[str, Any] | None, out_dir: Path) -> PerfCheck:
    """The plan's perf cases timed in a worker process and judged against the baseline's perf section."""
    if not plan.perf_cases:
        return no_perf_case_check(plan, baseline_perf)

    with perf_worker(plan) as worker:
        return _judged_perf(plan, baseline_perf, out_dir, worker)


def perf_worker(plan: RunPlan) -> PerfWorker:
    """The worker process the plan's kernel is timed in (this process never imports it)."""
    return PerfWorker(plan.kernel, plan.device, plan.isolation, plan.family)


def perf_target(plan: RunPlan) -> PerfTarget:
    """What the plan's speed half times: its kernel, suite and --only scope, on its device, against
    the config's anchor for that device."""
    return PerfTarget.of(plan.kernel, plan.suite, plan.perf_config, plan.device, None, plan.only)


def timed_in(worker, target: PerfTarget, rounds: int | None = None) -> PerfResult:
    """The target's perf cases timed in `worker` (a PerfWorker of its kernel) against its anchor,
    with a progress bar; `rounds` None: the config's."""
    with _measured_with_progress(target, worker.measure) as measure:
        return run_perf(target, measure, worker.info.version, rounds)


def no_speed_section(result: PerfResult) -> tuple[PerfJudgement, ...]:
    """Every timed pass INCONCLUSIVE when the baseline has no speed section to judge it by."""
    return tuple(
        PerfJudgement(
            case_id=c.case_id,
            pass_=p,
            severity=PerfSeverity.INCONCLUSIVE,
            message=f"the baseline has no speed section: run `attn-gate baseline update --perf --kernel {result.kernel} "
            f"--suite {result.suite}` on this GPU class and commit it",
        )
        for c in result.cases
        if c.status is not Status.SKIP
        for p in result.plan.passes
    ) or (nothing_judged(result),)


def _judged_perf(plan: RunPlan, baseline_perf: dict[str, Any] | None, out_dir: Path, worker) -> PerfCheck:
    target = perf_target(plan)
    result = timed_in(worker, target)
    cfg = plan.perf_config
    if not baseline_perf:
        judgements = no_speed_section(result)
    else:
        judgements = judge_perf(result, baseline_perf, cfg, remeasure_with(target, worker.measure), only=plan.only)
    paths = {"perf": write_perf_outputs(result, out_dir)}
    try:
        paths["speed_plot"] = plot_speed_ratios(
            judgements,
            f"{result.kernel} vs {result.anchor} / {result.suite}: speed ratio vs baseline",
            Path(out_dir) / f"speed-{safe_name(result.kernel)}-{result.suite}.png",
        )
    except Exception as exc:  # an artifact, not the verdict
        warn(f"the speed plot was not drawn ({type(exc).__name__}: {exc})")
    md = speed_section(result, cfg, plan.device)
    return PerfCheck(result, judgements, perf_findings(judgements), perf_thresholds(cfg), paths, md)


def refuse_noisy(
    section: dict[str, Any], config: PerfConfig, accept_noisy: bool, where: str, device: str
) -> dict[str, Any]:
    """A speed section is refused (one line, exit 2) where a pass's noise band exceeds max_noise_pct
    or its own rounds cannot pass against themselves (an unchanged kernel would be INCONCLUSIVE
    against it, on every check); with --accept-noisy such passes are recorded marked (`check`
    then says so in their findings)."""
    noisy = noisy_passes(section, config)
    unresolvable = unresolvable_passes(section, config, device)
    if not noisy and not unresolvable:
        return section
    unresolvable_keys = [(j.case_id, j.pass_, j.ci_high) for j in unresolvable]
    marked = sorted({(c, p) for c, p, _ in noisy + unresolvable_keys})
    if accept_noisy:
        print(
            f'attn-gate: recording {len(marked)} speed ratio(s) marked "noisy" (--accept-noisy): '
            + ", ".join(f"{c} {p}" for c, p in marked[:3])
            + (" ..." if len(marked) > 3 else ""),
            file=sys.stderr,
        )
        return mark_noisy(section, noisy + unresolvable_keys)
    more = f" (and {len(marked) - 1} more pass(es))" if len(marked) > 1 else ""
    fix = "time it again with more rounds or on a quieter machine, or pass --accept-noisy to record it marked noisy"
    if noisy:
        case_id, pass_, band = noisy[0]
        raise UserError(
            f"{where}: speed of {case_id} {pass_} has noise {band * 100:.1f}% ({config.noise_k:g} x the "
            f"median's standard error) > max_noise_pct {config.max_noise_pct:g}%{more}; nothing written: {fix}"
        )
    first = unresolvable[0]
    why = (
        f"its rounds, compared with themselves, reach +{first.ci_high * 100:.2f}% > the "
        f"{config.regression_pct_for(device):g}% regression limit"
        if math.isfinite(first.ci_high)
        else f"judged against itself, {first.message}"
    )
    raise UserError(
        f"{where}: speed of {first.case_id} {first.pass_} cannot pass against itself: {why}, so a check of "
        f"an unchanged kernel would be INCONCLUSIVE{more}; nothing written: {fix}"
    )


def no_perf_case_check(plan: RunPlan, baseline_perf: dict[str, Any] | None) -> PerfCheck:
    """No perf case in the run's scope: nothing is timed. INFO when the baseline has no speed ratio
    there either (that scope holds no speed to check); INCONCLUSIVE for each baseline speed ratio
    within the scope (a perf case that disappeared is not judged, so it cannot pass)."""
    why = no_perf_case_reason(plan.suite, plan.only)
    judgements = unmatched_baseline_judgements(baseline_perf, set(), plan.only, PASSES)
    findings = perf_findings(judgements) or [
        not_checked(f"speed not checked: no perf case in scope ({why})", Severity.INFO)
    ]
    md = not_timed_section(why)
    return PerfCheck(None, judgements, findings, perf_thresholds(plan.perf_config), {}, md)


@contextlib.contextmanager
def _measured_with_progress(target: PerfTarget, measure):
    """`measure` that moves a progress bar (gate/workflow/progress.py) over the target's perf cases."""
    costs = [expected_cost(c) for c in target.cases]
    with Progress(True, f"{target.kernel} / {target.suite.name} speed", costs) as advance:

        def measured(case, anchor, timing_plan):
            result = measure(case, anchor, timing_plan)
            advance(case.id, result.label, expected_cost(case))
            return result

        yield measured


def perf_baseline_section(
    plan: RunPlan, old_perf: dict[str, Any] | None, accept_noisy: bool = False
) -> tuple[dict[str, Any], PerfResult]:
    """The baseline's perf section from a fresh run with confirm_rounds rounds (a filtered run
    replaces only its own cases); refused (`refuse_noisy`) unless `accept_noisy`."""

    if not plan.perf_cases:
        raise UserError(no_perf_case_reason(plan.suite, plan.only))
    cfg = plan.perf_config
    with perf_worker(plan) as worker:
        result = timed_in(worker, perf_target(plan), max(cfg.confirm_rounds, cfg.rounds))
    measured = {c.case_id: baseline_entry(c, result.anchor, result.host) for c in result.cases if c.measured}
    if not measured:
        kernel, suite = plan.kernel, plan.suite.name
        raise UserError(
            f"no perf case of suite {suite!r} could be timed for {kernel!r} (all skipped or failed); "
            f"see `attn-gate perf --kernel {kernel} --suite {suite}`"
        )
    measured = refuse_noisy(measured, cfg, accept_noisy, "baseline update --perf", plan.device)
    section = {**(old_perf or {}), **measured} if plan.only else measured
    return dict(sorted(section.items())), result


def perf_section_from_file(
    path: Path,
    kernel: str,
    suite: str,
    gpu_class: str,
    config: Config,
    old_perf: dict[str, Any] | None,
    accept_noisy: bool = False,
) -> dict[str, Any]:
    """The baseline's perf section from a PerfResult file made on a machine of this GPU class
    (refused when kernel, suite or GPU class differ, or when it has fewer than min_rounds rounds)."""
    result = PerfResult.read(path)
    found_class = result.env.gpu_class_or_unknown
    for what, wanted, found in (
        ("kernel", kernel, result.kernel),
        ("suite", suite, result.suite),
        ("GPU class", gpu_class, found_class),
    ):
        if wanted != found:
            raise UserError(
                f"--perf-from {path}: holds timings of {what} {found!r}, this baseline is for {wanted!r}; "
                f"pass the perf JSON of the same {what}"
            )
    if result.plan.rounds < config.perf.min_rounds:
        raise UserError(
            f"--perf-from {path}: {result.plan.rounds} rounds is below min_rounds {config.perf.min_rounds}; "
            f"re-run `attn-gate perf --rounds {config.perf.confirm_rounds}`"
        )
    measured = {c.case_id: baseline_entry(c, result.anchor, result.host) for c in result.cases if c.measured}
    if not measured:
        raise UserError(f"--perf-from {path}: no case was timed (all skipped or failed)")
    measured = refuse_noisy(measured, config.perf, accept_noisy, f"--perf-from {path}", result.device)
    filtered = not result.scope.whole
    section = {**(old_perf or {}), **measured} if filtered else measured
    return dict(sorted(section.items()))


# Environment keys that must agree between a perf file and the sweep it is judged with: the
# software and GPU that timed the kernel. Host details (CPU model, python) may differ between
# runners of one pool; a shard-to-shard difference in them is refused by `attn-gate merge` already.
RUN_KEYS = ("device", "gpu_class", "kernel", "kernel_version", "torch", "cuda", "driver", "cudnn", "attn_gate")


def read_perf_files(paths: list[Path]) -> PerfResult:
    """One PerfResult from one or more perf files (e.g. one per GPU job), refused where they differ
    in kernel, suite, anchor, timing plan or environment, or hold a case twice (pyperf's rule:
    runs with different metadata do not merge)."""
    if not paths:
        raise UserError("--perf-results: name at least one perf JSON (from `attn-gate perf`)")
    read = [(Path(p), PerfResult.read(Path(p))) for p in paths]
    first_path, first = read[0]
    seen: dict[str, Path] = {}
    for path, result in read:
        for key in ("kernel", "suite", "anchor", "device", "plan"):
            if getattr(result, key) != getattr(first, key):
                raise UserError(
                    f"--perf-results: {path} has {key} {getattr(result, key)!r} but {first_path} has "
                    f"{getattr(first, key)!r}; pass the perf files of one run"
                )
        mine, theirs = result.env, first.env
        for key in sorted(set(result.environment) | set(first.environment)):
            if key in RUN_KEYS and mine.value(key) != theirs.value(key):
                raise UserError(
                    f"--perf-results: {path} ran with {key}={mine.value(key)!r} but {first_path} "
                    f"with {theirs.value(key)!r}; time them on machines of one kind"
                )
        for c in result.cases:
            if c.case_id in seen:
                raise UserError(
                    f"--perf-results: case {c.case_id} is in {seen[c.case_id]} and in {path}; pass each "
                    f"perf case's timings once"
                )
            seen[c.case_id] = path
    results = [r for _, r in read]
    notes = tuple(dict.fromkeys(n for r in results for n in r.notes))
    hosts = {r.host for r in results}  # timed on several hosts: no one host to judge the rows' limit by
    scopes = tuple(dict.fromkeys(r.scope.only for r in results if not r.scope.whole))  # filtered if any one was
    return PerfResult(
        kernel=first.kernel,
        anchor=first.anchor,
        suite=first.suite,
        device=first.device,
        environment=first.environment if len(hosts) == 1 else {**first.environment, "host": ""},
        plan=first.plan,
        cases=tuple(c for r in results for c in r.cases),
        started_at=min(r.started_at for r in results),
        wall_s=sum(r.wall_s for r in results),
        notes=notes,
        scope=Scope("|".join(f"(?:{s})" for s in scopes) if len(scopes) > 1 else (scopes[0] if scopes else None)),
    )


def refuse_perf_of_another_run(
    perf: PerfResult, kernel: str, suite: str, environment: dict[str, Any], baseline_class: str, where: str
) -> None:
    """Perf files are judged with a sweep only when they timed the same kernel and suite on the
    baseline's GPU class with the same software as the sweep."""
    for what, wanted, found in (
        ("kernel", kernel, perf.kernel),
        ("suite", suite, perf.suite),
        ("GPU class", baseline_class, perf.env.gpu_class_or_unknown),
    ):
        if wanted != found:
            raise UserError(
                f"--perf-results {where}: timings of {what} {found!r}, but the results and baseline are for "
                f"{wanted!r}; pass `attn-gate perf` output of the same {what}"
            )
    run, timed = Environment.from_dict(environment), perf.env
    if run.device is not None and perf.device != run.device:
        raise UserError(
            f"--perf-results {where}: device = {perf.device!r} but the results ran on "
            f"{run.device!r}; pass `attn-gate perf` output timed on the sweep's device"
        )
    for key in RUN_KEYS:
        if run.value(key) is not None and timed.value(key) != run.value(key):
            raise UserError(
                f"--perf-results {where}: timed with {key}={timed.value(key)!r} but the results ran "
                f"with {run.value(key)!r}; time the kernel in the same run environment as the sweep"
            )


def unconfirmed_from_file(j: PerfJudgement) -> PerfJudgement:
    """A suspected regression read from a file cannot be re-measured, so it is not confirmed:
    INCONCLUSIVE (fails closed, never a PASS), with the measured change and the way to confirm it."""
    if not (j.suspected and j.confirmed is None and j.severity is PerfSeverity.FAIL):
        return j
    return dataclasses.replace(
        j,
        severity=PerfSeverity.INCONCLUSIVE,
        message=(
            f"{j.message.replace('; not yet confirmed', '')}; read from a perf file, so not re-measured: confirm with "
            f"`attn-gate check --perf --only '{j.case_id}'` on this GPU class"
        ),
    )


def file_perf_check(
    paths: list[Path], sweep: SweepResult, baseline: Baseline, config: Config, out_dir: Path
) -> PerfCheck:
    """`check --results FILE --perf-results PERF...`: the timings of the files judged against the
    baseline's perf section by the rule a fresh check applies, without its confirm re-run."""
    kernel, suite, environment, only = sweep.kernel, sweep.suite, sweep.environment, sweep.scope.only
    baseline_class, baseline_perf = baseline.gpu_class, baseline.perf
    result = read_perf_files(paths)
    refuse_perf_of_another_run(result, kernel, suite, environment, baseline_class, ", ".join(map(str, paths)))
    if not baseline_perf:
        judgements = no_speed_section(result)
    else:
        judgements = tuple(map(unconfirmed_from_file, judge_perf(result, baseline_perf, config.perf, None, only=only)))
    md = speed_section(result, config.perf, result.device, from_files=len(paths))
    paths_out = {"perf": write_perf_outputs(result, out_dir)}  # the merged timings, beside the verdict
    return PerfCheck(result, judgements, perf_findings(judgements), perf_thresholds(config.perf), paths_out, md)


def speed_findings_known(perf: PerfCheck, sweep: SweepResult, baseline: Baseline, config: Config) -> list[Finding]:
    """The speed half's findings, an untimed pass KNOWN where its case raised when timed and in
    this sweep too, under a declaration that covers the error (gate/compare/known.py); a timing-only
    case, one the sweep measured, and a run that timed nothing or has no speed section to judge
    against stay INCONCLUSIVE."""
    if perf.result is None or not baseline.perf or not any(c.measured for c in perf.result.cases):
        return perf.findings
    raised = {c.case_id for c in sweep.cases if c.status is Status.ERROR}
    return apply_known_to_speed(
        perf.findings,
        [c.case_id for c in perf.result.cases if c.status is Status.ERROR and not c.measured and c.case_id in raised],
        sweep.kernel,
        sweep.env.kernel_version or "",
        config.known_failures,
    )


def speed_half(
    plan: RunPlan, source: FreshSweep | SavedSweep, baseline: Baseline, sweep: SweepResult, out_dir: Path
) -> tuple[PerfCheck | None, list[Finding]]:
    """The speed half of the verdict: timed now (default on a GPU, off on a CPU), judged from the
    perf files of a results file, or, where it would have been gated, a finding that says it was not."""
    if isinstance(source, FreshSweep):
        if not perf_wanted(plan.perf, plan.device):
            return None, []
        return run_perf_check(plan, baseline.perf, out_dir), []
    if source.perf_results:
        return file_perf_check(list(source.perf_results), sweep, baseline, plan.config, out_dir), []
    return None, results_file_findings(plan.perf, plan.device)
