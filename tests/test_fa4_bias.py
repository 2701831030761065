"""FA4's custom bias and masks, without a GPU: a fake `flash_attn.cute` records what the
fa4 adapter hands it, and a fake `cutlass` lets the CuTe mods of gate/kernels/fa4_mods.py run as
plain Python on torch tensors. The fake kernel applies the mods element by element the way FA4
calls them (one-element index vectors, q_idx/kv_idx/seqlen_info/aux_tensors as keywords for
score_mod) and, like FA4, drops causal/window under a mask_mod, so `run_case` against the float64
reference checks what the mods read and what the adapter folds. What it cannot check: that the
mods compile with the real CuTe DSL, and FA4's kernels themselves (on a GPU only).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

import gate.kernels
from gate.attention.bias import make_bias
from gate.attention.inputs import make_inputs
from gate.attention.masks import allowed_mask
from gate.core.cases import Case
from gate.core.config import ToleranceConfig
from gate.correctness.run_case import leaf_call, run_case
from gate.kernels.capabilities import Feature
from gate.kernels.flash_attn import (
    BIAS_GRAD_REASON,
    GQA_DV_REASON,
    SOFTCAP_BIAS_REASON,
    FA4Adapter,
    fa4_bias_aux,
    fa4_mask_aux,
)

MODS_PATH = Path(gate.kernels.__file__).parent / "fa4_mods.py"


def case(**kw) -> Case:
    base = dict(
        batch=2, seqlen_q=9, seqlen_k=13, heads_q=4, heads_kv=2, head_dim=16, head_dim_v=16, dtype="bf16", seeds=(0,)
    )
    base.update(kw)
    return Case.build(**base)


# ---------------------------------------------------------------- fakes


class _Rmem:
    """cute.make_rmem_tensor(1, dtype): one register, stored into by [0] and read by load()."""

    def __init__(self, dtype):
        self.value = torch.zeros(1, dtype=dtype)

    def __setitem__(self, i, v):
        self.value[i] = v

    def load(self):
        return self.value


class _AuxTensor:
    """What a mod sees of an aux tensor: element_type and [b, h, q, k] loads (torch dtype stands in)."""

    def __init__(self, t: torch.Tensor):
        self.t, self.element_type = t, t.dtype

    def __getitem__(self, idx):
        return self.t[tuple(int(i) for i in idx)]


def _fake_cutlass() -> tuple[ModuleType, ModuleType]:
    cutlass, cute = ModuleType("cutlass"), ModuleType("cutlass.cute")
    cutlass.Float32, cutlass.Boolean = torch.float32, torch.bool
    cutlass.Int32 = lambda x: int(x)  # a conversion in the mods, never a dtype
    cute.jit = lambda fn: fn
    cute.make_rmem_tensor = lambda n, dtype: _Rmem(dtype)
    cutlass.cute = cute
    return cutlass, cute


class FakeFA4:
    """flash_attn.cute.flash_attn_func with FA4's keywords: records each call's kwargs and computes
    attention in float64, applying score_mod / mask_mod per (b, h, q, k) as FA4 does."""

    def __init__(self):
        self.calls: list[dict] = []

    def flash_attn_func(
        self,
        q,
        k,
        v,
        qv=None,
        softmax_scale=None,
        causal=False,
        window_size=(None, None),
        learnable_sink=None,
        softcap=0.0,
        deterministic=False,
        score_mod=None,
        score_mod_bwd=None,
        mask_mod=None,
        aux_tensors=None,
        return_lse=False,
    ):
        self.calls.append(
            dict(
                causal=causal,
                window_size=window_size,
                softcap=softcap,
                score_mod=score_mod,
                score_mod_bwd=score_mod_bwd,
                mask_mod=mask_mod,
                aux_tensors=aux_tensors,
            )
        )
        assert score_mod is None or score_mod_bwd is not None, "FA4's backward asserts score_mod_bwd with score_mod"
        b, nq, hq, _ = q.shape
        nk, hk = k.shape[1], k.shape[2]
        qh = q.double().transpose(1, 2)
        kh = k.double().transpose(1, 2).repeat_interleave(hq // hk, dim=1)
        vh = v.double().transpose(1, 2).repeat_interleave(hq // hk, dim=1)
        s = qh @ kh.transpose(-1, -2) * softmax_scale
        aux = [_AuxTensor(t) for t in aux_tensors] if aux_tensors else []
        one = lambda x: torch.tensor([x])  # noqa: E731 (FA4 hands one-element vectors)
        if score_mod is not None:
            rows = []
            for idx in torch.cartesian_prod(*(torch.arange(n) for n in (b, hq, nq, nk))).tolist():
                bi, hi, qi, ki = idx
                rows.append(
                    score_mod(
                        s[bi, hi, qi, ki].reshape(1),
                        one(bi),
                        one(hi),
                        q_idx=one(qi),
                        kv_idx=one(ki),
                        seqlen_info=None,
                        aux_tensors=aux,
                    )
                )
            s = torch.cat(rows).reshape(s.shape)
        if mask_mod is not None:  # FA4: a mask_mod replaces causal and window (_resolve_causal_local_window)
            keep = torch.tensor(
                [
                    bool(mask_mod(one(bi), one(hi), one(qi), one(ki), None, aux)[0])
                    for bi, hi, qi, ki in torch.cartesian_prod(*(torch.arange(n) for n in (b, hq, nq, nk))).tolist()
                ]
            )
            s = s.masked_fill(~keep.reshape(s.shape), float("-inf"))
        else:
            window = tuple(-1 if w is None else w for w in window_size)
            allowed = allowed_mask(torch.arange(nq), nq, nk, causal, window)
            if allowed is not None:
                s = s.masked_fill(~allowed, float("-inf"))
        empty = torch.isinf(s).all(dim=-1, keepdim=True)
        p = torch.softmax(s.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
        lse = torch.logsumexp(s, dim=-1)
        out = (p @ vh).transpose(1, 2).to(q.dtype)
        return out, lse.float()


@pytest.fixture
def fake_fa4(monkeypatch):
    """The fakes in sys.modules, and gate/kernels/fa4_mods.py loaded against the fake cutlass."""
    cutlass, cute = _fake_cutlass()
    monkeypatch.setitem(sys.modules, "cutlass", cutlass)
    monkeypatch.setitem(sys.modules, "cutlass.cute", cute)
    spec = importlib.util.spec_from_file_location("gate.kernels.fa4_mods", MODS_PATH)
    mods = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mods)
    monkeypatch.setitem(sys.modules, "gate.kernels.fa4_mods", mods)
    monkeypatch.setattr(gate.kernels, "fa4_mods", mods, raising=False)
    fake = FakeFA4()
    flash, flash_cute = ModuleType("flash_attn"), ModuleType("flash_attn.cute")
    flash_cute.flash_attn_func = fake.flash_attn_func
    flash.cute = flash_cute
    monkeypatch.setitem(sys.modules, "flash_attn", flash)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", flash_cute)
    fake.mods = mods
    return fake


class CpuFA4(FA4Adapter):
    """The fa4 adapter, its capabilities unchanged except that it may run on the CPU (the fake kernel)."""

    def capabilities(self):
        return dataclasses.replace(super().capabilities(), devices=("cpu",))


def _call(c: Case):
    inputs = make_inputs(c, 0, "cpu")
    return leaf_call(c, inputs)


# ---------------------------------------------------------------- aux tensors (pure torch)


@pytest.mark.parametrize("kind", ["dense", "broadcast_b", "broadcast_h", "broadcast_1", "shifted_rows"])
@pytest.mark.parametrize("bias_dtype", [torch.bfloat16, torch.float32])
def test_float_bias_aux_is_the_bias_itself_in_its_own_shape_and_dtype(kind, bias_dtype):
    bias = make_bias(case(bias=kind), 0, "cpu", bias_dtype).requires_grad_(True)
    aux = fa4_bias_aux(bias)
    assert aux.shape == bias.shape and aux.dtype == bias_dtype and aux.is_contiguous()
    assert not aux.requires_grad and aux.data_ptr() == bias.data_ptr()  # no copy, no expansion
    assert torch.equal(aux, bias.detach())


def test_float_bias_aux_of_a_strided_bias_is_made_contiguous():
    bias = make_bias(case(bias="dense"), 0, "cpu", torch.float32).transpose(2, 3).contiguous().transpose(2, 3)
    aux = fa4_bias_aux(bias)
    assert aux.is_contiguous() and aux.stride(-1) == 1 and torch.equal(aux, bias)


@pytest.mark.parametrize("kind", ["bool_mask", "bool_empty_rows", "document", "prefix_lm"])
def test_mask_aux_without_causal_or_window_is_a_uint8_view(kind):
    mask = make_bias(case(bias=kind), 0, "cpu", torch.bfloat16)
    aux = fa4_mask_aux(mask, 9, 13, False, (-1, -1))
    assert aux.dtype == torch.uint8 and aux.shape == mask.shape and aux.data_ptr() == mask.data_ptr()
    assert torch.equal(aux.bool(), mask) and set(aux.unique().tolist()) <= {0, 1}


@pytest.mark.parametrize(
    "causal, window, nq, nk",
    [
        (True, (-1, -1), 9, 13),
        (True, (-1, -1), 13, 9),
        (False, (3, 0), 9, 13),
        (False, (2, 2), 13, 13),
    ],
)
@pytest.mark.parametrize("kind", ["bool_mask", "document"])
def test_mask_aux_folds_causal_and_window_bottom_right(kind, causal, window, nq, nk):
    mask = make_bias(case(bias=kind, seqlen_q=nq, seqlen_k=nk), 0, "cpu", torch.bfloat16)
    aux = fa4_mask_aux(mask, nq, nk, causal, window)
    allowed = allowed_mask(torch.arange(nq), nq, nk, causal, window)
    assert aux.dtype == torch.uint8 and aux.shape == mask.shape  # broadcast dims stay 1
    assert torch.equal(aux.bool(), mask & allowed)
    assert not torch.equal(aux.bool(), mask)  # the fold removed something on these shapes


# ---------------------------------------------------------------- capabilities and skips


def test_fa4_declares_float_bias_and_masks_but_no_bias_gradient(fake_fa4):
    a = FA4Adapter()
    caps = a.capabilities()
    assert caps.supports(Feature.BIAS) and caps.supports(Feature.BOOL_MASK) and not caps.supports(Feature.BIAS_GRAD)
    assert caps.reason(Feature.BIAS_GRAD).startswith("no bias gradient: FA4's backward")
    for kind in (
        "dense",
        "broadcast_b",
        "broadcast_h",
        "broadcast_1",
        "bool_mask",
        "bool_empty_rows",
        "document",
        "prefix_lm",
    ):
        assert a.unsupported_reason(case(bias=kind), "cuda") is None, kind
    assert a.unsupported_reason(case(bias="shifted_rows", bias_dtype="fp32"), "cuda") is None
    assert a.unsupported_reason(case(bias="dense", bias_grad=True), "cuda") == BIAS_GRAD_REASON
    assert "returns None for aux_tensors" in BIAS_GRAD_REASON
    assert a.unsupported_reason(case(bias="dense", softcap=20.0), "cuda") == SOFTCAP_BIAS_REASON
    assert a.unsupported_reason(case(bias="document", softcap=20.0), "cuda") is None  # mask_mod + softcap: allowed
    assert a.unsupported_reason(case(softcap=20.0), "cuda") is None


def test_fa4_skips_gqa_with_a_different_value_head_dim_as_its_backward_asserts(fake_fa4):
    """Seen on the H200: FA4 4.0.0b36 raised 'GQA backward requires head_dim == head_dim_v' (an
    ERROR row); the case is SKIPPED with that reason, MHA with dv != d and GQA with dv == d still run."""
    a = FA4Adapter()
    assert a.unsupported_reason(case(head_dim=32, head_dim_v=16), "cuda") == GQA_DV_REASON
    assert a.unsupported_reason(case(head_dim=32, head_dim_v=16, heads_kv=4), "cuda") is None
    assert a.unsupported_reason(case(head_dim=32, head_dim_v=32), "cuda") is None


def test_an_fa4_without_the_mod_keywords_skips_every_bias_case_saying_which(monkeypatch, fake_fa4):
    def old_func(q, k, v, softmax_scale=None, causal=False, window_size=(None, None), softcap=0.0, return_lse=False):
        raise AssertionError("not called")

    monkeypatch.setattr(sys.modules["flash_attn.cute"], "flash_attn_func", old_func)
    reason = FA4Adapter().unsupported_reason(case(bias="dense"), "cuda")
    assert (
        reason
        == "this flash-attn-4's flash_attn_func takes no score_mod/score_mod_bwd/mask_mod/aux_tensors: no custom bias or mask"
    )
    assert FA4Adapter().unsupported_reason(case(), "cuda") is None


def test_without_flash_attn_the_bias_reason_names_fa4():
    # CI: flash_attn is not installed; the adapter is unavailable anyway, and its bias reason says why
    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash_attn is installed here")
    assert "FA4's flash_attn_func could not be inspected" in FA4Adapter().unsupported_reason(case(bias="dense"), "cuda")


# ---------------------------------------------------------------- what the kernel is handed


@pytest.mark.parametrize(
    "kind, one_batch, one_head",
    [
        ("dense", False, False),
        ("broadcast_b", True, False),
        ("broadcast_h", False, True),
        ("broadcast_1", True, True),
    ],
)
def test_float_bias_goes_in_as_score_mod_and_aux_tensor(fake_fa4, kind, one_batch, one_head):
    c = case(bias=kind, bias_dtype="fp32", causal=True)
    call = _call(c)
    FA4Adapter()(call)
    kw = fake_fa4.calls[-1]
    assert kw["score_mod"] is fake_fa4.mods.bias_score_mod(one_batch, one_head)
    assert kw["score_mod_bwd"] is fake_fa4.mods.bias_score_mod_bwd and kw["mask_mod"] is None
    (aux,) = kw["aux_tensors"]
    assert aux.shape == call.opts.bias.shape and aux.dtype == torch.float32 and torch.equal(aux, call.opts.bias)
    assert kw["causal"] is True and kw["window_size"] == (None, None)  # a score_mod leaves FA4's own masks on


@pytest.mark.parametrize("kind", ["bool_mask", "document", "prefix_lm"])
def test_bool_mask_goes_in_as_mask_mod_with_causal_folded_and_off(fake_fa4, kind):
    c = case(bias=kind, causal=True, window=(5, -1))
    call = _call(c)
    a = FA4Adapter()
    a.prepare(c)
    a(call)
    kw = fake_fa4.calls[-1]
    bias = call.opts.bias
    assert kw["mask_mod"] is fake_fa4.mods.bool_mask_mod(bias.shape[0] == 1, bias.shape[1] == 1)
    assert kw["score_mod"] is None and kw["score_mod_bwd"] is None
    assert kw["causal"] is False and kw["window_size"] == (None, None)
    (aux,) = kw["aux_tensors"]
    assert aux.dtype == torch.uint8 and aux.shape == bias.shape
    assert torch.equal(aux.bool(), bias & allowed_mask(torch.arange(c.seqlen_q), c.seqlen_q, c.seqlen_k, True, (5, -1)))
    a(call)  # the same call again (a timed repeat): the folded mask is built once per case
    assert fake_fa4.calls[-1]["aux_tensors"][0] is aux
    a.prepare(c)
    a(call)
    assert fake_fa4.calls[-1]["aux_tensors"][0] is not aux


def test_mods_are_built_once_per_broadcast_pattern_with_fa4s_signatures(fake_fa4):
    m = fake_fa4.mods
    pairs = [(ob, oh) for ob in (False, True) for oh in (False, True)]
    assert len({id(m.bias_score_mod(*p)) for p in pairs}) == 4 and len({id(m.bool_mask_mod(*p)) for p in pairs}) == 4
    assert all(
        m.bias_score_mod(*p) is m.bias_score_mod(*p) and m.bool_mask_mod(*p) is m.bool_mask_mod(*p) for p in pairs
    )
    # FA4 calls score mods with these keywords (softmax.call_score_mod), mask mods positionally (mask.call_mask_mod)
    assert list(inspect.signature(m.bias_score_mod(False, False)).parameters) == [
        "score",
        "batch_idx",
        "head_idx",
        "q_idx",
        "kv_idx",
        "seqlen_info",
        "aux_tensors",
    ]
    assert list(inspect.signature(m.bias_score_mod_bwd).parameters) == [
        "grad",
        "score",
        "batch_idx",
        "head_idx",
        "q_idx",
        "kv_idx",
        "seqlen_info",
        "aux_tensors",
    ]
    assert len(inspect.signature(m.bool_mask_mod(False, False)).parameters) == 6
    grad = torch.tensor([0.37])
    assert (
        m.bias_score_mod_bwd(
            grad, torch.tensor([5.0]), None, None, q_idx=None, kv_idx=None, seqlen_info=None, aux_tensors=[]
        )
        is grad
    )


def test_score_mod_reads_the_bias_at_b_h_q_k_and_index_0_on_broadcast_dims(fake_fa4):
    bias = torch.arange(2 * 1 * 3 * 5, dtype=torch.bfloat16).reshape(2, 1, 3, 5)  # broadcast over heads
    mod = fake_fa4.mods.bias_score_mod(False, True)
    one = lambda x: torch.tensor([x])  # noqa: E731
    got = mod(
        torch.tensor([0.5]),
        one(1),
        one(3),
        q_idx=one(2),
        kv_idx=one(4),
        seqlen_info=None,
        aux_tensors=[_AuxTensor(bias)],
    )
    assert got.dtype == torch.float32 and float(got) == 0.5 + float(bias[1, 0, 2, 4])
    mask = torch.zeros(1, 2, 3, 5, dtype=torch.uint8)
    mask[0, 1, 2, 4] = 1
    mmod = fake_fa4.mods.bool_mask_mod(True, False)
    assert bool(mmod(one(1), one(1), one(2), one(4), None, [_AuxTensor(mask)])[0])
    assert not bool(mmod(one(1), one(0), one(2), one(4), None, [_AuxTensor(mask)])[0])


# ---------------------------------------------------------------- the gate's own path, on the fake kernel


CASES = [
    case(bias=k, causal=causal)
    for k in (
        "dense",
        "broadcast_b",
        "broadcast_h",
        "broadcast_1",
        "bool_mask",
        "bool_empty_rows",
        "document",
        "prefix_lm",
    )
    for causal in (False, True)
]
CASES += [
    case(bias="shifted_rows", bias_dtype="fp32"),
    case(bias="dense", bias_dtype="fp32", dtype="fp16", causal=True),
    case(bias="dense", window=(4, 0)),
    case(bias="document", window=(3, 3)),
    case(bias="bool_mask", seqlen_q=13, seqlen_k=9, causal=True),
]


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_run_case_passes_on_a_kernel_that_applies_the_mods_as_fa4_does(fake_fa4, c):
    r = run_case(CpuFA4(), c, "cpu", ToleranceConfig())
    assert r.status.value == "PASS", (r.status.value, r.reason)
    assert fake_fa4.calls and all(call["aux_tensors"] for call in fake_fa4.calls)


def test_a_mask_handed_over_without_the_fold_fails_the_causal_case(fake_fa4, monkeypatch):
    """The fold is what makes a causal mask case right: FA4 drops causal under a mask_mod."""
    import gate.kernels.flash_attn as fa

    monkeypatch.setattr(
        fa, "fa4_mask_aux", lambda mask, nq, nk, causal, window: mask.detach().contiguous().view(torch.uint8)
    )
    r = run_case(CpuFA4(), case(bias="document", causal=True), "cpu", ToleranceConfig())
    assert r.status.value == "FAIL" and "error" in r.reason


@pytest.mark.parametrize(
    "c",
    [case(bias="dense", bias_grad=True), case(bias="broadcast_h", bias_dtype="fp32", bias_grad=True)],
    ids=lambda c: c.id,
)
def test_bias_grad_cases_skip_with_the_reason_and_never_reach_the_kernel(fake_fa4, c):
    r = run_case(CpuFA4(), c, "cpu", ToleranceConfig())
    assert r.status.value == "SKIP" and r.reason == BIAS_GRAD_REASON and not fake_fa4.calls
