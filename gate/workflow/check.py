"""The two workflows around a baseline, as small steps (nox-style): CLI-free, one call each.

    run_check:            plan -> known failures (each must match a case) -> baseline (must exist,
                          must parse) -> sweep (fresh or a results file) -> refuse incomparable ->
                          compare -> known failures -> speed half -> decide -> render (md, json, png)
    run_baseline_update:  plan -> sweep -> refuse a run that lacks cases of the suite (or of its --only scope)
                          -> refuse a failing row no known_failures declaration covers -> merge with
                          the old baseline -> diff for the reviewer -> summary, then the atomic write

Everything that can be wrong with the inputs (no baseline, malformed or truncated file, unknown
schema version, another GPU class or suite, a case id twice, an --out or --summary that cannot be
written) raises a UserError (exit 2) before anything is written or measured, so a refused run
never overwrites a file; an OSError while writing is a UserError too (never a traceback, never
exit 1, which would read as a gate FAIL).

The plan (gate/workflow/plan.py: kernel, suite cases, device, GPU class, baseline path, options)
is resolved once, by the command or from a results file. run_check hands each step below it the
parts it asks about: the refusals before a sweep (gate/compare/admission.py) the RunKey, suite and
baseline path; the rules (gate/compare/) the baseline and the sweep; the renderer
(gate/report/check_report.py) the verdict.

No baseline yet: `check` exits 2 and prints the exact `attn-gate baseline update` command. It does
not run the sweep first: without a baseline there is nothing to gate, and a gate that passes
without a reference would pass anything (fail closed). The speed half's findings and thresholds
join the correctness ones (compare_all) in run_check, before decide.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gate.compare.admission import (
    baseline_for_fresh_run,
    baseline_for_results,
    refuse_foreign_rows,
    refuse_unmatched_known,
)
from gate.compare.baselines import (
    WIDEN_KEYS,
    Baseline,
    BaselineDiff,
    diff_baselines,
    merge_baseline,
    read_baseline,
    refuse_lacking_cases,
    refuse_widen,
    spans_machines,
    timed_perf,
    update_command,
    validate_written,
    widen_baseline,
)
from gate.compare.comparable import same, why_not_comparable
from gate.compare.diagnosis import diagnose
from gate.compare.findings import CheckContext, Rule, Verdict, decide, worst_first
from gate.compare.known import undeclared_failures
from gate.compare.sweep_rules import (
    check_comparable,
    compare_all,
    incomplete_pass,
    refuse_duplicate_cases,
    refuse_unjudged_by_mean,
)
from gate.core.config import Config, known_failures_in, own_kernel
from gate.core.environment import default_device
from gate.core.errors import EXIT_FAIL, EXIT_PASS, UserError
from gate.core.files import (
    FolderLock,
    refuse_inside_baselines,
    require_writable,
    writing,
)
from gate.core.identity import Environment, Scope
from gate.core.jsonio import write_text_atomic
from gate.core.results import Status, SweepResult
from gate.report import terminal_width, wrapped
from gate.report.check_report import render_check
from gate.report.failures import refusal
from gate.report.sweep_report import write_sweep_outputs
from gate.workflow.plan import FreshSweep, RunPlan, SavedSweep, current_gpu_class, plan_run
from gate.workflow.speed_check import (
    perf_baseline_section,
    perf_section_from_file,
    perf_wanted,
    speed_findings_known,
    speed_half,
)
from gate.workflow.sweep import fresh_sweep


@dataclass(frozen=True)
class Target:
    kernel: str
    suite: str
    device: str
    gpu_class: str


@dataclass(frozen=True)
class CheckOutcome:
    verdict: Verdict
    sweep: SweepResult
    baseline: Baseline
    baseline_path: Path
    paths: dict[str, Path] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code


@dataclass(frozen=True)
class UpdateOutcome:
    diff: BaselineDiff
    path: Path
    sweep: SweepResult
    exit_code: int


# ---------------------------------------------------------------- steps


def read_results(path: Path, kernel: str | None, suite: str | None) -> SweepResult:
    sweep = SweepResult.read(path)
    refuse_duplicate_cases(sweep, path)
    refuse_unjudged_by_mean(sweep, path)
    for option, wanted, found in (("--kernel", kernel, sweep.kernel), ("--suite", suite, sweep.suite)):
        if wanted is not None and wanted != found:
            raise UserError(
                f"{option} {wanted} but {path} holds results of {found}; drop {option} or pass the right file"
            )
    return sweep


def resolve_target(
    config: Config, kernel: str | None, suite: str | None, device: str | None, results: SweepResult | None
) -> Target:
    """The names only, for commands that read a baseline and run nothing (`baseline show`)."""
    if results is not None:
        env = results.env
        return Target(results.kernel, results.suite, _device_of(env), env.gpu_class_or_unknown)

    device = device or default_device()
    profile = config.profile(device)
    return Target(kernel or profile.kernel, suite or profile.suite, device, current_gpu_class(device))


def plan_of_results(
    config: Config, results: SweepResult, baseline_file: Path | None = None, perf: bool | None = None
) -> RunPlan:
    """The plan a results file stands for: its own kernel, suite, device and GPU class."""
    env = results.env
    return plan_run(
        config,
        results.kernel,
        results.suite,
        _device_of(env),
        perf=perf,
        baseline_file=baseline_file,
        gpu_class=env.gpu_class_or_unknown,
    )


def _device_of(env: Environment) -> str:
    return env.device if env.device is not None else "?"


# ---------------------------------------------------------------- check


@dataclass(frozen=True)
class CaseVerdict:
    """The check's verdict on one case, for a runner that reports case by case (the pytest plugin):
    outcome FAIL (a blocking finding of the case), SKIP (the row is SKIP), KNOWN (a declared upstream
    failure) or PASS, with the one line that says why."""

    case_id: str
    outcome: str
    reason: str


def case_verdicts(plan: RunPlan, baseline: Baseline, sweep: SweepResult) -> dict[str, CaseVerdict]:
    """Each swept case's verdict under exactly the rules `check` applies (compare_all, decide)."""
    check_comparable(baseline, sweep, plan.baseline_path)
    findings, thresholds, _ = compare_all(baseline, sweep, plan.config, sweep.scope)
    verdict = decide(findings, thresholds)
    out = {}
    for row in sweep.cases:
        mine = [f for f in verdict.findings if f.case_id == row.case_id]
        blocking = sorted((f for f in mine if f.severity.blocks), key=worst_first)
        known = [f for f in mine if f.severity.value == "KNOWN"]
        if blocking:
            more = (
                f" (and {len(blocking) - 1} more: {', '.join(f.metric for f in blocking[1:])})"
                if len(blocking) > 1
                else ""
            )
            out[row.case_id] = CaseVerdict(row.case_id, "FAIL", blocking[0].message + more)
        elif row.status.value == "SKIP":
            out[row.case_id] = CaseVerdict(row.case_id, "SKIP", row.reason or "skipped")
        elif known:
            out[row.case_id] = CaseVerdict(row.case_id, "KNOWN", known[0].message)
        else:
            out[row.case_id] = CaseVerdict(row.case_id, "PASS", "")
    return out


@dataclass(frozen=True)
class Outputs:
    """Where a run writes: the --out folder (checked before anything runs: outputs(),
    update_outputs()), the console a check's summary lines go to (None: the terminal), and the file
    a baseline update's change summary goes to."""

    folder: Path = Path("out")
    console: Any = None
    summary: Path | None = None  # `baseline update --summary`: the change summary's file


def outputs(folder: Path, config: Config, console=None) -> Outputs:
    """--out checked before the sweep, not after minutes of it: writable, and outside the baselines."""
    require_writable(Path(folder), "--out")
    refuse_inside_baselines(Path(folder), config.baselines_dir)
    return Outputs(Path(folder), console)


def saved_sweep(
    config: Config,
    path: Path,
    kernel: str | None = None,
    suite: str | None = None,
    baseline_file: Path | None = None,
    perf: bool | None = None,
    perf_results: list[Path] | None = None,
) -> tuple[RunPlan, SavedSweep]:
    """A results file (refused where --kernel or --suite name another) and the plan it stands for:
    its own kernel, suite, device and GPU class."""
    sweep = read_results(path, kernel, suite)
    plan = plan_of_results(config, sweep, baseline_file, perf)
    return plan, SavedSweep(sweep, Path(path), tuple(perf_results or ()))


def refuse_check_flags(results: Path | None, only: str | None, perf: bool | None, perf_results) -> None:
    """The flags `check` cannot take together: a results file is compared as it is."""
    if results is not None and only is not None:
        raise UserError("--only filters a fresh run; with --results the file is compared as it is (drop --only)")
    if results is not None and perf:
        raise UserError("--perf times the kernel now, so it needs a fresh run: drop --results (or --perf)")
    if perf_results and results is None:
        raise UserError(
            "--perf-results judges saved timings with a saved sweep: pass --results too (a fresh check "
            "times the kernel itself)"
        )


def run_check(plan: RunPlan, source: FreshSweep | SavedSweep, out: Outputs) -> CheckOutcome:
    """The plan's check, its stages in order: the baseline with everything refused before a sweep
    (gate/compare/admission.py), the sweep (`source`: run now or read from a file), every rule's
    findings, the speed half (workflow/speed_check.py), the verdict and its diagnosis (gate/compare/),
    then its files in `out` (gate/report/)."""
    if isinstance(source, SavedSweep):
        baseline = baseline_for_results(
            plan.key, plan.suite, plan.config, source.sweep, source.path, plan.baseline_path, plan.baseline_option
        )
        sweep = source.sweep
    else:
        baseline = baseline_for_fresh_run(plan.key, plan.suite, plan.config, plan.baseline_path, plan.baseline_option)
        sweep = fresh_sweep(plan, source.progress)
    check_comparable(baseline, sweep, plan.baseline_path)
    findings, thresholds, known = compare_all(baseline, sweep, plan.config, sweep.scope)
    perf_run, not_timed = speed_half(plan, source, baseline, sweep, out.folder)
    if perf_run is not None:
        if isinstance(source, FreshSweep) and not plan.cases:
            # --only chose timing-only cases: the speed is what this check judges
            findings = [f for f in findings if f.rule is not Rule.NOTHING_MEASURED]
        speed = speed_findings_known(perf_run, sweep, baseline, plan.config)
        findings, thresholds = list(findings) + speed, {**thresholds, **perf_run.thresholds}
    context = CheckContext(
        key=sweep.key,  # the baseline's too: check_comparable refused any other
        baseline=str(plan.baseline_path),
        baseline_measured_at=baseline.measured_at,
        run_started_at=sweep.started_at,
        config=str(plan.config.source),
        scope=sweep.scope,
        baseline_option=str(plan.baseline_option) if plan.baseline_option else None,
        measured=sum(1 for c in sweep.cases if c.tensors),
        cases=len(sweep.cases),
        known_failures=tuple(known),
    )
    verdict = decide(list(findings) + not_timed, thresholds, context)
    diagnosis = diagnose(verdict, sweep)  # what the failing cases share: decided once, read by each renderer
    with writing(f"pass a writable --out folder (verdict: {'PASS' if verdict.passed else 'FAIL'})"):
        paths = render_check(
            verdict, diagnosis, sweep, baseline, out.folder, out.console, perf_run.markdown if perf_run else ""
        )
    if perf_run:
        paths.update(perf_run.paths)
    return CheckOutcome(verdict, sweep, baseline, plan.baseline_path, paths)


# ---------------------------------------------------------------- baseline update


def require_complete_run(plan: RunPlan, sweep: SweepResult, source: object, path: Path) -> None:
    """A baseline update replaces every case of its scope (the whole suite without --only): a run
    that lacks some of them (a truncated or edited results file) would silently delete them from
    the baseline, and a PASS row without its tensors would record a pass with nothing to compare."""
    redo = update_command(sweep.kernel, sweep.suite, sweep.env.gpu_class_or_unknown)
    suite = plan.suite
    if not same(sweep.key, plan.key, "suite_hash"):
        raise UserError(
            f"{source}: made from another definition of suite {sweep.suite!r} (hash {sweep.suite_hash}) than "
            f"{plan.config.source} gives now ({plan.suite_hash}), so `check` could never compare with the "
            f"baseline; update from a run of the suite as it is now (`{redo}`)"
        )
    scope = sweep.scope
    wanted = [c.id for c in scope.select(suite.swept_cases)]
    ran = {c.case_id for c in sweep.cases}
    # the row's case is what its case_hash in the baseline will say was measured
    refuse_foreign_rows(
        suite.swept_cases,
        sweep,
        source,
        f"a baseline of them would compare other cases: update from a run of the suite as it is now (`{redo}`)",
    )
    missing = [cid for cid in wanted if cid not in ran]
    if missing:
        within = f" matching --only {scope.only!r}" if not scope.whole else ""
        raise UserError(
            f"{source}: holds {len(wanted) - len(missing)} of the {len(wanted)} cases of suite {sweep.suite!r}"
            f"{within}; missing {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}; updating {path} "
            f"from it would drop them from the baseline: update from a complete run (`{redo}`)"
        )
    incomplete = [f.case_id for f in map(incomplete_pass, sweep.cases) if f]
    if incomplete:
        raise UserError(
            f"{source}: {len(incomplete)} PASS rows carry no out/dq/dk/dv ratios ({', '.join(incomplete[:5])}"
            f"{' ...' if len(incomplete) > 5 else ''}), so the baseline would hold nothing to compare "
            f"with; regenerate the file with `attn-gate sweep` or run `{redo}`"
        )


def refuse_failing_run(
    sweep: SweepResult, written: Baseline, config: Config, path: Path, note: Path | None, reuse: Path | None = None
) -> str:
    """Why a run must not become a baseline ('' when it may): a failing row is recorded only when
    known_failures declarations cover everything it fails on (a bug with a reason, and for another
    project's kernel an upstream link, which `check` then reports as KNOWN); a baseline with no PASS
    row validates nothing. `written` is the baseline the run becomes: an --only run of cases the kernel
    skips, merged into rows that pass, still validates them. The refusal lists the failing cases worst
    first with their reasons, what they share, and the ways forward with the declaration that records
    them (gate/report/failures.py); `reuse` is the saved run that recording them may start from."""
    if not any(row.status is Status.PASS for row in written.correctness.values()):
        return "no case passed (all skipped or failing), so the baseline would validate nothing; fix the kernel or the suite"
    undeclared = undeclared_failures(sweep, config.known_failures)
    if not undeclared:
        return ""
    return first_refusal(sweep, undeclared, config, written=written).text(
        path,
        sweep.kernel,
        update_command(sweep.kernel, sweep.suite, sweep.env.gpu_class_or_unknown),
        config.source,
        note,
        own_kernel(sweep.kernel, set(config.kernels)),
        terminal_width(),
        reuse,
    )


def first_refusal(
    sweep: SweepResult,
    undeclared: list[tuple[str, list[str]]],
    config: Config,
    reason: str = "",
    link: str = "",
    written: Baseline | None = None,
):
    """The refusal of `sweep`'s undeclared failures; `written`: the baseline the run would become,
    whose passing rows outside the run (an --only run merged into them) an envelope key must keep."""
    own = own_kernel(sweep.kernel, set(config.kernels))
    try:
        suite = {c.id: c for c in config.suite(sweep.suite).swept_cases}
    except UserError:  # a results file of a suite this config does not define: the run's own cases
        suite = {}
    ran = {c.case_id for c in sweep.cases}
    kept = [
        suite[cid]
        for cid, row in (written.correctness.items() if written is not None else ())
        if row.status is Status.PASS and cid not in ran and cid in suite
    ]
    # another project's kernel: its bug has an upstream issue; the block says so rather than inventing one
    return refusal(
        list(sweep.cases),
        undeclared,
        sweep.kernel,
        reason,
        link or ("" if own else "TODO: the upstream issue URL"),
        kept_passing=kept,
        suite_cases=list(suite.values()),
    )


def declare_known(sweep: SweepResult, config: Config, reason: str, link: str) -> tuple[Config, str, str]:
    """`baseline update --known REASON [--link URL]`: the config with declarations that cover
    exactly the run's undeclared failures, the pyproject text that holds them (appended; written
    by the caller, atomically, with the baseline) and the blocks, or a UserError naming the flag."""
    if config.source == "defaults" or not Path(config.source).is_file():
        raise UserError(
            "--known appends the declaration to your pyproject.toml, and there is none here: run "
            "`attn-gate init` first (or pass --config PATH/pyproject.toml)"
        )
    if not reason.strip() or "\n" in reason:
        raise UserError(
            '--known: give one line saying why these cases fail, e.g. --known "dq loses precision on shifted inputs"'
        )
    own = own_kernel(sweep.kernel, set(config.kernels))
    if not link and not own:
        raise UserError(
            f"--known for kernel {sweep.kernel!r}: another project's kernel, so pass --link with its upstream "
            f"issue (https://...); only your own kernel ([tool.attn-gate.kernels.NAME]) may go without"
        )
    undeclared = undeclared_failures(sweep, config.known_failures)
    if not undeclared:
        return config, "", ""
    block = first_refusal(sweep, undeclared, config, reason.strip(), link).block
    path = Path(config.source)
    text = path.read_text(encoding="utf-8")
    text = text + ("" if text.endswith("\n") else "\n") + "\n" + block
    try:
        entries = known_failures_in(text, path)
    except UserError as exc:
        raise UserError(f"--known: the declaration would not be valid ({exc}); nothing was written") from None
    return dataclasses.replace(config, known_failures=entries), text, block


@dataclass(frozen=True)
class UpdateFlags:
    """What `baseline update` adds to a run: timings from a perf file (`perf_from`), a widened
    baseline, a known_failures declaration (`known` with its `link`), a noisy speed section accepted."""

    perf_from: Path | None = None
    widen: bool = False
    known: str | None = None
    link: str = ""
    accept_noisy: bool = False


def update_outputs(folder: Path, summary: Path | None, config: Config, fresh: bool) -> Outputs:
    """--out (where a fresh run's sweep JSON is saved: outside the baselines, writable) and --summary,
    checked before the sweep; the summary is written before the baseline."""
    if fresh:
        refuse_inside_baselines(Path(folder), config.baselines_dir)
    if summary is not None:
        require_writable(Path(summary), "--summary", kind="file")
    if fresh:
        require_writable(Path(folder), "--out")
    return Outputs(Path(folder), summary=Path(summary) if summary is not None else None)


def run_baseline_update(
    plan: RunPlan, source: FreshSweep | SavedSweep, out: Outputs, flags: UpdateFlags = UpdateFlags()
) -> UpdateOutcome:
    """`_update_baseline` holding the baselines folder's lock from reading the old baseline to writing
    the new one: two updates at once would each merge into the same old file and one would be lost."""
    with FolderLock(Path(plan.config.baselines_dir), "baselines_dir"):
        return _update_baseline(plan, source, out, flags)


def _update_baseline(plan: RunPlan, source: FreshSweep | SavedSweep, out: Outputs, flags: UpdateFlags) -> UpdateOutcome:
    config, only, perf = plan.config, plan.only, plan.perf
    results, results_path = (source.sweep, source.path) if isinstance(source, SavedSweep) else (None, None)
    summary_path = out.summary
    refuse_unmatched_known(config, plan.kernel)
    if (
        flags.accept_noisy
        and flags.perf_from is None
        and (results is not None or flags.widen or not perf_wanted(perf, plan.device))
    ):
        raise UserError(
            "--accept-noisy records a noisy speed section, but this update times no speed: add --perf "
            "(or --perf-from FILE), or drop --accept-noisy"
        )
    path = plan.baseline_path
    old = None
    if path.exists():
        try:
            old = read_baseline(path)
        except UserError as exc:
            raise UserError(
                f"{exc} (the existing baseline is unreadable, so it is left as it is: restore it with "
                f"`git checkout -- {path}`, or delete it to start afresh)"
            ) from None
        if not same(plan.key, old.key, "gpu_class"):
            raise UserError(
                f"{path}: holds a baseline for GPU class {old.gpu_class!r}, not {plan.gpu_class!r}; it is left "
                f"as it is: move it to {Path(config.baselines_dir) / old.gpu_class}/ or delete it, then rerun"
            )
    scope = Scope.of_only(only) if results is None else results.scope
    suite_cases = plan.suite.swept_hashes()
    # refused now, not after the sweep
    if old is not None and not scope.whole and not same(plan.key, old.key, "suite_hash"):
        refuse_lacking_cases(
            old,
            suite_cases,
            scope.admits,
            f"--only {scope.only!r}" if results is None else f"{results_path}",
        )
    if old is None and not scope.whole:  # a filtered run merges into a baseline; without one it would BE the baseline
        what = f"--only {only!r}" if results is None else f"{results_path}: a run filtered with --only {scope.only!r}"
        raise UserError(
            f"{what}, but there is no baseline at {path} yet, so it would hold only those cases; create it "
            f"from the whole suite first: run without --only (`{update_command(plan.kernel, plan.suite.name, plan.gpu_class)}`)"
        )
    if flags.widen:  # refused now, not after the sweep
        if perf or flags.perf_from is not None:
            raise UserError(
                "--widen merges correctness rows of several machines; a speed section is one machine's "
                "timings: drop --perf / --perf-from (update the speed section on its own)"
            )
        refuse_widen(old, plan.key, None, path)
        perf = False  # not even a GPU's default: the committed speed section is kept as it is
    sweep = results if results is not None else fresh_sweep(plan, source.progress)
    saved_note = None
    if results is None:
        with writing("pass a writable --out folder"):
            saved_paths = write_sweep_outputs(sweep, out.folder)
        saved, saved_note = saved_paths["json"], saved_paths["note"]
        print(wrapped(f"the run is saved in {saved} (reuse it with --from-results)"))
    require_complete_run(plan, sweep, results_path if results is not None else "this run", path)
    differs = why_not_comparable(sweep.key, plan.key, ("tolerance",))
    if differs is not None:
        raise UserError(
            f"{results_path if results is not None else 'this run'}: measured with other tolerance "
            f"multipliers than {config.source} sets ({', '.join(differs.changed)}); a baseline of them could "
            f"never be compared with a check: update from a run with this config"
        )
    perf_section = None
    if results is not None and perf:
        raise UserError(
            "--perf times the kernel now, so it needs a fresh run: drop --from-results (or --perf), "
            "or pass the timings of that machine with --perf-from perf-K-S.json"
        )
    if flags.perf_from is not None:  # timings made elsewhere (e.g. `attn-gate perf --rounds 30` on the GPU runner)
        perf_section = perf_section_from_file(
            Path(flags.perf_from),
            plan.kernel,
            plan.suite.name,
            plan.gpu_class,
            config,
            old.perf if old is not None else None,
            flags.accept_noisy,
        )
    elif results is None:
        if perf_wanted(perf, plan.device):  # speed ratios with their noise; None keeps the old section
            perf_section, _ = perf_baseline_section(plan, old.perf if old is not None else None, flags.accept_noisy)
    new, kept = merge_baseline(Baseline.from_sweep(sweep, perf=perf_section), old, sweep.scope, suite_cases)
    new = dataclasses.replace(new, perf=timed_perf(new.perf, {c.id for c in plan.suite.perf_cases}))
    if flags.widen:
        new = widen_baseline(new, old, path)
    elif old is not None and spans_machines(old):
        print(
            f"attn-gate: {path} spanned {', '.join(f'{k} {v!r}' for k in WIDEN_KEYS if (v := old.env.value(k)) is not None)}; "
            f"this update holds this machine's rows only: widen it again with `--widen` from a run on each other machine",
            file=sys.stderr,
        )
    cfg = config.verdict
    diff = diff_baselines(old, new, path, cfg.headroom_factor, cfg.headroom_step, cfg.improvement_factor, kept)
    declared_text = declared = ""
    if flags.known is not None:  # declared now, validated as the config is; written with the baseline
        config, declared_text, declared = declare_known(sweep, config, flags.known, flags.link)
    # the run to record from with --known: the file read, or the run just saved where it timed no
    # speed (one that did would lose its speed section read back from a file)
    reuse = results_path if results is not None else (None if perf_wanted(perf, plan.device) else saved)
    refused = refuse_failing_run(sweep, new, config, path, saved_note, reuse)
    if refused:
        print(
            refused if refused.startswith("attn-gate: ") else f"attn-gate: refusing to write {path}: {refused}",
            file=sys.stderr,
        )
        return UpdateOutcome(diff, path, sweep, EXIT_FAIL)
    text = diff.markdown()
    if summary_path is not None:  # first: a summary that cannot be written leaves the baseline untouched
        with writing("pass a writable --summary file; the baseline was not written"):
            write_text_atomic(Path(summary_path), text)
    validate_written(new, path, plan.suite.swept_cases)  # the reader `check` uses, before the file is replaced
    if declared:  # never silently: the declaration is printed and lands in the file the PR shows
        with writing(f"neither {config.source} nor {path} was written"):
            write_text_atomic(Path(config.source), declared_text)
        print(f"appended to {config.source} (edit the reason if it should say more):\n\n{declared}")
    with writing(
        f"{path} was not written" + (f" ({summary_path} describes the change it would make)" if summary_path else "")
    ):
        new.write(path)
    print(text)
    wrote = f"wrote {path}: review the summary above and commit it in a PR" + (
        f" (summary for the PR body in {summary_path})" if summary_path else ""
    )
    print(wrapped(wrote))
    return UpdateOutcome(diff, path, sweep, EXIT_PASS)
