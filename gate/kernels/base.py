"""What every adapter is: a capability declaration and one call in the flash_attn_func convention.

The sweep asks an adapter two questions before running a case: is the kernel here at all
(`unavailable_reason`: not installed, no GPU) and can it run this case (`Capabilities.
unsupported_reason`, gate/kernels/capabilities.py: each feature the case needs and the kernel lacks
has its reason as data).
Either answer becomes a SKIPPED row with the reason, never a silent drop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from gate.attention.inputs import offsets
from gate.attention.kvcache import CacheInputs
from gate.attention.reference import AttnOptions
from gate.core.cases import Case, Knobs, first_visible_key
from gate.kernels.capabilities import Capabilities


def realised_keep_probability(p: float, levels: int) -> float:
    """The keep probability a kernel actually draws with for dropout p (see Capabilities)."""
    if not levels:
        return 1.0 - p

    return (math.floor((1.0 - p) * (levels - 1)) + 1) / levels


@dataclass(frozen=True)
class KernelCall:
    """One call: q/k/v track gradients (dense (B, N, H, D) or packed varlen): contiguous leaves, or
    under a case's `layout` strided views of leaves, which the kernel must honour."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    opts: AttnOptions
    cu_seqlens: torch.Tensor | None = None
    max_seqlen: int = 0
    seqlens: tuple[int, ...] | None = None
    deterministic: bool = False
    seed: int = 0
    want_lse: bool = True  # False when timing: adapters may skip extra work done only to expose the LSE
    # a decode call carries its cache (the adapter writes appended tokens into these very
    # tensors, as flash_attn_with_kvcache does; q/k/v above are then q, k_cache, v_cache); `sink` is
    # the (Hq,) float32 learnable sink logits (a leaf with requires_grad when the backward is run).
    cache: "CacheInputs | None" = None
    sink: torch.Tensor | None = None
    # varlen keys whose lengths differ from the queries' (None: cu_seqlens serves both)
    cu_seqlens_k: torch.Tensor | None = None
    max_seqlen_k: int = 0
    seqlens_k: tuple[int, ...] | None = None
    # an fp8 call: q/k/v are fp8 (no gradients) and these float32 (batch, KV heads) factors
    # dequantize them (value = fp8 * descale), FA3's q_descale, k_descale, v_descale
    descale: "tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None" = None
    # a decode call's forced kernel options (gate/core/cases.py KNOBS); defaults: the kernel's choice.
    # kv_layout "HND" also means call.cache's tensors are laid out (batch or pages, heads, tokens, dim).
    knobs: Knobs = Knobs()

    @property
    def keys_cu_seqlens(self) -> torch.Tensor | None:
        return self.cu_seqlens_k if self.cu_seqlens_k is not None else self.cu_seqlens

    @property
    def keys_max_seqlen(self) -> int:
        return self.max_seqlen_k if self.cu_seqlens_k is not None else self.max_seqlen


@dataclass(frozen=True)
class KernelOutput:
    """out is differentiable w.r.t. the call's q/k/v. lse follows the reference's layout
    ((B, H, Nq) dense, (H, total) varlen) or is None when the kernel does not expose it.
    dropout_keep is the mask the kernel used ((B, H, Nq, Nk) bool, or a per-sequence list)."""

    out: torch.Tensor
    lse: torch.Tensor | None = None
    dropout_keep: torch.Tensor | list[torch.Tensor] | None = None
    # decode: (k_cache, v_cache) after the call; None = the call's own cache tensors,
    # written in place (flash_attn_with_kvcache's way)
    cache: tuple[torch.Tensor, torch.Tensor] | None = None


def entry_kind(call: KernelCall) -> str:
    """The entry point a call is for: kvcache (a decode step on its cache), varlen (a packed
    batch with cu_seqlens) or dense."""
    if call.cache is not None:
        return "kvcache"
    return "varlen" if call.cu_seqlens is not None else "dense"


class NoKernel(Exception):
    """An adapter's refusal of one call it cannot make (SDPA's "No available kernel" for its
    backend): the case is SKIPPED with this message, not an ERROR."""


class KernelAdapter(ABC):
    name: str = ""
    description: str = ""

    def unavailable_reason(self) -> str | None:
        """None when the kernel can be called here; else why not (package missing, no GPU)."""
        return None

    @abstractmethod
    def capabilities(self) -> Capabilities: ...

    def unsupported_reason(self, case: Case, device: str) -> str | None:
        """Why this kernel cannot run `case` here, or None. A kernel family answers per entry point."""
        return self.capabilities().unsupported_reason(case, device)

    def entry_for(self, case: Case) -> KernelAdapter | None:
        """The adapter that serves `case`: the kernel itself; a family's entry point of the case's
        kind (None where it has none)."""
        return self

    @abstractmethod
    def __call__(self, call: KernelCall) -> KernelOutput: ...

    def version(self) -> str:
        return torch.__version__

    def prepare(self, case: Case) -> None:
        """Per-case set-up outside the measured call (e.g. compile once per shape family)."""

    def deterministic_scope(self):
        """A context that forward AND backward run inside when determinism is asked for. Kernels
        that take `deterministic=` read KernelCall.deterministic; this is for those that read a
        global switch instead (SDPA: torch.use_deterministic_algorithms)."""
        return contextlib.nullcontext()


class DelegatingAdapter(KernelAdapter):
    """Another adapter with only its call changed (a planted bug, a planted delay): what it runs,
    declares and is named comes from the inner adapter, per entry point too (unsupported_reason),
    so a wrapper can never claim more, or less, than the kernel it wraps."""

    def __init__(self, inner: KernelAdapter, description: str):
        self.inner = inner
        self.name = inner.name
        self.description = description

    def unavailable_reason(self):
        return self.inner.unavailable_reason()

    def capabilities(self):
        return self.inner.capabilities()

    def unsupported_reason(self, case: Case, device: str) -> str | None:
        return self.inner.unsupported_reason(case, device)

    def entry_for(self, case: Case) -> KernelAdapter | None:
        return self.inner.entry_for(case)

    def version(self) -> str:
        return self.inner.version()

    def prepare(self, case: Case) -> None:
        self.inner.prepare(case)

    def deterministic_scope(self):
        return self.inner.deterministic_scope()


def sequence_call(call: KernelCall, rows: slice, keys: slice) -> KernelCall:
    """The call as one varlen sequence sees it: a packed custom bias (query and key axes over all
    tokens, each sequence's block on its own rows and keys) becomes that sequence's block, a view,
    so a bias gradient still reaches the packed leaf."""
    bias = call.opts.bias
    if bias is None:
        return call
    return dataclasses.replace(call, opts=dataclasses.replace(call.opts, bias=bias[:, :, rows, keys]))


def per_sequence(call: KernelCall, dense_fn) -> KernelOutput:
    """Run a dense-only kernel on each varlen sequence separately and pack the results:
    `dense_fn(q, k, v, sequence_call)` for each non-empty sequence.

    Used by adapters without a varlen API: the kernel is still what computes every sequence;
    zero-length sequences are not sent to it (they have no rows). The offsets come from the
    host-side lengths when the call has them: `cu_seqlens.tolist()` on a GPU tensor is a device
    sync in every call, which made the timed forward of varlen cases host-bound and noisy (H200:
    the pr suite's varlen speed ratios moved 7-11% between two runs of an unchanged kernel)."""
    starts = offsets(call.seqlens) if call.seqlens is not None else call.cu_seqlens.tolist()
    key_lengths = call.seqlens_k if call.cu_seqlens_k is not None else call.seqlens
    keys = offsets(key_lengths) if key_lengths is not None else call.keys_cu_seqlens.tolist()
    outs, lses, keeps = [], [], []
    for a, z, ka, kz in zip(starts[:-1], starts[1:], keys[:-1], keys[1:]):
        if z == a:
            keeps.append(None)  # the reference wants one dropout mask per sequence, empty ones as None
            continue
        part = dense_fn(
            call.q[a:z][None], call.k[ka:kz][None], call.v[ka:kz][None], sequence_call(call, slice(a, z), slice(ka, kz))
        )
        outs.append(part.out[0])
        lses.append(None if part.lse is None else part.lse[0])
        keeps.append(part.dropout_keep)
    out = torch.cat(outs, dim=0)
    lse = None if any(x is None for x in lses) else torch.cat(lses, dim=-1)
    keep = keeps if any(k is not None for k in keeps) else None
    return KernelOutput(out=out, lse=lse, dropout_keep=keep)


def per_sequence_seeded(call: KernelCall, dense_fn) -> KernelOutput:
    """per_sequence for a kernel that draws its own dropout mask: the i-th sequence sent to it
    (empty ones are not) draws from call.seed + i, so no two sequences share a mask:
    `dense_fn(q, k, v, sequence_call, seed)`."""
    seeds = itertools.count(call.seed)
    return per_sequence(call, lambda q, k, v, seq_call: dense_fn(q, k, v, seq_call, next(seeds)))


def flash_lse_to_reference(lse: torch.Tensor, seqlen_q: int) -> torch.Tensor:
    """Flash kernels may pad the LSE's query dimension (e.g. to a multiple of 32): trim it."""
    return lse[..., :seqlen_q]


# --- the kernel side of a KV cache -------------------------------------------------
# A page walk of its own (logical page pos // page -> block_table -> physical block), sharing no
# code with the references' flat gather in gate/attention/kvcache.py.


def read_pages(cache: torch.Tensor, block_table, page: int, b: int, start: int, stop: int) -> torch.Tensor:
    """Tokens start..stop-1 of batch element b: the pages they lie on, looked up in the block table
    (one gather), laid end to end, then trimmed (contiguous cache: one slice of row b)."""
    if block_table is None:
        return cache[b, start:stop]
    if stop <= start:
        return cache[0, :0]
    first, last = start // page, (stop - 1) // page
    blocks = cache[block_table[b, first : last + 1].long()]  # (pages, page, H, D)
    flat = blocks.reshape(-1, *cache.shape[2:])
    return flat[start - first * page : stop - first * page]


def write_pages(cache: torch.Tensor, block_table, page: int, b: int, start: int, values: torch.Tensor) -> None:
    """Write `values` (n, H, D) as tokens start.. of batch element b, page by page."""
    if block_table is None:
        cache[b, start : start + values.shape[0]] = values
        return
    pos, done = start, 0
    while done < values.shape[0]:
        block, offset = int(block_table[b, pos // page]), pos % page
        n = min(page - offset, values.shape[0] - done)
        cache[block, offset : offset + n] = values[done : done + n]
        pos, done = pos + n, done + n


def append_new_tokens(c: CacheInputs) -> None:
    """The append of a kernel without one: each batch element's new k/v written into its cache
    (or pages) at its cached length, in place, as flash_attn_with_kvcache would."""
    if c.k_new is None:
        return
    for b, start in enumerate(c.cached):
        write_pages(c.k_cache, c.block_table, c.page_size, b, start, c.k_new[b])
        write_pages(c.v_cache, c.block_table, c.page_size, b, start, c.v_new[b])


def gathered_decode(call: KernelCall, dense_fn) -> KernelOutput:
    """A decode step for kernels without a KV-cache API (SDPA, Flex): the adapter appends the new
    tokens into the cache itself, gathers each batch element's keys by the page walk, and runs the
    dense kernel on them (q (1, Nq, H, D) against (1, L_b, Hkv, D), bottom-right aligned). What is
    judged is the kernel's attention; the append and the paging are this emulation's."""
    c = call.cache
    q = call.q
    bsz, nq, hq, _ = q.shape
    dv_dim = c.v_cache.shape[-1]
    cached_lengths = c.cached
    append_new_tokens(c)
    lengths = [n + (0 if c.k_new is None else c.k_new.shape[1]) for n in cached_lengths]
    # keys before the first one any query sees are not gathered (the cut keeps bottom-right alignment),
    # as a kernel skips the key blocks its window excludes: a cache may hold NaN there
    firsts = [first_visible_key(nq, n, call.opts.window) for n in lengths]
    if len(set(lengths)) == 1 and lengths[0] > 0:  # equal lengths: one batched call (as the speed cases have)
        n, first = lengths[0], firsts[0]
        if c.block_table is None:  # a view of the cache: no copy in the timed call
            kb, vb = c.k_cache[:, first:n], c.v_cache[:, first:n]
        else:
            kb = torch.stack([read_pages(c.k_cache, c.block_table, c.page_size, b, first, n) for b in range(bsz)])
            vb = torch.stack([read_pages(c.v_cache, c.block_table, c.page_size, b, first, n) for b in range(bsz)])
        part = dense_fn(q, kb, vb)
        return KernelOutput(out=part.out.detach(), lse=None if part.lse is None else part.lse.detach().float())
    outs, lses = [], []
    for b, nk in enumerate(lengths):
        if nk == 0:  # no key: nothing to call the kernel on; out 0, LSE -inf by convention
            outs.append(torch.zeros(nq, hq, dv_dim, dtype=q.dtype, device=q.device))
            lses.append(torch.full((hq, nq), float("-inf"), device=q.device))
            continue
        kb = read_pages(c.k_cache, c.block_table, c.page_size, b, firsts[b], nk)
        vb = read_pages(c.v_cache, c.block_table, c.page_size, b, firsts[b], nk)
        part = dense_fn(q[b : b + 1], kb[None], vb[None])
        outs.append(part.out[0].detach())
        lses.append(None if part.lse is None else part.lse[0].detach().float())
    lse = None if any(x is None for x in lses) else torch.stack(lses)
    return KernelOutput(out=torch.stack(outs), lse=lse)
