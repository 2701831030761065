"""`[tool.attn-gate]` in pyproject.toml: declared once, typed, validated; unknown keys are errors.

Every section is a frozen dataclass; a wrong type or an unknown key raises a UserError that
names the file, the key and the fix. Missing file or section means the defaults.
"""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gate.core.cases import CHECKS, FP8_DTYPES, Suite, expand_suite, load_suite
from gate.core.envelope import check_supports
from gate.core.errors import UserError
from gate.core.jsonio import MAX_MULT, checked_name
from gate.core.patterns import bounded_regex
from gate.core.results import ALL_TENSORS

# dBias is dS summed over the bias's broadcast dims (batch, heads): an accumulation
# across tiles and heads like dQ's, so it takes dQ's multiplier. Sharing it (not a new
# `mult_dbias` key) keeps the tolerance dict, and every committed baseline, comparable.
MULT_OF = {"dbias": "dq"}


@dataclass(frozen=True)
class Range:
    """A numeric setting's valid range. An upper bound too: a threshold of 1e308 switches its rule
    off as surely as NaN does, and a count of 1e9 hangs the run."""

    lo: float
    hi: float
    lo_open: bool = False
    integer: bool = False

    def __contains__(self, value: float) -> bool:
        return (value > self.lo if self.lo_open else value >= self.lo) and value <= self.hi

    def text(self) -> str:
        kind = "an integer" if self.integer else "a number"
        return f"{kind} in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}]"


@dataclass(frozen=True)
class Setting:
    """A setting declared once, beside its field: what it means, its unit, and for a number its
    valid range and why the bound is where it is. The range check, the settings tables of
    docs/configuration.md (gate/core/settings_doc.py) and the meaning column of the report's
    thresholds all read it."""

    meaning: str
    unit: str = ""  # "%", "s", "x" (a factor), or "" (a count or a name)
    range: Range | None = None
    why: str = ""  # why the range's bound is there; required with a range

    def __post_init__(self) -> None:
        if (self.range is None) != (not self.why) or "|" in self.meaning + self.why:
            raise ValueError(f"setting {self.meaning!r}: a range needs its why, and no '|' (a table cell)")


def setting(default: Any, meaning: str, unit: str = "", range: Range | None = None, why: str = "") -> Any:
    """A dataclass field carrying its Setting (the field's metadata)."""
    return field(default=default, metadata={"setting": Setting(meaning, unit, range, why)})


def settings_of(section) -> dict[str, Setting]:
    """A section dataclass's declared settings, by field name, in declaration order."""
    return {f.name: f.metadata["setting"] for f in dataclasses.fields(section) if "setting" in f.metadata}


def _in_range(section) -> None:
    """Every declared range of a section's settings, checked (a ValueError naming the key)."""
    for name, declared in settings_of(section).items():
        bounds = declared.range
        if bounds is None:
            continue
        value = getattr(section, name)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if (
            not number
            or not math.isfinite(value)
            or value not in bounds
            or (bounds.integer and not isinstance(value, int))
        ):
            raise ValueError(f"{name} = {value!r} must be {bounds.text()}")


@dataclass(frozen=True)
class Profile:
    """What the main job runs on a machine of this kind."""

    kernel: str
    suite: str


# The bound gate/core/jsonio.py holds a recorded multiplier to, too.
MULT = Range(0, MAX_MULT, lo_open=True)
MULT_WHY = f"a multiplier of {MAX_MULT:g} already passes a planted bug"


# Below 1 a kernel exactly as accurate as PyTorch's in-dtype arithmetic fails; at 10 the mean bound
# is about the max bound (P's max error is a few times its mean), so the rule would add nothing.
MEAN_MULT = Range(1, 10)
MEAN_MULT_WHY = "below 1 a kernel as accurate as PyTorch's own arithmetic fails; at 10 the rule adds nothing"


def _mult(default: float, tensor: str, note: str = "") -> Any:
    return setting(default, f"the multiplier of the in-dtype error bound of {tensor}{note}", "x", MULT, MULT_WHY)


@dataclass(frozen=True)
class ToleranceConfig:
    """The tolerance rule's multipliers (gate/correctness/tolerance.py, docs/tolerance.md)."""

    mult_out: float = _mult(2.0, "`out`")
    mult_lse: float = _mult(2.0, "`lse`")
    # dQ accumulates across key tiles (atomics / split reductions), hence 3.
    mult_dq: float = _mult(3.0, "`dq`", ", and of `dbias` (both accumulate across tiles)")
    mult_dk: float = _mult(2.0, "`dk`")
    mult_dv: float = _mult(2.0, "`dv`")
    mult_dsink: float = _mult(3.0, "`dsink`", " (it sums over every row and batch element)")
    # fp32 only: the yardstick P is then itself exact to a few ulps, the same size as any
    # kernel's reduction-order noise, so mult alone fails correct kernels (measured on CPU,
    # 8 seeds: tiled dK ratio 1.07, torch's CPU kernel 1.52 at mult 2). A 1e-4 relative error
    # still exceeds the widened bound by far (measured ratio ~60 on out, ~75 on dK at d=64;
    # tests/test_rule.py).
    fp32_factor: float = setting(4.0, "an extra factor on every multiplier for float32 inputs", "x", MULT, MULT_WHY)
    # flash-attention's tests: mean <= 1.5 x the in-dtype reference's mean (3 for fp8, whose P is
    # rounded to fp8 before P @ V). The fp32 factor applies as to the max (reduction-order noise
    # is as large as P's own error there; measured: tiled's fp32 dV mean error ~6x P's).
    mean_mult: float = setting(
        1.5, "the multiplier of the in-dtype mean-error bound of every tensor", "x", MEAN_MULT, MEAN_MULT_WHY
    )
    mean_mult_fp8: float = setting(3.0, "the same for fp8 inputs (`e4m3`, `e5m2`)", "x", MEAN_MULT, MEAN_MULT_WHY)

    def __post_init__(self) -> None:
        # 0, negative, inf or nan would make every bound meaningless (pass or fail all); a
        # multiplier of 1e300 passes a planted causal bug.
        _in_range(self)

    def mult(self, tensor: str, dtype: str = "bf16") -> float:
        return getattr(self, f"mult_{MULT_OF.get(tensor, tensor)}") * (self.fp32_factor if dtype == "fp32" else 1.0)

    def mean_mult_of(self, input_dtype: str, yardstick_dtype: str) -> float:
        """The mean rule's multiplier: fp8's for fp8 inputs, times the fp32 factor where the
        yardstick is float32 (as `mult`: an fp32 case, and the LSE of every case)."""
        base = self.mean_mult_fp8 if input_dtype in FP8_DTYPES else self.mean_mult
        return base * (self.fp32_factor if yardstick_dtype == "fp32" else 1.0)

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class VerdictConfig:
    """Correctness thresholds of `attn-gate check` (see gate/compare/sweep_rules.py)."""

    headroom_factor: float = setting(
        1.5,
        "FAIL when a case's error / bound ratio grows by more than this factor ...",
        "x",
        Range(1, 10, lo_open=True),
        "a ratio that grew tenfold is a regression whatever the setting",
    )
    headroom_step: float = setting(
        0.1,
        "... and by more than this absolute step (also the noise floor of the improvement WARN)",
        "",
        Range(0, 0.5),
        "a PASS row's ratio is at most 1: a step near 1 is never exceeded",
    )
    improvement_factor: float = setting(
        2.0,
        "WARN (refresh the baseline) when a ratio shrinks by this factor or more (and the step)",
        "x",
        Range(1, 100, lo_open=True),
        "beyond it the improvement warning never fires",
    )

    def __post_init__(self) -> None:
        # nan compares False everywhere, and 1e308 is never exceeded: either would switch a rule off.
        _in_range(self)


PERCENT = Range(0, 100, lo_open=True)
# Rounds and timed calls bound the run's work: each round times every pass of every perf case.
ROUNDS = 1000


@dataclass(frozen=True)
class PerfConfig:
    """Speed thresholds and timing effort (see gate/speed/timing.py and gate/speed/rule.py)."""

    anchor: str = setting(
        "sdpa-cudnn",
        "what speed ratios are measured against: a kernel name, or `matmul` (a dense matmul of equal FLOPs)",
    )
    cpu_anchor: str = setting("sdpa-math", "the anchor on a machine without a GPU")
    # Only "matmul" (equal FLOPs), which runs every case: a fallback that may refuse would need a fallback.
    anchor_fallback: str = setting(
        "matmul",
        "the anchor of a case the anchor cannot run (e.g. the cuDNN anchor above head dim 128), so it is "
        'still timed: `matmul`, or `""` (such a case SKIPs)',
    )
    regression_pct: float = setting(
        2.0,
        "speed: FAIL when the whole confidence interval of a change is slower than this, OK when it lies "
        "within it, INCONCLUSIVE when it straddles (a re-run decides)",
        "%",
        PERCENT,
        "a kernel twice as slow fails whatever the setting",
    )
    # perf_counter on shared cores: per-round noise of 20% and more, so only large regressions
    # (a 3x slower pass) can be told from the noise.
    cpu_regression_pct: float = setting(
        25.0,
        "speed: the same limit for a run timed on a CPU",
        "%",
        Range(0, 1000, lo_open=True),
        "a CPU's timing noise needs a wider limit; 10x slower fails whatever the setting",
    )
    cross_host_regression_pct: float = setting(
        8.0,
        "speed: the limit, where larger than the device's, against a speed ratio timed on another host or an "
        "unknown one (`baseline update --perf` on the runner restores the device's)",
        "%",
        PERCENT,
        "ratios of one GPU class move up to +6.6% from host to host (H200s): less fails correct kernels",
    )
    noise_k: float = setting(
        3.0,
        "speed: a ratio's noise band is this many standard errors of its median",
        "",
        Range(0, 10, lo_open=True),
        "more would excuse any slowdown as noise",
    )
    alpha: float = setting(
        0.05,
        "speed: 1 - the confidence of each change's interval (0.05: 95%)",
        "",
        Range(0.0001, 0.5),
        "a smaller one is never reached with the rounds we run",
    )
    improvement_pct: float = setting(
        10.0,
        "speed: WARN when the whole interval is faster than the baseline by more than this",
        "%",
        PERCENT,
        "a ratio cannot shrink by more than 100%",
    )
    max_noise_pct: float = setting(
        5.0,
        "speed: `baseline update --perf` refuses a noise band above this, and a pass whose rounds cannot pass "
        "against themselves (`--accept-noisy` records them)",
        "%",
        PERCENT,
        "above it the noise rule (INCONCLUSIVE) never fires",
    )
    # fewer rounds than min_rounds is allowed: such a run is judged INCONCLUSIVE, by rule
    min_rounds: int = setting(
        7, "speed: INCONCLUSIVE below this many rounds", "", Range(3, ROUNDS, integer=True), "as `rounds`"
    )
    rounds: int = setting(
        15,
        "speed: interleaved kernel/anchor rounds per pass",
        "",
        Range(1, ROUNDS, integer=True),
        "bounded work: each round times every pass of every perf case",
    )
    calls_per_round: int = setting(
        5,
        "timed calls per kernel per round (the round's value is their median)",
        "",
        Range(1, 100, integer=True),
        "bounded work",
    )
    confirm_rounds: int = setting(
        30,
        "speed: rounds of the re-run that confirms a suspected slowdown, and of a baseline (0: none)",
        "",
        Range(0, ROUNDS, integer=True),
        "bounded work (0: no confirm run)",
    )
    warmup_s: float = setting(
        0.25, "warm-up by time, both kernels, before the first round", "s", Range(0, 60), "bounded work, per case"
    )
    cold_l2: bool = setting(True, "flush L2 (a buffer larger than L2) before every timed call")

    def __post_init__(self) -> None:
        # Each of these, out of range, would switch a speed rule off (nan/inf/0) instead of failing.
        _in_range(self)
        if self.anchor_fallback not in ("", "matmul"):
            raise ValueError(
                f'anchor_fallback = {self.anchor_fallback!r} must be "matmul" (time a case the anchor '
                f'cannot run against a matmul of equal FLOPs) or "" (such a case SKIPs)'
            )

    def anchor_for(self, device: str) -> str:
        return self.anchor if device == "cuda" else self.cpu_anchor

    def regression_pct_for(self, device: str) -> float:
        return self.regression_pct if device == "cuda" else self.cpu_regression_pct


# --- user kernel families -------------------------------------------------------

FAMILY_ENTRIES = ("dense", "varlen", "kvcache")
_CALLABLE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_FAMILY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class KernelFamily:
    """`[tool.attn-gate.kernels.NAME]`: one kernel's entry points, each 'package.module:function' in
    flash-attn's convention for it (dense: flash_attn_func, varlen: flash_attn_varlen_func, kvcache:
    flash_attn_with_kvcache). backward = false declares a forward-only (inference) kernel.
    `supports`: its declared envelope (gate/core/envelope.py SUPPORTS_KEYS), validated. A table
    named by a function itself (`[tool.attn-gate.kernels."pkg.mod:fn"]`) holds only `supports`:
    the envelope of `--kernel pkg.mod:fn`."""

    name: str
    dense: str | None = None
    varlen: str | None = None
    kvcache: str | None = None
    backward: bool = True
    supports: dict[str, Any] = field(default_factory=dict)

    def entry(self, name: str) -> str | None:
        return getattr(self, name)

    @property
    def declaration_only(self) -> bool:
        """The table of a plain `package.module:function`: an envelope, no entry points."""
        return not any(self.entry(e) for e in FAMILY_ENTRIES)

    @property
    def supports_table(self) -> str:
        return supports_table(self.name)


def supports_table(kernel: str) -> str:
    """The TOML table header of a kernel's declared envelope."""
    return f"[tool.attn-gate.kernels.{toml_key(kernel)}.supports]"


def toml_key(name: str) -> str:
    """`name` as one TOML key: quoted where it is no bare key (a `package.module:function`, a
    dotted family name), which TOML would otherwise read as several."""
    return name if _BARE_KEY.match(name) else f'"{name}"'


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _kernel_families(raw: Any, where: str) -> dict[str, KernelFamily]:
    if not isinstance(raw, dict):
        raise UserError(f"{where}: expected tables [tool.attn-gate.kernels.NAME]")
    families = {}
    keys = ("backward", *FAMILY_ENTRIES, "supports")
    for name, spec in raw.items():
        here = f"{where}.{toml_key(name)}"
        function = bool(_CALLABLE.match(name))  # the table of a plain --kernel package.module:function
        if not _FAMILY_NAME.match(name) and not function:
            raise UserError(
                f"{here}: a kernel name is letters, digits, '_', '-', '.' (no ':'), or a quoted "
                f'"package.module:function" holding only its supports table; rename the table'
            )
        if not isinstance(spec, dict):
            raise UserError(f"{here}: expected a table with {', '.join(keys)}")
        unknown = sorted(set(spec) - set(keys))
        if unknown:
            raise UserError(f"{here}: unknown key {unknown[0]!r}; known keys: {', '.join(keys)}")
        supports = check_supports(spec.get("supports", {}), f"{here}.supports")
        if function:
            extra = sorted(set(spec) - {"supports"})
            if extra:
                raise UserError(
                    f"{here}: the table of a function holds only its supports table, not {extra[0]!r}; "
                    f"name a family [tool.attn-gate.kernels.NAME] for entry points"
                )
            families[name] = KernelFamily(name=name, supports=supports)
            continue
        for entry in FAMILY_ENTRIES:
            value = spec.get(entry)
            if value is not None and not (isinstance(value, str) and _CALLABLE.match(value)):
                raise UserError(f"{here}: {entry} = {value!r} should name a function as 'package.module:function'")
        if not any(spec.get(e) for e in FAMILY_ENTRIES):
            raise UserError(f"{here}: names no entry point; give at least one of {', '.join(FAMILY_ENTRIES)}")
        backward = spec.get("backward", True)
        if not isinstance(backward, bool):
            raise UserError(f"{here}: backward = {backward!r} should be true or false")
        families[name] = KernelFamily(
            name=name,
            dense=spec.get("dense"),
            varlen=spec.get("varlen"),
            kvcache=spec.get("kvcache"),
            backward=backward,
            supports=supports,
        )
    return families


@dataclass(frozen=True)
class IsolationConfig:
    """Worker processes (gate/workflow/isolation.py): how long a case may take before its
    worker is killed and the case is an ERROR row. --case-timeout S replaces the per-case value."""

    case_timeout_s: float = setting(
        300.0,
        "a case's worker is killed after this (worker warm-up, compilation, the first CUDA call) ...",
        "s",
        Range(0, 86400, lo_open=True),
        "a day",
    )
    timeout_s_per_gflop: float = setting(
        0.05,
        "... plus this per GFLOP of forward+backward over its seeds",
        "s",
        Range(0, 60),
        "a CPU does ~20 GFLOP/s",
    )
    worker_start_timeout_s: float = setting(
        300.0,
        "a fresh worker must import torch and the kernel within this",
        "s",
        Range(0, 3600, lo_open=True),
        "an hour to import torch and the kernel",
    )

    def __post_init__(self) -> None:
        _in_range(self)


# The sections whose settings are declared (docs/configuration.md's tables list them in this order).
SECTIONS = {"tolerance": ToleranceConfig, "verdict": VerdictConfig, "perf": PerfConfig, "isolation": IsolationConfig}
# section.key -> its declaration, and -> its valid range (the numbers only)
SETTINGS: dict[str, Setting] = {f"{s}.{k}": d for s, cls in SECTIONS.items() for k, d in settings_of(cls).items()}
RANGES: dict[str, Range] = {k: d.range for k, d in SETTINGS.items() if d.range is not None}


# --- CI files written by `attn-gate init` -----------------------------------------

CI_LIST_KEYS = ("runner_labels", "protected")


@dataclass(frozen=True)
class CiConfig:
    """`[tool.attn-gate.ci]`: the parameters the workflow templates are rendered with
    (gate/workflow/init.py). `attn-gate init` writes them; `init --check` renders the templates
    of the installed attn-gate with them and compares. Empty means "not initialised"."""

    repository: str = ""  # OWNER/REPO: the runner guard admits this repository only
    runner_labels: tuple[str, ...] = ()  # the GPU runners' default labels (ATTN_GATE_RUNNER overrides)
    owners: str = ""  # CODEOWNERS owner of every protected path, e.g. @org/maintainers
    setup: str = ""  # the PR gate's install step (one shell line; makes .venv)
    setup_locked: str = ""  # the trusted jobs' install step
    ci_run: str = ""  # the hosted CPU job's command
    nightly_suite: str = "nightly"
    protected: tuple[str, ...] = ()  # paths that decide a verdict: CODEOWNERS and the report's warning
    docs: str = ""  # where the workflows' error messages send a reader


def _ci_section(raw: Any, where: str) -> CiConfig:
    if not isinstance(raw, dict):
        raise UserError(f"{where}: expected a table")
    fields = {f.name for f in dataclasses.fields(CiConfig)}
    unknown = sorted(set(raw) - fields)
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r}; known keys: {', '.join(sorted(fields))}")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key in CI_LIST_KEYS:
            if not (isinstance(value, list) and all(isinstance(v, str) and v for v in value)):
                raise UserError(f"{where}: {key} = {value!r} should be a list of non-empty strings")
            value = tuple(value)
        elif not isinstance(value, str):
            raise UserError(f"{where}: {key} = {value!r} should be a string")
        elif "\n" in value:  # each value is rendered into one line of a workflow
            raise UserError(f"{where}: {key} should be one line; chain commands with &&")
        values[key] = value
    return CiConfig(**values)


# --- known failures -------------------------------------------------------------

KNOWN_FAILURE_KEYS = ("kernel", "cases", "tensors", "reason", "link", "versions", "strict")
# what a row can fail on besides its tensors: the kernel raised (an ERROR row)
ERROR_NAME = "error"


@dataclass(frozen=True)
class KnownFailure:
    """`[[tool.attn-gate.known_failures]]`: an upstream bug the gate lives with, pytest's
    xfail(reason=, strict=) for a kernel. The decisions (KNOWN, XPASS, unmatched) are
    gate/compare/known.py's; this is the validated declaration.

    index    1-based position among the file's [[...known_failures]] blocks: how reports name it
    kernel   an fnmatch pattern on the kernel name ("fa2", "sdpa-*", "mypkg.attn:*")
    cases    a regular expression searched in case ids (as --only)
    tensors  the names it covers (a tensor, a check, or "error"); None covers any failure
    versions a PEP 440 specifier on the kernel_version the run records; None: every version"""

    index: int
    kernel: str
    cases: str
    reason: str
    link: str  # "" only for the project's own kernel (own_kernel): no upstream issue exists
    tensors: tuple[str, ...] | None = None
    versions: str | None = None
    strict: bool = False
    source: str = "pyproject.toml"

    @property
    def pattern(self) -> re.Pattern[str]:
        return re.compile(self.cases)

    @property
    def name(self) -> str:
        """How every report and error message names the entry."""
        return f"known_failures #{self.index} ({self.reason})"

    def covers(self, failure: str) -> bool:
        return self.tensors is None or failure in self.tensors


def known_failure_names() -> tuple[str, ...]:
    """What `tensors` may name: every tensor a row may measure, every check, and "error"."""

    return ALL_TENSORS + tuple(CHECKS) + (ERROR_NAME,)


def own_kernel(pattern: str, families: set[str] | frozenset[str]) -> bool:
    """Does a declaration's `kernel` name the project's own kernel (a `package.module:function`
    path, or a [tool.attn-gate.kernels.NAME] of the same file)? Its bug has no upstream issue to
    link to: the reason is the record, and `link` is optional."""
    return ":" in pattern or pattern in families


def _known_failures(
    raw: Any, path: Path, families: set[str] | frozenset[str] = frozenset()
) -> tuple[KnownFailure, ...]:
    where = f"{path} [[tool.attn-gate.known_failures]]"
    if not isinstance(raw, list):
        raise UserError(f"{where}: expected an array of tables: write each entry as [[tool.attn-gate.known_failures]]")
    names = known_failure_names()
    entries = []
    for index, spec in enumerate(raw, start=1):
        here = f"{where} #{index}"
        if not isinstance(spec, dict):
            raise UserError(f"{here}: expected a table with keys {', '.join(KNOWN_FAILURE_KEYS)}")
        unknown = sorted(set(spec) - set(KNOWN_FAILURE_KEYS))
        if unknown:
            raise UserError(f"{here}: unknown key {unknown[0]!r}; known keys: {', '.join(KNOWN_FAILURE_KEYS)}")
        for key, what in (
            ("kernel", 'a kernel name or fnmatch pattern, e.g. "fa2" or "sdpa-*"'),
            ("cases", "a regular expression searched in case ids, as --only"),
            ("reason", "one line saying what is wrong upstream"),
            (
                "link",
                "the upstream issue or pull request, https://... (a declaration for the project's own "
                "kernel, a [tool.attn-gate.kernels.NAME] or a package.module:function, may leave it out)",
            ),
        ):
            value = spec.get(key)
            if (
                key == "link"
                and value is None
                and isinstance(spec.get("kernel"), str)
                and own_kernel(spec["kernel"], families)
            ):
                continue  # the project's own kernel: no upstream to link to
            if not isinstance(value, str) or not value.strip():
                raise UserError(
                    f"{here}: {key} is required: {what}"
                    if value is None
                    else f"{here}: {key} = {value!r} should be {what}"
                )
        try:
            bounded_regex(spec["cases"])
        except ValueError as exc:
            raise UserError(f"{here}: cases = {spec['cases'][:200]!r} {exc}") from None
        if "link" in spec and not re.match(r"^https?://\S+$", spec["link"]):
            raise UserError(
                f"{here}: link = {spec['link']!r} should be the upstream issue or pull request URL (https://...)"
            )
        tensors = spec.get("tensors")
        if tensors is not None:
            if not (isinstance(tensors, list) and tensors and all(isinstance(t, str) for t in tensors)):
                raise UserError(
                    f"{here}: tensors = {tensors!r} should be a non-empty list of names "
                    f"(leave the key out to cover any failure of the case)"
                )
            bad = [t for t in tensors if t not in names]
            if bad:
                raise UserError(f"{here}: tensors names {bad[0]!r}; known names: {', '.join(names)}")
            tensors = tuple(dict.fromkeys(tensors))
        versions = spec.get("versions")
        if versions is not None:
            if not isinstance(versions, str):
                raise UserError(
                    f'{here}: versions = {versions!r} should be a PEP 440 specifier string, e.g. ">=2.8,<2.8.4"'
                )
            from packaging.specifiers import InvalidSpecifier, SpecifierSet

            try:  # contains() parses each version of the specifier: a 5,000-digit one is a ValueError there
                if len(versions) > 200:
                    raise InvalidSpecifier(versions)
                SpecifierSet(versions, prereleases=True).contains("0")
            except (InvalidSpecifier, ValueError):
                raise UserError(
                    f'{here}: versions = {versions!r} is not a PEP 440 specifier; write e.g. ">=2.8,<2.8.4"'
                ) from None
        strict = spec.get("strict", False)
        if not isinstance(strict, bool):
            raise UserError(f"{here}: strict = {strict!r} should be true or false")
        entries.append(
            KnownFailure(
                index=index,
                kernel=spec["kernel"],
                cases=spec["cases"],
                reason=spec["reason"].strip(),
                link=spec.get("link", ""),
                tensors=tensors,
                versions=versions,
                strict=strict,
                source=str(path),
            )
        )
    return tuple(entries)


@dataclass(frozen=True)
class Config:
    source: str = "defaults"
    gpu: Profile = field(default_factory=lambda: Profile(kernel="sdpa-flash", suite="pr"))
    cpu: Profile = field(default_factory=lambda: Profile(kernel="sdpa-cpu", suite="smoke"))
    baselines_dir: str = "baselines"
    tolerance: ToleranceConfig = field(default_factory=ToleranceConfig)
    verdict: VerdictConfig = field(default_factory=VerdictConfig)
    perf: PerfConfig = field(default_factory=PerfConfig)
    suites: dict[str, Any] = field(default_factory=dict)
    isolation: IsolationConfig = field(default_factory=IsolationConfig)
    kernels: dict[str, KernelFamily] = field(default_factory=dict)
    known_failures: tuple[KnownFailure, ...] = ()
    ci: CiConfig = field(default_factory=CiConfig)
    section: bool = False  # the file has [tool.attn-gate] (`attn-gate init` wrote it), not only defaults
    # the suites expanded from this config, by name: the config is frozen, so each is expanded once
    _suites: dict[str, Suite] = field(default_factory=dict, init=False, repr=False, compare=False)

    def suite(self, name: str) -> Suite:
        """The named suite as this config defines it (an override, else the packaged default),
        expanded on first use and kept."""
        if name not in self._suites:
            self._suites[name] = load_suite(name, self.suites, self.source)
        return self._suites[name]

    def profile(self, device: str) -> Profile:
        return self.gpu if device == "cuda" else self.cpu

    def profile_key(self, device: str, key: str) -> str:
        """Where a profile's value comes from, for a message: `FILE [tool.attn-gate.cpu] kernel`."""
        name = "gpu" if device == "cuda" else "cpu"
        return (
            f"{self.source} [tool.attn-gate.{name}] {key}" if self.source != "defaults" else f"the default {name} {key}"
        )


def _section(cls, raw: Any, where: str):
    if not isinstance(raw, dict):
        raise UserError(f"{where}: expected a table")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r}; known keys: {', '.join(sorted(fields))}")
    values = {}
    defaults = cls() if all(f.default is not dataclasses.MISSING for f in fields.values()) else None
    for key, value in raw.items():
        expected = type(getattr(defaults, key)) if defaults is not None else str
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise UserError(f"{where}: {key} = {value!r} should be a {expected.__name__}")
        values[key] = value
    try:
        return cls(**values)
    except ValueError as exc:  # the section's own range checks (__post_init__)
        raise UserError(f"{where}: {exc}") from None


def _check_suites(suites: dict[str, Any], path: Path) -> dict[str, Suite]:
    """Expand every suite the file defines now, so a bad matrix is reported against this file
    (and before any work), not later under a default name or only when that suite is run; the
    expanded suites, by name, for the config to keep."""
    expanded = {}
    for name, spec in suites.items():
        try:  # a suite's name becomes part of file names (sweep-K-SUITE.json, baselines/...)
            checked_name(name, "suite name")
        except ValueError as exc:
            raise UserError(f"{path} [tool.attn-gate.suites]: {exc}; rename the table") from None
        if not isinstance(spec, dict):
            raise UserError(
                f"{path} [tool.attn-gate.suites.{name}]: expected a table with 'seeds' and [[matrix]] blocks"
            )
        expanded[name] = expand_suite(name, spec, str(path), "tool.attn-gate.suites")
    return expanded


def _beside(config_file: Path, folder: str) -> str:
    """A relative path in the config is relative to the config file's folder, not to where the
    command runs (`--config ../x/pyproject.toml` found no baseline and suggested a second one)."""
    return folder if Path(folder).is_absolute() else str(config_file.parent / folder)


def load_config(path: Path | None = None) -> Config:
    """Read [tool.attn-gate] from `path` (default ./pyproject.toml); defaults when absent."""
    path = Path(path) if path is not None else Path("pyproject.toml")
    if not path.is_file():
        if path.name != "pyproject.toml" or path.parent != Path("."):
            raise UserError(f"--config {path}: no such file")
        return Config()
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as exc:  # a binary file is not UTF-8
        raise UserError(
            f"{path}: invalid TOML ({str(exc)[:200]}); fix the file or pass another with --config"
        ) from None
    except OSError as exc:
        raise UserError(f"{path}: cannot be read ({exc.strerror or exc}); pass a readable --config file") from None
    tool = data.get("tool", {})
    if not isinstance(tool, dict):
        raise UserError(
            f"{path}: tool = {str(tool)[:40]} should be a table ([tool.attn-gate] lives under [tool]); fix the file"
        )
    raw = tool.get("attn-gate")
    if raw is None:
        return Config(source=str(path), baselines_dir=_beside(path, Config().baselines_dir))
    where = f"{path} [tool.attn-gate]"
    if not isinstance(raw, dict):
        raise UserError(
            f"{where}: attn-gate = {str(raw)[:40]} should be a table; write the settings under [tool.attn-gate]"
        )
    known = {
        "gpu",
        "cpu",
        "baselines_dir",
        "tolerance",
        "verdict",
        "perf",
        "suites",
        "isolation",
        "kernels",
        "known_failures",
        "ci",
    }
    unknown = sorted(set(raw) - known)
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r}; known keys: {', '.join(sorted(known))}")
    base = Config()
    profiles = {}
    for name in ("gpu", "cpu"):
        section = raw.get(name, {})
        merged = {**dataclasses.asdict(getattr(base, name)), **section} if isinstance(section, dict) else section
        profiles[name] = _section(Profile, merged, f"{where}.{name}")
    suites = raw.get("suites", {})
    if not isinstance(suites, dict):
        raise UserError(f"{where}.suites: expected tables [tool.attn-gate.suites.NAME]")
    expanded = _check_suites(suites, path)
    baselines_dir = raw.get("baselines_dir", base.baselines_dir)
    if not isinstance(baselines_dir, str):
        raise UserError(f"{where}: baselines_dir should be a path string")
    config = Config(
        source=str(path),
        gpu=profiles["gpu"],
        cpu=profiles["cpu"],
        baselines_dir=_beside(path, baselines_dir),
        tolerance=_section(ToleranceConfig, raw.get("tolerance", {}), f"{where}.tolerance"),
        verdict=_section(VerdictConfig, raw.get("verdict", {}), f"{where}.verdict"),
        perf=_section(PerfConfig, raw.get("perf", {}), f"{where}.perf"),
        suites=suites,
        kernels=_kernel_families(raw.get("kernels", {}), f"{where}.kernels"),
        isolation=_section(IsolationConfig, raw.get("isolation", {}), f"{where}.isolation"),
        known_failures=_known_failures(raw.get("known_failures", []), path, set(raw.get("kernels", {}) or {})),
        ci=_ci_section(raw.get("ci", {}), f"{where}.ci"),
        section=True,
    )
    config._suites.update(expanded)  # what Config.suite would expand again: load_suite's arguments
    return config


def known_failures_in(text: str, path: Path) -> tuple[KnownFailure, ...]:
    """The [[tool.attn-gate.known_failures]] of a pyproject's text, validated as load_config does
    (`baseline update --known` checks the file it is about to write)."""
    try:
        raw = tomllib.loads(text).get("tool", {}).get("attn-gate", {})
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: invalid TOML ({exc})") from None
    kernels = raw.get("kernels", {})
    return _known_failures(raw.get("known_failures", []), path, set(kernels) if isinstance(kernels, dict) else set())
