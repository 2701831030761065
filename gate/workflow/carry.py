"""`attn-gate baseline carry FILE`: a baseline brought to its suite as defined now, with no run.

When a suite loses cases, or a case becomes timing-only (perf = "only"), nothing new needs
measuring: every swept case of the suite still has its row, unchanged (its case_hash says so).
Carrying rewrites the baseline for the new suite hash, drops the rows of cases the suite no longer
sweeps and the speed rows of cases it no longer times, and keeps every other row as measured
(environment, commit and measured_at stay: the rows were measured then). It refuses, naming the
`--only` to measure, when a swept case is new or changed, or a timed case has no speed row and no
row at all (never measured). Runs anywhere: no kernel, no GPU.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from gate.compare.baselines import (
    SCHEMA_VERSION,
    BaselineDiff,
    cases_to_rerun,
    diff_baselines,
    read_baseline,
    remeasure_hint,
    timed_perf,
    update_command,
    validate_written,
)
from gate.compare.comparable import same, why_not_comparable
from gate.core.cases import suite_hash
from gate.core.config import Config
from gate.core.errors import UserError
from gate.core.identity import RunKey


def carry_baseline(path: Path, config: Config) -> BaselineDiff | None:
    """Rewrite the baseline at `path` for its suite as `config` defines it now; None when it
    matches already. Every refusal is a UserError naming the file and the run that would fix it."""
    old = read_baseline(path)
    suite = config.suite(old.suite)
    # the baseline's key as this config would make it now
    now = RunKey.of(old.kernel, old.suite, suite_hash(suite), config.tolerance.as_dict(), old.gpu_class)
    redo = update_command(old.kernel, old.suite, old.gpu_class)
    if same(now, old.key, "suite_hash"):
        return None
    differs = why_not_comparable(now, old.key, ("tolerance",))
    if differs is not None:
        raise UserError(
            f"{path}: measured with other tolerance multipliers ({', '.join(differs.changed)}), so its rows cannot "
            f"be carried; regenerate it with `{redo}`"
        )
    swept = suite.swept_hashes()
    timed = [c.id for c in suite.perf_cases]
    rerun = cases_to_rerun(old, swept)
    if rerun:
        raise UserError(
            f"{path}: {len(rerun)} cases suite {old.suite!r} sweeps are new or changed since the baseline; "
            f"nothing to carry them from: on a {old.gpu_class} machine run "
            f"{remeasure_hint(old, swept, set(timed), redo, path)}"
        )
    perf = old.perf
    if perf is not None:
        never = [cid for cid in timed if cid not in perf and cid not in old.correctness]
        if never:
            raise UserError(
                f"{path}: {len(never)} timing cases of suite {old.suite!r} were never measured "
                f"({', '.join(never[:3])}{' ...' if len(never) > 3 else ''}); time them with `attn-gate perf "
                f"--kernel {old.kernel} --suite {old.suite} --rounds 30 --out out` on a {old.gpu_class} machine and "
                f"record them with `{redo} --perf-from out/perf-{old.kernel}-{old.suite}.json`"
            )
        perf = timed_perf(perf, set(timed))
    new = dataclasses.replace(
        old,
        suite_hash=now.suite_hash,
        schema_version=SCHEMA_VERSION,
        perf=perf,
        correctness={cid: row for cid, row in old.correctness.items() if cid in swept},
    )
    validate_written(new, path, suite.swept_cases)
    verdict = config.verdict
    diff = diff_baselines(old, new, path, verdict.headroom_factor, verdict.headroom_step, verdict.improvement_factor)
    new.write(path)
    return diff
