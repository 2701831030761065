"""Extreme magnitudes and crossings as smoke forms: rows whose every logit is below -5e4, +1e4 on the
first key, batch x heads past the CUDA grid's y limit, and three crossings of traits. Each form has
a planted bug (gate/correctness/planted.py, "extreme magnitudes and crossings") that FAILS it and
no case of the suite without the new forms; the correct CPU kernels pass every new form."""

from __future__ import annotations

import re

import pytest
import torch

from gate.attention.bias import FIRST_KEY_SPIKE, make_bias
from gate.attention.inputs import make_inputs
from gate.attention.reference import AttnOptions, attention_reference
from gate.core.cases import Case, load_suite
from gate.core.config import ToleranceConfig
from gate.core.results import Status
from gate.correctness.planted import (
    BUGS,
    FINITE_NEG_INF,
    GRID_Y_MAX,
    host_of,
    planted_adapter,
)
from gate.correctness.run_case import run_case
from gate.kernels.registry import get_adapter
from gate.kernels.tiled import TILE, TiledAdapter

TOL = ToleranceConfig()
SMOKE = load_suite("smoke").cases

# bug -> regex of the new smoke cases it must fail (and no other case of smoke)
NEW = {
    "finite_sentinel_-5e4": r"-bias\.sunk_rows",
    "running_max_step_clamped": r"-bias\.first_key$",
    "grid_y_overflow": r"^bf16-b16385-",
    "stride0_mask_d512_last_key": r"-d512-kv_stride0-bias\.bool_mask$",
    "varlen_sink_dv192_no_dsink": r"-d192-.*varlen.*-sinks$",
    "decode_split_lse_underflow": r"-s1x128-d64-shifted$",
    "batch_offsets_int32": r"-far_batch$",
}
NEW_FORMS = "|".join(f"(?:{p})" for p in NEW.values())
NEW_CASES = [c for c in SMOKE if re.search(NEW_FORMS, c.id)]
OLD_CASES = [c for c in SMOKE if not re.search(NEW_FORMS, c.id)]
# where sdpa-cpu cannot run a new form (tiled runs all of them)
SDPA_CPU_SKIPS = {"-d512-": "head_dim > 256", "-sinks": "no learnable sinks"}


def _bug(name: str):
    return next(b for b in BUGS if b.name == name)


def _planted(name: str):
    """The bug planted where the CPU selftest plants it: around sdpa-cpu, or in tiled."""
    bug, sdpa = _bug(name), get_adapter("sdpa-cpu")
    return planted_adapter(bug, sdpa if host_of(bug, sdpa) == "kernel" else TiledAdapter())


def _case(pattern: str) -> Case:
    return next(c for c in NEW_CASES if re.search(pattern, c.id))


def _status(adapter, case: Case) -> tuple[Status, str]:
    result = run_case(adapter, case.with_fields(seeds=(0,)), "cpu", TOL)
    return result.status, result.reason or ""


# ---------------------------------------------------------------- the forms and their values


def test_every_new_form_is_in_smoke_and_the_bugs_are_registered():
    for name, pattern in NEW.items():
        assert _bug(name) and [c for c in SMOKE if re.search(pattern, c.id)], (name, pattern)
    # the decode and far_batch forms in GQA and MHA, the grid form at d8 and d64 (and d64 causal)
    assert len(NEW_CASES) == 17
    grid = _case(NEW["grid_y_overflow"])
    assert grid.batch * grid.heads_q > GRID_Y_MAX
    cross = _case(NEW["stride0_mask_d512_last_key"])
    assert (cross.layout, cross.bias.kind, cross.head_dim, cross.seqlen_k % 32) == ("kv_stride0", "bool_mask", 512, 1)
    sinks = _case(NEW["varlen_sink_dv192_no_dsink"])
    assert sinks.entry.varlen and sinks.entry.sinks and sinks.head_dim_v == 192
    decode = _case(NEW["decode_split_lse_underflow"])
    assert (decode.seqlen_q, decode.seqlen_k, decode.head_dim, decode.inputs, decode.causal) == (
        1,
        128,
        64,
        "shifted",
        False,
    )


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_sunk_rows_put_every_logit_below_the_sentinel_and_the_reference_stays_exact(dtype):
    case = _case(r"^" + dtype + r"-.*-causal-bias\.sunk_rows")
    inputs = make_inputs(case, 0, "cpu")
    scores = torch.einsum("bqhd,bkhd->bhqk", inputs.q.double(), inputs.k.double()) * inputs.softmax_scale
    logits = scores + inputs.bias.double()
    sunk = torch.arange(case.seqlen_q) % 4 == 1
    assert logits[:, :, sunk].max() < FINITE_NEG_INF - 88 and logits[:, :, ~sunk].max() > 0
    opts = AttnOptions(softmax_scale=inputs.softmax_scale, causal=case.causal, bias=inputs.bias)
    ref = attention_reference(inputs.q, inputs.k, inputs.v, inputs.dout, opts, torch.float64, backward=False)
    assert torch.isfinite(ref.out).all() and ref.lse[:, :, sunk].max() < FINITE_NEG_INF
    assert ref.out[:, sunk].abs().amax(dim=-1).min() > 0  # rows with output, not empty ones


def test_first_key_tops_every_other_row_and_later_tiles_sit_far_below():
    case = _case(r"^bf16-.*-s64x200-d32-bias\.first_key")
    bias = make_bias(case, 0, "cpu", torch.float32)
    spiked = bias[:, :, 0::2]
    assert (spiked[..., 0] >= FIRST_KEY_SPIKE - 100).all()
    assert (spiked[..., 0] - spiked[..., TILE:].amax(dim=-1) > 1000).all()  # exp(m_old - m_new) overflows
    assert bias[:, :, 1::2, 0].abs().max() < 100  # the other rows are the dense bias


# ---------------------------------------------------------------- the correct kernels pass


@pytest.mark.parametrize("kernel", ["sdpa-cpu", "tiled"])
@pytest.mark.parametrize("case", NEW_CASES, ids=lambda c: c.id)
def test_correct_cpu_kernels_pass_every_new_form(kernel, case):
    result = run_case(get_adapter(kernel), case, "cpu", TOL)
    skip = next((why for part, why in SDPA_CPU_SKIPS.items() if part in case.id), None)
    if kernel == "sdpa-cpu" and skip:
        assert result.status is Status.SKIP and skip in result.reason
    else:
        assert result.status is Status.PASS, result.reason


# ---------------------------------------------------------------- each bug dies on its form only


@pytest.mark.parametrize("name", sorted(NEW))
def test_planted_bug_fails_its_new_forms(name):
    targets = [c for c in NEW_CASES if re.search(NEW[name], c.id)]
    for case in targets:
        status, reason = _status(_planted(name), case)
        assert status is Status.FAIL, (name, case.id, reason)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(NEW))
def test_planted_bug_passes_the_other_new_forms(name):
    for case in NEW_CASES:
        if not re.search(NEW[name], case.id):
            status, reason = _status(_planted(name), case)
            assert status in (Status.PASS, Status.SKIP), (name, case.id, reason)


@pytest.mark.parametrize("name", sorted(NEW))
def test_no_case_of_smoke_without_the_new_forms_exercises_the_bug(name):
    from gate.workflow.selftest import exercising_cases

    bug, sdpa = _bug(name), get_adapter("sdpa-cpu")
    host = sdpa if host_of(bug, sdpa) == "kernel" else TiledAdapter()
    assert not exercising_cases(bug, OLD_CASES, host, "cpu")
    assert exercising_cases(bug, NEW_CASES, host, "cpu")


# The crossings: any three of the four traits pass (each trait is needed); the grid bug needs more
# than 65,535 programs. Each new case with one trait changed, run with the planted bug.
ONE_TRAIT_OFF = {
    "grid_y_overflow": [dict(batch=16383)],
    # rows past 2^31 with no batch offset (one element); the batch dense
    "batch_offsets_int32": [dict(layout="far_rows", batch=1), dict(layout="contiguous")],
    "stride0_mask_d512_last_key": [
        dict(layout="contiguous"),
        dict(bias="dense"),
        dict(head_dim=256, head_dim_v=256),
        dict(seqlen_k=64),
    ],
    "varlen_sink_dv192_no_dsink": [
        dict(varlen=None, batch=2, seqlen_q=40, seqlen_k=40),
        dict(sinks=False),
        dict(head_dim=128, head_dim_v=128),
    ],
    "decode_split_lse_underflow": [
        dict(seqlen_q=2),
        dict(inputs="normal"),
        dict(head_dim=128, head_dim_v=128),
        dict(seqlen_k=100),
        dict(causal=True),
    ],
}


@pytest.mark.parametrize(
    "name, change",
    [(n, c) for n, changes in ONE_TRAIT_OFF.items() for c in changes],
    ids=lambda x: x if isinstance(x, str) else ",".join(f"{k}={v}" for k, v in x.items()),
)
def test_the_bug_needs_every_trait_of_its_form(name, change):
    case = _case(NEW[name]).with_fields(**change)
    status, reason = _status(_planted(name), case)
    assert status is Status.PASS, (name, case.id, reason)


# the two tiled variants beside their neighbours: fully masked rows, LSE far below -88, a growing
# bias, large scores, sinks; the full old suite in the slow test below
NEIGHBOURS = (
    r"-bias\.(growing|shifted_rows|bool_empty_rows)|-(large|shifted|outliers)$|-sinks$|^fp16-b2-h2-s239x1-d32-causal$"
)


@pytest.mark.parametrize("name", ["finite_sentinel_-5e4", "running_max_step_clamped"])
def test_tiled_variant_passes_its_neighbouring_old_cases(name):
    cases = [c for c in OLD_CASES if re.search(NEIGHBOURS, c.id)]
    assert len(cases) >= 12
    for case in cases:
        status, reason = _status(_planted(name), case)
        assert status in (Status.PASS, Status.SKIP), (name, case.id, reason)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["finite_sentinel_-5e4", "running_max_step_clamped"])
def test_tiled_variant_passes_every_old_smoke_case(name):
    failed = []
    for case in OLD_CASES:
        status, reason = _status(_planted(name), case)
        if status not in (Status.PASS, Status.SKIP):
            failed.append((case.id, reason))
    assert failed == []
