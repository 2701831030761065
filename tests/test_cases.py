"""Cases and suites: stable readable ids, matrix expansion, validation that names file and key."""

from __future__ import annotations

import dataclasses
import re

import pytest

from gate.core.cases import Case, expand_suite, load_suite, suite_names
from gate.core.errors import UserError


def make(**kw):
    base = dict(batch=2, seqlen_q=128, seqlen_k=128, heads_q=4, heads_kv=4, head_dim=64, head_dim_v=64, dtype="bf16")
    return Case.build(**{**base, **kw})


@pytest.mark.parametrize(
    "kw, case_id",
    [
        (
            dict(
                batch=2,
                heads_q=16,
                heads_kv=16,
                seqlen_q=2048,
                seqlen_k=2048,
                head_dim=128,
                head_dim_v=128,
                causal=True,
            ),
            "bf16-b2-h16-s2048-d128-causal",
        ),
        (
            dict(
                dtype="fp16",
                batch=1,
                heads_q=8,
                heads_kv=2,
                seqlen_q=97,
                seqlen_k=257,
                head_dim=96,
                head_dim_v=64,
                window=(16, 0),
                softcap=30.0,
                alibi=True,
                dropout_p=0.1,
            ),
            "fp16-b1-h8/2-s97x257-d96/64-win16.0-cap30-alibi-drop0.1",
        ),
        (
            dict(batch=4, seqlen_q=130, seqlen_k=130, heads_q=4, heads_kv=2, varlen=(1, 97, 0, 130), causal=True),
            "bf16-b4-h4/2-s130-d64-causal-varlen1.97.0.130",
        ),
        (dict(dtype="fp32", seqlen_q=1, seqlen_k=1, heads_kv=1, window=(-1, 0)), "fp32-b2-h4/1-s1-d64-win-1.0"),
    ],
)
def test_ids_are_readable_and_fixed(kw, case_id):
    """These exact strings are keys in committed baselines: changing the format breaks them."""
    assert make(**kw).id == case_id


# One change per field the id must show (everything except seeds, perf and checks).
VARIANTS = {
    "dtype": dict(dtype="fp16"),
    "batch": dict(batch=3),
    "seqlen_q": dict(seqlen_q=127),
    "seqlen_k": dict(seqlen_k=129),
    "heads_q": dict(heads_q=8),
    "heads_kv": dict(heads_kv=2),
    "head_dim": dict(head_dim=32),
    "head_dim_v": dict(head_dim_v=32),
    "causal": dict(causal=True),
    "window": dict(window=(8, 8)),
    "window_left": dict(window=(9, 8)),
    "softcap": dict(softcap=20.0),
    "softcap_close": dict(softcap=20.00001),
    "alibi": dict(alibi=True),
    "dropout": dict(dropout_p=0.1),
    "dropout_close": dict(dropout_p=0.1000001),
    "varlen": dict(batch=2, seqlen_q=128, seqlen_k=128, varlen=(128, 5)),
    "varlen_other": dict(batch=2, seqlen_q=128, seqlen_k=128, varlen=(5, 128)),
}


def test_every_problem_field_changes_the_id():
    ids = {name: make(**kw).id for name, kw in VARIANTS.items()}
    ids["base"] = make().id
    assert len(set(ids.values())) == len(ids), ids


def test_seeds_perf_and_checks_do_not_change_the_id():
    assert make(seeds=(0, 1, 2), perf=True, checks=("determinism",)).id == make().id


def test_case_is_frozen_hashable_and_round_trips():
    c = make(window=(4, 0), varlen=None, softcap=5.0, seeds=(3, 4))
    assert {c: 1}[make(window=(4, 0), softcap=5.0, seeds=(3, 4))] == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.batch = 3  # type: ignore[misc]
    assert Case.from_dict(c.to_dict()) == c
    v = make(batch=3, seqlen_q=9, seqlen_k=9, varlen=(9, 0, 2))
    assert Case.from_dict(v.to_dict()) == v


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(dtype="bf32"), "dtype 'bf32'"),
        (dict(heads_q=6, heads_kv=4), "heads_q 6 is not a multiple of heads_kv 4"),
        (dict(seqlen_q=0), "seqlen_q must be >= 1"),
        (dict(dropout_p=1.0), "dropout_p"),
        (dict(window=(-2, 0)), "window"),
        (dict(varlen=(3, 4)), "varlen cases must have batch=len(varlen)"),
        (dict(seeds=()), "seed"),
    ],
)
def test_invalid_cases_say_what_is_wrong(kw, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        make(**kw)


# --- suites ------------------------------------------------------------------------------------


def spec(*blocks, seeds=(0,)):
    return {"seeds": list(seeds), "matrix": list(blocks)}


def test_block_is_the_cartesian_product_in_a_stable_order():
    s = expand_suite(
        "t", spec({"dtype": ["bf16", "fp16"], "seqlens": ["1", "97x257"], "causal": [False, True]}), "f.toml"
    )
    assert len(s.cases) == 8
    assert [c.id for c in s.cases[:3]] == ["bf16-b2-h4-s1-d64", "bf16-b2-h4-s1-d64-causal", "bf16-b2-h4-s97x257-d64"]
    assert (
        s.cases
        == expand_suite(
            "t", spec({"dtype": ["bf16", "fp16"], "seqlens": ["1", "97x257"], "causal": [False, True]}), "f.toml"
        ).cases
    )


def test_axes_left_out_take_their_defaults_and_pairs_parse():
    (c,) = expand_suite("t", spec({"heads": ["16/4"], "head_dims": ["192/128"], "seqlens": [300]}), "f.toml").cases
    assert (c.heads_q, c.heads_kv, c.head_dim, c.head_dim_v, c.seqlen_q, c.seqlen_k) == (16, 4, 192, 128, 300, 300)
    assert (c.dtype, c.batch, c.causal, c.window, c.seeds) == ("bf16", 2, False, (-1, -1), (0,))


def test_the_same_case_in_two_blocks_is_one_case_and_perf_wins():
    s = expand_suite("t", spec({"seqlens": ["128", "256"]}, {"seqlens": ["256"], "perf": [True]}), "f.toml")
    assert [c.id for c in s.cases] == ["bf16-b2-h4-s128-d64", "bf16-b2-h4-s256-d64"]
    assert [c.perf for c in s.cases] == [False, True]
    assert s.perf_cases == (s.cases[1],)


def test_varlen_sets_batch_and_seqlens():
    (c,) = expand_suite("t", spec({"varlen": [[1, 97, 0, 130]], "batch": [7]}), "f.toml").cases
    assert (c.batch, c.seqlen_q, c.seqlen_k, c.entry.varlen) == (4, 130, 130, (1, 97, 0, 130))


@pytest.mark.parametrize(
    "block, key",
    [
        ({"dtypes": ["bf16"]}, "unknown matrix axis 'dtypes'"),
        ({"dtype": "bf16"}, "axis 'dtype' must be a non-empty list"),
        ({"dtype": []}, "axis 'dtype' must be a non-empty list"),
        ({"dtype": ["bf32"]}, "dtype 'bf32'"),
        ({"causal": ["false"]}, "axis 'causal' value 'false' should be true or false"),
        ({"alibi": [1]}, "axis 'alibi' value 1 should be true or false"),
        ({"batch": [True]}, "axis 'batch' value True should be an integer"),
        ({"softcap": ["30"]}, "axis 'softcap' value '30' should be a number"),
        ({"seqlens": ["97by257"]}, "axis 'seqlens' value '97by257'"),
        ({"heads": ["16/4/2"]}, "axis 'heads' value '16/4/2'"),
        ({"heads": ["6/4"]}, "heads_q 6 is not a multiple of heads_kv 4"),
        ({"window": [[16]]}, "window value [16]"),
        ({"varlen": [[]]}, "varlen value []"),
        ({"varlen": [[0, 0]]}, "varlen needs non-negative lengths with at least one > 0"),
    ],
)
def test_matrix_errors_name_the_file_the_suite_the_block_and_the_key(block, key):
    with pytest.raises(UserError) as err:
        expand_suite("mine", spec({"seqlens": ["64"]}, block), "conf/attn.toml")
    message = str(err.value)
    assert message.startswith("conf/attn.toml [suites.mine] matrix[1]: "), message
    assert key in message and "\n" not in message


@pytest.mark.parametrize(
    "bad, key",
    [
        ({"seeds": [0], "matrix": [{}], "extra": 1}, "unknown key 'extra'"),
        ({"seeds": [], "matrix": [{}]}, "seeds must be a non-empty list of integers"),
        ({"seeds": [True], "matrix": [{}]}, "seeds must be a non-empty list of integers"),
        ({"seeds": [0]}, "needs at least one [[suites.mine.matrix]] block"),
        ({"seeds": [0], "matrix": ["x"]}, "matrix block 0 must be a table"),
    ],
)
def test_suite_errors_name_the_file_and_key(bad, key):
    with pytest.raises(UserError) as err:
        expand_suite("mine", bad, "conf/attn.toml")
    assert str(err.value).startswith("conf/attn.toml [suites.mine]") and key in str(err.value)


def test_unknown_suite_lists_the_known_ones():
    with pytest.raises(UserError, match=r"unknown suite 'smok'; choose one of: nightly, pr, smoke"):
        load_suite("smok")


def test_an_override_replaces_the_default_and_names_its_table():
    override = {"smoke": spec({"seqlens": ["33"]})}
    suite = load_suite("smoke", override, "my.toml")
    assert [c.id for c in suite.cases] == ["bf16-b2-h4-s33-d64"] and suite.source == "my.toml"
    assert "smoke" in suite_names(override) and "extra" in suite_names({"extra": spec({})})
    with pytest.raises(
        UserError, match=re.escape("my.toml [tool.attn-gate.suites.smoke] matrix[0]: unknown matrix axis")
    ):
        load_suite("smoke", {"smoke": spec({"bogus": [1]})}, "my.toml")


# --- the shipped suites ----------------------------------------------------------------------

SHIPPED = {name: load_suite(name) for name in ("smoke", "pr", "nightly")}
READABLE_ID = re.compile(
    r"^(bf16|fp16|fp32|e4m3|e5m2)-b\d+-h\d+(/\d+)?-s\d+(x\d+)?-d\d+(/\d+)?(-causal)?(-win-?\d+\.-?\d+)?"
    r"(-cap[\d.e+-]+)?(-alibi)?(-drop[\d.e+-]+)?(-varlen[\d.]+(x[\d.]+)?)?"
    r"(-kv[\d.]*)?(-append)?(-page\d+)?(-shuffled)?(-sinks)?(-nanleft)?(-splits\d+)?(-(no)?packgqa)?(-hnd)?"
    r"(-(k_sliced|qkv_packed|bhsd_view|dout_noncontig|kv_stride0|far_rows|far_batch))?(-(large|shifted|outliers))?"  # layout, inputs
    r"(-bias\.[a-z_1]+(\.fp32)?(\.grad)?)?$"
)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_suite_ids_are_unique_and_readable(name):
    ids = [c.id for c in SHIPPED[name].cases]
    assert len(ids) == len(set(ids)) > 0
    assert [i for i in ids if not READABLE_ID.match(i)] == []


def test_shipped_suites_cover_what_the_issue_asks_for():
    every = [c for s in SHIPPED.values() for c in s.cases]
    lengths = {c.seqlen_q for c in every} | {c.seqlen_k for c in every}
    assert {1, 97, 257, 1000} <= lengths
    assert any(c.seqlen_q != c.seqlen_k for c in SHIPPED["smoke"].cases)
    dims = {c.head_dim for c in every}
    assert {64, 128} <= dims and any(d & (d - 1) for d in dims)  # a non-power-of-two head dim
    assert any(c.heads_kv == 1 and c.heads_q > 1 for c in every) and any(1 < c.heads_kv < c.heads_q for c in every)
    for flag in ("causal", "has_window", "softcap", "alibi"):
        assert any(getattr(c, flag) for c in SHIPPED["smoke"].cases), flag
    assert any(c.entry.varlen and 0 in c.entry.varlen for c in SHIPPED["smoke"].cases)
    assert {c.dtype for c in SHIPPED["smoke"].cases} == {"bf16", "fp16", "fp32", "e4m3", "e5m2"}
    assert any(c.seqlen_q >= 8192 for c in SHIPPED["nightly"].cases)
    assert not any(c.seqlen_q >= 8192 for c in SHIPPED["smoke"].cases)
    assert SHIPPED["smoke"].perf_cases and SHIPPED["pr"].perf_cases


# --- kernel knobs: a decode case forces num_splits, pack_gqa, kv_layout ---------------------------

DECODE = {"entry": ["kvcache"], "seqlens": ["4x96"], "heads": ["4/2"], "cache_new": [True]}


def test_knobs_expand_as_one_axis_and_show_in_the_id_only_when_forced():
    knobs = [{}, {"num_splits": 3}, {"pack_gqa": True}, {"pack_gqa": False}, {"kv_layout": "HND"}]
    knobs.append({"num_splits": 2, "pack_gqa": True, "kv_layout": "HND"})
    s = expand_suite("t", spec({**DECODE, "knobs": knobs}), "f.toml")
    base = "bf16-b2-h4/2-s4x96-d64-kv-append"
    assert [c.id for c in s.cases] == [
        base,
        f"{base}-splits3",
        f"{base}-packgqa",
        f"{base}-nopackgqa",
        f"{base}-hnd",
        f"{base}-splits2-packgqa-hnd",
    ]
    # a case at the default knobs is the case without the axis: same id, same hash dict
    (plain,) = expand_suite("t", spec(DECODE), "f.toml").cases
    assert plain == s.cases[0] and "num_splits" not in plain.hash_dict()
    assert s.cases[5].hash_dict() | {"num_splits": 2, "pack_gqa": True, "kv_layout": "HND"} == s.cases[5].hash_dict()


def test_knobs_round_trip_and_a_case_dict_without_them_reads_as_the_kernels_choice():
    (c,) = expand_suite("t", spec({**DECODE, "knobs": [{"num_splits": 3, "kv_layout": "HND"}]}), "f.toml").cases
    assert Case.from_dict(c.to_dict()) == c and c.to_dict()["knobs"]["num_splits"] == 3
    older = c.with_fields(num_splits=0, kv_layout="NHD").to_dict()
    del older["knobs"]
    assert Case.from_dict(older).knobs == type(c.knobs)()


@pytest.mark.parametrize(
    "knobs, key",
    [
        ("splits3", "knobs value 'splits3' should be a table"),
        ({"splits": 3}, "unknown knob 'splits'; known knobs: num_splits, pack_gqa, kv_layout"),
        ({"num_splits": -1}, "num_splits -1 must be an integer >= 0"),
        ({"num_splits": True}, "num_splits True must be an integer >= 0"),
        ({"pack_gqa": 1}, "pack_gqa 1 must be true or false"),
        ({"kv_layout": "NDH"}, "kv_layout 'NDH' is not one of NHD, HND"),
    ],
)
def test_a_bad_knob_is_one_line_naming_it(knobs, key):
    with pytest.raises(UserError) as err:
        expand_suite("mine", spec({**DECODE, "knobs": [knobs]}), "conf/attn.toml")
    message = str(err.value)
    assert message.startswith("conf/attn.toml [suites.mine] matrix[0]: ") and key in message, message


def test_knobs_need_a_decode_case():
    with pytest.raises(UserError, match='knobs .num_splits, pack_gqa, kv_layout. need entry = "kvcache"'):
        expand_suite("mine", spec({"knobs": [{"num_splits": 2}]}), "conf/attn.toml")
