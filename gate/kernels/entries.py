"""The flash_attn convention's three entry points as call objects, shared by the flash-attn
adapters (gate/kernels/flash_attn.py) and a user's kernel family (gate/kernels/user.py), so how a
varlen or a kvcache entry point is called lives here once:

    dense    fn(q, k, v, **options)                                      q/k/v (B, N, H, D)
    varlen   fn(q, k, v, cu_seqlens_q=, cu_seqlens_k=, max_seqlen_q=, max_seqlen_k=, [seqused_k=],
                **options)                                               packed (total, H, D)
    kvcache  fn(q, k_cache, v_cache, cache_seqlens=, [k=, v=], [block_table= | page_table=], **options)

An entry knows its function, the keywords it takes (a library's documented API, or what a user
function's signature reads), how it spells the window, and which flag asks it for the LSE. A
keyword it does not take is left out; the cases that need one were SKIPPED by capabilities(). A
tuple result is (out, lse, ...).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

import torch

from gate.kernels.base import KernelCall, KernelOutput

DESCALE_KEYWORDS = ("q_descale", "k_descale", "v_descale")


@dataclass(frozen=True)
class Keywords:
    """The keywords an entry point takes: those named, or all of them (`any`: it takes **kwargs)."""

    names: frozenset[str] = frozenset()
    any: bool = False

    @classmethod
    def named(cls, *names: str) -> "Keywords":
        return cls(frozenset(names))

    @classmethod
    def of(cls, fn) -> "Keywords":
        """What a function's signature takes (nothing, if it has no signature to read)."""
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            params = {}
        return cls(frozenset(params), any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()))

    def takes(self, name: str) -> bool:
        return self.any or name in self.names

    def without(self, name: str) -> "Keywords":
        return Keywords(self.names - {name}, self.any)


def unbounded_as_minus_one(window: tuple[int, int]) -> tuple:
    """flash_attn_func's window spelling: (left, right), -1 for an unbounded side."""
    return tuple(window)


def call_options(call: KernelCall, takes: Keywords, lse_flag: str, window: Callable[[tuple[int, int]], tuple]) -> dict:
    """The keywords every entry point gets, those it takes: a keyword left out keeps the entry's
    default (flash-attn's: scale 1/sqrt(d), not causal). ALiBi slopes, descale factors and sink
    logits are passed whenever the call has them, taken or not: only the cases that need them carry
    them, and capabilities() skipped those for an entry without the keyword, so a mismatch raises
    instead of running without them."""
    o = call.opts
    optional = {
        "softmax_scale": o.softmax_scale,
        "causal": o.causal,
        "window_size": window(o.window),
        "softcap": o.softcap,
        "alibi_slopes": o.alibi_slopes,
        "deterministic": call.deterministic,
        lse_flag: True,
        "dropout_p": o.dropout_p,
    }
    kwargs = {k: val for k, val in optional.items() if takes.takes(k)}
    if o.alibi_slopes is not None:
        kwargs["alibi_slopes"] = o.alibi_slopes
    if call.descale is not None:
        kwargs.update(zip(DESCALE_KEYWORDS, call.descale))
    if call.sink is not None:
        kwargs["learnable_sink"] = call.sink
    # forced knobs only, passed as ALiBi slopes are: capabilities() skipped the case for an entry
    # that does not expose the knob
    kwargs.update(call.knobs.options())
    return kwargs


def split_result(result) -> KernelOutput:
    """(out, lse, ...) or out alone: the LSE detached, as float32."""
    if isinstance(result, (tuple, list)):
        out = result[0]
        lse = result[1] if len(result) > 1 and isinstance(result[1], torch.Tensor) else None
        return KernelOutput(out=out, lse=None if lse is None else lse.detach().float())
    return KernelOutput(out=result)


@dataclass(frozen=True)
class EntryPoint:
    fn: Callable
    takes: Keywords
    lse_flag: str = "return_attn_probs"
    window: Callable[[tuple[int, int]], tuple] = unbounded_as_minus_one

    def options(self, call: KernelCall) -> dict:
        return call_options(call, self.takes, self.lse_flag, self.window)

    def result(self, call: KernelCall, **extra) -> Any:
        """The function's own result; `extra` keywords are added last (they override options)."""
        raise NotImplementedError

    def __call__(self, call: KernelCall, **extra) -> KernelOutput:
        return split_result(self.result(call, **extra))


class DenseEntryPoint(EntryPoint):
    """flash_attn_func: q, k, v (B, N, H, D)."""

    def result(self, call: KernelCall, **extra) -> Any:
        return self.result_on(call.q, call.k, call.v, call, **extra)

    def result_on(self, q, k, v, call: KernelCall, **extra) -> Any:
        """On other q, k, v than the call's (one varlen sequence of it)."""
        return self.fn(q, k, v, **{**self.options(call), **extra})


class VarlenEntryPoint(EntryPoint):
    """flash_attn_varlen_func: the packed batch in ONE call, with cu_seqlens_q/k and max_seqlen_q/k
    (and seqused_k, the true key count per sequence, where the entry takes it)."""

    def result(self, call: KernelCall, **extra) -> Any:
        cu, cu_k = call.cu_seqlens, call.keys_cu_seqlens  # key lengths may differ from the queries'
        kwargs = self.options(call)
        if self.takes.takes("seqused_k"):
            kwargs["seqused_k"] = (cu_k[1:] - cu_k[:-1]).to(torch.int32)
        kwargs.update(extra)
        return self.fn(
            call.q,
            call.k,
            call.v,
            cu_seqlens_q=cu,
            cu_seqlens_k=cu_k,
            max_seqlen_q=call.max_seqlen,
            max_seqlen_k=call.keys_max_seqlen,
            **kwargs,
        )


@dataclass(frozen=True)
class KVCacheEntryPoint(EntryPoint):
    """flash_attn_with_kvcache: q (B, Nq, Hq, D) against k_cache/v_cache with cache_seqlens; k=/v=
    new tokens the function appends into the cache in place; the block table of a paged cache
    under the entry's name for it (`paged`: FA2 says block_table, FA3 page_table). Forward only."""

    lse_flag: str = "return_softmax_lse"
    paged: str = "block_table"

    def result(self, call: KernelCall, **extra) -> Any:
        c = call.cache
        kwargs = self.options(call)
        kwargs.pop("deterministic", None)  # a forward-only call: no backward to make deterministic
        kwargs.pop("dropout_p", None)
        if c.k_new is not None:
            kwargs.update(k=c.k_new, v=c.v_new)
        if c.block_table is not None:
            kwargs[self.paged] = c.block_table
        kwargs.update(extra)
        return self.fn(call.q, c.k_cache, c.v_cache, cache_seqlens=c.cache_seqlens, **kwargs)
