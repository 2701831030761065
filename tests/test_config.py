"""[tool.attn-gate]: typed, validated, unknown keys are errors that name the file and the key."""

from __future__ import annotations

import pytest

from gate.core.config import Config, ToleranceConfig, load_config
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


def test_no_section_means_defaults(tmp_path):
    config = load_config(write(tmp_path, "[project]\nname = 'x'\n"))
    assert (config.tolerance, config.cpu, config.gpu, config.suites) == (Config().tolerance, Config().cpu, Config().gpu, {})


def test_values_are_read_and_ints_widen_to_floats(tmp_path):
    config = load_config(write(tmp_path, """
[tool.attn-gate.tolerance]
mult_dk = 3
fp32_factor = 2.5
[tool.attn-gate.cpu]
kernel = "tiled"
"""))
    assert config.tolerance.mult_dk == 3.0 and isinstance(config.tolerance.mult_dk, float)
    assert config.tolerance.mult("dk", "fp32") == 7.5 and config.tolerance.mult("dk", "bf16") == 3.0
    assert config.tolerance.mult_dq == ToleranceConfig().mult_dq
    assert (config.cpu.kernel, config.cpu.suite) == ("tiled", Config().cpu.suite)  # the profile merges


@pytest.mark.parametrize("body, words", [
    ("[tool.attn-gate]\ntolerence = 1\n", "[tool.attn-gate]: unknown key 'tolerence'"),
    ("[tool.attn-gate.tolerance]\nmult_dK = 2.0\n", "[tool.attn-gate].tolerance: unknown key 'mult_dK'"),
    ("[tool.attn-gate.tolerance]\nmult_dk = '2'\n", "[tool.attn-gate].tolerance: mult_dk = '2' should be a float"),
    ("[tool.attn-gate.tolerance]\nmult_dk = true\n", "mult_dk = True should be a float"),
    ("[tool.attn-gate.tolerance]\nmult_dk = -1.0\n", "[tool.attn-gate].tolerance: mult_dk = -1.0 must be a positive finite number"),
    ("[tool.attn-gate.tolerance]\nmult_dq = 0\n", "mult_dq = 0.0 must be a positive finite number"),
    ("[tool.attn-gate.tolerance]\nfp32_factor = nan\n", "fp32_factor = nan must be a positive finite number"),
    ("[tool.attn-gate.tolerance]\nmult_out = inf\n", "mult_out = inf must be a positive finite number"),
    ("[tool.attn-gate]\ntolerance = 2\n", "[tool.attn-gate].tolerance: expected a table"),
    ("[tool.attn-gate.cpu]\nkernel = 3\n", "[tool.attn-gate].cpu: kernel = 3 should be a str"),
    ("[tool.attn-gate.cpu]\nsuit = 'smoke'\n", "[tool.attn-gate].cpu: unknown key 'suit'"),
    ("[tool.attn-gate.verdict]\nheadroom_factor = 'big'\n", "[tool.attn-gate].verdict: headroom_factor = 'big' should be a float"),
    ("[tool.attn-gate.perf]\nrounds = 1.5\n", "[tool.attn-gate].perf: rounds = 1.5 should be a int"),
    ("[tool.attn-gate.perf]\ncold_l2 = 1\n", "cold_l2 = 1 should be a bool"),
    # a fallback anchor that may refuse too would need a fallback of its own: only matmul or none
    ("[tool.attn-gate.perf]\nanchor_fallback = 'sdpa-flash'\n", "[tool.attn-gate].perf: anchor_fallback = 'sdpa-flash' must be \"matmul\""),
    ("[tool.attn-gate.perf]\nanchor_fallback = 'none'\n", "anchor_fallback = 'none' must be \"matmul\""),
    ("[tool.attn-gate]\nbaselines_dir = 3\n", "baselines_dir should be a path string"),
    ("[tool.attn-gate]\nsuites = 3\n", "[tool.attn-gate].suites: expected tables"),
    ("[tool.attn-gate.suites]\nmine = 3\n", "[tool.attn-gate.suites.mine]: expected a table"),
    ("[tool.attn-gate]\nbroken = [\n", "invalid TOML"),
])
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


@pytest.mark.parametrize("line, words", [
    ('heads = ["6/4"]', "heads_q 6 is not a multiple of heads_kv 4"),
    ('causal = ["yes"]', "axis 'causal' value 'yes' should be true or false"),
    ('sequence = ["64"]', "unknown matrix axis 'sequence'"),
    ('varlen = [[]]', "varlen value []"),
])
def test_an_invalid_suite_matrix_fails_at_load_naming_file_suite_block_and_axis(tmp_path, line, words):
    """Checked when the config is read, whichever suite is then run: a broken suite is never
    noticed only on the day someone runs it."""
    message = error_of(write(tmp_path, MINE.format(line=line)))
    assert "[tool.attn-gate.suites.mine] matrix[1]: " in message and words in message


def test_a_valid_suite_override_is_kept(tmp_path):
    config = load_config(write(tmp_path, MINE.format(line='causal = [true]')))
    assert list(config.suites) == ["mine"]


def test_a_missing_config_file_is_an_error_but_a_missing_default_is_not(tmp_path, monkeypatch):
    with pytest.raises(UserError, match="--config .*nope.toml: no such file"):
        load_config(tmp_path / "nope.toml")
    monkeypatch.chdir(tmp_path)
    assert load_config() == Config()


def test_tolerance_changes_counts_a_missing_multiplier_at_its_default():
    """A baseline written before a tensor's multiplier existed compares equal at that default, and
    unequal as soon as the configured value differs from it."""
    from gate.core.config import ToleranceConfig, tolerance_changes

    now = ToleranceConfig().as_dict()
    old = {k: v for k, v in now.items() if k != "mult_dsink"}
    assert tolerance_changes(old, now) == []
    assert tolerance_changes(old, {**now, "mult_dsink": 5.0}) == ["mult_dsink"]
    assert tolerance_changes(now, {**now, "mult_dk": 2.5}) == ["mult_dk"]
