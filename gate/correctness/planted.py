"""Planted correctness bugs: the registry `attn-gate selftest` runs through the gate.

Each bug is one real kernel bug class at the smallest size a kernel would ship by mistake. Two
ways to plant one:

  * `host="kernel"`: an adapter wrapped around the CONFIGURED kernel that perturbs its outputs or
    gradients (autograd wrappers), so detection is measured against that kernel's own error
    level. A bug that needs a capability the configured kernel lacks (its LSE, a deterministic
    mode) is wrapped around `tiled` instead.
  * `host="tiled"`: a variant of attn-gate's `tiled` algorithm with one flag flipped, for bugs
    that need another algorithm (a mask off by one, a dropped term of the backward). With no
    flag the variant is bit-identical to `tiled` (tests/test_selftest.py), so every difference
    the gate sees is the bug.

Each bug declares the case axis that exposes it (`Trigger`): on a suite without such a case the
bug is "not exercised" (it survives, and the selftest names the axis), or "not applicable" where
the configured kernel lacks what the bug `needs` (an HND-cache bug, a kernel that takes no HND
cache). A trigger on a Case field that this attn-gate does not have yet (`field`: layout, inputs,
bias, entry) is "pending" and lights up by itself once the field exists.

To add a bug: write its perturbation (a `Wrap` function or a tiled flag) and append a PlantedBug
to BUGS.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gate.attention.inputs import FAR
from gate.attention.masks import allowed_mask, effective_window
from gate.attention.reference import AttnOptions
from gate.core.cases import FLAT_FIELDS, Case, first_visible_key
from gate.core.errors import UserError
from gate.kernels.base import DelegatingAdapter, KernelAdapter, KernelCall, KernelOutput
from gate.kernels.capabilities import Capabilities, Feature
from gate.kernels.tiled import TILE, TiledAdapter, TileSteps, dropout_keep_mask


class PlantError(Exception):
    """The bug cannot be planted in this call (e.g. the call lacks the tensor it perturbs)."""


@dataclass(frozen=True)
class Trigger:
    """Which cases expose a bug: `axis` names it for people ("a causal case"), `applies` decides.
    `field` is the Case field (by its flat name) the axis lives in when another branch adds it (None: exists today)."""

    axis: str
    applies: Callable[[Case], bool]
    field: str | None = None

    @property
    def pending(self) -> bool:
        return self.field is not None and self.field not in FLAT_FIELDS


@dataclass(frozen=True)
class PlantedBug:
    name: str
    what: str  # the real kernel bug it stands for
    host: str  # "kernel" (wrapped around the configured kernel) or "tiled" (a tiled variant)
    trigger: Trigger
    plant: Callable[..., "KernelAdapter"]  # (host adapter) -> buggy adapter
    # what the configured kernel must have to be able to have this bug (a Capabilities feature or
    # trait): a "kernel" bug moves to tiled without it, and a suite without its axis is then no gap
    needs: Callable[[Capabilities], bool] | None = None
    hint: str = ""  # what else would catch it, for the survivor message


# ---------------------------------------------------------------- wrappers around a kernel


class ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient flowing back through it is multiplied by `factor`."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


class _NoisyGradUnderDeterminism(torch.autograd.Function):
    """Identity forward; the backward adds fresh run-to-run noise to the gradient: up to 1% relative,
    about one bf16 ulp, as an fp32 atomic accumulation order shows after the cast."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * (1.0 + 1e-2 * torch.rand_like(grad))


class Wrapped(DelegatingAdapter):
    """The inner adapter with `perturb(call, inner) -> KernelOutput` in place of its call."""

    def __init__(self, inner: KernelAdapter, bug: str, perturb):
        super().__init__(inner, f"{inner.description} + planted bug {bug}")
        self.bug, self.perturb = bug, perturb

    def __call__(self, call: KernelCall) -> KernelOutput:
        return self.perturb(self, call)


def wrap(perturb):
    return lambda inner, name: Wrapped(inner, name, perturb)


def _grad_scaled(tensor: str, factor: float):
    def perturb(w: Wrapped, call: KernelCall) -> KernelOutput:
        return w.inner(dataclasses.replace(call, **{tensor: ScaleGrad.apply(getattr(call, tensor), factor)}))

    return perturb


def _lse_shifted(w: Wrapped, call: KernelCall) -> KernelOutput:
    res = w.inner(call)
    return res if res.lse is None else dataclasses.replace(res, lse=res.lse + 1e-3)


def _masked_rows_nan(w: Wrapped, call: KernelCall) -> KernelOutput:
    """Rows that see no key come back NaN (0/0 in the normalisation) instead of 0."""
    res = w.inner(call)
    if call.cu_seqlens is not None:
        return res
    nq, nk = call.q.shape[1], call.k.shape[1]
    allowed = allowed_mask(torch.arange(nq, device=call.q.device), nq, nk, call.opts.causal, call.opts.window)
    if allowed is None:
        return res
    empty = ~allowed.any(dim=-1)
    nan = torch.where(empty, float("nan"), 0.0).to(res.out.dtype).view(1, nq, 1, 1)
    return dataclasses.replace(res, out=res.out + nan)


def _batch_leak(w: Wrapped, call: KernelCall) -> KernelOutput:
    """The last query row of batch element 1 is read from element 0 (a batch stride off at the boundary)."""
    res = w.inner(call)
    if call.cu_seqlens is not None or res.out.shape[0] < 2:
        return res
    out = res.out.clone()
    out[1, -1] = res.out[0, -1]
    return dataclasses.replace(res, out=out)


def _varlen_boundary(w: Wrapped, call: KernelCall) -> KernelOutput:
    """Packed sequences: the first row of the second non-empty sequence takes the row before it
    (the previous sequence's last row): cu_seqlens read one off."""
    res = w.inner(call)
    if call.cu_seqlens is None:
        return res
    starts = [a for a, z in zip(call.cu_seqlens.tolist()[:-1], call.cu_seqlens.tolist()[1:]) if z > a]
    if len(starts) < 2:
        return res
    out = res.out.clone()
    out[starts[1]] = res.out[starts[1] - 1]
    return dataclasses.replace(res, out=out)


class _BiasedForward(torch.autograd.Function):
    """out times `factor`, rounded back to out's dtype; the gradient passes unchanged (the bias
    lives in the forward's epilogue, which the backward does not replay)."""

    @staticmethod
    def forward(ctx, x, factor):
        return (x.double() * factor).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


# Half the dtype's epsilon: every element of out moves by about one ulp or less, each under the
# max bound (2 x P's max error + a spacing), while their mean is several times P's mean error.
OUT_BIAS_EPS = 0.5


def _out_biased(w: Wrapped, call: KernelCall) -> KernelOutput:
    """out scaled by (1 + OUT_BIAS_EPS x eps of its dtype): a reciprocal of the row sum rounded the
    same way on every row (an approximate rcp, a constant off in its last bit)."""
    res = w.inner(call)
    factor = 1.0 + OUT_BIAS_EPS * torch.finfo(res.out.dtype).eps
    return dataclasses.replace(res, out=_BiasedForward.apply(res.out, factor))


def _dq_noise_when_deterministic(w: Wrapped, call: KernelCall) -> KernelOutput:
    if not call.deterministic:
        return w.inner(call)
    return w.inner(dataclasses.replace(call, q=_NoisyGradUnderDeterminism.apply(call.q)))


def _noncontiguous_k(w: Wrapped, call: KernelCall) -> KernelOutput:
    """K read as if it were contiguous (its strides ignored): right only when it is."""
    k = call.k
    if k.is_contiguous():
        return w.inner(call)
    strides, acc = [], 1
    for n in reversed(k.shape):
        strides.insert(0, acc)
        acc *= n
    return w.inner(dataclasses.replace(call, k=torch.as_strided(k, k.shape, strides, k.storage_offset())))


def _bias_grad_scaled(w: Wrapped, call: KernelCall) -> KernelOutput:
    bias = call.opts.bias  # the custom bias travels in AttnOptions.bias
    if not isinstance(bias, torch.Tensor) or not bias.requires_grad:
        raise PlantError("the call carries no learnable bias (AttnOptions.bias with requires_grad)")
    return w.inner(dataclasses.replace(call, opts=dataclasses.replace(call.opts, bias=ScaleGrad.apply(bias, 1.02))))


def _paged_block_table_swapped(w: Wrapped, call: KernelCall) -> KernelOutput:
    """a decode call carries its cache in `call.cache` (gate/attention/kvcache.py
    CacheInputs); a paged one has `block_table` (B, pages) mapping logical pages to physical
    blocks. The kernel gets the same cache tensors (so its in-place appends land where it writes
    them) through a table with two entries swapped: only a paged read sees it."""
    cache = getattr(call, "cache", None)
    table = getattr(cache, "block_table", None)
    if not isinstance(table, torch.Tensor) or table.numel() < 2:
        raise PlantError(
            "the call carries no paged cache (KernelCall.cache.block_table): update _paged_block_table_swapped"
        )
    swapped = table.clone()
    flat = swapped.view(-1)
    flat[[0, -1]] = flat[[-1, 0]]  # two pages of the cache swapped: only paged reads see it
    return w.inner(dataclasses.replace(call, cache=dataclasses.replace(cache, block_table=swapped)))


def _one_token_decode_window_short(w: Wrapped, call: KernelCall) -> KernelOutput:
    """A one-token decode call (the decode fast path) keeps `left` keys of its window instead of
    `left + 1`: the oldest key of the window dropped. Other calls are the kernel's own."""
    left, right = call.opts.window
    if call.cache is None or call.q.shape[1] != 1 or left < 1:
        return w.inner(call)
    return w.inner(dataclasses.replace(call, opts=dataclasses.replace(call.opts, window=(left - 1, right))))


# ---------------------------------------------------------------- tiled variants


class _PlantedSteps(TileSteps):
    """tiled's tile steps with the flags' bugs (gate/kernels/tiled.py TileSteps); with no flag, the
    base steps themselves, so a variant differs from `tiled` only where a flag says."""

    def __init__(self, flags: frozenset, redrawn_keep=None):
        self.flags = flags
        self.redrawn_keep = redrawn_keep  # bug dropout_redrawn: the backward's own dropout mask

    def scaled_capped(self, qk, opts: AttnOptions):
        """bugs softcap_ignored (no cap) and softcap_before_scale (cap * tanh(qk / cap), then the scale)."""
        if opts.softcap and "softcap_ignored" in self.flags:
            return qk * opts.softmax_scale, None
        if opts.softcap and "softcap_before_scale" in self.flags:
            tanh = torch.tanh(qk / opts.softcap)
            return tanh * opts.softcap * opts.softmax_scale, tanh
        return super().scaled_capped(qk, opts)

    def alibi(self, slopes, rows, nq, nk):
        """bug alibi_wrong_sign."""
        bias = super().alibi(slopes, rows, nq, nk)
        return -bias if "alibi_wrong_sign" in self.flags else bias

    def mask(self, causal: bool, window):
        """bugs causal_window_ignores_window, causal_peek (one key ahead), window_off_by_one."""
        flags = self.flags
        if "causal_window_ignores_window" in flags and causal:
            window = (-1, -1)
        if "causal_peek" in flags and causal:
            left, right = effective_window(causal, window)
            causal, window = False, (left, right + 1)
        if "window_off_by_one" in flags and window != (-1, -1):
            window = tuple(w + 1 if w >= 0 else w for w in window)
        return causal, window

    def backward_keep(self, keep):
        return self.redrawn_keep if self.redrawn_keep is not None else keep

    def expand_kv(self, t, group: int):
        """bug gqa_mod: query head h reads kv head h % hkv."""
        return t.repeat(1, group, 1, 1) if "gqa_mod" in self.flags else super().expand_kv(t, group)

    def reduce_kv(self, t, b: int, hkv: int, group: int):
        if "gqa_mod" not in self.flags:
            return super().reduce_kv(t, b, hkv, group)
        n, d = t.shape[-2:]
        return t.view(b, group, hkv, n, d).sum(dim=1)

    def key_end(self, nk: int) -> int:
        """bug skip_last_partial_tile: the key loop stops before the last partial tile."""
        return nk - nk % TILE if "skip_last_partial_tile" in self.flags else nk

    def key_start(self, first: int) -> int:
        """bug reads_before_window: a decode step reads every tile from key 0 and lets the mask zero
        the probabilities of those before the window (0 x NaN = NaN)."""
        return 0 if "reads_before_window" in self.flags else super().key_start(first)

    def scores(self, qt, kt, rows, cols, nq, nk, opts: AttnOptions, bias=None):
        """bug window_top_left: the rows anchored at key 0 (as if seqlen_q were seqlen_k), not at the last key."""
        if "window_top_left" in self.flags:
            nq = nk
        return super().scores(qt, kt, rows, cols, nq, nk, opts, bias)

    def key_tiles(self, nk: int):
        """bug max_step_clamped walks the keys last to first, as FlashAttention's forward does."""
        tiles = super().key_tiles(nk)
        return reversed(tiles) if "max_step_clamped" in self.flags else tiles

    def rescale(self, m, s):
        """bugs no_max_subtraction and max_frozen (the running max kept from the first tile with a
        finite score: right while later tiles stay within exp's range of it); finite_sentinel and
        max_step_clamped (_rescale_extreme)."""
        if "max_frozen" in self.flags:
            m_kept = torch.where(torch.isinf(m), s.amax(dim=-1, keepdim=True), m)
            m_safe = torch.where(torch.isinf(m_kept), torch.zeros_like(m_kept), m_kept)
            return m_kept, m_safe, torch.exp(m - m_safe)
        if self.flags & {"finite_sentinel", "max_step_clamped"}:
            return _rescale_extreme(self.flags, m, s)
        return self._rescale_no_max(m, s)

    def _rescale_no_max(self, m, s):
        """bug no_max_subtraction: exp of the raw scores, fine for small logits, inf beyond ~88 in float32."""
        if "no_max_subtraction" not in self.flags:
            return super().rescale(m, s)
        zero = torch.zeros_like(m)
        return zero, zero, torch.ones_like(m)

    def delta(self, do, out):
        """bug drop_delta: the rowsum(dO * O) term of dS forgotten."""
        d = super().delta(do, out)
        return torch.zeros_like(d) if "drop_delta" in self.flags else d

    def softcap_grad(self, ds, tanh):
        """bug softcap_no_derivative: the softcap's factor left out of dS."""
        return ds if "softcap_no_derivative" in self.flags else super().softcap_grad(ds, tanh)

    def cache_view(self, cache, kv_layout: str):
        """bug hnd_read_as_nhd: an HND cache's memory taken as NHD (its shape reordered by `view`, the
        strides of an NHD tensor): right only where heads or tokens are one."""
        if kv_layout == "HND" and "hnd_read_as_nhd" in self.flags:
            n, h, t, d = cache.shape
            return cache.view(n, t, h, d)
        return super().cache_view(cache, kv_layout)

    def combine(self, parts, sink):
        """bug split_lse_transposed: the combine writes the LSE in (rows, heads) order into the
        (heads, rows) output: right only where there is one row or one head."""
        out, lse = super().combine(parts, sink)
        if "split_lse_transposed" in self.flags:
            lse = lse.transpose(-1, -2).reshape(lse.shape)
        return out, lse

    def write_rows(self, out, lse, b: int, out_b, lse_b):
        """bug pack_gqa_second_unwritten (a packed decode call): batch element 1's rows never written."""
        if "pack_gqa_second_unwritten" in self.flags and b == 1:
            return
        super().write_rows(out, lse, b, out_b, lse_b)


class TiledVariant(TiledAdapter):
    """`tiled` with planted flags (no flag: bit-identical to tiled)."""

    def __init__(self, flags: frozenset = frozenset(), bug: str = ""):
        self.flags, self.bug = frozenset(flags), bug
        self.description = f"tiled variant with planted bug {bug}" if bug else "tiled variant (no bug)"

    def tile_steps(self, call: KernelCall, keep) -> TileSteps:
        redrawn = None
        if keep is not None and "dropout_redrawn" in self.flags:
            redrawn = dropout_keep_mask(tuple(keep.shape), call.opts.dropout_p, call.seed + 1, keep.device)
        flags = self.flags
        if not _paged_left_window_call(call):  # window_top_left lives in the paged non-causal path alone
            flags = flags - {"window_top_left"}
        if not call.knobs.pack_gqa:  # pack_gqa_second_unwritten lives in the packed decode path alone
            flags = flags - {"pack_gqa_second_unwritten"}
        return _PlantedSteps(flags, redrawn)

    def _dense(self, q, k, v, call: KernelCall, keep=None) -> KernelOutput:
        d = q.shape[-1]
        if "head_dim_padded_scale" in self.flags and d % 32:
            # the scale of the head dim the tiles are padded to, not of the real one: only off-grid dims see it
            call = dataclasses.replace(
                call, opts=dataclasses.replace(call.opts, softmax_scale=(-(-d // 32) * 32) ** -0.5)
            )
        return super()._dense(q, k, v, call, keep)


def _paged_left_window_call(call: KernelCall) -> bool:
    """A paged decode call, not causal, with a left window and no right bound (FlashInfer's window_left)."""
    left, right = call.opts.window
    return call.cache is not None and call.cache.paged and not call.opts.causal and left >= 0 and right < 0


def variant(flag: str):
    return lambda _inner, name: TiledVariant(frozenset({flag}), name)


# ---------------------------------------------------------------- extreme magnitudes and crossings

FINITE_NEG_INF = -5e4  # the finite "-inf" an fp16-minded kernel starts its running max at
MAX_STEP = 128.0  # max_step_clamped: the most the running max may rise per key tile (a growing bias's whole rise)
GRID_Y_MAX = 65_535  # CUDA's grid y (and z) limit: programs past it are never launched


def _rescale_extreme(flags: frozenset, m, s):
    """Tile steps of two running-max bugs (gate/kernels/tiled.py TileSteps.rescale's contract):
    finite_sentinel: the max floored at FINITE_NEG_INF, so a row whose every logit is below it
    exponentiates to 0 (output 0, LSE -inf; fully masked rows stay right);
    max_step_clamped: once the max is finite it may rise by at most MAX_STEP per key tile (keys
    walked last to first): a score far above every later key's, met last, overflows exp(s - m)."""
    tile_max = s.amax(dim=-1, keepdim=True)
    if "finite_sentinel" in flags:
        m_new = torch.maximum(m.clamp_min(FINITE_NEG_INF), tile_max)
        return m_new, m_new, torch.exp(m - m_new)
    m_new = torch.maximum(m, tile_max)
    m_new = torch.where(torch.isinf(m), m_new, torch.minimum(m_new, m + MAX_STEP))
    m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
    return m_new, m_safe, torch.exp(m - m_safe)


def _grid_y_programs_dropped(w: Wrapped, call: KernelCall) -> KernelOutput:
    """One program per (batch, head) on the grid's y axis: those of index b * Hq + h >= 65,535 are
    never launched, so their output rows (and gradients, and LSE) stay 0."""
    res = w.inner(call)
    b, _, hq, _ = call.q.shape
    if call.cu_seqlens is not None or call.cache is not None or b * hq <= GRID_Y_MAX:
        return res
    ran = torch.arange(b * hq, device=call.q.device).view(b, hq) < GRID_Y_MAX
    out = res.out * ran.view(b, 1, hq, 1).to(res.out.dtype)
    lse = None if res.lse is None else torch.where(ran.view(b, hq, 1), res.lse, torch.zeros_like(res.lse))
    return dataclasses.replace(res, out=out, lse=lse)


def batches_read_at_int32_offsets(t: torch.Tensor) -> torch.Tensor:
    """`t` (B, N, H, D) as a kernel that computes each batch element's start in 32 bits (and the
    offsets inside it in 64) reads it: an element starting at or past 2**31 elements is read 2**31
    elements earlier. The gradient passes straight through. A packed varlen tensor has no batch dim."""
    if t.dim() != 4 or t.storage_offset() + (t.shape[0] - 1) * t.stride(0) < FAR:
        return t
    base = t.detach()
    elements = [
        torch.as_strided(base, t.shape[1:], t.stride()[1:], (t.storage_offset() + i * t.stride(0)) % FAR)
        for i in range(t.shape[0])
    ]
    return t + (torch.stack(elements) - base)


def _batch_offsets_int32(w: Wrapped, call: KernelCall) -> KernelOutput:
    """q, k and v read with 32-bit batch offsets (batches_read_at_int32_offsets)."""
    if call.cache is not None:
        return w.inner(call)
    q, k, v = (batches_read_at_int32_offsets(t) for t in (call.q, call.k, call.v))
    return w.inner(dataclasses.replace(call, q=q, k=k, v=v))


def _stride0_mask_d512_last_key(w: Wrapped, call: KernelCall) -> KernelOutput:
    """A crossing: with stride-0 (expanded) K/V, a 4-D boolean mask, head dim 512 and
    seqlen_k % 32 == 1, the one key alone in the last 32-key chunk of the mask is read as masked.
    Any three of the four traits leave the call untouched."""
    bias, k = call.opts.bias, call.k
    crossing = (
        call.cu_seqlens is None
        and 0 in k.stride()
        and isinstance(bias, torch.Tensor)
        and bias.dtype == torch.bool
        and bias.dim() == 4
        and k.shape[-1] == 512
        and k.shape[1] % 32 == 1
    )
    if not crossing:
        return w.inner(call)
    masked = bias.clone()
    masked[..., -1] = False
    return w.inner(dataclasses.replace(call, opts=dataclasses.replace(call.opts, bias=masked)))


def _varlen_sink_dv192_no_dsink(w: Wrapped, call: KernelCall) -> KernelOutput:
    """A crossing: the varlen backward with learnable sinks at head_dim_v 192 never writes dsink
    (left at its zero initialisation); dense, sink-less or other head dims are right."""
    if call.cu_seqlens is None or call.sink is None or call.v.shape[-1] != 192:
        return w.inner(call)
    return w.inner(dataclasses.replace(call, sink=ScaleGrad.apply(call.sink, 0.0)))


def _decode_split_combine_unshifted(w: Wrapped, call: KernelCall) -> KernelOutput:
    """A crossing: a single query, non-causal, head dim 64 and seqlen_k a multiple of 64 >= 128
    takes a split-KV path whose combine weights each split by exp(lse) without subtracting the
    max: rows whose LSE is below float32 exp's range (every row of `inputs = shifted`) come out 0/0.
    Emulated on the whole output: out = (exp(lse) * out) / exp(lse) in float32."""
    res = w.inner(call)
    q, nk = call.q, call.k.shape[1]
    crossing = (
        call.cu_seqlens is None
        and call.cache is None
        and q.shape[1] == 1
        and not call.opts.causal
        and q.shape[-1] == 64
        and nk >= 128
        and nk % 64 == 0
    )
    if not crossing:
        return res
    if res.lse is None:
        raise PlantError("the kernel returns no LSE (the split combine weights by it)")
    weight = torch.exp(res.lse.float()).transpose(1, 2).unsqueeze(-1)  # (b, 1, hq, 1)
    combined = ((weight * res.out.float()) / weight).to(res.out.dtype)
    return dataclasses.replace(res, out=res.out + (combined - res.out).detach())


# ---------------------------------------------------------------- the registry


def _any_keys(c: Case) -> bool:
    return c.seqlen_k > 1 or (c.entry.varlen is not None and max(c.entry.varlen) > 1)


ANY = Trigger("a case with more than one key", _any_keys)
CAUSAL = Trigger("a causal case with more than one key", lambda c: c.causal and _any_keys(c))
WINDOW = Trigger("a sliding-window case", lambda c: c.has_window)
CAUSAL_WINDOW = Trigger(
    "a causal case with a sliding window (left < seqlen_k)", lambda c: c.causal and 0 <= c.window[0] < c.seqlen_k - 1
)
PARTIAL_TILE = Trigger(
    f"a case with seqlen_k > {TILE} and not a multiple of the key tile ({TILE})",
    lambda c: any(n > TILE and n % TILE for n in (c.entry.varlen if c.entry.varlen is not None else (c.seqlen_k,))),
)
GQA = Trigger(
    "a GQA case with more than one kv head (heads 'Hq/Hkv', Hkv >= 2)",
    lambda c: c.is_gqa and c.heads_kv >= 2 and _any_keys(c),
)
SOFTCAP = Trigger("a softcap case", lambda c: c.softcap > 0)
ALIBI = Trigger("an ALiBi case", lambda c: c.alibi and _any_keys(c))
OFF_GRID = Trigger("a case with head_dim not a multiple of 32", lambda c: c.head_dim % 32 != 0)
MASKED_ROWS = Trigger(
    "a case with fully masked rows (causal with seqlen_q > seqlen_k)", lambda c: c.has_fully_masked_rows
)
BATCH = Trigger("a dense case with batch >= 2", lambda c: c.entry.varlen is None and c.batch >= 2)
VARLEN = Trigger(
    "a varlen case with two or more non-empty sequences",
    lambda c: c.entry.varlen is not None and sum(1 for n in c.entry.varlen if n) >= 2,
)
DETERMINISM = Trigger(
    'a case with the determinism check (checks = [["determinism"]])',
    lambda c: "determinism" in c.checks or "race" in c.checks,
)
DROPOUT = Trigger("a dropout case", lambda c: c.dropout_p > 0)
LSE = Trigger("a case where the kernel returns its LSE", _any_keys)
EXTREME = Trigger(
    "an inputs = large/shifted/outliers case (extreme logits)",
    lambda c: c.inputs in ("large", "shifted", "outliers"),
    field="inputs",
)
NONCONTIG_K = Trigger(
    "a layout case with a non-contiguous K (k_sliced, qkv_packed, bhsd_view)",
    lambda c: c.layout in ("k_sliced", "qkv_packed", "bhsd_view"),
    field="layout",
)
GROWING_BIAS = Trigger(
    'a case with a bias rising along the keys (bias = ["growing"])',
    lambda c: c.bias.kind == "growing" and _any_keys(c),
    field="bias",
)
BIAS_GRAD = Trigger("a case with a learnable bias (bias_grad = true)", lambda c: c.bias.grad, field="bias_grad")
PAGED = Trigger(
    "a paged kv-cache case (entry = kvcache with a page size)",
    lambda c: c.entry.kind == "kvcache" and bool(c.entry.page_size),
    field="entry",
)

# ---- decode and paged regimes: a one-token windowed decode, a paged non-causal left window with
# fewer queries than keys, NaN in the cache before the window
ONE_TOKEN_WINDOWED_DECODE = Trigger(
    "a one-token decode with a left window >= 1 that some cached key falls out of (entry = kvcache, seqlens 1xN)",
    lambda c: (
        c.entry.kind == "kvcache"
        and c.seqlen_q == 1
        and c.window[0] >= 1
        and any(first_visible_key(1, n, c.window) > 0 for n in c.key_lengths)
    ),
)
PAGED_LEFT_WINDOW = Trigger(
    "a paged kvcache case, not causal, window [left, -1], with keys before query 0's window",
    lambda c: (
        c.entry.kind == "kvcache"
        and bool(c.entry.page_size)
        and not c.causal
        and c.window[0] >= 0
        and c.window[1] < 0
        and any(first_visible_key(c.seqlen_q, n, c.window) > 0 for n in c.key_lengths)
    ),
)
NAN_BEFORE_WINDOW = Trigger(
    "a kvcache case whose cache holds NaN before the window (nan_before_window = true)",
    lambda c: any(c.nan_slots),
)
# kernel knobs: a forced split-KV, packed GQA rows, an HND cache
SPLIT_LSE = Trigger(
    "a kvcache case forcing num_splits >= 2 with two or more query tokens and two or more heads of rows "
    "(query heads; KV heads with pack_gqa) (knobs = [{num_splits = N}])",
    lambda c: (
        c.knobs.num_splits >= 2
        and c.seqlen_q >= 2
        and (c.heads_kv if c.knobs.pack_gqa else c.heads_q) >= 2
        and max(c.key_lengths, default=0) > 0
    ),
)
PACK_GQA_BATCH = Trigger(
    "a kvcache case forcing pack_gqa = true with batch >= 2, its second element holding keys "
    "(knobs = [{pack_gqa = true}])",
    lambda c: c.knobs.pack_gqa is True and c.batch >= 2 and c.key_lengths[1] > 0,
)
HND_CACHE = Trigger(
    'a kvcache case with an HND cache and two or more KV heads (knobs = [{kv_layout = "HND"}])',
    lambda c: c.knobs.kv_layout == "HND" and c.heads_kv >= 2,
)
# extreme magnitudes and crossings
SUNK_ROWS = Trigger(
    'a case with rows whose every logit is below -5e4 (bias = ["sunk_rows"])',
    lambda c: c.bias.kind == "sunk_rows",
    field="bias",
)
FIRST_KEY = Trigger(
    f'a case with +1e4 on the first key (bias = ["first_key"]) and more than {TILE} keys',
    lambda c: c.bias.kind == "first_key" and max(c.entry.keys_varlen or (c.seqlen_k,)) > TILE,
    field="bias",
)
GRID_Y = Trigger(
    f"a dense case with batch x heads > {GRID_Y_MAX} (the CUDA grid's y limit)",
    lambda c: c.entry.kind == "dense" and c.entry.varlen is None and c.batch * c.heads_q > GRID_Y_MAX,
)
FAR_BATCH = Trigger(
    "a case whose last batch element starts past 2^31 elements (layout far_batch)",
    lambda c: c.layout == "far_batch",
)
STRIDE0_MASK_D512 = Trigger(
    "a kv_stride0 case with a boolean mask, head dim 512 and seqlen_k % 32 == 1",
    lambda c: (
        c.layout == "kv_stride0"
        and c.bias.is_bool
        and c.head_dim == 512
        and c.entry.varlen is None
        and c.seqlen_k % 32 == 1
    ),
    field="layout",
)
VARLEN_SINK_DV192 = Trigger(
    "a varlen case with sinks and head_dim_v 192",
    lambda c: c.entry.varlen is not None and c.entry.sinks and c.head_dim_v == 192,
)
DECODE_SHIFTED = Trigger(
    "a non-causal seqlen_q 1 case with inputs = shifted, head dim 64 and seqlen_k a multiple of 64 >= 128",
    lambda c: (
        c.entry.kind == "dense"
        and c.entry.varlen is None
        and c.seqlen_q == 1
        and not c.causal
        and c.head_dim == 64
        and c.seqlen_k >= 128
        and c.seqlen_k % 64 == 0
        and c.inputs == "shifted"
    ),
    field="inputs",
)

BUGS: tuple[PlantedBug, ...] = (
    PlantedBug(
        "dk_x1.02",
        "dK 2% too large (a wrong constant in the backward epilogue)",
        "kernel",
        ANY,
        wrap(_grad_scaled("k", 1.02)),
    ),
    PlantedBug(
        "dq_x1.02",
        "dQ 2% too large (a wrong scale on the dQ accumulator)",
        "kernel",
        ANY,
        wrap(_grad_scaled("q", 1.02)),
    ),
    PlantedBug(
        "lse_plus_1e-3",
        "the LSE off by 1e-3 (a log2/ln constant rounded)",
        "kernel",
        LSE,
        wrap(_lse_shifted),
        needs=lambda caps: caps.returns_lse,
        hint="an fp32 case: in bf16/fp16 the LSE bound is ~1e-2, ten times this error",
    ),
    PlantedBug(
        "masked_row_nan",
        "a fully masked row gives NaN instead of 0 (0/0 in the normalisation)",
        "kernel",
        MASKED_ROWS,
        wrap(_masked_rows_nan),
        # rows with no key come from a mask aligned bottom-right over more queries than keys, or a bool mask
        needs=lambda caps: caps.supports(Feature.CAUSAL_SEQLEN_Q_NE_K) or caps.supports(Feature.BOOL_MASK),
    ),
    PlantedBug(
        "batch_leak",
        "a batch element leaks into its neighbour (batch stride off at the boundary)",
        "kernel",
        BATCH,
        wrap(_batch_leak),
    ),
    PlantedBug(
        "varlen_boundary",
        "varlen-only indexing: cu_seqlens read one off at a sequence boundary",
        "kernel",
        VARLEN,
        wrap(_varlen_boundary),
        needs=lambda caps: caps.supports(Feature.VARLEN),
    ),
    PlantedBug(
        "dq_noise_deterministic",
        "run-to-run noise in dQ under deterministic mode (an atomic left in)",
        "kernel",
        DETERMINISM,
        wrap(_dq_noise_when_deterministic),
        needs=lambda caps: caps.deterministic_mode,
    ),
    PlantedBug("drop_delta", "the rowsum(dO * O) term of dS dropped", "tiled", ANY, variant("drop_delta")),
    PlantedBug("causal_peek", "the causal mask peeks one key ahead", "tiled", CAUSAL, variant("causal_peek")),
    PlantedBug(
        "window_off_by_one",
        "the sliding window one key too wide on each side",
        "tiled",
        WINDOW,
        variant("window_off_by_one"),
    ),
    PlantedBug(
        "causal_window_ignores_window",
        "causal + window applies only the causal mask",
        "tiled",
        CAUSAL_WINDOW,
        variant("causal_window_ignores_window"),
    ),
    PlantedBug(
        "skip_last_partial_tile",
        "the last partial key tile skipped",
        "tiled",
        PARTIAL_TILE,
        variant("skip_last_partial_tile"),
    ),
    PlantedBug("gqa_h_mod_hkv", "GQA head mapping h % Hkv instead of h // (Hq/Hkv)", "tiled", GQA, variant("gqa_mod")),
    PlantedBug(
        "softcap_no_derivative",
        "softcap's derivative (1 - tanh^2) dropped in the backward",
        "tiled",
        SOFTCAP,
        variant("softcap_no_derivative"),
    ),
    PlantedBug("softcap_ignored", "the softcap not applied at all", "tiled", SOFTCAP, variant("softcap_ignored")),
    PlantedBug(
        "softcap_before_scale",
        "the cap applied before the softmax scale (the cap scaled)",
        "tiled",
        SOFTCAP,
        variant("softcap_before_scale"),
    ),
    PlantedBug("alibi_wrong_sign", "ALiBi bias added with the wrong sign", "tiled", ALIBI, variant("alibi_wrong_sign")),
    PlantedBug(
        "head_dim_off_grid",
        "softmax scale of the head dim padded to 32 (wrong only off the 32-grid)",
        "tiled",
        OFF_GRID,
        variant("head_dim_padded_scale"),
    ),
    PlantedBug(
        "dropout_redrawn", "the dropout mask redrawn in the backward", "tiled", DROPOUT, variant("dropout_redrawn")
    ),
    PlantedBug(
        "exp_overflow",
        "no running max: exp overflows/underflows at extreme logits",
        "tiled",
        EXTREME,
        variant("no_max_subtraction"),
    ),
    PlantedBug(
        "running_max_frozen",
        "the running max never raised after the first key tile: exp overflows once later scores pass it by 88",
        "tiled",
        GROWING_BIAS,
        variant("max_frozen"),
        needs=lambda caps: caps.supports(Feature.BIAS),
    ),
    PlantedBug(
        "noncontiguous_k",
        "wrong results for a non-contiguous K (strides ignored)",
        "kernel",
        NONCONTIG_K,
        wrap(_noncontiguous_k),
    ),
    PlantedBug(
        "bias_grad_x1.02",
        "dBias 2% too large (a broadcast bias's gradient reduced wrongly)",
        "kernel",
        BIAS_GRAD,
        wrap(_bias_grad_scaled),
        needs=lambda caps: caps.supports(Feature.BIAS_GRAD),
    ),
    PlantedBug(
        "paged_pages_swapped",
        "paged-cache-only indexing: two pages of the block table read swapped",
        "kernel",
        PAGED,
        wrap(_paged_block_table_swapped),
        needs=lambda caps: caps.supports(Feature.PAGED),
    ),
    # ---- decode and paged regimes
    PlantedBug(
        "decode_window_one_short",
        "a one-token sliding-window decode keeps `window` keys instead of `window + 1` (its fast path)",
        "kernel",
        ONE_TOKEN_WINDOWED_DECODE,
        wrap(_one_token_decode_window_short),
        needs=lambda caps: caps.supports(Feature.KVCACHE) and caps.supports(Feature.WINDOW),
    ),
    PlantedBug(
        "paged_window_top_left",
        "a paged non-causal call anchors its left window top-left (query i at key i), not bottom-right",
        "tiled",
        PAGED_LEFT_WINDOW,
        variant("window_top_left"),
    ),
    PlantedBug(
        "reads_before_window",
        "a decode step reads every page of the sequence and masks those before the window by a zero probability",
        "tiled",
        NAN_BEFORE_WINDOW,
        variant("reads_before_window"),
    ),
    # ---- kernel knobs
    PlantedBug(
        "split_combine_lse_transposed",
        "the split-KV combine writes the LSE in (query, head) order into the (head, query) output: "
        "right for one-token decode or one head",
        "tiled",
        SPLIT_LSE,
        variant("split_lse_transposed"),
        needs=lambda caps: caps.supports(Feature.NUM_SPLITS),
    ),
    PlantedBug(
        "pack_gqa_second_sequence_unwritten",
        "a pack_gqa decode never writes the second batch element's packed rows (its out stays 0)",
        "tiled",
        PACK_GQA_BATCH,
        variant("pack_gqa_second_unwritten"),
        needs=lambda caps: caps.supports(Feature.PACK_GQA),
    ),
    PlantedBug(
        "hnd_cache_read_as_nhd",
        "an HND (heads-first) cache read and appended with NHD strides: right only with one KV head",
        "tiled",
        HND_CACHE,
        variant("hnd_read_as_nhd"),
        needs=lambda caps: caps.supports(Feature.HND_CACHE),
    ),
    # ---- extreme magnitudes and crossings
    PlantedBug(
        "finite_sentinel_-5e4",
        'the running max starts at a finite "-inf" of -5e4: rows whose every logit is below it come out 0, LSE -inf',
        "tiled",
        SUNK_ROWS,
        variant("finite_sentinel"),
        needs=lambda caps: caps.supports(Feature.BIAS),
    ),
    PlantedBug(
        "running_max_step_clamped",
        "the running max may rise by at most 128 per key tile (keys walked last to first): a first key "
        "far above the rest, met last, overflows exp",
        "tiled",
        FIRST_KEY,
        variant("max_step_clamped"),
        needs=lambda caps: caps.supports(Feature.BIAS),
    ),
    PlantedBug(
        "grid_y_overflow",
        "one program per (batch, head) on the grid's y axis: those past 65,535 never run (their rows stay 0)",
        "kernel",
        GRID_Y,
        wrap(_grid_y_programs_dropped),
        # a kernel declaring it launches no more programs than the y limit never runs these cases
        needs=lambda caps: not caps.max_batch_heads or caps.max_batch_heads > GRID_Y_MAX,
    ),
    PlantedBug(
        "batch_offsets_int32",
        "each batch element's start computed in 32 bits: an element past 2^31 elements is read 2^31 earlier",
        "kernel",
        FAR_BATCH,
        wrap(_batch_offsets_int32),
        needs=lambda caps: "far_batch" in caps.layouts,
    ),
    PlantedBug(
        "stride0_mask_d512_last_key",
        "stride-0 K/V x 4-D bool mask x head dim 512 x seqlen_k % 32 == 1: the last key read as masked",
        "kernel",
        STRIDE0_MASK_D512,
        wrap(_stride0_mask_d512_last_key),
        needs=lambda caps: caps.supports(Feature.BOOL_MASK) and caps.max_head_dim >= 512,
    ),
    PlantedBug(
        "varlen_sink_dv192_no_dsink",
        "varlen x learnable sinks x head_dim_v 192: the backward never writes dsink",
        "kernel",
        VARLEN_SINK_DV192,
        wrap(_varlen_sink_dv192_no_dsink),
        needs=lambda caps: caps.supports(Feature.SINKS) and caps.supports(Feature.VARLEN) and caps.sink_grad,
    ),
    PlantedBug(
        "decode_split_lse_underflow",
        "seqlen_q 1 x d64 x seqlen_k 128 non-causal: the split-KV combine weights by exp(lse) unshifted (0/0 "
        "where the LSE is below -104)",
        "kernel",
        DECODE_SHIFTED,
        wrap(_decode_split_combine_unshifted),
        # the crossing is non-causal: a kernel of causal attention only never takes that path
        needs=lambda caps: caps.returns_lse and caps.supports(Feature.NON_CAUSAL),
    ),
    # a bias under the max bound on every element: only the mean-error rule sees it
    PlantedBug(
        "out_bias_half_ulp",
        "out scaled by (1 + eps/2) of its dtype (a reciprocal rounded up: a bias under the max bound)",
        "kernel",
        ANY,
        wrap(_out_biased),
        hint="the mean-error rule (mean_mult): the max rule alone passes it",
    ),
)


def select_bugs(names: tuple[str, ...] = ()) -> tuple[PlantedBug, ...]:
    """All bugs, or those named (unknown names are a UserError naming the known ones)."""
    if not names:
        return BUGS

    known = {b.name: b for b in BUGS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UserError(f"--bugs: unknown planted bug {unknown[0]!r}; known: {', '.join(known)}")
    return tuple(known[n] for n in names)


def host_of(bug: PlantedBug, kernel: KernelAdapter, cases=()) -> str:
    """'kernel' or 'tiled': a kernel-hosted bug moves to tiled (where the gate's own teeth are still
    shown) when the kernel lacks what it needs, or when every case of its axis among `cases` goes
    to an entry point that lacks it (a family whose decode entry takes no window, beside a dense
    one that does). A shape the kernel refuses (a page size, a head dim it was not built for)
    moves nothing: there the suite lacks a case the kernel runs."""
    if bug.host != "kernel":
        return bug.host
    if bug.needs is not None and not bug.needs(kernel.capabilities()):
        return "tiled"
    axis = [c for c in cases if bug.trigger.applies(c)] if not bug.trigger.pending else []
    if axis and all(_entry_lacks(bug, kernel, c) for c in axis):
        return "tiled"
    return "kernel"


def _entry_lacks(bug: PlantedBug, kernel: KernelAdapter, case) -> bool:
    """The entry point that serves `case` is missing or lacks what `bug` needs."""
    entry = kernel.entry_for(case)
    return entry is None or (bug.needs is not None and not bug.needs(entry.capabilities()))


def planted_adapter(bug: PlantedBug, host: KernelAdapter) -> KernelAdapter:
    return bug.plant(host, bug.name)


def case_cost(case: Case) -> float:
    """Order cases cheapest first (a bug is usually killed by the first few)."""
    return case.flops("fwd") * (3.5 if case.dtype != "fp32" else 7.0) * len(case.seeds) + 1e4 * (
        1 + len(case.checks) * 10
    )


def mult_to_catch(max_err: float, pt_err: float, floor: float) -> float:
    """The tolerance multiplier at or below which an error of max_err would fail (ratio > 1)."""
    if pt_err <= 0 or not math.isfinite(max_err):
        return math.inf if max_err > floor else 0.0
    return max(0.0, (max_err - floor) / pt_err)
