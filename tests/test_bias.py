"""Custom biases and masks: the axis, the tensors, the reference's dBias, the kernels
that take a bias, and `attn-gate check` catching the planted bias bugs of tests/bias_kernels.py."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
import torch

from gate.attention.bias import make_bias
from gate.attention.inputs import make_inputs
from gate.attention.reference import AttnOptions, attention_reference
from gate.commands.main import main
from gate.compare.sweep_rules import required_tensors, rule_incomplete_pass
from gate.core.cases import BIAS_KINDS, BOOL_BIAS_KINDS, FLOAT_BIAS_KINDS, Case, expand_suite, load_suite
from gate.core.config import ToleranceConfig
from gate.core.errors import UserError
from gate.correctness.run_case import run_case
from gate.kernels.registry import get_adapter

F64 = torch.float64


def case(**kw) -> Case:
    base = dict(batch=2, seqlen_q=33, seqlen_k=47, heads_q=4, heads_kv=2, head_dim=16, head_dim_v=16, dtype="bf16")
    base.update(kw)
    return Case.build(**base)


# ---------------------------------------------------------------- the axis


def test_bias_fields_default_away_and_show_in_the_id():
    plain = case()
    assert "bias" not in plain.hash_dict() and "bias_grad" not in plain.hash_dict() and "bias" not in plain.id
    c = case(bias="dense", bias_dtype="fp32", bias_grad=True)
    assert c.id == "bf16-b2-h4/2-s33x47-d16-bias.dense.fp32.grad"
    assert case(bias="document").id.endswith("-bias.document")
    assert Case.from_dict(c.to_dict()) == c and Case.from_dict(plain.to_dict()) == plain
    assert len({case(bias=k).id for k in BIAS_KINDS}) == len(BIAS_KINDS)


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(bias="alibi2"), "is not one of"),
        (dict(bias="document", bias_grad=True), "boolean"),
        (dict(bias="bool_mask", bias_dtype="fp32"), "boolean"),
        (dict(bias_grad=True), "need a bias"),
        (dict(bias="dense", bias_dtype="fp64"), "bias_dtype"),
        (dict(bias="dense", bias_dtype="fp32", dtype="fp32"), "bf16/fp16"),
    ],
)
def test_invalid_bias_cases_say_what_is_wrong(kw, words):
    with pytest.raises(ValueError, match=words):
        case(**kw)


def test_matrix_axes_expand_and_bad_values_name_the_suite():
    spec = {
        "matrix": [
            {"seqlens": ["64"], "bias": ["dense", "broadcast_1"], "bias_dtype": ["fp32"], "bias_grad": [False, True]}
        ]
    }
    suite = expand_suite("b", spec, "pyproject.toml")
    assert [c.id for c in suite.cases] == [
        "bf16-b2-h4-s64-d64-bias.dense.fp32",
        "bf16-b2-h4-s64-d64-bias.dense.fp32.grad",
        "bf16-b2-h4-s64-d64-bias.broadcast_1.fp32",
        "bf16-b2-h4-s64-d64-bias.broadcast_1.fp32.grad",
    ]
    with pytest.raises(UserError, match=r"pyproject.toml \[suites.b\] matrix\[0\]: bias value 'dens'"):
        expand_suite("b", {"matrix": [{"bias": ["dens"]}]}, "pyproject.toml")
    with pytest.raises(UserError, match="bias_grad"):
        expand_suite("b", {"matrix": [{"bias": ["dense"], "bias_grad": ["yes"]}]}, "pyproject.toml")


def test_shipped_suites_carry_every_kind():
    pr, smoke, nightly = (load_suite(n) for n in ("pr", "smoke", "nightly"))
    assert {c.bias.kind for c in pr.cases} == set(BIAS_KINDS)
    assert {c.bias.kind for c in smoke.cases} == set(BIAS_KINDS)
    assert any(c.bias.grad for c in pr.cases) and any(c.bias.dtype == "fp32" for c in pr.cases)
    assert any(c.has_bias and 1088 in (c.seqlen_q, c.seqlen_k) for c in pr.cases)  # a tile edge (17 x 64)
    assert {c.bias.kind for c in pr.perf_cases} >= {"broadcast_b", "document"}  # a bias and a Flex mask_mod speed case
    assert any(c.has_bias and c.seqlen_k > 65536 for c in nightly.cases)
    assert any(c.has_bias and c.has_window for c in nightly.cases) and any(
        c.has_bias and c.heads_kv == 1 for c in nightly.cases
    )
    assert max(c.seqlen_q * c.seqlen_k for c in smoke.cases if c.has_bias) <= 130 * 130


# ---------------------------------------------------------------- the tensors


# the rows of the extreme kinds that carry the dense bias alone (the others: -60000, or +10000 on key 0)
TAME_ROWS = {"sunk_rows": lambda rows: rows % 4 != 1, "first_key": lambda rows: rows % 2 == 1}


@pytest.mark.parametrize("kind", FLOAT_BIAS_KINDS)
def test_float_biases_are_tens_per_shape_and_seeded(kind):
    c = case(bias=kind)
    a, b = make_bias(c, 0, "cpu", torch.float32), make_bias(c, 1, "cpu", torch.float32)
    assert tuple(a.shape) == c.bias_shape and a.dtype == torch.float32
    assert torch.equal(a, make_bias(c, 0, "cpu", torch.float32)) and not torch.equal(a, b)
    tame = a[:, :, TAME_ROWS[kind](torch.arange(c.seqlen_q))] if kind in TAME_ROWS else a
    assert 10 < float(tame.abs().max()) < 400 and float(tame.std()) > 5  # relative-position-like tens, not unit noise
    if a.shape[1] > 1:
        assert not torch.equal(a[:, 0], a[:, 1])  # a per-head bias differs per head
    if a.shape[0] > 1:
        assert not torch.equal(a[0], a[1])
    assert not torch.equal(a[..., :-1], a[..., 1:])  # not shift-invariant along keys (the per-key term)


def test_shifted_rows_push_the_lse_below_fp32_exp_underflow():
    c = case(bias="shifted_rows", bias_dtype="fp32", seqlen_q=47)
    inputs = make_inputs(c, 0, "cpu")
    gold = attention_reference(
        inputs.q, inputs.k, inputs.v, inputs.dout, AttnOptions(inputs.softmax_scale, bias=inputs.bias), F64
    )
    assert float(gold.lse[:, :, 1::4].max()) < -88.7 < float(gold.lse[:, :, 0::4].min())


@pytest.mark.parametrize("kind", BOOL_BIAS_KINDS)
def test_bool_patterns_keep_a_key_per_row_and_ignore_the_seed(kind):
    for nq, nk in ((33, 47), (47, 33), (64, 64)):
        c = case(bias=kind, seqlen_q=nq, seqlen_k=nk)
        m = make_bias(c, 0, "cpu", torch.bfloat16)
        assert m.dtype == torch.bool and tuple(m.shape) == c.bias_shape
        assert torch.equal(
            m, make_bias(c, 5, "cpu", torch.bfloat16)
        )  # the structure, not the seed: one block mask per case
        rows_seen = m.any(dim=-1)
        if kind == "bool_empty_rows":
            assert not rows_seen[:, :, 2::5].any() and rows_seen[:, :, 0::5].all() and c.has_fully_masked_rows
        else:
            assert rows_seen.all()
            assert 0.05 < float(m.float().mean()) < 0.95


def test_document_is_block_diagonal_and_prefix_lm_is_bidirectional_then_causal():
    doc = make_bias(case(bias="document", seqlen_q=96, seqlen_k=96), 0, "cpu", torch.bfloat16)
    for b in range(2):
        d = doc[b, 0]
        assert torch.equal(d, d.T) and 1 < len(torch.unique(d.sum(-1))) and not d.all()  # several documents
        assert torch.equal(d.float() @ d.float() > 0, d)  # an equivalence relation: blocks
    pre = make_bias(case(bias="prefix_lm", seqlen_q=96, seqlen_k=96), 0, "cpu", torch.bfloat16)[0, 0]
    n = int(pre[0].sum())  # row 0 sees exactly the prefix
    assert pre[:n, :n].all() and torch.equal(pre[n:], torch.ones(96, 96, dtype=torch.bool).tril()[n:])


# ---------------------------------------------------------------- the reference's dBias


def naive(q, k, v, dout, scale, bias, causal=False, softcap=0.0):
    """float64 autograd of softmax(cap(QK^T scale) + bias, masked) V; bias leaf with grad."""
    q, k, v = (t.detach().to(F64).requires_grad_(True) for t in (q, k, v))
    bias = bias.detach().to(F64).requires_grad_(True) if bias.dtype != torch.bool else bias
    group = q.shape[2] // k.shape[2]
    qh = q.transpose(1, 2)
    kh = k.transpose(1, 2).repeat_interleave(group, 1)
    vh = v.transpose(1, 2).repeat_interleave(group, 1)
    s = qh @ kh.transpose(-1, -2) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~bias, float("-inf")) if bias.dtype == torch.bool else s + bias
    nq, nk = s.shape[-2:]
    if causal:
        s = s.masked_fill(torch.arange(nk).view(1, -1) > torch.arange(nq).view(-1, 1) + nk - nq, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    out = (p @ vh).transpose(1, 2)
    out.backward(dout.to(F64))
    return out.detach(), q.grad, k.grad, v.grad, (bias.grad if bias.dtype != torch.bool else None)


@pytest.mark.parametrize(
    "kind, causal, softcap",
    [
        ("dense", False, 0.0),
        ("broadcast_b", True, 0.0),
        ("broadcast_h", False, 5.0),
        ("broadcast_1", True, 0.0),
        ("shifted_rows", False, 0.0),
        ("document", True, 0.0),
        ("bool_mask", False, 0.0),
    ],
)
def test_reference_matches_float64_autograd_including_dbias(kind, causal, softcap, monkeypatch):
    monkeypatch.setattr("gate.attention.reference.CHUNK_ELEMENTS", 2048)  # several query chunks
    c = case(bias=kind, causal=causal, softcap=softcap, bias_dtype="fp32" if kind in FLOAT_BIAS_KINDS else None)
    x = make_inputs(c, 0, "cpu")
    gold = attention_reference(
        x.q, x.k, x.v, x.dout, AttnOptions(x.softmax_scale, causal=causal, softcap=softcap, bias=x.bias), F64
    )
    out, dq, dk, dv, dbias = naive(x.q, x.k, x.v, x.dout, x.softmax_scale, x.bias, causal, softcap)
    tight = dict(rtol=1e-9, atol=1e-10)
    for mine, theirs in ((gold.out, out), (gold.dq, dq), (gold.dk, dk), (gold.dv, dv)):
        torch.testing.assert_close(mine, theirs, **tight)
    if dbias is None:
        assert gold.dbias is None and "dbias" not in gold.tensors()
    else:
        assert gold.dbias.shape == x.bias.shape  # summed over the broadcast dims
        torch.testing.assert_close(gold.dbias, dbias, **tight)


def test_dbias_matches_finite_differences():
    c = case(bias="broadcast_h", batch=1, seqlen_q=9, seqlen_k=11, heads_q=2, heads_kv=1, dtype="fp32")
    x = make_inputs(c, 0, "cpu")
    bias = x.bias.double()

    def loss(b):
        r = attention_reference(x.q, x.k, x.v, x.dout, AttnOptions(x.softmax_scale, causal=True, bias=b), F64)
        return float((r.out * x.dout.double()).sum())

    gold = attention_reference(x.q, x.k, x.v, x.dout, AttnOptions(x.softmax_scale, causal=True, bias=bias), F64)
    eps = 1e-6
    for idx in ((0, 0, 8, 10), (0, 0, 4, 1), (0, 0, 8, 3), (0, 0, 0, 5)):
        plus, minus = bias.clone(), bias.clone()
        plus[idx] += eps
        minus[idx] -= eps
        fd = (loss(plus) - loss(minus)) / (2 * eps)
        assert abs(fd - float(gold.dbias[idx])) < 1e-6, (idx, fd, float(gold.dbias[idx]))
    assert float(gold.dbias[0, 0, 0, 5]) == 0.0  # a causally masked key: no gradient


def test_low_precision_yardstick_keeps_an_fp32_bias_exact():
    """bf16 scores + an fp32 bias are an fp32 sum (PyTorch's promotion): rounding that bias to bf16
    is an error the yardstick does not make, so the rule can see it."""
    c = case(bias="dense", bias_dtype="fp32")
    x = make_inputs(c, 0, "cpu")
    opts = AttnOptions(x.softmax_scale, bias=x.bias)
    gold = attention_reference(x.q, x.k, x.v, x.dout, opts, F64)
    low = attention_reference(x.q, x.k, x.v, x.dout, opts, torch.bfloat16)
    rounded = attention_reference(
        x.q, x.k, x.v, x.dout, AttnOptions(x.softmax_scale, bias=x.bias.bfloat16()), torch.bfloat16
    )
    assert float((low.out.double() - gold.out).abs().max()) < 0.5 * float((rounded.out.double() - gold.out).abs().max())


# ---------------------------------------------------------------- kernels


CPU_CASES = [case(bias=k, causal=cz) for k in BIAS_KINDS[1:] for cz in (False, True)] + [
    case(bias="dense", bias_dtype="fp32", bias_grad=True),
    case(bias="broadcast_h", bias_grad=True, dtype="fp16"),
    case(bias="broadcast_1", bias_grad=True, dtype="fp32"),
    case(bias="document", window=(8, 0)),
]


@pytest.mark.parametrize("kernel", ["tiled", "sdpa-math", "sdpa-cpu", "tests.bias_kernels:correct"])
def test_correct_kernels_pass_every_bias_kind(kernel, in_repo_root):
    adapter = get_adapter(kernel)
    statuses = {}
    for c in CPU_CASES:
        if kernel == "tests.bias_kernels:correct" and c.has_window:
            continue
        r = run_case(adapter, c, "cpu", ToleranceConfig())
        statuses[c.id] = r.status.value
        assert r.status.value in ("PASS", "SKIP"), (c.id, r.reason)
        if r.status.value == "PASS" and c.bias.grad:
            assert r.tensor("dbias") is not None and r.tensor("dbias").ratio <= 1
        if r.status.value == "SKIP":
            assert kernel == "sdpa-cpu" and c.bias.grad and "refuses an attn_mask that requires grad" in r.reason
    assert list(statuses.values()).count("PASS") >= len(CPU_CASES) - 4


def test_kernels_without_a_bias_skip_with_the_reason(in_repo_root):
    c = case(bias="dense")
    assert (
        get_adapter("tests.bias_kernels:correct_without_bias").capabilities().unsupported_reason(c, "cpu")
        == "no custom bias (attn_bias)"
    )
    assert "attn_mask" in get_adapter("sdpa-flash").capabilities().unsupported_reason(c, "cuda")
    assert "FA4" in get_adapter("fa4").capabilities().unsupported_reason(c, "cuda")
    assert "cuDNN backward" in get_adapter("sdpa-cudnn").capabilities().unsupported_reason(
        case(bias="dense", bias_grad=True), "cuda"
    )
    assert (
        get_adapter("sdpa-efficient").capabilities().unsupported_reason(case(bias="dense", bias_grad=True), "cuda")
        is None
    )
    # rows emptied through attn_mask and through causal_lower_right both run (wrong answers are KNOWN, not SKIP)
    assert get_adapter("sdpa-efficient").capabilities().unsupported_reason(case(bias="bool_empty_rows"), "cuda") is None
    assert (
        get_adapter("sdpa-efficient")
        .capabilities()
        .unsupported_reason(case(seqlen_q=47, seqlen_k=33, causal=True), "cuda")
        is None
    )


@pytest.mark.parametrize(
    "kernel, words",
    [
        ("bias_rounded_to_input_dtype", "error"),
        ("bias_head0", "error"),
        ("bias_no_grad", "dbias is missing"),
    ],
)
def test_planted_bias_bugs_fail_the_case(kernel, words, in_repo_root):
    c = case(bias="dense", bias_dtype="fp32", bias_grad=True, heads_kv=4, causal=True)
    r = run_case(get_adapter(f"tests.bias_kernels:{kernel}"), c, "cpu", ToleranceConfig())
    assert r.status.value == "FAIL" and words in r.reason


# ---- varlen: a packed bias, each sequence its own block

VARLEN = dict(
    batch=4,
    seqlen_q=70,
    seqlen_k=70,
    heads_q=4,
    heads_kv=2,
    head_dim=16,
    head_dim_v=16,
    dtype="fp32",
    varlen=(1, 45, 0, 70),
)


def test_a_varlen_bias_is_packed_with_one_block_per_sequence():
    c = case(**{**VARLEN, "varlen_k": (3, 60, 5, 30), "seqlen_k": 60}, bias="dense")
    assert c.bias_shape == (1, 4, 116, 98)
    bias = make_bias(c, 0, "cpu", torch.float32)
    rows, keys = (0, 1, 46, 46, 116), (0, 3, 63, 68, 98)
    inside = torch.zeros_like(bias, dtype=torch.bool)
    for a, z, ka, kz in zip(rows[:-1], rows[1:], keys[:-1], keys[1:]):
        inside[:, :, a:z, ka:kz] = True
    assert (bias[~inside] == 0).all() and (bias[inside] != 0).all()
    # the blocks are not one block repeated: a kernel reading the wrong block reads other numbers
    assert not torch.equal(bias[0, :, 1:46, 3:63][:, :5, :5], bias[0, :, 46:116, 68:98][:, :5, :5])


def test_varlen_reference_reads_each_sequences_block_and_packs_dbias():
    c = case(**VARLEN, bias="dense", bias_grad=True, causal=True)
    x = make_inputs(c, 0, "cpu")
    opts = AttnOptions(x.softmax_scale, causal=True, bias=x.bias)
    packed = attention_reference(x.q, x.k, x.v, x.dout, opts, F64, cu_seqlens=x.cu_seqlens)
    a, z = 1, 46  # the second sequence alone, as a dense batch of one with its block of the bias
    alone = attention_reference(
        x.q[a:z][None],
        x.k[a:z][None],
        x.v[a:z][None],
        x.dout[a:z][None],
        AttnOptions(x.softmax_scale, causal=True, bias=x.bias[:, :, a:z, a:z]),
        F64,
    )
    torch.testing.assert_close(packed.out[a:z], alone.out[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(packed.dbias[:, :, a:z, a:z], alone.dbias, rtol=1e-12, atol=1e-12)
    assert packed.dbias[:, :, a:z, z:].abs().max() == 0  # no gradient outside a sequence's block


def _reading_bias(rewrite):
    """sdpa-math on a varlen call whose packed bias is `rewrite(bias, cu_seqlens)`: a kernel that
    indexes the packed bias wrongly."""
    import dataclasses

    class Wrong(type(get_adapter("sdpa-math"))):
        def __call__(self, call):
            wrong = rewrite(call.opts.bias, call.cu_seqlens.tolist())
            return super().__call__(dataclasses.replace(call, opts=dataclasses.replace(call.opts, bias=wrong)))

    return Wrong(backend="math")


def _at_origin(bias, rows):
    """Every sequence's block read at the packed origin (its offsets dropped)."""
    wrong = bias.clone()
    for a, z in zip(rows[:-1], rows[1:]):
        wrong[:, :, a:z, a:z] = bias[:, :, : z - a, : z - a]
    return wrong


def _first_two_swapped(bias, rows):
    """The first two sequences (of one length) handed each other's blocks."""
    (a, z, y), wrong = rows[:3], bias.clone()
    wrong[:, :, a:z, a:z], wrong[:, :, z:y, z:y] = bias[:, :, z:y, z:y], bias[:, :, a:z, a:z]
    return wrong


@pytest.mark.parametrize(
    "kw",
    [
        dict(bias="dense"),
        dict(bias="dense", bias_grad=True, causal=True),
        dict(bias="bool_mask", causal=True),
        dict(bias="broadcast_h"),
    ],
)
def test_varlen_bias_passes_correct_kernels_and_fails_one_reading_at_the_origin(kw):
    c = case(**VARLEN, **kw)
    for kernel in ("tiled", "sdpa-math", "sdpa-cpu"):
        r = run_case(get_adapter(kernel), c, "cpu", ToleranceConfig())
        assert r.status.value == "PASS" or (kernel == "sdpa-cpu" and c.bias.grad and r.status.value == "SKIP"), (
            kernel,
            r.reason,
        )
        if r.status.value == "PASS" and c.bias.grad:
            assert r.tensor("dbias").ratio <= 1
    wrong = run_case(_reading_bias(_at_origin), c, "cpu", ToleranceConfig())
    assert wrong.status.value == "FAIL", wrong.reason


@pytest.mark.parametrize("kind", ["dense", "bool_mask", "document", "prefix_lm"])
def test_sequences_of_one_length_get_different_blocks(kind):
    """Each sequence's block is its own (a boolean pattern too): a kernel that swaps two equal-length
    sequences' blocks fails."""
    c = case(**{**VARLEN, "varlen": (40, 40, 7), "batch": 3, "seqlen_q": 40, "seqlen_k": 40}, bias=kind)
    assert run_case(get_adapter("sdpa-math"), c, "cpu", ToleranceConfig()).status.value == "PASS"
    assert run_case(_reading_bias(_first_two_swapped), c, "cpu", ToleranceConfig()).status.value == "FAIL"


def test_a_packed_bias_past_its_size_limit_is_refused():
    from gate.core.cases import MAX_PACKED_BIAS

    n = int(MAX_PACKED_BIAS**0.5) + 1
    with pytest.raises(ValueError, match="packed over all tokens"):
        case(**{**VARLEN, "varlen": (n,), "batch": 1, "seqlen_q": n, "seqlen_k": n}, bias="broadcast_h")
    case(**{**VARLEN, "varlen": (n - 2,), "batch": 1, "seqlen_q": n - 2, "seqlen_k": n - 2}, bias="broadcast_h")


def test_kernels_without_a_varlen_bias_skip_with_the_reason():
    from gate.kernels.capabilities import Capabilities, feature_set

    c = case(**{**VARLEN, "dtype": "bf16"}, bias="dense")
    native = Capabilities(features=feature_set(varlen=True, bias=True))  # FA4's form: a varlen API, no packed bias
    assert native.unsupported_reason(c, "cuda") == "no custom bias on a varlen call"
    assert native.unsupported_reason(case(bias="dense"), "cuda") is None
    assert get_adapter("flex").capabilities().unsupported_reason(c, "cuda") is None
    assert get_adapter("sdpa-efficient").capabilities().unsupported_reason(c, "cuda") is None


@pytest.mark.slow
def test_flex_mods_read_the_bias_as_the_reference_does():
    """Flex on CPU runs forward only (eager): enough to show the score_mod/mask_mod index the
    captured tensor right (broadcast dims, bottom-right masks, softcap order). Its backward runs on
    an H200."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    from torch.nn.attention.flex_attention import flex_attention

    from gate.correctness.run_case import leaf_call, references
    from gate.kernels.flex import FlexAdapter

    adapter = FlexAdapter()
    adapter._compiled = flex_attention  # eager: no inductor on the CI machine
    for c in (
        case(bias="broadcast_h", bias_dtype="fp32", causal=True),
        case(bias="dense", softcap=20.0, window=(8, 4), bias_dtype="fp32"),
        case(bias="bool_empty_rows"),
        case(bias="document", causal=True),
    ):
        x = make_inputs(c, 0, "cpu")
        call = leaf_call(c, x)
        call = type(call)(**{**call.__dict__, "q": call.q.detach(), "k": call.k.detach(), "v": call.v.detach()})
        adapter.prepare(c)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = adapter(call).out
        gold, low = references(c, x, None)
        err, pt = float((out.double() - gold.out).abs().max()), float((low.out.double() - gold.out).abs().max())
        assert err <= 2 * pt + 2**-9, (c.id, err, pt)


# ---------------------------------------------------------------- the verdict and `attn-gate check`


def test_a_pass_without_dbias_is_incomplete_when_the_bias_trains():
    measured = {"out", "dq", "dk", "dv"}
    assert rule_incomplete_pass("c", "PASS", measured, required_tensors(True)).rule == "incomplete_pass"
    assert rule_incomplete_pass("c", "PASS", measured, required_tensors(False)) is None
    assert rule_incomplete_pass("c", "PASS", measured | {"dbias"}, required_tensors(True)) is None


SUITE = """
[tool.attn-gate.suites.bias]
seeds = [0, 1]

[[tool.attn-gate.suites.bias.matrix]]
dtype = ["bf16"]
seqlens = ["64x96"]
heads = ["4"]
head_dims = ["32"]
causal = [false, true]
bias = ["dense", "broadcast_b"]
bias_dtype = ["fp32"]
bias_grad = [true]

[[tool.attn-gate.suites.bias.matrix]]
dtype = ["fp16"]
seqlens = ["64x96"]
heads = ["4"]
head_dims = ["32"]
bias = ["dense", "document", "bool_empty_rows"]
"""


@pytest.fixture(scope="module")
def bias_baseline(tmp_path_factory):
    """A baseline of the bias suite made by the correct kernel, as a maintainer would."""
    import contextlib

    root = Path(__file__).resolve().parent.parent
    tmp = tmp_path_factory.mktemp("bias")
    cfg = tmp / "pyproject.toml"
    cfg.write_text(f'[tool.attn-gate]\nbaselines_dir = "{(tmp / "baselines").as_posix()}"\n' + SUITE)
    with pytest.MonkeyPatch.context() as mp, contextlib.chdir(root):
        mp.delenv("GITHUB_STEP_SUMMARY", raising=False)
        rc = main(
            [
                "baseline",
                "update",
                "--config",
                str(cfg),
                "--kernel",
                "tests.bias_kernels:correct",
                "--suite",
                "bias",
                "--device",
                "cpu",
                "--no-progress",
                "--out",
                str(tmp / "made"),
            ]
        )
    (path,) = (tmp / "baselines" / "cpu").glob("*.json")
    return rc, cfg, path


def _check(kernel: str, cfg: Path, baseline: Path, out: Path) -> tuple[int, dict]:
    rc = main(
        [
            "check",
            "--config",
            str(cfg),
            "--kernel",
            f"tests.bias_kernels:{kernel}",
            "--suite",
            "bias",
            "--device",
            "cpu",
            "--baseline",
            str(baseline),
            "--no-progress",
            "--out",
            str(out),
        ]
    )
    (findings,) = out.glob("findings-*.json")
    return rc, json.loads(findings.read_text())


@pytest.mark.slow
@pytest.mark.xdist_group("bias")
def test_the_correct_bias_kernel_passes_check_against_its_baseline(bias_baseline, in_repo_root, tmp_path):
    rc, cfg, path = bias_baseline
    assert rc == 0
    data = json.loads(path.read_text())
    assert {c for c in data["correctness"]} and all(
        "dbias" in c["tensors"] for cid, c in data["correctness"].items() if ".grad" in cid
    )
    rc, findings = _check("correct", cfg, path, tmp_path / "ok")
    assert rc == 0 and findings["verdict"] == "PASS"


@pytest.mark.slow
@pytest.mark.parametrize(
    "kernel, rule, where",
    [
        ("bias_rounded_to_input_dtype", "tolerance", r"\.fp32"),  # only the fp32-bias cases change
        (
            "bias_head0",
            "tolerance",
            r"bias\.(dense|broadcast_b|bool_empty_rows)",
        ),  # per-head ones; not document (1 head)
        ("bias_no_grad", "status", r"\.grad$"),  # dbias missing: a FAIL row
    ],
)
@pytest.mark.xdist_group("bias")
def test_planted_bias_bugs_fail_check_against_the_correct_kernels_baseline(
    bias_baseline, in_repo_root, tmp_path, kernel, rule, where
):
    _, cfg, path = bias_baseline
    rc, findings = _check(kernel, cfg, path, tmp_path / kernel)
    assert rc == 1 and findings["verdict"] == "FAIL"
    failing = [f for f in findings["findings"] if f["severity"] == "FAIL"]
    assert any(f["rule"] == rule for f in failing)
    assert all(re.search(where, f["case_id"]) for f in failing), [f["case_id"] for f in failing]


def test_speed_workload_and_determinism_take_the_bias_gradient():
    from gate.correctness.probes.determinism import batch_invariance_check, determinism_check
    from gate.speed.timing import KernelWorkload

    c = case(bias="broadcast_b", bias_grad=True, perf=True)
    work = KernelWorkload(get_adapter("sdpa-math"), c, "cpu")
    work.prepare()
    grads = work.run("bwd")
    assert len(grads) == 4 and tuple(grads[3].shape) == c.bias_shape  # the timed backward computes dBias too
    (det,) = determinism_check(get_adapter("tiled"), c, "cpu", runs=2)
    assert det.passed and "dbias" in det.detail
    for kind in (
        "dense",
        "broadcast_b",
    ):  # a per-batch dBias is judged per sequence; a shared one is not one sequence's
        (inv,) = batch_invariance_check(get_adapter("tiled"), case(bias=kind, bias_grad=True), "cpu")
        assert inv.passed and ("dbias" in inv.detail) == (kind == "dense"), inv.detail


def test_kernels_skip_the_bias_forms_the_h200_showed_they_refuse():
    """Declared from an H200 bias sweep: mem-efficient raises on an fp32 bias
    with bf16 inputs, Flex's compiled backward of an fp32 bias does not fit in shared memory. Both
    are SKIPs with the measured reason, not ERROR rows; the bf16 bias and Flex's forward still run."""
    from gate.core.cases import Case
    from gate.kernels.registry import get_adapter

    base = Case.build(
        batch=2,
        seqlen_q=1088,
        seqlen_k=1088,
        heads_q=8,
        heads_kv=8,
        head_dim=128,
        head_dim_v=128,
        dtype="bf16",
        bias="dense",
        seeds=(0,),
    )
    fp32 = base.with_fields(bias_dtype="fp32")
    fp32_grad = fp32.with_fields(bias_grad=True)
    efficient = get_adapter("sdpa-efficient").capabilities()
    assert "invalid dtype for bias" in efficient.unsupported_reason(fp32, "cuda")
    assert efficient.unsupported_reason(base, "cuda") is None
    flex = get_adapter("flex").capabilities()
    assert flex.unsupported_reason(fp32, "cuda") is None
    assert "shared memory" in flex.unsupported_reason(fp32_grad, "cuda")
    assert flex.unsupported_reason(base.with_fields(bias_grad=True), "cuda") is None


def test_sdpa_folds_a_boolean_mask_with_alibi_into_an_additive_mask():
    """The one SDPA path that turns a boolean mask additive (ALiBi must be added to it): sdpa-math
    runs it on the CPU and passes against the float64 reference."""
    from gate.core.cases import Case
    from gate.core.config import ToleranceConfig
    from gate.correctness.run_case import run_case
    from gate.kernels.registry import get_adapter

    case = Case.build(
        batch=2,
        seqlen_q=48,
        seqlen_k=64,
        heads_q=4,
        heads_kv=4,
        head_dim=32,
        head_dim_v=32,
        dtype="bf16",
        alibi=True,
        bias="bool_mask",
        seeds=(0,),
    )
    row = run_case(get_adapter("sdpa-math"), case, "cpu", ToleranceConfig())
    assert row.status.value == "PASS", row.reason
