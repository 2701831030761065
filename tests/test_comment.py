"""The PR comment, worst first, rendered from real runs: a planted causal-mask bug (a user
kernel whose causal diagonal is off by one), a crashing kernel, and the committed H200 run with
speed. Each test reads the comment as a reviewer would and checks what they need is there."""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import re
import shlex
from pathlib import Path

import pytest

from gate.commands.main import main
from gate.compare.baselines import read_baseline
from gate.compare.diagnosis import diagnose
from gate.compare.findings import Finding, Severity, Subject, advised, decide
from gate.core.results import Status, SweepResult
from gate.report.comment import COMMENT_LIMIT, Links, pr_comment

ROOT = Path(__file__).resolve().parent.parent
# recorded on CI's machines: read here only with a sweep recorded there too (tests/data)
CPU_BASELINE = ROOT / "baselines" / "cpu" / "sdpa-cpu-smoke.json"
# Real runs, gzipped: an H200 `check --perf` of sdpa-flash on pr and the baseline it was checked against
# (baselines/h200/sdpa-flash-pr.json of that time), and a CPU sweep of sdpa-cpu on smoke (tests/data/README.md names their commits).
DATA = ROOT / "tests" / "data"


def _unzipped(name: str, tmp: Path) -> Path:
    out = tmp / name.removesuffix(".gz")
    out.write_bytes(gzip.decompress((DATA / name).read_bytes()))
    return out


BUG = "tests.buggy_kernels:causal_off_by_one"
BUG_STEM = "tests.buggy_kernels_causal_off_by_one-smoke"


@pytest.fixture(scope="module")
def causal_bug(cpu_baseline, tmp_path_factory):
    out = tmp_path_factory.mktemp("bug")
    with pytest.MonkeyPatch.context() as mp, contextlib.chdir(ROOT):
        mp.delenv("GITHUB_STEP_SUMMARY", raising=False)
        for key, value in {
            "GITHUB_SERVER_URL": "https://github.com",
            "GITHUB_REPOSITORY": "acme/attn",
            "GITHUB_RUN_ID": "42",
            "ATTN_GATE_ASV_URL": "https://acme.github.io/attn",
        }.items():
            mp.setenv(key, value)
        rc = main(
            [
                "check",
                "--kernel",
                BUG,
                "--device",
                "cpu",
                "--baseline",
                str(cpu_baseline.path),
                "--no-progress",
                "--out",
                str(out),
            ]
        )
    return rc, out


def _failing_case_ids(out: Path) -> set[str]:
    """The cases with a FAIL finding (tolerance violations and crashes alike), from the findings JSON."""
    findings = json.loads((out / f"findings-{BUG_STEM}.json").read_text())["findings"]
    return {f["case_id"] for f in findings if f["severity"] == "FAIL" and f["case_id"]}


def _top(comment: str) -> str:
    """What is shown unfolded: everything before the first <details>."""
    return comment.split("<details>", 1)[0]


@pytest.mark.slow
@pytest.mark.xdist_group("comment")
def test_the_worst_case_leads_the_first_table(causal_bug):
    rc, out = causal_bug
    assert rc == 1
    comment = (out / f"comment-{BUG_STEM}.md").read_text()
    assert comment == (out / f"check-{BUG_STEM}.md").read_text()
    sweep = SweepResult.read(out / f"sweep-{BUG_STEM}.json")
    worst = max((c for c in sweep.cases if c.tensors), key=lambda c: c.worst_ratio)
    top = _top(comment)
    assert top.splitlines()[2] == "> [!CAUTION]"
    verdict = top.splitlines()[3]
    failing = _failing_case_ids(out)
    assert len(failing) >= 10  # the off-by-one diagonal fails every causal/windowed case of smoke
    assert (
        f"correctness **FAIL** in {len(failing)} of {len(sweep.cases)} cases" in verdict
        and "speed not timed" in verdict
    )
    assert f"`{worst.case_id}`" in verdict
    table = top.split("### Worst findings", 1)[1].strip().splitlines()
    assert table[0].startswith("|  | case | what | baseline | now | change | limit |")
    assert f"`{worst.case_id}`" in table[2]  # the first data row
    ratios = [float(re.sub(r"[ ,x]", "", row.split(" | ")[4])) for row in table[2:] if row.startswith("| FAIL")]
    cases_in_rows = [row.split(" | ")[1] for row in table[2:] if row.startswith("| ")]
    assert ratios and ratios == sorted(ratios, reverse=True)  # worst first
    assert len(cases_in_rows) == len(set(cases_in_rows))  # one row per case
    assert len(comment) < COMMENT_LIMIT


@pytest.mark.slow
@pytest.mark.xdist_group("comment")
def test_the_pattern_line_names_causal(causal_bug):
    comment = (causal_bug[1] / f"comment-{BUG_STEM}.md").read_text()
    line = next(line for line in comment.splitlines() if line.startswith("**What the failing cases share:**"))
    n_failing = len(_failing_case_ids(causal_bug[1]))
    assert "causal" in line and f"{n_failing} failing cases" in line


@pytest.mark.slow
@pytest.mark.xdist_group("comment")
def test_a_fail_never_advises_refreshing_the_baseline(causal_bug):
    out = causal_bug[1]
    findings = json.loads((out / f"findings-{BUG_STEM}.json").read_text())["findings"]
    assert not [
        f
        for f in findings
        if f["severity"] in ("WARN", "FAIL", "INCONCLUSIVE") and "refresh the baseline" in f["message"]
    ]
    assert "refresh" not in _top((out / f"comment-{BUG_STEM}.md").read_text())


@pytest.mark.slow
@pytest.mark.xdist_group("comment")
def test_links_to_artifacts_and_the_baseline_commit(cpu_baseline, causal_bug):
    top = _top((causal_bug[1] / f"comment-{BUG_STEM}.md").read_text())
    assert "https://github.com/acme/attn/actions/runs/42#artifacts" in top
    assert "https://acme.github.io/attn/" in top
    commit = read_baseline(cpu_baseline.path).commit  # the commit the judged baseline was measured at
    assert (f"`{commit[:12]}`" if commit else "commit unknown") in top
    assert (
        Links(repository="https://github.com/acme/attn").commit("0123456789abcdef")
        == "[`0123456789ab`](https://github.com/acme/attn/commit/0123456789abcdef)"
    )


def test_a_baseline_joined_from_two_runs_links_both_commits():
    links = Links(repository="https://github.com/acme/attn")
    shown = links.commit(f"{'a' * 40}+dirty (454 cases); {'b' * 40} (5 cases)")
    assert shown == (
        f"[`{'a' * 12}`](https://github.com/acme/attn/commit/{'a' * 40}) (with uncommitted changes) (454 cases); "
        f"[`{'b' * 12}`](https://github.com/acme/attn/commit/{'b' * 40}) (5 cases)"
    )
    assert links.commit("not a sha") == "`not a sha`"  # shown, never a broken link


@pytest.mark.slow
@pytest.mark.xdist_group("comment")
def test_the_rerun_command_reproduces_exactly_the_failing_cases(causal_bug, tmp_path, capsys):
    out = causal_bug[1]
    comment = (out / f"comment-{BUG_STEM}.md").read_text()
    command = comment.split("```sh\n", 1)[1].split("\n```", 1)[0]
    argv = shlex.split(command)
    assert argv[:2] == ["attn-gate", "check"]
    failing = {
        f["case_id"]
        for f in json.loads((out / f"findings-{BUG_STEM}.json").read_text())["findings"]
        if f["severity"] == "FAIL" and f["case_id"]
    }
    rerun = tmp_path / "rerun"
    with contextlib.chdir(ROOT):
        assert main(argv[1:] + ["--no-progress", "--out", str(rerun)]) == 1
    capsys.readouterr()
    again = SweepResult.read(rerun / f"sweep-{BUG_STEM}.json")
    assert {c.case_id for c in again.cases} == failing
    assert all(c.status is Status.FAIL for c in again.cases)


@pytest.mark.slow
def test_identical_errors_are_grouped_with_their_traceback(cpu_baseline, tmp_path, capsys):
    with contextlib.chdir(ROOT):
        assert (
            main(
                [
                    "check",
                    "--kernel",
                    "tests.buggy_kernels:raises",
                    "--device",
                    "cpu",
                    "--baseline",
                    str(cpu_baseline.path),
                    "--only",
                    # six cases: each ERROR row costs a fresh worker (a torch import); the grouping needs more than three
                    "^bf16-b2-h4-s(1|97x257|128)-d64",
                    "--no-progress",
                    "--out",
                    str(tmp_path),
                ]
            )
            == 1
        )
    capsys.readouterr()
    comment = (tmp_path / "comment-tests.buggy_kernels_raises-smoke.md").read_text()
    sweep = SweepResult.read(tmp_path / "sweep-tests.buggy_kernels_raises-smoke.json")
    errors = [c for c in sweep.cases if c.status is Status.ERROR]
    assert len(errors) > 3 and all("Traceback" in c.traceback and "buggy_kernels.py" in c.traceback for c in errors)
    top = _top(comment)
    assert top.count("raised** `") == 1 and f"**{len(errors)} cases raised**" in top
    assert "```text\nTraceback" in top or "buggy_kernels.py" in top.split("```text", 1)[1]


def _h200_inputs(tmp: Path):
    from gate.compare.sweep_rules import compare
    from gate.core.config import load_config
    from gate.speed.runs import PerfResult, judge_perf
    from gate.workflow.speed_check import perf_findings

    config = load_config(ROOT / "pyproject.toml")
    baseline = read_baseline(_unzipped("h200-baseline-sdpa-flash-pr.json.gz", tmp))
    sweep = SweepResult.read(_unzipped("h200-sweep-sdpa-flash-pr.json.gz", tmp))
    perf = PerfResult.read(_unzipped("h200-perf-sdpa-flash-pr.json.gz", tmp))
    # regression_pct 3: read from files (no re-run to settle them), five of these 60 unchanged passes'
    # 95% intervals reach past 2% (upper ends up to +2.8%), which INCONCLUSIVE would block
    judgements = judge_perf(perf, baseline.perf, dataclasses.replace(config.perf, regression_pct=3.0))
    findings = compare(baseline, sweep, config.verdict) + perf_findings(judgements)
    return (
        decide(
            findings,
            {},
            {"kernel": sweep.kernel, "suite": sweep.suite, "baseline": "baselines/h200/sdpa-flash-pr.json"},
        ),
        sweep,
        baseline,
        judgements,
    )


def test_a_passing_h200_run_shows_speed_baseline_now_and_change_per_pass(tmp_path):
    verdict, sweep, baseline, judgements = _h200_inputs(tmp_path)
    comment = pr_comment(verdict, diagnose(verdict, sweep), sweep, baseline)
    top = _top(comment)
    assert verdict.passed and top.splitlines()[2] in ("> [!TIP]", "> [!WARNING]")
    line = top.splitlines()[3]
    assert "correctness **PASS**" in line and "speed **PASS**" in line
    speed = top.split("### Speed per pass: baseline -> now", 1)[1]
    for j in judgements:
        row = next(r for r in speed.splitlines() if r.startswith("| ") and f"`{j.case_id}` {j.pass_} |" in r)
        cells = [c.strip() for c in row.strip("|").split("|")]
        # 4 significant digits (a value stored rounded may show its last digit rounded once more)
        assert (
            abs(float(cells[3]) - j.baseline) <= 1.5e-3 * j.baseline
            and abs(float(cells[4]) - j.current) <= 1.5e-3 * j.current
        )
        assert abs(float(cells[5].rstrip("%")) - j.change * 100) < 0.011 and cells[6].endswith("%")  # 4-digit ratios


def test_a_speed_regression_leads_with_baseline_now_change_and_limit(tmp_path):
    verdict, sweep, baseline, judgements = _h200_inputs(tmp_path)
    j = judgements[0]
    slow = Finding(
        "speed",
        Severity.FAIL,
        j.case_id,
        Subject.speed(j.pass_),
        round(j.baseline, 4),
        round(j.baseline * 1.05, 4),
        round(j.baseline * 1.02, 4),
        "slower by +5.00%",
    )
    verdict = decide(
        [f for f in verdict.findings if not (f.case_id == j.case_id and f.metric == j.metric)] + [slow],
        {},
        verdict.context,
    )
    top = _top(pr_comment(verdict, diagnose(verdict, sweep), sweep, baseline, Links(asv="https://acme.github.io/attn")))
    assert "speed **FAIL** in 1 of" in top.splitlines()[3]
    first = top.split("### Worst findings", 1)[1].strip().splitlines()[2]
    limit_pct = (slow.threshold / slow.baseline - 1) * 100  # +2% of the ratio, as the rounded finding carries it
    assert f"`{j.case_id}` {j.pass_}" in first and "**+5.00%**" in first and f"{limit_pct:+.2f}%" in first
    assert "https://acme.github.io/attn/#bench_attention.AttentionSpeed.track_" in first


@pytest.mark.slow
@pytest.mark.xdist_group("comment")
def test_a_huge_failing_run_stays_under_the_comment_limit(cpu_baseline, causal_bug):
    sweep = SweepResult.read(causal_bug[1] / f"sweep-{BUG_STEM}.json")
    baseline = read_baseline(cpu_baseline.path)
    many = tuple(
        dataclasses.replace(c, case=c.case.with_fields(heads_q=c.case.heads_q * (k + 1)))
        for k in range(60)
        for c in sweep.cases
    )
    big = dataclasses.replace(sweep, cases=many)
    from gate.compare.sweep_rules import compare
    from gate.core.config import VerdictConfig

    verdict = decide(compare(baseline, big, VerdictConfig()), {}, {"kernel": big.kernel, "suite": big.suite})
    comment = pr_comment(verdict, diagnose(verdict, big), big, baseline)
    assert len(many) > 2000 and len(comment) < COMMENT_LIMIT
    assert "Left out to stay under GitHub's 65,536-character comment limit" in comment


def test_an_improvement_with_an_environment_change_is_info_naming_it():
    improved = Finding(
        "improvement",
        Severity.WARN,
        "c1",
        Subject.ratio("dv"),
        0.246,
        0.106,
        0.123,
        **advised(
            "c1: dv ratio improved 0.246 -> 0.106 (/2 or better)", "; refresh the baseline so the gate keeps its teeth"
        ),
    )
    cpu = Finding(
        "env_drift",
        Severity.WARN,
        "",
        Subject.env("cpu_model"),
        "Intel Xeon 8375C",
        "AMD EPYC 7763",
        None,
        "environment cpu_model changed",
    )
    verdict = decide([improved, cpu])
    f = next(f for f in verdict.findings if f.case_id == "c1")
    assert f.severity is Severity.INFO and "cpu_model Intel Xeon 8375C -> AMD EPYC 7763" in f.message
    assert "refresh" not in f.message
    alone = next(f for f in decide([improved]).findings if f.case_id == "c1")  # no environment change: still a WARN
    assert alone.severity is Severity.WARN and "refresh the baseline" in alone.message


def test_the_environment_records_cpu_model_and_capability():
    import torch

    from gate.core.environment import describe

    env = describe("cpu", "k", "1")
    assert env["cpu_model"] and env["cpu_model"] != env["machine"]
    # torch's own dispatch level, never the "unknown" of a failed query
    assert env["cpu_capability"] == str(torch.backends.cpu.get_cpu_capability()) != "unknown"


@pytest.mark.slow
@pytest.mark.xdist_group("comment")
def test_plots_are_150_dpi_and_show_at_most_the_worst_cases(cpu_baseline, causal_bug, tmp_path):
    """readable plots: 150 dpi, one row per case (at most MAX_CASES, so labels stay legible)."""
    from PIL import Image

    from gate.compare.sweep_rules import compare, correctness_thresholds
    from gate.core.config import VerdictConfig
    from gate.report.plots import MAX_CASES, plot_ratios

    png = causal_bug[1] / f"ratios-{BUG_STEM}.png"
    with Image.open(png) as im:
        assert round(im.info["dpi"][0]) == 150
    sweep = SweepResult.read(causal_bug[1] / f"sweep-{BUG_STEM}.json")
    baseline = read_baseline(cpu_baseline.path)
    few = dataclasses.replace(sweep, cases=sweep.cases[:10])
    with Image.open(
        plot_ratios(decide(compare(baseline, few, VerdictConfig())), few, baseline, tmp_path / "few.png")
    ) as im:
        small_height = im.size[1]
    many = dataclasses.replace(
        sweep,
        cases=tuple(
            dataclasses.replace(c, case=c.case.with_fields(heads_q=c.case.heads_q * (k + 1)))
            for k in range(10)
            for c in sweep.cases
        ),
    )
    verdict = decide(compare(baseline, many, VerdictConfig()), correctness_thresholds(VerdictConfig()))
    with Image.open(plot_ratios(verdict, many, baseline, tmp_path / "many.png")) as im:
        per_row = small_height / len(few.cases)
        assert im.size[1] < per_row * (MAX_CASES + 12)  # capped: 360 cases do not make a 360-row plot


def test_another_cpu_model_turns_a_moved_ratio_into_info_end_to_end(tmp_path):
    """Through the real rules: an unchanged kernel on another CPU model whose dv ratio halved
    reads as INFO naming the CPU change, not as a WARN to refresh; the same move on the same CPU warns."""
    from gate.compare.baselines import TensorBaseline
    from gate.compare.sweep_rules import compare
    from gate.core.config import VerdictConfig

    sweep = SweepResult.read(_unzipped("cpu-sweep-sdpa-cpu-smoke.json.gz", tmp_path))
    baseline = read_baseline(CPU_BASELINE)
    case = next(c for c in sweep.cases if c.tensor("dv") is not None and c.tensor("dv").ratio > 0.2)
    dv = case.tensor("dv")
    old = baseline.correctness[case.case_id]
    moved = dataclasses.replace(
        old, tensors={**old.tensors, "dv": TensorBaseline(dv.ratio * 2.5, dv.max_err, dv.mean_err, dv.bound, dv.pt_err)}
    )
    env_now = {k: str(v) for k, v in sweep.environment.items()}
    # judged on this one case: the other rows of the committed baseline were measured on another
    # CPU model (or kernel path) than this recorded sweep, and their moves are not what is tested
    sweep = dataclasses.replace(sweep, cases=(case,))
    for other_cpu, expected in (("Intel Xeon Platinum 8375C", Severity.INFO), (env_now["cpu_model"], Severity.WARN)):
        base = dataclasses.replace(
            baseline,
            correctness={case.case_id: moved},
            environment={**baseline.environment, "cpu_model": other_cpu, "cpu_capability": env_now["cpu_capability"]},
        )
        verdict = decide(compare(base, sweep, VerdictConfig()))
        f = next(f for f in verdict.findings if f.case_id == case.case_id and f.metric == "ratio:dv")
        assert f.rule == "improvement" and f.severity is expected, f
        if expected is Severity.INFO:
            assert f"cpu_model {other_cpu} -> {env_now['cpu_model']}" in f.message and "refresh" not in f.message


def test_the_pattern_line_says_so_when_nothing_distinguishes_the_failing_cases():
    from gate.compare.diagnosis import shared_pattern
    from gate.core.cases import Case

    a = Case.build(batch=1, seqlen_q=8, seqlen_k=8, heads_q=2, heads_kv=2, head_dim=16, head_dim_v=16, dtype="bf16")
    b = a.with_fields(causal=True)
    c = a.with_fields(dtype="fp16")
    assert shared_pattern([a, b], []).startswith("every measured case fails (2)")
    assert shared_pattern([b], [a, c]).startswith("the failing case is causal")
    assert shared_pattern([c], [a, b]).startswith("the failing case is fp16")


def test_the_committed_h200_check_speed_findings_render_baseline_now_and_change(tmp_path):
    """The real H200 `check --perf` (tests/data, speed findings with the
    baseline and current speed ratio and the failing limit) rendered by this renderer."""
    data = json.loads(gzip.decompress((DATA / "h200-findings-sdpa-flash-pr.json.gz").read_bytes()))
    speed = [Finding.from_dict(f) for f in data["findings"] if f["rule"] == "speed"]
    assert len(speed) == 4
    verdict, sweep, baseline, _ = _h200_inputs(tmp_path)
    verdict = decide([f for f in verdict.findings if f.rule != "speed"] + speed, {}, verdict.context)
    top = _top(pr_comment(verdict, diagnose(verdict, sweep), sweep, baseline))
    assert "speed **PASS** (4 passes; largest change" in top.splitlines()[3]
    # a pass that raised under a declared bug is not timed: the verdict line counts it apart
    untimed = Finding(
        "speed",
        Severity.KNOWN,
        "bf16-x",
        Subject.speed("fwd"),
        None,
        None,
        None,
        "not measured: E [KNOWN: #1]",
        entry=1,
    )
    verdict = decide(list(verdict.findings) + [untimed], {}, verdict.context)
    top = _top(pr_comment(verdict, diagnose(verdict, sweep), sweep, baseline))
    assert "speed **PASS** (4 passes, 1 KNOWN (not timed); largest change" in top.splitlines()[3]
    table = top.split("### Speed per pass: baseline -> now", 1)[1]
    for f in speed:
        pass_ = f.subject.item
        row = next(r for r in table.splitlines() if f"`{f.case_id}` {pass_} |" in r)
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[3:7] == [
            f"{f.baseline:.4g}",
            f"{f.current:.4g}",
            f"{(f.current / f.baseline - 1) * 100:+.2f}%",
            f"{(f.threshold / f.baseline - 1) * 100:+.2f}%",
        ]


def test_the_thresholds_table_reads_each_meaning_from_the_settings_declaration():
    """Every threshold a check prints has a meaning, and a setting's is its declaration's."""
    from gate.compare.sweep_rules import correctness_thresholds
    from gate.core.config import SETTINGS, PerfConfig, VerdictConfig
    from gate.report.comment import thresholds_table
    from gate.workflow.speed_check import perf_thresholds

    thresholds = {**correctness_thresholds(VerdictConfig()), **perf_thresholds(PerfConfig())}
    rows = {line.split(" | ")[0].strip("|` "): line for line in thresholds_table(decide([], thresholds))[2:]}
    assert set(rows) == set(thresholds)
    for key, row in rows.items():
        meaning = row.rsplit(" | ", 1)[1].removesuffix(" |")
        assert meaning, key
        declared = SETTINGS.get(f"verdict.{key}") or SETTINGS.get(f"perf.{key}")
        assert declared is not None or key == "tolerance_ratio", f"threshold {key} is no declared setting"
        assert declared is None or meaning == declared.meaning, key
    unknown = thresholds_table(decide([], {"made_up": 1.0}))[2]
    assert unknown == "| `made_up` | 1 |  |"


def test_newly_skipped_cases_alone_have_no_pattern_line_and_are_what_the_rerun_names(tmp_path):
    """Two cases measured in the baseline and SKIPPED now: INCONCLUSIVE, each with its own line.
    They were not measured, so no "what the failing cases share" line is made of them (it read
    "every measured case fails (2)"); the rerun still names them."""
    from gate.compare.sweep_rules import compare
    from gate.core.config import load_config

    config = load_config(ROOT / "pyproject.toml")
    baseline = read_baseline(_unzipped("h200-baseline-sdpa-flash-pr.json.gz", tmp_path))
    sweep = SweepResult.read(_unzipped("h200-sweep-sdpa-flash-pr.json.gz", tmp_path))
    measured = [c.case_id for c in sweep.cases if c.status is Status.PASS][:2]
    skipped = [
        dataclasses.replace(c, status=Status.SKIP, reason="declared: batch x heads", tensors=())
        if c.case_id in measured
        else c
        for c in sweep.cases
    ]
    sweep = dataclasses.replace(sweep, cases=tuple(skipped))
    verdict = decide(compare(baseline, sweep, config.verdict), {}, {"kernel": sweep.kernel, "suite": sweep.suite})
    found = diagnose(verdict, sweep)
    assert not verdict.passed and found.failed == () and set(found.focus) == set(measured)
    assert found.pattern == ""
    comment = pr_comment(verdict, found, sweep, baseline)
    assert "**Rerun exactly the 2 inconclusive cases:**" in comment and "What the failing cases share" not in comment
