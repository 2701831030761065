"""Known failures ([[tool.attn-gate.known_failures]]): each rule of gate/compare/known.py with a table
(bad input speaks, good input stays silent), the config's validation, and the acceptance runs
through the real `attn-gate check` on CPU with planted upstream bugs (tests/known_kernels.py) on a
two-case suite, so the end-to-end part stays under a minute on two cores."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gate.compare.baselines import Baseline
from gate.compare.diagnosis import diagnose
from gate.compare.findings import STATUS, Finding, Severity, Subject, decide
from gate.compare.known import (
    UNATTRIBUTED,
    apply_known,
    apply_known_to_speed,
    coverage,
    declared_known,
    refuse_unmatched,
    row_failures,
    rule_known,
    rule_unused,
    rule_version,
    rule_xpass,
    undeclared_failures,
)
from gate.compare.sweep_rules import compare
from gate.core.cases import load_suite
from gate.core.config import KnownFailure, load_config
from gate.core.errors import UserError
from gate.report.comment import pr_comment
from tests.minisuite import ROOT, gate, project, suite
from tests.test_baselines import BEHIND_BY_NEW_CASES, DROPPED_SKIP_REASON
from tests.test_verdict import CFG, result, sweep

LINK = "https://github.com/Dao-AILab/flash-attention/issues/895"


def entry(
    index: int = 1, kernel: str = "k", cases: str = "s7", tensors=None, versions=None, strict=False
) -> KnownFailure:
    return KnownFailure(
        index=index,
        kernel=kernel,
        cases=cases,
        reason=f"bug {index}",
        link=LINK,
        tensors=tuple(tensors) if tensors else None,
        versions=versions,
        strict=strict,
    )


# ---------------------------------------------------------------- config: typed, validated

GOOD_ENTRY = 'kernel = "fa2"\ncases = "causal"\nreason = "r"\nlink = "https://x.org/1"\n'


def load(tmp_path, body: str):
    path = tmp_path / "attn.toml"
    path.write_text("[[tool.attn-gate.known_failures]]\n" + body)
    return load_config(path)


@pytest.mark.parametrize(
    "body, words",
    [
        (GOOD_ENTRY + "tensor = ['dq']\n", "#1: unknown key 'tensor'; known keys: kernel, cases, tensors"),
        (GOOD_ENTRY.replace('reason = "r"\n', ""), "#1: reason is required"),
        (GOOD_ENTRY.replace('link = "https://x.org/1"\n', ""), "#1: link is required"),
        (GOOD_ENTRY.replace("https://x.org/1", "see slack"), "link = 'see slack' should be the upstream issue"),
        (GOOD_ENTRY.replace('"causal"', '"causal("'), "cases = 'causal(' is not a regular expression"),
        (GOOD_ENTRY + "tensors = ['dQ']\n", "tensors names 'dQ'; known names: out, lse, dq"),
        (GOOD_ENTRY + "tensors = []\n", "should be a non-empty list"),
        (GOOD_ENTRY + "versions = 'before 2.8'\n", "versions = 'before 2.8' is not a PEP 440 specifier"),
        (GOOD_ENTRY + "strict = 'yes'\n", "strict = 'yes' should be true or false"),
        (GOOD_ENTRY.replace('"fa2"', "3"), "kernel = 3 should be a kernel name or fnmatch pattern"),
    ],
)
def test_a_bad_declaration_names_file_entry_and_key(tmp_path, body, words):
    with pytest.raises(UserError) as err:
        load(tmp_path, body)
    message = str(err.value)
    assert "\n" not in message and str(tmp_path / "attn.toml") in message and words in message, message


def test_a_good_declaration_is_typed(tmp_path):
    cfg = load(tmp_path, GOOD_ENTRY + "tensors = ['dq', 'error']\nversions = '>=2.8,<2.8.4'\nstrict = true\n")
    (e,) = cfg.known_failures
    assert (e.index, e.kernel, e.tensors, e.versions, e.strict) == (1, "fa2", ("dq", "error"), ">=2.8,<2.8.4", True)
    assert e.covers("dq") and not e.covers("dk") and entry().covers("anything")


# A failing row of a committed baseline that is ours, not the kernel's: an ERROR of the gate's own
# harness, since fixed, that stays until a whole nightly run refreshes the file.
HARNESS_ROWS = {("sdpa-flash", "nightly"): {"bf16-b6-h8/2-s4224-d128-causal-drop0.1-varlen1.97.0.1000.513.4224"}}


@pytest.mark.parametrize(
    "path", sorted((ROOT / "baselines").glob("*/*.json")), ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_every_failing_row_of_a_committed_baseline_is_declared_and_every_declaration_is_used(path):
    """The project's declarations and its baselines agree: each failing row is covered, and each
    declaration for the baseline's kernel covers a failing row (none is stale)."""
    from gate.compare.baselines import read_baseline
    from gate.compare.known import coverage, for_kernel, row_failures

    config = load_config(ROOT / "pyproject.toml")
    b = read_baseline(path)
    entries = for_kernel(config.known_failures, b.kernel, str(b.environment.get("kernel_version", "")))
    undeclared, used = [], set()
    for case_id, row in b.correctness.items():
        failures = row_failures(row.status.value, {n: t.ratio for n, t in row.tensors.items()}, [], row.reason)
        if not failures or case_id in HARNESS_ROWS.get((b.kernel, b.suite), set()):
            continue
        covered = coverage(failures, [e for e in entries if e.pattern.search(case_id)])
        used.update(e.index for e in covered.values())
        if set(failures) - set(covered):
            undeclared.append((case_id, sorted(set(failures) - set(covered))))
    assert undeclared == [], f"{path.name}: failing rows no known_failures entry covers"
    if b.suite != "pr":  # nightly-only entries may cover rows the pr baseline has not
        return
    # an entry for cases only another suite sweeps (the nightly's) is not this baseline's to use
    swept = [c.id for c in load_suite(b.suite, config.suites).swept_cases]
    unused = [e for e in entries if e.index not in used and any(e.pattern.search(cid) for cid in swept)]
    if f"{path.parent.name}/{path.name}" in BEHIND_BY_NEW_CASES:
        # a baseline behind its suite may lack what a declaration covers: only cases it never
        # measured as they run now (no row, or a SKIP the adapter no longer declares) may be what an
        # unused declaration matches
        defined = load_suite(b.suite, config.suites)
        unmeasured = {c.id for c in defined.swept_cases if c.id not in b.correctness}
        unmeasured |= {
            cid
            for cid, row in b.correctness.items()
            if row.status.value == "SKIP" and row.reason.startswith(DROPPED_SKIP_REASON)
        }
        matched = {e.index: {c.id for c in defined.swept_cases if e.pattern.search(c.id)} for e in unused}
        unused = [e for e in unused if not matched[e.index] or not matched[e.index] <= unmeasured]
    assert sorted(e.index for e in unused) == [], f"{path.name}: declarations that cover nothing"


# ---------------------------------------------------------------- one table per rule


@pytest.mark.parametrize(
    "status, ratios, checks, reason, expected",
    [
        ("PASS", {"out": 0.2, "dq": 0.9}, [], "", set()),
        ("SKIP", {}, [], "no softcap", set()),
        ("FAIL", {"out": 0.2, "dq": 1.5, "dk": math.nan}, [], "", {"dq", "dk"}),  # NaN never passes
        ("FAIL", {"out": 0.2}, ["determinism"], "", {"determinism"}),
        ("FAIL", {}, [], "seed 1: dq contains NaN/Inf", {"dq"}),  # refused before it was measured
        ("FAIL", {}, [], "out has shape (1, 2), expected (2, 1)", {"out"}),
        ("FAIL", {}, [], "something odd", {UNATTRIBUTED}),  # only a declaration without tensors covers it
        ("ERROR", {}, [], "CUDA error", {"error"}),
    ],
)
def test_row_failures(status, ratios, checks, reason, expected):
    assert row_failures(status, ratios, checks, reason) == expected


def test_coverage_takes_the_first_declaration_that_names_each_failure():
    a, b = entry(1, tensors=["dq"]), entry(2)
    assert coverage({"dq", "dk"}, [b, a]) == {"dq": a, "dk": b}
    assert coverage({"dq", "dk"}, [a]) == {"dq": a}
    assert coverage({"?"}, [a]) == {} and coverage({"?"}, [b]) == {"?": b}


def fail(rule: str, metric: str, current="FAIL") -> Finding:
    return Finding(rule, Severity.FAIL, "c", Subject.parse(metric), None, current, None, f"c: {rule}")


@pytest.mark.parametrize(
    "finding, failures, declared, known",
    [
        (fail("tolerance", "ratio:dq", 1.5), {"dq"}, ["dq"], True),
        (fail("tolerance", "ratio:dk", 1.2), {"dq", "dk"}, ["dq"], False),  # not named: a new bug still fails
        (fail("status", "status"), {"dq"}, ["dq"], True),
        (fail("status", "status"), {"dq", "dk"}, ["dq"], False),  # the row fails on more than declared
        (fail("status", "status", "ERROR"), {"error"}, ["dq"], False),
        (fail("status", "status", "ERROR"), {"error"}, ["error"], True),
        (fail("headroom", "ratio:dk", 0.9), {"dq"}, None, False),  # worse elsewhere: never covered
        (Finding("removed_case", Severity.INCONCLUSIVE, "c", STATUS, "PASS", None, None, "gone"), set(), None, False),
    ],
)
def test_rule_known(finding, failures, declared, known):
    e = entry(tensors=declared)
    f = rule_known(finding, frozenset(failures), coverage(failures, [e]))
    assert (f is not None) == known, f
    if known:
        assert f.severity is Severity.KNOWN and f.entry == 1 and LINK in f.message and not f.severity.blocks


@pytest.mark.parametrize(
    "status, failures, measured, declared, strict, severity",
    [
        ("PASS", set(), ["out", "dq", "dk", "dv"], ["dq"], False, Severity.WARN),
        ("PASS", set(), ["out", "dq", "dk", "dv"], None, True, Severity.FAIL),  # strict: an XPASS fails
        ("FAIL", {"dk"}, ["out", "dq", "dk", "dv"], ["dq"], False, Severity.WARN),  # dq passes now; dk is another bug
        ("FAIL", {"dq"}, ["out", "dq", "dk", "dv"], ["dq"], False, None),  # still failing: the declaration holds
        ("FAIL", {"dk"}, ["out"], ["dq"], False, None),  # dq not measured: unknown
        ("ERROR", {"error"}, [], ["dq"], False, None),
        ("SKIP", set(), [], None, False, None),
    ],
)
def test_rule_xpass(status, failures, measured, declared, strict, severity):
    f = rule_xpass(entry(tensors=declared, strict=strict), "c", status, frozenset(failures), measured, 0, 1)
    assert (f.severity if f else None) is severity, f
    if f:
        assert "known_failures #1 (bug 1)" in f.message and "delete the entry" in f.message and f.entry == 1


def test_rule_xpass_advises_narrowing_while_other_cases_still_fail():
    f = rule_xpass(entry(), "c", "PASS", frozenset(), ["out"], 3, 4)
    assert "narrow its cases or tensors (3 of the 4 cases" in f.message


@pytest.mark.parametrize(
    "versions, version, applies",
    [
        (None, "unknown", True),
        (">=2.8,<2.8.4", "2.8.3", True),
        (">=2.8,<2.8.4", "2.8.3.post2", True),
        (">=2.8,<2.8.4", "2.8.4", False),  # the fix landed: judged as any other case
        ("<2.14", "2.13.0+cpu", True),  # torch's local version
        ("<2.14", "2.14.0.dev20261201", False),
        ("<2.14", "unknown", False),  # cannot compare: not applied, fails closed
    ],
)
def test_rule_version(versions, version, applies):
    f = rule_version(entry(versions=versions), version)
    assert (f is None) == applies, f


def test_rule_unused():
    assert rule_unused(entry(), 2) is None
    assert rule_unused(entry(), 0).severity is Severity.INFO


@pytest.mark.parametrize(
    "kernel, cases, refused",
    [
        ("k", "s7", False),
        ("k", "s77", True),  # a typo: matches no case of any suite
        ("k*", "s77", True),  # a pattern that names this kernel is checked too
        ("other", "s77", False),  # another kernel's declaration is not checked against this run
    ],
)
def test_refuse_unmatched(kernel, cases, refused):
    suites = {"smoke": ["bf16-b1-h1-s7-d8"], "pr": ["bf16-b1-h1-s9-d8"]}
    if refused:
        with pytest.raises(UserError, match=r"#1: cases = .* matches no case of suite pr or smoke for kernel 'k'"):
            refuse_unmatched([entry(kernel=kernel, cases=cases)], "k", suites)
    else:
        refuse_unmatched([entry(kernel=kernel, cases=cases)], "k", suites)


# ---------------------------------------------------------------- the rules together


BASE = sweep(result(7, "FAIL", dq=1.6, out=0.2, dk=0.3, dv=0.3), result(8, out=0.2, dq=0.3, dk=0.3, dv=0.3))


def judged(current, entries):
    findings, applied = apply_known(compare(Baseline.from_sweep(BASE), current, CFG), current, entries)
    return decide(findings, {}, {"known_failures": applied})


def test_a_declared_failure_is_known_and_passes():
    v = judged(BASE, [entry(tensors=["dq"])])
    assert v.passed and {f.rule for f in v.of(Severity.KNOWN)} == {"tolerance", "status"}
    assert "except 1 known failure" in v.headline


def test_a_new_error_inside_a_declared_case_still_fails():
    worse = sweep(result(7, "FAIL", dq=1.6, out=0.2, dk=1.3, dv=0.3), result(8, out=0.2, dq=0.3, dk=0.3, dv=0.3))
    v = judged(worse, [entry(tensors=["dq"])])
    assert not v.passed and {(f.rule, f.metric) for f in v.of(Severity.FAIL)} == {
        ("tolerance", "ratio:dk"),
        ("status", "status"),
    }
    # within its bound but past the baseline's headroom: the headroom rule still speaks
    looser = sweep(result(7, "FAIL", dq=1.6, out=0.2, dk=0.9, dv=0.3), result(8, out=0.2, dq=0.3, dk=0.3, dv=0.3))
    assert {f.rule for f in judged(looser, [entry(tensors=["dq"])]).of(Severity.FAIL)} == {"headroom"}


def test_an_undeclared_failure_fails_and_another_kernels_declaration_changes_nothing():
    assert not judged(BASE, []).passed
    assert not judged(BASE, [entry(kernel="fa2")]).passed
    assert not judged(BASE, [entry(cases="s8")]).passed  # declared on the wrong case


def test_a_declared_case_that_passes_is_xpass():
    fixed = sweep(result(7, out=0.2, dq=0.3, dk=0.3, dv=0.3), result(8, out=0.2, dq=0.3, dk=0.3, dv=0.3))
    v = judged(fixed, [entry(tensors=["dq"])])
    (x,) = [f for f in v.findings if f.rule == "xpass"]
    assert v.passed and x.severity is Severity.WARN and "known_failures #1 (bug 1)" in x.message
    assert not judged(fixed, [entry(tensors=["dq"], strict=True)]).passed


def test_undeclared_failures_for_baseline_update():
    run = sweep(result(7, "FAIL", dq=1.6, dk=1.2, out=0.2, dv=0.3), result(8, "ERROR", "boom"))
    assert undeclared_failures(run, []) == [("bf16-b1-h1-s7-d8", ["dk", "dq"]), ("bf16-b1-h1-s8-d8", ["error"])]
    assert undeclared_failures(run, [entry(tensors=["dq"]), entry(2, cases="s8")]) == [("bf16-b1-h1-s7-d8", ["dk"])]
    assert undeclared_failures(run, [entry(), entry(2, cases="s8", versions=">=2")]) == [
        ("bf16-b1-h1-s8-d8", ["error"])
    ]


def test_declared_known_is_a_failing_row_whose_every_failure_is_covered():
    bad = result(7, "FAIL", dq=1.6, dk=1.2, out=0.2, dv=0.3)
    assert declared_known(bad, [entry(tensors=["dq", "dk"])])
    assert not declared_known(bad, [entry(tensors=["dq"])])  # dK is not declared
    assert not declared_known(bad, [entry(cases="s8")])  # another case's declaration
    assert not declared_known(result(7, "PASS", dq=0.6), [entry()])  # nothing failed: nothing known
    assert declared_known(result(7, "ERROR", "boom"), [entry()]) and not declared_known(result(7, "ERROR", "boom"), [])


def test_the_comment_lists_known_failures_apart_with_their_link():
    v = judged(BASE, [entry(tensors=["dq"])])
    text = pr_comment(v, diagnose(v, BASE), BASE, Baseline.from_sweep(BASE))
    known = text[text.index("### Known failures") :]
    assert "**#1** bug 1" in known and LINK in known and "`bf16-b1-h1-s7-d8`" in known
    assert "KNOWN" in text.split("\n")[3]  # the verdict line says so


# ---------------------------------------------------------------- acceptance: the real `attn-gate check`

SUITE = suite("tiny")
CAUSAL = "bf16-b2-h2-s64-d32-causal"
DECLARED = f'''
[[tool.attn-gate.known_failures]]
kernel = "planted"
cases = "-causal$"
tensors = ["dq"]
reason = "causal backward: dQ 10% too large"
link = "{LINK}"
'''


def planted(tmp_path: Path, name: str, function: str, known: str = DECLARED) -> Path:
    """A config whose kernel `planted` is tests.known_kernels:FUNCTION: the same kernel name (and
    baseline file) before and after the planted bug is fixed."""
    return project(tmp_path / f"{name}.toml", "planted", f"tests.known_kernels:{function}", SUITE, known)


def run(*argv: str) -> int:
    """A swept run: the planted kernel on the tiny suite; a check of saved results: ARGV alone."""
    if argv[0] == "check" and "--results" in argv:
        return gate(list(argv))
    return gate([*argv, "--kernel", "planted", "--suite", "tiny", "--device", "cpu", "--no-progress"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The baseline of the buggy kernel (declared), then fresh checks of three versions of it."""
    tmp = tmp_path_factory.mktemp("known")
    buggy = planted(tmp, "buggy", "causal_dq_bug")
    assert run("baseline", "update", "--config", str(buggy), "--out", str(tmp / "base")) == 0
    rcs = {
        name: run("check", "--config", str(planted(tmp, name, function)), "--out", str(tmp / name))
        for name, function in (("buggy", "causal_dq_bug"), ("worse", "causal_dq_bug_and_dk"), ("fixed", "fixed"))
    }
    return tmp, rcs


def findings(out: Path) -> dict:
    return json.loads((out / "findings-planted-tiny.json").read_text())


@pytest.mark.xdist_group("known_failures")
def test_a_declared_planted_bug_passes_as_known_with_its_link(runs):
    tmp, rcs = runs
    assert rcs["buggy"] == 0
    data = findings(tmp / "buggy")
    assert {(f["severity"], f["rule"], f["case_id"]) for f in data["findings"] if f["severity"] == "KNOWN"} == {
        ("KNOWN", "tolerance", CAUSAL),
        ("KNOWN", "status", CAUSAL),
    }
    assert data["context"]["known_failures"][0]["link"] == LINK
    for name in ("check-planted-tiny.md", "comment-planted-tiny.md"):
        text = (tmp / "buggy" / name).read_text()
        assert "### Known failures" in text and LINK in text and f"`{CAUSAL}`" in text


@pytest.mark.parametrize(
    "function, counts", [("causal_dq_bug", "(1 known FAIL)"), ("causal_dq_bug_and_dk", "(1 FAIL)")]
)
def test_the_live_progress_counts_a_declared_failure_apart(tmp_path, capsys, function, counts):
    """A run that `check` will pass does not look failing while it runs; an undeclared failure in
    the same case still counts as FAIL."""
    from gate.workflow.sweep import run_sweep

    config = load_config(planted(tmp_path, "p", function))
    run_sweep("planted", "tiny", config, "cpu", progress=True)
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("[2/2] ") and last.endswith(counts), last


@pytest.mark.xdist_group("known_failures")
def test_selftest_a_planted_bug_inside_a_declared_case_still_fails(runs):
    """dQ is declared; a new 5% dK error in the same causal case is not, and fails the check."""
    tmp, rcs = runs
    assert rcs["worse"] == 1
    failing = {
        (f["rule"], f["metric"])
        for f in findings(tmp / "worse")["findings"]
        if f["severity"] == "FAIL" and f["case_id"] == CAUSAL
    }
    assert ("tolerance", "ratio:dk") in failing and ("status", "status") in failing


@pytest.mark.xdist_group("known_failures")
def test_the_fixed_kernel_is_xpass_naming_the_entry_and_fails_under_strict(runs, capsys):
    tmp, rcs = runs
    assert rcs["fixed"] == 0
    (x,) = [f for f in findings(tmp / "fixed")["findings"] if f["rule"] == "xpass"]
    assert x["severity"] == "WARN" and "known_failures #1 (causal backward: dQ 10% too large)" in x["message"]
    assert "delete the entry" in x["message"]
    strict = planted(tmp, "strict", "fixed", DECLARED + "strict = true\n")
    assert (
        run(
            "check",
            "--config",
            str(strict),
            "--results",
            str(tmp / "fixed" / "sweep-planted-tiny.json"),
            "--out",
            str(tmp / "strict"),
        )
        == 1
    )
    assert "XPASS" in capsys.readouterr().out


@pytest.mark.xdist_group("known_failures")
def test_an_undeclared_failure_fails(runs):
    tmp, _ = runs
    bare = planted(tmp, "bare", "causal_dq_bug", known="")
    assert (
        run(
            "check",
            "--config",
            str(bare),
            "--results",
            str(tmp / "buggy" / "sweep-planted-tiny.json"),
            "--out",
            str(tmp / "bare"),
        )
        == 1
    )


def test_an_unmatched_declaration_is_a_usage_error_before_the_sweep(tmp_path, capsys):
    typo = planted(tmp_path, "typo", "causal_dq_bug", DECLARED.replace("-causal$", "-casual$"))
    assert run("check", "--config", str(typo), "--out", str(tmp_path / "o")) == 2
    err = capsys.readouterr().err
    assert "known_failures]] #1: cases = '-casual$' matches no case" in err and str(typo) in err
    assert not (tmp_path / "o" / "sweep-planted-tiny.json").exists()
    # the same typo in a declaration for another kernel is not this run's business
    other = planted(tmp_path, "other", "fixed", DECLARED.replace("-causal$", "-casual$").replace('"planted"', '"fa2"'))
    assert run("baseline", "update", "--config", str(other), "--out", str(tmp_path / "b")) == 0


# ---------------------------------------------------------------- the speed half: a case that cannot be timed


def _untimed(case_id: str, pass_: str = "fwd") -> Finding:
    return Finding("speed", Severity.INCONCLUSIVE, case_id, Subject.speed(pass_), None, None, None, "not measured: X")


def test_a_timed_case_that_raises_under_a_declared_error_is_known_and_passes_the_speed_half():
    findings = [_untimed("s7", "fwd"), _untimed("s7", "bwd")]
    known = apply_known_to_speed(findings, ["s7"], "k", "1.0", [entry(cases="s7", tensors=["error"])])
    assert [f.severity for f in known] == [Severity.KNOWN, Severity.KNOWN]
    assert all(f.entry == 1 and LINK in f.message for f in known)
    assert decide(known).speed.passed
    assert not decide(findings).speed.passed


@pytest.mark.parametrize(
    "errored, declared, kernel, version",
    [
        ([], entry(cases="s7", tensors=["error"]), "k", "1.0"),  # it did not raise: skipped or not timed
        (["s7"], entry(cases="s7", tensors=["dq"]), "k", "1.0"),  # declared for a wrong answer, not an error
        (["s7"], entry(cases="s8", tensors=["error"]), "k", "1.0"),  # another case
        (["s7"], entry(kernel="other", cases="s7"), "k", "1.0"),  # another kernel
        (["s7"], entry(cases="s7", versions="<1.0"), "k", "1.0"),  # a version the bug is not in
    ],
)
def test_an_untimed_speed_pass_stays_inconclusive_unless_a_declaration_covers_its_error(
    errored, declared, kernel, version
):
    findings = [_untimed("s7")]
    assert apply_known_to_speed(findings, errored, kernel, version, [declared]) == findings
    assert not decide(apply_known_to_speed(findings, errored, kernel, version, [declared])).speed.passed


def test_a_slower_timed_speed_pass_fails_whatever_is_declared():
    slow = Finding("speed", Severity.FAIL, "s7", Subject.speed("bwd"), 1.0, 3.0, 1.05, "s7: bwd 3x slower")
    assert apply_known_to_speed([slow], ["s7"], "k", "1.0", [entry(cases="s7")]) == [slow]
