"""Perf files (`check --results --perf-results`) and a baseline's speed section that lie about what
was timed: each is refused (exit 2, one line naming the file and the field), never judged as
"speed PASS". A pass the baseline times that the file lacks is INCONCLUSIVE (exit 1)."""

from __future__ import annotations

import contextlib
import copy
import io
import json
from pathlib import Path

import pytest

from gate.commands.main import main
from gate.core.config import Config
from gate.speed.runs import PerfCaseResult, PerfResult, baseline_entry
from gate.speed.timing import PASSES, PassTiming, TimingPlan, TimingRun
from gate.workflow.sweep import run_sweep

# its tests share one module-scoped run: one worker makes it (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("perf_inputs")


SUITE = (
    "[tool.attn-gate.suites.pf]\nseeds = [0]\n[[tool.attn-gate.suites.pf.matrix]]\n"
    'dtype = ["fp32"]\nbatch = [1]\nseqlens = ["16"]\nheads = ["2"]\nhead_dims = ["8"]\nperf = [true]\n'
)
ANCHOR = "sdpa-math"
PLAN = TimingPlan(rounds=15, calls_per_round=1, warmup_s=0.0)


def timed(case, ratio: float = 1.0) -> PerfCaseResult:
    """A synthetic timed row (no timing happens): ratio `ratio`, +-0.2% from round to round."""
    wobble = [1.0 + 0.002 * ((i * 7) % 15 / 7 - 1) for i in range(15)]
    passes = tuple(PassTiming(p, tuple((w,) for w in wobble), tuple((1.0 / ratio,) for _ in wobble)) for p in PASSES)
    return PerfCaseResult(
        case=case, status="OK", timing=TimingRun(method="perf_counter", plan=PLAN, passes=passes), anchor=ANCHOR
    )


class PerfProject:
    """A real sweep of a one-case suite, its baseline with a synthetic speed section, and a perf
    file of the same run whose ratio equals the baseline's: `check` of them passes."""

    def __init__(self, root: Path):
        import tomllib

        self.root = root
        self.config = root / "pyproject.toml"
        self.config.write_text(f'[tool.attn-gate]\nbaselines_dir = "baselines"\n{SUITE}')
        suites = tomllib.loads(SUITE)["tool"]["attn-gate"]["suites"]
        sweep = run_sweep("sdpa-cpu", "pf", Config(suites=suites, source=str(self.config)), "cpu", progress=False)
        self.results = root / "results.json"
        sweep.write(self.results)
        quiet(["baseline", "update", "--from-results", str(self.results), "--config", str(self.config)], 0)
        (self.baseline,) = (root / "baselines" / "cpu").glob("*.json")
        case = sweep.cases[0].case
        data = json.loads(self.baseline.read_text())
        data["perf"] = {case.id: baseline_entry(timed(case), ANCHOR, "")}
        self.baseline.write_text(json.dumps(data))
        self.baseline_json = data
        perf = PerfResult(
            kernel="sdpa-cpu",
            anchor=ANCHOR,
            suite="pf",
            device="cpu",
            environment={**sweep.environment, "anchor": ANCHOR},
            plan=PLAN,
            cases=(timed(case),),
            started_at="2026-01-01T00:00:00+00:00",
            wall_s=1.0,
        )
        self.perf_json = json.loads(json.dumps(perf.to_dict()))

    def check(self, perf: Path) -> list[str]:
        return [
            "check",
            "--config",
            str(self.config),
            "--results",
            str(self.results),
            "--perf-results",
            str(perf),
            "--out",
            str(self.root / "out"),
            "--no-progress",
        ]


def quiet(argv: list[str], expected: int | None = None) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(argv)
    if expected is not None:
        assert code == expected, err.getvalue()
    return code, err.getvalue()


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> PerfProject:
    return PerfProject(tmp_path_factory.mktemp("perf-inputs"))


def _pass(d: dict, name: str = "fwd") -> dict:
    return next(p for p in d["cases"][0]["timing"]["passes"] if p["pass"] == name)


def _set(path: tuple, value):
    def edit(d):
        for key in path[:-1]:
            d = d[key]
        d[path[-1]] = value

    return edit


# (name, edit of the perf file, words of the one-line refusal)
PERF_FILES = [
    ("passes-empty", _set(("cases", 0, "timing", "passes"), []), "timing.passes = []"),
    ("pass-unknown", lambda d: _pass(d).update({"pass": "fwdx"}), "must be distinct passes"),
    ("pass-twice", lambda d: _pass(d, "bwd").update({"pass": "fwd"}), "must be distinct passes"),
    ("sample-negative", lambda d: _pass(d)["candidate_ms"][0].__setitem__(0, -1.0), "candidate_ms holds -1.0"),
    ("sample-zero", lambda d: _pass(d)["anchor_ms"][3].__setitem__(0, 0.0), "anchor_ms holds 0.0"),
    ("sample-nan", lambda d: _pass(d)["candidate_ms"][0].__setitem__(0, "nan"), "candidate_ms holds nan"),
    ("sample-huge", lambda d: _pass(d)["candidate_ms"][0].__setitem__(0, 1e300), "candidate_ms holds 1e+300"),
    ("round-empty", lambda d: _pass(d)["candidate_ms"].__setitem__(0, []), "a round of 0 calls"),
    ("rounds-differ", lambda d: _pass(d)["anchor_ms"].pop(), "15 candidate and 14 anchor rounds"),
    ("anchor-scale-zero", lambda d: _pass(d).update({"anchor_scale": 0.0}), "anchor_scale = 0.0 must be in (0"),
    ("device-cuda", _set(("device",), "cuda"), "device = 'cuda' but environment.device = 'cpu'"),
    (
        "device-cuda-both",
        lambda d: (d.update(device="cuda"), d["environment"].update(device="cuda")),
        "device = 'cuda' but the results ran on 'cpu'",
    ),
    ("kind-sweep", _set(("kind",), "attn-gate sweep"), "kind = 'attn-gate sweep' is not 'attn-gate perf'"),
    ("plan-rounds-1e9", _set(("plan", "rounds"), 10**9), "plan.rounds = 1000000000 must be an integer in [1, 1000]"),
    ("plan-passes-empty", _set(("plan", "passes"), []), "plan.passes = [] must be a non-empty list"),
    ("case-id-forged", _set(("cases", 0, "case_id"), "fp32-b1-h2-s99-d8"), "is not the id of its case"),
    ("case-twice", lambda d: d["cases"].append(copy.deepcopy(d["cases"][0])), "appears twice"),
    ("ok-without-timing", _set(("cases", 0, "timing"), None), "status OK without timing"),
    ("no-cases", _set(("cases",), []), "cases = []"),
]


@pytest.mark.parametrize("name, edit, words", PERF_FILES, ids=[p[0] for p in PERF_FILES])
def test_a_perf_file_that_lies_about_its_timings_is_refused(project, name, edit, words):
    data = copy.deepcopy(project.perf_json)
    edit(data)
    perf = project.root / f"perf-{name}.json"
    perf.write_text(json.dumps(data))
    code, err = quiet(project.check(perf))
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert words in err and str(perf) in err, err


def test_the_good_perf_file_passes(project):
    perf = project.root / "perf-good.json"
    perf.write_text(json.dumps(project.perf_json))
    quiet(project.check(perf), 0)


def test_a_pass_the_baseline_times_and_the_file_lacks_is_inconclusive(project):
    """A file timing the forward only (`plan.passes = ["fwd"]`) against a baseline that times both:
    the backward is not judged, so the run cannot pass."""
    data = copy.deepcopy(project.perf_json)
    data["plan"]["passes"] = ["fwd"]
    data["cases"][0]["timing"]["passes"] = [_pass(data)]
    perf = project.root / "perf-fwd-only.json"
    perf.write_text(json.dumps(data))
    quiet(project.check(perf), 1)
    findings = json.loads(next((project.root / "out").glob("findings-*.json")).read_text())["findings"]
    speed = [(f["metric"], f["severity"]) for f in findings if f["rule"] == "speed"]
    assert ("speed_ratio:bwd", "INCONCLUSIVE") in speed, speed


def _entry(d: dict) -> dict:
    return next(iter(d["perf"].values()))


# (name, edit of the baseline, words)
SPEED_SECTIONS = [
    ("median-negative", lambda d: _entry(d)["fwd"].update(median=-1.0), "median = -1.0 must be"),
    ("median-nan", lambda d: _entry(d)["fwd"].update(median="nan"), "median = 'nan' must be"),
    ("median-zero", lambda d: _entry(d)["fwd"].update(median=0.0, samples=[]), "median = 0.0 must be > 0"),
    ("median-not-of-samples", lambda d: _entry(d)["fwd"].update(median=5.0), "is not the median of its samples"),
    ("n-zero", lambda d: _entry(d)["bwd"].update(n=0), "n = 0 must be an integer in [1, 1000]"),
    ("samples-short", lambda d: _entry(d)["bwd"]["samples"].pop(), "samples must be a list of n = 15 ratios"),
    ("pass-unknown", lambda d: _entry(d).update(fwdx=_entry(d)["fwd"]), "unknown key 'fwdx'"),
    ("entry-not-an-object", lambda d: d["perf"].update({next(iter(d["perf"])): 3}), "must be an object"),
    ("no-pass", lambda d: d["perf"].update({next(iter(d["perf"])): {"anchor": ANCHOR}}), "has no pass"),
    ("perf-a-list", _set(("perf",), [1]), "perf must be an object"),
]


@pytest.mark.parametrize("name, edit, words", SPEED_SECTIONS, ids=[p[0] for p in SPEED_SECTIONS])
def test_a_baseline_speed_section_that_contradicts_itself_is_refused(project, name, edit, words):
    data = copy.deepcopy(project.baseline_json)
    edit(data)
    bad = project.root / f"baseline-{name}.json"
    bad.write_text(json.dumps(data))
    perf = project.root / "perf-good.json"
    perf.write_text(json.dumps(project.perf_json))
    argv = project.check(perf)
    code, err = quiet(argv[:1] + ["--baseline", str(bad)] + argv[1:])
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert words in err and str(bad) in err, err
