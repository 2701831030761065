"""Every axis through every CPU adapter that supports it: a case an adapter declares it can run
must PASS (error ratio on out, LSE where returned, dq, dk, dv); one it cannot must be SKIPPED with
its declared reason - never a runtime refusal, never a FAIL. Fully masked rows must come out 0."""

from __future__ import annotations

import pytest
import torch

from gate.attention.inputs import make_inputs
from gate.core.cases import Case
from gate.core.config import ToleranceConfig
from gate.core.results import Status
from gate.correctness.run_case import leaf_call, run_case
from gate.kernels.registry import get_adapter


def _case(nq, nk, hq=2, hkv=2, d=32, dv=None, dtype="bf16", **kw):
    return Case.build(
        batch=kw.pop("batch", 2),
        seqlen_q=nq,
        seqlen_k=nk,
        heads_q=hq,
        heads_kv=hkv,
        head_dim=d,
        head_dim_v=dv or d,
        dtype=dtype,
        seeds=(0,),
        **kw,
    )


AXES = {
    "window-two-sided-gqa": _case(96, 96, 4, 2, window=(16, 16)),
    "window-rows-empty": _case(90, 40, window=(8, 4)),
    "softcap": _case(70, 70, softcap=20.0, causal=True),
    "alibi-bias-path": _case(80, 110, 4, 4, alibi=True),
    "alibi-causal-rows-empty": _case(150, 90, alibi=True, causal=True),
    "varlen-zero-length": Case.build(
        batch=4,
        seqlen_q=97,
        seqlen_k=97,
        heads_q=4,
        heads_kv=2,
        head_dim=32,
        head_dim_v=32,
        dtype="bf16",
        varlen=(1, 97, 0, 40),
        causal=True,
        seeds=(0,),
    ),
    "mqa": _case(64, 64, 4, 1, causal=True),
    "q-shorter": _case(33, 65, causal=True, dtype="fp16"),
    "causal-rows-empty": _case(150, 90, causal=True),
    "head-dim-v": _case(65, 33, d=64, dv=32, dtype="fp32", causal=True),
    "dropout": _case(64, 80, 4, 2, dropout_p=0.2, causal=True),
}
KERNELS = ("tiled", "sdpa-cpu", "sdpa-math")


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("axis", AXES)
def test_axis_passes_or_is_declared_unsupported(kernel, axis):
    adapter, case = get_adapter(kernel), AXES[axis]
    declared = adapter.capabilities().unsupported_reason(case, "cpu")
    result = run_case(adapter, case, "cpu", ToleranceConfig())
    if declared:
        assert result.status is Status.SKIP and result.reason == declared
        return
    assert result.status is Status.PASS, f"{kernel} {case.id}: {result.status.value} {result.reason}"
    measured = {t.tensor for t in result.tensors}
    assert {"out", "dq", "dk", "dv"} <= measured
    if kernel == "tiled":
        assert "lse" in measured  # tiled always returns its LSE: it must be checked


def test_tiled_runs_every_axis():
    caps = get_adapter("tiled").capabilities()
    assert all(caps.unsupported_reason(c, "cpu") is None for c in AXES.values())


@pytest.mark.parametrize("kernel", KERNELS)
def test_fully_masked_rows_are_zero(kernel):
    case = AXES["causal-rows-empty"]
    assert case.has_fully_masked_rows
    adapter = get_adapter(kernel)
    inputs = make_inputs(case, 0, "cpu")
    call = leaf_call(case, inputs)
    out = adapter(call).out
    empty = case.seqlen_q - case.seqlen_k  # bottom-right: the first 60 query rows see no key
    assert torch.equal(out[:, :empty], torch.zeros_like(out[:, :empty]))
    assert (out[:, empty:].abs() > 0).any()


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (_case(150, 90, causal=True), True),
        (_case(90, 150, causal=True), False),
        (_case(150, 90), False),
        (_case(200, 200, window=(32, 0)), False),
        (_case(90, 40, window=(8, 4)), True),
        (_case(40, 90, window=(4, 8)), False),  # bottom-right: the last row always sees the last key
        (_case(65, 33, window=(-1, 2)), True),
        (_case(64, 64, window=(0, 0)), False),
        (
            Case.build(
                batch=2,
                seqlen_q=5,
                seqlen_k=5,
                heads_q=1,
                heads_kv=1,
                head_dim=8,
                head_dim_v=8,
                dtype="bf16",
                varlen=(0, 5),
                causal=True,
            ),
            False,
        ),
    ],
)
def test_has_fully_masked_rows(case, expected):
    assert case.has_fully_masked_rows is expected


@pytest.mark.parametrize("backend", ["efficient", "cudnn", "flash", "math"])
def test_sdpa_runs_fully_masked_rows(backend):
    """A SKIP is for a call the kernel refuses: the rows mem-efficient and cuDNN get wrong run, and
    the worked configuration's known_failures name them."""
    from gate.kernels.sdpa import SdpaAdapter

    caps = SdpaAdapter(backend).capabilities()
    assert caps.unsupported_reason(_case(150, 90, causal=True), "cuda") is None
    assert caps.unsupported_reason(_case(90, 150, causal=True), "cuda") is None
