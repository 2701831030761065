"""Decided verdicts rendered by every renderer, for the golden-text tests (tests/test_render_golden.py).

Each scenario is a real sweep (the committed CPU smoke sweep in tests/data) with planted changes, judged
against the committed CPU baseline by the real rules, so every rule family and every tempering of
advice (a failing run, an environment change) reaches the renderers."""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import math
from pathlib import Path

from gate.compare.baselines import read_baseline
from gate.compare.diagnosis import diagnose
from gate.compare.findings import CheckContext, decide
from gate.compare.sweep_rules import compare, correctness_thresholds
from gate.core.config import VerdictConfig
from gate.core.results import Status, SweepResult

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
CPU_BASELINE = ROOT / "baselines" / "cpu" / "sdpa-cpu-smoke.json"
# the committed baseline as it stood beside the stored sweep (read as if from CPU_BASELINE's path):
# the goldens stay the same text when smoke grows and the committed one gains rows
FROZEN_BASELINE = DATA / "cpu-baseline-sdpa-cpu-smoke.json.gz"


def _sweep(tmp: Path) -> SweepResult:
    path = tmp / "cpu-sweep.json"
    path.write_bytes(gzip.decompress((DATA / "cpu-sweep-sdpa-cpu-smoke.json.gz").read_bytes()))
    return SweepResult.read(path)


def _set(case, tensor: str, ratio: float):
    return dataclasses.replace(
        case, tensors=tuple(dataclasses.replace(t, ratio=ratio) if t.tensor == tensor else t for t in case.tensors)
    )


def _planted(sweep: SweepResult, failing: bool, env: dict[str, str]) -> SweepResult:
    """Improvements in two cases (WARN: refresh), one case dropped from the run (removed), and when
    `failing` a tolerance violation, a headroom regression and an error."""
    cases = list(sweep.cases)
    passing = [i for i, c in enumerate(cases) if c.status is Status.PASS and c.tensors]
    cases[passing[0]] = _set(cases[passing[0]], "dv", cases[passing[0]].tensor("dv").ratio * 0.01)
    cases[passing[1]] = _set(cases[passing[1]], "dq", cases[passing[1]].tensor("dq").ratio * 0.01)
    if failing:
        cases[passing[2]] = _set(cases[passing[2]], "dk", 3.0)
        cases[passing[3]] = _set(cases[passing[3]], "out", 0.95)
        cases[passing[4]] = dataclasses.replace(
            cases[passing[4]], status=Status.ERROR, reason="RuntimeError: planted", tensors=()
        )
    del cases[passing[5]]
    return dataclasses.replace(sweep, cases=tuple(cases), environment={**sweep.environment, **env})


def scenarios(tmp: Path) -> dict[str, tuple]:
    """name -> (verdict, sweep, baseline)."""
    frozen = tmp / "cpu-baseline.json"
    frozen.write_bytes(gzip.decompress(FROZEN_BASELINE.read_bytes()))
    baseline = read_baseline(frozen)
    base = _sweep(tmp)
    cfg = VerdictConfig()
    out = {}
    for name, failing, env in (
        ("pass", False, {}),
        ("pass-env", False, {"torch": "9.9.9"}),
        ("fail", True, {}),
        ("fail-env", True, {"torch": "9.9.9"}),
        ("quiet", False, dict(baseline.environment)),
    ):
        sweep = _planted(base, failing, env)
        context = CheckContext(key=sweep.key, baseline=str(CPU_BASELINE.relative_to(ROOT)))
        found = compare(baseline, sweep, cfg)
        out[name] = (decide(found, correctness_thresholds(cfg), context), sweep, baseline)
        if name in ("pass", "pass-env", "quiet"):  # speed beside correctness: an environment change, a failing run
            speed = speed_findings()
            calm = [f for f in speed if not f.severity.blocks]
            out[f"{name}-speed"] = (decide(found + speed, correctness_thresholds(cfg), context), sweep, baseline)
            out[f"{name}-speed-calm"] = (decide(found + calm, correctness_thresholds(cfg), context), sweep, baseline)
    return out


def speed_findings():
    """Speed judgements of every severity by the real rule, as findings: a faster pass (WARN with
    advice), a slower one (FAIL), one within, one straddling, one without a baseline."""
    from gate.core.config import PerfConfig
    from gate.speed.rule import PerfRules, RatioEstimate, judge
    from gate.workflow.speed_check import perf_findings

    rules = PerfRules.from_config(PerfConfig(), "cuda")

    def est(m, noise=0.002, n=30):
        return RatioEstimate.from_samples([m * (1 + noise * ((i % 5) - 2)) for i in range(n)])

    judgements = (
        judge("case-a", "fwd", est(1.0), est(0.5), rules),
        judge("case-a", "bwd", est(1.0), est(1.5), rules),
        judge("case-b", "fwd", est(1.0), est(1.001), rules),
        judge("case-b", "bwd", est(1.0), est(1.02, noise=0.03, n=8), rules),
        judge("case-c", "fwd", None, est(1.0), rules),
    )
    return perf_findings(judgements)


def rendered(verdict, sweep, baseline) -> str:
    """Every renderer's text for one decided verdict, in one document."""
    from rich.console import Console

    from gate.report.check_report import print_check
    from gate.report.comment import Links, pr_comment
    from gate.report.failures import check_lines

    console = Console(file=io.StringIO(), width=200, color_system=None, force_terminal=False)
    print_check(verdict, diagnose(verdict, sweep), sweep, console=console)
    rows = {c.case_id: c for c in sweep.cases}
    lines = [f"{x.text} | {x.size if math.isfinite(x.size) else 'inf'}" for x in check_lines(verdict.findings, rows)]
    links = Links(artifacts="https://x/run#artifacts", asv="https://x/asv", repository="https://x/r")
    return "\n".join(
        [
            "== headline",
            verdict.headline,
            "== findings json",
            json.dumps(verdict.to_dict(), indent=1, sort_keys=True, default=str),
            "== terminal",
            console.file.getvalue(),
            "== failure lines",
            *lines,
            "== comment",
            pr_comment(verdict, diagnose(verdict, sweep), sweep, baseline, links),
        ]
    )


def write_goldens(tmp: Path) -> list[Path]:
    """Rewrite tests/data/golden from this tree: only on purpose, when a report's text is meant to
    change (`python -m tests.render_scenarios`), and review the diff of the decompressed texts."""
    out = []
    for name, judged in scenarios(tmp).items():
        path = DATA / "golden" / f"{name}.txt.gz"
        path.write_bytes(gzip.compress(rendered(*judged).encode(), mtime=0))
        out.append(path)
    return out


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        for path in write_goldens(Path(d)):
            print(path.relative_to(ROOT))
