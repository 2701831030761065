"""[tool.attn-gate]: typed, validated, unknown keys are errors that name the file and the key."""

from __future__ import annotations

import pytest

from gate.core.config import Config, ToleranceConfig, load_config, supports_table
from gate.core.errors import UserError
from tests.conftest import ROOT


def write(tmp_path, body: str, name="attn.toml"):
    path = tmp_path / name
    path.write_text(body)
    return path


def error_of(path) -> str:
    with pytest.raises(UserError) as err:
        load_config(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message, message
    return message


def test_the_projects_own_pyproject_loads():
    config = load_config(ROOT / "pyproject.toml")
    assert config.source.endswith("pyproject.toml")
    assert config.cpu.kernel and config.cpu.suite and config.gpu.kernel


def test_a_supports_table_header_reads_back_as_that_kernels_table(tmp_path):
    """The header printed in advice is the one the config reads: a name that is no bare TOML key
    (a function, a dotted family name) is quoted."""
    for kernel in ("fa2", "my-attn", "pkg.mod:attn", "my.family"):
        path = tmp_path / "pyproject.toml"
        family = (
            "" if ":" in kernel else f'{supports_table(kernel).replace(".supports]", "]")}\ndense = "pkg.mod:attn"\n'
        )
        path.write_text(f"{supports_table(kernel)}\ngqa = false\n{family}")
        assert load_config(path).kernels[kernel].supports == {"gqa": False}, kernel
    assert supports_table("fa2") == "[tool.attn-gate.kernels.fa2.supports]"
    # an error in a dotted family's table names that table as TOML reads it
    path.write_text('[tool.attn-gate.kernels."my.family"]\ndense = "pkg.mod:attn"\nvarlenn = "x:y"\n')
    assert ".kernels.\"my.family\": unknown key 'varlenn'" in error_of(path)


def test_no_section_means_defaults(tmp_path):
    config = load_config(write(tmp_path, "[project]\nname = 'x'\n"))
    assert (config.tolerance, config.cpu, config.gpu, config.suites) == (
        Config().tolerance,
        Config().cpu,
        Config().gpu,
        {},
    )


def test_values_are_read_and_ints_widen_to_floats(tmp_path):
    config = load_config(
        write(
            tmp_path,
            """
[tool.attn-gate.tolerance]
mult_dk = 3
fp32_factor = 2.5
[tool.attn-gate.cpu]
kernel = "tiled"
""",
        )
    )
    assert config.tolerance.mult_dk == 3.0 and isinstance(config.tolerance.mult_dk, float)
    assert config.tolerance.mult("dk", "fp32") == 7.5 and config.tolerance.mult("dk", "bf16") == 3.0
    assert config.tolerance.mult_dq == ToleranceConfig().mult_dq
    assert (config.cpu.kernel, config.cpu.suite) == ("tiled", Config().cpu.suite)  # the profile merges


@pytest.mark.parametrize(
    "body, words",
    [
        ("[tool.attn-gate]\ntolerence = 1\n", "[tool.attn-gate]: unknown key 'tolerence'"),
        ("[tool.attn-gate.tolerance]\nmult_dK = 2.0\n", "[tool.attn-gate].tolerance: unknown key 'mult_dK'"),
        ("[tool.attn-gate.tolerance]\nmult_dk = '2'\n", "[tool.attn-gate].tolerance: mult_dk = '2' should be a float"),
        ("[tool.attn-gate.tolerance]\nmult_dk = true\n", "mult_dk = True should be a float"),
        (
            "[tool.attn-gate.tolerance]\nmult_dk = -1.0\n",
            "[tool.attn-gate].tolerance: mult_dk = -1.0 must be a number in (0, 100]",
        ),
        ("[tool.attn-gate.tolerance]\nmult_dq = 0\n", "mult_dq = 0.0 must be a number in (0, 100]"),
        ("[tool.attn-gate.tolerance]\nfp32_factor = nan\n", "fp32_factor = nan must be a number in (0, 100]"),
        ("[tool.attn-gate.tolerance]\nmult_out = inf\n", "mult_out = inf must be a number in (0, 100]"),
        ("[tool.attn-gate]\ntolerance = 2\n", "[tool.attn-gate].tolerance: expected a table"),
        ("[tool.attn-gate.cpu]\nkernel = 3\n", "[tool.attn-gate].cpu: kernel = 3 should be a str"),
        ("[tool.attn-gate.cpu]\nsuit = 'smoke'\n", "[tool.attn-gate].cpu: unknown key 'suit'"),
        (
            "[tool.attn-gate.verdict]\nheadroom_factor = 'big'\n",
            "[tool.attn-gate].verdict: headroom_factor = 'big' should be a float",
        ),
        ("[tool.attn-gate.perf]\nrounds = 1.5\n", "[tool.attn-gate].perf: rounds = 1.5 should be a int"),
        ("[tool.attn-gate.perf]\ncold_l2 = 1\n", "cold_l2 = 1 should be a bool"),
        # a fallback anchor that may refuse too would need a fallback of its own: only matmul or none
        (
            "[tool.attn-gate.perf]\nanchor_fallback = 'sdpa-flash'\n",
            "[tool.attn-gate].perf: anchor_fallback = 'sdpa-flash' must be \"matmul\"",
        ),
        ("[tool.attn-gate.perf]\nanchor_fallback = 'none'\n", "anchor_fallback = 'none' must be \"matmul\""),
        ("[tool.attn-gate]\nbaselines_dir = 3\n", "baselines_dir should be a path string"),
        ("[tool.attn-gate]\nsuites = 3\n", "[tool.attn-gate].suites: expected tables"),
        ("[tool.attn-gate.suites]\nmine = 3\n", "[tool.attn-gate.suites.mine]: expected a table"),
        ("[tool.attn-gate]\nbroken = [\n", "invalid TOML"),
    ],
)
def test_bad_config_names_file_and_key(tmp_path, body, words):
    assert words in error_of(write(tmp_path, body))


MINE = """
[tool.attn-gate.suites.mine]
seeds = [0]
[[tool.attn-gate.suites.mine.matrix]]
dtype = ["bf16"]
seqlens = ["64"]
[[tool.attn-gate.suites.mine.matrix]]
{line}
"""


@pytest.mark.parametrize(
    "line, words",
    [
        ('heads = ["6/4"]', "heads_q 6 is not a multiple of heads_kv 4"),
        ('causal = ["yes"]', "axis 'causal' value 'yes' should be true or false"),
        ('sequence = ["64"]', "unknown matrix axis 'sequence'"),
        ("varlen = [[]]", "varlen value []"),
    ],
)
def test_an_invalid_suite_matrix_fails_at_load_naming_file_suite_block_and_axis(tmp_path, line, words):
    """Checked when the config is read, whichever suite is then run: a broken suite is never
    noticed only on the day someone runs it."""
    message = error_of(write(tmp_path, MINE.format(line=line)))
    assert "[tool.attn-gate.suites.mine] matrix[1]: " in message and words in message


def test_a_valid_suite_override_is_kept(tmp_path):
    config = load_config(write(tmp_path, MINE.format(line="causal = [true]")))
    assert list(config.suites) == ["mine"]


def test_a_missing_config_file_is_an_error_but_a_missing_default_is_not(tmp_path, monkeypatch):
    with pytest.raises(UserError, match="--config .*nope.toml: no such file"):
        load_config(tmp_path / "nope.toml")
    monkeypatch.chdir(tmp_path)
    assert load_config() == Config()


def test_tolerance_changes_counts_a_missing_multiplier_at_its_default():
    """A baseline written before a tensor's multiplier existed compares equal at that default, and
    unequal as soon as the configured value differs from it."""
    from gate.compare.comparable import tolerance_changes
    from gate.core.config import ToleranceConfig

    now = ToleranceConfig().as_dict()
    old = {k: v for k, v in now.items() if k != "mult_dsink"}
    assert tolerance_changes(old, now) == []
    assert tolerance_changes(old, {**now, "mult_dsink": 5.0}) == ["mult_dsink"]
    assert tolerance_changes(now, {**now, "mult_dk": 2.5}) == ["mult_dk"]


@pytest.mark.parametrize(
    "body, words",
    [
        ("tool = 5\n", "tool = 5 should be a table"),
        ("tool = [1, 2]\n", "tool = [1, 2] should be a table"),
        ("[tool]\nattn-gate = 5\n", "attn-gate = 5 should be a table"),
        ("[tool]\nattn-gate = [1]\n", "attn-gate = [1] should be a table"),
    ],
)
def test_a_tool_table_of_the_wrong_type_is_one_line(tmp_path, body, words):
    assert words in error_of(write(tmp_path, body))


def test_a_binary_config_file_is_invalid_toml_not_a_traceback(tmp_path):
    path = tmp_path / "attn.toml"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00binary")
    assert "invalid TOML" in error_of(path)


@pytest.mark.parametrize(
    "key, value",
    [
        ("verdict", "headroom_factor = 1e308"),
        ("verdict", "headroom_step = 1e308"),
        ("verdict", "headroom_step = 1.0"),
        ("verdict", "improvement_factor = 1e308"),
        ("perf", "rounds = 1000000000"),
        ("perf", "confirm_rounds = 1000000000"),
        ("perf", "calls_per_round = 1000000000"),
        ("perf", "min_rounds = 1000000000"),
        ("perf", "regression_pct = 1e308"),
        ("perf", "noise_k = 1e308"),
        ("perf", "max_noise_pct = 1e308"),
        ("perf", "alpha = 1e-300"),
        ("perf", "warmup_s = 1e9"),
        ("isolation", "case_timeout_s = 1e308"),
        ("isolation", "worker_start_timeout_s = 1e308"),
        ("isolation", "timeout_s_per_gflop = 1e308"),
    ],
)
def test_a_setting_beyond_its_upper_bound_is_refused_with_its_range(tmp_path, key, value):
    """A threshold of 1e308 is never exceeded (its rule is off) and a count of 1e9 hangs the run."""
    from gate.core.config import RANGES

    name = value.split(" = ")[0]
    message = error_of(write(tmp_path, f"[tool.attn-gate.{key}]\n{value}\n"))
    assert f"{name} = " in message and RANGES[f"{key}.{name}"].text() in message, message


def test_the_settings_tables_of_the_docs_are_generated_from_the_declarations():
    """docs/configuration.md's settings and ranges tables are what scripts/settings_doc.py writes."""
    from gate.core.settings_doc import render

    page = (ROOT / "docs" / "configuration.md").read_text()
    assert render(page) == page, "docs/configuration.md is out of date: run python scripts/settings_doc.py"


def test_a_drifted_settings_table_is_rewritten_and_a_missing_one_refused():
    from gate.core.config import SETTINGS
    from gate.core.settings_doc import render

    page = (ROOT / "docs" / "configuration.md").read_text()
    meaning = SETTINGS["perf.regression_pct"].meaning
    drifted = page.replace(meaning, "FAIL whenever it likes", 1)
    assert drifted != page and render(drifted) == page
    bound = "| `verdict.headroom_factor` | a number in (1, 10] |"
    assert bound in page and render(page.replace(bound, "| `verdict.headroom_factor` | a number in (1, 1e9] |")) == page
    with pytest.raises(ValueError, match="begin ranges table"):
        render(page.replace("<!-- begin ranges table -->", ""))


def test_every_setting_is_in_the_generated_tables_with_its_default_and_range():
    from gate.core.config import SECTIONS, SETTINGS

    page = (ROOT / "docs" / "configuration.md").read_text()
    for key, declared in SETTINGS.items():
        section, name = key.split(".")
        default = getattr(SECTIONS[section](), name)
        shown = ("true" if default else "false") if isinstance(default, bool) else repr(default).replace("'", '"')
        assert f"| `{key}` | `{shown}` | {declared.unit} | {declared.meaning} |" in page, key
        if declared.range is not None:
            assert f"| `{key}` | {declared.range.text()} | {declared.why} |" in page, key


def test_every_numeric_setting_has_a_range_and_every_field_a_meaning():
    """A new field without its declaration is neither checked nor documented: refuse it here."""
    import dataclasses

    from gate.core.config import SECTIONS, SETTINGS

    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            declared = SETTINGS.get(f"{section}.{f.name}")
            assert declared is not None and declared.meaning, f"{section}.{f.name} declares no meaning"
            numeric = f.type in ("float", "int", float, int)
            assert (declared.range is not None) == numeric, f"{section}.{f.name}: range iff numeric"


def test_a_declaration_with_a_range_needs_its_reason():
    import re

    from gate.core.config import Range, Setting

    Setting("m", "%", Range(0, 1), "why")
    with pytest.raises(ValueError, match="a range needs its why"):
        Setting("m", "%", Range(0, 1))
    with pytest.raises(ValueError, match=re.escape("no '|'")):
        Setting("a | b")


def test_the_toml_example_of_the_docs_holds_the_defaults():
    """The example at the top of docs/configuration.md says its values are the defaults."""
    import re
    import tomllib

    from gate.core.config import SECTIONS

    page = (ROOT / "docs" / "configuration.md").read_text()
    example = tomllib.loads(re.search(r"```toml\n(.*?)```", page, re.S).group(1))["tool"]["attn-gate"]
    shown = [(s, k, v) for s in SECTIONS for k, v in example.get(s, {}).items()]
    assert len(shown) >= 10
    for section, key, value in shown:
        assert getattr(SECTIONS[section](), key) == value, f"{section}.{key}"


def test_the_defaults_and_the_ends_of_each_range_are_accepted(tmp_path):
    from gate.core.config import RANGES

    for key, bounds in RANGES.items():
        section, name = key.split(".")
        for value in (bounds.hi, bounds.lo if not bounds.lo_open else None):
            if value is None:
                continue
            text = str(int(value)) if bounds.integer else repr(float(value))
            load_config(write(tmp_path, f"[tool.attn-gate.{section}]\n{name} = {text}\n"))


def test_a_version_of_5000_digits_in_known_failures_is_one_line(tmp_path):
    body = (
        '[[tool.attn-gate.known_failures]]\nkernel = "sdpa-*"\ncases = "causal"\nreason = "r"\n'
        f'link = "https://example.org/1"\nversions = "=={"9" * 5000}"\n'
    )
    assert "is not a PEP 440 specifier" in error_of(write(tmp_path, body))


def test_a_version_of_5000_digits_in_a_run_does_not_apply():
    from gate.compare.known import version_applies
    from gate.core.config import KnownFailure

    entry = KnownFailure(index=1, kernel="k", cases="c", reason="r", link="https://x", versions=">=1")
    assert version_applies(entry, "9" * 5000) is False


@pytest.mark.parametrize(
    "cases",
    ["(a+)+$", "(a|a)*$", "(x+x+)+y", ".*.*.*.*x", "(a)\\\\1", "a" * 100_001],
    ids=["nested", "alternation", "nested2", "side-by-side", "backreference", "too-long"],
)
def test_a_known_failure_regex_that_can_backtrack_without_bound_is_refused(tmp_path, cases):
    body = (
        f'[[tool.attn-gate.known_failures]]\nkernel = "sdpa-*"\ncases = "{cases}"\nreason = "r"\n'
        f'link = "https://example.org/1"\n'
    )
    assert "cases = " in error_of(write(tmp_path, body))
