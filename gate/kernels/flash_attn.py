"""flash-attn's three generations: FA2 (`flash_attn`), FA3 (`flash_attn_interface`), FA4
(`flash_attn.cute`, pip `flash-attn-4`). Imported lazily: a missing package makes the adapter
unavailable (reported), never an import error at start-up.

Decode knobs (a case's forced num_splits / pack_gqa, gate/core/cases.py KNOBS) go to the library by
its own keywords: FA2's flash_attn_with_kvcache takes num_splits, FA3's num_splits and pack_gqa
(unless its build disabled split or packgqa), FA4's flash_attn_varlen_func both where its signature
has them. None takes an HND cache.

Conventions kept by all three: (B, N, H, D) layout, bottom-right causal, window (left, right),
LSE (B, H, Nq) dense and (H, total_q) varlen; each entry point is called through the shared
DenseEntryPoint / VarlenEntryPoint / KVCacheEntryPoint (gate/kernels/entries.py), as a user's kernel
family is. Differences handled here: FA4 spells an unbounded window side None (not -1), always
returns (out, lse) and decodes through flash_attn_varlen_func; FA3 names the block table
page_table, and returns (out, lse) in some releases and out alone in others (older ones take no
return_attn_probs); FA2 returns the LSE (and its dropout mask, encoded in the sign of S_dmask)
only with return_attn_probs=True.

Custom bias, FA4 only: a float bias goes in as aux_tensors[0] read by a CuTe score_mod
(score + bias[b, h, q, k], with an identity score_mod_bwd), a boolean mask as a uint8 aux tensor
read by a mask_mod, causal/window folded into it (FA4 drops both under a mask_mod). FA4's backward
returns no gradient for an aux tensor, so bias_grad cases are SKIPPED; softcap and a score_mod
cannot be combined in FA4, so neither can softcap and a float bias. The mods: gate/kernels/fa4_mods.py.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import inspect

import torch

from gate.attention.masks import allowed_mask
from gate.kernels.base import Capabilities, KernelAdapter, KernelCall, KernelOutput, append_new_tokens, entry_kind
from gate.kernels.capabilities import Feature, feature_set
from gate.kernels.entries import (
    DenseEntryPoint,
    Keywords,
    KVCacheEntryPoint,
    VarlenEntryPoint,
    call_options,
    split_result,
    unbounded_as_minus_one,
)

# The keywords each generation's calls pass (its library takes more): fixed, never read from the
# installed signature, so a build that lost one raises instead of running without it.
OPTIONS = ("softmax_scale", "causal", "window_size", "softcap")
FA2_TAKES = Keywords.named(*OPTIONS, "deterministic", "alibi_slopes", "dropout_p", "return_attn_probs")
KVCACHE_TAKES = Keywords.named(*OPTIONS, "return_softmax_lse")  # FA2's and FA3's; + alibi_slopes in FA2 ALiBi calls
FA3_TAKES = Keywords.named(*OPTIONS, "deterministic", "return_attn_probs")  # + q/k/v_descale in fp8 calls
FA4_TAKES = Keywords.named(*OPTIONS, "deterministic", "return_lse")  # + learnable_sink in sink calls
FA4_DECODE_TAKES = Keywords.named(*OPTIONS, "return_lse")


def _import(module: str):
    return importlib.import_module(module)


class _FlashBase(KernelAdapter):
    """flash_attn_func and flash_attn_varlen_func called through the shared entry points
    (gate/kernels/entries.py) with this generation's keywords, LSE flag and window spelling."""

    module = ""
    dist = ""
    takes = Keywords()
    lse_flag = ""

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

    def _window(self, window: tuple[int, int]) -> tuple:
        return unbounded_as_minus_one(window)

    def _entry(self, call: KernelCall, mod) -> DenseEntryPoint | VarlenEntryPoint:
        """flash_attn_func, or flash_attn_varlen_func for a varlen call."""
        if entry_kind(call) == "dense":
            return DenseEntryPoint(mod.flash_attn_func, self.takes, self.lse_flag, self._window)
        return VarlenEntryPoint(mod.flash_attn_varlen_func, self.takes, self.lse_flag, self._window)

    def _extra(self, call: KernelCall) -> dict:
        """Keywords beyond the entry point's options (FA4's bias mods)."""
        return {}

    def __call__(self, call: KernelCall) -> KernelOutput:
        return self._entry(call, _import(self.module))(call, **self._extra(call))


@functools.lru_cache(maxsize=1)
def fa2_head_dim_kernels() -> tuple[int, ...] | None:
    """The head-dim kernels of a trimmed FA2 build (scripts/build-flash-attn.sh records them in
    `flash_attn/attn_gate_build.py`), or None for a full build (or no FA2). Read once: a missing
    module is searched for again on every import attempt, and every case asks."""
    try:
        kernels = _import("flash_attn.attn_gate_build").HEAD_DIM_KERNELS
    except Exception:
        return None
    return tuple(int(k) for k in kernels)


# FA2's HEADDIM_SWITCH: the kernel a head dim runs (32, 64, 96, 128, 192, 256); the next one down + 1 to it.
FA2_HEAD_DIM_KERNELS = (32, 64, 96, 128, 192, 256)


def fa2_kernel_for(head_dim: int) -> int | None:
    return next((k for k in FA2_HEAD_DIM_KERNELS if head_dim <= k), None)


class FA2Adapter(_FlashBase):
    name, module, dist = "fa2", "flash_attn", "flash-attn"
    description = "flash-attn 2 (flash_attn.flash_attn_func)"
    takes, lse_flag = FA2_TAKES, "return_attn_probs"

    def unsupported_reason(self, case, device: str) -> str | None:
        reason = super().unsupported_reason(case, device)
        built = fa2_head_dim_kernels() if reason is None else None
        if built is not None and fa2_kernel_for(max(case.head_dim, case.head_dim_v)) not in built:
            return (
                f"head dim {max(case.head_dim, case.head_dim_v)}: this FA2 build compiles only the head-dim kernels "
                f"{', '.join(map(str, built))} (trimmed by scripts/build-flash-attn.sh; flash_attn/attn_gate_build.py)"
            )
        return reason

    def capabilities(self) -> Capabilities:
        # flash_attn_with_kvcache: paged KV needs page_block_size % 256 == 0 (its docstring)
        return Capabilities(
            dtypes=("fp16", "bf16"),
            max_head_dim=256,
            page_size_multiple=256,
            # knobs: flash_attn_with_kvcache takes num_splits (no pack_gqa, NHD caches only)
            features=feature_set(
                window=True,
                softcap=True,
                alibi=True,
                dropout=True,
                varlen=True,
                kvcache=True,
                paged=True,
                num_splits=True,
            ),
            dropout_keep_levels=256,
            deterministic_mode=True,
            returns_lse=True,
        )

    def __call__(self, call: KernelCall) -> KernelOutput:
        mod = _import(self.module)
        if entry_kind(call) == "kvcache":  # flash_attn_with_kvcache appends the new k/v in place
            return KVCacheEntryPoint(mod.flash_attn_with_kvcache, KVCACHE_TAKES)(call)
        # FA2 draws dropout from torch's CUDA generator: seed it from the call (forked, so the
        # caller's RNG is untouched) so the same seed gives the same mask; the backward replays
        # the forward's saved Philox state.
        devices = [call.q.device.index or 0] if call.q.is_cuda else []
        with torch.random.fork_rng(devices=devices, enabled=bool(call.opts.dropout_p)):
            if call.opts.dropout_p:
                torch.manual_seed(call.seed)
            out, lse, s_dmask = self._entry(call, mod).result(call)  # return_attn_probs: S_dmask third
        keep = None
        if call.opts.dropout_p:
            # FA2 encodes a dropped element as a negative entry of S_dmask (padded to 128/256);
            # varlen: one (batch slot, H, max_q, max_k) block per sequence, top-left filled.
            if call.cu_seqlens is None:
                nq, nk = call.q.shape[1], call.k.shape[1]
                keep = s_dmask[:, :, :nq, :nk] >= 0
            else:
                keys = call.seqlens_k or call.seqlens
                keep = [
                    None if not n else s_dmask[i : i + 1, :, :n, : keys[i]] >= 0 for i, n in enumerate(call.seqlens)
                ]
        return KernelOutput(out=out, lse=lse.detach().float(), dropout_keep=keep)


def fa3_build_flags() -> dict[str, bool]:
    """FA3's build switches, as its setup.py writes them into `flash_attn_config.CONFIG["build_flags"]`
    beside the extension, with one spelling (it writes both FLASHATTENTION_ and FLASH_ATTENTION_
    prefixes); {} where there is no such module (a build that predates it, or no FA3)."""
    try:
        flags = _import("flash_attn_config").CONFIG["build_flags"]
    except Exception:
        return {}
    if not isinstance(flags, dict):
        return {}
    return {k.replace("FLASH_ATTENTION_", "FLASHATTENTION_"): bool(v) for k, v in flags.items()}


# FA3's hopper/flash_api.cpp refuses every other pair with a TORCH_CHECK (a raise, not a skip):
# declared, so 128/96 is a SKIP with FA3's own words while 144/128 and 160/128 run.
FA3_DV_REASON = (
    "head_dim_v != head_dim: FA3 takes Q/K head dim in (128, 192] with V head dim in (96, 128], "
    "or Q/K <= 64 with V <= 512 (hopper/flash_api.cpp)"
)


def fa3_serves_dv(d: int, dv: int) -> bool:
    """Whether FA3 runs Q/K head dim d with V head dim dv != d (its flash_api.cpp rule)."""
    return (128 < d <= 192 and 96 < dv <= 128) or (d <= 64 and dv <= 512)


class FA3Adapter(_FlashBase):
    name, module, dist = "fa3", "flash_attn_interface", "flash-attn-3"
    description = "flash-attn 3, Hopper (flash_attn_interface.flash_attn_func)"
    takes, lse_flag = FA3_TAKES, "return_attn_probs"

    def capabilities(self) -> Capabilities:
        """What this FA3 build runs. A build made with hopper/setup.py's FLASH_ATTENTION_DISABLE_*
        switches says which in the `flash_attn_config.CONFIG` it generates beside the extension; a
        trimmed build (e.g. no softcap, head dims 64/128 only) then SKIPS
        what it lacks with that reason instead of raising in every such case."""
        off = fa3_build_flags()
        dims = [d for d in (64, 96, 128, 192, 256) if not off.get(f"FLASHATTENTION_DISABLE_HDIM{d}")]
        trimmed = sorted(
            k.removeprefix("FLASHATTENTION_DISABLE_").lower()
            for k, v in off.items()
            if v and k.startswith("FLASHATTENTION_DISABLE_")
        )
        # fp8: e4m3 only (FA3's flash_api.cpp refuses e5m2), forward only (Case.forward_only)
        dtypes = (("bf16",) if off.get("FLASHATTENTION_DISABLE_FP16") else ("fp16", "bf16")) + (
            () if off.get("FLASHATTENTION_DISABLE_FP8") else ("e4m3",)
        )
        return Capabilities(
            dtypes=dtypes,
            max_head_dim=max(dims, default=256),
            head_dim_multiple=8,
            features=feature_set(
                head_dim_v_differs=not (
                    off.get("FLASHATTENTION_DISABLE_HDIMDIFF64") and off.get("FLASHATTENTION_DISABLE_HDIMDIFF192")
                ),
                window=not off.get("FLASHATTENTION_DISABLE_LOCAL"),
                softcap=not off.get("FLASHATTENTION_DISABLE_SOFTCAP"),
                varlen=not off.get("FLASHATTENTION_DISABLE_VARLEN"),
                kvcache=True,
                paged=not off.get("FLASHATTENTION_DISABLE_PAGEDKV"),
                # knobs of flash_attn_with_kvcache, unless the build left their kernels out
                num_splits=not off.get("FLASHATTENTION_DISABLE_SPLIT"),
                pack_gqa=not off.get("FLASHATTENTION_DISABLE_PACKGQA"),
            ),
            deterministic_mode=True,
            returns_lse=True,
            backward=not off.get("FLASHATTENTION_DISABLE_BACKWARD"),
            notes=(f"FA3 build without: {', '.join(trimmed)} (its flash_attn_config)",) if trimmed else (),
        )

    def unsupported_reason(self, case, device: str) -> str | None:
        reason = super().unsupported_reason(case, device)
        if reason is None and case.head_dim != case.head_dim_v and not fa3_serves_dv(case.head_dim, case.head_dim_v):
            return FA3_DV_REASON
        if reason is None and case.entry.cache_new and fa3_build_flags().get("FLASHATTENTION_DISABLE_APPENDKV"):
            return "this FA3 build has no append-KV (built with FLASH_ATTENTION_DISABLE_APPENDKV)"
        return reason

    def __call__(self, call: KernelCall) -> KernelOutput:
        mod = _import(self.module)
        if entry_kind(call) == "kvcache":  # FA3 names the block table page_table
            return KVCacheEntryPoint(mod.flash_attn_with_kvcache, KVCACHE_TAKES, paged="page_table")(call)
        entry = self._entry(call, mod)
        try:
            return entry(call)
        except TypeError as exc:
            # releases that return out alone honour return_attn_probs; others take no such keyword
            if "return_attn_probs" not in str(exc):
                raise
            return dataclasses.replace(entry, takes=entry.takes.without("return_attn_probs"))(call)


class FA4Adapter(_FlashBase):
    name, module, dist = "fa4", "flash_attn.cute", "flash-attn-4"
    description = "flash-attn 4, CuTe DSL (flash_attn.cute.flash_attn_func)"
    takes, lse_flag = FA4_TAKES, "return_lse"

    def __init__(self):
        self._masks: dict = {}  # this case's folded boolean masks (see fa4_mask_aux)

    def prepare(self, case) -> None:
        self._masks.clear()  # a new case: a new mask and new options

    def _takes(self, fn_name: str, keyword: str) -> bool:
        """Whether this FA4 build's fn_name takes `keyword` (False where it does not import)."""

        try:
            return keyword in inspect.signature(getattr(_import(self.module), fn_name)).parameters
        except Exception:
            return False

    def _sink_grad(self) -> bool:
        """Whether this build's backward computes dsink (earlier builds' backward had no sink)."""
        try:
            bwd = importlib.import_module(f"{self.module}.interface")._flash_attn_bwd
            return "learnable_sink" in inspect.signature(bwd).parameters
        except Exception:
            return False

    def capabilities(self) -> Capabilities:
        # decode through flash_attn_varlen_func(page_table=, seqused_k=) and learnable
        # sinks, each only where this build's signature has it.
        paged = self._takes("flash_attn_varlen_func", "page_table")
        no_bias = self._bias_reason()
        return Capabilities(
            dtypes=("fp16", "bf16"),
            max_head_dim=256,
            head_dim_multiple=8,
            # float biases through score_mod, boolean masks through mask_mod
            features=feature_set(
                head_dim_v_differs=True,
                window=True,
                softcap=True,
                varlen=True,
                kvcache=self._takes("flash_attn_varlen_func", "seqused_k"),
                paged=paged,
                sinks=self._takes("flash_attn_func", "learnable_sink"),
                bias=True,
                bool_mask=True,
                # decode knobs: keywords of the flash_attn_varlen_func the decode calls, where it has them
                num_splits=self._takes("flash_attn_varlen_func", "num_splits"),
                pack_gqa=self._takes("flash_attn_varlen_func", "pack_gqa"),
            ),
            reasons={
                Feature.BIAS_GRAD: BIAS_GRAD_REASON,
                **({Feature.BIAS: no_bias, Feature.BOOL_MASK: no_bias} if no_bias else {}),
            },
            deterministic_mode=True,
            returns_lse=True,
            # a backward that takes the sink returns its gradient (4.0.0b36's source, SM90 and SM100)
            sink_grad=self._sink_grad(),
            notes=(
                "decode: flash_attn_varlen_func with seqused_k (and page_table); the new k/v are "
                "written into the cache by the adapter (FA4 has no append)",
                "custom bias: a CuTe score_mod reading the bias from aux_tensors; boolean masks: a "
                "mask_mod, with causal/window folded into the mask (gate/kernels/fa4_mods.py)",
            ),
        )

    def unsupported_reason(self, case, device: str) -> str | None:
        reason = super().unsupported_reason(case, device)
        if reason is None and case.has_float_bias and case.softcap:
            return SOFTCAP_BIAS_REASON
        if reason is None and case.is_gqa and case.head_dim != case.head_dim_v and case.entry.kind != "kvcache":
            return GQA_DV_REASON
        if reason is None and case.knobs.num_splits >= 2 and device == "cuda" and torch.cuda.is_available():
            major = torch.cuda.get_device_capability()[0]
            if major not in SPLIT_KV_ARCHS:
                return SPLIT_KV_REASON.format(major=major)
        return reason

    def _bias_reason(self) -> str:
        """'' when this FA4's flash_attn_func takes the mods the bias path hands it;
        else why every bias case is skipped, read from its signature (never guessed)."""
        try:
            params = set(inspect.signature(_import(self.module).flash_attn_func).parameters)
        except Exception as exc:  # not installed, or a signature we cannot read
            return f"FA4's flash_attn_func could not be inspected for score_mod/mask_mod ({type(exc).__name__})"
        missing = [p for p in BIAS_KEYWORDS if p not in params]
        if missing:
            return f"this flash-attn-4's flash_attn_func takes no {'/'.join(missing)}: no custom bias or mask"
        return ""

    def _window(self, window: tuple[int, int]) -> tuple:
        return tuple(None if w < 0 else w for w in window)

    def _extra(self, call: KernelCall) -> dict:
        return {} if call.opts.bias is None else self._bias_kwargs(call)

    def _bias_kwargs(self, call: KernelCall) -> dict:
        """the mod and aux tensor for the call's bias. A boolean mask goes through
        mask_mod, under which FA4 drops causal and window (interface._resolve_causal_local_window):
        they are folded into the mask, and causal/window are passed as off to say so."""
        from gate.kernels import fa4_mods  # needs cutlass: only here, for a bias case

        bias = call.opts.bias
        one_batch, one_head = bias.shape[0] == 1, bias.shape[1] == 1
        if bias.dtype != torch.bool:
            return dict(
                score_mod=fa4_mods.bias_score_mod(one_batch, one_head),
                score_mod_bwd=fa4_mods.bias_score_mod_bwd,
                aux_tensors=[fa4_bias_aux(bias)],
            )
        o = call.opts
        key = (bias.data_ptr(), bias._version, tuple(bias.shape), str(bias.device), o.causal, tuple(o.window))
        # Built once per case, not in every timed call. A boolean pattern does not depend on the seed
        # (gate.attention.bias), so a later seed's mask at the same address is the same mask.
        if key not in self._masks:
            self._masks[key] = fa4_mask_aux(bias, call.q.shape[1], call.k.shape[1], o.causal, tuple(o.window))
        return dict(
            mask_mod=fa4_mods.bool_mask_mod(one_batch, one_head),
            aux_tensors=[self._masks[key]],
            causal=False,
            window_size=(None, None),
        )

    def __call__(self, call: KernelCall) -> KernelOutput:
        if entry_kind(call) != "kvcache":
            return super().__call__(call)
        # decode: FA4 has no append and no with_kvcache: the adapter writes the new tokens, then
        # flash_attn_varlen_func attends over the first seqused_k keys of each cache row (or pages)
        c = call.cache
        append_new_tokens(c)
        lengths = c.cache_seqlens if c.k_new is None else c.cache_seqlens + c.k_new.shape[1]
        kwargs = call_options(call, FA4_DECODE_TAKES, "return_lse", self._window)
        kwargs["seqused_k"] = lengths.to(torch.int32)
        if c.block_table is not None:
            kwargs["page_table"] = c.block_table
        return split_result(_import(self.module).flash_attn_varlen_func(call.q, c.k_cache, c.v_cache, **kwargs))


# --- FA4's custom bias and masks, the torch side (the CuTe side: gate/kernels/fa4_mods.py)

BIAS_KEYWORDS = ("score_mod", "score_mod_bwd", "mask_mod", "aux_tensors")
BIAS_GRAD_REASON = (
    "no bias gradient: FA4's backward (FlashAttnFunc.backward, 4.0.0b36) returns None for "
    "aux_tensors, so the bias read by score_mod gets no dBias"
)
# FA4 4.0.0b36 asserts in its
# backward "GQA backward requires head_dim == head_dim_v" (bf16-b2-h8/2-s257x1000-d192/128-causal)
GQA_DV_REASON = "GQA with head_dim_v != head_dim: FA4's backward asserts head_dim == head_dim_v under GQA"
# FA4's forward asserts "SplitKV not supported on SM 8.0/9.0/12.0" (interface.py, 4.0.0b36): only
# its SM100/SM110 forward splits the keys
SPLIT_KV_ARCHS = (10, 11)
SPLIT_KV_REASON = (
    "no forced num_splits >= 2 on SM {major}.x: FA4's forward asserts 'SplitKV not supported' there "
    "(its split-KV forward is SM100's)"
)
SOFTCAP_BIAS_REASON = "no custom bias with softcap: FA4 takes softcap or a score_mod, not both (its interface asserts)"


def fa4_bias_aux(bias: torch.Tensor) -> torch.Tensor:
    """The float bias as score_mod reads it: the tensor itself, in its own dtype and broadcast
    shape (the mod indexes 0 on a dimension of size 1), detached (FA4 returns no gradient for it)
    and contiguous (one stride-1 dimension, as FA4's aux-tensor layout check wants)."""
    return bias.detach().contiguous()


def fa4_mask_aux(
    mask: torch.Tensor, seqlen_q: int, seqlen_k: int, causal: bool, window: tuple[int, int]
) -> torch.Tensor:
    """The boolean mask as mask_mod reads it: uint8 (1 = allowed), with causal and the window
    folded in (bottom-right aligned, gate.attention.masks, as FA4's own causal is), because FA4
    ignores both when a mask_mod is given. Without causal/window: a zero-copy uint8 view."""
    allowed = allowed_mask(torch.arange(seqlen_q, device=mask.device), seqlen_q, seqlen_k, causal, window)
    mask = mask.detach()
    if allowed is not None:
        mask = mask & allowed  # (b, h, Nq, Nk) & (Nq, Nk): the mask keeps its broadcast shape
    return mask.contiguous().view(torch.uint8)


class FA4RawWindowAdapter(FA4Adapter):
    """FA4 handed the window exactly as flash_attn_func callers spell it: -1 for an unbounded side.
    FA4's API spells that None and reads -1 differently (TransformerEngine #3528: causal + window
    (-1, 0) returned zeros), so both spellings must reach the kernel: `fa4` takes None, this one
    -1; the window cases of the suites run through both."""

    name = "fa4-raw-window"
    description = "flash-attn 4 with window_size passed raw (-1 = unbounded), as FA2/FA3 callers write it"

    def _window(self, window: tuple[int, int]) -> tuple:
        return unbounded_as_minus_one(window)
