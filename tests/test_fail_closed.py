"""Paths that must fail closed: a kernel calling sys.exit, thresholds that would switch a rule off,
a user function without the `causal` keyword."""

import math

import pytest

from gate.core.cases import Case
from gate.commands.main import main
from gate.core.config import PerfConfig, ToleranceConfig, VerdictConfig, load_config
from gate.correctness.run_case import run_case
from gate.core.errors import UserError
from gate.kernels.user import UserAdapter
from gate.core.results import Status

CASE = Case.build(batch=1, seqlen_q=16, seqlen_k=16, heads_q=2, heads_kv=2, head_dim=16, head_dim_v=16, dtype="bf16", seeds=(0,))


@pytest.mark.parametrize("fn", ["exits_zero", "exits_one"])
def test_a_kernel_calling_sys_exit_is_an_error_row(fn):
    result = run_case(UserAdapter(f"tests.exiting_kernels:{fn}"), CASE, "cpu", ToleranceConfig())
    assert result.status is Status.ERROR and "SystemExit" in result.reason


@pytest.mark.slow
def test_sweep_with_a_kernel_calling_sys_exit_zero_exits_one(tmp_path, capsys):
    rc = main(["sweep", "--kernel", "tests.exiting_kernels:exits_zero", "--suite", "smoke", "--device", "cpu",
               "--only", "^bf16-b2-h4-s128-d64$", "--out", str(tmp_path), "--no-progress"])
    assert rc == 1


def test_a_command_cut_short_by_system_exit_fails(monkeypatch, capsys):
    import gate.commands.listing as listing

    def bail(args):
        raise SystemExit(0)

    monkeypatch.setattr(listing, "kernels", bail)
    assert main(["kernels"]) == 1
    assert "SystemExit" in capsys.readouterr().err
    monkeypatch.undo()
    assert main(["kernels"]) == 0


@pytest.mark.parametrize(("section", "kwargs"), [
    (VerdictConfig, {"headroom_factor": math.nan}), (VerdictConfig, {"headroom_factor": 1.0}),
    (VerdictConfig, {"headroom_step": -0.1}), (VerdictConfig, {"improvement_factor": math.inf}),
    (PerfConfig, {"regression_pct": math.inf}), (PerfConfig, {"regression_pct": 0.0}), (PerfConfig, {"alpha": 0.0}),
    (PerfConfig, {"alpha": 1.0}), (PerfConfig, {"max_noise_pct": math.nan}), (PerfConfig, {"min_rounds": 0}),
    (PerfConfig, {"calls_per_round": 0}),
])
def test_thresholds_that_would_switch_a_rule_off_are_refused(section, kwargs):
    with pytest.raises(ValueError):
        section(**kwargs)
    section()  # the defaults are valid


def test_a_nan_threshold_in_pyproject_is_a_usage_error(tmp_path):
    path = tmp_path / "pyproject.toml"
    path.write_text("[tool.attn-gate.verdict]\nheadroom_factor = nan\n")
    with pytest.raises(UserError, match=r"headroom_factor = nan must be a finite number > 1"):
        load_config(path)
    path.write_text("[tool.attn-gate.verdict]\nheadroom_factor = 1.5\n")
    assert load_config(path).verdict.headroom_factor == 1.5


def test_user_kernel_without_causal_keyword_runs_non_causal_cases(tmp_path, monkeypatch):
    (tmp_path / "nocausal.py").write_text(
        "import torch.nn.functional as F\n"
        "def attn(q, k, v, softmax_scale=None):\n"
        "    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=softmax_scale)\n"
        "    return o.transpose(1, 2)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    adapter = UserAdapter("nocausal:attn")
    assert run_case(adapter, CASE, "cpu", ToleranceConfig()).status is Status.PASS
    causal = run_case(adapter, CASE.with_fields(causal=True, seeds=(0,)), "cpu", ToleranceConfig())
    assert causal.status is Status.SKIP and "causal" in causal.reason
