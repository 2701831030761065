"""Capabilities as data: a feature a kernel lacks skips the cases that need it with the reason the
kernel gives for it (else the feature's default), and that reason reaches the SKIP row as written."""

import itertools

import pytest

from gate.core.cases import Case
from gate.kernels.capabilities import ASSUMED, DEFAULT_REASONS, Capabilities, Feature, feature_needs, feature_set

BASE = dict(batch=2, seqlen_q=16, seqlen_k=16, heads_q=2, heads_kv=2, head_dim=16, head_dim_v=16, dtype="bf16")


def case(**kw) -> Case:
    return Case.build(**{**BASE, **kw})


def test_every_feature_has_a_default_reason():
    assert set(DEFAULT_REASONS) == set(Feature)


def test_every_feature_has_its_condition_and_a_check_that_asks_it():
    c = case(causal=True, seqlen_k=32, window=(4, 0), softcap=5.0, heads_kv=1, head_dim_v=32, bias="dense")
    needs = feature_needs(c)
    assert set(needs) == set(Feature)
    # a kernel lacking any one feature this case needs SKIPs it with that feature's reason
    everything = feature_set(**{f.value: True for f in Feature})
    for feature in (f for f, needed in needs.items() if needed):
        caps = Capabilities(devices=("cpu",), features=everything, reasons={feature: f"lacks {feature.value}"})
        assert caps.unsupported_reason(c, "cpu") == f"lacks {feature.value}"


def test_feature_set_starts_from_what_is_assumed():
    assert feature_set() == ASSUMED
    assert feature_set(window=True, causal=False) == (ASSUMED | {Feature.WINDOW}) - {Feature.CAUSAL}
    with pytest.raises(ValueError):
        feature_set(windw=True)


@pytest.mark.parametrize(
    "kw, feature",
    [
        (dict(causal=True), Feature.CAUSAL),
        (dict(window=(4, 0)), Feature.WINDOW),
        (dict(softcap=5.0), Feature.SOFTCAP),
        (dict(alibi=True), Feature.ALIBI),
        (dict(dropout_p=0.1), Feature.DROPOUT),
        (dict(batch=2, seqlen_q=7, seqlen_k=7, varlen=(3, 7)), Feature.VARLEN),
        (dict(heads_kv=1), Feature.GQA),
        (dict(head_dim_v=32), Feature.HEAD_DIM_V_DIFFERS),
        (dict(seqlen_k=32), Feature.SEQLEN_Q_NE_K),
        (dict(seqlen_k=32, causal=True), Feature.CAUSAL_SEQLEN_Q_NE_K),
        (dict(sinks=True), Feature.SINKS),
        (dict(bias="dense"), Feature.BIAS),
        (dict(bias="document"), Feature.BOOL_MASK),
        (dict(causal=True, seqlen_q=32), Feature.FULLY_MASKED_ROWS),
    ],
)
def test_a_missing_feature_skips_with_its_default_reason_or_the_kernels_own(kw, feature):
    everything = feature_set(**{f.value: True for f in Feature})
    assert Capabilities(devices=("cpu",), features=everything).unsupported_reason(case(**kw), "cpu") is None
    lacking = Capabilities(devices=("cpu",), features=everything - {feature})
    assert lacking.unsupported_reason(case(**kw), "cpu") == DEFAULT_REASONS[feature]
    said = Capabilities(devices=("cpu",), features=everything, reasons={feature: "measured: it returns garbage"})
    assert not said.supports(feature) and said.unsupported_reason(case(**kw), "cpu") == "measured: it returns garbage"


def test_bias_refinements_are_judged_after_the_kind():
    caps = Capabilities(
        devices=("cpu",),
        features=feature_set(bias=True, bias_grad=True),
        reasons={Feature.BIAS_OTHER_DTYPE: "no fp32 bias", Feature.BIAS_GRAD_OTHER_DTYPE: "no fp32 dbias"},
    )
    assert caps.unsupported_reason(case(bias="dense", bias_grad=True), "cpu") is None
    assert caps.unsupported_reason(case(bias="dense", bias_dtype="fp32"), "cpu") == "no fp32 bias"
    refused = Capabilities(
        devices=("cpu",),
        features=feature_set(bias=True, bool_mask=True),
        reasons={Feature.BIAS: "takes no mask", Feature.BOOL_MASK: "takes no mask"},
    )
    assert refused.unsupported_reason(case(bias="dense", bias_grad=True, bias_dtype="fp32"), "cpu") == "takes no mask"


def test_rows_a_bias_empties_may_be_fine_where_masked_rows_are_not():
    caps = Capabilities(
        devices=("cpu",),
        features=feature_set(bool_mask=True),
        fully_masked_rows_ok_with_bias=True,
        reasons={Feature.FULLY_MASKED_ROWS: "fully masked rows: NaN"},
    )
    assert caps.unsupported_reason(case(causal=True, seqlen_q=32), "cpu") == "fully masked rows: NaN"
    assert caps.unsupported_reason(case(bias="bool_empty_rows"), "cpu") is None


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(features=frozenset({"window"})), "is not a Feature"),
        (dict(reasons={Feature.WINDOW: ""}), "non-empty string"),
    ],
)
def test_a_malformed_declaration_is_refused(kw, message):
    with pytest.raises(TypeError, match=message):
        Capabilities(**kw)


def _rows(nq: int, nk: int, off: int, left: int, right: int) -> list[frozenset[int]]:
    """Each query's visible keys, the query sitting at key i + off (window bounds -1 = unbounded)."""
    return [
        frozenset(j for j in range(nk) if (left < 0 or j >= i + off - left) and (right < 0 or j <= i + off + right))
        for i in range(nq)
    ]


def test_mask_alignment_matters_exactly_where_the_two_alignments_mask_differently():
    """Against every small mask, written out: bottom-right (query i at key i + nk - nq) vs top-left."""
    from gate.core.cases import _alignment_matters

    for nq, nk, left, right in itertools.product(range(1, 7), range(0, 7), range(-1, 8), range(-1, 8)):
        if left < 0 and right < 0:
            continue
        differ = _rows(nq, nk, nk - nq, left, right) != _rows(nq, nk, 0, left, right)
        assert _alignment_matters(nq, nk, left, right, False) == differ, (nq, nk, left, right)
    assert _alignment_matters(3, 5, -1, -1, True) and not _alignment_matters(5, 5, -1, -1, True)


def test_a_kernel_whose_masks_need_equal_lengths_keeps_every_other_case_of_unequal_lengths():
    caps = Capabilities(
        devices=("cpu",),
        features=feature_set(window=True, alibi=True, kvcache=True, varlen=True, causal_seqlen_q_ne_k=False),
    )
    reason = DEFAULT_REASONS[Feature.CAUSAL_SEQLEN_Q_NE_K]
    decode = dict(entry="kvcache", seqlen_q=1, seqlen_k=64, cache_seqlens=(40, 64), causal=True)
    refused = [
        case(seqlen_k=32, causal=True),
        case(seqlen_q=32, window=(4, 0)),
        case(batch=2, seqlen_q=9, seqlen_k=7, varlen=(5, 9), varlen_k=(5, 7), causal=True),
        case(**decode),
        case(seqlen_k=32, alibi=True),  # ALiBi's distance is from the aligned key too
    ]
    for c in refused:
        assert c.mask_alignment_matters and caps.unsupported_reason(c, "cpu") == reason, c.id
    kept = [
        case(seqlen_k=32),  # no mask to align
        case(causal=True),  # equal lengths: both alignments agree
        case(batch=2, seqlen_q=9, seqlen_k=9, varlen=(5, 9), causal=True),
        case(seqlen_q=32, seqlen_k=32, window=(4, 0)),
        case(seqlen_q=9, seqlen_k=1, window=(16, -1)),  # a window wider than every row: the same mask
    ]
    for c in kept:
        assert not c.mask_alignment_matters and caps.unsupported_reason(c, "cpu") is None, c.id
    # a kernel that lacks causal masks says that first
    no_causal = Capabilities(devices=("cpu",), features=feature_set(causal=False, causal_seqlen_q_ne_k=False))
    assert no_causal.unsupported_reason(case(seqlen_k=32, causal=True), "cpu") == DEFAULT_REASONS[Feature.CAUSAL]
