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
import itertools
import json
import math
import shutil
import tempfile
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gate.commands.main import main
from gate.core.config import RANGES, Config, Range
from gate.core.jsonio import MAX_MULT
from gate.workflow.sweep import run_sweep

SUITE = (
    "[tool.attn-gate.suites.fz]\nseeds = [0]\n[[tool.attn-gate.suites.fz.matrix]]\n"
    'dtype = ["fp32"]\nbatch = [1]\nseqlens = ["8", "9", "10"]\nheads = ["2"]\nhead_dims = ["8"]\n'
)
SETTINGS = settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A valid results file and its baseline, made once (sdpa-cpu, in process)."""
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


JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.text(max_size=8),
    st.sampled_from(["nan", "inf", "-inf", float("nan"), float("inf"), -1.0, 1e300, "../../x", "a/b", [], {}]),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
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
            data[key] = {k: data[key][k] for k in ids[: draw(st.integers(min_value=0, max_value=len(ids) - 1))]}
        must_fail = "lost cases"
    text = json.dumps(data, indent=1)
    if kind == "duplicate_key":
        text = text.replace('"suite":', '"suite": "x", "suite":', 1)
    elif kind == "truncate":
        text = text[: draw(st.integers(min_value=0, max_value=len(text) - 1))]
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


TOML_VALUES = (
    "nan",
    "inf",
    "-1",
    "0",
    "0.25",
    "1e300",
    '"x"',
    "[]",
    "[nan]",
    "{}",
    "true",
    '"../../x"',
    "3",
    '["bf16"]',
    "[[1, 2]]",
    '"',
    "[1, 2, 3]",
)
# (table, key) -> what a good value is, declared here apart from the reader: a number in its
# declared range (config.RANGES; a tolerance multiplier in (0, MAX_MULT]), a path string, a table.
NUMBER_RANGES = {
    ("verdict", "headroom_factor"): RANGES["verdict.headroom_factor"],
    ("verdict", "headroom_step"): RANGES["verdict.headroom_step"],
    ("perf", "alpha"): RANGES["perf.alpha"],
    ("isolation", "case_timeout_s"): RANGES["isolation.case_timeout_s"],
    ("tolerance", "mult_dq"): Range(0, MAX_MULT, lo_open=True),
}
TOML_KEYS = (
    *NUMBER_RANGES,
    ("", "baselines_dir"),
    ("cpu", "kernel"),  # a name: checked where a kernel is run, not by `check --results`
    ("", "perf"),
    ("", "verdict"),
    ("", "unknown"),
)


def fuzzed_config(table: str, key: str, value: str) -> str:
    """[tool.attn-gate] with `key = value` in `table` ("" for the top level), the rest valid."""
    top = {"baselines_dir": '"baselines"'}
    if not table:
        top[key] = value
    text = "[tool.attn-gate]\n" + "".join(f"{k} = {v}\n" for k, v in top.items())
    if table:
        text += f"[tool.attn-gate.{table}]\n{key} = {value}\n"
    return text + SUITE


def good(table: str, key: str, value) -> bool:
    """Whether the parsed `value` is a good setting for the key (the oracle)."""
    if (table, key) in NUMBER_RANGES:
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return number and math.isfinite(value) and value in NUMBER_RANGES[(table, key)]
    if key in ("baselines_dir", "kernel"):
        return isinstance(value, str)
    if key in ("perf", "verdict"):
        return isinstance(value, dict)  # an empty table: every default
    return False  # an unknown key


def test_fuzzed_configs(project):
    """Every key with every value (a few hundred in-process checks): every bad value is refused
    (exit 2, one line naming the key), every good one accepted: the results file judged against
    its own baseline passes, where the setting leaves the comparison possible (results measured with
    another tolerance, or a folder without the baseline, are refused naming that)."""
    root, results, baseline = project
    sweep_file = root / "results.json"
    config = root / "fuzzed.toml"
    shutil.copytree(root / "baselines", root / "x", dirs_exist_ok=True)  # baselines_dir = "x" finds it
    wrong = []
    for (table, name), value in itertools.product(TOML_KEYS, TOML_VALUES):
        config.write_text(fuzzed_config(table, name, value))
        before = snapshot(root)
        code, err = run_check(root, sweep_file, config)
        assert_safe(root, before, code, err, None)
        try:
            parsed = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            ok = code == 2 and str(config) in err and err.count("\n") == 1  # names the file: no key was read
        else:
            if not good(table, name, parsed):
                ok = code == 2 and err.count("\n") == 1 and name in err
            elif name == "mult_dq" and parsed != results["tolerance"]["mult_dq"]:
                ok = code == 2 and "other tolerance multipliers" in err and name in err
            elif name == "baselines_dir" and not (root / parsed / "cpu").is_dir():
                ok = code == 2 and str(root / parsed) in err
            else:
                ok = code == 0
        if not ok:
            wrong.append(f"{table}.{name} = {value}: exit {code}, {err.strip()!r}")
    assert not wrong, "\n".join(wrong)


# ---------------------------------------------------------------- the oracle: a field the reader uses is never ignored
#
# Per file kind: mutate one field to a junk value, run the command that reads it. Exit 2 (refused)
# is always fine. Exit 0 is fine only when the reader took the mutated value as given: the file read
# back through the kind's reader and written again holds it at the same place (numbers compared as
# numbers). A value dropped, replaced or re-derived there, with exit 0, is a verdict that ignored
# what the file said. Fields the reader never reads (derived summaries, written for people) are
# listed per kind.

MISSING = object()


def norm(value):
    """A value as the verdict sees it: numbers as floats (a JSON "nan" is a NaN), the rest as text."""
    if value is None or isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, float, str)):
        try:
            return repr(float(value))
        except (ValueError, OverflowError):
            return str(value)
    if isinstance(value, (list, tuple)):
        return [norm(v) for v in value]
    if isinstance(value, dict):
        return {str(k): norm(v) for k, v in value.items()}
    return str(value)


def get_at(data, path):
    for key in path:
        try:
            data = data[key]
        except (KeyError, IndexError, TypeError):
            return MISSING
    return data


def under(path, prefixes) -> bool:
    return any(len(path) >= len(p) and all(a == "*" or a == b for a, b in zip(p, path)) for p in prefixes)


def leaf_paths(data, skip=()):
    return [p for p, v in paths_of(data) if p and not isinstance(v, (dict, list)) and not under(p, skip)]


ORACLE_SETTINGS = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def oracle(kind: str, path, value, code: int, err: str, reread) -> None:
    assert code in (0, 1, 2) and "Traceback" not in err, err
    if code != 0:
        return
    got = get_at(reread(), path)
    assert got is not MISSING and norm(got) == norm(value), (
        f"{kind}: exit 0 with {'.'.join(map(str, path))} = {value!r} in the file, but the reader used {got!r}"
    )


def _reread(reader, path: Path):
    from gate.core.jsonio import clean_json

    return lambda: json.loads(json.dumps(clean_json(reader(path).to_dict())))


def suite_cases(root: Path) -> dict:
    from gate.core.cases import load_suite
    from gate.core.config import load_config

    config = load_config(root / "pyproject.toml")
    return {c.id: c for c in load_suite("fz", config.suites, config.source).swept_cases}


# the sweep reader recomputes these from the rows (never read back)
SWEEP_DERIVED = [("summary",), ("harness_report",), ("kind",), ("schema_version",)]


def test_oracle_sweep_results(project):
    from gate.core.results import SweepResult

    root, results, baseline = project

    suite = suite_cases(root)
    paths = leaf_paths(results, SWEEP_DERIVED)
    case_paths = [p for p in paths if len(p) > 2 and p[2] == "case"]  # what a row says it measured

    @ORACLE_SETTINGS
    @given(st.data())
    def check(data):
        target = data.draw(st.sampled_from(case_paths) | st.sampled_from(paths))
        value = data.draw(JUNK | st.integers(min_value=0, max_value=64))
        mutated = copy.deepcopy(results)
        set_at(mutated, target, value)
        path = root / "oracle-results.json"
        path.write_text(json.dumps(mutated))
        code, err = run_check(root, path, root / "pyproject.toml")
        oracle("sweep", target, value, code, err, _reread(SweepResult.read, path))
        if code == 0:  # consistent with the run: each row measured the suite's case of its id
            assert all(suite.get(c.case_id) == c.case for c in SweepResult.read(path).cases), (target, value)

    check()


BASELINE_DERIVED = [("kind",), ("schema_version",)]


def test_oracle_baselines(project):
    from gate.compare.baselines import read_baseline

    root, results, baseline = project
    (path,) = (root / "baselines" / "cpu").glob("*.json")
    original = path.read_text()

    from gate.core.cases import case_hash

    suite = suite_cases(root)
    paths = leaf_paths(baseline, BASELINE_DERIVED)
    hashes = [p for p in paths if p[-1] == "case_hash"]

    @ORACLE_SETTINGS
    @given(st.data())
    def check(data):
        target = data.draw(st.sampled_from(hashes) | st.sampled_from(paths))
        value = data.draw(JUNK | st.sampled_from(["0123456789abcdef", "ffffffffffffffff"]))
        mutated = copy.deepcopy(baseline)
        set_at(mutated, target, value)
        path.write_text(json.dumps(mutated))
        try:
            code, err = run_check(root, root / "results.json", root / "pyproject.toml")
            oracle("baseline", target, value, code, err, _reread(read_baseline, path))
            if code == 0:  # consistent with the suite: each row's case_hash is its case's
                rows = read_baseline(path).correctness
                assert all(r.case_hash in (None, case_hash(suite[cid])) for cid, r in rows.items()), (target, value)
        finally:
            path.write_text(original)

    check()


# a perf row's `summary` is derived from its samples and never read back
PERF_DERIVED = [("kind",), ("schema_version",), ("cases", "*", "summary")]


def test_oracle_perf_files(tmp_path_factory):
    from gate.speed.runs import PerfResult
    from tests.test_perf_inputs import PerfProject, quiet

    project = PerfProject(tmp_path_factory.mktemp("perf-oracle"))
    perf = project.perf_json

    @ORACLE_SETTINGS
    @given(st.data())
    def check(data):
        target = data.draw(st.sampled_from(leaf_paths(perf, PERF_DERIVED)))
        value = data.draw(JUNK)
        mutated = copy.deepcopy(perf)
        set_at(mutated, target, value)
        path = project.root / "oracle-perf.json"
        path.write_text(json.dumps(mutated))
        code, err = quiet(project.check(path))
        oracle("perf", target, value, code, err, _reread(PerfResult.read, path))

    check()


def test_oracle_findings_files(tmp_path):
    """`check --last-failed` reruns what a findings file says failed: a damaged file is refused,
    never read as fewer failures than it holds."""
    from gate.commands.check import last_failed
    from gate.core.errors import UserError

    good = {
        "schema_version": 2,
        "kind": "attn-gate findings",
        "verdict": "FAIL",
        "context": {"kernel": "k", "suite": "s"},
        "findings": [
            {"rule": "tolerance", "severity": "FAIL", "case_id": "fp32-b1-h2-s16-d8", "metric": "ratio:out"},
            {"rule": "speed", "severity": "INCONCLUSIVE", "case_id": "fp32-b1-h2-s17-d8", "metric": "x"},
            {"rule": "headroom", "severity": "OK", "case_id": "fp32-b1-h2-s18-d8", "metric": "ratio:dq"},
        ],
    }

    @ORACLE_SETTINGS
    @given(st.data())
    def check(data):
        target = data.draw(st.sampled_from([p for p in leaf_paths(good) if p[0] in ("kind", "findings")]))
        value = data.draw(st.one_of(JUNK, st.sampled_from(["FAIL", "INCONCLUSIVE", "OK", "WARN", ""])))
        mutated = copy.deepcopy(good)
        set_at(mutated, target, value)
        (tmp_path / "findings-k-s.json").write_text(json.dumps(mutated))
        try:
            regex = last_failed(tmp_path, None, None)[0]
        except UserError:
            return
        import re

        rows = mutated["findings"]
        ids = [r["case_id"] for r in rows]
        expected = {r["case_id"] for r in rows if r["severity"] in ("FAIL", "INCONCLUSIVE") and r["case_id"]}
        assert all(r["severity"] in ("FAIL", "INCONCLUSIVE", "WARN", "KNOWN", "INFO", "OK") for r in rows), (
            target,
            value,
        )
        if regex is None:  # nothing failed: every case runs again
            assert not expected, (target, value)
            return
        assert {cid for cid in ids if isinstance(cid, str) and re.search(regex, cid)} == expected, (
            target,
            value,
            regex,
        )

    check()


def test_oracle_journal_rows(project, tmp_path):
    """`--resume` keeps a journal's rows as finished cases: a mutated row is refused, or read back
    as written, and only ever as the run's own case of that id."""
    from gate.core.cases import load_suite
    from gate.core.config import load_config
    from gate.core.errors import UserError
    from gate.core.jsonio import clean_json
    from gate.workflow.journal import Journal, read_journal

    root, results, baseline = project
    config = load_config(root / "pyproject.toml")
    cases = load_suite("fz", config.suites, config.source).swept_cases
    header = {"kernel": "sdpa-cpu", "suite": "fz"}
    row = results["cases"][0]

    @ORACLE_SETTINGS
    @given(st.data())
    def check(data):
        target = data.draw(st.sampled_from(leaf_paths(row, [("seconds",)])))
        value = data.draw(JUNK)
        mutated = copy.deepcopy(row)
        set_at(mutated, target, value)
        journal = Journal(tmp_path / "journal.jsonl")
        journal.start(header, resume=False)
        with open(journal.path, "a") as fh:
            fh.write(json.dumps(mutated) + "\n")
        try:
            _, done = read_journal(journal.path, header, cases)
        except UserError:
            return
        (got,) = done.values()
        assert got.case == next(c for c in cases if c.id == got.case_id)
        reread = json.loads(json.dumps(clean_json(got.to_dict())))
        found = get_at(reread, target)
        assert found is not MISSING and norm(found) == norm(value), (target, value, found)

    check()


CONFIG_KEYS = [
    ("verdict", "headroom_factor"),
    ("verdict", "headroom_step"),
    ("verdict", "improvement_factor"),
    ("perf", "alpha"),
    ("perf", "rounds"),
    ("perf", "confirm_rounds"),
    ("perf", "calls_per_round"),
    ("perf", "regression_pct"),
    ("perf", "max_noise_pct"),
    ("perf", "noise_k"),
    ("perf", "min_rounds"),
    ("tolerance", "mult_dq"),
    ("tolerance", "fp32_factor"),
    ("isolation", "case_timeout_s"),
    ("isolation", "timeout_s_per_gflop"),
    ("cpu", "kernel"),
    ("cpu", "suite"),
]
CONFIG_VALUES = st.one_of(
    st.sampled_from(
        [
            "nan",
            "inf",
            "-inf",
            "-1",
            "0",
            "1e308",
            "1e-300",
            '"x"',
            "[]",
            "{}",
            "true",
            "1000000000",
            "3",
            "0.5",
            "1.5",
            "10",
            '"sdpa-cpu"',
            '"fz"',
        ]
    ),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.integers(min_value=-(10**6), max_value=10**12).map(str),
)


def test_oracle_config_values(tmp_path):
    """A setting the config accepts is the setting in force: refused (exit 2, one line) or read
    as written, never clamped, dropped or defaulted; and every accepted number is in its range."""
    from gate.core.config import RANGES, load_config
    from gate.core.errors import UserError

    @ORACLE_SETTINGS
    @given(st.sampled_from(CONFIG_KEYS), CONFIG_VALUES)
    def check(key, value):
        section, name = key
        path = tmp_path / "fuzzed.toml"
        path.write_text(f"[tool.attn-gate.{section}]\n{name} = {value}\n{SUITE}")
        try:
            config = load_config(path)
        except UserError as exc:
            assert "\n" not in str(exc) and str(path) in str(exc)
            return
        got = getattr(getattr(config, section), name)
        assert norm(got) == norm(tomllib.loads(f"v = {value}")["v"]), (key, value, got)
        bounds = RANGES.get(f"{section}.{name}")
        assert bounds is None or got in bounds, (key, value)

    check()
