"""Speed joined with correctness in `attn-gate check` / `baseline update`, on a tiny CPU case.
A doctored baseline must FAIL the speed rule; a lax one must pass; nothing asserts a speed."""

import json
from pathlib import Path

import pytest

from gate.cli import main

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
"""
CASE = "fp32-b1-h2-s32-d16"


def write_config(tmp: Path, extra: str = "") -> Path:
    path = tmp / "pyproject.toml"
    path.write_text(CONFIG.replace("{extra}", extra))
    return path


@pytest.fixture()
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = write_config(tmp_path)
    assert main(["baseline", "update", "--device", "cpu", "--perf", "--config", str(cfg), "--no-progress",
                 "--out", str(tmp_path / "out")]) == 0
    baseline = tmp_path / "baselines" / "cpu" / "sdpa-cpu-tiny.json"
    return tmp_path, baseline


def findings(tmp: Path) -> list[dict]:
    return json.loads((tmp / "out" / "findings-sdpa-cpu-tiny.json").read_text())["findings"]


def check(tmp: Path, *extra: str) -> int:
    return main(["check", "--device", "cpu", "--config", str(tmp / "pyproject.toml"), "--no-progress",
                 "--out", str(tmp / "out"), *extra])


def doctor(baseline: Path, factor: float) -> None:
    """Pretend the baseline was `factor` times the speed ratio it recorded, with no noise."""
    data = json.loads(baseline.read_text())
    for entry in data["perf"].values():
        for p in ("fwd", "bwd"):
            m = entry[p]["median"] * factor
            entry[p].update(median=m, noise=0.0, samples=[m] * entry[p]["n"])
    baseline.write_text(json.dumps(data))


def test_baseline_update_records_speed_ratios_with_noise(project):
    _, baseline = project
    perf = json.loads(baseline.read_text())["perf"]
    entry = perf[CASE]
    assert entry["anchor"] == "sdpa-math"
    for p in ("fwd", "bwd"):
        assert entry[p]["n"] == 7 and len(entry[p]["samples"]) == 7 and entry[p]["median"] > 0 and entry[p]["noise"] >= 0


def test_check_joins_speed_findings_into_one_report(project):
    tmp, _ = project
    check(tmp, "--perf")
    speed = [f for f in findings(tmp) if f["rule"] == "speed"]
    assert {f["metric"] for f in speed} == {"speed_ratio:fwd", "speed_ratio:bwd"}
    assert (tmp / "out" / "speed-sdpa-cpu-tiny.png").is_file()
    assert (tmp / "out" / "perf-sdpa-cpu-tiny.json").is_file()
    assert "### Speed" in (tmp / "out" / "check-sdpa-cpu-tiny.md").read_text()


def test_a_far_slower_kernel_fails_and_a_lax_threshold_passes(project):
    tmp, baseline = project
    write_config(tmp, "max_noise_pct = 100000.0")  # CI noise must not turn the planted case inconclusive
    doctor(baseline, 0.2)  # the baseline says the kernel was 5x faster relative to its anchor
    assert check(tmp, "--perf") == 1
    speed = [f for f in findings(tmp) if f["rule"] == "speed"]
    assert speed and all(f["severity"] == "FAIL" for f in speed), speed
    assert all("confirmed by a re-run" in f["message"] for f in speed)
    write_config(tmp, "max_noise_pct = 100000.0\nregression_pct = 100000.0")
    doctor(baseline, 1.0)
    assert check(tmp, "--perf") == 0
    assert all(f["severity"] in ("OK", "WARN") for f in findings(tmp) if f["rule"] == "speed")


def test_no_speed_section_is_inconclusive_not_pass(project):
    tmp, baseline = project
    data = json.loads(baseline.read_text())
    data["perf"] = None
    baseline.write_text(json.dumps(data))
    assert check(tmp, "--perf") == 1
    speed = [f for f in findings(tmp) if f["rule"] == "speed"]
    assert speed and all(f["severity"] == "INCONCLUSIVE" for f in speed)
    assert "baseline update --perf" in speed[0]["message"]


def test_speed_is_off_by_default_on_a_cpu(project):
    tmp, _ = project
    assert check(tmp) == 0
    assert not [f for f in findings(tmp) if f["rule"] == "speed"]


def test_perf_with_a_results_file_is_a_usage_error(project, capsys):
    tmp, _ = project
    results = next((tmp / "out").glob("sweep-*.json"))
    assert check(tmp, "--perf", "--results", str(results)) == 2
    assert "--perf times the kernel now" in capsys.readouterr().err


def test_speed_section_from_a_perf_file_made_elsewhere(project):
    tmp, baseline = project
    cfg = str(tmp / "pyproject.toml")
    assert main(["perf", "--device", "cpu", "--config", cfg, "--out", str(tmp / "perf")]) == 0
    perf_file = tmp / "perf" / "perf-sdpa-cpu-tiny.json"
    data = json.loads(baseline.read_text())
    data["perf"] = None
    baseline.write_text(json.dumps(data))
    sweep = next((tmp / "out").glob("sweep-*.json"))
    assert main(["baseline", "update", "--device", "cpu", "--config", cfg, "--from-results", str(sweep),
                 "--perf-from", str(perf_file), "--out", str(tmp / "out")]) == 0
    entry = json.loads(baseline.read_text())["perf"][CASE]
    assert entry["fwd"]["n"] == 7 and entry["bwd"]["median"] > 0
    other = json.loads(perf_file.read_text())
    other["kernel"] = "tiled"
    perf_file.write_text(json.dumps(other))
    assert main(["baseline", "update", "--device", "cpu", "--config", cfg, "--from-results", str(sweep),
                 "--perf-from", str(perf_file), "--out", str(tmp / "out")]) == 2  # another kernel's timings: refused
