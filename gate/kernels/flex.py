"""FlexAttention: masks and score modifications as Python functions, compiled by inductor.

flash-attn's semantics expressed as flex mods: bottom-right causal/window as a mask_mod,
softcap and ALiBi as a score_mod. Compilation is the trap: each new (shape, dtype, mod) family
recompiles, and dynamo gives up after its recompile limit. So the compiled function is made
once per adapter, the limit is raised for a suite's worth of shape families, and the mods and
block mask are built once per case in `prepare` (not once per seed).

Custom biases: a float bias is read by a score_mod that captures the tensor
(`score + bias[b, h, q_idx, kv_idx]`, index 0 on a broadcast dim), so Flex's backward returns
its gradient; a boolean mask becomes a mask_mod reading the captured bool tensor, and its block
mask is built once per case (the patterns do not change with the seed). Block masks are built by
create_block_mask as users call it: eagerly, or compiled past EAGER_BLOCK_MASK_MAX_ELEMENTS, where
the eager build's dense evaluation of the mask_mod does not fit in a GPU (65,537 keys).
"""

from __future__ import annotations

import functools

import torch

from gate.attention.inputs import offsets
from gate.attention.masks import effective_window
from gate.core.cases import Case
from gate.kernels.base import (
    Capabilities,
    KernelAdapter,
    KernelCall,
    KernelOutput,
    append_new_tokens,
    entry_kind,
    per_sequence,
    read_pages,
)
from gate.kernels.capabilities import Feature, feature_set

RECOMPILE_LIMIT = 512
# Above this many mask elements (batch x heads x queries x keys, broadcast dims counted once) the block
# mask is built by a compiled create_block_mask. The eager one evaluates the mask_mod densely under vmap:
# at 65,537 x 65,537 with a mask_mod reading a bool tensor the process held 136 GiB of the H200's 140 when
# it died out of memory in vmap's aten.index (bf16-b1-h2-s65537-d64-bias.document),
# while compiling it is how FlexAttention's users build long masks (torchtitan compiles it). 2**28 keeps
# every case up to 16k x 16k on the eager path it has always run on; only the 65,537-key masks cross it.
# Built so, that row gets past the build and faults as plain flex does on the same mask (a 32-bit
# index into the captured mask in flex's kernel: docs/upstream-findings.md).
EAGER_BLOCK_MASK_MAX_ELEMENTS = 1 << 28


def _band(ok, k_pos, diag, p: dict, has_left: bool, has_right: bool):
    """`ok` narrowed to the window around `diag` (the query's key position): right, then left side."""
    if has_right:
        ok = ok & (k_pos <= diag + p["right"])
    if has_left:
        ok = ok & (k_pos >= diag - p["left"])
    return ok


def _capped(score, h, diag, k_pos, p: dict, has_cap: bool, has_alibi: bool):
    """The softcap, then ALiBi's -slope * |diag - key| (diag: the query's key position)."""
    if has_cap:
        score = torch.tanh(score / p["cap"]) * p["cap"]
    if has_alibi:
        score = score - p["slopes"][h] * (diag - k_pos).abs()
    return score


def block_options(block_size: tuple[int, int], dtype: torch.dtype) -> dict:
    """kernel_options whose Triton tiles divide a block mask's (query, key) blocks. Flex's default tiles
    (up to 128 each way, by GPU, dtype and head dim) must divide the mask's blocks, or its lowering raises
    "Q and KV block size must be divisible by BLOCK_M and BLOCK_N" (the forward) or finds no config (the
    backward, whose tiles must also divide one another: BLOCK_N1 % BLOCK_M1, BLOCK_M2 % BLOCK_N2). Only a
    block under 128 changes anything: its forward tile drops to 32 (at most the default everywhere, so it
    fits in shared memory), and the backward's four tiles become one size; fp32's backward tiles are 16
    already. Unprefixed BLOCK_M / BLOCK_N reach the forward and the decoding kernel alike. On SM90 at
    head dims 64-128 the backward still finds no config for a key block under 128: the lowering filters
    its configs by their own tiles before these options apply (the ERROR row says so)."""
    q_block, kv_block = block_size
    options: dict = {}
    if q_block % 128:
        options["BLOCK_M"] = min(32, q_block)
    if kv_block % 128:
        options["BLOCK_N"] = min(32, kv_block)
    if options and dtype != torch.float32:
        tile = min(32, q_block, kv_block)
        options.update({f"bwd_BLOCK_{name}": tile for name in ("M1", "N1", "M2", "N2")})
    return options


def _flex_call(fn, qh, kh, vh, kwargs: dict):
    """(out, lse) of one flex_attention call, asking for the LSE as this torch spells it."""
    try:
        from torch.nn.attention.flex_attention import AuxRequest

        out, aux = fn(qh, kh, vh, **kwargs, return_aux=AuxRequest(lse=True))
        return out, aux.lse
    except ImportError:
        return fn(qh, kh, vh, **kwargs, return_lse=True)


class FlexAdapter(KernelAdapter):
    name = "flex"
    description = "torch FlexAttention (torch.compile'd flex_attention)"
    dynamic = False  # torch.compile(flex_attention, dynamic=...)
    # > 0: each block mask is built for a grid this many queries and keys larger and cropped to the
    # case with BlockMask._adjust, as a model reusing one mask made for its longest sequence does
    mask_margin = 0
    packed_varlen = False  # True: a varlen case is one call over the packed sequences (FlexPackedAdapter)
    block_size: tuple[int, int] | None = None  # the block masks' (query, key) blocks; None: Flex's default, 128
    # True: each block mask is built for every batch element and head, as a model masking per (b, h) does
    full_batch_heads = False

    def __init__(self) -> None:
        self._compiled = None
        self._compiled_block_mask = None
        self._block_masks: dict = {}
        self._mod_cache: dict = {}
        self._scalars: dict = {}  # _on: device copies of the numbers the mods read

    def unavailable_reason(self) -> str | None:
        try:
            import torch.nn.attention.flex_attention  # noqa: F401
        except ImportError as exc:
            return f"FlexAttention not in this torch ({exc})"
        if not torch.cuda.is_available():
            return "needs a CUDA GPU (FlexAttention has no backward on CPU)"
        return None

    def capabilities(self) -> Capabilities:
        return Capabilities(
            devices=("cuda",),
            dtypes=("fp16", "bf16", "fp32"),
            max_head_dim=256,
            features=feature_set(
                head_dim_v_differs=True,
                window=True,
                softcap=True,
                alibi=True,
                varlen=True,
                gqa=True,
                kvcache=True,
                paged=True,  # on a gathered dense cache
                bias=True,
                bias_grad=True,
                bool_mask=True,  # score_mod / mask_mod over the captured tensor
                varlen_bias=True,
            ),
            deterministic_mode=True,
            returns_lse=True,
            notes=(
                "varlen by running each sequence alone",
                "decode: one call on the gathered cache padded to the longest element, a mask_mod with each "
                "element's length (append and paging emulated by the adapter)",
            ),
            reasons={
                Feature.BIAS_GRAD_OTHER_DTYPE: (
                    "no gradient of an fp32 bias with bf16/fp16 inputs: the compiled backward does not fit in shared "
                    "memory (measured on an H200, torch 2.11, d128: Inductor 'No valid triton configs', 262 KB needed, "
                    "227 KB available)"
                )
            },
        )

    def _fn(self):
        if self._compiled is None:
            import torch._dynamo
            from torch.nn.attention.flex_attention import flex_attention

            for knob in (
                "recompile_limit",
                "cache_size_limit",
                "accumulated_recompile_limit",
                "accumulated_cache_size_limit",
            ):
                if hasattr(torch._dynamo.config, knob):
                    setattr(torch._dynamo.config, knob, max(getattr(torch._dynamo.config, knob), RECOMPILE_LIMIT))
            import torch._functorch.config

            # timing runs the backward of one graph again and again; donated buffers forbid that
            torch._functorch.config.donated_buffer = False
            self._compiled = torch.compile(flex_attention, dynamic=self.dynamic)
        return self._compiled

    def _block_mask(
        self, key, mask_mod, batch, heads, nq: int, nk: int, device, croppable: bool = True, block_size=None
    ):
        """The case's block mask, built once per case and key (the patterns do not change with the seed):
        eagerly where the mask is small, by a compiled create_block_mask past EAGER_BLOCK_MASK_MAX_ELEMENTS,
        where the eager build's dense evaluation does not fit in the GPU's memory. Blocks of `block_size`
        (queries, keys), else the adapter's, else Flex's default."""
        block_mask = self._block_masks.get(key)
        if block_mask is None:
            from torch.nn.attention.flex_attention import create_block_mask

            size = block_size or self.block_size
            build = create_block_mask
            if (batch or 1) * (heads or 1) * nq * nk > EAGER_BLOCK_MASK_MAX_ELEMENTS:
                if self._compiled_block_mask is None:
                    self._compiled_block_mask = torch.compile(create_block_mask)
                build = self._compiled_block_mask
            if size is not None:
                build = functools.partial(build, BLOCK_SIZE=size)
            if self.mask_margin and croppable:
                big = build(mask_mod, batch, heads, nq + self.mask_margin, nk + self.mask_margin, device=device)
                block_mask = self._block_masks[key] = big._adjust(nq, nk)
            else:
                block_mask = self._block_masks[key] = build(mask_mod, batch, heads, nq, nk, device=device)
        return block_mask

    def _attend(self, qh, kh, vh, kwargs: dict):
        """(out, lse) of the compiled flex_attention on (B, H, N, D) tensors, with kernel_options whose
        tiles divide the block mask's blocks."""
        block_mask = kwargs.get("block_mask")
        options = block_options(block_mask.BLOCK_SIZE, qh.dtype) if block_mask is not None else {}
        return _flex_call(self._fn(), qh, kh, vh, {**kwargs, "kernel_options": options} if options else kwargs)

    def _on(self, device, slot: str, value):
        """`value` (a number or a tuple of numbers) for the mods' `slot` as a device tensor, made once
        and reused: a new torch.tensor(..., device=cuda) is a host-to-device copy, i.e. a wait on the
        GPU, in every timed call. Keyed by slot as well as value, so two slots never share one tensor
        when their values coincide (offset 0 and window right 0 on a square sequence). Dynamo guards
        that captured tensors do not alias; with sharing, that guard fails for any cached compile made
        while the sharing was otherwise (an earlier case in the worker, an earlier varlen sequence),
        and torch 2.11's report of that failure re-reads the old compile's sources, crashing where one
        passes through a score_mod that is now None ("AttributeError:
        'NoneType' object has no attribute '__closure__'" in recompilation_reason_for_no_tensor_aliasing_guard,
        pytorch #176211, fix PR #184793). Without sharing that guard cannot fail."""
        key = (str(device), slot, type(value), value)
        if key not in self._scalars:
            self._scalars[key] = torch.tensor(value, device=device)
        return self._scalars[key]

    def _mods(self, call: KernelCall, nq: int, nk: int):
        """(mask_mod, score_mod), built once per structure and reused: the numbers they read
        (offset, window sides, softcap, slopes) are device tensors, so a new case changes
        values, not the traced program, and does not add a recompile of its own."""
        o = call.opts
        left, right = effective_window(o.causal, o.window)
        device = call.q.device
        params = {
            "offset": self._on(device, "offset", nk - nq),
            "left": self._on(device, "left", left),
            "right": self._on(device, "right", right),
            "cap": self._on(device, "cap", float(o.softcap or 1.0)),
            "slopes": o.alibi_slopes if o.alibi_slopes is not None else self._on(device, "slopes", (0.0,)),
        }
        key = (left >= 0, right >= 0, bool(o.softcap), o.alibi_slopes is not None, str(device))
        if key not in self._mod_cache:
            self._mod_cache[key] = self._make_mods(*key[:4])
        holder, mask_mod, score_mod = self._mod_cache[key]
        holder.clear()
        holder.update(params)
        if o.bias is not None:
            return self._bias_mods(key, o.bias, mask_mod, score_mod)
        return mask_mod, score_mod

    def _bias_mods(self, key, bias: torch.Tensor, mask_mod, score_mod):
        """the case's mods with the custom bias read on top, built once per structure
        (bias kind, broadcast dims) and fed the tensor through a holder like the other numbers."""
        is_bool = bias.dtype == torch.bool
        bkey = ("bias", key, is_bool, bias.shape[0] == 1, bias.shape[1] == 1)
        if bkey not in self._mod_cache:
            self._mod_cache[bkey] = self._make_bias_mods(mask_mod, score_mod, *bkey[2:])
        holder, new_mask, new_score = self._mod_cache[bkey]
        holder.clear()
        holder["bias"] = bias
        return new_mask, new_score

    @staticmethod
    def _make_bias_mods(base_mask, base_score, is_bool: bool, one_batch: bool, one_head: bool):
        p: dict = {}

        def at(b, h, q_idx, kv_idx):
            return p["bias"][0 if one_batch else b, 0 if one_head else h, q_idx, kv_idx]

        if is_bool:

            def mask_mod(b, h, q_idx, kv_idx):
                ok = at(b, h, q_idx, kv_idx)
                return ok if base_mask is None else ok & base_mask(b, h, q_idx, kv_idx)

            return p, mask_mod, base_score

        def score_mod(score, b, h, q_idx, kv_idx):
            if base_score is not None:
                score = base_score(score, b, h, q_idx, kv_idx)
            return score + at(b, h, q_idx, kv_idx)

        return p, base_mask, score_mod

    @staticmethod
    def _make_mods(has_left: bool, has_right: bool, has_cap: bool, has_alibi: bool):
        p: dict = {}
        mask_mod = None
        if has_left or has_right:

            def mask_mod(b, h, q_idx, kv_idx):
                return _band(kv_idx >= 0, kv_idx, q_idx + p["offset"], p, has_left, has_right)

        score_mod = None
        if has_cap or has_alibi:

            def score_mod(score, b, h, q_idx, kv_idx):
                return _capped(score, h, q_idx + p["offset"], kv_idx, p, has_cap, has_alibi)

        return p, mask_mod, score_mod

    def _dense(self, q, k, v, call: KernelCall) -> KernelOutput:
        qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        nq, nk = qh.shape[2], kh.shape[2]
        mask_mod, score_mod = self._mods(call, nq, nk)
        block_mask = None
        if mask_mod is not None:
            key = (nq, nk, call.opts.causal, call.opts.window, str(q.device))
            bb = hb = None
            bias = call.opts.bias
            if bias is not None and bias.dtype == torch.bool:  # per (batch, head) where the mask varies
                bb = None if bias.shape[0] == 1 else bias.shape[0]
                hb = None if bias.shape[1] == 1 else bias.shape[1]
                # a varlen sequence's block of a packed mask: where it starts tells the blocks apart
                key += ("bool_bias", tuple(bias.shape), bias.storage_offset())
            if self.full_batch_heads:
                bb, hb = qh.shape[0], qh.shape[1]
            # a boolean bias's mask_mod reads the bias tensor: a larger grid would index past it
            block_mask = self._block_mask(
                key, mask_mod, bb, hb, nq, nk, q.device, croppable=bias is None or bias.dtype != torch.bool
            )
        kwargs = dict(
            score_mod=score_mod,
            block_mask=block_mask,
            scale=call.opts.softmax_scale,
            enable_gqa=qh.shape[1] != kh.shape[1],
        )
        out, lse = self._attend(qh, kh, vh, kwargs)
        # Flex reports fully masked rows with LSE -inf, like the reference; out is 0 there.
        return KernelOutput(out=out.transpose(1, 2), lse=lse.detach().float())

    def prepare(self, case: Case) -> None:
        self._block_masks.clear()

    # --- decode as ONE flex call per case (not one per key length: each would compile) ---

    @staticmethod
    def _make_decode_mods(has_left: bool, has_right: bool, has_cap: bool, has_alibi: bool):
        """Mods over a batch padded to the longest cache: key j of element b exists when j < lens[b],
        and query i sits at key lens[b] - nq + i (bottom-right, per element)."""
        p: dict = {}

        def mask_mod(b, h, q_idx, kv_idx):
            n = p["lens"][b]
            return _band(kv_idx < n, kv_idx, q_idx + n - p["nq"], p, has_left, has_right)

        score_mod = None
        if has_cap or has_alibi:

            def score_mod(score, b, h, q_idx, kv_idx):
                return _capped(score, h, q_idx + p["lens"][b] - p["nq"], kv_idx, p, has_cap, has_alibi)

        return p, mask_mod, score_mod

    def _decode_mods(self, o, lengths, nq: int, dev):
        """The decode mask_mod and score_mod (compiled once per feature set), their numbers for this
        call put in the holder they read: each element's key length, the queries, window and softcap."""
        left, right = effective_window(o.causal, o.window)
        key = ("decode", left >= 0, right >= 0, bool(o.softcap), o.alibi_slopes is not None, str(dev))
        if key not in self._mod_cache:
            self._mod_cache[key] = self._make_decode_mods(*key[1:5])
        holder, mask_mod, score_mod = self._mod_cache[key]
        holder.clear()
        slots = (
            ("lens", tuple(lengths)),
            ("nq", nq),
            ("left", left),
            ("right", right),
            ("cap", float(o.softcap or 1.0)),
        )
        holder.update({slot: self._on(dev, slot, value) for slot, value in slots})
        holder["slopes"] = o.alibi_slopes if o.alibi_slopes is not None else self._on(dev, "slopes", (0.0,))
        return mask_mod, score_mod

    def _decode(self, call: KernelCall) -> KernelOutput:
        c, o, q = call.cache, call.opts, call.q
        bsz, nq = q.shape[0], q.shape[1]
        append_new_tokens(c)  # the append is this adapter's emulation (Flex has no cache API)
        lengths = c.key_lengths  # host-side: no device sync in the timed call
        longest = max(1, max(lengths))
        hkv = c.k_cache.shape[-2]
        kb = q.new_zeros(bsz, longest, hkv, c.k_cache.shape[-1])
        vb = q.new_zeros(bsz, longest, hkv, c.v_cache.shape[-1])
        for b, n in enumerate(lengths):
            kb[b, :n] = read_pages(c.k_cache, c.block_table, c.page_size, b, 0, n)
            vb[b, :n] = read_pages(c.v_cache, c.block_table, c.page_size, b, 0, n)
        mask_mod, score_mod = self._decode_mods(o, lengths, nq, q.device)
        mkey = ("decode", tuple(lengths), nq, o.causal, o.window, str(q.device))
        heads = q.shape[2] if self.full_batch_heads else None
        block_mask = self._block_mask(mkey, mask_mod, bsz, heads, nq, longest, q.device)
        qh, kh, vh = q.transpose(1, 2), kb.transpose(1, 2), vb.transpose(1, 2)
        kwargs = dict(
            score_mod=score_mod, block_mask=block_mask, scale=o.softmax_scale, enable_gqa=qh.shape[1] != kh.shape[1]
        )
        out, lse = self._attend(qh, kh, vh, kwargs)
        return KernelOutput(out=out.transpose(1, 2), lse=lse.detach().float())

    def __call__(self, call: KernelCall) -> KernelOutput:
        kind = entry_kind(call)
        if kind == "kvcache":
            return self._decode(call)
        if kind == "varlen":
            return self._packed(call) if self.packed_varlen else per_sequence(call, self._dense)
        return self._dense(call.q, call.k, call.v, call)

    # --- varlen as ONE call over the packed sequences (FlexAttention's own varlen: documents) ---

    @staticmethod
    def _make_packed_mods(has_left: bool, has_right: bool, has_cap: bool, has_alibi: bool):
        """Mods over packed sequences: a query sees only keys of its own sequence (document), placed
        bottom-right within it; softcap and ALiBi on the positions inside each sequence."""
        p: dict = {}

        def local(q_idx, kv_idx):
            doc = p["doc_q"][q_idx]
            q_pos = q_idx - p["q_start"][doc] + p["k_len"][doc] - p["q_len"][doc]  # its key position in the doc
            return doc, q_pos, kv_idx - p["k_start"][doc]

        def mask_mod(b, h, q_idx, kv_idx):
            doc, q_pos, k_pos = local(q_idx, kv_idx)
            return _band(p["doc_k"][kv_idx] == doc, k_pos, q_pos, p, has_left, has_right)

        score_mod = None
        if has_cap or has_alibi:

            def score_mod(score, b, h, q_idx, kv_idx):
                _, q_pos, k_pos = local(q_idx, kv_idx)
                return _capped(score, h, q_pos, k_pos, p, has_cap, has_alibi)

        return p, mask_mod, score_mod

    def _packed(self, call: KernelCall) -> KernelOutput:
        o = call.opts
        q_lens = list(call.seqlens) if call.seqlens is not None else torch.diff(call.cu_seqlens).tolist()
        k_lens = (
            list(call.seqlens_k)
            if call.seqlens_k is not None
            else (torch.diff(call.keys_cu_seqlens).tolist() if call.cu_seqlens_k is not None else q_lens)
        )
        dev = call.q.device
        left, right = effective_window(o.causal, o.window)
        key = ("packed", left >= 0, right >= 0, bool(o.softcap), o.alibi_slopes is not None, str(dev))
        if key not in self._mod_cache:
            self._mod_cache[key] = self._make_packed_mods(*key[1:5])
        holder, mask_mod, score_mod = self._mod_cache[key]
        holder.clear()
        docs = range(len(q_lens))
        holder.update(
            {
                slot: self._on(dev, slot, tuple(value))
                for slot, value in (
                    ("doc_q", [d for d in docs for _ in range(q_lens[d])]),
                    ("doc_k", [d for d in docs for _ in range(k_lens[d])]),
                    ("q_start", offsets(q_lens)[:-1]),
                    ("k_start", offsets(k_lens)[:-1]),
                    ("q_len", q_lens),
                    ("k_len", k_lens),
                )
            }
        )
        holder.update(
            {
                slot: self._on(dev, slot, value)
                for slot, value in (("left", left), ("right", right), ("cap", float(o.softcap or 1.0)))
            }
        )
        holder["slopes"] = o.alibi_slopes if o.alibi_slopes is not None else self._on(dev, "slopes", (0.0,))
        nq, nk = sum(q_lens), sum(k_lens)
        mkey = ("packed", tuple(q_lens), tuple(k_lens), o.causal, o.window, str(dev))
        heads = None
        if o.bias is not None:  # the packed bias read at packed positions: each sequence its own block
            mask_mod, score_mod = self._bias_mods(key, o.bias, mask_mod, score_mod)
            if o.bias.dtype == torch.bool:
                heads = None if o.bias.shape[1] == 1 else o.bias.shape[1]
                mkey += ("bool_bias", tuple(o.bias.shape))
        if self.full_batch_heads:
            heads = call.q.shape[1]
        block_mask = self._block_mask(
            mkey, mask_mod, None, heads, nq, nk, dev, croppable=o.bias is None or o.bias.dtype != torch.bool
        )
        qh, kh, vh = (t[None].transpose(1, 2) for t in (call.q, call.k, call.v))
        kwargs = dict(
            score_mod=score_mod, block_mask=block_mask, scale=o.softmax_scale, enable_gqa=qh.shape[1] != kh.shape[1]
        )
        out, lse = self._attend(qh, kh, vh, kwargs)
        return KernelOutput(out=out.transpose(1, 2)[0], lse=lse[0].detach().float())


class FlexPackedAdapter(FlexAdapter):
    """FlexAttention's own varlen: a varlen case is one call over the packed sequences with a
    document mask_mod (each query sees its own sequence, placed bottom-right in it), its softcap
    and ALiBi score_mods on the positions inside each sequence, and a packed custom bias read at
    packed positions by a score_mod (a mask_mod for a boolean one); `flex` runs each sequence alone."""

    name = "flex-packed"
    description = "torch FlexAttention, varlen as one call over packed sequences with a document mask_mod"
    packed_varlen = True


class FlexDynamicAdapter(FlexAdapter):
    """FlexAttention compiled with dynamic=True: one graph over symbolic shapes instead of one per
    shape, the path of models that vary their sequence length."""

    name = "flex-dynamic"
    description = "torch FlexAttention compiled with dynamic=True"
    dynamic = True


class FlexAdjustedMaskAdapter(FlexAdapter):
    """FlexAttention with each block mask built for a longer grid (300 more queries and keys: not a
    whole number of 128-blocks) and cropped to the case with BlockMask._adjust, as a model that
    makes one mask for its longest sequence and reuses it. The gate's mask_mods place each query
    bottom-right for the case's own lengths, so the crop is the case's mask. A boolean custom mask
    (read from its tensor, which has the case's size) is built exactly."""

    name = "flex-adjusted-mask"
    description = "torch FlexAttention with block masks built for a longer grid and BlockMask._adjust'ed"
    mask_margin = 300


class FlexSlicedMaskAdapter(FlexAdapter):
    """FlexAttention with each block mask built once for every batch element and head (B, H) and
    sliced with an integer index per query block (`mask[:, :, i]`), as a decoding model slices its
    whole-sequence mask at the block of the current position: one flex call per 128-query block, the
    slice's mask_mod and score_mod the case's own shifted by the block's first query, its seq_lengths
    the block's. The same answer as `flex`'s one call on the whole mask."""

    name = "flex-sliced-mask"
    description = "torch FlexAttention with a (B, H) block mask sliced mask[:, :, i], one call per query block"
    full_batch_heads = True

    def _shifted(self, mask_mod, score_mod):
        """(holder, mask_mod, score_mod) reading query q_idx + holder["q_off"]: a query block's mods,
        built once per pair of mods and fed the block's offset as a device tensor."""
        key = ("sliced", id(mask_mod), id(score_mod))
        if key not in self._mod_cache:
            p: dict = {}

            def sliced_mask(b, h, q_idx, kv_idx):
                return mask_mod(b, h, q_idx + p["q_off"], kv_idx)

            sliced_score = None
            if score_mod is not None:

                def sliced_score(score, b, h, q_idx, kv_idx):
                    return score_mod(score, b, h, q_idx + p["q_off"], kv_idx)

            self._mod_cache[key] = (p, sliced_mask, sliced_score)
        return self._mod_cache[key]

    def _attend(self, qh, kh, vh, kwargs: dict):
        whole = kwargs.get("block_mask")
        if whole is None:
            return super()._attend(qh, kh, vh, kwargs)
        holder, mask_mod, score_mod = self._shifted(whole.mask_mod, kwargs.get("score_mod"))
        nq, nk, rows = qh.shape[2], kh.shape[2], whole.BLOCK_SIZE[0]
        outs, lses = [], []
        for i, start in enumerate(range(0, nq, rows)):
            stop = min(nq, start + rows)
            part = whole[:, :, i]  # the integer index: one row of query blocks, every batch element and head
            part.mask_mod = mask_mod  # a slice's mask_mod raises until the caller gives it the shifted one
            part.seq_lengths = (stop - start, nk)
            holder["q_off"] = self._on(qh.device, "q_off", start)
            out, lse = super()._attend(
                qh[:, :, start:stop], kh, vh, {**kwargs, "block_mask": part, "score_mod": score_mod}
            )
            outs.append(out)
            lses.append(lse)
        return torch.cat(outs, dim=2), torch.cat(lses, dim=2)


class FlexBlockSizeAdapter(FlexAdapter):
    """FlexAttention with block masks of blocks other than its default 128: (queries, keys) per block,
    with kernel_options whose Triton tiles divide them (`block_options`)."""

    def __init__(self, name: str, block_size: tuple[int, int]) -> None:
        super().__init__()
        self.name = name
        self.block_size = block_size
        q_block, kv_block = block_size
        self.description = f"torch FlexAttention with block masks of {q_block} queries x {kv_block} keys per block"


# Decode through PagedAttention: the page (and key block) of a cache the case does not page itself.
PAGE = 128


class FlexPagedAdapter(FlexAdapter):
    """Decode through FlexAttention's PagedAttention (torch.nn.attention.experimental._paged_attention):
    K/V in one physical cache of pages, (1, Hkv, pages x page, D); a paged case's own block table as
    the page table and its own block pool as that cache (the new tokens `assign`ed into it, where the
    gate checks them), a contiguous one's cache `assign`ed into pages that `reserve` hands out to the
    batch elements in turn (so logical and physical order differ), 128 tokens a page. The logical block
    mask (blocks of 128 queries x one page of keys) goes through `convert_logical_block_mask` with each
    element's key length, the score_mod through `get_score_mod`: the mods see logical key positions,
    the kernel physical ones. Key lengths are not whole pages, so each element's last page is partial."""

    name = "flex-paged"
    description = "torch FlexAttention decode through PagedAttention: physical pages, converted block mask"

    def unsupported_reason(self, case: Case, device: str) -> str | None:
        reason = super().unsupported_reason(case, device)
        page = case.entry.page_size
        if reason is None and page and (page < 16 or page & (page - 1)):
            return (
                f"page_size {page}: PagedAttention's key block is the page, and Flex's Triton blocks are "
                f"powers of two >= 16"
            )
        return reason

    def _pages(self, c, lengths: list[int], device):
        """(PagedAttention, physical k, physical v): the case's own pool and block table when paged,
        else pages reserved for the cache and filled by `assign`."""
        from torch.nn.attention.experimental._paged_attention import PagedAttention

        bsz, hkv = len(lengths), c.k_cache.shape[-2]
        if c.paged:
            blocks, page = c.k_cache.shape[0], c.page_size
            paged = PagedAttention(blocks, page, bsz, device=device)
            table = c.block_table.long()
            paged.page_table[:, : table.shape[1]] = table
            logical = torch.arange(table.shape[1], device=device).expand_as(table)
            paged.physical_to_logical.scatter_(1, table, logical)
            paged.capacity[:] = table.shape[1] * page
            # the pool itself, viewed (1, Hkv, slots, D): assign writes the new tokens into the case's pages
            k_phys = c.k_cache.view(1, blocks * page, hkv, -1).transpose(1, 2)
            v_phys = c.v_cache.view(1, blocks * page, hkv, -1).transpose(1, 2)
            return paged, k_phys, v_phys
        pages = -(-max(1, max(lengths)) // PAGE)
        paged = PagedAttention(bsz * pages, PAGE, bsz, device=device)
        for j in range(pages):  # page j of every element before page j + 1 of any
            for b in range(bsz):
                paged.reserve(torch.tensor(b, device=device), torch.tensor((j + 1) * PAGE, device=device))
        k_phys = c.k_cache.new_zeros(1, hkv, bsz * pages * PAGE, c.k_cache.shape[-1])
        v_phys = c.v_cache.new_zeros(1, hkv, bsz * pages * PAGE, c.v_cache.shape[-1])
        for b, n in enumerate(c.cached):
            if n:
                paged.assign(
                    torch.tensor([b], device=device),
                    torch.arange(n, device=device)[None],
                    c.k_cache[b : b + 1, :n].transpose(1, 2),
                    c.v_cache[b : b + 1, :n].transpose(1, 2),
                    k_phys,
                    v_phys,
                )
        return paged, k_phys, v_phys

    def _decode(self, call: KernelCall) -> KernelOutput:
        c, o, q = call.cache, call.opts, call.q
        bsz, nq, dev = q.shape[0], q.shape[1], q.device
        lengths = c.key_lengths
        paged, k_phys, v_phys = self._pages(c, lengths, dev)
        if c.k_new is not None:  # the new tokens at each element's cached length, by the API's assign
            positions = torch.tensor([[n + i for i in range(nq)] for n in c.cached], device=dev)
            batch = torch.arange(bsz, device=dev)
            paged.assign(batch, positions, c.k_new.transpose(1, 2), c.v_new.transpose(1, 2), k_phys, v_phys)
            if not c.paged:
                append_new_tokens(c)  # the case's own contiguous cache, which the gate checks, gets them too
        mask_mod, score_mod = self._decode_mods(o, lengths, nq, dev)
        longest = max(1, max(lengths))
        page = paged.page_size
        mkey = ("paged", tuple(lengths), nq, o.causal, o.window, page, str(dev))
        logical = self._block_mask(mkey, mask_mod, bsz, None, nq, longest, dev, block_size=(128, page))
        kv_len = self._on(dev, "kv_len", tuple(lengths))
        physical = paged.convert_logical_block_mask(logical, kv_len=kv_len)
        kwargs = dict(
            score_mod=paged.get_score_mod(score_mod, kv_len),
            block_mask=physical,
            scale=o.softmax_scale,
            enable_gqa=q.shape[2] != k_phys.shape[1],
        )
        out, lse = self._attend(q.transpose(1, 2), k_phys, v_phys, kwargs)
        return KernelOutput(out=out.transpose(1, 2), lse=lse.detach().float())
