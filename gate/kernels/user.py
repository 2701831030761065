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
import inspect
import sys
from pathlib import Path

import torch

from gate.attention.bias import as_additive
from gate.core.errors import UserError
from gate.kernels.base import Capabilities, KernelAdapter, KernelCall, KernelOutput, per_sequence
from gate.kernels.capabilities import Feature, feature_set


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


DESCALE_KEYWORDS = ("q_descale", "k_descale", "v_descale")
FP8_DTYPES = ("e4m3", "e5m2")


def _dtypes(sig: "_Signature") -> tuple[str, ...]:
    """A function that takes the three descale keywords has an fp8 path (FA3's convention)."""
    return ("fp16", "bf16", "fp32") + (FP8_DTYPES if all(sig.takes(k) for k in DESCALE_KEYWORDS) else ())


class _Signature:
    """The keywords a user function takes (all of them, if it takes **kwargs)."""

    def __init__(self, fn):
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            params = {}
        self.accepts_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        self.params = set(params)

    def takes(self, name: str) -> bool:
        return self.accepts_kwargs or name in self.params


def _split_result(result) -> KernelOutput:
    if isinstance(result, (tuple, list)):
        out = result[0]
        lse = result[1] if len(result) > 1 and isinstance(result[1], torch.Tensor) else None
        return KernelOutput(out=out, lse=None if lse is None else lse.detach().float())
    return KernelOutput(out=result)


def _common_kwargs(sig: _Signature, call: KernelCall, lse_flag: str) -> dict:
    o = call.opts
    optional = {
        # a keyword the function does not take is left out (its default is flash-attn's: scale
        # 1/sqrt(d), not causal); cases that need it were skipped by capabilities()
        "softmax_scale": o.softmax_scale,
        "causal": o.causal,
        "window_size": tuple(o.window),
        "softcap": o.softcap,
        "alibi_slopes": o.alibi_slopes,
        "deterministic": call.deterministic,
        lse_flag: True,
        "dropout_p": o.dropout_p,
    }
    kwargs = {k: val for k, val in optional.items() if sig.takes(k)}
    if call.descale is not None:  # only fp8 cases; capabilities() skipped them where not taken
        kwargs.update(zip(DESCALE_KEYWORDS, call.descale))
    if call.sink is not None:  # only cases with sinks; capabilities() skipped them where not taken
        kwargs["learnable_sink"] = call.sink
    return kwargs


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
    """One function in the flash_attn_func convention; varlen cases run each sequence through it alone."""

    def __init__(
        self, spec: str, fn=None, backward: bool = True, family: str = "", declared: Capabilities | None = None
    ):
        self.name = spec
        self.description = f"user kernel {spec} (flash_attn_func convention)"
        self.fn = fn if fn is not None else load_callable(spec)
        self.sig = _Signature(self.fn)
        self.backward = backward
        self.declared = declared

    def _takes(self, name: str) -> bool:
        return self.sig.takes(name)

    def inferred(self) -> Capabilities:
        return Capabilities(
            devices=("cpu", "cuda"),
            dtypes=_dtypes(self.sig),
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
        kwargs = _common_kwargs(self.sig, call, "return_attn_probs")
        if call.opts.bias is not None:  # only cases with a bias pass it (capabilities() skipped the rest)
            kwargs["attn_bias"] = as_additive(call.opts.bias, q.dtype)
        return _split_result(self.fn(q, k, v, **kwargs))

    def __call__(self, call: KernelCall) -> KernelOutput:
        if call.cu_seqlens is not None:
            return per_sequence(call, self._dense)
        return self._dense(call.q, call.k, call.v, call)


# --- kernel families ------------------------------------------------------------


def declaration_of(family) -> Capabilities | None:
    """The envelope `[tool.attn-gate.kernels.NAME.supports]` declares, as Capabilities; None when empty."""
    if not family.supports:
        return None
    return Capabilities.from_declaration(family.supports, family.supports_table)


class VarlenEntry(_Declared):
    """flash_attn_varlen_func convention: the packed batch in ONE call, with cu_seqlens_q/k and
    max_seqlen_q/k (and seqused_k, the true key count per sequence, where the function takes it)."""

    def __init__(self, spec: str, fn, backward: bool = True, declared: Capabilities | None = None):
        self.name, self.fn, self.sig, self.backward, self.declared = spec, fn, _Signature(fn), backward, declared
        self.description = f"user kernel {spec} (flash_attn_varlen_func convention)"

    def inferred(self) -> Capabilities:
        t = self.sig.takes
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
        cu, cu_k = call.cu_seqlens, call.keys_cu_seqlens  # key lengths may differ from the queries'
        kwargs = _common_kwargs(self.sig, call, "return_attn_probs")
        if self.sig.takes("seqused_k"):
            kwargs["seqused_k"] = (cu_k[1:] - cu_k[:-1]).to(torch.int32)
        return _split_result(
            self.fn(
                call.q,
                call.k,
                call.v,
                cu_seqlens_q=cu,
                cu_seqlens_k=cu_k,
                max_seqlen_q=call.max_seqlen,
                max_seqlen_k=call.keys_max_seqlen,
                **kwargs,
            )
        )


class KVCacheEntry(_Declared):
    """flash_attn_with_kvcache convention: q (B, Nq, Hq, D) against k_cache/v_cache with
    cache_seqlens; k=/v= new tokens the function appends into the cache in place; block_table for a
    paged cache (blocks, page, Hkv, D). Forward only."""

    def __init__(self, spec: str, fn, declared: Capabilities | None = None):
        self.name, self.fn, self.sig, self.declared = spec, fn, _Signature(fn), declared
        self.description = f"user kernel {spec} (flash_attn_with_kvcache convention)"

    def inferred(self) -> Capabilities:
        t = self.sig.takes
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
            ),
            returns_lse=t("return_softmax_lse"),
            backward=False,
        )

    def unsupported_reason(self, case, device: str) -> str | None:
        why = self.declared.unsupported_reason(case, device) if self.declared is not None else None
        if why:
            return why
        if case.entry.cache_new and not (self.sig.takes("k") and self.sig.takes("v")):
            return "its kvcache entry point takes no k=/v= to append"
        return super().unsupported_reason(case, device)

    def __call__(self, call: KernelCall) -> KernelOutput:
        c = call.cache
        kwargs = _common_kwargs(self.sig, call, "return_softmax_lse")
        kwargs.pop("deterministic", None)
        kwargs.pop("dropout_p", None)
        if c.k_new is not None:
            kwargs.update(k=c.k_new, v=c.v_new)
        if c.block_table is not None:
            kwargs["block_table"] = c.block_table
        return _split_result(self.fn(call.q, c.k_cache, c.v_cache, cache_seqlens=c.cache_seqlens, **kwargs))


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
            self.entries["kvcache"] = KVCacheEntry(family.kvcache, load_callable(family.kvcache), declared)

    def capabilities(self) -> Capabilities:
        """The family as a whole (devices, dtypes, backward): per-case answers come from unsupported_reason."""
        first = next(iter(self.entries.values())).capabilities()
        notes = tuple(f"{e} entry point: {a.name}" for e, a in self.entries.items())
        if not self.family.backward:
            notes += ("forward-only kernel (backward = false): judged on out and LSE, no gradients",)
        features = first.features - {Feature.KVCACHE} | ({Feature.KVCACHE} if "kvcache" in self.entries else set())
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
        kind = "kvcache" if call.cache is not None else "varlen" if call.cu_seqlens is not None else "dense"
        entry = self.entries.get(kind)
        if entry is None:  # run_case asks unsupported_reason first; this is a caller that did not
            raise RuntimeError(f"kernel family {self.name!r} has no {kind} entry point")
        return entry(call)
