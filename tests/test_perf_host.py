"""The speed limit across hosts: a baseline's speed ratio timed on another host (or an unknown
one) is judged against max(the device's limit, cross_host_regression_pct); on the same host the
device's limit stands. Synthetic per-round ratios: no timing."""

from __future__ import annotations

import json

import pytest

from gate.commands.main import main
from gate.compare.baselines import read_baseline
from gate.core.config import PerfConfig
from gate.core.environment import HOST_DIGITS, host_digest
from gate.speed.entries import checked_baseline_perf, entry_host
from gate.speed.rule import HostMatch, PerfRules, PerfSeverity, RatioEstimate, judge
from gate.speed.runs import baseline_entry, judge_perf
from tests.test_perf_check import ANCHOR, A, run_of, timed

HERE, THERE = "0123456789ab", "ba9876543210"
RULES = PerfRules.from_config(PerfConfig(), "cuda")  # regression_pct 2, cross_host_regression_pct 8
CROSS_NOTE = (
    "limit 8%; re-record the speed section on this runner (`attn-gate baseline update --perf`) for the 2% limit"
)


def rounds(center: float, jitter: float = 0.002, n: int = 15) -> RatioEstimate:
    """n deterministic per-round ratios spread evenly over center * (1 +- jitter)."""
    return RatioEstimate.from_samples([center * (1 + jitter * (((i * 7) % n) / (n - 1) * 2 - 1)) for i in range(n)])


def judged(baseline_host: str, run_host: str, change: float):
    return judge("c", "fwd", rounds(1.0), rounds(1.0 + change), RULES.across_hosts(baseline_host, run_host))


@pytest.mark.parametrize(
    "baseline_host, run_host, change, severity, limit, note",
    [
        pytest.param(HERE, HERE, 0.03, PerfSeverity.FAIL, 0.02, "", id="same-host-3pct-fails"),
        pytest.param(HERE, HERE, 0.01, PerfSeverity.OK, 0.02, "", id="same-host-1pct-passes"),
        pytest.param(THERE, HERE, 0.03, PerfSeverity.OK, 0.08, "baseline timed on another host", id="other-3pct"),
        pytest.param(THERE, HERE, 0.10, PerfSeverity.FAIL, 0.08, "baseline timed on another host", id="other-10pct"),
        pytest.param("", HERE, 0.03, PerfSeverity.OK, 0.08, "baseline's host unknown", id="old-baseline-3pct"),
        pytest.param("", HERE, 0.10, PerfSeverity.FAIL, 0.08, "baseline's host unknown", id="old-baseline-10pct"),
        pytest.param(HERE, "", 0.03, PerfSeverity.OK, 0.08, "baseline's host unknown", id="run-host-unknown"),
        pytest.param("", "", 0.03, PerfSeverity.OK, 0.08, "baseline's host unknown", id="both-unknown"),
    ],
)
def test_the_limit_widens_only_across_hosts(baseline_host, run_host, change, severity, limit, note):
    j = judged(baseline_host, run_host, change)
    assert j.severity is severity and j.threshold == pytest.approx(limit), (j.severity, j.threshold, j.message)
    if note:
        assert f"{note}: {CROSS_NOTE}" in j.message, j.message
    else:
        assert "host" not in j.message, j.message


def test_a_cross_host_fail_is_confirmed_with_the_cross_host_limit_and_keeps_its_note():
    here = RULES.across_hosts(THERE, HERE)
    j = judge("c", "fwd", rounds(1.0), rounds(1.10), here, confirm=rounds(1.10, n=30))
    assert j.severity is PerfSeverity.FAIL and j.confirmed, j.message
    assert "above the 8% limit" in j.message and CROSS_NOTE in j.message, j.message
    j = judge("c", "fwd", rounds(1.0), rounds(1.10), here, confirm=rounds(1.03, n=30))  # the re-run says +3%
    assert j.severity is PerfSeverity.OK and CROSS_NOTE in j.message, j.message


def test_a_cpu_limit_above_the_cross_host_one_stays_and_says_nothing_of_hosts():
    cpu = PerfRules.from_config(PerfConfig(), "cpu").across_hosts(THERE, HERE)
    assert cpu.limit_pct == 25.0
    j = judge("c", "fwd", rounds(1.0), rounds(1.10), cpu)
    assert j.severity is PerfSeverity.OK and "host" not in j.message, j.message


def test_host_match_needs_both_hosts_known_and_equal():
    assert HostMatch.of(HERE, HERE) is HostMatch.SAME
    assert HostMatch.of(THERE, HERE) is HostMatch.OTHER
    assert HostMatch.of("", HERE) is HostMatch.UNKNOWN and HostMatch.of(HERE, "") is HostMatch.UNKNOWN
    assert HostMatch.of("", "") is HostMatch.UNKNOWN  # two unknowns are not one host


def test_judge_perf_reads_each_rows_host_against_the_runs():
    """One row timed here, one elsewhere, one from before hosts were recorded: +3% passes only
    where the host differs or is unknown."""
    slower = timed(A, ratio=1.03)
    entry = baseline_entry(timed(A), ANCHOR, HERE)
    for host, severity in ((HERE, "FAIL"), (THERE, "OK"), (None, "OK")):
        row = {k: v for k, v in entry.items() if k != "host"} if host is None else {**entry, "host": host}
        js = judge_perf(run_of(slower), {A.id: row}, PerfConfig())  # run_of: the run's host is HERE
        assert [j.severity.value for j in js] == [severity] * 2, (host, [j.message for j in js])


def test_the_host_digest_is_short_hex_and_keeps_no_serial():
    uuid = "GPU-5e8a1c0b-2f4d-4c1e-9a7b-1234567890ab"
    digest = host_digest(uuid)
    assert len(digest) == HOST_DIGITS and set(digest) <= set("0123456789abcdef") and digest not in uuid.lower()
    assert host_digest(uuid.removeprefix("GPU-").upper()) == digest  # torch and NVML spell one UUID alike
    assert host_digest("other-machine") != digest and host_digest("  ") == ""


def _perf_section(host) -> dict:
    entry = baseline_entry(timed(A), ANCHOR, HERE)
    return {A.id: {k: v for k, v in entry.items() if k != "host"} if host is None else {**entry, "host": host}}


@pytest.mark.parametrize("host", [HERE, "", None], ids=["digest", "unknown", "absent"])
def test_a_speed_row_with_a_digest_or_without_a_host_reads(host):
    section = checked_baseline_perf(_perf_section(host))
    assert entry_host(section[A.id]) == (host or "")


@pytest.mark.parametrize(
    "host", ["GPU-5e8a1c0b-2f4d", "ABCDEF", 12, "a" * 65], ids=["raw-uuid", "upper", "int", "long"]
)
def test_a_speed_row_with_a_raw_or_odd_host_is_refused(host):
    with pytest.raises(ValueError, match=r"perf\[.*\]\.host"):
        checked_baseline_perf(_perf_section(host))


def test_a_schema_3_baseline_without_hosts_reads_as_host_unknown(tmp_path):
    """A baseline written before hosts were recorded: read (migrated to version 4), its rows'
    host unknown, so the cross-host limit applies until `baseline update --perf` re-records it."""
    from tests.test_baselines import GOOD_TEXT

    data = json.loads(GOOD_TEXT)
    data["schema_version"] = 3
    data["perf"] = _perf_section(None)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    old = read_baseline(path)
    assert old.schema_version == 4 and entry_host(old.perf[A.id]) == ""
    js = judge_perf(run_of(timed(A, ratio=1.03)), old.perf, PerfConfig())
    assert [j.severity.value for j in js] == ["OK"] * 2 and all("host unknown" in j.message for j in js)


@pytest.mark.parametrize("value", ["0", "-1", "101", "nan", "inf", '"8"'])
def test_a_bad_cross_host_limit_exits_2_naming_the_key(tmp_path, capsys, value):
    config = tmp_path / "pyproject.toml"
    config.write_text(f"[tool.attn-gate.perf]\ncross_host_regression_pct = {value}\n")
    assert main(["suites", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "cross_host_regression_pct" in err and str(config) in err, err


def test_perf_files_timed_on_several_hosts_merge_with_the_host_unknown(tmp_path):
    """One perf file per GPU job: the rows of two hosts cannot be judged by one host's limit."""
    import dataclasses

    from gate.workflow.speed_check import read_perf_files
    from tests.test_perf_check import B

    paths = []
    for name, case, host in (("a.json", A, HERE), ("b.json", B, THERE), ("c.json", B, HERE)):
        run = run_of(timed(case))
        dataclasses.replace(run, environment={**run.environment, "host": host}).write(tmp_path / name)
        paths.append(tmp_path / name)
    assert read_perf_files(paths[:2]).host == ""
    assert read_perf_files([paths[0], paths[2]]).host == HERE  # one host: kept


def test_the_reports_rule_sentence_names_the_cross_host_limit_only_where_it_widens():
    from gate.report.speed_report import rule_sentence

    assert "+8% where the baseline's ratio was timed on another host" in rule_sentence(PerfConfig(), "cuda")
    assert "another host" not in rule_sentence(PerfConfig(), "cpu")  # 25% already covers it
