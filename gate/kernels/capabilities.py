"""What a kernel can run, as data: numeric limits, the features it has (`Feature`), why it lacks
the ones it names (a mapping from feature to reason, shown to users as written), and traits that
change how a case is judged. Torch-free: deciding whether a case runs is pure logic."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from gate.core.cases import Case


class Feature(str, enum.Enum):
    """What a case may need of a kernel beyond a plain forward and backward. A kernel that lacks
    one skips the cases that need it with the feature's reason (its own, else `DEFAULT_REASONS`)."""

    KVCACHE = "kvcache"  # a decode entry point (flash_attn_with_kvcache convention, or emulated on a gathered cache)
    PAGED = "paged"  # takes a paged cache with a block table
    SINKS = "sinks"  # learnable per-head sink logits
    HEAD_DIM_V_DIFFERS = "head_dim_v_differs"
    SEQLEN_Q_NE_K = "seqlen_q_ne_k"
    CAUSAL = "causal"
    WINDOW = "window"
    SOFTCAP = "softcap"
    ALIBI = "alibi"
    DROPOUT = "dropout"
    VARLEN = "varlen"
    GQA = "gqa"
    FULLY_MASKED_ROWS = "fully_masked_rows"  # returns 0 on rows with no allowed key (not NaN)
    BIAS = "bias"  # a custom float bias (attn_bias), added to the scaled scores
    BOOL_MASK = "bool_mask"  # a boolean custom mask
    BIAS_GRAD = "bias_grad"  # the bias's gradient
    BIAS_OTHER_DTYPE = "bias_other_dtype"  # a bias in another dtype than q (fp32 with bf16/fp16)
    BIAS_GRAD_OTHER_DTYPE = "bias_grad_other_dtype"  # the gradient of such a bias
    VARLEN_BIAS = "varlen_bias"  # a custom bias or mask on a varlen call (the packed convention)


# The reason a SKIP row shows when a kernel lacks a feature and gives no reason of its own.
DEFAULT_REASONS: dict[Feature, str] = {
    Feature.KVCACHE: "no KV-cache (decode) entry point",
    Feature.PAGED: "no paged KV cache (block table)",
    Feature.SINKS: "no learnable sinks",
    Feature.HEAD_DIM_V_DIFFERS: "head_dim_v != head_dim",
    Feature.SEQLEN_Q_NE_K: "seqlen_q != seqlen_k",
    Feature.CAUSAL: "no causal mask",
    Feature.WINDOW: "no sliding window",
    Feature.SOFTCAP: "no softcap",
    Feature.ALIBI: "no ALiBi",
    Feature.DROPOUT: "no dropout (or its mask cannot be observed)",
    Feature.VARLEN: "no varlen",
    Feature.GQA: "no GQA/MQA",
    Feature.FULLY_MASKED_ROWS: "fully masked rows: not 0 where no key is allowed",
    Feature.BIAS: "no custom bias (attn_bias)",
    Feature.BOOL_MASK: "no boolean custom mask",
    Feature.BIAS_GRAD: "no bias gradient",
    Feature.BIAS_OTHER_DTYPE: "no bias in another dtype than the inputs",
    Feature.BIAS_GRAD_OTHER_DTYPE: "no gradient of a bias in another dtype than the inputs",
    Feature.VARLEN_BIAS: "no custom bias on a varlen call",
}
# What a kernel in the flash_attn_func convention is taken to support unless it says otherwise.
ASSUMED = frozenset({Feature.CAUSAL, Feature.SEQLEN_Q_NE_K, Feature.GQA, Feature.FULLY_MASKED_ROWS,
                     Feature.BIAS_OTHER_DTYPE, Feature.BIAS_GRAD_OTHER_DTYPE})


def feature_set(**flags: bool) -> frozenset[Feature]:
    """ASSUMED with each named feature turned on or off: `feature_set(window=True, causal=False)`.
    A name that is no Feature raises ValueError."""
    on = {Feature(name) for name, value in flags.items() if value}
    off = {Feature(name) for name, value in flags.items() if not value}
    return frozenset((ASSUMED | on) - off)


@dataclass(frozen=True)
class Capabilities:
    """What a kernel supports: numeric limits, the features it has, why it lacks the ones it
    names (`reasons`: data, shown to users as written), and traits that change how a case is
    judged rather than whether it runs."""

    # --- limits
    devices: tuple[str, ...] = ("cuda",)
    dtypes: tuple[str, ...] = ("fp16", "bf16")
    max_head_dim: int = 256
    head_dim_multiple: int = 1
    page_size_multiple: int = 1  # page sizes it accepts (FA2: 256)
    # --- features: supported where in `features` and not in `reasons`
    features: frozenset[Feature] = ASSUMED
    # A feature's reason (non-empty) takes it away, in the kernel's words: e.g. NaN rows under an
    # -inf additive mask (FULLY_MASKED_ROWS), a bias form the kernel refuses.
    reasons: Mapping[Feature, str] = field(default_factory=dict)
    # --- traits
    deterministic_mode: bool = False
    returns_lse: bool = False
    # FA2-family kernels draw dropout against an 8-bit threshold: the keep probability they
    # realise is (floor((1 - p) * 255) + 1) / 256, not 1 - p (measured on the H200 through SDPA
    # flash: p=0.1 keeps 0.8984 = 230/256 of 16.7M pairs, p=0.3 keeps 0.6993 = 179/256).
    # 256 says so; 0 means the kernel draws with the exact probability.
    dropout_keep_levels: int = 0
    sink_grad: bool = True  # with sinks: its backward returns dsink (False: dsink not judged, and the row says so)
    backward: bool = True  # False: a forward-only (inference) kernel, judged on out and LSE
    # Rows emptied by a custom bias/mask are fine even where FULLY_MASKED_ROWS is refused
    # (SDPA efficient/cuDNN: 0 under an additive -inf mask, nonzero only via causal_lower_right).
    fully_masked_rows_ok_with_bias: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        unknown = [f for f in (*self.features, *self.reasons) if not isinstance(f, Feature)]
        if unknown:
            raise TypeError(f"{unknown[0]!r} is not a Feature")
        if any(not isinstance(r, str) or not r for r in self.reasons.values()):
            raise TypeError("a feature's reason is a non-empty string")

    def supports(self, feature: Feature) -> bool:
        return feature in self.features and feature not in self.reasons

    def reason(self, feature: Feature) -> str:
        """Why the kernel lacks `feature`: its own words, else the default."""
        return self.reasons.get(feature) or DEFAULT_REASONS[feature]

    def _needs(self, feature: Feature, needed: bool) -> tuple[bool, str]:
        return not needed or self.supports(feature), self.reason(feature)

    def unsupported_reason(self, case: Case, device: str) -> str | None:
        """The first reason this kernel cannot run `case` on `device`, or None."""
        decode = case.entry.kind == "kvcache"
        page = case.entry.page_size
        checks = [
            (device in self.devices, f"runs on {'/'.join(self.devices)}, not {device}"),
            self._needs(Feature.KVCACHE, decode),
            self._needs(Feature.PAGED, bool(page)),
            (not page or page % self.page_size_multiple == 0, f"page size {page} not a multiple of {self.page_size_multiple}"),
            self._needs(Feature.SINKS, case.entry.sinks),
            (case.dtype in self.dtypes, f"no {case.dtype}{': no fp8 path' if case.is_fp8 else ''} "
                                        f"(supports {', '.join(self.dtypes)})"),
            (max(case.head_dim, case.head_dim_v) <= self.max_head_dim, f"head_dim > {self.max_head_dim}"),
            (case.head_dim % self.head_dim_multiple == 0 and case.head_dim_v % self.head_dim_multiple == 0,
             f"head_dim not a multiple of {self.head_dim_multiple}"),
            self._needs(Feature.HEAD_DIM_V_DIFFERS, case.head_dim != case.head_dim_v),
            self._needs(Feature.SEQLEN_Q_NE_K, case.seqlen_q != case.seqlen_k and case.entry.varlen is None and not decode),
            self._needs(Feature.CAUSAL, case.causal),
            self._needs(Feature.WINDOW, case.has_window),
            self._needs(Feature.SOFTCAP, bool(case.softcap)),
            self._needs(Feature.ALIBI, case.alibi),
            self._needs(Feature.DROPOUT, bool(case.dropout_p)),
            self._needs(Feature.VARLEN, case.entry.varlen is not None),
            self._needs(Feature.GQA, case.is_gqa),
            self._needs(Feature.FULLY_MASKED_ROWS,
                        case.has_fully_masked_rows and not (case.has_bias and self.fully_masked_rows_ok_with_bias)),
            # the bias's kind first: a kernel that refuses every bias says so on both kinds
            self._needs(Feature.BIAS, case.has_float_bias),
            self._needs(Feature.BOOL_MASK, case.has_bool_bias),
            self._needs(Feature.BIAS_GRAD, case.bias.grad),
            self._needs(Feature.BIAS_OTHER_DTYPE, case.bias.dtype is not None),
            self._needs(Feature.BIAS_GRAD_OTHER_DTYPE, case.bias.grad and case.bias.dtype is not None),
            self._needs(Feature.VARLEN_BIAS, case.has_bias and case.entry.varlen is not None),
        ]
        return next((reason for ok, reason in checks if not ok), None)
