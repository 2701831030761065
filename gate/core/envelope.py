"""What a kernel supports, as one vocabulary: the features a case may need (`Feature`) and the
keys of a declared envelope, `[tool.attn-gate.kernels.NAME.supports]` (`SUPPORTS_KEYS`).

The built-in adapters' `Capabilities` (gate/kernels/capabilities.py) are written in these terms,
and a user's declaration is read into the same `Capabilities` (`capabilities.declared`); the docs
list every key of `SUPPORTS_KEYS` (docs/kernels.md, checked by a test). Torch-free.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from difflib import get_close_matches
from typing import Any

from gate.core.cases import BIAS_KINDS, DTYPES, LAYOUTS
from gate.core.errors import UserError


class Feature(str, enum.Enum):
    """What a case may need of a kernel beyond a plain forward and backward. A kernel that lacks
    one skips the cases that need it with the feature's reason (its own, else `DEFAULT_REASONS`).
    Each is also a true/false key of a declared envelope, under the same name. A refinement comes
    after what it refines (paged after kvcache, causal_seqlen_q_ne_k after causal)."""

    KVCACHE = "kvcache"  # a decode entry point (flash_attn_with_kvcache convention, or emulated on a gathered cache)
    PAGED = "paged"  # takes a paged cache with a block table
    SINKS = "sinks"  # learnable per-head sink logits
    HEAD_DIM_V_DIFFERS = "head_dim_v_differs"
    SEQLEN_Q_NE_K = "seqlen_q_ne_k"
    CAUSAL = "causal"
    NON_CAUSAL = "non_causal"  # attention without a causal mask (a causal-only kernel declares it false)
    WINDOW = "window"
    # causal masks, windows and ALiBi over unequal lengths, aligned bottom-right as flash-attn aligns them
    CAUSAL_SEQLEN_Q_NE_K = "causal_seqlen_q_ne_k"
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
    # kernel knobs (gate/core/cases.py KNOBS): a kernel exposes them or SKIPs the cases that force one
    NUM_SPLITS = "num_splits"  # takes a forced split-KV count
    PACK_GQA = "pack_gqa"  # takes a forced pack_gqa choice
    HND_CACHE = "hnd_cache"  # reads a cache laid out (batch or pages, heads, tokens, dim)


# The reason a SKIP row shows when a kernel lacks a feature and gives no reason of its own.
DEFAULT_REASONS: dict[Feature, str] = {
    Feature.KVCACHE: "no KV-cache (decode) entry point",
    Feature.PAGED: "no paged KV cache (block table)",
    Feature.SINKS: "no learnable sinks",
    Feature.HEAD_DIM_V_DIFFERS: "head_dim_v != head_dim",
    Feature.SEQLEN_Q_NE_K: "seqlen_q != seqlen_k",
    Feature.CAUSAL_SEQLEN_Q_NE_K: (
        "causal, windowed or ALiBi with seqlen_q != seqlen_k (the gate aligns all three bottom-right)"
    ),
    Feature.CAUSAL: "no causal mask",
    Feature.NON_CAUSAL: "no attention without a causal mask",
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
    Feature.NUM_SPLITS: "no num_splits knob: the kernel exposes no forced split-KV count",
    Feature.PACK_GQA: "no pack_gqa knob: the kernel exposes no forced packing of GQA query heads",
    Feature.HND_CACHE: "no HND cache layout: the kernel exposes no kv_layout knob (it reads NHD caches only)",
}

# Each knob (gate/core/cases.py Knobs, by its field and keyword name) and the feature that exposes it.
KNOB_FEATURES = {"num_splits": Feature.NUM_SPLITS, "pack_gqa": Feature.PACK_GQA, "kv_layout": Feature.HND_CACHE}

# A knob's envelope key says what the kernel takes (its SKIP reason says what it lacks). Knobs are
# never assumed: a kernel exposes them, a user's kernel family by declaring them true.
KNOB_MEANINGS: dict[Feature, str] = {
    Feature.NUM_SPLITS: "kvcache: takes num_splits= (a forced split-KV count; knobs num_splits)",
    Feature.PACK_GQA: "kvcache: takes pack_gqa= (knobs pack_gqa)",
    Feature.HND_CACHE: 'kvcache: takes kv_layout="HND", the cache as (batch or pages, heads, tokens, dim) (knobs kv_layout)',
}

# what declaring a feature false is for, where its reason alone does not say
WHEN_FALSE: dict[Feature, str] = {
    Feature.NON_CAUSAL: ": false for a kernel that runs causal attention only",
    Feature.SEQLEN_Q_NE_K: ": false when only seqlen_q == seqlen_k runs",
    Feature.CAUSAL_SEQLEN_Q_NE_K: (
        ": false for a mask aligned top-left (PyTorch's is_causal) or written for equal lengths;"
        " the other cases of unequal lengths still run"
    ),
}

DEVICES = ("cpu", "cuda")
DIM_RANGE_KEYS = ("min", "max", "multiple")


@dataclass(frozen=True)
class Key:
    """One key of a declared envelope: its TOML form (`kind`), the values it may hold, and what it means."""

    name: str
    kind: (
        str  # "bool" | "names" (a list drawn from `choices`) | "dims" (a list of ints, or {min, max, multiple}) | "int"
    )
    meaning: str
    choices: tuple[str, ...] = ()

    @property
    def form(self) -> str:
        """How a value is written, for docs and messages."""
        return {
            "bool": "true or false",
            "int": "an integer >= 1",
            "names": f"a list drawn from {', '.join(self.choices)}",
            "dims": "a list of integers, or a table {min = A, max = B, multiple = N}",
        }[self.kind]


SUPPORTS_KEYS: dict[str, Key] = {
    k.name: k
    for k in (
        Key("devices", "names", "the devices it runs on", DEVICES),
        Key("dtypes", "names", "input dtypes (e4m3/e5m2: the fp8 path)", DTYPES),
        Key("head_dims", "dims", "head dims of q and k (and of v where head_dims_v is not given)"),
        Key("head_dims_v", "dims", "head dims of v (dv)"),
        Key("max_seqlen", "int", "the longest query or key length (each sequence's, varlen and cache too)"),
        Key("seqlen_multiple", "int", "every query and key length is a multiple of this"),
        Key(
            "max_batch_heads",
            "int",
            "the most batch x query heads one call may hold (a grid of one program per (batch, head) on "
            "CUDA's y axis: 65535)",
        ),
        Key("page_size_multiple", "int", "paged KV cache: page sizes it accepts are multiples of this"),
        Key("layouts", "names", "how q, k, v and dO may reach it (see the coverage axes)", tuple(LAYOUTS)),
        Key("bias_kinds", "names", "the custom bias / mask kinds it takes (none: no bias)", BIAS_KINDS),
        *(
            Key(
                f.value,
                "bool",
                KNOB_MEANINGS.get(f) or DEFAULT_REASONS[f].removeprefix("no ") + WHEN_FALSE.get(f, ""),
            )
            for f in Feature
        ),
    )
}


def _fix(key: Key) -> str:
    return f"write {key.name} = {key.form}"


def check_supports(raw: Any, where: str) -> dict[str, Any]:
    """A declared envelope, validated: the same dict (JSON-native values) or a UserError naming
    the key and its fix. `where` names the table, e.g. `pyproject.toml [tool.attn-gate.kernels.x.supports]`."""
    if not isinstance(raw, dict):
        raise UserError(f"{where}: expected a table of keys {', '.join(SUPPORTS_KEYS)}")
    out: dict[str, Any] = {}
    for name, value in raw.items():
        key = SUPPORTS_KEYS.get(name)
        if key is None:
            near = get_close_matches(name, SUPPORTS_KEYS, n=1)
            raise UserError(
                f"{where}: unknown key {name!r}; {f'did you mean {near[0]!r}? ' if near else ''}"
                f"known keys: {', '.join(SUPPORTS_KEYS)}"
            )
        bad = UserError(f"{where}: {name} = {value!r} is not valid; {_fix(key)}")
        if key.kind == "bool":
            if not isinstance(value, bool):
                raise bad
        elif key.kind == "int":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad
        elif key.kind == "names":
            if not (isinstance(value, list) and value and all(isinstance(v, str) for v in value)):
                raise bad
            unknown = [v for v in value if v not in key.choices]
            if unknown:
                raise UserError(f"{where}: {name} names {unknown[0]!r}; choose from {', '.join(key.choices)}")
            value = list(dict.fromkeys(value))
        elif key.kind == "dims":
            value = _check_dims(value, bad, where, name)
        out[name] = value
    return out


def _is_dim(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _check_dims(value: Any, bad: UserError, where: str, name: str) -> Any:
    if isinstance(value, list):
        if not value or not all(_is_dim(v) for v in value):
            raise bad
        return sorted(set(value))
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(DIM_RANGE_KEYS))
        if unknown:
            raise UserError(
                f"{where}: {name} has unknown key {unknown[0]!r}; a range is {{min = A, max = B, multiple = N}}"
            )
        if not value or not all(_is_dim(v) for v in value.values()):
            raise bad
        if value.get("min", 1) > value.get("max", value.get("min", 1)):
            raise UserError(f"{where}: {name} has min {value['min']} > max {value['max']}; swap them")
        return dict(value)
    raise bad


def dims_allow(dims: Any, d: int) -> bool:
    """Whether head dim `d` is inside a declared `dims` value (a list, or a range table)."""
    if isinstance(dims, (list, tuple)):
        return d in dims
    return dims.get("min", 1) <= d <= dims.get("max", d) and d % dims.get("multiple", 1) == 0


def describe_dims(dims: Any) -> str:
    """A dims value in words: `32..128, multiple of 8` or `64, 128`."""
    if isinstance(dims, (list, tuple)):
        return ", ".join(str(d) for d in dims)
    lo, hi, mul = dims.get("min"), dims.get("max"), dims.get("multiple", 1)
    parts = [f"{lo}..{hi}" if lo and hi else f"<= {hi}" if hi else f">= {lo}" if lo else ""]
    parts.append(f"multiple of {mul}" if mul > 1 else "")
    return ", ".join(p for p in parts if p) or "any"


def render_supports(supports: dict[str, Any], table: str) -> str:
    """The declaration as a TOML table, in `SUPPORTS_KEYS` order (what `probe` prints and writes)."""
    lines = [f"[{table}]"]
    for name in SUPPORTS_KEYS:
        if name in supports:
            lines.append(f"{name} = {_toml(supports[name])}")
    return "\n".join(lines) + "\n"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {value!r} as TOML")
