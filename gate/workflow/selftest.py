"""`attn-gate selftest`: the gate proves its own teeth here, with this config and suite.

controls:   for the configured kernel and `tiled`: sweep -> baseline (in a temp folder, never
            baselines/) -> a second sweep checked against it -> must PASS (a false failure is
            the worst thing a gate can do); a failing control ends the selftest (exit 1)
bugs:       each planted bug (gate/correctness/planted.py) swept on the suite's cases that
            expose it, cheapest first, and judged by the real check path (compare against the
            in-run baseline -> findings -> decide); killed = a FAIL finding
slowdowns:  GPU only: the kernel's forward or backward slowed by 1-10% (gate/speed/planted.py),
            plus an A/A control, each judged by the speed rule against an in-run speed
            baseline (judge_perf, confirm re-runs included), repeated while the time budget lasts
report:     DIR/selftest.json and DIR/selftest.md rewritten after every step (partial results
            survive a timeout), the Markdown appended to $GITHUB_STEP_SUMMARY at the end
"""

from __future__ import annotations

import datetime as dt
import math
import re
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from gate.compare.baselines import Baseline, baseline_path, read_baseline
from gate.compare.findings import CheckContext, Severity, decide
from gate.compare.known import undeclared_failures
from gate.compare.selftest import (
    BugOutcome,
    BugStatus,
    ControlOutcome,
    SelftestReport,
    SlowdownSection,
    SlowdownTrial,
)
from gate.compare.sweep_rules import check_comparable, compare_all, correctness_thresholds
from gate.core.cases import exact_regex
from gate.core.config import Config
from gate.core.environment import describe, host_id
from gate.core.errors import UserError
from gate.core.files import append_step_summary, require_writable
from gate.core.jsonio import write_json_atomic, write_text_atomic
from gate.core.results import SweepResult
from gate.correctness.planted import case_cost, host_of, mult_to_catch, planted_adapter, select_bugs
from gate.kernels.registry import kernel_entry
from gate.report.selftest_report import selftest_markdown
from gate.speed.planted import CPU_CYCLES_PER_MS, SlowedKernel, planted_cycles
from gate.speed.runs import PerfResult, baseline_entry, case_anchor, judge_perf, measure_case
from gate.speed.timing import PASSES, TimingPlan, sleep_cycles_per_ms
from gate.workflow.plan import RunPlan, resolve_plan
from gate.workflow.speed_check import perf_thresholds
from gate.workflow.sweep import sweep_plan

LEVELS_PCT = (1.0, 2.0, 3.0, 5.0, 10.0)
DEFAULT_REPS = 5
DEFAULT_GPU_BUDGET_S = 330.0  # the H200 run (`--suite pr`) should fit ~6 minutes with start-up
FIRST_BATCH = 3  # cases of a bug swept first; the rest only when those did not kill it
CPU_SLOWDOWN_REASON = (
    "not run: planted slowdowns need a CUDA GPU (torch.cuda._sleep is the in-stream delay; "
    "CPU timings are history, not a gate)"
)


def _log(msg: str) -> None:
    print(f"selftest: {msg}", file=sys.stderr, flush=True)


class _Run:
    """State of one selftest run: its plan (each host's and each planted bug's plan derived from
    it), where it writes, what it found so far."""

    def __init__(self, plan: RunPlan, out_dir: Path, tmp: Path, log):
        self.plan, self.out_dir, self.tmp, self.log = plan, out_dir, tmp, log
        self.config, self.kernel, self.suite, self.device = plan.config, plan.kernel, plan.suite.name, plan.device
        self.adapter = plan.in_process_adapter()
        self.gpu_class = plan.gpu_class
        self.plans: dict[str, RunPlan] = {plan.kernel: plan}
        config = plan.config
        self.t0 = time.perf_counter()
        self.report = SelftestReport(
            kernel=self.kernel,
            suite=self.suite,
            device=self.device,
            environment=describe(self.device, self.kernel, self.adapter.version()),
            thresholds={
                "tolerance": config.tolerance.as_dict(),
                "verdict": correctness_thresholds(config.verdict),
                "perf": perf_thresholds(config.perf),
            },
            started_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            notes=(f"config: {config.source}",),
        )
        self.baselines: dict[str, tuple[Path, Baseline]] = {}

    def host_plan(self, name: str) -> RunPlan:
        """The plan of a host of planted bugs: the kernel's own, or tiled's, derived from it."""
        if name not in self.plans:
            self.plans[name] = replace(self.plan, entry=kernel_entry(name), adapter=None)
        return self.plans[name]

    def update(self, **changes) -> None:
        self.report = replace(self.report, wall_s=time.perf_counter() - self.t0, **changes)
        write_outputs(self.report, self.out_dir)

    def sweep(self, kernel_name: str, adapter=None, only: str | None = None) -> SweepResult:
        """In this process (a plan without options): a planted bug is an adapter object
        wrapped around the kernel, which cannot be sent to a worker. The judging is the same code
        as the isolated path's (run_case.seed_loop of judge_seed, then judged_row), and
        tests/test_isolation_features.py shows a worker's row equal to this process's row for every
        feature a bug here plants (dBias, layouts, LSE, dropout, probes)."""

        return sweep_plan(replace(self.host_plan(kernel_name), only=only, adapter=adapter), progress=False)

    def judge(self, kernel_name: str, sweep: SweepResult):
        path, baseline = self.baselines[kernel_name]
        check_comparable(baseline, sweep, path)
        # as `check` judges: failures a known_failures declaration covers are KNOWN, not blocking
        findings, thresholds, known = compare_all(baseline, sweep, self.config, sweep.scope)
        return decide(
            findings, thresholds, CheckContext(key=sweep.key, baseline=str(path), known_failures=tuple(known))
        )


# ---------------------------------------------------------------- controls


def run_control(run: _Run, kernel_name: str, only: str | None = None) -> ControlOutcome:
    """Baseline sweep -> temp baseline -> a second sweep checked against it: must pass. `only`
    limits the control to the cases its planted bugs are judged on (tiled_control_scope)."""
    t0 = time.perf_counter()
    first = run.sweep(kernel_name, adapter=run.adapter if kernel_name == run.kernel else None, only=only)
    # a declared known failure is recorded in the control's baseline, as `baseline update` records it
    undeclared = {cid for cid, _ in undeclared_failures(first, run.config.known_failures)}
    failing = [c for c in first.cases if c.status.failed and c.case_id in undeclared]
    measured = sum(1 for c in first.cases if c.status.value != "SKIP")
    skipped = len(first.cases) - measured
    if failing or not measured:
        detail = (
            "; ".join(f"{c.case_id} {c.status.value}: {c.reason}" for c in failing[:3])
            if failing
            else "no case was measured (all skipped)"
        )
        return ControlOutcome(
            kernel_name,
            False,
            measured,
            skipped,
            f"its own sweep fails its bounds: {detail}",
            tuple(c.case_id for c in failing),
            time.perf_counter() - t0,
        )
    path = baseline_path(run.tmp / "baselines", run.gpu_class, kernel_name, run.suite)
    Baseline.from_sweep(first).write(path)
    run.baselines[kernel_name] = (path, read_baseline(path))
    second = run.sweep(kernel_name, only=only)
    verdict = run.judge(kernel_name, second)
    if verdict.passed:
        return ControlOutcome(kernel_name, True, measured, skipped, "", (), time.perf_counter() - t0)
    bad = [f for f in verdict.findings if f.severity.blocks]
    detail = "; ".join(f"{f.rule} on {f.case_id or 'the run'}: {f.message}" for f in bad[:3])
    return ControlOutcome(
        kernel_name,
        False,
        measured,
        skipped,
        f"a second run fails against the baseline made minutes before (a false failure): {detail}",
        tuple(dict.fromkeys(f.case_id for f in bad if f.case_id)),
        time.perf_counter() - t0,
    )


# ---------------------------------------------------------------- planted bugs


def _survivor_message(bug, sweeps: list[SweepResult], run: _Run, host_name: str) -> tuple[str, float, str, float]:
    """Why it survived and what would catch it: the closest call (the tensor the bug moved most
    against the in-run baseline) and the multiplier / headroom factor at which the rules would
    have fired. Returns (message, ratio, case id, baseline ratio)."""

    _, baseline = run.baselines[host_name]

    def base_ratio(case_id: str, tensor: str) -> float:
        entry = baseline.correctness.get(case_id)
        t = entry.tensors.get(tensor) if entry else None
        return t.ratio if t else math.nan

    best, best_key = None, None
    for sweep in sweeps:
        for c in sweep.cases:
            for t in c.tensors:
                # the tensor the bug moved most against the in-run baseline (then the highest ratio)
                grew = t.ratio - base_ratio(c.case_id, t.tensor)
                key = (grew if math.isfinite(grew) else -math.inf, t.ratio)
                if best_key is None or key > best_key:
                    best, best_key = (c, t), key
    if best is None:
        return (f"no case measured a tensor; {bug.hint or 'add a case of its axis'}", math.nan, "", math.nan)
    c, t = best
    base = base_ratio(c.case_id, t.tensor)
    tol = run.config.tolerance
    msg = f"closest call: {t.tensor} ratio {t.ratio:.3g} on {c.case_id} (in-run baseline {base:.3g})"
    configured = getattr(tol, f"mult_{t.tensor}", None)  # a tensor without its own multiplier: no such hint
    if configured:
        dtype_factor = tol.mult(t.tensor, c.case.dtype) / configured  # fp32_factor on fp32 cases
        need = mult_to_catch(t.max_err, t.pt_err, t.floor) / dtype_factor
        msg += f"; the tolerance rule would catch it at mult_{t.tensor} < {need:.3g} (now {configured:g})"
    if math.isfinite(base) and base > 0:
        msg += (
            f"; the headroom rule at headroom_factor < {t.ratio / base:.3g} with headroom_step < {t.ratio - base:.3g}"
        )
    if bug.hint:
        msg += f"; also: {bug.hint}"
    return msg, t.ratio, c.case_id, base


def tiled_control_scope(run: _Run, bugs) -> str | None:
    """For `tiled` as only the host of planted bugs (not the kernel under test), its control
    covers the cases those bugs are judged on - each tiled-hosted bug's first batch - instead of
    the whole suite: on an H200 two pr sweeps of tiled (plain PyTorch tiles, 454 cases) alone
    outlast a 10-minute CI step. A bug's later batches stay within the control's cases (run_bug)."""

    cases = run.plan.suite.swept_cases
    tiled = run.host_plan("tiled").in_process_adapter()
    ids = {
        c.id
        for bug in bugs
        if not bug.trigger.pending and host_of(bug, run.adapter, cases) == "tiled"
        for c in exercising_cases(bug, cases, tiled, run.device)[:FIRST_BATCH]
    }
    return exact_regex(ids) if ids else None


def exercising_cases(bug, cases, host_adapter, device: str) -> list:
    """The cases that expose `bug` and its host can run on `device`, cheapest first (asked of the
    host itself: a kernel family answers per entry point, a trimmed build per compiled head dim)."""
    return sorted(
        (c for c in cases if bug.trigger.applies(c) and host_adapter.unsupported_reason(c, device) is None),
        key=case_cost,
    )


def skipped_there(bug, cases, host_adapter, host_name: str, device: str) -> str:
    """Why the suite's cases of the bug's axis do not run (a declared envelope that leaves out
    every one of them, say), the most common reason first; empty where the suite has none."""
    reasons: dict[str, int] = {}
    axis = [c for c in cases if bug.trigger.applies(c)]
    for c in axis:
        if (why := host_adapter.unsupported_reason(c, device)) is not None:
            reasons[why] = reasons.get(why, 0) + 1
    if not reasons:
        return ""
    ranked = sorted(reasons.items(), key=lambda kv: -kv[1])
    n = sum(reasons.values())
    more = f"; {len(ranked) - 1} other reason{'s' * (len(ranked) > 2)}" if len(ranked) > 1 else ""
    which = f"its {n} case{'s' * (n != 1)}" if n == len(axis) else f"{n} of its {len(axis)} cases"
    return f"; {which} of that axis SKIP for {host_name}: {ranked[0][0]}{more}"


def run_bug(run: _Run, bug) -> BugOutcome:
    t0 = time.perf_counter()
    host = host_of(bug, run.adapter, run.plan.suite.swept_cases)
    host_name = run.kernel if host == "kernel" else "tiled"
    common = dict(name=bug.name, what=bug.what, host=host_name, axis=bug.trigger.axis)
    if bug.trigger.pending:
        return BugOutcome(
            **common,
            status=BugStatus.PENDING,
            message=f"pending: needs the case field `{bug.trigger.field}`, which this attn-gate does not have "
            f"yet; it is judged once the field exists",
        )
    host_plan = run.host_plan(host_name)
    cases = exercising_cases(bug, run.plan.suite.swept_cases, host_plan.in_process_adapter(), run.device)
    if host_name in run.baselines:  # a control limited to some cases (tiled_control_scope) judges only those
        in_baseline = run.baselines[host_name][1].correctness
        cases = [c for c in cases if c.id in in_baseline]
    if not cases:
        gap = f"suite {run.suite!r} has no case that {host_name} runs on {run.device} of the axis that would catch it"
        if bug.needs is not None and not bug.needs(run.adapter.capabilities()):
            return BugOutcome(
                **common,
                status=BugStatus.NOT_APPLICABLE,
                message=f"{gap} ({bug.trigger.axis}); not counted: {run.kernel} does not take what this bug "
                f"needs, so it cannot have it (a suite for a kernel that does needs such a case)",
                wall_s=time.perf_counter() - t0,
            )
        return BugOutcome(
            **common,
            status=BugStatus.NOT_EXERCISED,
            message=f"{gap}: {bug.trigger.axis}; add one to the suite"
            + (f" ({bug.hint})" if bug.hint else "")
            + skipped_there(bug, run.plan.suite.swept_cases, host_plan.in_process_adapter(), host_name, run.device),
            wall_s=time.perf_counter() - t0,
        )
    sweeps, ran = [], 0
    for batch in (cases[:FIRST_BATCH], cases[FIRST_BATCH:]):
        if not batch:
            continue
        planted = planted_adapter(bug, host_plan.entry.adapter())  # a fresh host for each planting
        sweep = run.sweep(host_name, adapter=planted, only=exact_regex(c.id for c in batch))
        sweeps.append(sweep)
        ran += len(sweep.cases)
        not_planted = [c for c in sweep.cases if "PlantError" in c.reason]
        if not_planted:
            return BugOutcome(
                **common,
                status=BugStatus.NOT_PLANTED,
                cases_run=ran,
                exercisable=len(cases),
                message=f"could not be planted ({not_planted[0].reason}); counted as surviving",
                wall_s=time.perf_counter() - t0,
            )
        verdict = run.judge(host_name, sweep)
        fails = verdict.of(Severity.FAIL)
        if fails:
            f = fails[0]
            row = next((c for c in sweep.cases if c.case_id == f.case_id), None)
            ratio = f.current if isinstance(f.current, (int, float)) else (row.worst_ratio if row else math.nan)
            base = f.baseline if isinstance(f.baseline, (int, float)) else math.nan
            return BugOutcome(
                **common,
                status=BugStatus.KILLED,
                rule=f.rule,
                case_id=f.case_id,
                metric=f.metric,
                ratio=float(ratio),
                baseline=float(base),
                message=f.message,
                cases_run=ran,
                exercisable=len(cases),
                wall_s=time.perf_counter() - t0,
            )
    if not any(c.status.value != "SKIP" for sw in sweeps for c in sw.cases):
        why = next((c.reason for sw in sweeps for c in sw.cases if c.reason), "skipped")
        return BugOutcome(
            **common,
            status=BugStatus.NOT_EXERCISED,
            cases_run=ran,
            exercisable=len(cases),
            message=f"every case of its axis ({bug.trigger.axis}) was skipped by {host_name} ({why}); add one it runs",
            wall_s=time.perf_counter() - t0,
        )
    msg, ratio, case_id, base = _survivor_message(bug, sweeps, run, host_name)
    return BugOutcome(
        **common,
        status=BugStatus.SURVIVED,
        case_id=case_id,
        ratio=ratio,
        baseline=base,
        message=f"passed the gate on all {ran} cases of its axis; {msg}",
        cases_run=ran,
        exercisable=len(cases),
        wall_s=time.perf_counter() - t0,
    )


# ---------------------------------------------------------------- planted slowdowns


def run_slowdowns(
    run: _Run, reps: int, deadline: float | None, levels=LEVELS_PCT, case_pattern: str | None = None
) -> SlowdownSection:
    """Planted slowdowns of the forward and backward (the forward alone on a decode case), and an
    A/A control, repeated `reps` times or until `deadline` (perf_counter seconds): at least one
    repetition always runs. The case: the cheapest perf case, or the cheapest matching `case_pattern`."""

    cfg = run.config.perf
    cases = run.plan.suite.perf_cases
    if case_pattern is not None:  # checked by refuse_slowdown_case: it matches a perf case
        cases = [c for c in cases if re.search(case_pattern, c.id)]
    if not cases:
        return SlowdownSection(ran=False, reason=f"not run: suite {run.suite!r} has no perf case (perf = [true])")
    if case_pattern is None:  # by default both passes are slowed: a case with a backward where there is one
        cases = [c for c in cases if not c.forward_only] or cases
    case = min(cases, key=lambda c: c.flops("fwd") + c.flops("bwd"))  # the cheapest: more repetitions fit the budget
    passes = ("fwd",) if case.forward_only or not run.adapter.capabilities().backward else PASSES
    anchor = case_anchor(cfg.anchor_for(run.device), cfg, case, run.device)
    base_plan = TimingPlan.from_config(cfg, rounds=max(cfg.confirm_rounds, cfg.rounds))
    base = measure_case(run.adapter, anchor, case, run.device, base_plan)
    if not base.measured:
        return SlowdownSection(
            ran=False,
            reason=f"not run: the speed baseline of {case.id} failed: {base.status} {base.reason}",
            case_id=case.id,
            anchor=anchor,
        )
    # the baseline and the slowed runs are timed in this process: one host, even where host_id cannot tell it
    host = host_id(run.device) or "this-process"
    base_entry = baseline_entry(base, anchor, host)
    pass_ms = {p: base.pass_timing(p).candidate_median_ms for p in passes}
    gpu = run.device == "cuda"
    cycles_per_ms = sleep_cycles_per_ms(samples=5) if gpu else CPU_CYCLES_PER_MS
    cycles = {(p, lv): planted_cycles(lv, pass_ms[p], cycles_per_ms) for p in passes for lv in levels}
    calibration = {
        "cycles_per_ms": cycles_per_ms,
        "pass_ms": pass_ms,
        "baseline_ratio": {p: base.estimate(p).median for p in passes},
        "baseline_noise_pct": {p: base.estimate(p).noise * 100 for p in passes},
        "cycles": {f"{p}+{lv:g}%": n for (p, lv), n in cycles.items()},
        "method": (
            "cycles = level/100 x the pass's median time in the in-run baseline x torch.cuda._sleep "
            "cycles per ms (measured with CUDA events)"
        )
        if gpu
        else "CPU rehearsal: a busy-wait of level/100 x the pass's median time; plumbing only, not a gate",
    }
    section = SlowdownSection(
        ran=True,
        case_id=case.id,
        anchor=anchor,
        levels_pct=tuple(levels),
        reps_planned=reps,
        calibration=calibration,
        gating=gpu,
    )
    run.update(slowdowns=section)
    experiments = [("both", 0.0)] + [(p, lv) for lv in levels for p in passes]
    trials: list[SlowdownTrial] = []
    started = time.perf_counter()
    for rep in range(reps):
        if rep and deadline is not None:
            per_rep = (time.perf_counter() - started) / rep
            if time.perf_counter() + per_rep > deadline:
                section = replace(
                    section, reason=f"time budget: {rep} of {reps} repetitions ran (~{per_rep:.0f}s each)"
                )
                break
        for p, lv in experiments:
            if lv == 0:
                adapter, timed = run.adapter, passes
            else:
                adapter = SlowedKernel(
                    run.adapter,
                    fwd_cycles=cycles[(p, lv)] if p == "fwd" else 0,
                    bwd_cycles=cycles[(p, lv)] if p == "bwd" else 0,
                )
                timed = (p,)
            plan = TimingPlan.from_config(cfg, passes=timed)
            t1 = time.perf_counter()
            pc = measure_case(adapter, anchor, case, run.device, plan)
            result = PerfResult(
                kernel=run.kernel,
                anchor=anchor,
                suite=run.suite,
                device=run.device,
                environment={**run.report.environment, "host": host},
                plan=plan,
                cases=(pc,),
                started_at=run.report.started_at,
                wall_s=time.perf_counter() - t1,
            )

            def remeasure(c, pass_, rounds, adapter=adapter):
                again = measure_case(
                    adapter, anchor, c, run.device, TimingPlan.from_config(cfg, rounds=rounds, passes=(pass_,))
                )
                return again.estimate(pass_) if again.measured else None

            # the in-run baseline of the passes timed here: the other pass is judged in its own experiment
            judged = {case.id: {k: v for k, v in base_entry.items() if k not in PASSES or k in timed}}
            for j in judge_perf(result, judged, cfg, remeasure):
                timing = pc.pass_timing(j.pass_)
                cand = (timing.candidate_median_ms / pass_ms[j.pass_] - 1) * 100 if timing else math.nan
                trials.append(
                    SlowdownTrial(
                        pass_=j.pass_,
                        level_pct=lv,
                        rep=rep,
                        severity=j.severity.value,
                        shift_pct=j.change * 100,
                        candidate_shift_pct=cand,
                        confirmed=j.confirmed,
                        message=j.message,
                    )
                )
            section = replace(section, trials=tuple(trials))
            run.update(slowdowns=section)
        run.log(f"slowdowns: repetition {rep + 1}/{reps} done ({time.perf_counter() - started:.0f}s)")
    return section


def refuse_slowdown_case(
    pattern: str, config: Config, suite: str, device: str, slowdowns: bool, rehearse: bool
) -> None:
    """--slowdown-case names a test the run must make: a bad pattern, one no perf case matches, or
    a run whose slowdowns would not run at all is a usage error, not a selftest without it."""
    if not slowdowns:
        raise UserError("--slowdown-case with --no-slowdowns: drop one of them")
    if device != "cuda" and not rehearse:
        raise UserError(
            "--slowdown-case: planted slowdowns need a CUDA GPU; on a CPU add --rehearse-slowdowns-on-cpu "
            "(plumbing only) or drop --slowdown-case"
        )
    from gate.core.patterns import bounded_regex

    try:
        compiled = bounded_regex(pattern)
    except ValueError as exc:
        raise UserError(f"--slowdown-case {pattern[:200]!r} {exc}") from None
    if not any(compiled.search(c.id) for c in config.suite(suite).perf_cases):
        raise UserError(
            f"--slowdown-case {pattern!r} matches no perf case of suite {suite!r} (`attn-gate suites --cases` "
            f"marks them [perf])"
        )


# ---------------------------------------------------------------- the run


def run_selftest(
    config: Config,
    kernel: str | None = None,
    suite: str | None = None,
    device: str | None = None,
    out_dir: Path = Path("out"),
    bugs: tuple[str, ...] = (),
    slowdowns: bool = True,
    budget_s: float | None = None,
    reps: int = DEFAULT_REPS,
    log=_log,
    rehearse_slowdowns_on_cpu: bool = False,
    slowdown_case: str | None = None,
) -> SelftestReport:
    """`rehearse_slowdowns_on_cpu` runs the slowdown part on a CPU with a busy-wait: it checks the
    plumbing (engine, rule, report) where no GPU exists, measures nothing about GPUs, and never
    decides the exit code."""

    # the same checks, defaults and "did you mean" answers as every other command; the planted
    # bugs wrap the kernel in this process, so it is loaded here
    plan = resolve_plan(config, kernel, suite, device, kernel_in_worker=False)
    kernel, suite, device = plan.kernel, plan.suite.name, plan.device
    if slowdown_case is not None:  # before minutes of bug sweeps: a slowdown test asked for must run
        refuse_slowdown_case(slowdown_case, config, suite, device, slowdowns, rehearse_slowdowns_on_cpu)
    if reps < 1:
        raise UserError(f"--reps {reps}: must be >= 1")
    require_writable(Path(out_dir), "--out")
    chosen = select_bugs(tuple(bugs))
    if budget_s is None and device == "cuda":
        budget_s = DEFAULT_GPU_BUDGET_S
    deadline = None if budget_s is None else time.perf_counter() + budget_s
    with tempfile.TemporaryDirectory(prefix="attn-gate-selftest-") as tmp:
        run = _Run(plan, Path(out_dir), Path(tmp), log)  # resolve_plan checked it is available
        controls: list[ControlOutcome] = []
        for name in dict.fromkeys((kernel, "tiled")):
            scope = tiled_control_scope(run, chosen) if name != kernel else None
            if name != kernel and scope is None:
                # tiled is here only as the host of planted bugs; none of the chosen ones lives in it
                # (seen on the H200: `--bugs dk_x1.02` swept all of pr with tiled, > 7 minutes)
                log("control tiled: not run: none of the chosen planted bugs is planted in tiled")
                continue
            log(
                f"control {name} on {suite}{' (the cases its planted bugs are judged on)' if scope else ''}: "
                f"baseline sweep, then a second sweep checked against it"
            )
            controls.append(run_control(run, name, only=scope))
            c = controls[-1]
            log(
                f"control {name}: {'PASS' if c.passed else 'FAIL'} ({c.cases} cases measured, {c.skipped} skipped, "
                f"{c.wall_s:.1f}s){'' if c.passed else ': ' + c.detail}"
            )
            run.update(controls=tuple(controls))
            if not c.passed:
                run.update(complete=True, slowdowns=SlowdownSection(ran=False, reason="not run: a control failed"))
                return _finish(run)
        outcomes: list[BugOutcome] = []
        for i, bug in enumerate(chosen, 1):
            outcomes.append(run_bug(run, bug))
            o = outcomes[-1]
            where = f" by {o.rule} on {o.case_id} (ratio {o.ratio:.3g})" if o.killed else ""
            log(f"[{i}/{len(chosen)}] {bug.name} ({o.host}): {o.status.value}{where} {o.wall_s:.1f}s")
            run.update(bugs=tuple(outcomes))
        if not slowdowns:
            section = SlowdownSection(ran=False, reason="not run: --no-slowdowns")
        elif device != "cuda" and not rehearse_slowdowns_on_cpu:
            section = SlowdownSection(ran=False, reason=CPU_SLOWDOWN_REASON)
        else:
            section = run_slowdowns(run, reps, deadline, case_pattern=slowdown_case)
        run.update(slowdowns=section, complete=True)
        return _finish(run)


def _finish(run: _Run) -> SelftestReport:
    append_step_summary(selftest_markdown(run.report))  # the last run.update() wrote the files
    return run.report


def output_paths(out_dir: Path) -> dict[str, Path]:
    return {"json": Path(out_dir) / "selftest.json", "md": Path(out_dir) / "selftest.md"}


def write_outputs(report: SelftestReport, out_dir: Path) -> dict[str, Path]:
    paths = output_paths(out_dir)
    try:
        write_json_atomic(paths["json"], report.to_dict())
        write_text_atomic(paths["md"], selftest_markdown(report))
    except OSError as exc:
        raise UserError(
            f"--out {out_dir}: cannot write the selftest report ({exc.strerror or exc}); pass a writable folder"
        ) from None
    return paths
