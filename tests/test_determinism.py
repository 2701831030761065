"""Determinism, race and batch-invariance checks: each catches its planted bug, the correct
kernel passes, and they are wired into suites, the sweep, the CLI and the validation note."""

from __future__ import annotations

import pytest

from gate.core.cases import Case, expand_suite, load_suite
from gate.core.config import Config, ToleranceConfig
from gate.core.errors import UserError
from gate.core.results import Status
from gate.correctness.probes.determinism import batch_invariance_check, determinism_check, race_check
from gate.correctness.probes.registry import CHECKS, checks_for, parse_names
from gate.correctness.run_case import run_case
from gate.kernels.registry import get_adapter
from gate.kernels.tiled import TiledAdapter
from tests.depth_kernels import BatchCoupledTiled, RacyTiled, RacyTiledNoClaim

TOL = ToleranceConfig()
DENSE = Case.build(
    batch=2,
    seqlen_q=48,
    seqlen_k=70,
    heads_q=4,
    heads_kv=2,
    head_dim=32,
    head_dim_v=32,
    dtype="bf16",
    causal=True,
    seeds=(0,),
)
VARLEN = Case.build(
    batch=3,
    seqlen_q=40,
    seqlen_k=40,
    heads_q=2,
    heads_kv=1,
    head_dim=32,
    head_dim_v=32,
    dtype="fp16",
    varlen=(0, 40, 23),
    seeds=(0,),
)


def _check(results, name):
    found = [c for c in results if c.name == name]
    assert len(found) == 1, results
    return found[0]


@pytest.mark.parametrize("case", [DENSE, VARLEN], ids=["dense", "varlen"])
def test_tiled_is_bit_reproducible_and_batch_invariant(case):
    tiled = TiledAdapter()
    det = _check(determinism_check(tiled, case, "cpu"), "determinism")
    assert det.passed is True and det.value == 0.0, det
    assert "10 runs" in det.detail
    race = _check(race_check(tiled, case, "cpu", runs=3), "race")
    assert race.passed is True and "batch x4" in race.detail, race
    inv = _check(batch_invariance_check(tiled, case, "cpu"), "batch_invariance")
    assert inv.passed is True and "out, lse, dq, dk, dv" in inv.detail, inv


def test_racy_kernel_passes_the_error_ratio_but_fails_determinism():
    case = DENSE
    plain = run_case(RacyTiled(), case, "cpu", TOL)
    assert plain.status is Status.PASS, plain.reason  # a last-bit race is invisible to the ratio
    checked = run_case(RacyTiled(), case, "cpu", TOL, checks_for(case, ("determinism",)))
    assert checked.status is Status.FAIL
    det = _check(checked.checks, "determinism")
    assert det.passed is False and det.value >= 1 and "dq" in det.detail, det
    assert "determinism: not bit-identical" in checked.reason
    race = _check(race_check(RacyTiled(), case, "cpu", runs=3), "race")
    assert race.passed is False


def test_kernel_without_a_deterministic_mode_gets_its_spread_reported_not_judged():
    det = _check(determinism_check(RacyTiledNoClaim(), DENSE, "cpu", runs=4), "determinism")
    assert det.passed is None and det.value > 0, det
    assert "information" in det.detail and "dq" in det.detail
    # dq is not bit-reproducible, so batch invariance judges only the other tensors
    inv = _check(batch_invariance_check(RacyTiledNoClaim(), DENSE, "cpu"), "batch_invariance")
    assert inv.passed is True and "not judged" in inv.detail and "dq (" in inv.detail, inv


def test_batch_coupled_kernel_fails_batch_invariance():
    plain = run_case(BatchCoupledTiled(), DENSE, "cpu", TOL)
    assert plain.status is Status.PASS, plain.reason  # a few ulps: inside the error bound
    checked = run_case(BatchCoupledTiled(), DENSE, "cpu", TOL, checks_for(DENSE, ("batch_invariance",)))
    assert checked.status is Status.FAIL
    inv = _check(checked.checks, "batch_invariance")
    assert inv.passed is False and inv.value > 0 and "depends on its neighbours" in inv.detail, inv
    varlen = _check(batch_invariance_check(BatchCoupledTiled(), VARLEN, "cpu"), "batch_invariance")
    assert varlen.passed is False


def test_batch_of_one_is_widened_to_two_for_invariance():
    single = Case.build(
        batch=1, seqlen_q=20, seqlen_k=20, heads_q=2, heads_kv=2, head_dim=16, head_dim_v=16, dtype="fp32", seeds=(0,)
    )
    assert _check(batch_invariance_check(BatchCoupledTiled(), single, "cpu"), "batch_invariance").passed is False
    lone = Case.build(
        batch=2,
        seqlen_q=9,
        seqlen_k=9,
        heads_q=2,
        heads_kv=2,
        head_dim=16,
        head_dim_v=16,
        dtype="fp32",
        varlen=(0, 9),
        seeds=(0,),
    )
    assert _check(batch_invariance_check(TiledAdapter(), lone, "cpu"), "batch_invariance").passed is None


@pytest.mark.parametrize("kernel", ["sdpa-cpu", "sdpa-math"])
def test_torch_cpu_kernels(kernel):
    adapter = get_adapter(kernel)
    det = _check(determinism_check(adapter, DENSE, "cpu", runs=3), "determinism")
    # sdpa-cpu claims a mode (torch.use_deterministic_algorithms); sdpa-math does not: spread only
    assert det.passed is (True if kernel == "sdpa-cpu" else None), det
    assert _check(batch_invariance_check(adapter, DENSE, "cpu"), "batch_invariance").passed is True


# ---------------------------------------------------------------- wiring


def _mini_spec(**extra):
    block = {"dtype": ["bf16"], "seqlens": ["33"], "heads": ["2"], "head_dims": ["16"], "causal": [True]}
    block.update(extra)
    return {"seeds": [0], "matrix": [block]}


def test_checks_axis_sets_case_checks_without_changing_ids():
    plain = expand_suite("mini", _mini_spec(), "test")
    checked = expand_suite("mini", _mini_spec(checks=[["determinism", "batch_invariance"]]), "test")
    assert [c.id for c in plain.cases] == [c.id for c in checked.cases]
    assert checked.cases[0].checks == ("determinism", "batch_invariance")
    assert "checks" not in plain.cases[0].hash_dict()  # the suite hash is unchanged without checks
    assert Case.from_dict(checked.cases[0].to_dict()) == checked.cases[0]
    # the same problem twice: one case, running the checks of both copies
    spec = {
        "seeds": [0],
        "matrix": [_mini_spec(checks=[["dropout"]])["matrix"][0], _mini_spec(checks=[["determinism"]])["matrix"][0]],
    }
    merged = expand_suite("mini", spec, "test")
    assert len(merged.cases) == 1 and merged.cases[0].checks == ("dropout", "determinism")


@pytest.mark.parametrize("bad", [[["nope"]], [["determinism", 3]], ["determinism"]])
def test_bad_checks_axis_is_a_user_error(bad):
    with pytest.raises(UserError, match="check"):
        expand_suite("mini", _mini_spec(checks=bad), "pyproject.toml")


def test_parse_names():
    assert parse_names("determinism, dropout,determinism") == ("determinism", "dropout")
    assert parse_names(None) == ()
    with pytest.raises(UserError, match="--checks 'determinsm'.*known checks"):
        parse_names("determinsm")
    assert set(CHECKS) == {"determinism", "race", "batch_invariance", "dropout"}


def test_shipped_suites_turn_checks_on():
    # smoke is left as it is: the committed CPU baseline is pinned to its hash
    for name in ("pr", "nightly"):
        enabled = {c for case in load_suite(name).cases for c in case.checks}
        assert {"determinism", "batch_invariance", "dropout"} <= enabled, (name, enabled)
    assert "race" in {c for case in load_suite("nightly").cases for c in case.checks}


@pytest.mark.slow
def test_sweep_and_cli_run_checks_and_the_note_shows_them(tmp_path, monkeypatch):
    from gate.commands.main import main
    from gate.report.sweep_report import validation_note
    from gate.workflow import sweep as sweep_mod

    config = Config(suites={"mini": _mini_spec()})
    good = sweep_mod.run_sweep("tiled", "mini", config, "cpu", progress=False, check_names=("determinism",))
    assert good.passed and all(c.checks and c.checks[0].passed is True for c in good.cases)
    note = validation_note(good)
    assert "## Further checks" in note and "| determinism | yes |" in note
    assert any("extra checks on every case: determinism" in n for n in good.notes)

    bad = sweep_mod.run_sweep(
        "racy", "mini", config, "cpu", progress=False, check_names=("determinism",), adapter=RacyTiled()
    )
    assert not bad.passed and "| determinism | **NO** |" in validation_note(bad)

    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        "[tool.attn-gate.suites.mini]\nseeds = [0]\n[[tool.attn-gate.suites.mini.matrix]]\n"
        'dtype = ["bf16"]\nseqlens = ["33"]\nheads = ["2"]\nhead_dims = ["16"]\nchecks = [["batch_invariance"]]\n'
    )
    args = [
        "sweep",
        "--kernel",
        "tiled",
        "--suite",
        "mini",
        "--device",
        "cpu",
        "--config",
        str(pyproject),
        "--out",
        str(tmp_path / "out"),
        "--no-progress",
    ]
    assert main(args + ["--checks", "determinism"]) == 0
    text = (tmp_path / "out" / "validation-tiled-mini.md").read_text()
    assert "batch_invariance" in text and "determinism" in text
    assert main(args + ["--checks", "bogus"]) == 2
