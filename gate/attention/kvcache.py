"""Decode inputs: a KV cache, contiguous or paged, as flash_attn_with_kvcache takes it.

    q             (B, Nq, Hq, D)          the decode step's query tokens
    k_cache       (B, cap, Hkv, D)        contiguous: one row of `cap` slots per batch element
                  (blocks, page, Hkv, D)  paged: physical blocks of `page` slots; block_table maps
    block_table   (B, pages_per_seq) int32  logical page j of batch element b -> physical block
    cache_seqlens (B,) int32              tokens already cached per batch element, before the call
    k_new, v_new  (B, Nq, Hkv, D)         with case.entry.cache_new: written at slots
                                          cache_seqlens[b] .. cache_seqlens[b] + Nq - 1, then attended

Slots past a batch element's tokens hold loud garbage (large keys, shifted values) and the pool has
spare blocks of it, so a kernel that reads past cache_seqlens, ignores the block table or assumes
contiguous pages gets a visibly wrong answer. With `nan_before_window` the tokens far left of the
window (Case.nan_slots) are NaN: finite garbage times a probability of 0 is 0, NaN times 0 is NaN.
The references never see the cache: they get the dense K/V of each batch element from
`gather_dense`, computed here with one flat index (slot -> block, offset) that shares no code with
any adapter's page walk.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from gate.core.cases import Case

SPARE_BLOCKS = 3  # garbage blocks in the pool that no block table entry points at


@dataclass(frozen=True)
class CacheInputs:
    """One decode call's inputs. The cache tensors are the state BEFORE the call; an adapter gets clones."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    cache_seqlens: torch.Tensor
    block_table: torch.Tensor | None
    k_new: torch.Tensor | None
    v_new: torch.Tensor | None
    page_size: int  # 0: contiguous
    # cache_seqlens on the host: adapters read lengths here, since cache_seqlens.tolist() on a GPU
    # tensor is a device sync inside every timed call (the varlen lesson, gate/kernels/base.py per_sequence)
    cached: tuple[int, ...]
    # "NHD" as above; "HND": k_cache/v_cache are (B or blocks, Hkv, slots, D), a case's knobs kv_layout
    # (made by `in_layout` for the kernel's call only: the references read the NHD cache)
    kv_layout: str = "NHD"

    @property
    def paged(self) -> bool:
        return self.block_table is not None

    @property
    def key_lengths(self) -> list[int]:
        """Keys each batch element attends to after the call (cached + appended)."""
        extra = 0 if self.k_new is None else self.k_new.shape[1]
        return [n + extra for n in self.cached]


def in_layout(cache: CacheInputs, kv_layout: str) -> CacheInputs:
    """A copy of the cache whose tensors are laid out `kv_layout` (their own memory, contiguous in it):
    what a kernel writes into them leaves `cache` as drawn."""
    if kv_layout == "NHD":
        return dataclasses.replace(cache, k_cache=cache.k_cache.clone(), v_cache=cache.v_cache.clone())
    k, v = (t.transpose(1, 2).contiguous() for t in (cache.k_cache, cache.v_cache))
    return dataclasses.replace(cache, k_cache=k, v_cache=v, kv_layout=kv_layout)


def as_nhd(t: torch.Tensor, kv_layout: str) -> torch.Tensor:
    """A cache tensor of layout `kv_layout` as the (B or blocks, slots, Hkv, D) view the checks read."""
    return t.transpose(1, 2) if kv_layout == "HND" else t


GARBAGE_TILE = 61  # slots of random garbage, repeated over the unused slots (a prime: no page size divides it)


def _garbage_tile(lead: int, n: int, rest: tuple[int, ...], gen, shift: float) -> torch.Tensor:
    """Loud float32 garbage for n slots: a random tile of GARBAGE_TILE slots (fewer if n is smaller),
    repeated over the slots (_tile_span). Every slot is still far from a real token (keys
    ~N(4, 3), values ~N(8, 3)), so a kernel that reads one gets a visibly wrong answer; a tile instead
    of fresh noise per slot keeps a large cache cheap to make (a 16 x 8192-slot paged cache drew ~10^9
    normals per call before: ~30 s of an H200 case spent on the host, in the worker and again in the gate)."""
    return (
        torch.randn((lead, min(n, GARBAGE_TILE), *rest), generator=gen, dtype=torch.float32, device=gen.device) * 3.0
        + shift
    )


def _tile_span(tile: torch.Tensor, start: int, stop: int, first: int) -> torch.Tensor:
    """The garbage for slots start..stop-1 (dim 1) when slot `first` holds the tile's column 0 and the
    tile repeats from there: slot p gets column (p - first) % tile width."""
    if stop <= start:
        return tile[:, :0]
    return tile[:, torch.arange(start - first, stop - first, device=tile.device) % tile.shape[1]]


def make_cache_inputs(case: Case, q: torch.Tensor, gen: torch.Generator, dtype, device) -> CacheInputs:
    """The cache for a kvcache case: real tokens at the front of each element's slots, garbage after.

    Built in place, in one buffer per tensor: the random draws come in the same order as always
    (garbage tiles, each element's tokens, the appended tokens, the page padding's tiles, the
    shuffle, the spare blocks), so every case's inputs are the ones its baselines were measured on
    (tests/test_kvcache_inputs.py pins them), while no garbage is written where a token goes and
    no whole-cache concatenation or tile repeat is made (a 16 x 8192-slot cache took ~7 s here)."""
    b, cap, hkv = case.batch, case.seqlen_k, case.heads_kv
    cached = case.cached_lengths
    page = case.entry.page_size
    padded = -(-cap // page) * page if page else cap
    dims = {"k": case.head_dim, "v": case.head_dim_v}
    slots = {name: torch.empty((b, padded, hkv, d), dtype=torch.float32, device=gen.device) for name, d in dims.items()}
    tiles = {name: _garbage_tile(b, cap, (hkv, d), gen, shift) for (name, d), shift in zip(dims.items(), (4.0, 8.0))}
    for name in dims:  # garbage only where no token goes
        for i, n in enumerate(cached):
            slots[name][i : i + 1, n:cap] = _tile_span(tiles[name][i : i + 1], n, cap, 0)
    for i, n in enumerate(cached):  # real tokens only where they are cached: no normals drawn for the rest
        slots["k"][i, :n].normal_(generator=gen)
        slots["v"][i, :n].normal_(generator=gen)
    for i, n in enumerate(case.nan_slots):  # after every draw: the other values stay the ones drawn without it
        slots["k"][i, :n] = float("nan")
        slots["v"][i, :n] = float("nan")
    k_new = v_new = None
    if case.entry.cache_new:
        k_new = torch.randn((b, case.seqlen_q, hkv, case.head_dim), generator=gen, device=gen.device).to(
            device=device, dtype=dtype
        )
        v_new = torch.randn((b, case.seqlen_q, hkv, case.head_dim_v), generator=gen, device=gen.device).to(
            device=device, dtype=dtype
        )
    block_table = None
    k_slots, v_slots = slots["k"], slots["v"]
    if page:
        for (name, d), shift in zip(dims.items(), (4.0, 8.0)):  # the padding of the last page: garbage too
            pad = _garbage_tile(b, padded - cap, (hkv, d), gen, shift)
            slots[name][:, cap:padded] = _tile_span(pad, cap, padded, cap)
        pages = padded // page
        blocks = b * pages + SPARE_BLOCKS
        order = (
            torch.randperm(blocks, generator=gen, device=gen.device)
            if case.entry.shuffled_pages
            else torch.arange(blocks, device=gen.device)
        )
        block_table = order[: b * pages].view(b, pages).to(torch.int32)
        k_pool = torch.empty((blocks, page, hkv, case.head_dim), dtype=torch.float32, device=gen.device)
        v_pool = torch.empty((blocks, page, hkv, case.head_dim_v), dtype=torch.float32, device=gen.device)
        k_pool[block_table.flatten().long()] = k_slots.reshape(b * pages, page, hkv, case.head_dim)
        v_pool[block_table.flatten().long()] = v_slots.reshape(b * pages, page, hkv, case.head_dim_v)
        spare = order[b * pages :].long()  # the blocks no table entry points at: garbage too
        for pool, (name, d), shift in zip((k_pool, v_pool), dims.items(), (4.0, 8.0)):
            pool[spare] = _tile_span(_garbage_tile(SPARE_BLOCKS, page, (hkv, d), gen, shift), 0, page, 0)
        k_slots, v_slots = k_pool, v_pool
        block_table = block_table.to(device)
    return CacheInputs(
        q=q,
        k_cache=k_slots.to(device=device, dtype=dtype),
        v_cache=v_slots.to(device=device, dtype=dtype),
        cache_seqlens=torch.tensor(cached, dtype=torch.int32, device=device),
        block_table=block_table,
        k_new=k_new,
        v_new=v_new,
        page_size=page,
        cached=tuple(int(n) for n in cached),
    )


def slot_index(cache: CacheInputs, b: int, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, column) of the cache tensor holding token `positions` of batch element b."""
    if not cache.paged:
        return torch.full_like(positions, b), positions
    page = cache.page_size
    return cache.block_table[b].long()[positions // page], positions % page


def expected_cache(cache: CacheInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """(k_cache, v_cache) as they must be after the call: the new tokens written after each
    element's cached ones, every other slot (garbage and spare blocks included) untouched."""
    k, v = cache.k_cache.clone(), cache.v_cache.clone()
    if cache.k_new is None:
        return k, v
    n = cache.k_new.shape[1]
    for b, start in enumerate(cache.cached):
        rows, cols = slot_index(cache, b, torch.arange(start, start + n, device=k.device))
        k[rows, cols] = cache.k_new[b]
        v[rows, cols] = cache.v_new[b]
    return k, v


def gather_dense(
    cache: CacheInputs, k_cache: torch.Tensor, v_cache: torch.Tensor
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per batch element, the dense (L_b, Hkv, D) keys and values it attends to, read from the
    given cache tensors (the expected ones, for the references)."""
    out = []
    for b, n in enumerate(cache.key_lengths):
        rows, cols = slot_index(cache, b, torch.arange(n, device=k_cache.device))
        out.append((k_cache[rows, cols], v_cache[rows, cols]))
    return out
