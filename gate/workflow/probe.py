"""`attn-gate probe`: find a kernel's envelope by calling it on tiny inputs along each axis.

Each call runs in a worker process with a timeout (gate/workflow/isolation.py: one worker reused
while it answers or raises, a fresh one after a crash, a hang, a CUDA fault or a changed process
state) and is judged like a gate case, against the float64 reference with the tolerance rule. What
an outcome means:

    PASS            runs and is right                      -> inside
    FAIL            runs and is WRONG                      -> inside, and printed as a finding:
                                                              the gate, not the envelope, judges it
    ERROR           raises, crashes or hangs (timeout)     -> outside: the axis goes into the declaration
    SKIP            the adapter refuses it (its signature)  -> nothing to declare

`trials` lists the calls, `derive` turns their outcomes into a declaration (pure, tested with
tables), `probe` runs them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from gate.core.cases import BIAS_KINDS, DTYPES, LAYOUTS, Case
from gate.core.config import Config, KernelFamily, load_config
from gate.core.envelope import render_supports
from gate.core.errors import UserError
from gate.core.jsonio import write_text_atomic
from gate.report.failures import ratio_text
from gate.workflow.isolation import worker_pool

HEAD_DIMS = (16, 32, 40, 64, 72, 80, 96, 128, 160, 192, 256)
SEQLENS = (17, 64, 100, 128, 192, 256, 1024)
BASE_DTYPES = ("bf16", "fp16", "fp32")  # the first that runs, in DTYPES order, is the dtype of every other trial
MULTIPLES = (256, 128, 64, 32, 16, 8, 4, 2)
# far_rows and far_batch allocate tensors past 2^31 elements: not a tiny call, never probed (left in the envelope)
PROBED_LAYOUTS = tuple(x for x in LAYOUTS if x not in ("contiguous", "far_rows", "far_batch"))
BASE = dict(batch=1, seqlen_q=128, seqlen_k=128, heads_q=2, heads_kv=2, head_dim=64, head_dim_v=64, seeds=(0,))


class Outcome:
    OK, WRONG, UNSUPPORTED, REFUSED = "ok", "wrong", "unsupported", "refused"


@dataclass(frozen=True)
class Trial:
    """One probe call: the envelope key it informs, the value tried along it, and the case."""

    key: str
    value: Any
    case: Case


@dataclass(frozen=True)
class Result:
    trial: Trial
    outcome: str
    detail: str = ""  # the error's first line, or the worst tensor and its ratio

    def line(self) -> str:
        """The call as `probe` and `init --probe` show it while they run: `  unsupported gqa <case>  (why)`."""
        word = {Outcome.OK: "runs", Outcome.WRONG: "WRONG"}.get(self.outcome, self.outcome)
        return f"  {word:11} {self.trial.key} {self.trial.case.id}" + (f"  ({self.detail})" if self.detail else "")


@dataclass(frozen=True)
class ProbeReport:
    kernel: str
    table: str  # the TOML table the declaration belongs in
    supports: dict[str, Any]
    findings: tuple[str, ...]
    results: tuple[Result, ...]

    @property
    def outside(self) -> int:
        """Calls that raised, crashed or hung: each put its axis outside the envelope."""
        return sum(r.outcome == Outcome.UNSUPPORTED for r in self.results)

    def counts(self) -> str:
        """`54 calls, 0 unsupported, 1 wrong, 30 refused by its signature ...`: the refused ones
        are named, or a summary of 0 unsupported would contradict the lines shown as they ran."""
        refused = sum(r.outcome == Outcome.REFUSED for r in self.results)
        wrong = sum(r.outcome == Outcome.WRONG for r in self.results)
        return f"{len(self.results)} calls, {self.outside} unsupported, {wrong} wrong" + (
            f", {refused} refused by its signature (they SKIP, no declaration needed)" if refused else ""
        )

    def toml(self) -> str:
        return render_supports(self.supports, self.table.strip("[]"))


def base_case(dtype: str, **changes: Any) -> Case:
    return Case.build(**{**BASE, "dtype": dtype, **changes})


def dtype_trials(causal: bool = False) -> list[Trial]:
    return [Trial("dtypes", d, base_case(d, causal=causal)) for d in DTYPES]


def axis_trials(dtype: str, causal: bool = False) -> list[Trial]:
    """Every axis but the dtype, at `dtype` (one the kernel runs); each call causal where the
    kernel runs causal attention only."""
    c = lambda **kw: base_case(dtype, **{"causal": causal, **kw})  # noqa: E731
    trials = [Trial("head_dims", d, c(head_dim=d, head_dim_v=d)) for d in HEAD_DIMS]
    trials += [Trial("head_dim_v_differs", dv, c(head_dim_v=dv)) for dv in (32, 128)]
    trials += [Trial("gqa", f"4/{kv} heads", c(heads_q=4, heads_kv=kv)) for kv in (2, 1)]
    # causal at unequal lengths as well: a causal mask written for equal lengths (or aligned
    # top-left) raises or answers wrong only there
    trials += [
        Trial("seqlen_q_ne_k", "128x256", c(seqlen_k=256)),
        Trial("causal_seqlen_q_ne_k", "128x256 causal", c(seqlen_k=256, causal=True)),
    ]
    trials += [Trial("seqlens", n, c(seqlen_q=n, seqlen_k=n)) for n in SEQLENS]
    trials += [
        Trial("causal", True, c(causal=True)),
        Trial("window", (16, 0), c(window=(16, 0))),
        Trial("softcap", 30.0, c(softcap=30.0)),
        Trial("alibi", True, c(alibi=True)),
        Trial("dropout", 0.1, c(dropout_p=0.1)),
        Trial("sinks", True, c(sinks=True)),
        Trial("varlen", (128, 256), c(batch=2, seqlen_q=256, seqlen_k=256, varlen=(128, 256))),
    ]
    decode = dict(entry="kvcache", seqlen_q=1, seqlen_k=256, cache_seqlens=(200,), causal=True)
    trials += [Trial("kvcache", True, c(**decode)), Trial("paged", 16, c(**decode, page_size=16))]
    trials += [Trial("bias_kinds", k, c(bias=k)) for k in BIAS_KINDS if k != "none"]
    trials += [Trial("layouts", x, c(layout=x)) for x in PROBED_LAYOUTS]
    return trials


# ---------------------------------------------------------------- outcomes -> declaration (pure)


def _ran(results: list[Result]) -> list[Result]:
    return [r for r in results if r.outcome in (Outcome.OK, Outcome.WRONG)]


def derive_names(results: list[Result], everything: tuple) -> list | None:
    """A list key (dtypes, bias kinds, layouts): the values that ran, where some tried one did not
    (None: nothing to narrow). Refused values are the signature's business, not the declaration's."""
    tried = [r for r in results if r.outcome != Outcome.REFUSED]
    ran = {r.trial.value for r in _ran(results)}
    if len(ran) == len(tried):
        return None
    seen = {r.trial.value for r in results}  # values never tried (bias "none", layout far_rows) stay in
    return [x for x in everything if x in ran or x not in seen]


def derive_dims(results: list[Result]) -> Any:
    """head_dims: None (every tried dim ran), {max = M} (all up to M and none above), {min = m}, or the list."""
    tried = sorted(r.trial.value for r in results if r.outcome != Outcome.REFUSED)
    ran = sorted(r.trial.value for r in _ran(results))
    if ran == tried:
        return None
    if ran and ran == [d for d in tried if d <= ran[-1]]:
        return {"max": ran[-1]}
    if ran and ran == [d for d in tried if d >= ran[0]]:
        return {"min": ran[0]}
    return ran


def derive_lengths(results: list[Result]) -> tuple[dict[str, int], list[str]]:
    """max_seqlen (every length above the longest that ran failed) and seqlen_multiple (the largest
    power of two every length that ran is a multiple of, and no failing one is), with a finding
    when failures follow no such rule."""
    tried = sorted(r.trial.value for r in results if r.outcome != Outcome.REFUSED)
    ran = sorted(r.trial.value for r in _ran(results))
    out: dict[str, int] = {}
    if not ran or ran == tried:
        return out, []
    if any(n > ran[-1] for n in tried):
        out["max_seqlen"] = ran[-1]
    failed = [n for n in tried if n <= ran[-1] and n not in ran]
    if not failed:
        return out, []
    for m in MULTIPLES:
        if all(n % m == 0 for n in ran) and all(n % m for n in failed):
            out["seqlen_multiple"] = m
            return out, []
    return out, [
        f"lengths {', '.join(map(str, failed))} fail and {', '.join(map(str, ran))} run, by no multiple: "
        f"declare max_seqlen / seqlen_multiple by hand"
    ]


NAMED_KEYS = (("dtypes", DTYPES), ("bias_kinds", BIAS_KINDS), ("layouts", tuple(LAYOUTS)))
FEATURE_KEYS = (
    "head_dim_v_differs",
    "gqa",
    "seqlen_q_ne_k",
    "causal_seqlen_q_ne_k",
    "causal",
    "non_causal",
    "window",
    "softcap",
    "alibi",
    "dropout",
    "sinks",
    "varlen",
    "kvcache",
    "paged",
)
# what derive can write and a re-probe redoes; any other key of a declaration (max_batch_heads,
# devices ...) is the user's own statement, which a re-probe keeps. causal_seqlen_q_ne_k is both:
# the probe writes it where its causal call raises, but it also covers windows and ALiBi at unequal
# lengths, which the probe does not try, so a `false` already there stays.
PROBED_KEYS = frozenset(
    {k for k, _ in NAMED_KEYS} | {"head_dims", "max_seqlen", "seqlen_multiple"} | set(FEATURE_KEYS)
) - {"causal_seqlen_q_ne_k"}


ALIGNMENT = (
    " (the gate aligns a causal mask bottom-right, as flash-attn does: query i of Nq sees keys up to"
    " i + Nk - Nq; a mask aligned top-left answers otherwise wherever Nq != Nk: if that is its design,"
    " declare causal_seqlen_q_ne_k = false)"
)


def derive(results: list[Result], declared: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """The declaration the outcomes call for, and the findings (wrong answers, unexplained failures).
    `declared`: the table before the probe; a wrong answer it already declares away is said so."""
    by_key: dict[str, list[Result]] = {}
    for r in results:
        by_key.setdefault(r.trial.key, []).append(r)
    supports: dict[str, Any] = {}
    top_left = (declared or {}).get("causal_seqlen_q_ne_k") is False
    wrong = [r for r in results if r.outcome == Outcome.WRONG]
    findings, inherited = _wrong_plain_call(results, wrong)
    findings += [
        f"{r.trial.key} {_show(r.trial.value)}: runs but {r.detail}: "
        + (
            "declared causal_seqlen_q_ne_k = false, which stays"
            if top_left and r.trial.key == "causal_seqlen_q_ne_k"
            else "left in the envelope so the gate judges it"
            + (ALIGNMENT if r.trial.key == "causal_seqlen_q_ne_k" else "")
        )
        for r in wrong
        if r not in inherited
    ]
    for key, everything in NAMED_KEYS:
        names = derive_names(by_key.get(key, []), everything)
        if names is not None:
            supports[key] = names
    dims = derive_dims(by_key.get("head_dims", []))
    if dims is not None:
        supports["head_dims"] = dims
    lengths, unexplained = derive_lengths(by_key.get("seqlens", []))
    supports.update(lengths)
    findings += unexplained
    # the causal call at unequal lengths speaks of its mask's alignment only where a causal call
    # ran at equal lengths and a plain one at unequal lengths: else causal = false or
    # seqlen_q_ne_k = false says it
    if not (_ran(by_key.get("causal", [])) and _ran(by_key.get("seqlen_q_ne_k", []))):
        by_key.pop("causal_seqlen_q_ne_k", None)
    for key in FEATURE_KEYS:
        if any(r.outcome == Outcome.UNSUPPORTED for r in by_key.get(key, [])):
            supports[key] = False
    return supports, findings


def _wrong_plain_call(results: list[Result], wrong: list[Result]) -> tuple[list[str], list[Result]]:
    """Where the plain call (its dtype that of every other call) is wrong, every call built on it
    inherits that: one finding names them and the calls that run right, which differ from it in
    what is broken (a backward written for causal attention: only `causal` runs right). The causal
    call at unequal lengths keeps its own finding (its alignment note) where a causal one ran right."""
    plain = next((r for r in results if r.trial.key == "dtypes" and r.trial.value == plain_dtype(results)), None)
    if plain is None or plain.outcome != Outcome.WRONG:
        return [], []
    right = [r for r in results if r.outcome == Outcome.OK]
    causal_right = any(r.trial.key == "causal" for r in right)
    built = [
        r for r in wrong if r.trial.key != "dtypes" and not (causal_right and r.trial.key == "causal_seqlen_q_ne_k")
    ]
    siblings = [r for r in wrong if r.trial.key == "dtypes" and r is not plain]
    text = f"the plain call ({plain.trial.case.id}) runs but {plain.detail}"
    if siblings:
        text += f", as at {_by_key(siblings)}"
    if built:
        text += f", and so do {len(built)} calls built on it ({_by_key(built)})"
    text += f"; what runs right differs from it in: {_by_key(right)}" if right else "; no call runs right"
    return [text + ": left in the envelope so the gate judges it"], [plain, *siblings, *built]


def plain_dtype(results: list[Result]) -> str | None:
    """The dtype of the plain call, and so of every call along the other axes: the first of
    BASE_DTYPES that runs, in the order the dtype calls were made (DTYPES')."""
    return next(
        (r.trial.value for r in _ran(results) if r.trial.key == "dtypes" and r.trial.value in BASE_DTYPES), None
    )


def _by_key(results: list[Result], most: int = 8) -> str:
    """`head_dims 64, 128; causal; layouts k_sliced`: the calls' values grouped by their key, the
    first `most` keys named."""
    values: dict[str, list[str]] = {}
    for r in results:
        shown = values.setdefault(r.trial.key, [])
        if r.trial.value is not True and _show(r.trial.value) not in shown:
            shown.append(_show(r.trial.value))
    named = [f"{key} {', '.join(vs)}" if vs else key for key, vs in values.items()]
    return "; ".join(named[:most]) + (f"; and {len(named) - most} more keys" if len(named) > most else "")


def _show(value: Any) -> str:
    return "x".join(map(str, value)) if isinstance(value, tuple) else str(value)


# ---------------------------------------------------------------- running the trials


def outcome_of(trial: Trial, result) -> Result:
    """The gate's row of `trial` (a CaseResult, gate/core/results.py) as a probe outcome."""
    status = result.status.value
    if status == "PASS":
        return Result(trial, Outcome.OK)
    if status == "FAIL":
        worst = max(result.tensors, key=lambda t: t.ratio, default=None)
        # three digits: a ratio of 1.04 is a wrong answer, never "1x its bound"
        detail = f"{worst.tensor} is {ratio_text(worst.ratio)}x its bound" if worst is not None else result.reason
        return Result(trial, Outcome.WRONG, detail)
    if status == "SKIP":
        return Result(trial, Outcome.REFUSED, result.reason)
    return Result(trial, Outcome.UNSUPPORTED, (result.reason.splitlines() or [""])[0])


def no_plain_case(kernel: str, plain: list[Result]) -> str:
    """Why the probe stops: each distinct error once with the dtypes that met it, then the
    convention the gate calls a kernel in (a wrong convention is the usual cause)."""
    by_detail: dict[str, list[str]] = {}
    for r in plain:
        by_detail.setdefault(r.detail, []).append(str(r.trial.value))
    why = "; ".join(f"{', '.join(dtypes)}: {detail}" for detail, dtypes in by_detail.items())
    return (
        f"probe {kernel}: the kernel ran no plain case (b1 h2 s128 d64 in {', '.join(BASE_DTYPES)}, with or "
        f"without a causal mask): {why}; "
        "fix the kernel, or check its convention: the gate calls fn(q, k, v, softmax_scale=, causal=, ...) "
        "with q, k, v of shape (batch, seqlen, heads, head_dim), and a kernel of another takes a wrapper "
        '(`attn-gate docs kernels`, "A kernel in another convention")'
    )


def probe(
    kernel: str, config: Config, device: str, timeout: float = 60.0, progress: Callable[[Result], None] | None = None
) -> ProbeReport:
    """Probe `kernel` (a built-in, package.module:function, or a family of `config`) on `device`."""
    from gate.kernels.registry import kernel_entry  # imports the built-in adapters (torch)

    family = kernel_entry(kernel, config).family
    table = (family or KernelFamily(name=kernel)).supports_table
    declared = dict(family.supports) if family is not None else {}
    kept = {k: v for k, v in declared.items() if k not in PROBED_KEYS}
    if family is not None and family.declaration_only:
        family = None  # the function itself, with no declaration: the probe finds the true envelope
    elif family is not None:
        family = dataclasses.replace(family, supports={})
    results: list[Result] = []
    with worker_pool(kernel, device, 1, config.isolation, family) as pool:
        info = pool.kernel_info()
        if info.unavailable:
            raise UserError(f"kernel {kernel!r} is unavailable here: {info.unavailable}")
        if device not in info.devices:
            raise UserError(f"kernel {kernel!r} runs on {'/'.join(info.devices)}, not {device}; pass --device")

        def run(trials: list[Trial]) -> list[Result]:
            done = []
            for trial in trials:
                # a trial that raises is the kernel's answer, not a broken process: its worker (and
                # the kernel's compiles) serve the next trial unless the worker saw its state change
                row = pool.run_case(trial.case, config.tolerance, (), timeout, info.traits, keep_after_raise=True)
                done.append(outcome_of(trial, row))
                if progress is not None:
                    progress(done[-1])
            return done

        results += run(dtype_trials())
        base, causal_only = plain_dtype(results), False
        if base is None:
            # a kernel of causal attention only: the same calls with the mask, and if one runs, the
            # calls without it are the evidence for non_causal = false
            causal_calls = run(dtype_trials(causal=True))
            if plain_dtype(causal_calls) is not None:
                results = [Result(dataclasses.replace(r.trial, key="non_causal"), r.outcome, r.detail) for r in results]
                results += causal_calls
                base, causal_only = plain_dtype(causal_calls), True
        if base is None:
            raise UserError(no_plain_case(kernel, [r for r in results if r.trial.value in BASE_DTYPES]))
        results += run(axis_trials(base, causal=causal_only))
    supports, findings = derive(results, declared)
    supports = {**kept, **supports}  # what the probe found outranks a kept claim: a raise outranks it
    return ProbeReport(kernel=kernel, table=table, supports=supports, findings=tuple(findings), results=tuple(results))


# ---------------------------------------------------------------- writing the declaration


def _header(line: str) -> str:
    return "".join(line.split())


def with_declaration(text: str, report: ProbeReport, source: str) -> str:
    """`text` (a pyproject.toml) with the report's table replaced, or appended where it is absent."""
    block = report.toml()
    lines = text.splitlines(keepends=True)
    want = _header(report.table)
    start = next((i for i, line in enumerate(lines) if _header(line.split("#")[0]) == want), None)
    if start is None:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise UserError(f"{source}: invalid TOML ({exc}); fix it before --write") from None
        family = data.get("tool", {}).get("attn-gate", {}).get("kernels", {}).get(report.kernel, {})
        if isinstance(family, dict) and "supports" in family:
            raise UserError(
                f"{source}: {report.kernel}'s supports is written inline, not as the table {report.table}; "
                f"remove that supports line, then rerun with --write"
            )
        return text + ("" if text.endswith("\n") or not text else "\n") + "\n" + block
    end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
    tail = lines[end:]
    return "".join(lines[:start]) + block + ("\n" if tail else "") + "".join(tail)


def write_declaration(path, report: ProbeReport) -> None:
    """Put the declaration into `path`: checked as the gate will read it, then written atomically;
    never through a symlink (the write would replace the link, not the file it points to)."""
    from gate.kernels.registry import kernel_names

    if report.kernel in kernel_names():
        raise UserError(
            f"--write: {report.kernel!r} is a built-in kernel; its envelope is attn-gate's own and a table "
            f"of that name is refused; probe your own kernel (package.module:function or a family)"
        )
    path = Path(path)
    if path.is_symlink():
        raise UserError(f"--write: {path} is a symlink; write through the real file ({path.resolve()}) with --config")
    if not path.is_file():
        raise UserError(f"--write: no {path}; run `attn-gate init --probe` to create the section, or pass --config")
    new = with_declaration(path.read_text(encoding="utf-8"), report, str(path))
    with tempfile.TemporaryDirectory() as tmp:  # the new file must load, and hold exactly this declaration
        check = Path(tmp) / "pyproject.toml"
        check.write_text(new, encoding="utf-8")
        family = load_config(check).kernels.get(report.kernel)
    if family is None or family.supports != report.supports:
        raise UserError(
            f"--write: {path} would not read back as this declaration; add the table {report.table} by hand"
        )
    write_text_atomic(path, new)


def probe_for_init(
    root,
    kernel: str | None,
    family: str | None,
    entries: tuple,
    forward_only: bool,
    progress: Callable[[Result], None] | None = None,
) -> ProbeReport:
    """`attn-gate init --probe`: the declaration of the kernel init is about to write, probed in the
    repository root (where its modules import) on this machine's default device."""
    from gate.core.environment import default_device  # imports torch
    from gate.kernels.registry import kernel_names

    if kernel and kernel in kernel_names():
        raise UserError(
            f"--probe: {kernel!r} is a built-in kernel; its envelope is attn-gate's own (`attn-gate kernels`)"
        )
    name = family if entries else kernel
    kernels = {name: KernelFamily(name=name, **dict(entries), backward=not forward_only)} if entries else {}
    with contextlib.chdir(root):
        return probe(name, Config(kernels=kernels), default_device(), progress=progress)
