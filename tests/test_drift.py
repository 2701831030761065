"""Training drift: the band and the judgement as tables; end to end on CPU, the correct kernel
(tiled) stays inside the band and a kernel whose backward halves dQ/dK leaves it; the command
writes JSON + PNG and exits 0/1/2."""

from __future__ import annotations

import json
import math

import pytest

from gate.core.errors import UserError
from gate.correctness.drift import (
    REFERENCE,
    band,
    default_config,
    judge,
    moving_average,
    reference_curves,
    run_drift,
    write_drift_outputs,
)
from tests.depth_kernels import DriftingTiled


@pytest.mark.parametrize(
    ("values", "window", "expected"),
    [
        ([1.0, 2.0, 3.0, 4.0], 2, [1.0, 1.5, 2.5, 3.5]),
        ([1.0, 2.0, 3.0], 1, [1.0, 2.0, 3.0]),
        ([1.0, math.nan, 3.0, 5.0], 2, [1.0, math.nan, math.nan, 4.0]),
    ],
)
def test_moving_average(values, window, expected):
    got = moving_average(values, window)
    assert [("nan" if math.isnan(x) else x) for x in got] == [("nan" if math.isnan(x) else x) for x in expected]


def test_band_is_the_reference_spread_widened_plus_a_relative_floor():
    refs = [[2.0, 1.0], [2.2, 1.0]]
    lower, upper = band(refs, center=[2.0, 1.0], widen=1.0, rel_floor=0.01)
    assert lower == pytest.approx([2.0 - 0.2 - 0.02, 1.0 - 0.01])
    assert upper == pytest.approx([2.2 + 0.2 + 0.02, 1.0 + 0.01])


@pytest.mark.parametrize(
    ("kernel", "passed", "outside", "worst_step"),
    [
        ([1.0, 1.0, 1.0], True, 0, -1),
        ([1.0, 1.5, 0.4], False, 2, 2),
        ([1.0, math.nan, 1.0], False, 1, 1),  # a NaN loss is outside: fail closed
    ],
)
def test_judge(kernel, passed, outside, worst_step):
    j = judge(kernel, lower=[0.9, 0.9, 0.9], upper=[1.1, 1.1, 1.1])
    assert (j.passed, j.steps_outside, j.worst_step) == (passed, outside, worst_step)
    if not passed:
        assert f"worst at step {worst_step + 1}" in j.reason


def test_judge_refuses_a_curve_of_the_wrong_length():
    assert not judge([1.0], [0.0, 0.0], [2.0, 2.0]).passed


@pytest.fixture(scope="module")
def cpu_run():
    cfg = default_config("cpu")
    assert cfg.steps == 100
    refs = reference_curves(cfg, "cpu")
    return cfg, refs


@pytest.mark.slow
@pytest.mark.xdist_group("drift")
def test_correct_kernel_stays_inside_and_drifting_kernel_leaves_the_band(cpu_run, tmp_path):
    cfg, refs = cpu_run
    # the task is learned within the run: the band is tested on a real slope, not a plateau
    ref = moving_average(refs[REFERENCE], 10)
    assert ref[-1] < 0.8 * ref[9]
    good = run_drift("tiled", cfg, "cpu", references=refs)
    assert good.passed, good.reason
    assert good.steps_outside == 0 and good.worst_excess == 0.0
    bad = run_drift("drifting-tiled", cfg, "cpu", adapter=DriftingTiled(), references=refs)
    assert not bad.passed and bad.steps_outside > 0 and bad.worst_excess > 0, bad.reason
    paths = write_drift_outputs(bad, tmp_path)
    data = json.loads(paths["json"].read_text())
    assert data["schema_version"] == 1 and data["kind"] == "attn-gate drift" and data["passed"] is False
    assert set(data["curves"]) == set(refs) | {"kernel drifting-tiled"}
    assert len(data["lower"]) == len(data["upper"]) == cfg.steps
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.xdist_group("drift")
def test_kernel_that_raises_fails_the_run(cpu_run):
    cfg, refs = cpu_run

    class Broken(DriftingTiled):
        def __call__(self, call):
            raise RuntimeError("illegal memory access")

    result = run_drift("broken", cfg, "cpu", adapter=Broken(), references=refs)
    assert not result.passed and "RuntimeError: illegal memory access" in result.reason


@pytest.mark.slow
def test_drift_command_exit_codes(tmp_path, monkeypatch):
    from gate.commands.main import main

    out = tmp_path / "out"
    assert main(["drift", "--kernel", "sdpa-math", "--device", "cpu", "--steps", "12", "--out", str(out)]) == 0
    assert (out / "drift-sdpa-math.json").is_file() and (out / "drift-sdpa-math.png").is_file()
    assert main(["drift", "--kernel", "nope", "--device", "cpu", "--out", str(out)]) == 2
    assert main(["drift", "--kernel", "tiled", "--device", "cpu", "--steps", "1", "--out", str(out)]) == 2
    assert main(["drift", "--kernel", "sdpa-flash", "--device", "cpu", "--steps", "5", "--out", str(out)]) == 2
    import gate.kernels.registry as registry

    builtins = registry._builtins
    monkeypatch.setattr(registry, "_builtins", lambda: {**builtins(), "drifting": DriftingTiled})
    assert main(["drift", "--kernel", "drifting", "--device", "cpu", "--steps", "100", "--out", str(out)]) == 1
    with pytest.raises(UserError):
        default_config("cpu", dtype="fp8")


def test_judge_fails_closed_when_the_reference_band_diverged():
    """A NaN in the references makes the band NaN; that must not read as 'inside'."""
    lower, upper = band([[1.0, math.nan, 1.0], [1.0, 1.0, 1.0]], center=[1.0, math.nan, 1.0], widen=1.0, rel_floor=0.01)
    j = judge([1.0, 5.0, 1.0], lower, upper)
    assert not j.passed and j.steps_outside == 1 and j.worst_step == 1
    finite_lower, finite_upper = band(
        [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], center=[1.0, 1.0, 1.0], widen=1.0, rel_floor=0.01
    )
    assert judge([1.0, 1.0, 1.0], finite_lower, finite_upper).passed
