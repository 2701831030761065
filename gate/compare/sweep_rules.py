"""The correctness verdict: a fresh sweep against its committed baseline -> findings.

Pure decision code: plain values in, `Finding`s out (gate/compare/findings.py); no torch, no I/O. pandas
joins the current run with the baseline (outer joins on case id and on (case id, tensor)); every
decision is one of the small rule functions below, each tested with a table in
tests/test_verdict.py (a bad input fails, a good one passes).

The rules, with thresholds from [tool.attn-gate.verdict] (VerdictConfig), printed in every report:

    FAIL  tolerance      a tensor's error ratio > 1 (outside the bound), or not a number
    FAIL  mean_error     a tensor's mean error ratio > 1 within its max bound (a bias spread under it); a row
                         recorded before this rule is not judged by it, and the commands that read
                         results files refuse such a file (refuse_unjudged_by_mean)
    FAIL  status         a case FAILs or ERRORs now (whether or not it did in the baseline:
                         a baseline never turns a violation into a pass)
    FAIL  headroom       ratio > baseline x headroom_factor AND ratio - baseline > headroom_step:
                         the slow loosening a fixed tolerance never sees; the absolute step keeps
                         tiny ratios (0.01 -> 0.03: noise of a different CPU) from flaking
    INCONCLUSIVE  (fails closed: coverage or data lost is never a silent pass)
          nothing_measured  every case skipped: nothing validated
          newly_skipped     measured in the baseline, SKIPPED now (a kernel that dropped its softcap or
                            window_size keyword, SDPA's "No available kernel" after an upgrade): accept
                            the coverage loss on purpose with `attn-gate baseline update`
          removed_case      a baseline case of the same suite (equal suite_hash) missing from the run:
                            a truncated or edited results file (with a changed suite hash: WARN)
          tensor_dropped    a PASS case no longer measures a tensor the baseline had (e.g. its LSE)
          incomplete_pass   a PASS row without out/dq/dk/dv: run_case measures all four for every PASS,
                            so the row is corrupt; nothing shows the case is right, nothing shows it
                            is wrong (re-run the sweep)
    WARN  new_case / newly_measured / fixed
    WARN  improvement    baseline / ratio >= improvement_factor AND baseline - ratio > headroom_step:
                         refresh the baseline so the gate keeps its teeth
    WARN  env_drift      torch, driver, CUDA, GPU name or kernel version differ from the baseline's
    INFO  env_info, skipped (in both), out_of_scope, tensor_added
    OK    one per case compared and found within bound and baseline

Refused outright (UserError, exit 2), never compared: another GPU class, another suite or suite
hash, other tolerance multipliers, a results file holding a case id twice. Comparing a result with
itself never produces a relative finding (tests/test_verdict.py), so a passing result always
passes against itself.

For the perf verdict: produce Findings with subject `Subject.speed("fwd")` / `Subject.speed("bwd")`,
add them to `compare(...)`'s list, and reduce everything with `gate.compare.findings.decide`.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING, Any

import pandas as pd

from gate.compare.baselines import DRIFT_KEYS, INFO_KEYS, Baseline, env_values, remeasure_hint, update_command  # noqa: F401 - re-exported
from gate.compare.comparable import same, why_not_comparable
from gate.compare.findings import STATUS, Finding, Rule, Severity, Subject, Value, advised, fmt
from gate.compare.headroom import is_headroom_regression, is_large_improvement
from gate.compare.known import apply_known
from gate.core.errors import UserError
from gate.core.identity import Environment, RunKey, Scope
from gate.core.results import REQUIRED_TENSORS, required_tensors  # noqa: F401 - re-exported

if TYPE_CHECKING:
    from gate.core.config import Config, VerdictConfig
    from gate.core.results import CaseResult, SweepResult

MEASURED = ("PASS", "FAIL", "ERROR")
FAILED = ("FAIL", "ERROR")


def correctness_thresholds(cfg: "VerdictConfig") -> dict[str, float]:
    return {
        "tolerance_ratio": 1.0,
        "headroom_factor": cfg.headroom_factor,
        "headroom_step": cfg.headroom_step,
        "improvement_factor": cfg.improvement_factor,
    }


# ---------------------------------------------------------------- rules: one decision each


def rule_tolerance(case_id: str, tensor: str, ratio: float, base: float | None = None) -> Finding | None:
    """`base` (the baseline's ratio, when there is one) is only reported, never needed to fail."""
    if ratio <= 1.0:  # NaN compares False: fails closed
        return None
    return Finding(
        Rule.TOLERANCE,
        Severity.FAIL,
        case_id,
        Subject.ratio(tensor),
        base,
        ratio,
        1.0,
        f"{case_id}: {tensor} error is {fmt(ratio)} x its bound (must be <= 1)",
    )


def rule_mean_error(case_id: str, tensor: str, mean_ratio: float | None, ratio: float = 0.0) -> Finding | None:
    """A correctness rule of the run alone (no baseline): the mean of |K - G| over the elements the
    max is taken over, against mean_mult x the in-dtype reference's mean + its floor. Silent where
    the max `ratio` is above 1 (or NaN): that is rule_tolerance's FAIL, not said twice. None: a
    tensor recorded before the rule (not judged here; `refuse_unjudged_by_mean` keeps such files out)."""
    if mean_ratio is None or mean_ratio <= 1.0 or not ratio <= 1.0:  # a NaN mean ratio fails closed
        return None
    return Finding(
        Rule.MEAN_ERROR,
        Severity.FAIL,
        case_id,
        Subject.mean_ratio(tensor),
        None,
        mean_ratio,
        1.0,
        f"{case_id}: {tensor} mean error is {fmt(mean_ratio)} x its mean bound (must be <= 1)",
    )


def rule_status(case_id: str, base_status: str | None, cur_status: str, reason: str) -> Finding | None:
    if cur_status not in FAILED:
        return None
    if base_status == cur_status:
        how = f"still {cur_status.lower()}s (as in the baseline)"
    elif base_status in FAILED:
        how = f"{cur_status.lower()}s (baseline: {base_status})"
    else:
        how = f"newly {'fails' if cur_status == 'FAIL' else 'errors'}"
    return Finding(
        Rule.STATUS,
        Severity.FAIL,
        case_id,
        STATUS,
        base_status,
        cur_status,
        None,
        f"{case_id} {how}: {reason or 'no reason given'}",
    )


def rule_headroom(case_id: str, tensor: str, base: float, cur: float, factor: float, step: float) -> Finding | None:
    """Silent above ratio 1 (and for NaN): that is rule_tolerance's FAIL, not said twice."""
    if not math.isfinite(base) or not cur <= 1.0 or not is_headroom_regression(base, cur, factor, step):
        return None
    limit = max(base * factor, base + step)
    return Finding(
        Rule.HEADROOM,
        Severity.FAIL,
        case_id,
        Subject.ratio(tensor),
        base,
        cur,
        limit,
        f"{case_id}: {tensor} ratio grew {fmt(base)} -> {fmt(cur)} (limit {fmt(limit)}: "
        f"x{factor:g} and +{step:g}); headroom regression",
    )


def rule_improvement(case_id: str, tensor: str, base: float, cur: float, factor: float, step: float) -> Finding | None:
    if not math.isfinite(base) or not is_large_improvement(base, cur, factor, step):
        return None
    return Finding(
        Rule.IMPROVEMENT,
        Severity.WARN,
        case_id,
        Subject.ratio(tensor),
        base,
        cur,
        base / factor,
        **advised(
            f"{case_id}: {tensor} ratio improved {fmt(base)} -> {fmt(cur)} (/{factor:g} or better)",
            "; refresh the baseline so the gate keeps its teeth",
        ),
    )


def rule_case_presence(
    case_id: str,
    base_status: str | None,
    cur_status: str | None,
    reason: str,
    same_suite: bool = True,
    accept: str = "attn-gate baseline update",
) -> Finding | None:
    """A case that appeared, disappeared, stopped or started being measured, or got fixed.

    Lost coverage blocks (INCONCLUSIVE): a case measured in the baseline that is SKIPPED now, and,
    when the run is of the same suite (`same_suite`: equal suite hash), a baseline case missing
    from it. `accept` is the command that records the loss on purpose."""
    if base_status is None and cur_status is not None:
        return Finding(
            Rule.NEW_CASE,
            Severity.WARN,
            case_id,
            STATUS,
            None,
            cur_status,
            None,
            f"{case_id}: new case ({cur_status}), not in the baseline; add it with `{accept}`",
        )
    if cur_status is None and base_status is not None:
        if not same_suite:
            return Finding(
                Rule.REMOVED_CASE,
                Severity.WARN,
                case_id,
                STATUS,
                base_status,
                None,
                None,
                **advised(
                    f"{case_id}: in the baseline but not run; if it was removed on purpose", ", refresh the baseline"
                ),
            )
        return Finding(
            Rule.REMOVED_CASE,
            Severity.INCONCLUSIVE,
            case_id,
            STATUS,
            base_status,
            None,
            None,
            f"{case_id}: in the baseline and in this suite (same suite hash) but missing from the run: "
            f"not validated (a truncated or edited results file?); re-run the sweep",
        )
    if base_status in MEASURED and cur_status == "SKIP":
        return Finding(
            Rule.NEWLY_SKIPPED,
            Severity.INCONCLUSIVE,
            case_id,
            STATUS,
            base_status,
            cur_status,
            None,
            f"{case_id}: measured in the baseline ({base_status}), now SKIPPED: {reason or 'no reason given'}; "
            f"not validated any more. If that coverage loss is on purpose, accept it with `{accept}` "
            f"and review the diff in the PR",
        )
    if base_status == "SKIP" and cur_status in MEASURED:
        return Finding(
            Rule.NEWLY_MEASURED,
            Severity.WARN,
            case_id,
            STATUS,
            base_status,
            cur_status,
            None,
            **advised(f"{case_id}: skipped in the baseline, measured now ({cur_status})", "; refresh the baseline"),
        )
    if base_status in FAILED and cur_status == "PASS":
        return Finding(
            Rule.FIXED,
            Severity.WARN,
            case_id,
            STATUS,
            base_status,
            cur_status,
            None,
            **advised(f"{case_id}: {base_status} in the baseline, passes now", "; refresh the baseline"),
        )
    if base_status == "SKIP" and cur_status == "SKIP":
        return Finding(
            Rule.SKIPPED,
            Severity.INFO,
            case_id,
            STATUS,
            base_status,
            cur_status,
            None,
            f"{case_id}: skipped (not validated): {reason or 'no reason given'}",
        )
    return None


def rule_tensor_presence(
    case_id: str, tensor: str, base: float | None, cur: float | None, accept: str = "attn-gate baseline update"
) -> Finding | None:
    """A tensor the baseline validated that a passing case no longer measures (e.g. the kernel
    stopped returning its LSE) is lost coverage: INCONCLUSIVE, accepted on purpose with `accept`."""
    if base is not None and cur is None:
        return Finding(
            Rule.TENSOR_DROPPED,
            Severity.INCONCLUSIVE,
            case_id,
            Subject.ratio(tensor),
            base,
            None,
            None,
            f"{case_id}: {tensor} was measured in the baseline, not any more, so it is not validated; "
            f"if that is on purpose, accept it with `{accept}` and review the diff in the PR",
        )
    if base is None and cur is not None:
        return Finding(
            Rule.TENSOR_ADDED,
            Severity.INFO,
            case_id,
            Subject.ratio(tensor),
            None,
            cur,
            None,
            f"{case_id}: {tensor} measured now, not in the baseline",
        )
    return None


def incomplete_pass(c: "CaseResult") -> Finding | None:
    """rule_incomplete_pass for one results row, with the tensors its case must carry (a case whose
    bias requires grad adds dbias; a forward-only row needs out only; run_case sets `forward_only`
    from the case and the kernel's declaration)."""
    return rule_incomplete_pass(
        c.case_id, c.status.value, {t.tensor for t in c.tensors}, required_tensors(c.case.bias.grad, c.forward_only)
    )


def rule_incomplete_pass(
    case_id: str, status: str, tensors: set[str] | frozenset[str], required: tuple[str, ...] = REQUIRED_TENSORS
) -> Finding | None:
    """A PASS row must carry the evidence for it: run_case measures out, dq, dk and dv for every
    case it passes, so a PASS without them is a corrupt or edited results file. INCONCLUSIVE, not
    FAIL: nothing says the kernel is wrong, only that nothing shows it is right. A forward-only row
    (decode, or a kernel declared backward = false) has no gradients: out is required."""
    missing = [t for t in required if t not in tensors]
    if status != "PASS" or not missing:
        return None
    return Finding(
        Rule.INCOMPLETE_PASS,
        Severity.INCONCLUSIVE,
        case_id,
        STATUS,
        None,
        status,
        None,
        f"{case_id}: PASS without {', '.join(missing)}: nothing shows it is within its bounds "
        f"(edited or truncated results?); re-run the sweep",
    )


def rule_env_drift(key: str, base: Value, cur: Value) -> Finding | None:
    if base == cur or (key not in DRIFT_KEYS and key not in INFO_KEYS):
        return None
    if base is None:  # an older baseline did not record it: nothing to compare, worth knowing
        return Finding(
            Rule.ENV_INFO,
            Severity.INFO,
            "",
            Subject.env(key),
            None,
            cur,
            None,
            f"environment {key} is {fmt(cur)} now; the baseline did not record it",
        )
    if str(cur) in env_values(base):  # one of the machines a widened baseline spans: ratios differ between them
        return Finding(
            Rule.ENV_INFO,
            Severity.INFO,
            "",
            Subject.env(key),
            base,
            cur,
            None,
            f"environment {key} is {fmt(cur)}, one of those the baseline spans ({fmt(base)})",
        )
    severity = Severity.WARN if key in DRIFT_KEYS else Severity.INFO
    return Finding(
        Rule.ENV_DRIFT if severity is Severity.WARN else Rule.ENV_INFO,
        severity,
        "",
        Subject.env(key),
        base,
        cur,
        None,
        **(
            advised(
                f"environment {key} changed: baseline {fmt(base)}, now {fmt(cur)}; ratios may shift",
                ", refresh the baseline if they did",
            )
            if severity is Severity.WARN
            else {"message": f"environment {key} changed: baseline {fmt(base)}, now {fmt(cur)}"}
        ),
    )


def rule_nothing_measured(n_measured: int, n_cases: int) -> Finding | None:
    """Every case skipped (or none ran): nothing was validated, so the gate cannot pass."""
    if n_measured > 0:
        return None
    return Finding(
        Rule.NOTHING_MEASURED,
        Severity.INCONCLUSIVE,
        "",
        STATUS,
        None,
        float(n_measured),
        1.0,
        f"inconclusive: none of {n_cases} cases was measured (all skipped); nothing was validated",
    )


# ---------------------------------------------------------------- refusals


def refuse_other_gpu_class(baseline: Baseline, run: RunKey, path: Any) -> None:
    if not same(run, baseline.key, "gpu_class"):
        cur_class, kernel, suite = run.gpu_class, run.kernel, run.suite
        raise UserError(
            f"{path}: baseline is for GPU class {baseline.gpu_class!r} but this run is on {cur_class!r}; attn-gate never "
            f"compares across GPU classes: run on a {baseline.gpu_class} machine, or create a {cur_class} baseline with "
            f"`{update_command(kernel, suite, cur_class)}`"
        )


def refuse_duplicate_cases(sweep: "SweepResult", path: Any) -> None:
    """A case id twice in one run: which row is the truth? (The join would compare both.)"""
    twice = sorted(cid for cid, n in Counter(c.case_id for c in sweep.cases).items() if n > 1)
    if twice:
        raise UserError(
            f"{path}: {len(twice)} case ids appear more than once ({', '.join(twice[:5])}"
            f"{' ...' if len(twice) > 5 else ''}); a sweep holds each case once: regenerate the file "
            f"with `attn-gate sweep --kernel {sweep.kernel} --suite {sweep.suite}`"
        )


def refuse_unjudged_by_mean(sweep: "SweepResult", path: Any) -> None:
    """Rows recorded before the mean-error rule (results version 3) cannot be judged by it: a PASS
    there may hide a bias under the max bound, so a file holding one is not judged nor recorded."""
    unjudged = sweep.unjudged_by_mean
    if unjudged:
        raise UserError(
            f"{path}: {len(unjudged)} cases ({unjudged[0]}{' ...' if len(unjudged) > 1 else ''}) were recorded "
            f"before the mean-error rule (no pt_mean_err), so they cannot be judged by it; re-run the sweep with "
            f"`attn-gate sweep --kernel {sweep.kernel} --suite {sweep.suite}`"
        )


def check_comparable(baseline: Baseline, sweep: "SweepResult", path: Any) -> None:
    """Raise a UserError naming the file and the fix when the two must not be compared."""
    refuse_other_gpu_class(baseline, sweep.key, path)
    refuse_stale_baseline(baseline, sweep.key, path)


def refuse_stale_baseline(
    baseline: Baseline,
    run: RunKey,
    path: Any,
    suite_cases: dict[str, str] | None = None,
    timed: set[str] | None = None,
) -> None:
    """A baseline of another suite, another definition of it, or other tolerance multipliers cannot be
    compared with a run. `check` asks this before it sweeps (with the suite and tolerance it is about to
    run), not only after: a refusal then costs a second, not a whole sweep whose results it would not
    keep (a pr check on an H200 ran 149 s and then refused a baseline of the previous suite)."""
    suite = run.suite
    redo = update_command(run.kernel, suite, run.gpu_class)
    differs = why_not_comparable(run, baseline.key, ("suite", "suite_hash", "tolerance"))
    if differs is None:
        return
    if differs.key == "suite":
        raise UserError(
            f"{path}: baseline is for suite {baseline.suite!r}, this run is suite {suite!r}; "
            f"pass --suite {baseline.suite} or create a baseline with `{redo}`"
        )
    if differs.key == "suite_hash":
        way = (
            remeasure_hint(baseline, suite_cases, timed or set(), redo, path)
            if suite_cases is not None
            else f"`{redo}`"
        )
        raise UserError(
            f"{path}: suite {suite!r} changed since the baseline was made (hash {baseline.suite_hash} -> "
            f"{run.suite_hash}); bring it up to date with {way} and review the diff in the PR"
        )
    raise UserError(
        f"{path}: tolerance multipliers changed since the baseline was made ({', '.join(differs.changed)}), so ratios "
        f"are not comparable; refresh it with `{redo}` and review the diff in the PR"
    )


# ---------------------------------------------------------------- the join


def _frames(baseline: Baseline, sweep: "SweepResult", scope: Scope) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """Outer joins: cases on case id, tensors on (case id, tensor); `side` says where a row exists."""
    cur = pd.DataFrame(
        [{"case_id": c.case_id, "status": c.status.value, "reason": c.reason} for c in sweep.cases],
        columns=["case_id", "status", "reason"],
    )
    base = pd.DataFrame(
        [{"case_id": cid, "status": c.status.value} for cid, c in baseline.correctness.items()],
        columns=["case_id", "status"],
    )
    out_of_scope = 0
    if not scope.whole:
        in_scope = base["case_id"].map(scope.admits).astype(bool)
        out_of_scope = int((~in_scope).sum())
        base = base[in_scope]
    cases = cur.merge(base, on="case_id", how="outer", suffixes=("_cur", "_base"), indicator="side")
    cur_t = pd.DataFrame(
        [{"case_id": c.case_id, "tensor": t.tensor, "ratio": t.ratio} for c in sweep.cases for t in c.tensors],
        columns=["case_id", "tensor", "ratio"],
    )
    base_t = pd.DataFrame(
        [
            {"case_id": cid, "tensor": name, "ratio": t.ratio}
            for cid, c in baseline.correctness.items()
            for name, t in c.tensors.items()
        ],
        columns=["case_id", "tensor", "ratio"],
    )
    base_t = base_t[base_t["case_id"].isin(set(cur["case_id"]))]
    tensors = cur_t.merge(base_t, on=["case_id", "tensor"], how="outer", suffixes=("_cur", "_base"), indicator="side")
    return cases, tensors, out_of_scope


def _sides(side: str) -> tuple[bool, bool]:
    return side in ("left_only", "both"), side in ("right_only", "both")


def compare_correctness(
    baseline: Baseline, sweep: "SweepResult", cfg: "VerdictConfig", scope: Scope = Scope()
) -> list[Finding]:
    """Every rule over the joined cases and tensors. `scope` is the --only filter the run was
    filtered with: baseline cases outside it were not run and are not 'removed'."""
    cases, tensors, out_of_scope = _frames(baseline, sweep, scope)
    same_suite = same(sweep.key, baseline.key, "suite_hash")
    accept = update_command(sweep.kernel, sweep.suite, baseline.gpu_class)
    findings: list[Finding] = []
    cur_status_of: dict[str, str] = {}
    base_status_of: dict[str, str] = {}
    for row in cases.itertuples(index=False):
        in_cur, in_base = _sides(row.side)
        cur_status = row.status_cur if in_cur else None
        base_status = row.status_base if in_base else None
        reason = row.reason if in_cur else ""
        if in_cur:
            cur_status_of[row.case_id] = cur_status
        if in_base:
            base_status_of[row.case_id] = base_status
        findings += [
            f
            for f in (
                rule_case_presence(row.case_id, base_status, cur_status, reason, same_suite, accept),
                rule_status(row.case_id, base_status, cur_status, reason) if in_cur else None,
            )
            if f
        ]
    incomplete = [f for f in map(incomplete_pass, sweep.cases) if f]
    findings += incomplete
    complete_pass = {cid for cid, status in cur_status_of.items() if status == "PASS"} - {f.case_id for f in incomplete}
    mean_ratio = {(c.case_id, t.tensor): t.mean_ratio for c in sweep.cases for t in c.tensors}
    for row in tensors.itertuples(index=False):
        in_cur, in_base = _sides(row.side)
        cur = float(row.ratio_cur) if in_cur else None
        base = float(row.ratio_base) if in_base else None
        if in_cur:
            known = base if base_status_of.get(row.case_id, "SKIP") != "SKIP" else None
            findings += [
                f
                for f in (
                    rule_tolerance(row.case_id, row.tensor, cur, known),
                    rule_mean_error(row.case_id, row.tensor, mean_ratio[(row.case_id, row.tensor)], cur),
                )
                if f
            ]
        if base_status_of.get(row.case_id, "SKIP") == "SKIP":
            continue  # no baseline ratios for this case: rule_case_presence spoke already
        if in_cur and in_base:
            found = (
                rule_headroom(row.case_id, row.tensor, base, cur, cfg.headroom_factor, cfg.headroom_step),
                rule_improvement(row.case_id, row.tensor, base, cur, cfg.improvement_factor, cfg.headroom_step),
            )
        elif in_cur or row.case_id in complete_pass:
            found = (rule_tensor_presence(row.case_id, row.tensor, base, cur, accept),)
        else:  # no tensors now (SKIP/ERROR/FAIL, not run) or an incomplete PASS: another rule spoke
            found = ()
        findings += [f for f in found if f]
    if out_of_scope:
        findings.append(
            Finding(
                Rule.OUT_OF_SCOPE,
                Severity.INFO,
                "",
                STATUS,
                None,
                None,
                None,
                f"{out_of_scope} baseline cases outside --only {scope.only!r} were not compared",
            )
        )
    findings += _ok_findings(baseline, sweep, findings)
    n_measured = sum(1 for c in sweep.cases if c.status.value in MEASURED)
    findings += [f for f in (rule_nothing_measured(n_measured, len(sweep.cases)),) if f]
    return findings


def _ok_findings(baseline: Baseline, sweep: "SweepResult", findings: list[Finding]) -> list[Finding]:
    """One OK per case that passed and raised nothing worth a look: the full table stays complete."""
    flagged = {f.case_id for f in findings if f.severity is not Severity.OK}
    out = []
    for c in sweep.cases:
        if c.case_id in flagged or c.status.value != "PASS" or c.case_id not in baseline.correctness:
            continue
        base = baseline.correctness[c.case_id]
        base_worst = max((t.ratio for t in base.tensors.values()), default=math.nan)
        out.append(
            Finding(
                Rule.WITHIN,
                Severity.OK,
                c.case_id,
                Subject.ratio("worst"),
                base_worst,
                c.worst_ratio,
                1.0,
                f"{c.case_id}: worst ratio {fmt(c.worst_ratio)} (baseline {fmt(base_worst)})",
            )
        )
    return out


def compare_environment(base: Environment, cur: Environment) -> list[Finding]:
    """One finding per checked key whose value moved (the records' values are strings)."""
    pairs = ((k, base.value(k), cur.value(k)) for k in DRIFT_KEYS + INFO_KEYS)
    return [f for f in (rule_env_drift(k, b, c) for k, b, c in pairs if b is not None or c is not None) if f]


def compare(baseline: Baseline, sweep: "SweepResult", cfg: "VerdictConfig", scope: Scope = Scope()) -> list[Finding]:
    """All correctness findings of a run against its baseline (check_comparable first)."""
    return compare_correctness(baseline, sweep, cfg, scope) + compare_environment(baseline.env, sweep.env)


def compare_all(
    baseline: Baseline, sweep: "SweepResult", config: "Config", scope: Scope
) -> tuple[list[Finding], dict[str, float], list[dict]]:
    """Every rule family's findings and thresholds (the perf verdict adds its own here), with the
    correctness failures the known_failures declarations cover turned KNOWN; and those declarations."""
    findings, known = apply_known(compare(baseline, sweep, config.verdict, scope), sweep, config.known_failures)
    return findings, correctness_thresholds(config.verdict), known
