"""PyTorch scaled_dot_product_attention, one adapter per backend (and torch's CPU attention).

SDPA takes (B, H, N, D); we transpose from flash_attn_func's (B, N, H, D). Conventions that
differ from flash-attn, and what we do about them:
  * `is_causal` is top-left aligned: for seqlen_q != seqlen_k we pass `causal_lower_right`
    (flash-attn's bottom-right), or fold it into the additive mask;
  * window and ALiBi exist only as an additive `attn_mask` (the custom-bias path), which the
    math, mem-efficient, cuDNN and CPU kernels take and the flash kernel does not;
  * GQA/MQA: K/V go in with their own head count and `enable_gqa=True` (torch >= 2.5), so each
    backend's own GQA path runs (cuDNN's and mem-efficient's included); the `-copyheads` kernels
    (`sdpa-flash-copyheads`...) repeat the K/V heads instead (autograd sums their gradients
    back), the path these adapters took before. The flash dropout path and the LSE ops are aten
    ops without `enable_gqa`: they get copied heads (the LSE op runs without grad, apart from
    the measured call);
  * no varlen API: each sequence runs separately (gate.kernels.base.per_sequence);
  * the LSE comes from the same backend's aten op, called once more without grad;
  * dropout (flash only): the aten op `_scaled_dot_product_flash_attention(...,
    return_debug_mask=True)` returns FA2's S_dmask, where a dropped probability is stored
    negated: keep = S_dmask >= 0 after trimming the tile padding. The RNG is seeded from the
    call's seed (forked, so the caller's RNG is untouched); the backward replays the forward's
    Philox seed/offset, which the op saves;
  * deterministic mode (cpu only): torch.use_deterministic_algorithms around forward and
    backward (`deterministic_scope`): SDPA reads it, not an argument. Mem-efficient claims none:
    under that flag torch only warns for it, and on an H200 its dQ differed in 3 of 10 runs for
    bf16-b4-h16/4-s2048-d128, so its spread is reported instead;
  * fully masked rows (seqlen_q > seqlen_k causal): every backend runs them. Where mem-efficient
    or cuDNN refuses the shape ("No available kernel") the row is a SKIP with that message; where
    it answers wrongly (nonzero rows under `causal_lower_right`, neighbouring rows too) the
    worked configuration's pyproject.toml declares them as known failures with the upstream link,
    so a fix shows as XPASS and a new breakage still fails;
  * custom bias: the case's bias goes in as `attn_mask` as it is (float in its own
    dtype, fp32 with bf16 inputs included; bool as bool), with causal/window/ALiBi folded into it
    (SDPA takes attn_mask or is_causal, not both). The bias gradient comes back from math
    (autograd) and mem-efficient (its backward returns grad_attn_bias); cuDNN's and the CPU
    kernel's backward ops return no attn_bias gradient, so bias_grad cases are SKIPPED there;
    flash takes no attn_mask at all.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from gate.attention.bias import as_additive
from gate.attention.masks import allowed_mask, dense_bias
from gate.kernels.base import (
    Capabilities,
    KernelAdapter,
    KernelCall,
    KernelOutput,
    NoKernel,
    entry_kind,
    flash_lse_to_reference,
    gathered_decode,
    per_sequence_seeded,
)
from gate.kernels.capabilities import Feature, feature_set

BACKENDS = {
    "math": ("MATH", "SDPA math (reference-style composite)"),
    "flash": ("FLASH_ATTENTION", "SDPA flash backend (FA2 kernel vendored in torch)"),
    "efficient": ("EFFICIENT_ATTENTION", "SDPA memory-efficient backend (xformers cutlass kernel)"),
    "cudnn": ("CUDNN_ATTENTION", "SDPA cuDNN backend"),
    "cpu": ("FLASH_ATTENTION", "torch's CPU attention (the fused CPU flash kernel)"),
}


class SdpaAdapter(KernelAdapter):
    def __init__(self, backend: str, copy_heads: bool = False):
        self.backend = backend
        self.copy_heads = copy_heads
        self.name = f"sdpa-{backend}" + ("-copyheads" if copy_heads else "")
        self.description = BACKENDS[backend][1] + (", GQA/MQA by copying K/V heads" if copy_heads else "")
        self._folds: dict = {}  # this case's window/ALiBi masks by shape and options; see _mask

    def prepare(self, case) -> None:
        self._folds.clear()  # a new case: new options, new masks

    def unavailable_reason(self) -> str | None:
        if self.backend != "cpu" and self.backend != "math" and not torch.cuda.is_available():
            return "needs a CUDA GPU"
        if self.backend == "cudnn" and torch.cuda.is_available() and not torch.backends.cudnn.is_available():
            return "cuDNN is not available in this torch build"
        return None

    def capabilities(self) -> Capabilities:
        takes_bias = self.backend in ("math", "efficient", "cudnn", "cpu")
        devices = {"cpu": ("cpu",), "math": ("cpu", "cuda")}.get(self.backend, ("cuda",))
        dtypes = ("fp16", "bf16", "fp32") if self.backend in ("math", "efficient", "cpu") else ("fp16", "bf16")
        return Capabilities(
            devices=devices,
            dtypes=dtypes,
            max_head_dim=256 if self.backend != "cudnn" else 128,
            features=feature_set(
                head_dim_v_differs=self.backend in ("math", "efficient"),
                window=takes_bias,
                alibi=takes_bias,
                varlen=True,
                gqa=True,
                dropout=self.backend == "flash",
                kvcache=True,
                paged=True,  # on a gathered dense cache (gate.kernels.base.gathered_decode)
                # custom bias through attn_mask; its gradient only where the backward op returns one
                bias=takes_bias,
                bool_mask=takes_bias,
                bias_grad=self.backend in ("math", "efficient"),
                varlen_bias=takes_bias,
            ),  # each sequence its block of the packed bias
            reasons=self._reasons(takes_bias),
            returns_lse=True,
            dropout_keep_levels=256 if self.backend == "flash" else 0,
            deterministic_mode=self.backend == "cpu",
            notes=(
                "GQA by repeating k/v heads"
                if self.copy_heads
                else "GQA/MQA through enable_gqa=True (K/V heads not copied)",
                "varlen by running each sequence alone",
                "decode: on each batch element's gathered cache (append and paging emulated by the adapter)",
            )
            + (("window/ALiBi through the additive attn_mask",) if takes_bias else ())
            + (
                ("dropout mask read from the flash op's debug mask (return_debug_mask=True)",)
                if self.backend == "flash"
                else ()
            )
            + (
                ("deterministic mode: torch.use_deterministic_algorithms(True) around forward and backward",)
                if self.backend in ("efficient", "cpu")
                else ()
            ),
        )

    def _reasons(self, takes_bias: bool) -> dict[Feature, str]:
        """Why this backend lacks what it lacks: calls it refuses, never answers measured wrong
        (those run, and a known_failures declaration names them)."""
        reasons: dict[Feature, str] = {}
        if not takes_bias:
            no_mask = "SDPA flash takes no attn_mask (custom bias or mask)"
            reasons.update({Feature.BIAS: no_mask, Feature.BOOL_MASK: no_mask})
        no_grad = {
            "cudnn": "no bias gradient: the cuDNN backward op returns none for attn_bias",
            "cpu": "no bias gradient: torch's CPU flash kernel refuses an attn_mask that requires grad "
            "(No available kernel) and its backward returns none",
        }.get(self.backend)
        if no_grad:
            reasons[Feature.BIAS_GRAD] = no_grad
        if self.backend == "efficient":
            reasons[Feature.BIAS_OTHER_DTYPE] = (
                "no fp32 bias with bf16/fp16 inputs: the mem-efficient kernel refuses it (measured on an H200, "
                "torch 2.11: RuntimeError 'invalid dtype for bias - should match query's dtype')"
            )
        return reasons

    def deterministic_scope(self):
        return _deterministic_algorithms()

    def _mask(self, call: KernelCall, nq: int, nk: int, dtype) -> tuple[object, bool]:
        """(attn_mask, is_causal) for SDPA's public API."""
        o = call.opts
        if o.bias is not None:
            return self._with_custom_bias(o.bias, call, nq, nk), False
        needs_bias = o.window != (-1, -1) or o.alibi_slopes is not None
        if not needs_bias:
            if not o.causal:
                return None, False
            if nq == nk:
                return None, True
            from torch.nn.attention.bias import causal_lower_right

            return causal_lower_right(nq, nk), False
        return self._fold(call, nq, nk, dtype, call.q.device), False

    def _fold(self, call: KernelCall, nq: int, nk: int, dtype, device, boolean: bool = False):
        """The case's causal/window/ALiBi as a (1, 1, Nq, Nk) additive mask (`boolean`: the allowed
        mask, None when everything is allowed). Built once per case and shape, not in every (timed)
        call: the options are the case's, and a dense Nq x Nk mask rebuilt per call is time charged to
        the kernel (or the anchor)."""
        o = call.opts
        slopes = None if o.alibi_slopes is None else tuple(o.alibi_slopes.shape)  # ALiBi slopes follow the head count
        key = (nq, nk, dtype, str(device), o.causal, o.window, slopes, boolean)
        if key not in self._folds:
            if boolean:
                self._folds[key] = allowed_mask(torch.arange(nq, device=device), nq, nk, o.causal, o.window)
            else:
                fold = dense_bias(1, nq, nk, o.causal, o.window, o.alibi_slopes, device, dtype)
                self._folds[key] = None if fold is None else fold.unsqueeze(0)  # the 4-D form every backend broadcasts
        return self._folds[key]

    def _with_custom_bias(self, bias: torch.Tensor, call: KernelCall, nq: int, nk: int) -> torch.Tensor:
        """the case's bias as SDPA's attn_mask, causal/window/ALiBi folded in (the fold
        cached per case, _fold; the combination per call, since the bias is an autograd input whose
        gradient flows through it, broadcast dims summed by autograd). The bias keeps its dtype (an
        fp32 mask with bf16 inputs is what the case tests)."""
        o = call.opts
        if bias.dtype == torch.bool and o.alibi_slopes is None:
            allowed = self._fold(call, nq, nk, torch.bool, bias.device, boolean=True)
            return bias if allowed is None else bias & allowed
        if bias.dtype == torch.bool:  # a boolean mask with ALiBi: additive in the input dtype
            bias = as_additive(bias, call.q.dtype)
        fold = self._fold(call, nq, nk, bias.dtype, bias.device)
        return bias if fold is None else bias + fold

    def _lse(self, q, k, v, call: KernelCall, is_causal: bool, mask) -> torch.Tensor | None:
        """LSE from the backend's aten op; only for cases without a mask object (None if not exposed)."""
        if mask is not None:
            return None
        scale = call.opts.softmax_scale
        ops = torch.ops.aten
        with torch.no_grad():
            try:
                if self.backend == "cpu":
                    lse = ops._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, is_causal, scale=scale)[1]
                elif self.backend == "flash":
                    lse = ops._scaled_dot_product_flash_attention(q, k, v, 0.0, is_causal, False, scale=scale)[1]
                elif self.backend == "efficient":
                    lse = ops._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, is_causal, scale=scale)[
                        1
                    ]
                elif self.backend == "cudnn":
                    lse = ops._scaled_dot_product_cudnn_attention(
                        q, k, v, None, True, 0.0, is_causal, False, scale=scale
                    )[1]
                else:
                    return None
            except (RuntimeError, TypeError, AttributeError):
                return None
        lse = lse.reshape(lse.shape[0], lse.shape[1], -1) if lse.dim() == 4 else lse
        return flash_lse_to_reference(lse.float(), q.shape[2])

    def _flash_dropout(self, qh, kh, vh, call: KernelCall, seed: int) -> KernelOutput:
        """Flash with dropout, its keep mask read back from the debug mask (see the module doc)."""
        o = call.opts
        nq, nk, d = qh.shape[2], kh.shape[2], qh.shape[-1]
        pad = (-d) % 8  # the op wants head_dim % 8 == 0; SDPA's front end pads the same way
        if pad:
            qh, kh, vh = (torch.nn.functional.pad(t, (0, pad)) for t in (qh, kh, vh))
        devices = (
            [qh.device.index if qh.device.index is not None else torch.cuda.current_device()] if qh.is_cuda else []
        )
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            res = torch.ops.aten._scaled_dot_product_flash_attention(
                qh, kh, vh, o.dropout_p, o.causal, True, scale=o.softmax_scale
            )
        out, lse, dmask = res[0][..., :d], res[1], res[-1]
        keep = dmask[:, :, :nq, :nk].detach() >= 0
        return KernelOutput(
            out=out.transpose(1, 2), lse=flash_lse_to_reference(lse.detach().float(), nq), dropout_keep=keep
        )

    def _dense(self, q, k, v, call: KernelCall, seed: int | None = None) -> KernelOutput:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        group = qh.shape[1] // kh.shape[1]

        def copied(t):  # K/V with one head per query head
            return t.repeat_interleave(group, dim=1) if group > 1 else t

        if self.copy_heads or call.opts.dropout_p:  # the dropout path is an aten op without enable_gqa
            kh, vh = copied(kh), copied(vh)
        if call.opts.dropout_p:
            if self.backend != "flash":
                raise NoKernel(f"SDPA {self.backend}: dropout mask not observable")
            return self._flash_dropout(qh, kh, vh, call, call.seed if seed is None else seed)
        mask, is_causal = self._mask(call, qh.shape[2], kh.shape[2], q.dtype)
        backend = getattr(SDPBackend, BACKENDS[self.backend][0])
        gqa = {"enable_gqa": True} if kh.shape[1] != qh.shape[1] else {}
        try:
            with sdpa_kernel([backend]):
                out = F.scaled_dot_product_attention(
                    qh, kh, vh, attn_mask=mask, is_causal=is_causal, scale=call.opts.softmax_scale, **gqa
                )
                lse = None
                if call.want_lse:
                    with torch.no_grad():
                        lse = self._lse(
                            qh.detach(),
                            copied(kh.detach()) if gqa else kh.detach(),
                            copied(vh.detach()) if gqa else vh.detach(),
                            call,
                            is_causal,
                            mask,
                        )
        except RuntimeError as exc:
            if "No available kernel" in str(exc):
                raise NoKernel(f"SDPA {self.backend} refused this case: {str(exc).splitlines()[0]}") from None
            raise
        return KernelOutput(out=out.transpose(1, 2), lse=lse)

    def __call__(self, call: KernelCall) -> KernelOutput:
        kind = entry_kind(call)
        if kind == "kvcache":
            return gathered_decode(call, lambda q, k, v: self._dense(q, k, v, call))
        if kind == "varlen":  # under dropout each sequence its own seed, as tiled does
            return per_sequence_seeded(call, self._dense)
        return self._dense(call.q, call.k, call.v, call)


@contextlib.contextmanager
def _deterministic_algorithms():
    """torch.use_deterministic_algorithms(True) for the duration, then the caller's setting back."""
    was, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)
