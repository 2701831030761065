"""A run's identity as values: the Scope (the --only filter, implemented once) and the RunKey."""

from __future__ import annotations

import ast
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from gate.compare.comparable import KEYS, same, why_not_comparable
from gate.core.errors import UserError
from gate.core.identity import RunKey, Scope


@dataclass(frozen=True)
class _Case:
    id: str


IDS = ("bf16-b2-h4-s128-d64", "bf16-b2-h4-s128-d64-causal", "fp16-b1-h8-s512-d128")


def test_whole_scope_admits_every_case():
    scope = Scope()
    assert scope.whole and scope.pattern is None
    assert all(scope.admits(cid) for cid in IDS)
    assert scope.select([_Case(c) for c in IDS]) == tuple(_Case(c) for c in IDS)


@pytest.mark.parametrize(
    ("only", "admitted"),
    [
        ("causal", ("bf16-b2-h4-s128-d64-causal",)),
        ("^bf16", IDS[:2]),
        ("d128$", ("fp16-b1-h8-s512-d128",)),
        ("(s512|causal)", IDS[1:]),
        ("nothing-like-this", ()),
    ],
)
def test_scope_admits_what_the_regex_finds_in_the_id(only, admitted):
    scope = Scope.of_only(only)
    assert not scope.whole
    assert tuple(c for c in IDS if scope.admits(c)) == admitted
    assert scope.select([_Case(c) for c in IDS]) == tuple(_Case(c) for c in admitted)


@pytest.mark.parametrize("only", ["(a+)+$", "([", ".*.*x"])
def test_an_invalid_or_unbounded_only_is_one_line_naming_the_flag(only):
    with pytest.raises(UserError) as info:
        Scope.of_only(only)
    message = str(info.value)
    assert message.startswith(f"--only {only!r}") and "\n" not in message


def test_of_only_none_is_the_whole_suite():
    assert Scope.of_only(None) == Scope()


def test_covers():
    whole, causal, other = Scope(), Scope("causal"), Scope("d128")
    assert whole.covers(causal) and whole.covers(whole)
    assert causal.covers(Scope("causal"))
    assert not causal.covers(whole)  # a filtered run does not hold the whole suite
    assert not causal.covers(other)


def test_run_key_is_a_hashable_value():
    a = RunKey.of("sdpa", "smoke", "abc", {"mult_out": 2.0, "mult_dq": 3.0}, "cpu")
    b = RunKey.of("sdpa", "smoke", "abc", {"mult_dq": 3.0, "mult_out": 2.0}, "cpu")
    assert a == b and hash(a) == hash(b)  # the order the multipliers were recorded in is no identity
    assert a.multipliers == {"mult_out": 2.0, "mult_dq": 3.0}
    assert RunKey.of("sdpa", "smoke", "abd", a.multipliers, "cpu") != a


# ---------------------------------------------------------------- comparability, asked in one place

GATE = Path(__file__).resolve().parents[1] / "gate"
COMPARABLE = GATE / "compare" / "comparable.py"
CHECKED_NAMES = ("suite_hash", "tolerance")


def _names_a_checked_key(node: ast.AST) -> bool:
    """An operand that is a suite hash or tolerance value: `x.suite_hash`, `tolerance`, `suite_hash(s)`."""
    for sub in ast.walk(node):
        name = sub.attr if isinstance(sub, ast.Attribute) else sub.id if isinstance(sub, ast.Name) else None
        if name in CHECKED_NAMES:
            return True
    return False


def comparisons_of_checked_keys(source: str) -> list[str]:
    """Each place `source` compares a suite hash or tolerance multipliers itself: an == / != on
    them, a call of tolerance_changes, or a getattr comparison in a function that names them."""
    found = []
    tree = ast.parse(source)
    for fn in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
        names_keys = any(isinstance(c, ast.Constant) and c.value in CHECKED_NAMES for c in ast.walk(fn))
        body = fn.body if isinstance(fn, ast.Module) else [fn]
        for node in (n for stmt in body for n in ast.walk(stmt)):
            if isinstance(node, ast.Compare) and all(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):
                operands = [node.left, *node.comparators]
                via_getattr = names_keys and any(
                    isinstance(o, ast.Call) and getattr(o.func, "id", None) == "getattr" for o in operands
                )
                if any(_names_a_checked_key(o) for o in operands) or via_getattr:
                    found.append(f"{node.lineno}: {ast.unparse(node)}")
            elif isinstance(node, ast.Call):
                callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
                if callee == "tolerance_changes":
                    found.append(f"{node.lineno}: {ast.unparse(node)}")
    return sorted(set(found))


def test_the_counter_finds_each_way_of_comparing_keys():
    planted = """
def a(old, new, run):
    if old.suite_hash != new.suite_hash:
        pass
    if suite_hash(suite) == run.suite_hash:
        pass
    changed = tolerance_changes(old.tolerance, new)
    same = old.tolerance == new.tolerance

def b(first, sweep):
    for key in ("kernel", "suite_hash"):
        if getattr(sweep, key) != getattr(first, key):
            pass

def c(sweep, baseline):
    if "suite_hash" in baseline:  # a field read, not a comparison of two runs
        pass
    return f"hash {sweep.suite_hash}", sweep.kernel == baseline.kernel
"""
    found = comparisons_of_checked_keys(planted)
    assert [line.split(":")[0] for line in found] == ["12", "3", "5", "7", "8"], found


def test_suite_hash_and_tolerance_are_compared_only_in_comparable():
    """'May this run be judged against that one?' is answered by gate/compare/comparable.py's table;
    every other module asks it (why_not_comparable / same) instead of comparing the keys itself."""
    outside = {
        str(p.relative_to(GATE)): found
        for p in sorted(GATE.rglob("*.py"))
        if p != COMPARABLE and "templates" not in p.parts
        for found in [comparisons_of_checked_keys(p.read_text(encoding="utf-8"))]
        if found
    }
    assert outside == {}, outside
    assert comparisons_of_checked_keys(COMPARABLE.read_text(encoding="utf-8"))  # the table itself compares


# ---------------------------------------------------------------- the table


KEY = RunKey.of("sdpa", "smoke", "abc", {"mult_out": 2.0, "mult_dq": 3.0}, "cpu")


@pytest.mark.parametrize(
    ("other", "key", "changed"),
    [
        (replace(KEY, gpu_class="h100"), "gpu_class", ("h100 -> cpu",)),
        (replace(KEY, kernel="flex"), "kernel", ("flex -> sdpa",)),
        (replace(KEY, suite="pr"), "suite", ("pr -> smoke",)),
        (replace(KEY, suite_hash="abd"), "suite_hash", ("abd -> abc",)),
        (RunKey.of("sdpa", "smoke", "abc", {"mult_out": 2.0, "mult_dq": 3.5}, "cpu"), "tolerance", ("mult_dq",)),
    ],
)
def test_the_first_differing_key_is_the_refusal(other, key, changed):
    refusal = why_not_comparable(KEY, other)
    assert refusal is not None and (refusal.key, refusal.changed) == (key, changed)
    assert refusal.ours == getattr(KEY, key) if key != "tolerance" else refusal.ours == KEY.multipliers
    assert "\n" not in str(refusal) and str(refusal)
    assert not same(KEY, other) and same(KEY, other, *(k for k in KEYS if k != key))


def test_same_key_is_comparable_and_order_follows_the_table():
    assert why_not_comparable(KEY, KEY) is None and same(KEY, KEY)
    both = replace(KEY, suite_hash="abd", tolerance=(("mult_out", 9.0),))
    assert why_not_comparable(KEY, both).key == "suite_hash"
    assert why_not_comparable(KEY, both, ("tolerance",)).key == "tolerance"


def test_a_multiplier_recorded_before_it_existed_counts_at_its_default():
    from gate.core.config import ToleranceConfig

    now = ToleranceConfig().as_dict()
    old = {k: v for k, v in now.items() if k != "mult_dsink"}
    assert same(RunKey.of("k", "s", "h", now, "cpu"), RunKey.of("k", "s", "h", old, "cpu"))
    assert not same(RunKey.of("k", "s", "h", {**now, "mult_dsink": 5.0}, "cpu"), RunKey.of("k", "s", "h", old, "cpu"))


def test_an_unknown_key_is_refused():
    with pytest.raises(ValueError, match="not a checked key: driver"):
        why_not_comparable(KEY, KEY, ("driver",))


# ---------------------------------------------------------------- a perf run's scope is a field


def _perf_payload(version: int, notes: list[str]) -> dict:
    import gzip
    import json

    from gate.speed.runs import migrate_perf

    payload = json.loads(
        gzip.decompress((Path(__file__).parent / "data" / "h200-perf-sdpa-flash-pr.json.gz").read_bytes())
    )
    payload = migrate_perf(payload) if version > 1 else payload
    payload = {k: v for k, v in payload.items() if k != "scope"}
    return {**payload, "schema_version": version, "notes": notes}


@pytest.mark.parametrize("version", [1, 2])
def test_an_older_perf_file_reads_its_only_note_as_the_scope(tmp_path, version):
    import json

    from gate.speed.runs import PerfResult

    first = _perf_payload(1, [])["cases"][0]["case_id"]
    kept = "CPU timings (perf_counter, no L2 flush): history only, not a gate"
    path = tmp_path / "perf.json"
    path.write_text(json.dumps(_perf_payload(version, [kept, f"filtered with --only {first!r}"])))
    perf = PerfResult.read(path)
    assert (perf.scope, perf.notes) == (Scope(first), (kept,))
    assert not perf.scope.whole and perf.scope.admits(first)
    perf.write(tmp_path / "again.json")
    data = json.loads((tmp_path / "again.json").read_text())
    assert (data["schema_version"], data["scope"], data["notes"]) == (3, first, [kept])
    assert PerfResult.read(tmp_path / "again.json").scope == Scope(first)
    path.write_text(json.dumps(_perf_payload(version, [kept])))
    assert PerfResult.read(path).scope.whole  # no note: the whole suite


def test_a_perf_file_with_a_bad_scope_is_refused(tmp_path):
    import json

    from gate.speed.runs import PerfResult

    payload = {**_perf_payload(2, []), "schema_version": 3, "scope": "(a+)+$"}
    path = tmp_path / "perf.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(UserError, match="scope"):
        PerfResult.read(path)


@pytest.mark.parametrize("filtered", [True, False])
def test_perf_from_a_filtered_file_keeps_the_other_speed_rows(tmp_path, filtered):
    """A perf file of some cases (--only) updates those rows of the speed section and keeps the
    others; a whole run's file is the whole section."""
    import json

    from gate.core.config import Config
    from gate.workflow.speed_check import perf_section_from_file

    payload = _perf_payload(2, [])
    payload = {**payload, "schema_version": 3, "scope": payload["cases"][0]["case_id"] if filtered else None}
    path = tmp_path / "perf.json"
    path.write_text(json.dumps(payload))
    old = {"elsewhere-case": {"fwd": {"ratio": 1.0}}}
    section = perf_section_from_file(
        path, payload["kernel"], payload["suite"], payload["environment"]["gpu_class"], Config(), old, True
    )
    assert section and ("elsewhere-case" in section) is filtered


def test_the_journal_header_is_the_runs_key_and_scope(tmp_path):
    """Line 1 of a journal carries the key and scope; a resume under another suite hash, other
    multipliers or another --only is refused with the key and both values."""
    from gate.workflow.journal import Journal, journal_header, read_journal

    env = {"device": "cpu", "gpu_class": "cpu"}
    header = journal_header(KEY, Scope("s128"), "cpu", env, ("determinism",), (1, 2), "2026-01-01T00:00:00+00:00")
    assert header == {
        "kernel": "sdpa",
        "suite": "smoke",
        "suite_hash": "abc",
        "device": "cpu",
        "environment": env,
        "tolerance": {"mult_out": 2.0, "mult_dq": 3.0},
        "only": "s128",
        "checks": ["determinism"],
        "shard": [1, 2],
        "started_at": "2026-01-01T00:00:00+00:00",
    }
    path = tmp_path / "journal.jsonl"
    Journal(path).start(header, resume=False)
    assert read_journal(path, header) == ("2026-01-01T00:00:00+00:00", {})
    for other, key in (
        (replace(KEY, suite_hash="abd"), "suite_hash"),
        (RunKey.of("sdpa", "smoke", "abc", {"mult_out": 2.0, "mult_dq": 3.5}, "cpu"), "tolerance"),
        (KEY, "only"),
    ):
        now = journal_header(other, Scope("s64" if other == KEY else "s128"), "cpu", env, ("determinism",), (1, 2), "")
        with pytest.raises(UserError, match=f"another run: {key} was"):
            read_journal(path, now)


# ---------------------------------------------------------------- the environment, typed


def test_environment_reads_its_keys_typed_and_gives_the_record_back():
    from gate.core.identity import Environment

    record = {"device": "cuda", "gpu_class": "h100", "torch": "2.9.0", "git_commit": "abc+dirty", "host_id": "r7"}
    env = Environment.from_dict(record)
    assert (env.device, env.gpu_class, env.torch, env.git_commit, env.cuda) == (
        "cuda",
        "h100",
        "2.9.0",
        "abc+dirty",
        None,
    )
    assert env.extra == (("host_id", "r7"),)  # a key of a newer writer is kept, not dropped
    assert env.to_dict() == record
    assert env.gpu_class_or_unknown == "h100"
    assert Environment.from_dict({"device": "cpu"}).gpu_class_or_unknown == "unknown"
    assert Environment.from_dict({"driver": 550}).driver == "550"  # read as the string every reader printed


def test_a_results_files_environment_is_read_through_the_record():
    from gate.core.results import SweepResult

    sweep = SweepResult("sdpa", "smoke", "abc", {"device": "cpu", "gpu_class": "cpu"}, (), {}, "", 0.0)
    assert sweep.env.gpu_class == "cpu" and sweep.key.gpu_class == "cpu"
    bare = SweepResult("sdpa", "smoke", "abc", {}, (), {}, "", 0.0)
    assert bare.key.gpu_class == "unknown" and bare.env.device is None


# ---------------------------------------------------------------- shards of one run only


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"kernel": "flex"}, "kernel"),
        ({"suite_hash": "0" * 16}, "suite_hash"),
        ({"tolerance": {"mult_out": 9.0}}, "tolerance"),
        ({"scope": "s128"}, "scope"),
    ],
)
def test_merge_refuses_a_shard_of_another_run_naming_the_key(tmp_path, change, key):
    import gzip
    import json

    from gate.core.config import Config
    from gate.core.results import SweepResult, error_ratio, migrate_results
    from gate.workflow.merge import merge_shards

    data = json.loads(
        gzip.decompress((Path(__file__).parent / "data" / "cpu-sweep-sdpa-cpu-smoke.json.gz").read_bytes())
    )
    data = SweepResult.from_dict(migrate_results(data)).to_dict()
    for row in data["cases"]:  # the committed run predates the mean rule, which merge refuses: give it one
        for t in row["tensors"].values():
            t.update(pt_mean_err=t["mean_err"], mean_mult=1.5, mean_floor=t["floor"] / 4)
            t["mean_bound"] = 1.5 * t["mean_err"] + t["mean_floor"]
            t["mean_ratio"] = error_ratio(t["mean_err"], t["mean_bound"])
    folders = []
    for k, edit in ((1, {}), (2, change)):
        shard = {**data, "notes": [f"shard {k}/2"], **edit}
        if edit.get("scope"):
            shard["cases"] = [c for c in shard["cases"] if "s128" in c["case_id"]]
        folder = tmp_path / f"s{k}"
        folder.mkdir()
        (folder / "sweep-k-s.json").write_text(json.dumps(shard))
        folders.append(folder)
    with pytest.raises(UserError, match=f"merge: .*s2/sweep-k-s.json has {key} .*; merge shards of one run only"):
        merge_shards(folders, Config())
