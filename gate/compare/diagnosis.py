"""What the failing cases of a verdict share: analysis of decided findings over case axes.

The pattern line (which tensors fail, counted against all failing cases; the trait every failing
case has and most passing cases lack; a derived trait or a numeric axis that separates them) is
computed here, from the verdict and the sweep, and printed as it is by the PR comment, the
terminal summary and the refusal to record a failing baseline (gate/report/). Pure: no torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gate.compare.findings import Quantity, Severity, Verdict
from gate.core.cases import Case
from gate.core.results import CaseResult, Status, SweepResult
from gate.kernels.capabilities import Feature, feature_needs


@dataclass(frozen=True)
class Diagnosis:
    """The failing cases of a verdict and what they share, for every report to print as it is."""

    failed: tuple[str, ...]  # case ids with a FAIL finding
    blocking: tuple[str, ...]  # case ids with a FAIL or INCONCLUSIVE finding
    pattern: str  # the pattern line; "" when no failing case is in the sweep

    @property
    def focus(self) -> tuple[str, ...]:
        """The cases the rerun is about: those that FAIL; INCONCLUSIVE ones (e.g. newly skipped)
        only when nothing fails. The pattern is about the FAIL ones alone."""
        return self.failed or self.blocking


def diagnose(verdict: Verdict, sweep: SweepResult) -> Diagnosis:
    failed = tuple(sorted({f.case_id for f in verdict.findings if f.severity is Severity.FAIL and f.case_id}))
    blocking = tuple(sorted({f.case_id for f in verdict.findings if f.severity.blocks and f.case_id}))
    results = {c.case_id: c for c in sweep.cases}
    # only failures have a pattern: an INCONCLUSIVE case (newly skipped, say) was not measured, and
    # its own line says why
    focus = [results[c] for c in failed if c in results]
    passing = [c.case for c in sweep.cases if c.case_id not in set(blocking) and c.status is Status.PASS]
    # what each failing case failed on, as the findings say (a headroom regression is within its bound)
    pattern = diagnosis(focus, passing, failing_names(verdict)) if focus else ""
    return Diagnosis(failed, blocking, pattern)


def case_traits(case: Case) -> dict[str, str]:
    """The readable traits a pattern line may name: name -> value."""
    traits = {
        "dtype": case.dtype,
        "causal": "causal" if case.causal else "not causal",
        "window": "windowed" if case.has_window else "no window",
        "head dim": f"head dim {case.head_dim}" + (f"/{case.head_dim_v}" if case.head_dim_v != case.head_dim else ""),
        "gqa": "grouped-query (GQA/MQA)" if case.is_gqa else "one KV head per query head",
        "lengths": "seqlen_q != seqlen_k" if case.seqlen_q != case.seqlen_k else "seqlen_q == seqlen_k",
        "decode": "one query (seqlen 1)" if case.seqlen_q == 1 else "more than one query",
        "varlen": "variable length" if case.entry.varlen is not None else "fixed length",
        "softcap": "softcap" if case.softcap else "no softcap",
        "alibi": "ALiBi" if case.alibi else "no ALiBi",
    }
    return traits


def derived_traits(case: Case) -> dict[str, bool]:
    """Traits a maintainer reads off a case id at once, as yes/no questions: head-dim classes a
    kernel's tiles care about, the q/k length order, the GQA group size, masked rows, the entry
    point, the layout and the input distribution. Phrased to follow "has a" / "is"."""
    group = case.heads_q // max(1, case.heads_kv)
    return {
        # the 32-wide class first: where several separate, the one of a kernel's usual block width
        "head dim not a multiple of 32": case.head_dim % 32 != 0,
        "head dim not a multiple of 64": case.head_dim % 64 != 0,
        "head dim not a multiple of 16": case.head_dim % 16 != 0,
        "seqlen_q < seqlen_k": case.seqlen_q < case.seqlen_k,
        "seqlen_q > seqlen_k": case.seqlen_q > case.seqlen_k,
        f"GQA group size {group}": True,
        "fully masked rows": case.has_fully_masked_rows,
        f"entry point {case.entry_point}": True,
        f"layout {case.layout}": True,
        f"{case.inputs} inputs": True,
    }


def separating_trait_name(failing: list[Case], passing: list[Case]) -> str | None:
    """The derived trait every failing case has and no passing case has, as "has ..." reads it
    ("fully masked rows", "a head dim not a multiple of 32"); None when there is none. The most
    specific wins (a multiple of 64 before one of 32 only when it alone separates)."""
    if not passing or not failing:
        return None
    have = [derived_traits(c) for c in failing]
    names = [name for name in have[0] if all(t.get(name) for t in have)]
    for name in names:
        if not any(derived_traits(c).get(name) for c in passing):
            return _article(name)
    return None


def separating_trait(failing: list[Case], passing: list[Case]) -> str | None:
    """The separating trait stated with its counts; None when there is none."""
    name = separating_trait_name(failing, passing)
    if name is None:
        return None
    who = "the failing case has" if len(failing) == 1 else f"every failing case ({len(failing)}) has"
    return f"{who} {name}; none of the {len(passing)} passing cases does"


# numeric axes a kernel's envelope is often bounded on: "head dim > 128", "seqlen_k > 4096"
THRESHOLD_AXES: dict[str, Callable[[Case], int]] = {
    "head dim": lambda c: c.head_dim,
    "head dim v": lambda c: c.head_dim_v,
    "seqlen_q": lambda c: c.seqlen_q,
    "seqlen_k": lambda c: c.seqlen_k,
}


def threshold_trait(failing: list[Case], passing: list[Case]) -> str | None:
    """A numeric axis on which every failing case lies past every passing one (a kernel that
    raises past head dim 128), stated with its counts; None when no axis separates so."""
    if not passing or not failing:
        return None
    n, p = len(failing), len(passing)
    who = "the failing case has" if n == 1 else f"every failing case ({n}) has"
    for name, value in THRESHOLD_AXES.items():
        f_values, p_values = [value(c) for c in failing], [value(c) for c in passing]
        if min(f_values) > max(p_values):
            return f"{who} {name} > {max(p_values)}; none of the {p} passing cases does"
        if max(f_values) < min(p_values):
            return f"{who} {name} < {min(p_values)}; none of the {p} passing cases does"
    return None


def _article(name: str) -> str:
    return (
        name
        if name[0].isdigit()
        or name.startswith(("GQA", "entry", "layout", "fully", "seqlen"))
        or name.endswith("inputs")
        else f"a {name}"
    )


NO_ANSWER = "no answer"  # what an ERROR row (a raise, crash or hang) is counted as


def failing_tensors(results: list[CaseResult], names: Mapping[str, set[str]] | None = None) -> str:
    """What the failing cases fail on, counted against ALL of them: "every failing case fails on dq
    (74 cases)", "dk in 42 of 65 failing cases; 23 fail otherwise (headroom, dq)"; empty when none
    names a tensor. `names`: case id -> what each failed on where the caller knows more than the
    row (a headroom regression within the bound, a failed check); default: the row's tensors over
    their bound (NaN included)."""
    from gate.compare.known import UNATTRIBUTED, failures_of
    from gate.core.config import ERROR_NAME

    counts: dict[str, int] = {}
    n = len(results)
    for r in results:
        over = set(names.get(r.case_id, set())) if names is not None else set()
        over |= {t.tensor for t in r.tensors if math.isnan(t.ratio) or t.ratio > 1}
        if not over and r.status.failed:
            over = set(failures_of(r))
        # an ERROR row measured nothing: it counts as "no answer", not as a tensor named "error"
        for name in {NO_ANSWER if x == ERROR_NAME else x for x in over} - {UNATTRIBUTED}:
            counts[name] = counts.get(name, 0) + 1
    if not counts:
        return ""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    if len(counts) == 1 and ranked[0][1] == n:
        name, _ = ranked[0]
        if name == NO_ANSWER:
            return f"no failing case gave an answer ({n} ERROR row{'s' * (n != 1)})"
        return f"every failing tensor is {name} ({n} case{'s' * (n != 1)})"
    parts = [f"{name} in {k} of {n}" if k != n else f"{name} in all {n}" for name, k in ranked[:4]]
    # the rest by name and count only: "of N failing cases" belongs to the four before
    more = "; also " + ", ".join(f"{name} in {k}" for name, k in ranked[4:]) if len(ranked) > 4 else ""
    return f"failing tensors: {', '.join(parts)} failing case{'s' * (n != 1)}{more}"


def failing_names(verdict: Verdict) -> dict[str, set[str]]:
    """Case id -> the tensors its blocking findings name (a headroom regression within its bound
    included): what the check failed each case on, for the pattern line's counts."""
    names: dict[str, set[str]] = {}
    for f in verdict.findings:
        if f.severity.blocks and f.case_id and f.subject.quantity in (Quantity.RATIO, Quantity.MEAN_RATIO):
            names.setdefault(f.case_id, set()).add(f.subject.item)
    return names


def diagnosis(failing: list[CaseResult], passing: list[Case], names: Mapping[str, set[str]] | None = None) -> str:
    """The pattern line: which tensors fail, then what the failing cases share."""
    tensors = failing_tensors(failing, names)
    pattern = shared_pattern([r.case for r in failing], passing)
    return "; ".join(p for p in (tensors, pattern) if p)


# yes/no traits a pattern may pair: "causal or windowed", "causal and seqlen_q != seqlen_k"
FLAGS: dict[str, Callable[[Case], bool]] = {
    "causal": lambda c: c.causal,
    "windowed": lambda c: c.has_window,
    "softcap": lambda c: bool(c.softcap),
    "ALiBi": lambda c: c.alibi,
    "variable length": lambda c: c.entry.varlen is not None,
    "GQA/MQA": lambda c: c.is_gqa,
    "seqlen_q != seqlen_k": lambda c: c.seqlen_q != c.seqlen_k,
}


def separating_flags(failing: list[Case], passing: list[Case]) -> tuple[str, ...]:
    """A yes/no trait every failing case has and no passing case does (("causal",)), else two that
    they have together (("causal", "seqlen_q != seqlen_k"): a causal mask right only at equal
    lengths); empty when neither separates."""
    if not passing or not failing:
        return ()

    def separates(names: tuple[str, ...]) -> bool:
        has = lambda c: all(FLAGS[n](c) for n in names)  # noqa: E731
        return all(map(has, failing)) and not any(map(has, passing))

    names = list(FLAGS)
    candidates = [(a,) for a in names] + [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    return next((c for c in candidates if separates(c)), ())


def separating_feature(failing: list[Case], passing: list[Case], others: list[Case] = ()) -> Feature | None:
    """A feature every failing case needs and no passing case does: declaring it false in the
    kernel's envelope SKIPs the failing cases and keeps every passing one. Of several, the one the
    fewest cases of the suite need (`others`: its cases, SKIP rows and those outside the run
    included), so `causal_seqlen_q_ne_k` before `seqlen_q_ne_k` or `causal`."""
    if not failing:
        return None
    needed = [feature_needs(c) for c in failing]
    used = [feature_needs(c) for c in passing]
    fits = [f for f in Feature if all(n[f] for n in needed) and not any(u[f] for u in used)]
    everyone = [feature_needs(c) for c in others]
    # equal counts: the later feature, a refinement of an earlier one
    return min(reversed(fits), key=lambda f: sum(n[f] for n in everyone), default=None)


def what_separates(failing: list[Case], passing: list[Case]) -> str | None:
    """What the failing cases alone have, in as few words as it takes: one yes/no trait
    ("causal"), else a derived one ("fully masked rows"), else two together; None if nothing."""
    flags = separating_flags(failing, passing)
    if len(flags) == 1:
        return flags[0]
    return separating_trait_name(failing, passing) or " and ".join(flags) or None


def shared_pattern(failing: list[Case], passing: list[Case]) -> str:
    """One line: what every failing case has (and most passing ones lack). Single traits first
    (the most specific: fewest passing cases share it), then a derived trait no passing case has
    (head dim not a multiple of 32, q < k ...), then pairs read as "a or b"."""
    if not failing:
        return ""
    n = len(failing)
    if not passing:
        return f"every measured case fails ({n}): nothing specific to a shape, dtype or mask"
    separated = separating_trait(failing, passing) or threshold_trait(failing, passing)
    traits_f = [case_traits(c) for c in failing]
    traits_p = [case_traits(c) for c in passing]
    found: list[tuple[int, str]] = []
    for key in traits_f[0]:
        values = {t[key] for t in traits_f}
        if len(values) == 1:
            value = values.pop()
            also = sum(1 for t in traits_p if t[key] == value)
            # a trait most passing cases share explains nothing ("one KV head per query head" for a
            # kernel that raises past head dim 128, when most cases of the suite are MHA anyway)
            if also <= len(passing) / 2:
                found.append((also, value))
    found.sort()
    # two boolean traits that together cover every failing case ("causal or windowed")
    best = None
    names = list(FLAGS)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if all(FLAGS[a](c) or FLAGS[b](c) for c in failing):
                also = sum(1 for c in passing if FLAGS[a](c) or FLAGS[b](c))
                if also <= len(passing) / 2 and (best is None or also < best[0]):
                    best = (also, f"{a} or {b}")
    flags = separating_flags(failing, passing)
    if separated and not (found and found[0][0] == 0):  # a derived trait alone separates; no plain one does
        return separated
    if len(flags) == 2 and not (found and found[0][0] == 0):
        who = "the failing case is" if n == 1 else f"every failing case ({n}) is"
        return f"{who} {' and '.join(flags)}; none of the {len(passing)} passing cases is both"
    if found and (best is None or found[0][0] <= best[0]):
        names = [v for also, v in found[:3] if also <= found[0][0] or also < len(passing) / 2]
        tail = f" ({found[0][0]} of {len(passing)} passing cases are {found[0][1]} too)" if passing else ""
        subject = f"all {n} failing cases are" if n != 1 else "the failing case is"
        return f"{subject} {' and '.join(names)}{tail}"
    if best is not None:
        return f"all {n} failing cases are {best[1]} ({best[0]} of {len(passing)} passing cases are too)"
    dtypes = sorted({c.dtype for c in failing})
    return f"no single trait: {n} failing cases across dtypes {', '.join(dtypes)}"
