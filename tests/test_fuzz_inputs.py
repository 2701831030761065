"""Property-based fuzz (Hypothesis) over the files the gate reads: a results file, a
baseline and a config, each mutated the way a hostile or clumsy hand would (values of the wrong
type, NaN/inf/negative/huge numbers, lost cases, path-like names, duplicate keys, truncation).

Whatever the file: exit code in {0, 1, 2}, no traceback, nothing written outside --out (the
baselines folder and the inputs are unchanged), and never exit 0 on a file that lost cases or
carries a non-finite or negative ratio. Each example runs `attn-gate check --results` in this
process (no kernel runs), so the whole module takes a few seconds."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gate.commands.main import main
from gate.core.config import Config
from gate.workflow.sweep import run_sweep

SUITE = ('[tool.attn-gate.suites.fz]\nseeds = [0]\n[[tool.attn-gate.suites.fz.matrix]]\n'
         'dtype = ["fp32"]\nbatch = [1]\nseqlens = ["8", "9", "10"]\nheads = ["2"]\nhead_dims = ["8"]\n')
SETTINGS = settings(max_examples=20, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A valid results file and its baseline, made once (sdpa-cpu, in process)."""
    import tomllib

    root = tmp_path_factory.mktemp("fuzz")
    config = root / "pyproject.toml"
    config.write_text(f'[tool.attn-gate]\nbaselines_dir = "baselines"\n{SUITE}')
    suites = tomllib.loads(SUITE)["tool"]["attn-gate"]["suites"]
    sweep = run_sweep("sdpa-cpu", "fz", Config(suites=suites, source=str(config)), "cpu", progress=False)
    results = root / "results.json"
    sweep.write(results)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["baseline", "update", "--from-results", str(results), "--config", str(config)]) == 0
    (baseline,) = (root / "baselines" / "cpu").glob("*.json")
    return root, json.loads(results.read_text()), json.loads(baseline.read_text())


JUNK = st.one_of(st.none(), st.booleans(), st.integers(min_value=-10**30, max_value=10**30), st.text(max_size=8),
                 st.sampled_from(["nan", "inf", "-inf", float("nan"), float("inf"), -1.0, 1e300, "../../x", "a/b", [], {}]),
                 st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
BAD_NUMBERS = st.sampled_from(["nan", "inf", "-inf", -1.0, -1e-9])


def paths_of(data, prefix=()):
    """Every (path, value) in a JSON document, for picking what to mutate."""
    yield prefix, data
    if isinstance(data, dict):
        for k, v in data.items():
            yield from paths_of(v, prefix + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from paths_of(v, prefix + (i,))


def set_at(data, path, value):
    for key in path[:-1]:
        data = data[key]
    data[path[-1]] = value


@st.composite
def mutated(draw, original: dict, ratio_paths):
    """(text of the file, why it must not pass or None)."""
    data = copy.deepcopy(original)
    kind = draw(st.sampled_from(["junk", "junk", "bad_ratio", "lose_cases", "duplicate_key", "truncate", "nest"]))
    must_fail = None
    if kind == "junk":
        paths = [p for p, _ in paths_of(data) if p]
        set_at(data, draw(st.sampled_from(paths)), draw(JUNK))
    elif kind == "bad_ratio":
        set_at(data, draw(st.sampled_from(ratio_paths)), draw(BAD_NUMBERS))
        must_fail = "a non-finite or negative ratio"
    elif kind == "lose_cases":
        key = "cases" if "cases" in data else "correctness"
        if isinstance(data[key], list):
            keep = draw(st.integers(min_value=0, max_value=len(data[key]) - 1))
            data[key] = data[key][:keep]
        else:
            ids = sorted(data[key])
            data[key] = {k: data[key][k] for k in ids[:draw(st.integers(min_value=0, max_value=len(ids) - 1))]}
        must_fail = "lost cases"
    text = json.dumps(data, indent=1)
    if kind == "duplicate_key":
        text = text.replace('"suite":', '"suite": "x", "suite":', 1)
    elif kind == "truncate":
        text = text[:draw(st.integers(min_value=0, max_value=len(text) - 1))]
    elif kind == "nest":
        text = text[:-2] + ', "deep": ' + "[" * 100_000 + "]" * 100_000 + "}\n"
    return text, must_fail


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def run_check(root: Path, results: Path, config: Path) -> tuple[int, str]:
    out = Path(tempfile.mkdtemp(dir=root, prefix="out-"))
    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = main(["check", "--results", str(results), "--config", str(config), "--out", str(out)])
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return code, err.getvalue()


def ratio_paths(data: dict, key: str) -> list[tuple]:
    return [p for p, _ in paths_of(data) if p and p[0] == key and p[-1] == "ratio"]


def assert_safe(root, before, code, err, must_fail):
    assert code in (0, 1, 2), err
    assert "Traceback" not in err, err
    assert code == 2 or not err.strip() or err.count("\n") <= 3
    if must_fail:
        assert code != 0, f"exit 0 on a file with {must_fail}"
    after = snapshot(root)
    assert after == before, sorted(set(after) ^ set(before)) or "a file changed"


def test_fuzzed_results_files(project):
    root, results, baseline = project

    @SETTINGS
    @given(mutated(results, ratio_paths(results, "cases")))
    def check(example):
        text, must_fail = example
        path = root / "fuzzed-results.json"
        path.write_text(text)
        before = snapshot(root)
        code, err = run_check(root, path, root / "pyproject.toml")
        assert_safe(root, before, code, err, must_fail)

    check()


def test_fuzzed_baselines(project):
    root, results, baseline = project
    (path,) = (root / "baselines" / "cpu").glob("*.json")
    original = path.read_text()
    sweep_file = root / "results.json"

    @SETTINGS
    @given(mutated(baseline, ratio_paths(baseline, "correctness")))
    def check(example):
        text, must_fail = example
        path.write_text(text)
        try:
            before = snapshot(root)
            code, err = run_check(root, sweep_file, root / "pyproject.toml")
            assert_safe(root, before, code, err, must_fail)
        finally:
            path.write_text(original)

    check()


TOML_VALUES = st.sampled_from(["nan", "inf", "-1", "0", "1e300", '"x"', "[]", "[nan]", "{}", "true", '"../../x"', "3",
                               '["bf16"]', "[[1, 2]]", '"', "[1, 2, 3]"])
TOML_KEYS = st.sampled_from([
    "[tool.attn-gate]\nbaselines_dir", "[tool.attn-gate.verdict]\nheadroom_factor", "[tool.attn-gate.verdict]\nheadroom_step",
    "[tool.attn-gate.perf]\nalpha", "[tool.attn-gate.tolerance]\nmult_dq", "[tool.attn-gate.isolation]\ncase_timeout_s",
    "[tool.attn-gate.cpu]\nkernel", "[tool.attn-gate]\nperf", "[tool.attn-gate]\nverdict", "[tool.attn-gate]\nsuites",
    "[tool.attn-gate.suites.fz.matrix.0]\nsoftcap", "[tool.attn-gate]\nunknown",
])


def test_fuzzed_configs(project):
    root, results, baseline = project
    sweep_file = root / "results.json"

    @SETTINGS
    @given(TOML_KEYS, TOML_VALUES)
    def check(key, value):
        config = root / "fuzzed.toml"
        section, name = key.split("\n")
        body = f'[tool.attn-gate]\nbaselines_dir = "baselines"\n{SUITE}' if section != "[tool.attn-gate]" or name == "perf" else SUITE
        text = (f"{section}\n{name} = {value}\n" + body) if section == "[tool.attn-gate]" and name != "baselines_dir" \
            else f"{body}\n{section}\n{name} = {value}\n"
        if name == "baselines_dir":
            text = f"[tool.attn-gate]\nbaselines_dir = {value}\n{SUITE}"
        config.write_text(text)
        before = snapshot(root)
        code, err = run_check(root, sweep_file, config)
        assert_safe(root, before, code, err, None)

    check()
