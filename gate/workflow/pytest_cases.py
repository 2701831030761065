"""The gate's side of `pytest --attn-gate` (gate/pytest_plugin.py holds the pytest side): the run
resolved once, one case swept and judged by the check's rules, and the rows of every item judged
as one run with `attn-gate check --results`'s own code, which writes its files."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from gate.compare.admission import baseline_for_fresh_run
from gate.compare.baselines import Baseline
from gate.core.cases import Case, exact_regex
from gate.core.config import load_config
from gate.core.errors import UserError
from gate.core.identity import Scope
from gate.core.results import CaseResult
from gate.workflow.check import (
    CaseVerdict,
    CheckOutcome,
    case_verdicts,
    outputs,
    run_check,
    saved_sweep,
)
from gate.workflow.plan import RunPlan, resolve_plan
from gate.workflow.sweep import SweepOptions, sweep_plan, sweep_result

__all__ = ["GateRun", "UserError", "resolve"]


@dataclass(frozen=True)
class GateRun:
    plan: RunPlan  # its baseline_path and baseline_option (--attn-gate-baseline as given) name the file
    baseline: Baseline

    def run_case(self, case: Case) -> tuple[CaseVerdict, str]:
        """The case swept alone, isolated in the gate's worker, and the check's verdict on it; with
        the row as JSON (what the reporting process joins)."""
        plan = dataclasses.replace(self.plan, only=exact_regex([case.id]), options=SweepOptions(workers=1))
        # pytest sets PYTEST_CURRENT_TEST per item; the warm worker pool is keyed by the environment,
        # so with it each case would start (and import torch in) a new worker
        current = os.environ.pop("PYTEST_CURRENT_TEST", None)
        try:
            sweep = sweep_plan(plan, progress=False)
        finally:
            if current is not None:
                os.environ["PYTEST_CURRENT_TEST"] = current
        verdict = case_verdicts(plan, self.baseline, sweep)[case.id]
        (row,) = sweep.cases
        return verdict, json.dumps({"row": row.to_dict(), "environment": sweep.environment, "notes": list(sweep.notes)})

    def judge(self, rows: dict[str, dict], started: float, out_dir: Path) -> CheckOutcome:
        """Every item's row as one sweep (scoped to the cases that ran), judged and written as
        `attn-gate check --results` does."""
        from rich.console import Console

        plan = self.plan
        ran = [c.id for c in plan.cases if c.id in rows]
        first = rows[ran[0]]
        sweep = sweep_result(
            plan,
            environment=first["environment"],
            cases=[CaseResult.from_dict(rows[cid]["row"]) for cid in ran],
            started_at=time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(started)),
            wall_s=time.time() - started,
            notes=first["notes"],
            scope=Scope() if len(ran) == len(plan.cases) else Scope(exact_regex(ran)),
        )
        with tempfile.TemporaryDirectory(prefix="attn-gate-pytest-") as tmp:
            results = Path(tmp) / f"sweep-{plan.suite.name}.json"
            sweep.write(results)
            out = outputs(out_dir, plan.config, Console(file=io.StringIO()))
            saved_plan, source = saved_sweep(plan.config, results, baseline_file=plan.baseline_option)
            return run_check(saved_plan, source, out)


def resolve(
    config_file: str | None, kernel: str | None, suite: str | None, device: str | None, baseline_file: str | None
) -> GateRun:
    """The plan and the baseline, with every refusal `check` makes before a fresh sweep."""
    option = Path(baseline_file) if baseline_file else None
    plan = resolve_plan(
        load_config(Path(config_file) if config_file else None), kernel, suite, device, baseline_file=option
    )
    return GateRun(
        plan, baseline_for_fresh_run(plan.key, plan.suite, plan.config, plan.baseline_path, plan.baseline_option)
    )
