"""scripts/speed_rule_benchmark.py runs end to end on a CPU with a tiny timing plan: a benchmark is
not a unit test of speed (its figures live in docs/results/), but the script must not rot between
the runs that produce them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("speed_rule_benchmark", ROOT / "scripts" / "speed_rule_benchmark.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_one_trial_of_each_kind_is_judged(tmp_path, capsys):
    config = tmp_path / "pyproject.toml"
    config.write_text(
        "[tool.attn-gate.perf]\nrounds = 3\nmin_rounds = 3\nconfirm_rounds = 3\ncalls_per_round = 1\nwarmup_s = 0\n"
    )
    rc = _script().main(["--trials", "1", "--config", str(config), "--case", "^bf16-b2-h4-s256-d64-causal$"])
    out = capsys.readouterr().out
    assert rc in (0, 1)  # the verdicts of three rounds on a loaded CPU are not the point here
    assert "A/A: FAIL " in out and "bwd +200%: FAIL " in out
    assert "Traceback" not in out
