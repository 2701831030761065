"""User kernels: one function (`--kernel package.module:function`, flash_attn_func convention),
or a kernel family declared in pyproject.toml with an entry point per convention:

    [tool.attn-gate.kernels.mykernel]
    dense   = "pkg.mod:attn_func"            # flash_attn_func(q, k, v, ...)            (B, N, H, D)
    varlen  = "pkg.mod:attn_varlen_func"     # flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                             #   max_seqlen_q, max_seqlen_k, [seqused_k], ...)  packed (total, H, D)
    kvcache = "pkg.mod:attn_with_kvcache"    # flash_attn_with_kvcache(q, k_cache, v_cache, [k, v],
                                             #   cache_seqlens=, [block_table=], ...)
    backward = true                          # false: forward-only, judged on out and LSE

Each case goes to the entry point of its kind (Case.entry_point); a family without that entry
point SKIPs the case and says which key to add. What an entry point supports is read from its
signature: a keyword it does not take (softcap, window_size, alibi_slopes, dropout_p,
deterministic, learnable_sink, block_table, k/v for appending) is a feature it does not have,
and cases that need it are SKIPPED. A tuple result is (out, lse, ...), as flash-attn returns with
return_attn_probs=True / return_softmax_lse=True.

A decode case's forced knobs (num_splits=, pack_gqa=, kv_layout="HND" with heads-first cache
tensors) reach a kvcache entry point only where the family declares them true in its supports table
(num_splits, pack_gqa, hnd_cache) and the function takes the keyword; elsewhere those cases SKIP.

fp8 (e4m3, e5m2) cases run where the function takes `q_descale`, `k_descale` and `v_descale`
(FA3's flash_attn_func): q, k, v arrive as float8 tensors with float32 descale factors of shape
(batch, KV heads), value = fp8 * descale; out is expected in bf16. Elsewhere they are SKIPPED.

`attn_bias`: a float tensor broadcastable to (batch, heads, seqlen_q, seqlen_k), in the
case's bias dtype (the input dtype, or float32), to be ADDED to the scaled (and capped) scores
before the causal/window masks; it may hold -inf; when it requires grad, the gradient must flow
back to it. Boolean masks arrive in the same keyword as 0 / -inf in the input dtype.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from pathlib import Path

from gate.attention.bias import as_additive
from gate.core.envelope import KNOB_FEATURES
from gate.core.errors import UserError
from gate.kernels.base import Capabilities, KernelAdapter, KernelCall, KernelOutput, entry_kind, per_sequence
from gate.kernels.capabilities import DEFAULT_REASONS, Feature, feature_set
from gate.kernels.entries import (
    DESCALE_KEYWORDS,
    DenseEntryPoint,
    Keywords,
    KVCacheEntryPoint,
    VarlenEntryPoint,
    split_result,
)


def load_callable(spec: str):
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UserError(f"--kernel {spec!r}: a user kernel is named 'package.module:function'")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # as `python -m` would: the project's own modules import
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # SystemExit: a script that exits on import
        lines = str(exc).strip().splitlines()
        raise UserError(
            f"--kernel {spec!r}: module {module_name!r} does not import ({type(exc).__name__}: {lines[0] if lines else ''}); "
            f"check the name and that it is on PYTHONPATH"
        ) from None
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise UserError(f"--kernel {spec!r}: {module_name} has no attribute {attr!r}")
    if not callable(fn):
        raise UserError(f"--kernel {spec!r}: {attr!r} is not callable")
    return fn


FP8_DTYPES = ("e4m3", "e5m2")


def _dtypes(takes: Keywords) -> tuple[str, ...]:
    """A function that takes the three descale keywords has an fp8 path (FA3's convention)."""
    return ("fp16", "bf16", "fp32") + (FP8_DTYPES if all(takes.takes(k) for k in DESCALE_KEYWORDS) else ())


class _Declared(KernelAdapter):
    """A user entry point: what its signature allows (`inferred`), narrowed by the envelope its
    table declares (`declared`, gate/core/envelope.py), which is asked first."""

    declared: Capabilities | None = None

    def inferred(self) -> Capabilities:
        raise NotImplementedError

    def capabilities(self) -> Capabilities:
        own = self.inferred()
        return own if self.declared is None else own.narrowed_by(self.declared, f"the signature of {self.name}")


class UserAdapter(_Declared):
    """One function in the flash_attn_func convention (gate.kernels.entries.DenseEntryPoint); varlen
    cases run each sequence through it alone."""

    def __init__(
        self, spec: str, fn=None, backward: bool = True, family: str = "", declared: Capabilities | None = None
    ):
        self.name = spec
        self.description = f"user kernel {spec} (flash_attn_func convention)"
        fn = fn if fn is not None else load_callable(spec)
        self.entry = DenseEntryPoint(fn, Keywords.of(fn))
        self.backward = backward
        self.declared = declared

    def _takes(self, name: str) -> bool:
        return self.entry.takes.takes(name)

    def inferred(self) -> Capabilities:
        return Capabilities(
            devices=("cpu", "cuda"),
            dtypes=_dtypes(self.entry.takes),
            max_head_dim=1024,
            features=feature_set(
                head_dim_v_differs=True,
                causal=self._takes("causal"),
                window=self._takes("window_size"),
                softcap=self._takes("softcap"),
                alibi=self._takes("alibi_slopes"),
                dropout=False,
                varlen=True,
                gqa=True,
                sinks=self._takes("learnable_sink"),
                # a kernel with an `attn_bias` keyword takes every bias kind (bool as 0/-inf)
                bias=self._takes("attn_bias"),
                bias_grad=self._takes("attn_bias"),
                bool_mask=self._takes("attn_bias"),
                varlen_bias=self._takes("attn_bias"),
            ),  # varlen runs each sequence alone: its block of the bias
            deterministic_mode=self._takes("deterministic"),
            returns_lse=self._takes("return_attn_probs"),
            backward=self.backward,
            notes=("varlen by running each sequence alone",),
        )

    def _dense(self, q, k, v, call: KernelCall) -> KernelOutput:
        extra = {}
        if call.opts.bias is not None:  # only cases with a bias pass it (capabilities() skipped the rest)
            extra["attn_bias"] = as_additive(call.opts.bias, q.dtype)
        return split_result(self.entry.result_on(q, k, v, call, **extra))

    def __call__(self, call: KernelCall) -> KernelOutput:
        if entry_kind(call) == "varlen":
            return per_sequence(call, self._dense)
        return self._dense(call.q, call.k, call.v, call)


# --- kernel families ------------------------------------------------------------


def declaration_of(family) -> Capabilities | None:
    """The envelope `[tool.attn-gate.kernels.NAME.supports]` declares, as Capabilities; None when empty."""
    if not family.supports:
        return None
    return Capabilities.from_declaration(family.supports, family.supports_table)


class VarlenEntry(_Declared):
    """A family's varlen entry point, flash_attn_varlen_func convention: the packed batch in ONE
    call (gate.kernels.entries.VarlenEntryPoint, as FA2/FA3/FA4 are called); what it supports is
    read from its signature."""

    def __init__(self, spec: str, fn, backward: bool = True, declared: Capabilities | None = None):
        self.name, self.backward, self.declared = spec, backward, declared
        self.entry = VarlenEntryPoint(fn, Keywords.of(fn))
        self.description = f"user kernel {spec} (flash_attn_varlen_func convention)"

    def inferred(self) -> Capabilities:
        t = self.entry.takes.takes
        return Capabilities(
            devices=("cpu", "cuda"),
            dtypes=("fp16", "bf16", "fp32"),
            max_head_dim=1024,
            features=feature_set(
                head_dim_v_differs=True,
                causal=t("causal"),
                window=t("window_size"),
                softcap=t("softcap"),
                alibi=t("alibi_slopes"),
                dropout=False,
                varlen=True,
                gqa=True,
                sinks=t("learnable_sink"),
            ),
            deterministic_mode=t("deterministic"),
            returns_lse=t("return_attn_probs"),
            backward=self.backward,
        )

    def __call__(self, call: KernelCall) -> KernelOutput:
        return self.entry(call)


def knob_features(takes: Keywords, declared: Capabilities | None, table: str) -> tuple[dict, dict]:
    """(feature flags, reasons) of a user kvcache entry's knobs: a knob is exposed only where the
    family declares it true in its `supports` table (never inferred: a keyword's name says nothing
    of what the function does with a forced value) and the signature takes its keyword (else
    narrowed_by says the declaration claims what the signature lacks)."""
    said = declared.declared if declared is not None else {}
    flags, reasons = {}, {}
    for keyword, feature in KNOB_FEATURES.items():  # a knob arrives in the keyword of its name
        flags[feature.value] = said.get(feature.value) is True and takes.takes(keyword)
        if said.get(feature.value) is not True:
            reasons[feature] = (
                f"{DEFAULT_REASONS[feature]}: declare {feature.value} = true in {table} "
                f"if its kvcache entry takes {keyword}="
            )
    return flags, reasons


class KVCacheEntry(_Declared):
    """A family's kvcache entry point, flash_attn_with_kvcache convention (gate.kernels.entries.
    KVCacheEntryPoint, as FA2/FA3 are called): the function appends k=/v= into the cache in place;
    block_table for a paged cache (blocks, page, Hkv, D). Forward only. Knobs a case forces
    (num_splits=, pack_gqa=, kv_layout="HND") reach it where the family declares them."""

    def __init__(
        self, spec: str, fn, declared: Capabilities | None = None, table: str = "[tool.attn-gate.kernels.NAME.supports]"
    ):
        self.name, self.declared, self.table = spec, declared, table
        self.entry = KVCacheEntryPoint(fn, Keywords.of(fn))
        self.description = f"user kernel {spec} (flash_attn_with_kvcache convention)"

    def inferred(self) -> Capabilities:
        t = self.entry.takes.takes
        knobs, knob_reasons = knob_features(self.entry.takes, self.declared, self.table)
        return Capabilities(
            devices=("cpu", "cuda"),
            dtypes=("fp16", "bf16", "fp32"),
            max_head_dim=1024,
            features=feature_set(
                head_dim_v_differs=True,
                causal=t("causal"),
                window=t("window_size"),
                softcap=t("softcap"),
                alibi=t("alibi_slopes"),
                gqa=True,
                kvcache=True,
                paged=t("block_table"),
                sinks=t("learnable_sink"),
                **knobs,
            ),
            reasons=knob_reasons,
            returns_lse=t("return_softmax_lse"),
            backward=False,
        )

    def unsupported_reason(self, case, device: str) -> str | None:
        why = self.declared.unsupported_reason(case, device) if self.declared is not None else None
        if why:
            return why
        if case.entry.cache_new and not (self.entry.takes.takes("k") and self.entry.takes.takes("v")):
            return "its kvcache entry point takes no k=/v= to append"
        return super().unsupported_reason(case, device)

    def __call__(self, call: KernelCall) -> KernelOutput:
        return self.entry(call)


def family_adapter_of(family) -> KernelAdapter:
    """The adapter of a `[tool.attn-gate.kernels]` table: a family's entry points, or (the table of
    a plain `package.module:function`) that function with the table's declared envelope."""
    if family.declaration_only:
        return UserAdapter(family.name, declared=declaration_of(family))
    return FamilyAdapter(family)


class FamilyAdapter(KernelAdapter):
    """A kernel family from `[tool.attn-gate.kernels.NAME]`: each case goes to its entry point."""

    def __init__(self, family):
        self.family = family
        self.name = family.name
        named = ", ".join(f"{e}={family.entry(e)}" for e in ("dense", "varlen", "kvcache") if family.entry(e))
        self.description = f"user kernel family ({named})" + ("" if family.backward else ", forward-only")
        self.entries: dict[str, KernelAdapter] = {}
        declared = declaration_of(family)
        if family.dense:
            self.entries["dense"] = UserAdapter(
                family.dense, load_callable(family.dense), family.backward, declared=declared
            )
        if family.varlen:
            self.entries["varlen"] = VarlenEntry(family.varlen, load_callable(family.varlen), family.backward, declared)
        if family.kvcache:
            self.entries["kvcache"] = KVCacheEntry(
                family.kvcache, load_callable(family.kvcache), declared, family.supports_table
            )

    def capabilities(self) -> Capabilities:
        """The family as a whole (devices, dtypes, backward): per-case answers come from unsupported_reason."""
        first = next(iter(self.entries.values())).capabilities()
        notes = tuple(f"{e} entry point: {a.name}" for e, a in self.entries.items())
        if not self.family.backward:
            notes += ("forward-only kernel (backward = false): judged on out and LSE, no gradients",)
        # a decode or varlen case is called through its own entry point: without one, the family lacks it
        by_entry = {Feature.KVCACHE: "kvcache", Feature.VARLEN: "varlen"}
        features = first.features - set(by_entry) | {f for f, e in by_entry.items() if e in self.entries}
        return dataclasses.replace(first, features=features, backward=self.family.backward, notes=notes)

    def entry_for(self, case) -> KernelAdapter | None:
        return self.entries.get(case.entry_point)

    def unsupported_reason(self, case, device: str) -> str | None:
        declared = declaration_of(self.family)
        why = declared.unsupported_reason(case, device) if declared is not None else None
        if why:
            return why
        entry = self.entry_for(case)
        if entry is None:
            return (
                f'no {case.entry_point} entry point: add {case.entry_point} = "package.module:function" '
                f"to [tool.attn-gate.kernels.{self.name}]"
            )
        return entry.unsupported_reason(case, device)

    def __call__(self, call: KernelCall) -> KernelOutput:
        kind = entry_kind(call)
        entry = self.entries.get(kind)
        if entry is None:  # run_case asks unsupported_reason first; this is a caller that did not
            raise RuntimeError(f"kernel family {self.name!r} has no {kind} entry point")
        return entry(call)
