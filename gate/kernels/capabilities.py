"""What a kernel can run, as data: numeric limits, the features it has (`Feature`), why it lacks
the ones it names (a mapping from feature to reason, shown to users as written), and traits that
change how a case is judged. Torch-free: deciding whether a case runs is pure logic.

The vocabulary (Feature, the keys of a declared envelope) is gate/core/envelope.py's: a user's
`[tool.attn-gate.kernels.NAME.supports]` becomes a Capabilities here (`from_declaration`) and
narrows what the adapter infers (`narrowed_by`), so both speak one language."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gate.core.cases import BIAS_KINDS, DTYPES, LAYOUTS, Case
from gate.core.envelope import (
    DEFAULT_REASONS,
    DEVICES,
    KNOB_FEATURES,
    SUPPORTS_KEYS,
    Feature,
    describe_dims,
    dims_allow,
)

__all__ = ["ASSUMED", "DEFAULT_REASONS", "Capabilities", "Feature", "feature_set"]


def declared_refusal(reason: str, table: str, key: str) -> str:
    """A declared envelope's SKIP reason: `declared: no GQA/MQA (TABLE gqa = false)`."""
    return f"declared: {reason} ({table} {key})"


def declared_key(reason: str) -> str | None:
    """The envelope key a `declared_refusal` names (`gqa = false`), None for any other reason:
    a report counts SKIPs by it."""
    m = _DECLARED.match(reason)
    return m.group(1) if m else None


_DECLARED = re.compile(r"declared: .* \(\S+ ([^()]+)\)$")


# What a kernel in the flash_attn_func convention is taken to support unless it says otherwise.
ASSUMED = frozenset(
    {
        Feature.CAUSAL,
        Feature.NON_CAUSAL,
        Feature.SEQLEN_Q_NE_K,
        Feature.CAUSAL_SEQLEN_Q_NE_K,
        Feature.GQA,
        Feature.FULLY_MASKED_ROWS,
        Feature.BIAS_OTHER_DTYPE,
        Feature.BIAS_GRAD_OTHER_DTYPE,
    }
)


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
    # the envelope's finer limits (gate/core/envelope.py SUPPORTS_KEYS): None / 0 = no limit
    head_dims: Any = None  # head dims of q/k (and of v unless head_dims_v): a list, or {min, max, multiple}
    head_dims_v: Any = None
    max_seqlen: int = 0
    seqlen_multiple: int = 1
    max_batch_heads: int = 0  # 0: no limit
    layouts: tuple[str, ...] = tuple(LAYOUTS)
    bias_kinds: tuple[str, ...] = BIAS_KINDS
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
    # Rows emptied by a custom bias/mask are fine even where FULLY_MASKED_ROWS is refused (a kernel
    # that gives 0 under an additive -inf mask and refuses only its own causal alignment's empty rows).
    fully_masked_rows_ok_with_bias: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)
    # --- a declared envelope: `declared_in` names its table (this Capabilities IS a declaration:
    # each refusal reads "declared: ... (TABLE key)"); `declaration` is the one that narrowed an
    # adapter's own, asked first so a case outside it is refused in the declaration's words.
    declared_in: str = ""
    declared: Mapping[str, Any] = field(default_factory=dict)
    declaration: "Capabilities | None" = None

    def __post_init__(self) -> None:
        unknown = [f for f in (*self.features, *self.reasons) if not isinstance(f, Feature)]
        if unknown:
            raise TypeError(f"{unknown[0]!r} is not a Feature")
        if any(not isinstance(r, str) or not r for r in self.reasons.values()):
            raise TypeError("a feature's reason is a non-empty string")

    @classmethod
    def from_declaration(cls, supports: Mapping[str, Any], where: str) -> "Capabilities":
        """A declared envelope (validated by gate.core.envelope.check_supports) as Capabilities:
        everything allowed but what it limits or turns off."""
        limits = {k: v for k, v in supports.items() if SUPPORTS_KEYS[k].kind != "bool"}
        for key in ("devices", "dtypes", "layouts", "bias_kinds"):
            if key in limits:
                limits[key] = tuple(limits[key])
        off = {Feature(k) for k, v in supports.items() if SUPPORTS_KEYS[k].kind == "bool" and not v}
        base = dict(devices=DEVICES, dtypes=DTYPES, max_head_dim=1 << 30)
        return cls(
            **{**base, **limits},
            features=frozenset(Feature) - off,
            reasons={f: DEFAULT_REASONS[f] for f in off},
            declared_in=where,
            declared=dict(supports),
        )

    def narrowed_by(self, declaration: "Capabilities", what_infers: str = "the function's signature") -> "Capabilities":
        """These capabilities within `declaration`: a case must be inside both. A feature the
        declaration claims but this adapter lacks stays off (the adapter wins: a declaration
        never makes the gate pass a keyword the function does not take); its reason says so."""
        d = declaration
        claimed = {Feature(k) for k, v in d.declared.items() if v is True and k in Feature._value2member_map_}
        reasons = dict(self.reasons)
        for f in claimed:
            if not self.supports(f):
                reasons[f] = (
                    f"{self.reason(f)}: declared {f.value} = true in {d.declared_in}, but {what_infers} "
                    f"does not allow it"
                )
        return dataclasses.replace(
            self,
            devices=tuple(x for x in self.devices if x in d.devices),
            dtypes=tuple(x for x in self.dtypes if x in d.dtypes),
            max_head_dim=min(self.max_head_dim, d.max_head_dim),
            page_size_multiple=max(self.page_size_multiple, d.page_size_multiple),
            head_dims=d.head_dims if d.head_dims is not None else self.head_dims,
            head_dims_v=d.head_dims_v if d.head_dims_v is not None else self.head_dims_v,
            max_seqlen=min(x for x in (self.max_seqlen, d.max_seqlen) if x) if (self.max_seqlen or d.max_seqlen) else 0,
            seqlen_multiple=max(self.seqlen_multiple, d.seqlen_multiple),
            max_batch_heads=min(x for x in (self.max_batch_heads, d.max_batch_heads) if x)
            if (self.max_batch_heads or d.max_batch_heads)
            else 0,
            layouts=tuple(x for x in self.layouts if x in d.layouts),
            bias_kinds=tuple(x for x in self.bias_kinds if x in d.bias_kinds),
            features=self.features & d.features,
            reasons=reasons,
            declaration=d,
        )

    def supports(self, feature: Feature) -> bool:
        return feature in self.features and feature not in self.reasons

    def reason(self, feature: Feature) -> str:
        """Why the kernel lacks `feature`: its own words, else the default."""
        return self.reasons.get(feature) or DEFAULT_REASONS[feature]

    def _needs(self, feature: Feature, needed: bool) -> tuple[bool, str, str]:
        return not needed or self.supports(feature), self.reason(feature), f"{feature.value} = false"

    def unsupported_reason(self, case: Case, device: str) -> str | None:
        """The first reason this kernel cannot run `case` on `device`, or None. A declaration
        that narrowed these capabilities is asked first, so its refusal names its key."""
        if self.declaration is not None:
            why = self.declaration.unsupported_reason(case, device)
            if why:
                return why
        for ok, reason, key in self._checks(case, device):
            if not ok:
                return declared_refusal(reason, self.declared_in, key) if self.declared_in else reason
        return None

    def _checks(self, case: Case, device: str):
        """(ok, reason, the envelope key that decides it) for each thing `case` needs, in order."""
        page = case.entry.page_size
        hd, hdv = case.head_dim, case.head_dim_v
        dims_v = self.head_dims_v if self.head_dims_v is not None else self.head_dims
        lengths = case_lengths(case)
        needs = feature_needs(case)
        need = lambda feature: self._needs(feature, needs[feature])  # noqa: E731
        return [
            (device in self.devices, f"runs on {'/'.join(self.devices)}, not {device}", "devices"),
            need(Feature.KVCACHE),
            # a knob the case forces and the kernel does not expose: said before anything else it lacks
            *(need(feature) for feature in KNOB_FEATURES.values()),
            need(Feature.PAGED),
            (
                not page or page % self.page_size_multiple == 0,
                f"page size {page} not a multiple of {self.page_size_multiple}",
                "page_size_multiple",
            ),
            need(Feature.SINKS),
            (
                case.dtype in self.dtypes,
                f"no {case.dtype}{': no fp8 path' if case.is_fp8 else ''} (supports {', '.join(self.dtypes)})",
                "dtypes",
            ),
            (max(hd, hdv) <= self.max_head_dim, f"head_dim > {self.max_head_dim}", "head_dims"),
            (
                hd % self.head_dim_multiple == 0 and hdv % self.head_dim_multiple == 0,
                f"head_dim not a multiple of {self.head_dim_multiple}",
                "head_dims",
            ),
            (
                self.head_dims is None or dims_allow(self.head_dims, hd),
                f"head_dim {hd} (supports {describe_dims(self.head_dims or [])})",
                "head_dims",
            ),
            (
                dims_v is None or dims_allow(dims_v, hdv),
                f"head_dim_v {hdv} (supports {describe_dims(dims_v or [])})",
                "head_dims_v" if self.head_dims_v is not None else "head_dims",
            ),
            need(Feature.HEAD_DIM_V_DIFFERS),
            need(Feature.SEQLEN_Q_NE_K),
            (
                not self.max_seqlen or max(lengths) <= self.max_seqlen,
                f"seqlen {max(lengths)} > {self.max_seqlen}",
                "max_seqlen",
            ),
            (
                not self.max_batch_heads or case.batch * case.heads_q <= self.max_batch_heads,
                f"batch x heads {case.batch * case.heads_q:,} > {self.max_batch_heads:,}",
                "max_batch_heads",
            ),
            (
                all(n % self.seqlen_multiple == 0 for n in lengths),
                f"seqlen {next((n for n in lengths if n % self.seqlen_multiple), 0)} not a multiple of {self.seqlen_multiple}",
                "seqlen_multiple",
            ),
            (case.layout in self.layouts, f"layout {case.layout} (supports {', '.join(self.layouts)})", "layouts"),
            (
                case.bias.kind in self.bias_kinds,
                f"bias {case.bias.kind} (supports {', '.join(self.bias_kinds)})",
                "bias_kinds",
            ),
            need(Feature.CAUSAL),
            need(Feature.NON_CAUSAL),
            need(Feature.WINDOW),
            need(Feature.CAUSAL_SEQLEN_Q_NE_K),
            need(Feature.SOFTCAP),
            need(Feature.ALIBI),
            need(Feature.DROPOUT),
            need(Feature.VARLEN),
            need(Feature.GQA),
            self._needs(
                Feature.FULLY_MASKED_ROWS,
                needs[Feature.FULLY_MASKED_ROWS] and not (case.has_bias and self.fully_masked_rows_ok_with_bias),
            ),
            # the bias's kind first: a kernel that refuses every bias says so on both kinds
            need(Feature.BIAS),
            need(Feature.BOOL_MASK),
            need(Feature.BIAS_GRAD),
            need(Feature.BIAS_OTHER_DTYPE),
            need(Feature.BIAS_GRAD_OTHER_DTYPE),
            need(Feature.VARLEN_BIAS),
        ]

    def envelope(self) -> dict[str, Any]:
        """These capabilities in the declaration's vocabulary (SUPPORTS_KEYS), for `attn-gate kernels`."""
        dims = (
            self.head_dims
            if self.head_dims is not None
            else {
                "max": self.max_head_dim,
                **({"multiple": self.head_dim_multiple} if self.head_dim_multiple > 1 else {}),
            }
        )
        out: dict[str, Any] = {"devices": list(self.devices), "dtypes": list(self.dtypes), "head_dims": dims}
        if self.head_dims_v is not None:
            out["head_dims_v"] = self.head_dims_v
        if self.max_seqlen:
            out["max_seqlen"] = self.max_seqlen
        if self.seqlen_multiple > 1:
            out["seqlen_multiple"] = self.seqlen_multiple
        if self.max_batch_heads:
            out["max_batch_heads"] = self.max_batch_heads
        if self.page_size_multiple > 1:
            out["page_size_multiple"] = self.page_size_multiple
        if self.layouts != tuple(LAYOUTS):
            out["layouts"] = list(self.layouts)
        if self.bias_kinds != BIAS_KINDS:
            out["bias_kinds"] = list(self.bias_kinds)
        out.update({f.value: self.supports(f) for f in Feature})
        return out


def feature_needs(case: Case) -> dict[Feature, bool]:
    """Whether `case` needs each feature: a kernel without it SKIPs the case (the one place these
    conditions are written; `Capabilities._checks` orders them for the reason a refusal names)."""
    decode = case.entry.kind == "kvcache"
    forced = case.knobs.options()
    return {
        Feature.KVCACHE: decode,
        **{feature: name in forced for name, feature in KNOB_FEATURES.items()},
        Feature.PAGED: bool(case.entry.page_size),
        Feature.SINKS: case.entry.sinks,
        Feature.HEAD_DIM_V_DIFFERS: case.head_dim != case.head_dim_v,
        Feature.SEQLEN_Q_NE_K: case.seqlen_q != case.seqlen_k and case.entry.varlen is None and not decode,
        Feature.CAUSAL: case.causal,
        Feature.NON_CAUSAL: not case.causal,
        Feature.WINDOW: case.has_window,
        Feature.CAUSAL_SEQLEN_Q_NE_K: case.mask_alignment_matters,
        Feature.SOFTCAP: bool(case.softcap),
        Feature.ALIBI: case.alibi,
        Feature.DROPOUT: bool(case.dropout_p),
        Feature.VARLEN: case.entry.varlen is not None,
        Feature.GQA: case.is_gqa,
        Feature.FULLY_MASKED_ROWS: case.has_fully_masked_rows,
        Feature.BIAS: case.has_float_bias,
        Feature.BOOL_MASK: case.has_bool_bias,
        Feature.BIAS_GRAD: case.bias.grad,
        Feature.BIAS_OTHER_DTYPE: case.bias.dtype is not None,
        Feature.BIAS_GRAD_OTHER_DTYPE: case.bias.grad and case.bias.dtype is not None,
        Feature.VARLEN_BIAS: case.has_bias and case.entry.varlen is not None,
    }


def case_lengths(case: Case) -> tuple[int, ...]:
    """Every query and key length the kernel sees in `case`: each varlen sequence's, a decode
    step's queries and each cache's keys."""
    if case.entry.kind == "kvcache":
        return (case.seqlen_q, *case.key_lengths)
    if case.entry.varlen is not None:
        return (*case.entry.varlen, *case.keys_varlen)
    return (case.seqlen_q, case.seqlen_k)
