"""Cases and suites: what to test, as frozen, hashable identities with readable ids.

A Case says nothing about results; it is composed of small frozen parts (Shape, Masking, Entry,
Bias) and derives its id and hash from them. A suite is a tuple of Cases expanded from a matrix (the
cartesian product of the axes each matrix block lists). Default suites ship in `suites.toml`
beside this module; `[tool.attn-gate.suites.NAME]` in pyproject.toml replaces a suite of the
same name or adds a new one, in the same format.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import tomllib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from gate.core.errors import UserError

DTYPES = ("fp16", "bf16", "fp32", "e4m3", "e5m2")
# fp8 input dtypes -> the dtype the kernel computes in and returns out in (FA3's fp8 forward
# returns bf16): the low-precision reference, the rounding floor and the bands use it.
FP8_DTYPES = {"e4m3": "bf16", "e5m2": "bf16"}
DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4, "e4m3": 1, "e5m2": 1}


def compute_dtype(dtype: str) -> str:
    """The dtype a case of input dtype `dtype` is computed and judged in (itself but for fp8)."""
    return FP8_DTYPES.get(dtype, dtype)


# Depth checks (probes) a case may ask for, by name -> what each proves. The functions behind the
# names live in gate/correctness/probes/registry.py, which imports this vocabulary.
CHECKS: dict[str, str] = {
    "determinism": "forward+backward 10 times: bit-identical (torch.equal) where the adapter claims a "
    "deterministic mode (it is asked for it); elsewhere the run-to-run max spread, as information",
    "race": "the determinism check at 4x the batch (more blocks in flight: atomics and split reductions race)",
    "batch_invariance": "a sequence's outputs and grads are bit-identical when the other sequences of its batch "
    "change (judged for every tensor that is bit-reproducible run to run)",
    "dropout": "the kept fraction is binomially plausible for p; the same seed gives the same mask, out (and "
    "grads in deterministic mode), another seed a different mask",
}

# nan_before_window: NaN slots end this many keys before the window's first key. No attention kernel's
# key block is wider (FA2/FA3 tiles are <= 256 keys), so a block that reaches the window reads none.
NAN_MARGIN = 256


def _alignment_matters(nq: int, nk: int, left: int, right: int, alibi: bool) -> bool:
    """Whether one sequence of nq queries over nk keys is masked (window (left, right), -1 unbounded)
    or ALiBi-biased differently with query i at key i + nk - nq (bottom-right) and at key i (top-left)."""
    off = nk - nq
    if not nq or not nk or not off:
        return False
    if alibi:  # a distance from the aligned key, on every row
        return True
    # a row's keys are [pos - left, pos + right] clipped to [0, nk - 1]: the same at pos = i and at
    # pos = i + off on every row when neither bound cuts into the keys at either position
    low_never_cuts = left < 0 or left >= nq - 1 + max(0, off)
    high_never_cuts = right < 0 or right + min(0, off) >= nk - 1
    return not (low_never_cuts and high_never_cuts)


def first_visible_key(seqlen_q: int, seqlen_k: int, window: tuple[int, int]) -> int:
    """The first key any query row may see (bottom-right alignment: row 0 sits at key seqlen_k -
    seqlen_q, its window starts `left` keys earlier; causal only bounds the right); 0 without a
    left window. A kernel that skips the key blocks its window excludes reads nothing before it."""
    left = window[0]
    return max(0, seqlen_k - seqlen_q - left) if left >= 0 else 0


PERF_ONLY = "only"  # perf = "only": a timing case that sweeps do not check for correctness

# Axes a matrix block may name, with the default used when a block leaves one out.
MATRIX_AXES: dict[str, Any] = {
    "dtype": ["bf16"],
    "batch": [2],
    "seqlens": ["128"],
    "heads": ["4"],
    "head_dims": ["64"],
    "causal": [False],
    "window": [None],
    "softcap": [0.0],
    "alibi": [False],
    "dropout_p": [0.0],
    "varlen": [None],
    "perf": [False],
    "checks": [
        []
    ],  # extra checks by name (gate/correctness/probes/registry.py), e.g. [["determinism", "batch_invariance"]]
    # --- entry points, decode / KV cache, sinks ---
    "entry": ["dense"],  # "kvcache": q of a few tokens against a cache (flash_attn_with_kvcache)
    "cache_seqlens": [None],  # kvcache: tokens already in the cache per batch element (ragged); None = full
    "cache_new": [False],  # kvcache: the call appends seqlen_q new k/v tokens into the cache
    "page_size": [0],  # kvcache: 0 = one contiguous cache per batch element; N = paged, N tokens a page
    "shuffled_pages": [False],  # kvcache, paged: the block table maps pages in a shuffled order
    "sinks": [False],  # a learnable per-head logit in every softmax denominator
    "nan_before_window": [False],  # kvcache, left window: slots NAN_MARGIN keys before the window hold NaN
    "knobs": [{}],  # kvcache: options a kernel exposes, forced (KNOBS), e.g. [{}, {num_splits = 3}]
    # ---- custom bias: a custom bias / boolean mask handed to the kernel (see BIAS_KINDS)
    "bias": ["none"],
    "bias_dtype": ["input"],  # "input" = the input dtype; "fp32" = a float32 bias with bf16/fp16 inputs
    "bias_grad": [False],
    # ---- coverage
    "layout": ["contiguous"],
    "inputs": ["normal"],
    "varlen_k": [None],
}

# ---- kernel knobs: options of a kernel's call that choose its internal path, forced by a case (a
# decode case's `knobs` table), by name -> what. A kernel that exposes none of them SKIPs the case.
KNOBS: dict[str, str] = {
    "num_splits": "an integer: N >= 2 splits the keys into N parts, each its own partial softmax, combined by "
    "their LSE (split-KV, flash-decoding); 1 forces one part; 0 (the default) leaves it to the kernel",
    "pack_gqa": "true or false: the query heads of one KV head packed into the rows of one tile (true) "
    "or each head its own rows (false)",
    "kv_layout": 'the cache tensors\' layout: "NHD" (batch or pages, tokens, heads, dim) or "HND" (heads before tokens)',
}
KV_LAYOUTS = ("NHD", "HND")

# Entry points a case can be called through: dense (flash_attn_func), varlen
# (flash_attn_varlen_func: every case with `varlen` set), kvcache (flash_attn_with_kvcache).
ENTRIES = ("dense", "kvcache")

# ---- coverage: how q, k, v and dO reach the kernel (gate/attention/inputs.py kernel_views), by name -> what.
LAYOUTS: dict[str, str] = {
    "contiguous": "each tensor its own contiguous (B, N, H, D) allocation",
    "k_sliced": "K a strided slice of a wider buffer (one extra leading key row, head dim padded by >= 8): "
    "non-contiguous, non-zero storage offset",
    "qkv_packed": "q, k and v are head-slices of ONE (B, N, Hq + 2 Hkv, D) buffer, as a fused QKV projection leaves them",
    "bhsd_view": "q, k, v allocated (B, H, N, D) and handed over transposed as (B, N, H, D) views",
    "dout_noncontig": "dO allocated (B, H, N, Dv) and handed to the backward transposed (its strides differ from out's)",
    "kv_stride0": "K and V are `expand`ed views of one (seqlen, head_dim) slab: stride 0 over batch and KV heads "
    "(varlen: over KV heads), the slab inside a full-size buffer whose other elements differ",
    "far_rows": "q, k, v and dO rows (tokens) strided apart so the last quarter of each tensor's rows sit past "
    "2^31 elements from its base: offsets computed in int32 wrap (the buffers are allocated, not filled)",
    "far_batch": "q, k, v and dO batch elements strided apart so the last one starts past 2^31 elements from "
    "its base, each element's rows dense: batch offsets computed in int32 wrap (the buffers are allocated, not filled)",
}
MAX_PACKED_BIAS = 2**28  # elements of a varlen case's packed bias (2 GiB as the reference's float64 dBias)
FAR_ROWS_MIN = 4  # far_rows puts the last quarter of a tensor's rows past 2^31: it needs four rows
# ---- coverage: how the values are drawn (gate/attention/inputs.py), by name -> what.
INPUTS: dict[str, str] = {
    "normal": "q, k, v, dO standard normal",
    "large": "q scaled so the scores reach well past +-88 (softcap cases: scores of softcap/4 typical size, "
    "deep into the cap, as FA3's tests scale q)",
    "shifted": "q and k share one aligned channel (q +a, k -a) so every score, and every row's LSE, sits far below -88",
    "outliers": "two channels of K and V 30x larger than the rest, as real activations have",
}

# ---- custom bias: the kinds of custom bias a case may give the kernel, -> what each is.
# Float kinds are an additive tensor broadcastable to (batch, heads_q, seqlen_q, seqlen_k), added to
# the scaled (and capped) scores; boolean kinds are True where a query may see a key. Every boolean
# pattern allows each row's diagonal key (bottom-right aligned, clamped into range), so it never
# empties a row on its own; `bool_empty_rows` empties every 5th row on purpose (output 0 there).
FLOAT_BIAS_KINDS: dict[str, str] = {
    "dense": "float (B, H, Nq, Nk): a relative-position-like bias of tens, different per batch and head",
    "broadcast_b": "float (1, H, Nq, Nk): broadcast over the batch",
    "broadcast_h": "float (B, 1, Nq, Nk): broadcast over the heads",
    "broadcast_1": "float (1, 1, Nq, Nk): broadcast over batch and heads",
    "shifted_rows": "float (B, H, Nq, Nk): dense, with every 4th query row shifted by -160 so its LSE is "
    "below -88.7 (exp underflows in fp32: pytorch #196678, cuDNN NaN dQ); best with bias_dtype fp32",
    "growing": "float (B, H, Nq, Nk): a per-key term plus a rise of 128 from the first key to the last, so each key "
    "tile raises the running max (a kernel that stops updating it overflows exp past +88)",
    "sunk_rows": "float (B, H, Nq, Nk): dense, with every 4th query row shifted by -60000 so its every logit is below "
    "-5e4 (a kernel whose running max starts at a finite '-inf' of -5e4 returns 0 there); best with bias_dtype fp32",
    "first_key": "float (B, H, Nq, Nk): dense, with +10000 on the first key of every other query row: the row's max "
    "arrives in the first key tile and later tiles sit far below it (an attention sink)",
}
BOOL_BIAS_KINDS: dict[str, str] = {
    "bool_mask": "bool (B, H, Nq, Nk): a random sparse pattern (about 30% allowed) plus each row's diagonal key",
    "bool_empty_rows": "bool (B, H, Nq, Nk): bool_mask with every 5th query row fully masked (its output must be 0)",
    "document": "bool (B, 1, Nq, Nk): block-diagonal documents (packed sequences), different boundaries per batch",
    "prefix_lm": "bool (B, 1, Nq, Nk): a bidirectional prefix per batch, causal after it",
}
BIAS_KINDS = ("none", *FLOAT_BIAS_KINDS, *BOOL_BIAS_KINDS)
# The dims each kind's tensor broadcasts over (size 1): "b" the batch, "h" the heads.
BIAS_BROADCAST: dict[str, str] = {
    "broadcast_b": "b",
    "broadcast_h": "h",
    "broadcast_1": "bh",
    "document": "h",
    "prefix_lm": "h",
}
BIAS_DTYPES = ("input", "fp32")


def _num(x: float) -> str:
    """The shortest text that reads back as x (20.0 -> '20', 0.1 -> '0.1'): unlike `:g`, two
    different values never share an id (the suite would merge them as one case)."""
    text = repr(float(x))
    return text[:-2] if text.endswith(".0") else text


# Every part is checked when it becomes part of a Case (its `problems`), so one message lists
# every problem of the case, the cross-part ones included.
@dataclass(frozen=True)
class Shape:
    """The problem's size and dtype. With varlen lengths (Entry) `batch`, `seqlen_q` and
    `seqlen_k` are the padded equivalent (len(varlen), max(varlen), max(varlen_k))."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    head_dim: int
    head_dim_v: int
    dtype: str

    def problems(self) -> list[str]:
        problems = []
        if self.dtype not in DTYPES:
            problems.append(f"dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        for name in ("batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim", "head_dim_v"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1")
        if self.heads_kv >= 1 and self.heads_q % self.heads_kv:
            problems.append(f"heads_q {self.heads_q} is not a multiple of heads_kv {self.heads_kv}")
        return problems


@dataclass(frozen=True)
class Masking:
    """What shapes the scores: `window` is flash-attn's (left, right), -1 unbounded."""

    causal: bool = False
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    alibi: bool = False
    dropout_p: float = 0.0

    def problems(self) -> list[str]:
        problems = []
        if not 0.0 <= self.dropout_p < 1.0:
            problems.append("dropout_p must be in [0, 1)")
        if not (self.softcap >= 0 and self.softcap != float("inf")):  # nan fails this too
            problems.append("softcap must be a finite number >= 0")
        if len(self.window) != 2 or any(w < -1 for w in self.window):
            problems.append("window must be (left, right) with -1 for unbounded")
        return problems

    @property
    def has_window(self) -> bool:
        return self.window != (-1, -1)


@dataclass(frozen=True)
class Entry:
    """How the kernel is called and the extra tensors the call takes.

    kind "dense" is flash_attn_func, or flash_attn_varlen_func when `varlen` lengths are set
    (queries; `varlen_k` keys where they differ). kind "kvcache" is flash_attn_with_kvcache:
    seqlen_q is the number of query tokens of the decode step (1..16 typically), seqlen_k the
    cache capacity per batch element, cache_seqlens the tokens already cached per batch element
    before the call (None: a full cache), cache_new whether the call appends seqlen_q new k/v
    tokens after them (flash_attn_with_kvcache's k=, v=), page_size > 0 a paged cache with a block
    table (shuffled_pages: the table maps logical pages to physical blocks in a shuffled order).
    Forward only. `sinks`: a learnable per-head logit in every softmax denominator.
    nan_before_window: with a left window, the cached slots at least NAN_MARGIN keys before the
    first key any query sees hold NaN (paged: whole pages of them), so a kernel that reads them and
    masks by multiplying with 0 returns NaN (`Case.nan_slots`)."""

    kind: str = "dense"
    varlen: tuple[int, ...] | None = None
    varlen_k: tuple[int, ...] | None = None
    cache_seqlens: tuple[int, ...] | None = None
    cache_new: bool = False
    page_size: int = 0
    shuffled_pages: bool = False
    sinks: bool = False
    nan_before_window: bool = False

    @property
    def point(self) -> str:
        """The entry point a kernel family is called through: dense, varlen or kvcache."""
        if self.kind == "kvcache":
            return "kvcache"
        return "varlen" if self.varlen is not None else "dense"

    @property
    def keys_varlen(self) -> tuple[int, ...] | None:
        """The varlen key lengths: varlen_k where given, else the query lengths."""
        return self.varlen_k if self.varlen_k is not None else self.varlen


@dataclass(frozen=True)
class Bias:
    """A custom bias or boolean mask given to the kernel (`attn_bias`, SDPA's attn_mask, a Flex
    score_mod/mask_mod), see BIAS_KINDS. dtype None = the input dtype; grad: the bias requires
    grad and dBias is measured like dQ/dK/dV."""

    kind: str = "none"
    dtype: str | None = None
    grad: bool = False

    def problems(self) -> list[str]:
        problems = []
        if self.kind not in BIAS_KINDS:
            problems.append(f"bias {self.kind!r} is not one of {', '.join(BIAS_KINDS)}")
        if self.dtype not in (None, "fp32"):
            problems.append(f"bias_dtype {self.dtype!r} must be None (the input dtype) or 'fp32'")
        if self.kind == "none" and (self.dtype is not None or self.grad):
            problems.append("bias_dtype and bias_grad need a bias")
        if self.kind in BOOL_BIAS_KINDS and (self.dtype is not None or self.grad):
            problems.append(f"bias {self.kind!r} is boolean: it has no dtype choice and no gradient")
        return problems

    @property
    def present(self) -> bool:
        return self.kind != "none"

    @property
    def is_float(self) -> bool:
        return self.kind in FLOAT_BIAS_KINDS

    @property
    def is_bool(self) -> bool:
        return self.kind in BOOL_BIAS_KINDS


@dataclass(frozen=True)
class Knobs:
    """Options of the kernel's call a case forces (KNOBS); at their defaults the kernel chooses.
    num_splits 0: the kernel's own choice (1: forced unsplit); pack_gqa None: its own choice;
    kv_layout: how the cache tensors reach the kernel (the references read NHD either way)."""

    num_splits: int = 0
    pack_gqa: bool | None = None
    kv_layout: str = "NHD"

    def problems(self) -> list[str]:
        problems = []
        if isinstance(self.num_splits, bool) or not isinstance(self.num_splits, int) or self.num_splits < 0:
            problems.append(f"num_splits {self.num_splits!r} must be an integer >= 0 (0: the kernel's choice)")
        if self.pack_gqa is not None and not isinstance(self.pack_gqa, bool):
            problems.append(f"pack_gqa {self.pack_gqa!r} must be true or false")
        if self.kv_layout not in KV_LAYOUTS:
            problems.append(f"kv_layout {self.kv_layout!r} is not one of {', '.join(KV_LAYOUTS)}")
        return problems

    @property
    def forced(self) -> bool:
        return self != Knobs()

    def options(self) -> dict[str, Any]:
        """The knobs this case forces, by name (flash-attn's keywords); those at their default left out."""
        return {name: value for name, value in asdict(self).items() if value != getattr(Knobs, name)}

    def id_parts(self) -> list[str]:
        """e.g. splits3, packgqa / nopackgqa, hnd; nothing at the defaults."""
        parts = [f"splits{self.num_splits}"] if self.num_splits else []
        if self.pack_gqa is not None:
            parts.append("packgqa" if self.pack_gqa else "nopackgqa")
        if self.kv_layout != "NHD":
            parts.append(self.kv_layout.lower())
        return parts


# Case dict format history (`Case.to_dict`; results and perf files embed it, and so does the
# worker protocol):
#   1  one flat dict of every field (no schema_version key); fields added after the first suites
#      were hashed (checks, entry and cache fields, sinks, layout, inputs, varlen_k, bias) were
#      left out at their defaults so that suite hashes did not move.
#   2  schema_version 2; the parts as nested objects (shape, masking, entry, bias), every field
#      written. `migrate_case` turns a version 1 dict into this. The `knobs` part was added later
#      in the same version: a dict without it reads as the defaults (the kernel's own choices).
CASE_SCHEMA_VERSION = 2

# Version 1's flat names -> (part, field); part None: a field of Case itself.
FLAT_FIELDS: dict[str, tuple[str | None, str]] = {
    **{
        name: ("shape", name)
        for name in ("batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim", "head_dim_v", "dtype")
    },
    **{name: ("masking", name) for name in ("causal", "window", "softcap", "alibi", "dropout_p")},
    "entry": ("entry", "kind"),
    "varlen": ("entry", "varlen"),
    "varlen_k": ("entry", "varlen_k"),
    "cache_seqlens": ("entry", "cache_seqlens"),
    "cache_new": ("entry", "cache_new"),
    "page_size": ("entry", "page_size"),
    "shuffled_pages": ("entry", "shuffled_pages"),
    "sinks": ("entry", "sinks"),
    "nan_before_window": ("entry", "nan_before_window"),
    "num_splits": ("knobs", "num_splits"),
    "pack_gqa": ("knobs", "pack_gqa"),
    "kv_layout": ("knobs", "kv_layout"),
    "bias": ("bias", "kind"),
    "bias_dtype": ("bias", "dtype"),
    "bias_grad": ("bias", "grad"),
    "layout": (None, "layout"),
    "inputs": (None, "inputs"),
    "seeds": (None, "seeds"),
    "perf": (None, "perf"),
    "checks": (None, "checks"),
}
# Version 1 left these out at their defaults; suite_hash digests version 1's form, so it must
# keep doing so (a suite that uses none of them keeps its hash, and its baselines stay valid).
FLAT_OMITTED_AT_DEFAULT: dict[str, Any] = {
    "checks": (),
    "entry": "dense",
    "cache_seqlens": None,
    "cache_new": False,
    "page_size": 0,
    "shuffled_pages": False,
    "sinks": False,
    "nan_before_window": False,
    "num_splits": 0,
    "pack_gqa": None,
    "kv_layout": "NHD",
    "layout": "contiguous",
    "inputs": "normal",
    "varlen_k": None,
    "bias": "none",
    "bias_dtype": None,
    "bias_grad": False,
}
PARTS: dict[str, type] = {"shape": Shape, "masking": Masking, "entry": Entry, "bias": Bias, "knobs": Knobs}
# Fields whose values are tuples in memory and lists in JSON.
_SEQUENCES = {
    ("masking", "window"),
    ("entry", "varlen"),
    ("entry", "varlen_k"),
    ("entry", "cache_seqlens"),
    (None, "seeds"),
    (None, "checks"),
}


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


@dataclass(frozen=True)
class Case:
    """One attention problem, composed of frozen parts: its shape, masking, entry point (with
    varlen lengths, the KV cache and sinks), custom bias, the layout q/k/v reach the kernel in
    and how their values are drawn. The id and suite hash are derived from the parts.

    The shape and masking fields are also read-only properties (`case.batch`, `case.causal`):
    they are read everywhere; the entry and bias fields are read through their part
    (`case.entry.varlen`, `case.bias.kind`)."""

    shape: Shape
    masking: Masking = Masking()
    entry: Entry = Entry()
    bias: Bias = Bias()
    knobs: Knobs = Knobs()
    # ---- coverage: how q, k, v and dO reach the kernel (LAYOUTS) and how their values are drawn (INPUTS)
    layout: str = "contiguous"
    inputs: str = "normal"
    seeds: tuple[int, ...] = (0, 1)
    # True: also a timing case for the speed suites; "only": timed and never swept for correctness
    # (a serving-size decode whose float64 reference and inputs cost minutes, for one speed figure)
    perf: bool | str = False
    # Extra checks run on this case (names from gate/correctness/probes/registry.py). Not part of the id: the same
    # problem is the same case whichever checks also run on it (a suite merges them).
    checks: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name, kind in PARTS.items():
            if not isinstance(getattr(self, name), kind):
                raise TypeError(f"{name} must be a {kind.__name__}, not {type(getattr(self, name)).__name__}")
        problems = self._entry_problems()
        problems += self.shape.problems() + self.masking.problems()
        varlen = self.entry.varlen
        if varlen is not None:
            if not varlen or any(n < 0 for n in varlen) or max(varlen) < 1:
                problems.append("varlen needs non-negative lengths with at least one > 0")
            elif (self.batch, self.seqlen_q, self.seqlen_k) != (len(varlen), max(varlen), max(self.keys_varlen)):
                problems.append(
                    "varlen cases must have batch=len(varlen) and seqlens=max(varlen) (keys: max(varlen_k))"
                )
        if self.layout not in LAYOUTS:
            problems.append(f"layout {self.layout!r} is not one of {', '.join(LAYOUTS)}")
        if self.layout == "far_rows" and self.entry.kind != "kvcache":
            varlen = self.entry.varlen
            rows = (
                (sum(varlen), sum(self.keys_varlen))
                if varlen is not None
                else (self.batch * self.seqlen_q, self.batch * self.seqlen_k)
            )
            if min(rows) < FAR_ROWS_MIN:
                problems.append(
                    f"layout far_rows needs at least {FAR_ROWS_MIN} query and key rows (its last quarter sits past 2^31)"
                )
        if self.layout == "far_batch" and (
            self.entry.kind != "dense" or self.entry.varlen is not None or self.batch < 2
        ):
            problems.append(
                "layout far_batch needs a dense, non-varlen case of batch >= 2 (its last element sits past 2^31)"
            )
        if self.inputs not in INPUTS:
            problems.append(f"inputs {self.inputs!r} is not one of {', '.join(INPUTS)}")
        varlen_k = self.entry.varlen_k
        if varlen_k is not None:
            if varlen is None or len(varlen_k) != len(varlen):
                problems.append("varlen_k needs varlen, with one key length per sequence")
            elif any(nk < 1 and nq > 0 for nq, nk in zip(varlen, varlen_k)) or any(n < 0 for n in varlen_k):
                problems.append("varlen_k: every sequence with queries needs at least one key")
        if not self.seeds:
            problems.append("at least one seed is needed")
        elif not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**32 for x in self.seeds):
            problems.append("seeds must be integers in [0, 2**32)")
        if not isinstance(self.checks, tuple) or not all(isinstance(c, str) for c in self.checks):
            problems.append("checks must be a tuple of check names")
        if self.perf not in (True, False, PERF_ONLY) or (self.perf == PERF_ONLY and self.checks):
            problems.append(f"perf must be true, false or {PERF_ONLY!r} (timed, not swept: no checks)")
        problems += self._bias_problems()
        if self.is_fp8 and (
            self.entry.kind != "dense"
            or self.entry.varlen is not None
            or self.entry.sinks
            or self.layout != "contiguous"
            or self.bias.present
            or self.dropout_p
        ):
            # the per-(batch, KV head) descales are defined for dense contiguous q, k, v; FA3's fp8 has no dropout
            problems.append("an fp8 case is dense and contiguous: no varlen, kvcache, sinks, layout, bias or dropout")
        if problems:
            raise ValueError("; ".join(problems))

    @classmethod
    def build(cls, **fields: Any) -> "Case":
        """A Case from version 1's flat field names (`Case.build(batch=2, ..., causal=True)`):
        terse where a test or a tool writes one case by hand."""
        return cls.from_dict(fields)

    def with_fields(self, **changes: Any) -> "Case":
        """This case with some fields changed, by their flat names (`case.with_fields(batch=4)`)."""
        return Case.build(**{**self.flat(), **changes})

    # --- the shape and masking fields, read through the case ---
    @property
    def batch(self) -> int:
        return self.shape.batch

    @property
    def seqlen_q(self) -> int:
        return self.shape.seqlen_q

    @property
    def seqlen_k(self) -> int:
        return self.shape.seqlen_k

    @property
    def heads_q(self) -> int:
        return self.shape.heads_q

    @property
    def heads_kv(self) -> int:
        return self.shape.heads_kv

    @property
    def head_dim(self) -> int:
        return self.shape.head_dim

    @property
    def head_dim_v(self) -> int:
        return self.shape.head_dim_v

    @property
    def dtype(self) -> str:
        return self.shape.dtype

    @property
    def is_fp8(self) -> bool:
        return self.dtype in FP8_DTYPES

    @property
    def compute_dtype(self) -> str:
        """The dtype of out and of the low-precision reference: the input dtype, bf16 for fp8."""
        return compute_dtype(self.dtype)

    @property
    def causal(self) -> bool:
        return self.masking.causal

    @property
    def window(self) -> tuple[int, int]:
        return self.masking.window

    @property
    def softcap(self) -> float:
        return self.masking.softcap

    @property
    def alibi(self) -> bool:
        return self.masking.alibi

    @property
    def dropout_p(self) -> float:
        return self.masking.dropout_p

    def _entry_problems(self) -> list[str]:
        """The decode fields: kvcache-only fields need entry="kvcache"; the cache must hold what it is asked to."""
        problems = []
        e = self.entry
        if e.kind not in ENTRIES:
            problems.append(
                f"entry {e.kind!r} is not one of {', '.join(ENTRIES)} (varlen cases are those with varlen set)"
            )
            return problems
        problems += self.knobs.problems()
        if e.kind != "kvcache":
            if e.cache_seqlens is not None or e.cache_new or e.page_size or e.shuffled_pages or e.nan_before_window:
                problems.append(
                    'cache_seqlens, cache_new, page_size, shuffled_pages and nan_before_window need entry = "kvcache"'
                )
            if self.knobs.forced:
                problems.append(f'knobs ({", ".join(KNOBS)}) need entry = "kvcache"')
            return problems
        if e.varlen is not None:
            problems.append("a kvcache case cannot also be varlen")
        if self.dropout_p:
            problems.append("a kvcache case is forward-only: no dropout")
        # the layout, inputs and bias axes apply to q/k/v drawn densely; a decode case's cache is drawn apart
        if self.layout != "contiguous" or self.inputs != "normal" or self.bias.present:
            problems.append(
                "a kvcache case takes no layout, inputs or bias (they are defined for dense/varlen q, k, v)"
            )
        if e.page_size < 0:
            problems.append("page_size must be >= 0")
        if e.shuffled_pages and not e.page_size:
            problems.append("shuffled_pages needs a paged cache (page_size > 0)")
        if e.cache_seqlens is not None:
            if len(e.cache_seqlens) != self.batch:
                problems.append(f"cache_seqlens has {len(e.cache_seqlens)} lengths for batch {self.batch}")
            if any(n < 0 for n in e.cache_seqlens):
                problems.append("cache_seqlens must be >= 0")
        room = self.seqlen_k - (self.seqlen_q if e.cache_new else 0)
        if room < 0 or max(self.cached_lengths, default=0) > room:
            problems.append(
                f"the cache (capacity seqlen_k={self.seqlen_k}) cannot hold cache_seqlens"
                + (f" plus {self.seqlen_q} appended tokens" if e.cache_new else "")
            )
        if max(self.key_lengths, default=0) < 1:
            problems.append("a kvcache case needs at least one key in some batch element")
        if e.nan_before_window and not problems and not any(self.nan_slots):
            problems.append(
                f"nan_before_window needs a left window and a batch element whose cache reaches "
                f"{NAN_MARGIN} keys (NAN_MARGIN) plus a page before the first key its queries see"
            )
        return problems

    # --- derived facts of the entry point and the cache ---
    @property
    def entry_point(self) -> str:
        """The entry point a kernel family is called through: dense, varlen or kvcache."""
        return self.entry.point

    @property
    def forward_only(self) -> bool:
        """Decode has no backward (flash_attn_with_kvcache has none): judged on out, LSE and the cache.
        Nor has fp8 (FA3's fp8 path is forward-only): judged on out and LSE."""
        return self.entry.kind == "kvcache" or self.is_fp8

    @property
    def cached_lengths(self) -> tuple[int, ...]:
        """Tokens in the cache before the call, per batch element."""
        if self.entry.cache_seqlens is not None:
            return self.entry.cache_seqlens
        return (self.seqlen_k - (self.seqlen_q if self.entry.cache_new else 0),) * self.batch

    @property
    def key_lengths(self) -> tuple[int, ...]:
        """Keys each batch element attends to: the cached tokens plus the appended ones."""
        return tuple(n + (self.seqlen_q if self.entry.cache_new else 0) for n in self.cached_lengths)

    @property
    def nan_slots(self) -> tuple[int, ...]:
        """nan_before_window: per batch element, how many leading cache slots hold NaN (0 without
        the axis): those at least NAN_MARGIN keys before the first key any query sees (query 0's
        window start), rounded down to whole pages, so no key block or page reaching the window
        holds one."""
        if not self.entry.nan_before_window:  # without a left window the first visible key is 0
            return (0,) * self.batch
        page = self.entry.page_size or 1
        return tuple(
            max(0, (first_visible_key(self.seqlen_q, n, self.window) - NAN_MARGIN) // page * page)
            for n in self.key_lengths
        )

    def kv_bytes(self) -> float:
        """Bytes of K and V a decode step must read at least (its memory-bound cost): every attended key once."""
        size = DTYPE_BYTES[self.dtype]
        if self.entry.kind == "kvcache":
            keys = sum(self.key_lengths)
        elif self.entry.varlen is not None:
            keys = sum(self.entry.varlen)
        else:
            keys = self.batch * self.seqlen_k
        return float(keys * self.heads_kv * (self.head_dim + self.head_dim_v) * size)

    # ---- custom bias
    def _bias_problems(self) -> list[str]:
        problems = self.bias.problems()
        if self.bias.dtype == "fp32" and self.dtype == "fp32":
            problems.append("bias_dtype 'fp32' is for bf16/fp16 inputs (an fp32 case's bias is fp32 already)")
        if self.bias.present and self.entry.varlen is not None and self.bias.kind in BIAS_KINDS:
            if math.prod(self.bias_shape) > MAX_PACKED_BIAS:
                problems.append(
                    f"a varlen bias is packed over all tokens (total_q x total_k x heads): at most "
                    f"{MAX_PACKED_BIAS} elements (its float64 dBias in the reference is 8 bytes each)"
                )
        return problems

    @property
    def has_bias(self) -> bool:
        return self.bias.present

    @property
    def bias_shape(self) -> tuple[int, int, int, int]:
        """The custom bias tensor's shape, its broadcast dims 1. A varlen case's is packed:
        (1, heads or 1, all query tokens, all key tokens), each sequence's block on its own rows
        and keys (cu_seqlens), the rest unused."""
        broadcast = BIAS_BROADCAST.get(self.bias.kind, "")
        heads = 1 if "h" in broadcast else self.heads_q
        if self.entry.varlen is not None:
            return 1, heads, sum(self.entry.varlen), sum(self.keys_varlen)
        return 1 if "b" in broadcast else self.batch, heads, self.seqlen_q, self.seqlen_k

    @property
    def has_float_bias(self) -> bool:
        return self.bias.is_float

    @property
    def has_bool_bias(self) -> bool:
        return self.bias.is_bool

    @property
    def keys_varlen(self) -> tuple[int, ...] | None:
        """The varlen key lengths: varlen_k where given, else the query lengths."""
        return self.entry.keys_varlen

    @property
    def has_window(self) -> bool:
        return self.masking.has_window

    @property
    def is_gqa(self) -> bool:
        return self.heads_q != self.heads_kv

    @property
    def has_fully_masked_rows(self) -> bool:
        """Some query row may see no key (bottom-right alignment, as gate.attention.masks): its output must be 0.

        Row i sees keys [i + off - left, i + off + right] with off = seqlen_k - seqlen_q. The last
        row always sees key seqlen_k - 1, so only the first rows can be empty: when off + right < 0
        (varlen sequences have off = 0 and never are)."""
        if self.bias.kind == "bool_empty_rows":  # empty rows on purpose
            return True
        right = self.window[1]
        if self.causal:
            right = 0 if right < 0 else min(right, 0)
        if right < 0:
            return False
        if self.entry.kind == "kvcache":  # per batch element: its own key count against seqlen_q
            return min(self.key_lengths) - self.seqlen_q + right < 0
        if self.entry.varlen is not None:  # per sequence (keys may differ from queries)
            return any(nq and nk - nq + right < 0 for nq, nk in zip(self.entry.varlen, self.keys_varlen))
        return self.seqlen_k - self.seqlen_q + right < 0

    @property
    def mask_alignment_matters(self) -> bool:
        """A causal mask, a window or ALiBi over some sequence whose query and key counts differ,
        where a mask aligned bottom-right (the gate's) and one aligned top-left differ."""
        left, right = self.window
        if self.causal:
            right = 0 if right < 0 else min(right, 0)
        if left < 0 and right < 0 and not self.alibi:
            return False
        if self.entry.kind == "kvcache":
            pairs = [(self.seqlen_q, nk) for nk in self.key_lengths]
        elif self.entry.varlen is not None:
            pairs = list(zip(self.entry.varlen, self.keys_varlen))
        else:
            pairs = [(self.seqlen_q, self.seqlen_k)]
        return any(_alignment_matters(nq, nk, left, right, self.alibi) for nq, nk in pairs)

    @property
    def id(self) -> str:
        """Stable and readable: e.g. `bf16-b2-h16-s2048-d128-causal`. A part at its defaults adds nothing."""
        parts = [self.dtype, f"b{self.batch}"]
        parts.append(f"h{self.heads_q}" + (f"/{self.heads_kv}" if self.is_gqa else ""))
        parts.append(f"s{self.seqlen_q}" + (f"x{self.seqlen_k}" if self.seqlen_k != self.seqlen_q else ""))
        parts.append(f"d{self.head_dim}" + (f"/{self.head_dim_v}" if self.head_dim_v != self.head_dim else ""))
        if self.causal:
            parts.append("causal")
        if self.has_window:
            parts.append(f"win{self.window[0]}.{self.window[1]}")
        if self.softcap:
            parts.append(f"cap{_num(self.softcap)}")
        if self.alibi:
            parts.append("alibi")
        if self.dropout_p:
            parts.append(f"drop{_num(self.dropout_p)}")
        e = self.entry
        if e.varlen is not None:
            parts.append(
                "varlen"
                + ".".join(str(n) for n in e.varlen)
                + ("" if e.varlen_k is None else "x" + ".".join(str(n) for n in e.varlen_k))
            )
        parts += self._entry_id_parts()
        if self.layout != "contiguous":
            parts.append(self.layout)
        if self.inputs != "normal":
            parts.append(self.inputs)
        if self.has_bias:  # e.g. bias.dense, bias.dense.fp32.grad
            parts.append(
                ".".join(
                    ["bias", self.bias.kind]
                    + ([self.bias.dtype] if self.bias.dtype else [])
                    + (["grad"] if self.bias.grad else [])
                )
            )
        return "-".join(parts)

    def _entry_id_parts(self) -> list[str]:
        """The decode id parts; empty for default values."""
        parts = []
        e = self.entry
        if e.kind == "kvcache":
            parts.append("kv" + ("" if e.cache_seqlens is None else ".".join(str(n) for n in e.cache_seqlens)))
        if e.cache_new:
            parts.append("append")
        if e.page_size:
            parts.append(f"page{e.page_size}")
        if e.shuffled_pages:
            parts.append("shuffled")
        if e.sinks:
            parts.append("sinks")
        if e.nan_before_window:
            parts.append("nanleft")
        return parts + self.knobs.id_parts()

    def runs(self, check_names: tuple[str, ...] = ()) -> int:
        """Kernel runs per seed a sweep makes for this case: one, and about 10 more for each depth
        check (its own and `check_names`, run-wide)."""
        return 1 + 10 * len(set(self.checks) | set(check_names))

    def work(self, check_names: tuple[str, ...] = ()) -> float:
        """FLOPs of everything a sweep runs for this case: forward + backward on every seed, each
        run counted (`runs`). What shards are balanced on and case timeouts are sized by."""
        return (self.flops("fwd") + self.flops("bwd")) * len(self.seeds) * self.runs(check_names)

    @property
    def swept(self) -> bool:
        """Checked for correctness by sweeps (every case but a perf = "only" one)."""
        return self.perf != PERF_ONLY

    def flops(self, pass_: str = "fwd") -> float:
        """FLOPs counted as flash-attn's benchmarks do: fwd 4*B*H*Nq*Nk*D, halved for causal; bwd 2.5x."""
        if self.entry.kind == "kvcache":  # forward only; causal does not halve a decode step's work
            return 4.0 * self.heads_q * self.seqlen_q * sum(self.key_lengths) * (self.head_dim + self.head_dim_v) / 2
        if self.entry.varlen is not None:
            pairs = sum(nq * nk for nq, nk in zip(self.entry.varlen, self.keys_varlen))
            total = 4.0 * self.heads_q * pairs * (self.head_dim + self.head_dim_v) / 2
        else:
            total = (
                4.0 * self.batch * self.heads_q * self.seqlen_q * self.seqlen_k * (self.head_dim + self.head_dim_v) / 2
            )
        if self.causal:
            total /= 2
        return total * (2.5 if pass_ == "bwd" else 1.0)

    # --- serialisation ---
    def flat(self) -> dict[str, Any]:
        """Every field under its version 1 flat name (tuples as lists, as JSON has them)."""
        return {
            name: _plain(getattr(self if part is None else getattr(self, part), key))
            for name, (part, key) in FLAT_FIELDS.items()
        }

    def hash_dict(self) -> dict[str, Any]:
        """What suite_hash digests: version 1's flat form, later fields left out at their defaults.
        Kept apart from `to_dict` so the file format can change without moving any hash."""
        return {
            name: value
            for name, value in self.flat().items()
            if name not in FLAT_OMITTED_AT_DEFAULT or value != _plain(FLAT_OMITTED_AT_DEFAULT[name])
        }

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"schema_version": CASE_SCHEMA_VERSION}
        for name in PARTS:
            data[name] = {key: _plain(value) for key, value in asdict(getattr(self, name)).items()}
        for name in ("layout", "inputs", "seeds", "perf", "checks"):
            data[name] = _plain(getattr(self, name))
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Case":
        """A case dict of any readable version (`migrate_case`). A missing, unknown or
        mistyped field raises KeyError, TypeError or ValueError naming it."""
        data = migrate_case(data)
        unknown = sorted(set(data) - {"schema_version", *PARTS, "layout", "inputs", "seeds", "perf", "checks"})
        if unknown:
            raise TypeError(f"unknown case field {unknown[0]!r}")
        parts: dict[str, Any] = {}
        for name, kind in PARTS.items():
            fields = data.get(name, {}) if name != "shape" else data["shape"]
            if not isinstance(fields, dict):
                raise TypeError(f"case field {name!r} must be an object")
            parts[name] = kind(
                **{key: tuple(v) if (name, key) in _SEQUENCES and v is not None else v for key, v in fields.items()}
            )
        return cls(
            **parts,
            layout=data.get("layout", "contiguous"),
            inputs=data.get("inputs", "normal"),
            seeds=tuple(data.get("seeds", (0, 1))),
            perf=data.get("perf", False),
            checks=tuple(data.get("checks", ())),
        )


def migrate_case(data: dict[str, Any]) -> dict[str, Any]:
    """A case dict of an older version as the current one (see the format history above)."""
    if not isinstance(data, dict):
        raise TypeError(f"a case must be an object, not {type(data).__name__}")
    version = data.get("schema_version", 1)
    if version == CASE_SCHEMA_VERSION:
        return data
    if version != 1:
        raise ValueError(
            f"case schema_version {version!r} is not one this attn-gate reads (1 or {CASE_SCHEMA_VERSION})"
        )
    nested: dict[str, Any] = {"schema_version": CASE_SCHEMA_VERSION, **{name: {} for name in PARTS}}
    for name, value in data.items():
        if name == "schema_version":
            continue
        if name not in FLAT_FIELDS:
            raise TypeError(f"unknown case field {name!r}")
        part, key = FLAT_FIELDS[name]
        if part is None:
            nested[key] = value
        else:
            nested[part][key] = value
    return nested


@dataclass(frozen=True)
class Suite:
    name: str
    cases: tuple[Case, ...] = field(default_factory=tuple)
    source: str = ""

    @property
    def perf_cases(self) -> tuple[Case, ...]:
        return tuple(c for c in self.cases if c.perf)

    @property
    def swept_cases(self) -> tuple[Case, ...]:
        """The cases a sweep checks and a baseline holds correctness rows of (all but perf = "only")."""
        return tuple(c for c in self.cases if c.swept)

    def swept_hashes(self) -> dict[str, str]:
        """Each swept case's id -> case_hash: what a baseline's rows are checked against."""
        return {c.id: case_hash(c) for c in self.swept_cases}


def _pair(value: Any, sep: str, axis: str, where: str) -> tuple[int, int]:
    """Parse '97x257' / '16/4' / 128 into a pair (a single number means both equal)."""
    if isinstance(value, bool):
        raise UserError(f"{where}: axis {axis!r} value {value!r} is not a number")
    if isinstance(value, int):
        return value, value
    if isinstance(value, str):
        bits = value.split(sep)
        try:
            nums = [int(b) for b in bits]
        except ValueError:
            nums = []
        if len(nums) == 1:
            return nums[0], nums[0]
        if len(nums) == 2:
            return nums[0], nums[1]
    raise UserError(f"{where}: axis {axis!r} value {value!r} should look like 128 or '128{sep}64'")


def _window(value: Any, where: str) -> tuple[int, int]:
    if value is None or value == "none" or value == []:
        return (-1, -1)
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return int(value[0]), int(value[1])
    raise UserError(f"{where}: window value {value!r} should be [left, right] (-1 = unbounded) or 'none'")


def _checks(value: Any, where: str) -> tuple[str, ...]:
    """A `checks` axis value: a list of the depth-check (probe) names in CHECKS."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UserError(f'{where}: checks value {value!r} should be a list of check names, e.g. ["determinism"]')
    unknown = [v for v in value if v not in CHECKS]
    if unknown:
        raise UserError(f"{where}: unknown check {unknown[0]!r}; known checks: {', '.join(CHECKS)}")
    return tuple(dict.fromkeys(value))


def _knobs(value: Any, where: str) -> Knobs:
    """A `knobs` axis value: a table of KNOBS names, e.g. {num_splits = 3, pack_gqa = true}."""
    if not isinstance(value, dict):
        raise UserError(f"{where}: knobs value {value!r} should be a table, e.g. {{num_splits = 3}} or {{}}")
    unknown = sorted(set(value) - set(KNOBS))
    if unknown:
        raise UserError(f"{where}: unknown knob {unknown[0]!r}; known knobs: {', '.join(KNOBS)}")
    knobs = Knobs(**value)
    problems = knobs.problems()
    if problems:
        raise UserError(f"{where}: knobs {value!r}: {problems[0]}")
    return knobs


def _bias_part(point: dict[str, Any], where: str) -> Bias:
    """The bias axes of one matrix point as a Bias (names checked here, so a typo
    is a one-line error naming the suite, not a ValueError from deep inside)."""
    if point["bias"] not in BIAS_KINDS:
        raise UserError(f"{where}: bias value {point['bias']!r} should be one of {', '.join(BIAS_KINDS)}")
    if point["bias_dtype"] not in BIAS_DTYPES:
        raise UserError(f"{where}: bias_dtype value {point['bias_dtype']!r} should be one of {', '.join(BIAS_DTYPES)}")
    return Bias(
        kind=point["bias"],
        dtype=None if point["bias_dtype"] == "input" else point["bias_dtype"],
        grad=bool(point["bias_grad"]),
    )


# Axes whose values are plain scalars, with the types each value must have.
SCALAR_AXES: dict[str, tuple[type, ...]] = {
    "dtype": (str,),
    "batch": (int,),
    "causal": (bool,),
    "alibi": (bool,),
    "perf": (bool, str),
    "softcap": (int, float),
    "dropout_p": (int, float),
    "layout": (str,),
    "inputs": (str,),
    "bias": (str,),
    "bias_dtype": (str,),
    "bias_grad": (bool,),
    "entry": (str,),
    "cache_new": (bool,),
    "page_size": (int,),
    "shuffled_pages": (bool,),
    "sinks": (bool,),
    "nan_before_window": (bool,),
}
SCALAR_AXES_HINT = {
    "dtype": f"one of {', '.join(DTYPES)}",
    "batch": "an integer",
    "causal": "true or false",
    "alibi": "true or false",
    "perf": 'true, false or "only" (timed, not swept)',
    "softcap": "a number",
    "dropout_p": "a number in [0, 1)",
    "layout": f"one of {', '.join(LAYOUTS)}",
    "inputs": f"one of {', '.join(INPUTS)}",
    "bias": f"one of {', '.join(BIAS_KINDS)}",
    "bias_dtype": f"one of {', '.join(BIAS_DTYPES)}",
    "bias_grad": "true or false",
    "entry": f"one of {', '.join(ENTRIES)}",
    "cache_new": "true or false",
    "page_size": "an integer (0 = not paged)",
    "shuffled_pages": "true or false",
    "sinks": "true or false",
    "nan_before_window": "true or false",
}


# A suite larger than this is refused before it is expanded: a matrix of ~48M cases made
# every command hang. The nightly suite holds a few hundred; 20000 CPU-tiny cases take hours.
MAX_SUITE_CASES = 20_000


def block_size(block: dict[str, Any]) -> int:
    """How many cases a matrix block would expand to (the product of its axis lengths), without
    expanding it. A `pairwise = true` block is bounded instead by its number of value pairs
    (each all-pairs row covers at least one new pair), which is what its expansion can cost."""
    lengths = []
    for axis in MATRIX_AXES:
        values = block.get(axis, MATRIX_AXES[axis])
        lengths.append(len(values) if isinstance(values, list) else 1)
    size = 1
    for n in lengths:
        size *= n
    if block.get("pairwise") is True:
        pairs = sum(a * b for i, a in enumerate(lengths) for b in lengths[i + 1 :])
        size = min(size, max(pairs, max(lengths, default=1)))
    return size


def pairwise_points(sizes: list[int]) -> list[tuple[int, ...]]:
    """Index tuples covering every pair of values of every two axes at least once (all-pairs):
    far fewer than the product (the pr suite's blocks: dozens instead of thousands),
    and a bug that needs two settings together is still met. Greedy and deterministic: each new
    row starts from the first pair not yet covered, then takes, axis by axis, the value that
    covers most uncovered pairs with the values already chosen (ties: the value used least, then
    the first)."""
    n = len(sizes)
    uncovered = {
        (a, i, b, j) for a in range(n) for b in range(a + 1, n) for i in range(sizes[a]) for j in range(sizes[b])
    }
    used = [[0] * s for s in sizes]
    rows: list[tuple[int, ...]] = []
    if n == 1:
        return [(i,) for i in range(sizes[0])]
    while uncovered:
        a, i, b, j = min(uncovered)
        row: dict[int, int] = {a: i, b: j}
        for axis in range(n):
            if axis in row:
                continue

            def gain(v: int, axis: int = axis) -> tuple[int, int, int]:
                hits = sum(((x, row[x], axis, v) if x < axis else (axis, v, x, row[x])) in uncovered for x in row)
                return hits, -used[axis][v], -v

            row[axis] = max(range(sizes[axis]), key=gain)
        point = tuple(row[x] for x in range(n))
        for x in range(n):
            used[x][point[x]] += 1
            for y in range(x + 1, n):
                uncovered.discard((x, point[x], y, point[y]))
        rows.append(point)
    return rows


def expand_block(block: dict[str, Any], seeds: tuple[int, ...], where: str) -> list[Case]:
    """Expand one matrix block (axis -> list of values) into Cases, in a stable order: the
    cartesian product of its axes, or with `pairwise = true` an all-pairs cover."""
    block = dict(block)
    pairwise = block.pop("pairwise", False)
    if not isinstance(pairwise, bool):
        raise UserError(f"{where}: pairwise must be true or false, got {pairwise!r}")
    if "seeds" in block:  # a block may run fewer seeds than its suite (breadth over depth)
        seeds = block.pop("seeds")
        if (
            not isinstance(seeds, list)
            or not seeds
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in seeds)
        ):
            raise UserError(f"{where}: seeds must be a non-empty list of integers")
        seeds = tuple(seeds)
    unknown = sorted(set(block) - set(MATRIX_AXES))
    if unknown:
        raise UserError(f"{where}: unknown matrix axis {unknown[0]!r}; known axes: {', '.join(MATRIX_AXES)}")
    axes = {}
    for axis, default in MATRIX_AXES.items():
        values = block.get(axis, default)
        if not isinstance(values, list) or not values:
            raise UserError(f"{where}: axis {axis!r} must be a non-empty list, got {values!r}")
        kinds = SCALAR_AXES.get(axis)
        for value in values if kinds else ():
            # bool is an int in Python: `causal = ["false"]` or `batch = [true]` must not slip through.
            if (
                not isinstance(value, kinds)
                or (isinstance(value, bool) and bool not in kinds)
                or (axis == "perf" and isinstance(value, str) and value != PERF_ONLY)
            ):
                raise UserError(f"{where}: axis {axis!r} value {value!r} should be {SCALAR_AXES_HINT[axis]}")
        axes[axis] = values
    cases = []
    values = list(axes.values())
    if pairwise:
        combos = [tuple(values[x][i] for x, i in enumerate(p)) for p in pairwise_points([len(v) for v in values])]
    else:
        combos = list(itertools.product(*values))
    for combo in combos:
        point = dict(zip(axes, combo))
        seqlen_q, seqlen_k = _pair(point["seqlens"], "x", "seqlens", where)
        heads_q, heads_kv = _pair(point["heads"], "/", "heads", where)
        head_dim, head_dim_v = _pair(point["head_dims"], "/", "head_dims", where)
        varlen = point["varlen"]
        batch = point["batch"]
        checks = _checks(point["checks"], where)
        if varlen is not None:
            if (
                not isinstance(varlen, list)
                or not varlen
                or not all(isinstance(n, int) and not isinstance(n, bool) for n in varlen)
            ):
                raise UserError(f"{where}: varlen value {varlen!r} should be a non-empty list of sequence lengths")
            varlen = tuple(varlen)
            batch, seqlen_q, seqlen_k = len(varlen), max(varlen), max(varlen)
        cache_seqlens = point["cache_seqlens"]
        if cache_seqlens is not None:  # ragged cache lengths give the batch, as varlen does
            if (
                not isinstance(cache_seqlens, list)
                or not cache_seqlens
                or not all(isinstance(n, int) and not isinstance(n, bool) for n in cache_seqlens)
            ):
                raise UserError(
                    f"{where}: cache_seqlens value {cache_seqlens!r} should be a non-empty list of cached lengths"
                )
            cache_seqlens = tuple(cache_seqlens)
            batch = len(cache_seqlens)
        varlen_k = point["varlen_k"]
        if varlen_k is not None:
            if (
                varlen is None
                or not isinstance(varlen_k, list)
                or not all(isinstance(n, int) and not isinstance(n, bool) for n in varlen_k)
            ):
                raise UserError(
                    f"{where}: varlen_k value {varlen_k!r} should be a list of key lengths, one per varlen sequence"
                )
            varlen_k = tuple(varlen_k)
            seqlen_k = max(varlen_k) if varlen_k else 0
        try:
            cases.append(
                Case(
                    shape=Shape(
                        batch=batch,
                        seqlen_q=seqlen_q,
                        seqlen_k=seqlen_k,
                        heads_q=heads_q,
                        heads_kv=heads_kv,
                        head_dim=head_dim,
                        head_dim_v=head_dim_v,
                        dtype=point["dtype"],
                    ),
                    masking=Masking(
                        causal=bool(point["causal"]),
                        window=_window(point["window"], where),
                        softcap=float(point["softcap"]),
                        alibi=bool(point["alibi"]),
                        dropout_p=float(point["dropout_p"]),
                    ),
                    entry=Entry(
                        kind=point["entry"],
                        varlen=varlen,
                        varlen_k=varlen_k,
                        cache_seqlens=cache_seqlens,
                        cache_new=point["cache_new"],
                        page_size=point["page_size"],
                        shuffled_pages=point["shuffled_pages"],
                        sinks=point["sinks"],
                        nan_before_window=point["nan_before_window"],
                    ),
                    bias=_bias_part(point, where),
                    knobs=_knobs(point["knobs"], where),
                    layout=point["layout"],
                    inputs=point["inputs"],
                    seeds=seeds,
                    perf=point["perf"] if point["perf"] == PERF_ONLY else bool(point["perf"]),
                    checks=checks,
                )
            )
        except (TypeError, ValueError) as exc:
            raise UserError(f"{where}: invalid case {point}: {exc}") from None
    return cases


def expand_suite(name: str, spec: dict[str, Any], source: str, table: str = "suites") -> Suite:
    """`table` is where the suite sits in `source`, for messages: `suites` in suites.toml,
    `tool.attn-gate.suites` in pyproject.toml."""
    where = f"{source} [{table}.{name}]"
    unknown = sorted(set(spec) - {"seeds", "matrix", "description"})
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r}; a suite has 'seeds', 'matrix' and 'description'")
    seeds = spec.get("seeds", [0, 1])
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**32 for s in seeds)
    ):
        raise UserError(f"{where}: seeds must be a non-empty list of integers in [0, 2**32)")
    blocks = spec.get("matrix")
    if not isinstance(blocks, list) or not blocks:
        raise UserError(f"{where}: a suite needs at least one [[suites.{name}.matrix]] block")
    if any(not isinstance(b, dict) for b in blocks):
        raise UserError(
            f"{where}: matrix block {next(i for i, b in enumerate(blocks) if not isinstance(b, dict))} must be a table"
        )
    total = sum(block_size(b) for b in blocks)
    if total > MAX_SUITE_CASES:
        raise UserError(
            f"{where}: the matrix would expand to {total} cases, more than the cap of {MAX_SUITE_CASES} "
            f"(gate/core/cases.py MAX_SUITE_CASES); split it into smaller suites or list fewer axis values"
        )
    seen: dict[str, Case] = {}
    for i, block in enumerate(blocks):
        for case in expand_block(block, tuple(seeds), f"{where} matrix[{i}]"):
            prior = seen.get(case.id)
            # The same problem named twice is one case: timed if either copy is, swept if either
            # is, the checks of both run; its other fields (seeds) are a swept copy's, the timed
            # one's where both are swept (a timing-only copy never decides what a sweep runs).
            if prior is not None:
                checks = tuple(dict.fromkeys(prior.checks + case.checks))
                timed, swept = bool(prior.perf or case.perf), prior.swept or case.swept
                copies = [c for c in (prior, case) if c.swept] or [prior, case]
                base = next((c for c in reversed(copies) if c.perf), copies[0])
                case = replace(base, perf=PERF_ONLY if timed and not swept else timed, checks=checks)
            seen[case.id] = case
    return Suite(name=name, cases=tuple(seen.values()), source=source)


DEFAULT_SUITES_FILE = Path(__file__).with_name("suites.toml")


def default_suite_specs() -> dict[str, Any]:
    with DEFAULT_SUITES_FILE.open("rb") as fh:
        return tomllib.load(fh)["suites"]


def load_suite(name: str, overrides: dict[str, Any] | None = None, override_source: str = "pyproject.toml") -> Suite:
    """The named suite: a config override if there is one, else the packaged default."""
    overrides = overrides or {}
    if name in overrides:
        return expand_suite(name, overrides[name], override_source, "tool.attn-gate.suites")
    defaults = default_suite_specs()
    if name in defaults:
        return expand_suite(name, defaults[name], str(DEFAULT_SUITES_FILE.name))
    known = sorted(set(defaults) | set(overrides))
    raise UserError(
        f"unknown suite {name!r}; choose one of: {', '.join(known)} (or define [tool.attn-gate.suites.{name}])"
    )


def suite_names(overrides: dict[str, Any] | None = None) -> list[str]:
    return sorted(set(default_suite_specs()) | set(overrides or {}))


def case_hash(case: Case) -> str:
    """Changes when the case changes (what suite_hash digests, for one case): a baseline row
    remembers it, so rows of unchanged cases survive a change elsewhere in their suite."""
    return hashlib.sha256(json.dumps(case.hash_dict(), sort_keys=True).encode()).hexdigest()[:16]


def suite_hash(suite: Suite) -> str:
    """Changes when any case of the suite changes: a baseline from another suite is refused."""
    blob = json.dumps([c.hash_dict() for c in suite.cases], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def exact_regex(case_ids) -> str:
    """A regex `--only` matches exactly these ids with (re.search), and nothing else; readable (only
    regex metacharacters are escaped, so ids keep their dashes)."""
    special = set(".^$*+?{}[]\\|()")
    escaped = ("".join("\\" + ch if ch in special else ch for ch in c) for c in sorted(set(case_ids)))
    return "^(?:" + "|".join(escaped) + ")$"
