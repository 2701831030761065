"""The calls the flash-attn adapters make, on the CPU: fake FA2 / FA3 / FA4 modules with the
libraries' own signatures record every call bound to its parameters, and return tensors the test
knows. Each test states the whole call (every argument not at its default) and what the adapter
makes of the result (out, LSE, dropout mask), for each entry point: dense, varlen, kvcache."""

from __future__ import annotations

import dataclasses
import inspect
import sys
from types import ModuleType

import pytest
import torch

from gate.attention.inputs import make_inputs
from gate.core.cases import Case
from gate.correctness.run_case import grad_names, leaf_call
from gate.kernels.capabilities import Feature
from gate.kernels.flash_attn import FA2Adapter, FA3Adapter, FA4Adapter, FA4RawWindowAdapter

# --- the libraries' signatures (flash-attn 2.8 flash_attn_interface.py, FA3 hopper/flash_attn_interface.py,
# FA4 flash_attn/cute/interface.py); the bodies are the fake's


def fa2_dense(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
): ...


def fa2_varlen(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
): ...


def fa2_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
): ...


def fa3_dense(
    q,
    k,
    v,
    softmax_scale=None,
    causal=False,
    qv=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    num_splits=1,
    pack_gqa=None,
    deterministic=False,
    sm_margin=0,
    return_attn_probs=False,
): ...


def fa3_varlen(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    seqused_q=None,
    seqused_k=None,
    softmax_scale=None,
    causal=False,
    qv=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    num_splits=1,
    pack_gqa=None,
    deterministic=False,
    sm_margin=0,
    return_attn_probs=False,
): ...


def fa3_old_dense(
    q, k, v, softmax_scale=None, causal=False, q_descale=None, k_descale=None, v_descale=None, window_size=(-1, -1),
    softcap=0.0, deterministic=False,
): ...  # fmt: skip


def fa3_old_varlen(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None, causal=False,
    window_size=(-1, -1), softcap=0.0, deterministic=False,
): ...  # fmt: skip


def fa3_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    qv=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    page_table=None,
    cu_seqlens_q=None,
    cu_seqlens_k_new=None,
    max_seqlen_q=None,
    rotary_seqlens=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    rotary_interleaved=True,
    scheduler_metadata=None,
    num_splits=0,
    pack_gqa=None,
    sm_margin=0,
    return_softmax_lse=False,
): ...


def fa4_dense(
    q,
    k,
    v,
    softmax_scale=None,
    causal=False,
    window_size=(None, None),
    learnable_sink=None,
    softcap=0.0,
    num_splits=1,
    pack_gqa=None,
    deterministic=False,
    score_mod=None,
    score_mod_bwd=None,
    mask_mod=None,
    aux_tensors=None,
    return_lse=False,
): ...


def fa4_varlen(
    q,
    k,
    v,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    max_seqlen_q=None,
    max_seqlen_k=None,
    seqused_q=None,
    seqused_k=None,
    page_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(None, None),
    learnable_sink=None,
    softcap=0.0,
    num_splits=1,
    pack_gqa=None,
    deterministic=False,
    score_mod=None,
    aux_tensors=None,
    return_lse=False,
): ...


class Recorder:
    """One fake entry point: binds each call to the library's signature (a keyword it does not take
    raises TypeError, as Python does) and returns (out, lse[, S_dmask]) made up by the test."""

    def __init__(self, name: str, like, returns):
        self.name, self.sig, self.returns, self.calls = name, inspect.signature(like), returns, []

    def __call__(self, *args, **kwargs):
        try:
            bound = self.sig.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self.name}() {exc}") from None
        self.calls.append({"args": dict(bound.arguments), "seed": torch.initial_seed()})
        return self.returns(bound.arguments)

    @property
    def only_call(self) -> dict:
        assert len(self.calls) == 1, f"{self.name}: {len(self.calls)} calls, expected one"
        return self.calls[0]["args"]


def assert_call(rec: Recorder, expected: dict):
    """The call bound exactly `expected` (tensors: the very objects, or equal values where the
    expectation is a plain list) and left every other parameter at its default."""
    got = rec.only_call
    assert set(got) == set(expected), f"{rec.name}: passed {sorted(got)}, expected {sorted(expected)}"
    for name, want in expected.items():
        have = got[name]
        if isinstance(want, torch.Tensor):
            assert have is want, f"{rec.name}({name}=): not the call's own tensor"
        elif isinstance(want, list):
            assert torch.is_tensor(have) and have.tolist() == want, f"{rec.name}({name}=): {have} != {want}"
            assert have.dtype == torch.int32, f"{rec.name}({name}=): dtype {have.dtype}, not int32"
        else:
            assert have == want and type(have) is type(want), f"{rec.name}({name}=): {have!r} != {want!r}"


OUT_MARK = 7.0


def made_up(n_lse_pad: int = 3, dmask: bool = False, tuple_result: bool = True):
    """(out, lse[, S_dmask]) of the right shapes, tagged: out filled with OUT_MARK, the LSE an
    arange in float16 padded along its query axis (a kernel may pad it), S_dmask negative where
    (q + k) % 3 == 0 (else 0 or positive), padded to 128 queries and keys."""

    def returns(a):
        q = a["q"]
        v = a["v_cache"] if "v_cache" in a else a["v"]
        out = torch.full((*q.shape[:-1], v.shape[-1]), OUT_MARK, dtype=torch.bfloat16)
        if q.dim() == 3:  # varlen: (H, total_q)
            lse = torch.arange(q.shape[1] * q.shape[0], dtype=torch.float16).reshape(q.shape[1], q.shape[0])
        else:
            lse = torch.arange(q.shape[0] * q.shape[2] * (q.shape[1] + n_lse_pad), dtype=torch.float16)
            lse = lse.reshape(q.shape[0], q.shape[2], q.shape[1] + n_lse_pad)[..., : q.shape[1]]
        lse.requires_grad_(False)
        if not tuple_result:
            return out
        if not dmask:
            return out, lse
        batch = q.shape[0] if q.dim() == 4 else len(a["cu_seqlens_q"]) - 1
        nq = q.shape[1] if q.dim() == 4 else a["max_seqlen_q"]
        grid = torch.arange(128)[:, None] + torch.arange(128)[None, :]
        # kept where >= 0: a kept probability may be 0 (a masked score), a dropped one is stored negated
        values = torch.where(grid % 3 == 0, -0.5, torch.where(grid % 5 == 0, 0.0, 0.5))
        s_dmask = values.expand(batch, q.shape[-2], 128, 128).clone()
        assert nq <= 128
        return out, lse, s_dmask

    return returns


def install(monkeypatch, module: str, **entries: Recorder) -> None:
    mod = ModuleType(module)
    for name, fn in entries.items():
        setattr(mod, name, fn)
    if "." in module:  # flash_attn.cute: its parent too
        parent_name, child = module.rsplit(".", 1)
        parent = ModuleType(parent_name)
        setattr(parent, child, mod)
        monkeypatch.setitem(sys.modules, parent_name, parent)
    monkeypatch.setitem(sys.modules, module, mod)


BASE = dict(batch=2, seqlen_q=20, seqlen_k=30, heads_q=4, heads_kv=2, head_dim=32, head_dim_v=32, dtype="bf16")
DECODE = dict(
    BASE,
    batch=3,
    seqlen_q=4,
    seqlen_k=100,
    entry="kvcache",
    cache_seqlens=(5, 60, 0),
    cache_new=True,
    causal=True,
    page_size=16,
    shuffled_pages=True,
)


def call_of(**kw):
    kw = {**BASE, "seeds": (5,), **kw}
    if kw.get("varlen"):
        n = max(kw["varlen"])
        kw.update(batch=len(kw["varlen"]), seqlen_q=n, seqlen_k=max(kw.get("varlen_k") or kw["varlen"]))
    case = Case.build(**kw)
    return leaf_call(case, make_inputs(case, 5, "cpu"))


def assert_output(result, rec: Recorder):
    assert (result.out == OUT_MARK).all() and result.out.dtype == torch.bfloat16
    got_lse = result.lse
    q = rec.only_call["q"]
    nq = q.shape[1] if q.dim() == 4 else None
    expected = made_up()(rec.only_call)[1]
    assert got_lse.dtype == torch.float32 and not got_lse.requires_grad
    assert torch.equal(got_lse, expected.float()), "the LSE is the kernel's, as float32"
    if nq is not None:
        assert got_lse.shape[-1] == nq


# ---------------------------------------------------------------- FA2


def test_fa2_dense_passes_every_option_and_reads_out_and_lse(monkeypatch):
    dense = Recorder("flash_attn_func", fa2_dense, made_up(dmask=True))
    install(monkeypatch, "flash_attn", flash_attn_func=dense)
    call = call_of(causal=True, window=(16, 4), softcap=5.0, alibi=True)
    call = dataclasses.replace(call, deterministic=True)
    result = FA2Adapter()(call)
    o = call.opts
    assert_call(
        dense,
        dict(
            q=call.q,
            k=call.k,
            v=call.v,
            dropout_p=0.0,
            softmax_scale=o.softmax_scale,
            causal=True,
            window_size=(16, 4),
            softcap=5.0,
            alibi_slopes=o.alibi_slopes,
            deterministic=True,
            return_attn_probs=True,
        ),
    )
    assert_output(result, dense)
    assert result.dropout_keep is None


def test_fa2_dense_dropout_seeds_from_the_call_and_reads_the_mask_from_s_dmask(monkeypatch):
    dense = Recorder("flash_attn_func", fa2_dense, made_up(dmask=True))
    install(monkeypatch, "flash_attn", flash_attn_func=dense)
    call = call_of(dropout_p=0.25)
    before = torch.get_rng_state()
    result = FA2Adapter()(call)
    assert torch.equal(torch.get_rng_state(), before), "the caller's RNG is left as it was"
    assert dense.calls[0]["seed"] == call.seed
    args = dense.only_call
    assert args["dropout_p"] == 0.25 and args["return_attn_probs"] is True and args["causal"] is False
    assert args["alibi_slopes"] is None and args["window_size"] == (-1, -1)
    grid = torch.arange(20)[:, None] + torch.arange(30)[None, :]
    assert result.dropout_keep.shape == (2, 4, 20, 30)
    assert torch.equal(result.dropout_keep, (grid % 3 != 0).expand(2, 4, 20, 30))


def test_fa2_varlen_passes_the_packed_batch_and_reads_one_mask_per_sequence(monkeypatch):
    varlen = Recorder("flash_attn_varlen_func", fa2_varlen, made_up(dmask=True))
    install(monkeypatch, "flash_attn", flash_attn_varlen_func=varlen)
    call = call_of(varlen=(5, 0, 40), varlen_k=(9, 3, 12), dropout_p=0.1, causal=True)
    result = FA2Adapter()(call)
    o = call.opts
    assert_call(
        varlen,
        dict(
            q=call.q,
            k=call.k,
            v=call.v,
            cu_seqlens_q=call.cu_seqlens,
            cu_seqlens_k=call.cu_seqlens_k,
            max_seqlen_q=40,
            max_seqlen_k=12,
            dropout_p=0.1,
            softmax_scale=o.softmax_scale,
            causal=True,
            window_size=(-1, -1),
            softcap=0.0,
            alibi_slopes=None,
            deterministic=False,
            return_attn_probs=True,
        ),
    )
    assert_output(result, varlen)
    assert varlen.calls[0]["seed"] == call.seed
    keep = result.dropout_keep
    assert [None if k is None else tuple(k.shape) for k in keep] == [(1, 4, 5, 9), None, (1, 4, 40, 12)]
    grid = torch.arange(40)[:, None] + torch.arange(12)[None, :]
    assert torch.equal(keep[2][0, 1], grid % 3 != 0)


def test_fa2_varlen_without_dropout_leaves_the_rng_alone_and_has_no_mask(monkeypatch):
    varlen = Recorder("flash_attn_varlen_func", fa2_varlen, made_up(dmask=True))
    install(monkeypatch, "flash_attn", flash_attn_varlen_func=varlen)
    torch.manual_seed(1234)
    result = FA2Adapter()(call_of(varlen=(7, 13)))
    assert varlen.calls[0]["seed"] == 1234, "no dropout: the RNG is not reseeded"
    assert result.dropout_keep is None
    assert varlen.only_call["max_seqlen_k"] == 13 and varlen.only_call["cu_seqlens_k"].tolist() == [0, 7, 20]


@pytest.mark.parametrize("alibi", [False, True], ids=["plain", "alibi"])
def test_fa2_kvcache_appends_through_the_library_with_its_block_table(monkeypatch, alibi):
    kv = Recorder("flash_attn_with_kvcache", fa2_kvcache, made_up())
    install(monkeypatch, "flash_attn", flash_attn_with_kvcache=kv)
    call = call_of(**DECODE, window=(20, 0), softcap=3.0, alibi=alibi)
    c = call.cache
    result = FA2Adapter()(call)
    expected = dict(
        q=call.q,
        k_cache=c.k_cache,
        v_cache=c.v_cache,
        k=c.k_new,
        v=c.v_new,
        cache_seqlens=c.cache_seqlens,
        block_table=c.block_table,
        softmax_scale=call.opts.softmax_scale,
        causal=True,
        window_size=(20, 0),
        softcap=3.0,
        return_softmax_lse=True,
    )
    if alibi:
        expected["alibi_slopes"] = call.opts.alibi_slopes
    got = kv.only_call
    if not alibi and "alibi_slopes" in got:  # left out, or passed as its default: the same call
        assert got.pop("alibi_slopes") is None
    assert_call(kv, expected)
    assert_output(result, kv)
    assert result.cache is None, "FA2 appends in place: the call's own cache tensors are the result"


# ---------------------------------------------------------------- FA3


def test_fa3_dense_passes_its_options_and_asks_for_the_lse(monkeypatch):
    dense = Recorder("flash_attn_func", fa3_dense, made_up())
    install(monkeypatch, "flash_attn_interface", flash_attn_func=dense)
    call = call_of(window=(8, 8), softcap=10.0, dtype="fp16")
    result = FA3Adapter()(call)
    assert_call(
        dense,
        dict(
            q=call.q,
            k=call.k,
            v=call.v,
            softmax_scale=call.opts.softmax_scale,
            causal=False,
            window_size=(8, 8),
            softcap=10.0,
            deterministic=False,
            return_attn_probs=True,
        ),
    )
    assert_output(result, dense)


def test_fa3_fp8_passes_the_descale_factors(monkeypatch):
    dense = Recorder("flash_attn_func", fa3_dense, made_up())
    install(monkeypatch, "flash_attn_interface", flash_attn_func=dense)
    call = call_of(dtype="e4m3", heads_kv=4, causal=True)
    FA3Adapter()(call)
    args = dense.only_call
    assert (args["q_descale"], args["k_descale"], args["v_descale"]) == call.descale
    assert all(args[n] is t for n, t in zip(("q_descale", "k_descale", "v_descale"), call.descale))
    assert args["causal"] is True and args["return_attn_probs"] is True


def test_fa3_varlen_passes_the_packed_batch(monkeypatch):
    varlen = Recorder("flash_attn_varlen_func", fa3_varlen, made_up())
    install(monkeypatch, "flash_attn_interface", flash_attn_varlen_func=varlen)
    call = call_of(varlen=(11, 0, 3), causal=True, softcap=2.0)
    result = FA3Adapter()(call)
    assert_call(
        varlen,
        dict(
            q=call.q,
            k=call.k,
            v=call.v,
            cu_seqlens_q=call.cu_seqlens,
            cu_seqlens_k=call.cu_seqlens,
            max_seqlen_q=11,
            max_seqlen_k=11,
            softmax_scale=call.opts.softmax_scale,
            causal=True,
            window_size=(-1, -1),
            softcap=2.0,
            deterministic=False,
            return_attn_probs=True,
        ),
    )
    assert_output(result, varlen)


def test_fa3_without_return_attn_probs_is_called_again_without_it(monkeypatch):
    """An FA3 release whose flash_attn_func has no return_attn_probs (and returns (out, lse))."""
    dense = Recorder("flash_attn_func", fa3_old_dense, made_up())
    install(monkeypatch, "flash_attn_interface", flash_attn_func=dense)
    call = call_of(causal=True)
    result = FA3Adapter()(call)
    assert_call(
        dense,
        dict(
            q=call.q,
            k=call.k,
            v=call.v,
            softmax_scale=call.opts.softmax_scale,
            causal=True,
            window_size=(-1, -1),
            softcap=0.0,
            deterministic=False,
        ),
    )
    assert_output(result, dense)


def test_fa3_returning_out_alone_has_no_lse(monkeypatch):
    dense = Recorder("flash_attn_func", fa3_dense, made_up(tuple_result=False))
    install(monkeypatch, "flash_attn_interface", flash_attn_func=dense)
    result = FA3Adapter()(call_of())
    assert (result.out == OUT_MARK).all() and result.lse is None


def test_fa3_an_unrelated_type_error_is_raised(monkeypatch):
    def broken(*args, **kwargs):
        raise TypeError("expected a float for softcap")

    install(monkeypatch, "flash_attn_interface", flash_attn_func=broken)
    with pytest.raises(TypeError, match="softcap"):
        FA3Adapter()(call_of())


def test_fa3_kvcache_names_the_block_table_page_table(monkeypatch):
    kv = Recorder("flash_attn_with_kvcache", fa3_kvcache, made_up())
    install(monkeypatch, "flash_attn_interface", flash_attn_with_kvcache=kv)
    call = call_of(**{**DECODE, "dtype": "fp16"})
    c = call.cache
    result = FA3Adapter()(call)
    assert_call(
        kv,
        dict(
            q=call.q,
            k_cache=c.k_cache,
            v_cache=c.v_cache,
            k=c.k_new,
            v=c.v_new,
            cache_seqlens=c.cache_seqlens,
            page_table=c.block_table,
            softmax_scale=call.opts.softmax_scale,
            causal=True,
            window_size=(-1, -1),
            softcap=0.0,
            return_softmax_lse=True,
        ),
    )
    assert_output(result, kv)


def test_fa3_kvcache_without_append_or_pages_passes_neither(monkeypatch):
    kv = Recorder("flash_attn_with_kvcache", fa3_kvcache, made_up())
    install(monkeypatch, "flash_attn_interface", flash_attn_with_kvcache=kv)
    decode = {k: v for k, v in DECODE.items() if k not in ("page_size", "shuffled_pages")}
    call = call_of(**{**decode, "cache_new": False, "cache_seqlens": (5, 60, 1)})
    FA3Adapter()(call)
    args = kv.only_call
    assert {"k", "v", "page_table"}.isdisjoint(args)
    assert args["cache_seqlens"] is call.cache.cache_seqlens


# ---------------------------------------------------------------- FA4


@pytest.mark.parametrize(
    "adapter, window", [(FA4Adapter, (None, 0)), (FA4RawWindowAdapter, (-1, 0))], ids=["fa4", "fa4-raw-window"]
)
def test_fa4_dense_spells_the_window_its_way_and_asks_for_the_lse(monkeypatch, adapter, window):
    dense = Recorder("flash_attn_func", fa4_dense, made_up())
    install(monkeypatch, "flash_attn.cute", flash_attn_func=dense)
    call = call_of(causal=True, window=(-1, 0), softcap=4.0, sinks=True)
    result = adapter()(call)
    assert_call(
        dense,
        dict(
            q=call.q,
            k=call.k,
            v=call.v,
            softmax_scale=call.opts.softmax_scale,
            causal=True,
            window_size=window,
            softcap=4.0,
            deterministic=False,
            learnable_sink=call.sink,
            return_lse=True,
        ),
    )
    assert_output(result, dense)


def test_fa4_varlen_passes_the_packed_batch(monkeypatch):
    varlen = Recorder("flash_attn_varlen_func", fa4_varlen, made_up())
    install(monkeypatch, "flash_attn.cute", flash_attn_varlen_func=varlen)
    call = call_of(varlen=(6, 17), varlen_k=(30, 2), window=(4, -1))
    call = dataclasses.replace(call, deterministic=True)
    result = FA4Adapter()(call)
    assert_call(
        varlen,
        dict(
            q=call.q,
            k=call.k,
            v=call.v,
            cu_seqlens_q=call.cu_seqlens,
            cu_seqlens_k=call.cu_seqlens_k,
            max_seqlen_q=17,
            max_seqlen_k=30,
            softmax_scale=call.opts.softmax_scale,
            causal=False,
            window_size=(4, None),
            softcap=0.0,
            deterministic=True,
            return_lse=True,
        ),
    )
    assert_output(result, varlen)


def test_fa4_kvcache_appends_itself_then_calls_varlen_with_seqused_k(monkeypatch):
    varlen = Recorder("flash_attn_varlen_func", fa4_varlen, made_up())
    install(monkeypatch, "flash_attn.cute", flash_attn_varlen_func=varlen)
    call = call_of(**DECODE, window=(30, 0), sinks=True)
    c = call.cache
    k_before = c.k_cache.clone()
    result = FA4Adapter()(call)
    assert_call(
        varlen,
        dict(
            q=call.q,
            k=c.k_cache,
            v=c.v_cache,
            seqused_k=[9, 64, 4],
            page_table=c.block_table,
            softmax_scale=call.opts.softmax_scale,
            causal=True,
            window_size=(30, 0),
            softcap=0.0,
            learnable_sink=call.sink,
            return_lse=True,
        ),
    )
    assert_output(result, varlen)
    # the new tokens of batch element 1 are at its positions 60..63, on the pages its block table names
    page = c.page_size
    for j in range(4):
        pos = 60 + j
        block = int(c.block_table[1, pos // page])
        assert torch.equal(c.k_cache[block, pos % page], c.k_new[1, j])
    assert not torch.equal(c.k_cache, k_before)


def test_fa3_varlen_without_return_attn_probs_is_called_again_as_varlen(monkeypatch):
    """The retry without return_attn_probs goes to the entry point that refused it, the varlen one
    for a varlen call (never flash_attn_func with the packed batch)."""
    dense = Recorder("flash_attn_func", fa3_old_dense, made_up())
    varlen = Recorder("flash_attn_varlen_func", fa3_old_varlen, made_up())
    install(monkeypatch, "flash_attn_interface", flash_attn_func=dense, flash_attn_varlen_func=varlen)
    call = call_of(varlen=(3, 9), varlen_k=(12, 1), causal=True)
    result = FA3Adapter()(call)
    assert not dense.calls
    assert_call(
        varlen,
        dict(
            q=call.q,
            k=call.k,
            v=call.v,
            cu_seqlens_q=call.cu_seqlens,
            cu_seqlens_k=call.cu_seqlens_k,
            max_seqlen_q=9,
            max_seqlen_k=12,
            softmax_scale=call.opts.softmax_scale,
            causal=True,
            window_size=(-1, -1),
            softcap=0.0,
            deterministic=False,
        ),
    )
    assert_output(result, varlen)


# ---------------------------------------------------------------- the shared options


def test_an_option_a_case_needs_is_passed_even_where_the_entry_does_not_take_it():
    """ALiBi slopes, descale factors and sink logits go to the kernel whenever the call has them:
    an entry without the keyword raises, never runs the case without them. Options the call leaves
    at their off value follow the entry's keywords."""
    from gate.kernels.entries import Keywords, call_options, unbounded_as_minus_one

    plain = call_of(causal=True)
    assert call_options(plain, Keywords.named("causal"), "return_lse", unbounded_as_minus_one) == {"causal": True}
    everything = call_options(plain, Keywords(any=True), "return_lse", unbounded_as_minus_one)
    assert everything["alibi_slopes"] is None and everything["return_lse"] is True
    assert "learnable_sink" not in everything and "q_descale" not in everything
    for kw, keys in [
        (dict(alibi=True), {"alibi_slopes"}),
        (dict(sinks=True), {"learnable_sink"}),
        (dict(dtype="e4m3", heads_kv=4), {"q_descale", "k_descale", "v_descale"}),
    ]:
        call = call_of(**kw)
        assert set(call_options(call, Keywords(), "return_lse", unbounded_as_minus_one)) == keys, kw
    # a forced knob too (a decode case's knobs: the entries that do not expose it were skipped)
    for kw, knobs in [
        (dict(num_splits=3), {"num_splits": 3}),
        (dict(pack_gqa=False), {"pack_gqa": False}),
        (dict(kv_layout="HND"), {"kv_layout": "HND"}),
    ]:
        call = call_of(**DECODE, **kw)
        assert call_options(call, Keywords(), "return_lse", unbounded_as_minus_one) == knobs, kw


# ---------------------------------------------------------------- decode knobs


def test_fa2_kvcache_passes_a_forced_num_splits(monkeypatch):
    kv = Recorder("flash_attn_with_kvcache", fa2_kvcache, made_up())
    install(monkeypatch, "flash_attn", flash_attn_with_kvcache=kv)
    call = call_of(**DECODE, num_splits=3)
    FA2Adapter()(call)
    assert kv.only_call["num_splits"] == 3 and "pack_gqa" not in kv.only_call


@pytest.mark.parametrize("knobs", [dict(num_splits=4, pack_gqa=True), dict(num_splits=1, pack_gqa=False)])
def test_fa3_kvcache_passes_forced_knobs(monkeypatch, knobs):
    kv = Recorder("flash_attn_with_kvcache", fa3_kvcache, made_up())
    install(monkeypatch, "flash_attn_interface", flash_attn_with_kvcache=kv)
    call = call_of(**{**DECODE, "dtype": "fp16"}, **knobs)
    c = call.cache
    result = FA3Adapter()(call)
    assert_call(
        kv,
        dict(
            q=call.q,
            k_cache=c.k_cache,
            v_cache=c.v_cache,
            k=c.k_new,
            v=c.v_new,
            cache_seqlens=c.cache_seqlens,
            page_table=c.block_table,
            softmax_scale=call.opts.softmax_scale,
            causal=True,
            window_size=(-1, -1),
            softcap=0.0,
            return_softmax_lse=True,
            **knobs,
        ),
    )
    assert_output(result, kv)


def test_fa4_decode_passes_forced_knobs_to_varlen(monkeypatch):
    varlen = Recorder("flash_attn_varlen_func", fa4_varlen, made_up())
    install(monkeypatch, "flash_attn.cute", flash_attn_varlen_func=varlen)
    call = call_of(**DECODE, num_splits=2, pack_gqa=True)
    FA4Adapter()(call)
    args = varlen.only_call
    assert args["num_splits"] == 2 and args["pack_gqa"] is True and "kv_layout" not in args


def test_which_flash_generation_exposes_which_knob(monkeypatch):
    """FA2: num_splits; FA3: num_splits and pack_gqa unless its build left split / packgqa out; FA4:
    what its flash_attn_varlen_func takes; none an HND cache. A knob not exposed is a SKIP saying so."""
    import gate.kernels.flash_attn as fa

    contiguous = {k: v for k, v in DECODE.items() if k not in ("page_size", "shuffled_pages")}
    splits = Case.build(**{**contiguous, "dtype": "fp16", "num_splits": 3})
    packed = splits.with_fields(num_splits=0, pack_gqa=True)
    hnd = splits.with_fields(num_splits=0, kv_layout="HND")
    assert FA2Adapter().capabilities().unsupported_reason(splits, "cuda") is None
    assert FA2Adapter().capabilities().unsupported_reason(packed, "cuda").startswith("no pack_gqa knob")
    for case in (splits, packed):
        assert FA3Adapter().capabilities().unsupported_reason(case, "cuda") is None
    monkeypatch.setattr(fa, "fa3_build_flags", lambda: {"FLASHATTENTION_DISABLE_SPLIT": True})
    assert FA3Adapter().capabilities().unsupported_reason(splits, "cuda").startswith("no num_splits knob")
    assert FA3Adapter().capabilities().unsupported_reason(packed, "cuda") is None
    monkeypatch.setattr(fa, "fa3_build_flags", lambda: {"FLASHATTENTION_DISABLE_PACKGQA": True})
    assert FA3Adapter().capabilities().unsupported_reason(packed, "cuda").startswith("no pack_gqa knob")
    install(monkeypatch, "flash_attn.cute", flash_attn_varlen_func=fa4_varlen, flash_attn_func=fa4_dense)
    for case in (splits, packed):
        assert FA4Adapter().capabilities().unsupported_reason(case, "cuda") is None
    for adapter in (FA2Adapter(), FA3Adapter(), FA4Adapter()):
        assert adapter.capabilities().unsupported_reason(hnd, "cuda").startswith("no HND cache layout")

    def fa4_varlen_without_knobs(q, k, v, cu_seqlens_q=None, seqused_k=None, page_table=None, return_lse=False): ...

    install(monkeypatch, "flash_attn.cute", flash_attn_varlen_func=fa4_varlen_without_knobs, flash_attn_func=fa4_dense)
    assert FA4Adapter().capabilities().unsupported_reason(splits, "cuda").startswith("no num_splits knob")
    assert FA4Adapter().capabilities().unsupported_reason(packed, "cuda").startswith("no pack_gqa knob")


@pytest.mark.parametrize("major, refused", [(8, True), (9, True), (10, False), (11, False), (12, True)])
def test_fa4_refuses_a_forced_split_where_its_forward_asserts_it_cannot(monkeypatch, major, refused):
    """FA4 4.0.0b36 asserts 'SplitKV not supported on SM 9.0' (and 8.0, 12.0): on an H100 the
    splits cases were ERROR rows. They SKIP there, saying so, and run where FA4 splits (SM100)."""
    import gate.kernels.flash_attn as fa

    install(monkeypatch, "flash_attn.cute", flash_attn_varlen_func=fa4_varlen, flash_attn_func=fa4_dense)
    monkeypatch.setattr(fa.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(fa.torch.cuda, "get_device_capability", lambda *a: (major, 0))
    contiguous = {k: v for k, v in DECODE.items() if k not in ("page_size", "shuffled_pages")}
    splits = Case.build(**{**contiguous, "num_splits": 3})
    reason = FA4Adapter().unsupported_reason(splits, "cuda")
    assert (reason == fa.SPLIT_KV_REASON.format(major=major)) if refused else reason is None
    assert f"SM {major}.x" in fa.SPLIT_KV_REASON.format(major=major)
    for other in (splits.with_fields(num_splits=1), splits.with_fields(num_splits=0, pack_gqa=True)):
        assert FA4Adapter().unsupported_reason(other, "cuda") is None


def test_fa4_judges_dsink_where_its_backward_takes_the_sink(monkeypatch):
    """FA4 builds whose interface backward takes learnable_sink return dsink (it is judged); a build
    without it, or one whose interface does not import, is judged without dsink."""

    def fa4_dense_with_sink(q, k, v, softmax_scale=None, causal=False, learnable_sink=None, return_lse=False): ...

    def bwd_with_sink(q, k, v, out, dout, lse, softmax_scale, causal, dlse=None, learnable_sink=None): ...

    def bwd_without_sink(q, k, v, out, dout, lse, softmax_scale, causal, dlse=None): ...

    install(monkeypatch, "flash_attn.cute", flash_attn_func=fa4_dense_with_sink)
    assert not FA4Adapter().capabilities().sink_grad  # no flash_attn.cute.interface
    sinks = Case.build(**BASE, sinks=True)
    for bwd, judged in ((bwd_with_sink, True), (bwd_without_sink, False)):
        interface = ModuleType("flash_attn.cute.interface")
        interface._flash_attn_bwd = bwd
        monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", interface)
        caps = FA4Adapter().capabilities()
        assert caps.supports(Feature.SINKS) and caps.sink_grad is judged
        # what the judge then asks the backward for: dq, dk, dv and, where judged, dsink
        names = grad_names(FA4Adapter(), sinks, make_inputs(sinks, 0, "cpu"))
        assert names == ("dq", "dk", "dv", "dsink") if judged else names == ("dq", "dk", "dv")
