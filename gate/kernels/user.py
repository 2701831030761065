"""Any function in the flash_attn_func convention, named `package.module:function`.

What it supports is read from its signature: a keyword it does not take (softcap, window_size,
alibi_slopes, dropout_p, deterministic) is a feature it does not have, and cases that need it
are SKIPPED. A tuple result is (out, lse, ...), as flash_attn_func returns with
return_attn_probs=True.

`attn_bias` (issue #16): a float tensor broadcastable to (batch, heads, seqlen_q, seqlen_k), in the
case's bias dtype (the input dtype, or float32), to be ADDED to the scaled (and capped) scores
before the causal/window masks; it may hold -inf; when it requires grad, the gradient must flow
back to it. Boolean masks arrive in the same keyword as 0 / -inf in the input dtype.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path

import torch

from gate.core.errors import UserError
from gate.attention.bias import as_additive
from gate.kernels.base import Capabilities, KernelAdapter, KernelCall, KernelOutput, per_sequence


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


class UserAdapter(KernelAdapter):
    def __init__(self, spec: str):
        self.name = spec
        self.description = f"user kernel {spec} (flash_attn_func convention)"
        self.fn = load_callable(spec)
        try:
            params = inspect.signature(self.fn).parameters
        except (TypeError, ValueError):
            params = {}
        self.accepts_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        self.params = set(params)

    def _takes(self, name: str) -> bool:
        return self.accepts_kwargs or name in self.params

    def capabilities(self) -> Capabilities:
        return Capabilities(
            devices=("cpu", "cuda"), dtypes=("fp16", "bf16", "fp32"), max_head_dim=1024, head_dim_v_differs=True,
            causal=self._takes("causal"), window=self._takes("window_size"), softcap=self._takes("softcap"),
            alibi=self._takes("alibi_slopes"), dropout=False, varlen=True, gqa=True,
            deterministic_mode=self._takes("deterministic"), returns_lse=self._takes("return_attn_probs"),
            notes=("varlen by running each sequence alone",),
            # issue #16: a kernel with an `attn_bias` keyword takes every bias kind (bool as 0/-inf)
            bias=self._takes("attn_bias"), bias_grad=self._takes("attn_bias"), bool_mask=self._takes("attn_bias"),
        )

    def _dense(self, q, k, v, call: KernelCall) -> KernelOutput:
        o = call.opts
        optional = {
            # a keyword the function does not take is left out (its default is flash_attn_func's:
            # scale 1/sqrt(d), not causal); cases that need it were skipped by capabilities()
            "softmax_scale": o.softmax_scale, "causal": o.causal, "window_size": tuple(o.window), "softcap": o.softcap, "alibi_slopes": o.alibi_slopes,
            "deterministic": call.deterministic, "return_attn_probs": True, "dropout_p": o.dropout_p,
        }
        kwargs = {k: val for k, val in optional.items() if self._takes(k)}
        if o.bias is not None:  # issue #16: only cases with a bias pass it (capabilities() skipped the rest)
            kwargs["attn_bias"] = as_additive(o.bias, q.dtype)
        result = self.fn(q, k, v, **kwargs)
        if isinstance(result, (tuple, list)):
            out = result[0]
            lse = result[1] if len(result) > 1 and isinstance(result[1], torch.Tensor) else None
            return KernelOutput(out=out, lse=None if lse is None else lse.detach().float())
        return KernelOutput(out=result)

    def __call__(self, call: KernelCall) -> KernelOutput:
        if call.cu_seqlens is not None:
            return per_sequence(call, lambda q, k, v: self._dense(q, k, v, call))
        return self._dense(call.q, call.k, call.v, call)
