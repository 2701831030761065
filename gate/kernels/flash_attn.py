"""flash-attn's three generations: FA2 (`flash_attn`), FA3 (`flash_attn_interface`), FA4
(`flash_attn.cute`, pip `flash-attn-4`). Imported lazily: a missing package makes the adapter
unavailable (reported), never an import error at start-up.

Conventions kept by all three: (B, N, H, D) layout, bottom-right causal, window (left, right),
LSE (B, H, Nq) dense and (H, total_q) varlen. Differences handled here: FA4 spells an unbounded
window side None (not -1) and always returns (out, lse); FA3 returns (out, lse) in some
releases and out alone in others; FA2 returns the LSE (and its dropout mask, encoded in the sign
of S_dmask) only with return_attn_probs=True.
"""

from __future__ import annotations

import importlib
import importlib.metadata

import torch

from gate.kernels.base import Capabilities, KernelAdapter, KernelCall, KernelOutput, write_pages


def _import(module: str):
    return importlib.import_module(module)


class _FlashBase(KernelAdapter):
    module = ""
    dist = ""
    kvcache_fn = ""  # issue #10: the module's decode entry point ("" = none)

    def unavailable_reason(self) -> str | None:
        if not torch.cuda.is_available():
            return "needs a CUDA GPU"
        try:
            _import(self.module)
        except Exception as exc:  # ImportError, or a broken extension build
            return f"`{self.module}` does not import ({type(exc).__name__}: {exc}); install {self.dist}"
        return None

    def version(self) -> str:
        try:
            return importlib.metadata.version(self.dist)
        except importlib.metadata.PackageNotFoundError:
            return "unknown"

    def _window(self, call: KernelCall):
        return tuple(call.opts.window)

    def _kwargs(self, call: KernelCall) -> dict:
        return dict(softmax_scale=call.opts.softmax_scale, causal=call.opts.causal, window_size=self._window(call),
                    softcap=call.opts.softcap, deterministic=call.deterministic)

    @staticmethod
    def _split(result) -> tuple[torch.Tensor, torch.Tensor | None]:
        if isinstance(result, tuple):
            return result[0], (result[1].detach().float() if len(result) > 1 and result[1] is not None else None)
        return result, None

    def __call__(self, call: KernelCall) -> KernelOutput:
        mod = _import(self.module)
        kwargs = self._kwargs(call)
        if call.cu_seqlens is None:
            out, lse = self._split(mod.flash_attn_func(call.q, call.k, call.v, **kwargs))
        else:
            out, lse = self._split(mod.flash_attn_varlen_func(
                call.q, call.k, call.v, cu_seqlens_q=call.cu_seqlens, cu_seqlens_k=call.keys_cu_seqlens,
                max_seqlen_q=call.max_seqlen, max_seqlen_k=call.keys_max_seqlen, **kwargs))
        return KernelOutput(out=out, lse=lse)


# --- issue #10: decode through flash_attn_with_kvcache (FA2, FA3). Written to the documented APIs;
# not run here (no GPU build of FA2/FA3 was available): the H200 script says what it found.


def with_kvcache(fn, call: KernelCall, paged_keyword: str, window: tuple) -> KernelOutput:
    """flash_attn_with_kvcache(q, k_cache, v_cache, k=, v=, cache_seqlens=, <block_table|page_table>=,
    softmax_scale=, causal=, window_size=, softcap=, [alibi_slopes=], return_softmax_lse=True): the new
    k/v are appended into k_cache/v_cache in place; lse is (B, H, Nq)."""
    c = call.cache
    kwargs = dict(cache_seqlens=c.cache_seqlens, softmax_scale=call.opts.softmax_scale, causal=call.opts.causal,
                  window_size=window, softcap=call.opts.softcap, return_softmax_lse=True)
    if call.opts.alibi_slopes is not None:
        kwargs["alibi_slopes"] = call.opts.alibi_slopes
    if c.k_new is not None:
        kwargs.update(k=c.k_new, v=c.v_new)
    if c.block_table is not None:
        kwargs[paged_keyword] = c.block_table
    result = fn(call.q, c.k_cache, c.v_cache, **kwargs)
    out, lse = (result[0], result[1]) if isinstance(result, tuple) else (result, None)
    return KernelOutput(out=out, lse=None if lse is None else lse.detach().float())


class FA2Adapter(_FlashBase):
    name, module, dist = "fa2", "flash_attn", "flash-attn"
    description = "flash-attn 2 (flash_attn.flash_attn_func)"

    def capabilities(self) -> Capabilities:
        # flash_attn_with_kvcache: paged KV needs page_block_size % 256 == 0 (its docstring)
        return Capabilities(dtypes=("fp16", "bf16"), max_head_dim=256, window=True, softcap=True, alibi=True,
                            dropout=True, dropout_keep_levels=256, varlen=True, deterministic_mode=True, returns_lse=True,
                            kvcache=True, paged=True, page_size_multiple=256)

    def _kwargs(self, call: KernelCall) -> dict:
        kwargs = super()._kwargs(call)
        kwargs.update(alibi_slopes=call.opts.alibi_slopes, dropout_p=call.opts.dropout_p, return_attn_probs=True)
        return kwargs

    def __call__(self, call: KernelCall) -> KernelOutput:
        mod = _import(self.module)
        if call.cache is not None:
            return with_kvcache(mod.flash_attn_with_kvcache, call, "block_table", tuple(call.opts.window))
        kwargs = self._kwargs(call)
        # FA2 draws dropout from torch's CUDA generator: seed it from the call (forked, so the
        # caller's RNG is untouched) so the same seed gives the same mask; the backward replays
        # the forward's saved Philox state.
        devices = [call.q.device.index or 0] if call.q.is_cuda else []
        with torch.random.fork_rng(devices=devices, enabled=bool(call.opts.dropout_p)):
            if call.opts.dropout_p:
                torch.manual_seed(call.seed)
            if call.cu_seqlens is None:
                out, lse, s_dmask = mod.flash_attn_func(call.q, call.k, call.v, **kwargs)
            else:
                out, lse, s_dmask = mod.flash_attn_varlen_func(
                    call.q, call.k, call.v, call.cu_seqlens, call.keys_cu_seqlens, call.max_seqlen, call.keys_max_seqlen,
                    **kwargs)
        keep = None
        if call.opts.dropout_p:
            # FA2 encodes a dropped element as a negative entry of S_dmask (padded to 128/256);
            # varlen: one (batch slot, H, max_q, max_k) block per sequence, top-left filled.
            if call.cu_seqlens is None:
                nq, nk = call.q.shape[1], call.k.shape[1]
                keep = (s_dmask[:, :, :nq, :nk] >= 0)
            else:
                keys = call.seqlens_k or call.seqlens
                keep = [None if not n else s_dmask[i:i + 1, :, :n, :keys[i]] >= 0 for i, n in enumerate(call.seqlens)]
        return KernelOutput(out=out, lse=lse.detach().float(), dropout_keep=keep)


class FA3Adapter(_FlashBase):
    name, module, dist = "fa3", "flash_attn_interface", "flash-attn-3"
    description = "flash-attn 3, Hopper (flash_attn_interface.flash_attn_func)"

    def capabilities(self) -> Capabilities:
        return Capabilities(dtypes=("fp16", "bf16"), max_head_dim=256, head_dim_multiple=8, head_dim_v_differs=True,
                            window=True, softcap=True, varlen=True, deterministic_mode=True, returns_lse=True,
                            kvcache=True, paged=True)

    def _kwargs(self, call: KernelCall) -> dict:
        kwargs = super()._kwargs(call)
        kwargs["return_attn_probs"] = True  # releases that return out alone honour this; others ignore it
        return kwargs

    def __call__(self, call: KernelCall) -> KernelOutput:
        if call.cache is not None:  # FA3 names the block table page_table
            return with_kvcache(_import(self.module).flash_attn_with_kvcache, call, "page_table", tuple(call.opts.window))
        try:
            return super().__call__(call)
        except TypeError as exc:
            if "return_attn_probs" not in str(exc):
                raise
            mod = _import(self.module)
            kwargs = {k: v for k, v in self._kwargs(call).items() if k != "return_attn_probs"}
            out, lse = self._split(mod.flash_attn_func(call.q, call.k, call.v, **kwargs))
            return KernelOutput(out=out, lse=lse)


class FA4Adapter(_FlashBase):
    name, module, dist = "fa4", "flash_attn.cute", "flash-attn-4"
    description = "flash-attn 4, CuTe DSL (flash_attn.cute.flash_attn_func)"

    def _takes(self, fn_name: str, keyword: str) -> bool:
        """Whether this FA4 build's fn_name takes `keyword` (False where it does not import)."""
        import inspect

        try:
            return keyword in inspect.signature(getattr(_import(self.module), fn_name)).parameters
        except Exception:
            return False

    def capabilities(self) -> Capabilities:
        # issue #10: decode through flash_attn_varlen_func(page_table=, seqused_k=) and learnable
        # sinks, each only where this build's signature has it.
        paged = self._takes("flash_attn_varlen_func", "page_table")
        return Capabilities(dtypes=("fp16", "bf16"), max_head_dim=256, head_dim_multiple=8, head_dim_v_differs=True,
                            window=True, softcap=True, varlen=True, deterministic_mode=True, returns_lse=True,
                            kvcache=self._takes("flash_attn_varlen_func", "seqused_k"), paged=paged,
                            sinks=self._takes("flash_attn_func", "learnable_sink"),
                            # not seen on a GPU yet whether its backward returns the sink's gradient:
                            # dsink is not judged (the row says so) until it has been
                            sink_grad=False,
                            notes=("decode: flash_attn_varlen_func with seqused_k (and page_table); the new k/v are "
                                   "written into the cache by the adapter (FA4 has no append)",),
                            bias_unsupported=self._bias_reason())  # issue #16

    def _bias_reason(self) -> str:
        """issue #16: why FA4 bias/mask cases are skipped, read from its API (never guessed).

        FA4's score_mod / mask_mod are CuTe DSL functions over `aux_tensors`, and its backward
        returns no gradient for an aux tensor. attn-gate does not write CuTe mods yet (nothing
        here could test one: no GPU on the CI machine), so every bias case is SKIPPED with what
        the installed API offers. FlexAttention's FLASH backend compiles Python mods into these
        kernels: evidence/h200/bias_sweeps.py tries that route where it exists."""
        try:
            import inspect

            params = set(inspect.signature(_import(self.module).flash_attn_func).parameters)
        except Exception as exc:  # not installed, or a signature we cannot read
            return f"custom bias not wired for FA4 (its API could not be inspected: {type(exc).__name__})"
        mods = sorted(params & {"score_mod", "mask_mod", "aux_tensors"})
        if not mods:
            return "this flash-attn-4 has no score_mod/mask_mod: no custom bias or mask"
        return (f"FA4 takes {'/'.join(mods)} as CuTe DSL functions; attn-gate has no CuTe bias mod yet "
                f"(untested here), so the custom bias path is not run")

    def _window(self, call: KernelCall):
        return tuple(None if w < 0 else w for w in call.opts.window)

    def _kwargs(self, call: KernelCall) -> dict:
        kwargs = super()._kwargs(call)
        kwargs["return_lse"] = True
        if call.sink is not None:
            kwargs["learnable_sink"] = call.sink
        return kwargs

    def __call__(self, call: KernelCall) -> KernelOutput:
        if call.cache is None:
            return super().__call__(call)
        mod = _import(self.module)
        c = call.cache
        lengths = c.cache_seqlens
        if c.k_new is not None:  # FA4 does not append: write the new tokens, then attend over them too
            for b, start in enumerate(c.cached):
                write_pages(c.k_cache, c.block_table, c.page_size, b, start, c.k_new[b])
                write_pages(c.v_cache, c.block_table, c.page_size, b, start, c.v_new[b])
            lengths = c.cache_seqlens + c.k_new.shape[1]
        kwargs = dict(softmax_scale=call.opts.softmax_scale, causal=call.opts.causal, window_size=self._window(call),
                      softcap=call.opts.softcap, seqused_k=lengths.to(torch.int32), return_lse=True)
        if c.block_table is not None:
            kwargs["page_table"] = c.block_table
        if call.sink is not None:
            kwargs["learnable_sink"] = call.sink
        out, lse = self._split(mod.flash_attn_varlen_func(call.q, c.k_cache, c.v_cache, **kwargs))
        return KernelOutput(out=out, lse=lse)


class FA4RawWindowAdapter(FA4Adapter):
    """FA4 handed the window exactly as flash_attn_func callers spell it: -1 for an unbounded side
    (issue #9). FA4's API spells that None and reads -1 differently (TransformerEngine #3528:
    causal + window (-1, 0) returned zeros), so both spellings must reach the kernel: `fa4` takes
    None, this one -1; the window cases of the suites run through both."""

    name = "fa4-raw-window"
    description = "flash-attn 4 with window_size passed raw (-1 = unbounded), as FA2/FA3 callers write it"

    def _window(self, call: KernelCall):
        return tuple(call.opts.window)
