"""Speed joined with correctness in `attn-gate check` / `baseline update`, on a tiny CPU case.
A doctored baseline must FAIL the speed rule; a lax one must pass; nothing asserts a speed.
Speed that was wanted and not judged (skipped, missing, out of scope, a results file) must say so."""

import io
import json
import shutil
from pathlib import Path

import pytest

from gate.commands.main import main
from gate.compare.findings import decide
from gate.core.cases import Case
from gate.core.config import Config, PerfConfig, load_config
from gate.core.environment import host_id
from gate.core.errors import UserError
from gate.speed.rule import PerfRules, PerfSeverity, RatioEstimate, judge
from gate.speed.runs import (
    PerfCaseResult,
    PerfResult,
    baseline_entry,
    judge_perf,
    measure_case,
    noisy_passes,
    perf_cases,
)
from gate.speed.timing import PASSES, PassTiming, TimingPlan, TimingRun
from gate.workflow.speed_check import perf_findings, refuse_noisy

CONFIG = """
[tool.attn-gate]
baselines_dir = "baselines"

[tool.attn-gate.cpu]
kernel = "sdpa-cpu"
suite = "tiny"

[tool.attn-gate.perf]
cpu_anchor = "sdpa-math"
rounds = 7
calls_per_round = 1
confirm_rounds = 7
min_rounds = 5
warmup_s = 0.0
{extra}

[tool.attn-gate.suites.tiny]
seeds = [0]

[[tool.attn-gate.suites.tiny.matrix]]
dtype = ["fp32"]
batch = [1]
seqlens = ["32"]
heads = ["2"]
head_dims = ["16"]
perf = [true]

[[tool.attn-gate.suites.tiny.matrix]]
dtype = ["fp32"]
batch = [1]
seqlens = ["16"]
heads = ["2"]
head_dims = ["16"]
perf = [false]
"""
CASE = "fp32-b1-h2-s32-d16"
NOT_PERF = "fp32-b1-h2-s16-d16"  # a correctness-only case of the same suite


def write_config(tmp: Path, extra: str = "") -> Path:
    path = tmp / "pyproject.toml"
    path.write_text(CONFIG.replace("{extra}", extra))
    return path


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """The project with its speed baseline, recorded once per module (a perf run of a few seconds)."""
    tmp = tmp_path_factory.mktemp("perf-project")
    cfg = write_config(tmp)
    # CPU timings of 7 rounds are often noisier than max_noise_pct: recorded marked noisy
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp)
        assert (
            main(
                [
                    "baseline",
                    "update",
                    "--device",
                    "cpu",
                    "--perf",
                    "--accept-noisy",
                    "--config",
                    str(cfg),
                    "--no-progress",
                    "--out",
                    str(tmp / "out"),
                ]
            )
            == 0
        )
    return tmp


@pytest.fixture()
def project(recorded, tmp_path, monkeypatch):
    """A copy of the recorded project of this test's own, the working directory: a test may change it."""
    shutil.copytree(recorded, tmp_path, dirs_exist_ok=True)
    monkeypatch.chdir(tmp_path)
    baseline = tmp_path / "baselines" / "cpu" / "sdpa-cpu-tiny.json"
    return tmp_path, baseline


def findings(tmp: Path) -> list[dict]:
    return json.loads((tmp / "out" / "findings-sdpa-cpu-tiny.json").read_text())["findings"]


def check(tmp: Path, *extra: str) -> int:
    return main(
        [
            "check",
            "--device",
            "cpu",
            "--config",
            str(tmp / "pyproject.toml"),
            "--no-progress",
            "--out",
            str(tmp / "out"),
            *extra,
        ]
    )


def doctor(baseline: Path, factor: float) -> None:
    """Pretend the baseline was `factor` times the speed ratio it recorded, with no noise."""
    data = json.loads(baseline.read_text())
    for entry in data["perf"].values():
        for p in ("fwd", "bwd"):
            m = entry[p]["median"] * factor
            entry[p].update(median=m, noise=0.0, samples=[m] * entry[p]["n"])
    baseline.write_text(json.dumps(data))


@pytest.mark.slow
def test_baseline_update_records_speed_ratios_with_noise(project):
    _, baseline = project
    perf = json.loads(baseline.read_text())["perf"]
    entry = perf[CASE]
    assert entry["anchor"] == "sdpa-math"
    assert entry["host"] == host_id("cpu") != "", entry["host"]  # this machine's digest: the same-host limit
    for p in ("fwd", "bwd"):
        assert (
            entry[p]["n"] == 7 and len(entry[p]["samples"]) == 7 and entry[p]["median"] > 0 and entry[p]["noise"] >= 0
        )


@pytest.mark.slow
def test_check_joins_speed_findings_into_one_report(project):
    tmp, _ = project
    check(tmp, "--perf")
    speed = [f for f in findings(tmp) if f["rule"] == "speed"]
    assert {f["metric"] for f in speed} == {"speed_ratio:fwd", "speed_ratio:bwd"}
    assert (tmp / "out" / "speed-sdpa-cpu-tiny.png").is_file()
    assert (tmp / "out" / "perf-sdpa-cpu-tiny.json").is_file()
    assert "### Speed" in (tmp / "out" / "check-sdpa-cpu-tiny.md").read_text()


@pytest.mark.slow
def test_a_far_slower_kernel_fails_and_a_lax_threshold_passes(project):
    tmp, baseline = project
    write_config(tmp)
    doctor(baseline, 0.2)  # the baseline says the kernel was 5x faster relative to its anchor
    assert check(tmp, "--perf") == 1
    speed = [f for f in findings(tmp) if f["rule"] == "speed"]
    assert speed and all(f["severity"] == "FAIL" for f in speed), speed
    # every FAIL went through the 7-round confirm re-run: "confirmed" where the first interval lay
    # wholly above the limit, a re-measured straddle where a busy CPU's noise widened it
    assert all("7-round re-run" in f["message"] for f in speed)
    write_config(tmp, "cpu_regression_pct = 1000.0")  # timed on a CPU: its limit applies
    doctor(baseline, 1.0)
    assert check(tmp, "--perf") == 0
    assert all(f["severity"] in ("OK", "WARN") for f in findings(tmp) if f["rule"] == "speed")


@pytest.mark.slow
def test_no_speed_section_is_inconclusive_not_pass(project):
    tmp, baseline = project
    data = json.loads(baseline.read_text())
    data["perf"] = None
    baseline.write_text(json.dumps(data))
    assert check(tmp, "--perf") == 1
    speed = [f for f in findings(tmp) if f["rule"] == "speed"]
    assert speed and all(f["severity"] == "INCONCLUSIVE" for f in speed)
    assert "baseline update --perf" in speed[0]["message"]


@pytest.mark.slow
def test_speed_is_off_by_default_on_a_cpu(project):
    tmp, _ = project
    assert check(tmp) == 0
    assert not [f for f in findings(tmp) if f["rule"] == "speed"]


@pytest.mark.slow
def test_perf_with_a_results_file_is_a_usage_error(project, capsys):
    tmp, _ = project
    results = next((tmp / "out").glob("sweep-*.json"))
    assert check(tmp, "--perf", "--results", str(results)) == 2
    assert "--perf times the kernel now" in capsys.readouterr().err


@pytest.mark.slow
def test_speed_section_from_a_perf_file_made_elsewhere(project):
    tmp, baseline = project
    cfg = str(tmp / "pyproject.toml")
    assert main(["perf", "--device", "cpu", "--config", cfg, "--out", str(tmp / "perf")]) == 0
    perf_file = tmp / "perf" / "perf-sdpa-cpu-tiny.json"
    data = json.loads(baseline.read_text())
    data["perf"] = None
    baseline.write_text(json.dumps(data))
    sweep = next((tmp / "out").glob("sweep-*.json"))
    assert (
        main(
            [
                "baseline",
                "update",
                "--device",
                "cpu",
                "--config",
                cfg,
                "--from-results",
                str(sweep),
                "--perf-from",
                str(perf_file),
                "--accept-noisy",
                "--out",
                str(tmp / "out"),
            ]
        )
        == 0
    )  # CPU: often noisy
    entry = json.loads(baseline.read_text())["perf"][CASE]
    assert entry["fwd"]["n"] == 7 and entry["bwd"]["median"] > 0
    other = json.loads(perf_file.read_text())
    other["kernel"] = "tiled"
    perf_file.write_text(json.dumps(other))
    assert (
        main(
            [
                "baseline",
                "update",
                "--device",
                "cpu",
                "--config",
                cfg,
                "--from-results",
                str(sweep),
                "--perf-from",
                str(perf_file),
                "--out",
                str(tmp / "out"),
            ]
        )
        == 2
    )  # another kernel's timings: refused


def speed_findings(tmp: Path) -> list[dict]:
    return [f for f in findings(tmp) if f["rule"] == "speed"]


def add_perf_entry(baseline: Path, case_id: str) -> None:
    """Give the baseline a speed ratio for `case_id` (as if it was a perf case when recorded)."""
    data = json.loads(baseline.read_text())
    data["perf"][case_id] = data["perf"][CASE]
    baseline.write_text(json.dumps(data))


# ---------------------------------------------------------------- judged or said not to be


A = Case.build(
    batch=1, seqlen_q=32, seqlen_k=32, heads_q=2, heads_kv=2, head_dim=16, head_dim_v=16, dtype="fp32", perf=True
)
B = Case.build(
    batch=1, seqlen_q=64, seqlen_k=64, heads_q=2, heads_kv=2, head_dim=16, head_dim_v=16, dtype="fp32", perf=True
)
PLAN = TimingPlan(rounds=15, calls_per_round=1, warmup_s=0.0)
ANCHOR = "sdpa-math"
HOST = "0123456789ab"  # the host digest of the synthetic runs and of their baselines: the same-host limit


def timed(case: Case, candidate_ms: float = 1.0, ratio: float = 1.0) -> PerfCaseResult:
    """A synthetic timed case (no timing happens): 15 rounds, the candidate taking `candidate_ms` per
    call at speed ratio `ratio`, +-0.2% from round to round."""
    wobble = [1.0 + 0.002 * ((i * 7) % 15 / 7 - 1) for i in range(15)]
    passes = tuple(
        PassTiming(p, tuple((candidate_ms * w,) for w in wobble), tuple((candidate_ms / ratio,) for _ in wobble))
        for p in PASSES
    )
    return PerfCaseResult(case=case, status="OK", timing=TimingRun(method="perf_counter", plan=PLAN, passes=passes))


def measured(case: Case) -> PerfCaseResult:
    """A synthetic timed case of speed ratio 1.0 +- 0.2%."""
    return timed(case)


def skipped(case: Case) -> PerfCaseResult:
    return PerfCaseResult(case=case, status="SKIP", reason="sdpa-flash refused the case after a torch upgrade")


def errored(case: Case) -> PerfCaseResult:
    return PerfCaseResult(case=case, status="ERROR", reason="SystemExit: 0")


def run_of(*cases: PerfCaseResult) -> PerfResult:
    return PerfResult(
        kernel="k",
        anchor=ANCHOR,
        suite="s",
        device="cuda",
        environment={"host": HOST},
        plan=PLAN,
        cases=cases,
        started_at="",
        wall_s=0.0,
    )


BASE_A = {A.id: baseline_entry(measured(A), ANCHOR, HOST)}
BASE_AB = {**BASE_A, B.id: baseline_entry(measured(B), ANCHOR, HOST)}
INC, OK = "INCONCLUSIVE", "OK"

JUDGED = [
    # id, run cases, baseline perf, --only, expected (case_id, severity) per judgement, words in the first message
    ("unchanged-passes", (measured(A),), BASE_A, None, [(A.id, OK)] * 2, "within the 2% limit"),
    ("skipped-now-baseline-timed-it", (skipped(A),), BASE_A, None, [(A.id, INC)] * 2, "sdpa-flash refused"),
    (
        "skipped-now-among-passing",
        (measured(B), skipped(A)),
        BASE_AB,
        None,
        [(B.id, OK)] * 2 + [(A.id, INC)] * 2,
        "within the 2% limit",
    ),
    (
        "baseline-case-missing-from-run",
        (measured(A),),
        BASE_AB,
        None,
        [(A.id, OK)] * 2 + [(B.id, INC)] * 2,
        "within the 2% limit",
    ),
    (
        "baseline-case-missing-within-only",
        (measured(A),),
        BASE_AB,
        "h2",
        [(A.id, OK)] * 2 + [(B.id, INC)] * 2,
        "within the 2% limit",
    ),
    ("baseline-case-outside-only", (measured(A),), BASE_AB, "s32", [(A.id, OK)] * 2, "within the 2% limit"),
    ("errored-now", (errored(A),), BASE_A, None, [(A.id, INC)] * 2, "not measured: SystemExit"),
    ("skipped-then-and-now", (skipped(B),), BASE_A, "s64", [("", INC)], "speed not judged"),
    ("skipped-no-speed-baseline", (skipped(A),), {}, None, [("", INC)], "speed not judged"),
]


@pytest.mark.parametrize("cases,base,only,expected,words", [t[1:] for t in JUDGED], ids=[t[0] for t in JUDGED])
def test_every_baseline_speed_ratio_is_judged_or_inconclusive(cases, base, only, expected, words):
    js = judge_perf(run_of(*cases), base, PerfConfig(), only=only)
    assert [(j.case_id, j.severity.value) for j in js] == expected, [j.message for j in js]
    assert words in js[0].message
    verdict = decide(perf_findings(js))
    assert verdict.passed is all(sev == OK for _, sev in expected)  # skipped, missing or nothing judged: no pass


# ---------------------------------------------------------------- a kernel that ends the process


KERNELS = """
import sys

def exits_zero(q, k, v, softmax_scale=None, causal=False):
    sys.exit(0)

def raises_system_exit_one(q, k, v, softmax_scale=None, causal=False):
    raise SystemExit(1)

def crashes(q, k, v, softmax_scale=None, causal=False):
    raise RuntimeError("boom")

def interrupted(q, k, v, softmax_scale=None, causal=False):
    raise KeyboardInterrupt
"""


@pytest.mark.parametrize(
    "fn,reason",
    [("exits_zero", "SystemExit"), ("raises_system_exit_one", "SystemExit"), ("crashes", "RuntimeError: boom")],
)
def test_a_kernel_ending_the_process_while_timed_is_an_error_row(fn, reason, tmp_path, monkeypatch):
    from gate.kernels.user import UserAdapter

    (tmp_path / "perf_exiting.py").write_text(KERNELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    row = measure_case(
        UserAdapter(f"perf_exiting:{fn}"), ANCHOR, A, "cpu", TimingPlan(rounds=1, calls_per_round=1, warmup_s=0.0)
    )
    assert (row.status, row.measured) == ("ERROR", False) and reason in row.reason


def test_ctrl_c_while_timed_stops_the_run(tmp_path, monkeypatch):
    from gate.kernels.user import UserAdapter

    (tmp_path / "perf_exiting.py").write_text(KERNELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        measure_case(
            UserAdapter("perf_exiting:interrupted"),
            ANCHOR,
            A,
            "cpu",
            TimingPlan(rounds=1, calls_per_round=1, warmup_s=0.0),
        )


# ---------------------------------------------------------------- scope and usage


def test_an_invalid_only_regex_is_a_one_line_usage_error(tmp_path, capsys):
    cfg = write_config(tmp_path)
    assert (
        main(["perf", "--device", "cpu", "--config", str(cfg), "--only", "fp32-(", "--out", str(tmp_path / "o")]) == 2
    )
    err = capsys.readouterr().err.strip()
    assert (
        "--only 'fp32-(' is not a regular expression" in err and "Traceback" not in err and len(err.splitlines()) == 1
    )
    with pytest.raises(UserError, match="not a regular expression"):
        perf_cases("smoke", Config(), only="[")
    assert perf_cases("smoke", Config(), only="d64")  # a valid one still selects


@pytest.mark.slow
def test_only_without_a_perf_case_reports_speed_not_checked_and_keeps_correctness(project):
    tmp, baseline = project
    assert check(tmp, "--perf", "--only", NOT_PERF) == 0
    speed = speed_findings(tmp)
    assert [(f["severity"], f["case_id"]) for f in speed] == [("INFO", "")]
    assert "speed not checked: no perf case in scope" in speed[0]["message"]
    assert any(f["rule"] != "speed" and f["case_id"] == NOT_PERF for f in findings(tmp))  # correctness was judged
    add_perf_entry(baseline, NOT_PERF)  # the baseline timed it: out of the perf cases now, it cannot pass
    assert check(tmp, "--perf", "--only", NOT_PERF) == 1
    assert [(f["severity"], f["case_id"]) for f in speed_findings(tmp)] == [("INCONCLUSIVE", NOT_PERF)] * 2


@pytest.mark.slow
def test_a_baseline_speed_ratio_the_run_has_no_case_for_is_inconclusive(project):
    tmp, baseline = project
    write_config(tmp, "cpu_regression_pct = 1000.0")  # CI noise must not decide this test
    assert check(tmp, "--perf") == 0
    add_perf_entry(baseline, "fp32-b1-h2-s48-d16")  # e.g. a perf case renamed since the baseline
    assert check(tmp, "--perf") == 1
    missing = [f for f in speed_findings(tmp) if f["severity"] == "INCONCLUSIVE"]
    assert {f["case_id"] for f in missing} == {"fp32-b1-h2-s48-d16"} and len(missing) == 2
    assert "this run has no such perf case" in missing[0]["message"]


@pytest.mark.slow
@pytest.mark.parametrize("device,gpu_class,expected", [("cuda", "h200", [("WARN", "")]), ("cpu", "cpu", [])])
def test_check_from_a_results_file_says_speed_was_not_checked_on_a_gpu_class(project, device, gpu_class, expected):
    tmp, baseline = project
    sweep_file = next((tmp / "out").glob("sweep-*.json"))
    sweep = json.loads(sweep_file.read_text())
    sweep["environment"].update(device=device, gpu_class=gpu_class)  # as if the sweep ran on that machine
    results = tmp / "results.json"
    results.write_text(json.dumps(sweep))
    data = json.loads(baseline.read_text())
    data["gpu_class"] = gpu_class
    data["environment"].update(device=device, gpu_class=gpu_class)
    (tmp / "baselines" / gpu_class).mkdir(exist_ok=True)
    (tmp / "baselines" / gpu_class / baseline.name).write_text(json.dumps(data))
    assert (
        main(["check", "--config", str(tmp / "pyproject.toml"), "--results", str(results), "--out", str(tmp / "out")])
        == 0
    )
    speed = speed_findings(tmp)
    assert [(f["severity"], f["case_id"]) for f in speed] == expected
    if expected:
        assert "speed not checked: correctness read from a results file" in speed[0]["message"]


# ---------------------------------------------------------------- a FAIL on a very short pass says so


@pytest.mark.parametrize(
    "candidate_ms,ratio,severity,noted",
    [
        (0.035, 1.06, "FAIL", True),  # the H200's s512 forward: a 35 us pass 6% slower
        (1.5, 1.06, "FAIL", False),  # the same change on a long pass: no host caveat
        (0.035, 1.0, "OK", False),  # a short pass within its threshold: nothing to say
    ],
)
def test_a_speed_fail_on_a_pass_under_100_us_names_host_drift_and_still_fails(candidate_ms, ratio, severity, noted):
    base = {A.id: baseline_entry(timed(A, candidate_ms, 1.0), ANCHOR, HOST)}
    js = judge_perf(run_of(timed(A, candidate_ms, ratio)), base, PerfConfig())
    assert [j.severity.value for j in js] == [severity] * 2, [j.message for j in js]
    assert all(("us pass: passes under 100 us also move between hosts" in j.message) is noted for j in js), js[
        0
    ].message
    assert decide(perf_findings(js)).passed is (severity == "OK")  # the note never turns a FAIL into a pass


# ---------------------------------------------------------------- speed of a results file from perf files


def planted_perf(tmp: Path, baseline: Path, ratio: float, name: str = "perf.json", **change) -> Path:
    """A perf file of the project's sweep environment whose speed ratio is `ratio` times the one
    the baseline now records (synthetic timings: the verdict, not the CPU's noise, is under test)."""
    case = perf_cases("tiny", load_config(tmp / "pyproject.toml"))[0]
    data = json.loads(baseline.read_text())
    data["perf"] = {CASE: baseline_entry(timed(case), ANCHOR, "")}
    baseline.write_text(json.dumps(data))
    return perf_file(tmp, (timed(case, ratio=ratio),), name, **change)


def perf_file(tmp: Path, cases: tuple[PerfCaseResult, ...], name: str = "perf.json", **change) -> Path:
    """A perf file of `cases` in the environment of the project's sweep (tmp/out)."""
    env = {**json.loads(next((tmp / "out").glob("sweep-*.json")).read_text())["environment"], "anchor": ANCHOR}
    result = PerfResult(
        kernel="sdpa-cpu",
        anchor=ANCHOR,
        suite="tiny",
        device="cpu",
        environment=env,
        plan=PLAN,
        cases=cases,
        started_at="",
        wall_s=0.0,
    )
    payload = result.to_dict()
    payload["environment"].update(change.pop("environment", {}))
    payload.update(change)
    path = tmp / name
    path.write_text(json.dumps(payload))
    return path


def check_file(tmp: Path, *perf: Path) -> int:
    sweep = next((tmp / "out").glob("sweep-*.json"))
    return main(
        [
            "check",
            "--config",
            str(tmp / "pyproject.toml"),
            "--results",
            str(sweep),
            "--out",
            str(tmp / "out"),
            *(["--perf-results", *map(str, perf)] if perf else []),
        ]
    )


@pytest.mark.slow
def test_perf_files_gate_the_speed_of_a_results_file(project):
    tmp, baseline = project
    assert check_file(tmp, planted_perf(tmp, baseline, 1.0)) == 0  # the same ratio within its noise
    assert [f["severity"] for f in speed_findings(tmp)] == ["OK", "OK"]
    assert check_file(tmp, planted_perf(tmp, baseline, 1.50)) == 1  # 50% slower (CPU limit 25%): not a pass
    speed = speed_findings(tmp)
    assert [(f["case_id"], f["severity"]) for f in speed] == [(CASE, "INCONCLUSIVE")] * 2, speed
    assert all(
        " +50.0% [+" in f["message"]
        and "slower, the whole interval above the 25% limit" in f["message"]
        and "read from a perf file, so not re-measured" in f["message"]
        for f in speed
    )
    assert "timings from 1 perf file" in (tmp / "out" / "check-sdpa-cpu-tiny.md").read_text()
    assert check_file(tmp) == 0  # without perf files: today's results-file check (no speed on a CPU)
    assert not speed_findings(tmp)


@pytest.mark.slow
@pytest.mark.parametrize(
    "change,words",
    [
        ({"suite": "other"}, "timings of suite 'other'"),
        ({"kernel": "tiled"}, "timings of kernel 'tiled'"),
        ({"environment": {"gpu_class": "h200"}}, "timings of GPU class 'h200'"),
        ({"environment": {"torch": "0.0.1"}}, "timed with torch='0.0.1'"),
    ],
)
def test_perf_files_of_another_run_are_refused_in_one_line(project, capsys, change, words):
    tmp, baseline = project
    assert check_file(tmp, planted_perf(tmp, baseline, 1.0, **change)) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1, err


@pytest.mark.slow
def test_perf_files_merge_and_refuse_a_case_twice(project, capsys):
    tmp, baseline = project
    one, two = planted_perf(tmp, baseline, 1.0, "a.json"), planted_perf(tmp, baseline, 1.0, "b.json")
    assert check_file(tmp, one, two) == 2
    assert f"case {CASE} is in" in capsys.readouterr().err
    other = planted_perf(tmp, baseline, 1.0, "c.json", environment={"driver": "1.2"})
    assert check_file(tmp, one, other) == 2
    assert "ran with driver='1.2'" in capsys.readouterr().err


def test_perf_results_need_a_results_file(tmp_path, capsys):
    cfg = write_config(tmp_path)
    assert (
        main(
            [
                "check",
                "--device",
                "cpu",
                "--config",
                str(cfg),
                "--perf-results",
                str(tmp_path / "p.json"),
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 2
    )
    assert "pass --results too" in capsys.readouterr().err


# ---------------------------------------------------------------- a noisy speed section


def _section(noise: float) -> dict:
    entry = baseline_entry(measured(A), ANCHOR, HOST)
    return {A.id: {**entry, "bwd": {**entry["bwd"], "noise": noise}}}


def test_a_speed_section_noisier_than_max_noise_pct_is_refused_in_one_line():
    cfg = PerfConfig()  # noise_k 3, max_noise_pct 5
    with pytest.raises(UserError) as err:
        refuse_noisy(_section(0.071), cfg, accept_noisy=False, where="baseline update --perf", device="cuda")
    msg = str(err.value)
    assert "\n" not in msg and f"{A.id} bwd has noise 21.3%" in msg and "max_noise_pct 5%" in msg
    assert "--accept-noisy" in msg and "nothing written" in msg
    quiet = _section(0.01)  # a 3% band: recorded as it is
    assert refuse_noisy(quiet, cfg, accept_noisy=False, where="x", device="cuda") == quiet
    assert "noisy" not in json.dumps(quiet)


def test_accept_noisy_records_the_noisy_passes_marked_and_check_says_so():
    marked = refuse_noisy(_section(0.071), PerfConfig(), accept_noisy=True, where="x", device="cuda")
    assert marked[A.id]["bwd"]["noisy"] is True and "noisy" not in marked[A.id]["fwd"]
    js = judge_perf(run_of(measured(A)), marked, PerfConfig())
    notes = {j.pass_: "recorded as noisy" in j.message for j in js}
    assert notes == {"fwd": False, "bwd": True}, [j.message for j in js]


# The 30 per-round ratios of an H100 decode step (FA4 against cuDNN) whose anchor ran slow for a
# stretch of rounds: two levels, 0.54-0.86 and 0.94, with a small noise band (1.6% x 3); held here as a bwd pass.
TWO_LEVELS = [0.54, 0.567, 0.583, 0.585, 0.609, 0.627, 0.645, 0.649, 0.651, 0.656, 0.662, 0.665, 0.715, 0.859]
TWO_LEVELS += [0.938, 0.938, 0.942, 0.943, 0.943, 0.944, 0.945, 0.945, 0.945, 0.946, 0.947, 0.947, 0.947]
TWO_LEVELS += [0.949, 0.949, 1.124]


def _bwd_rounds(samples: list[float]) -> dict:
    entry = baseline_entry(measured(A), ANCHOR, HOST)
    median = sorted(samples)[len(samples) // 2]
    return {A.id: {**entry, "bwd": {"median": median, "noise": 0.0162, "n": len(samples), "samples": samples}}}


def test_a_pass_that_cannot_pass_against_itself_is_refused_where_its_limit_is_tight():
    cfg = PerfConfig()  # regression_pct 2 on a GPU, cpu_regression_pct 25
    split = _bwd_rounds(TWO_LEVELS)
    est = RatioEstimate.from_dict(split[A.id]["bwd"])
    # why: an unchanged kernel judged against these rounds straddles the 2% limit (fails closed)
    same = judge(A.id, "bwd", est, est, PerfRules.from_config(cfg, "cuda"))
    assert same.severity is PerfSeverity.INCONCLUSIVE and same.ci_high > 0.02
    assert noisy_passes(split, cfg) == []  # its noise band (4.9%) is within max_noise_pct
    with pytest.raises(UserError) as err:
        refuse_noisy(split, cfg, accept_noisy=False, where="--perf-from p.json", device="cuda")
    msg = str(err.value)
    assert "\n" not in msg and f"speed of {A.id} bwd cannot pass against itself" in msg, msg
    assert "2% regression limit" in msg and "--accept-noisy" in msg and "nothing written" in msg
    # the same rounds under a CPU's 25% limit, and rounds without the slow stretch: recorded as they are
    assert refuse_noisy(split, cfg, accept_noisy=False, where="x", device="cpu") == split
    steady = _bwd_rounds(TWO_LEVELS[14:] + TWO_LEVELS[15:29])
    assert refuse_noisy(steady, cfg, accept_noisy=False, where="x", device="cuda") == steady
    # fewer than min_rounds (7): no check passes them either, however steady
    few = _bwd_rounds(TWO_LEVELS[14:20])
    with pytest.raises(UserError, match=r"cannot pass against itself: judged against itself, too few rounds \(6 now"):
        refuse_noisy(few, cfg, accept_noisy=False, where="x", device="cuda")
    marked = refuse_noisy(split, cfg, accept_noisy=True, where="x", device="cuda")
    assert marked[A.id]["bwd"]["noisy"] is True and "noisy" not in marked[A.id]["fwd"]
    note = judge(A.id, "bwd", RatioEstimate.from_dict(marked[A.id]["bwd"]), est, PerfRules()).message
    assert "recorded as noisy" in note and "against themselves" in note, note


@pytest.mark.slow
def test_baseline_update_perf_refuses_a_noisy_section_and_writes_nothing(project, capsys):
    tmp, baseline = project
    before = baseline.read_text()
    write_config(tmp, "max_noise_pct = 0.000001")  # any real timing is noisier than this
    cfg = str(tmp / "pyproject.toml")
    capsys.readouterr()
    assert (
        main(
            [
                "baseline",
                "update",
                "--device",
                "cpu",
                "--perf",
                "--config",
                cfg,
                "--no-progress",
                "--out",
                str(tmp / "out"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"speed of {CASE}" in err and "max_noise_pct 1e-06%" in err and "--accept-noisy" in err, err
    assert baseline.read_text() == before
    assert (
        main(
            [
                "baseline",
                "update",
                "--device",
                "cpu",
                "--perf",
                "--accept-noisy",
                "--config",
                cfg,
                "--no-progress",
                "--out",
                str(tmp / "out"),
            ]
        )
        == 0
    )
    perf = json.loads(baseline.read_text())["perf"][CASE]
    assert perf["fwd"]["noisy"] is True and perf["bwd"]["noisy"] is True
    check(tmp, "--perf")
    assert all("recorded as noisy" in f["message"] for f in speed_findings(tmp))


def test_accept_noisy_without_speed_timing_is_a_usage_error(tmp_path, capsys):
    cfg = write_config(tmp_path)
    assert (
        main(
            [
                "baseline",
                "update",
                "--device",
                "cpu",
                "--no-perf",
                "--accept-noisy",
                "--config",
                str(cfg),
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 2
    )
    assert "--accept-noisy" in capsys.readouterr().err
    assert not (tmp_path / "baselines").exists()


def test_repeated_work_gives_the_same_values_and_runs_the_backward_n_times():
    """The CPU benchmark's planted 3x slower kernel: the same output and gradients, 3x the work."""
    import torch

    from gate.kernels.registry import get_adapter
    from gate.speed.planted import RepeatedKernel
    from gate.speed.timing import KernelWorkload

    inner = get_adapter("sdpa-math")
    plain, slowed = KernelWorkload(inner, A, "cpu"), KernelWorkload(RepeatedKernel(inner, 3), A, "cpu")
    for w in (plain, slowed):
        w.prepare()
    assert torch.equal(plain.run("fwd"), slowed.run("fwd"))
    assert all(torch.equal(a, b) for a, b in zip(plain.run("bwd"), slowed.run("bwd")))

    def backward_nodes(w):
        return sum(1 for n in _graph(w._out.grad_fn) if "Attention" in type(n).__name__ or "Bmm" in type(n).__name__)

    assert backward_nodes(slowed) == 3 * backward_nodes(plain) > 0
    with pytest.raises(ValueError):
        RepeatedKernel(inner, 0)


def _graph(node, seen=None):
    """Every autograd node reachable from `node`."""
    seen = set() if seen is None else seen
    if node is None or node in seen:
        return seen
    seen.add(node)
    for nxt, _ in node.next_functions:
        _graph(nxt, seen)
    return seen


KNOWN_ERROR = """
[[tool.attn-gate.known_failures]]
kernel = "sdpa-cpu"
cases = '^fp32-b1-h2-s48-d16$'
tensors = ["error"]
reason = "raises at 48 tokens"
link = "https://example.org/issues/1"
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "declared, swept_raises, code, severity",
    [
        (True, True, 0, "KNOWN"),  # raised when swept and when timed, under its declaration
        (False, True, 1, "INCONCLUSIVE"),  # nothing declared: the sweep's ERROR fails too
        (True, False, 1, "INCONCLUSIVE"),  # the sweep ran it: its timing's error is not the declared bug
    ],
)
def test_a_timing_case_that_raises_under_its_declared_error_is_known(tmp_path, declared, swept_raises, code, severity):
    """`check --results --perf-results` (the GPU runs' path): of two timing cases one is timed, the
    other raised; its passes are KNOWN only where its swept row raised too and is declared."""
    config = CONFIG.replace('seqlens = ["32"]', 'seqlens = ["32", "48"]').replace("{extra}", "")
    (tmp_path / "pyproject.toml").write_text(config + (KNOWN_ERROR if declared else ""))
    out = ["--config", str(tmp_path / "pyproject.toml"), "--out", str(tmp_path / "out"), "--no-progress"]
    assert main(["baseline", "update", "--device", "cpu", *out]) == 0
    baseline = tmp_path / "baselines" / "cpu" / "sdpa-cpu-tiny.json"
    sweep_path = tmp_path / "out" / "sweep-sdpa-cpu-tiny.json"
    ok, raises = perf_cases("tiny", load_config(tmp_path / "pyproject.toml"))
    assert raises.id == "fp32-b1-h2-s48-d16"
    data = json.loads(baseline.read_text())
    data["perf"] = {ok.id: baseline_entry(timed(ok), ANCHOR, "")}
    baseline.write_text(json.dumps(data))
    sweep = json.loads(sweep_path.read_text())
    if swept_raises:
        row = next(c for c in sweep["cases"] if c["case_id"] == raises.id)
        row.update(status="ERROR", reason="RuntimeError: raises at 48 tokens", tensors={})
        sweep_path.write_text(json.dumps(sweep))
    raised = PerfCaseResult(case=raises, status="ERROR", reason="RuntimeError: raises at 48 tokens")
    perf = perf_file(tmp_path, (timed(ok), raised))
    check = ["check", "--results", str(sweep_path), "--perf-results", str(perf)]
    assert main([*check, *out[:4]]) == code
    speed = {(f["case_id"], f["metric"]): f["severity"] for f in speed_findings(tmp_path)}
    assert speed == {
        (ok.id, "speed_ratio:fwd"): "OK",
        (ok.id, "speed_ratio:bwd"): "OK",
        (raises.id, "speed_ratio:fwd"): severity,
        (raises.id, "speed_ratio:bwd"): severity,
    }


LONG = A.with_fields(batch=6, seqlen_q=4096, seqlen_k=4096, heads_q=16, heads_kv=16, head_dim=128, head_dim_v=128)


REASON = "RuntimeError: CUDA error: an illegal memory access was encountered"


@pytest.mark.parametrize("width", [40, 60, 80, 100, 200])
@pytest.mark.parametrize("long_ids", [False, True])
def test_the_perf_table_keeps_every_number_whole_at_the_terminals_width(width, long_ids):
    """Columns a terminal cannot hold leave, named in a note, before any number is cut; then the
    interval wraps at its comma and a long case id folds; an ERROR row's reason wraps at words.
    Only a terminal too narrow for even that crops the table's right side, never a number in it."""
    from rich.console import Console

    from gate.report.speed_report import HEADER, OPTIONAL, perf_rows, print_perf_table

    first = LONG.with_fields(causal=True, window=(2048, 0), layout="k_sliced", inputs="outliers") if long_ids else A
    crash = PerfCaseResult(case=A.with_fields(batch=3), status="ERROR", reason=REASON)
    result = run_of(timed(first, 3.0261, 0.8471), timed(B, 12.5, 1.1678), crash)
    console = Console(width=width, record=True, file=io.StringIO())
    print_perf_table(result, console)
    lines = console.export_text().splitlines()
    assert max(map(len, lines)) <= width
    table = [ln for ln in lines if ln[:1] in "┏┃┡│└"]
    cropped = width < 64
    assert table and all(ln[-1] in "┓┃┩│┘" for ln in table) != cropped, "\n".join(lines)
    tokens = set(" ".join(table).replace("│", " ").split())
    ratios = {r[4] for r in perf_rows(result) if r[2]}
    assert ratios <= tokens, "\n".join(lines)  # the speed ratio is whole at every width
    if cropped:
        return
    header = " ".join(ln for ln in table if ln[0] == "┃")
    shown = [h for h in HEADER if all(w in header.split() for w in h.split())]
    at = next((i for i, ln in enumerate(lines) if " columns leave out " in ln), len(lines))
    note = " ".join(ln.strip() for ln in lines[at : at + 3])
    left_out = [h for h in HEADER if h not in shown]
    assert left_out == [h for h in reversed(OPTIONAL) if h in left_out] and "speed ratio" in shown, shown
    assert (note.split(" columns leave out ")[-1] if left_out else "") == (
        f"{', '.join(left_out)} (a wider terminal shows them)" if left_out else ""
    ), note
    for row in perf_rows(result)[:4]:  # the measured rows: their numbers are whole tokens
        for i, name in enumerate(HEADER[1:-1], 1):
            if name in shown:
                assert set(row[i].split()) <= tokens, (name, row[i], "\n".join(lines))
    assert set(REASON.split()) <= tokens, "\n".join(lines)  # the reason wraps at words
    assert (first.id in tokens) == (width == 200 or not long_ids)
