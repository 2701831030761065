"""May this check go ahead? What `check` refuses before it judges a run against its baseline.

    fresh run:     known_failures match cases -> the baseline file exists -> it parses -> same GPU
                   class -> complete for the suite -> not stale (suite, its definition, tolerance)
    results file:  of the config as it is now -> known_failures match cases -> the baseline, as above

Each step takes the values it asks about (the run's RunKey, the suite, the baseline's path) and
raises the one-line UserError that names the file and the fix, before anything is swept or written.
Whether two keys may be compared at all is gate/compare/comparable.py's table; this module says
what each answer means for a check.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from gate.compare.baselines import (
    Baseline,
    baseline_path,
    forged_case_hashes,
    read_baseline,
    refuse_incomplete_rows,
    update_command,
)
from gate.compare.comparable import same, why_not_comparable
from gate.compare.known import for_kernel, refuse_unmatched
from gate.compare.sweep_rules import refuse_other_gpu_class, refuse_stale_baseline
from gate.core.cases import Case, Suite, suite_names
from gate.core.config import Config
from gate.core.errors import UserError
from gate.core.identity import RunKey
from gate.core.results import SweepResult

# The documentation page and section that every "no baseline" message points to (tests/test_validate.py
# checks both exist).
BASELINES_DOC = ("docs/baselines.md", "Baselines")


def refuse_unmatched_known(config: Config, kernel: str) -> None:
    """Before any sweep: a known_failures declaration for this kernel must match a case of some
    suite (each suite as the config defines it; asked only when a declaration names the kernel)."""
    if not for_kernel(config.known_failures, kernel):
        return
    # swept cases: a declaration that matches only timing-only ones would never apply
    suites = {name: [c.id for c in config.suite(name).swept_cases] for name in suite_names(config.suites)}
    refuse_unmatched(config.known_failures, kernel, suites)


def refuse_foreign_rows(cases: Iterable[Case], sweep: SweepResult, source: object, fix: str) -> None:
    """Each row's case must be the suite's case of that id (`cases`: the suite's swept cases): a row
    whose case was edited (another seqlen under the same id) measured something else, and must not
    be judged or recorded as it."""
    by_id = {c.id: c for c in cases}
    foreign = [c.case_id for c in sweep.cases if by_id.get(c.case_id) != c.case]
    if foreign:
        raise UserError(
            f"{source}: {len(foreign)} rows measured a case that is not the suite's case of that id "
            f"({', '.join(foreign[:3])}{' ...' if len(foreign) > 3 else ''}); {fix}"
        )


def refuse_results_of_another_config(
    key: RunKey, config_source: str, cases: Iterable[Case], sweep: SweepResult, path: Path
) -> None:
    """A results file is judged under the config as it is now (`key`, from `config_source`): one
    measured with another definition of its suite or other tolerance multipliers is not what this
    config would gate."""
    differs = why_not_comparable(sweep.key, key, ("suite_hash", "tolerance"))
    if differs is not None and differs.key == "suite_hash":
        raise UserError(
            f"{path}: made from another definition of suite {sweep.suite!r} (hash {sweep.suite_hash}) than "
            f"{config_source} gives now ({key.suite_hash}); re-run the sweep with this config"
        )
    if differs is not None:
        raise UserError(
            f"{path}: measured with other tolerance multipliers than {config_source} sets "
            f"({', '.join(differs.changed)}); re-run the sweep with this config"
        )
    refuse_foreign_rows(cases, sweep, path, "re-run the sweep with this config")


def check_working_directory(config: Config) -> None:
    """Run from another folder, `baselines/` (relative to the working directory) is not there and
    every check would say "no baseline": say where to run from instead."""
    folder = Path(config.baselines_dir)
    if folder.is_dir() or config.source != "defaults":
        return  # a configured project without baselines yet: "no baseline, create it with ..." is right
    raise UserError(
        f"no pyproject.toml and no {folder}/ folder in {Path.cwd()}: run attn-gate from your "
        f"repository's root (where pyproject.toml and {folder}/ are), or pass --config PATH/pyproject.toml"
    )


def require_baseline_file(key: RunKey, config: Config, path: Path, option: Path | None) -> None:
    """The baseline `path` exists; else the one line that says how to make it (never, for a typo in
    --baseline `option`, advice to create and commit a file by that name)."""
    if path.is_file():
        return
    if option:
        raise UserError(
            f"--baseline {option}: no such file; pass an existing baseline JSON, or leave "
            f"--baseline out to use {baseline_path(config.baselines_dir, key.gpu_class, key.kernel, key.suite)}"
        )
    check_working_directory(config)  # run from another folder: say so, not "no baseline"
    raise UserError(
        f"no baseline for kernel {key.kernel!r} on suite {key.suite!r} (gpu class {key.gpu_class!r}): {path} "
        f"does not exist. Create it with `{update_command(key.kernel, key.suite, key.gpu_class)}`, review "
        f"the printed summary and commit {path} (see {BASELINES_DOC[0]}, '{BASELINES_DOC[1]}')"
    )


def require_complete_baseline(key: RunKey, suite: Suite, baseline: Baseline, path: Path) -> None:
    """A baseline cut to a few cases (or to `{}`), or with PASS rows that carry no ratios, would gate
    nothing on the cases it lost: refused as a damaged file. A baseline of another suite, or of
    another definition of it, is left to refuse_stale_baseline, which says so."""
    if not same(key, baseline.key, "suite", "suite_hash"):
        return
    missing = [c.id for c in suite.swept_cases if c.id not in baseline.correctness]
    empty = [cid for cid, c in baseline.correctness.items() if c.status.value == "PASS" and not c.tensors]
    if missing or empty:
        what = (
            f"lacks {len(missing)} of the {len(suite.swept_cases)} cases of suite {baseline.suite!r} ({', '.join(missing[:3])}"
            f"{' ...' if len(missing) > 3 else ''})"
            if missing
            else f"has {len(empty)} PASS rows without ratios ({', '.join(empty[:3])}{' ...' if len(empty) > 3 else ''})"
        )
        raise UserError(
            f"{path}: the baseline {what}, so they would not be gated; restore it with `git checkout -- {path}` "
            f"or regenerate it with `{update_command(baseline.kernel, baseline.suite, baseline.gpu_class)}`"
        )
    refuse_incomplete_rows(baseline, suite.swept_cases, path)
    forged = forged_case_hashes(baseline, suite.swept_hashes())
    if forged:
        raise UserError(
            f"{path}: the case_hash of {len(forged)} rows names another case than suite {baseline.suite!r}'s "
            f"case of that id ({', '.join(forged[:3])}{' ...' if len(forged) > 3 else ''}): the rows were "
            f"edited or measured on other cases; restore it with `git checkout -- {path}` or regenerate it "
            f"with `{update_command(baseline.kernel, baseline.suite, baseline.gpu_class)}`"
        )
    if not any(c.measured for c in baseline.correctness.values()):
        raise UserError(
            f"{path}: every case of the baseline is SKIP, so it gates nothing; regenerate it on a machine "
            f"where the kernel runs (`{update_command(baseline.kernel, baseline.suite, baseline.gpu_class)}`)"
        )


def existing_baseline(key: RunKey, suite: Suite, config: Config, path: Path, option: Path | None) -> Baseline:
    """The baseline at `path`: there, readable, of the run's GPU class, and complete for the suite."""
    require_baseline_file(key, config, path, option)
    baseline = read_baseline(path)
    refuse_other_gpu_class(baseline, key, path)  # before a long sweep
    require_complete_baseline(key, suite, baseline, path)
    return baseline


def baseline_for_fresh_run(key: RunKey, suite: Suite, config: Config, path: Path, option: Path | None) -> Baseline:
    """Everything a fresh check refuses before it sweeps (known_failures that match no case, no or a
    damaged baseline, one of another GPU class, a stale one), then the baseline."""
    refuse_unmatched_known(config, key.kernel)
    baseline = existing_baseline(key, suite, config, path, option)
    refuse_stale_baseline(baseline, key, path, suite.swept_hashes(), {c.id for c in suite.perf_cases})
    return baseline


def baseline_for_results(
    key: RunKey, suite: Suite, config: Config, sweep: SweepResult, results: Path, path: Path, option: Path | None
) -> Baseline:
    """What a check of a results file refuses before it judges it (a file of another config,
    known_failures that match no case, no or a damaged baseline), then the baseline."""
    refuse_results_of_another_config(key, str(config.source), suite.swept_cases, sweep, results)
    refuse_unmatched_known(config, key.kernel)
    return existing_baseline(key, suite, config, path, option)
