"""`pytest --attn-gate` (gate/pytest_plugin.py): the suite's cases as pytest items, judged by the check's
own rules. A planted bug in a plain-PyTorch kernel (examples/tiny-attn's, dK x1.02 on causal cases
only) fails exactly the items that `attn-gate check` fails; `-k`, `-x`, `--lf`, `-n 2` and
`--junitxml` work; this repository's smoke suite and the example repository's pass; without the
flag the plugin adds nothing.

A run under xdist, and the example repository's (it imports its own `tests`), is a fresh pytest
process; the others run in this one (pytester's in-process run, as pytest's own plugin tests do):
the cases run in the gate's worker processes either way, and one run's warm worker serves the
next run of the same kernel instead of a torch import per process."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.minisuite import DK_LINE, ROOT, TINY_ATTN, gate, run, suite

pytest_plugins = ("pytester",)

CAUSAL_BUG = DK_LINE + "        dk = dk * 1.02 if ctx.causal else dk\n"
PYPROJECT = '[tool.attn-gate.cpu]\nkernel = "tinyk:flash_attn_func"\nsuite = "mini"\n' + suite(
    "mini", dtype=("fp32",), seqlens=("33", "40x56"), head_dims=("16",)
)
BUGGY = [
    "--attn-gate-kernel",
    "tinyk_bug:flash_attn_func",
    "--attn-gate-baseline",
    "baselines/cpu/tinyk_flash_attn_func-mini.json",
]


def pytest_in(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """pytest in a fresh process: what xdist's controller and workers need, and a repository whose
    module names (`tests`) this process holds already."""
    return run([sys.executable, "-m", "pytest", "-p", "no:randomly", "-q", *args], cwd)


def pytest_here(pytester: pytest.Pytester, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """pytest from CWD in this process; stdout and stderr as a CompletedProcess's."""
    # pytester's run drops the modules it imported; the gate's are imported here first, so they stay
    import gate.workflow.pytest_cases  # noqa: F401

    with contextlib.chdir(cwd):
        result = pytester.runpytest_inprocess("-p", "no:randomly", "-q", *args)
    return subprocess.CompletedProcess(args, int(result.ret), "\n".join(result.outlines), "\n".join(result.errlines))


def verdict_lines(stdout: str) -> list[str]:
    """The plugin's summary: its `attn-gate:` lines and their indented continuations."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("attn-gate: "))
    end = start + 1
    while end < len(lines) and (lines[end].startswith("attn-gate: ") or lines[end].startswith("  ")):
        end += 1
    return lines[start:end]


def junit(path: Path) -> dict[str, str]:
    """test name -> passed / failed / skipped, from a --junitxml file."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        out[case.get("name")] = (
            "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
        )
    return out


def failing_cases(findings: Path) -> set[str]:
    """The cases with a blocking finding; a run-wide one (no case) counts as the case id ''."""
    data = json.loads(findings.read_text())
    return {f["case_id"] for f in data["findings"] if f["severity"] in ("FAIL", "INCONCLUSIVE")}


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A kernel repository: tinyk (correct) with its committed mini baseline, and tinyk_bug."""
    repo = tmp_path_factory.mktemp("plugin") / "kernels"
    for name, text in (("tinyk", TINY_ATTN), ("tinyk_bug", TINY_ATTN.replace(DK_LINE, CAUSAL_BUG))):
        (repo / name).mkdir(parents=True)
        (repo / name / "__init__.py").write_text(text)
    (repo / "pyproject.toml").write_text(PYPROJECT)
    assert gate(["baseline", "update", "--device", "cpu", "--no-progress", "--out", "o-base"], repo) == 0
    return repo


@pytest.mark.slow
@pytest.mark.xdist_group("pytest_plugin")
def test_the_failing_items_are_exactly_the_checks_fail_cases(repo, pytester, monkeypatch):
    check = ["check", "--kernel", BUGGY[1], "--baseline", BUGGY[3], "--device", "cpu", "--no-progress"]
    assert gate([*check, "--out", "o-check"], repo) == 1
    expected = failing_cases(repo / "o-check" / "findings-tinyk_bug_flash_attn_func-mini.json")
    assert expected and all("causal" in c for c in expected)  # the bug is on causal cases only
    # under xdist (-n 2): the controller writes the whole run's files; the runs below are in this process
    proc = pytest_in(repo, "--attn-gate", *BUGGY, "--attn-gate-out", "o-pytest", "-n", "2", "--junitxml", "j.xml")
    assert proc.returncode == 1, proc.stdout[-3000:]
    outcomes = junit(repo / "j.xml")
    assert {n for n, o in outcomes.items() if o == "failed"} == expected
    findings = json.loads((repo / "o-pytest" / "findings-tinyk_bug_flash_attn_func-mini.json").read_text())
    assert findings["context"]["cases"] == len(outcomes) == 4
    assert {n for n, o in outcomes.items() if o == "passed"} == {n for n in outcomes if "causal" not in n}
    # the gate's one line is the failure message; its files are those of `attn-gate check`
    (case, *_) = sorted(expected)
    assert f"{case}: dk ratio" in proc.stdout or f"{case}: dk" in proc.stdout, proc.stdout[-3000:]
    assert failing_cases(repo / "o-pytest" / "findings-tinyk_bug_flash_attn_func-mini.json") == expected
    for name in ("check-tinyk_bug_flash_attn_func-mini.md", "sweep-tinyk_bug_flash_attn_func-mini.json"):
        assert (repo / "o-pytest" / name).is_file()

    # --lf: only the failures run again
    again = pytest_here(
        pytester, repo, "--attn-gate", *BUGGY, "--attn-gate-out", "o-lf", "--lf", "--junitxml", "lf.xml"
    )
    assert again.returncode == 1 and set(junit(repo / "lf.xml")) == expected, again.stdout[-2000:]
    # the run's files cover what ran (a scoped check), and still fail those cases
    lf = json.loads((repo / "o-lf" / "findings-tinyk_bug_flash_attn_func-mini.json").read_text())
    assert lf["context"]["cases"] == len(expected) and lf["verdict"] == "FAIL"

    # -x stops at the first failure; -k selects by case id
    first = pytest_here(
        pytester, repo, "--attn-gate", *BUGGY, "--attn-gate-out", "o-x", "-x", "-k", "causal", "--junitxml", "x.xml"
    )
    assert first.returncode == 1 and list(junit(repo / "x.xml").values()) == ["failed"]
    monkeypatch.setenv("COLUMNS", "60")  # the verdict's lines wrap at words to pytest's width
    narrow = pytest_here(pytester, repo, "--attn-gate", *BUGGY, "--attn-gate-out", "o-narrow", "-k", "causal")
    ours = verdict_lines(narrow.stdout)
    assert any(line.startswith("attn-gate: wrote") for line in ours) and len(ours) > 2, narrow.stdout[-2000:]
    assert all(len(line) <= 60 or " " not in line.strip() for line in ours), ours
    picked = pytest_here(
        pytester, repo, "--attn-gate", *BUGGY, "--attn-gate-out", "o-k", "-k", "not causal", "--junitxml", "k.xml"
    )
    assert picked.returncode == 0 and set(junit(repo / "k.xml")) == {n for n in outcomes if "causal" not in n}


@pytest.mark.slow
@pytest.mark.xdist_group("pytest_plugin")
def test_without_the_flag_the_plugin_adds_nothing(repo, pytester):
    proc = pytest_here(pytester, repo, "--collect-only")
    assert "attn-gate" not in proc.stdout and "no tests collected" in proc.stdout, proc.stdout
    listed = pytest_here(pytester, repo, "--attn-gate", "--collect-only")
    assert listed.stdout.count("\nattn-gate::fp32-") + listed.stdout.startswith("attn-gate::") == 4, listed.stdout
    assert "4 tests collected" in listed.stdout


@pytest.mark.slow
@pytest.mark.xdist_group("pytest_plugin")
def test_no_baseline_is_a_usage_error_with_the_gates_message(repo, pytester):
    proc = pytest_here(pytester, repo, "--attn-gate", "--attn-gate-kernel", "tinyk_bug:flash_attn_func")
    assert proc.returncode == 4 and "no baseline for kernel 'tinyk_bug:flash_attn_func'" in proc.stderr + proc.stdout


@pytest.mark.slow
def test_this_repositorys_smoke_suite_passes_under_xdist(cpu_baseline, tmp_path):
    """This repository's smoke suite, checked case by case against this machine's CPU baseline.
    One xdist worker: its rows still reach the controller, which writes the run's files (the split
    over two workers is the mini suite's test above); each more worker is two more torch imports.
    Its GQA cases (-k h4/2, under half of them) carry every kind of row, passed or skipped: dense,
    varlen, KV cache, paged; the others would take the same route at a sweep's cost. A run so
    selected is judged as a scoped check; the whole suite's judgement is the mini suite's -n 2 run."""
    proc = pytest_in(
        ROOT,
        # gate/ holds no test module: --ignore=tests cannot drop testpaths' own folder, and each worker
        # would import the repository's tests only to deselect them
        "gate",
        "--attn-gate",
        f"--attn-gate-baseline={cpu_baseline.path}",  # one word: pytest takes a lone existing path for its rootdir
        "--attn-gate-suite",
        "smoke",
        "--attn-gate-kernel",
        "sdpa-cpu",
        "-m",
        "attn_gate",
        "-k",
        "h4/2",
        "--attn-gate-device",
        "cpu",
        "--attn-gate-out",
        str(tmp_path / "o"),
        "-n",
        "1",
        "--junitxml",
        str(tmp_path / "j.xml"),
        "-p",
        "no:cacheprovider",
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    outcomes = junit(tmp_path / "j.xml")
    sweep = json.loads((tmp_path / "o" / "sweep-sdpa-cpu-smoke.json").read_text())
    skipped = {c["case_id"] for c in sweep["cases"] if c["status"] == "SKIP"}
    assert {n for n, o in outcomes.items() if o == "skipped"} == skipped and skipped
    assert len(outcomes) == len(sweep["cases"]) and "failed" not in outcomes.values()
    # the subset still spans the entry points: dense, varlen, KV cache, paged KV cache
    entries = [c["case"]["entry"] for c in sweep["cases"] if c["status"] == "PASS"]
    kinds = {(e["kind"], bool(e["varlen"]), e["page_size"] > 0) for e in entries}
    assert kinds >= {
        ("dense", False, False),
        ("dense", True, False),
        ("kvcache", False, False),
        ("kvcache", False, True),
    }


@pytest.mark.slow
def test_the_example_repositorys_smoke_suite_passes(cpu_baseline, tmp_path):
    repo = tmp_path / "tiny-attn"
    shutil.copytree(ROOT / "examples" / "tiny-attn", repo, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    init = ["init", "--dense", "tiny_attn:flash_attn_func", "--varlen", "tiny_attn:flash_attn_varlen_func"]
    assert gate([*init, "--repository", "example/tiny-attn", "--install", "attn-gate==0.1.0", "--yes"], repo) == 0
    # sdpa-cpu's smoke baseline of this machine, where init's config keeps baselines (recorded once per session)
    (repo / "baselines" / "cpu").mkdir(parents=True, exist_ok=True)
    shutil.copy(cpu_baseline.path, repo / "baselines" / "cpu" / cpu_baseline.path.name)
    # the repository's own tests and the gate's cases in one run (a subset of the cases: -k)
    proc = pytest_in(
        repo,
        "--attn-gate",
        "--attn-gate-suite",
        "smoke",
        "--attn-gate-kernel",
        "sdpa-cpu",
        "--attn-gate-device",
        "cpu",
        "-k",
        "fp32 or test_dense",
        "--junitxml",
        "j.xml",
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    # the verdict on a line of its own, with pytest's summary (not after the progress's `[100%]`)
    assert re.search(r"^attn-gate: PASS: \d+ cases measured", proc.stdout, re.M), proc.stdout[-3000:]
    outcomes = junit(repo / "j.xml")
    assert outcomes.get("test_dense_matches_sdpa_with_gradients") == "passed"
    assert sum(n.startswith("fp32-") for n in outcomes) >= 5 and "failed" not in outcomes.values()


def test_the_plugin_is_registered_and_imports_nothing_of_the_gate_until_asked():
    """Installed in every venv that has attn-gate (this repository's too): it must cost nothing."""
    from importlib.metadata import entry_points

    assert [e.value for e in entry_points(group="pytest11") if e.name == "attn-gate"] == ["gate.pytest_plugin"]
    code = (
        "import sys, gate.pytest_plugin; "
        "sys.exit(sorted(m for m in sys.modules if m.startswith(('gate.', 'torch'))) != ['gate.pytest_plugin'])"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0
