"""The bad-input corpus: one generator per class of hostile or broken file the gate reads.

Each generator takes a good project (`Project`: a config with a tiny suite, a real results file of
it and the baseline made from that file) and writes one bad variant into the project's folder,
returning the command that must refuse it (exit 2, one line naming the file and the field or
key, no traceback) and the words that line must hold. tests/test_bad_inputs.py runs every class.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

SUITE = "tiny"


@dataclass(frozen=True)
class Project:
    root: Path
    config: Path
    results: Path  # a real sweep of SUITE, every row PASS
    baseline: Path

    def results_json(self) -> dict:
        return json.loads(self.results.read_text())

    def write(self, name: str, payload: dict | str) -> Path:
        path = self.root / name
        path.write_text(payload if isinstance(payload, str) else json.dumps(payload))
        return path

    def check(self, results: Path, config: Path | None = None) -> list[str]:
        return [
            "check",
            "--config",
            str(config or self.config),
            "--results",
            str(results),
            "--out",
            str(self.root / "out-bad"),
            "--no-progress",
        ]

    def update(self, results: Path, config: Path | None = None) -> list[str]:
        return ["baseline", "update", "--config", str(config or self.config), "--from-results", str(results)]


def config_text(baselines: Path, extra: str = "", suite: str = SUITE) -> str:
    return (
        f'[tool.attn-gate]\nbaselines_dir = "{baselines.as_posix()}"\n{extra}'
        f'[tool.attn-gate.suites."{suite}"]\nseeds = [0]\n[[tool.attn-gate.suites."{suite}".matrix]]\n'
        f'dtype = ["fp32"]\nbatch = [1]\nseqlens = ["16", "24"]\nheads = ["2"]\nhead_dims = ["8"]\n'
        f'checks = [["determinism"]]\n'
    )


def _first_row(p: Project, edit: Callable[[dict], None]) -> dict:
    data = p.results_json()
    edit(data["cases"][0])
    return data


def _first_tensor(row: dict) -> dict:
    return next(iter(row["tensors"].values()))


# ---------------------------------------------------------------- results rows that contradict themselves


def pass_row_with_failed_check(p: Project):
    def edit(row):
        row["checks"][0]["passed"] = False

    return p.check(p.write("failed-check.json", _first_row(p, edit))), ["status PASS contradicts", "check failed"]


def bound_zero(p: Project):
    def edit(row):
        _first_tensor(row)["bound"] = 0.0

    return p.check(p.write("bound-zero.json", _first_row(p, edit))), ["bound = 0.0 must be > 0"]


def ratio_not_err_over_bound(p: Project):
    def edit(row):
        _first_tensor(row)["ratio"] = 0.0

    return p.check(p.write("ratio-forged.json", _first_row(p, edit))), ["ratio = 0.0 is not max_err / bound"]


def pass_row_at_ratio_50(p: Project):
    def edit(row):
        t = _first_tensor(row)
        t["max_err"] = 50 * t["bound"]
        t["ratio"] = 50.0

    return p.check(p.write("ratio-50.json", _first_row(p, edit))), ["status PASS contradicts", "over the bound"]


def checks_passed_not_a_bool(p: Project):
    def edit(row):
        row["checks"][0]["passed"] = "no"

    return p.check(p.write("passed-no.json", _first_row(p, edit))), ["passed = 'no' must be true, false or null"]


# ---------------------------------------------------------------- results files: types, bounds, scope, config


def huge_int(p: Project):
    def edit(row):
        _first_tensor(row)["mean_err"] = int("9" * 401)

    return p.check(p.write("huge-int.json", _first_row(p, edit))), ["mean_err", "out of range"]


def tolerance_null(p: Project):
    data = p.results_json()
    data["tolerance"] = None
    return p.check(p.write("tolerance-null.json", data)), ["tolerance = None"]


def bad_scope_regex(p: Project):
    data = p.results_json()
    data["scope"] = "(unclosed"
    return p.check(p.write("scope-regex.json", data)), ["scope = '(unclosed' is not a regular expression"]


def scope_excludes_own_cases(p: Project):
    data = p.results_json()
    data["scope"] = "^nothing-matches$"
    return p.check(p.write("scope-excludes.json", data)), ["excludes the file's own case"]


def notes_not_strings(p: Project):
    data = p.results_json()
    data["notes"] = [["a list"]]
    return p.check(p.write("notes-list.json", data)), ["notes must be a list of strings"]


def results_of_another_tolerance(p: Project):
    data = p.results_json()
    data["tolerance"] = {**data["tolerance"], "mult_dq": 50.0}
    return p.check(p.write("other-tolerance.json", data)), ["other tolerance multipliers than", "mult_dq"]


def results_of_another_suite_definition(p: Project):
    data = p.results_json()
    data["suite_hash"] = "0000000000000000"
    return p.check(p.write("other-suite.json", data)), ["another definition of suite 'tiny'"]


def results_without_cases(p: Project):
    data = p.results_json()
    data["cases"], data["harness_report"] = [], []
    data["summary"] = {k: 0 for k in data["summary"]}
    return p.check(p.write("no-cases.json", data)), ["cases = []", "no case"]


# ---------------------------------------------------------------- baseline update


def update_from_pass_row_over_bound(p: Project):
    def edit(row):
        t = _first_tensor(row)
        t["max_err"] = 1000 * t["bound"]
        t["ratio"] = 1000.0

    return p.update(p.write("update-ratio-1000.json", _first_row(p, edit))), ["status PASS contradicts"]


def update_with_another_tolerance(p: Project):
    data = p.results_json()
    data["tolerance"] = {**data["tolerance"], "mult_out": 3.0}
    return p.update(p.write("update-tolerance.json", data)), ["other tolerance multipliers than", "mult_out"]


# ---------------------------------------------------------------- baselines that contradict themselves


def _baseline_variant(p: Project, name: str, edit: Callable[[dict], None]) -> list[str]:
    """`check` of the good results against an edited copy of the baseline (`--baseline` before
    `--results`: the refused file is the first JSON file of the command)."""
    data = json.loads(p.baseline.read_text())
    edit(next(iter(data["correctness"].values())))
    bad = p.write(name, data)
    return [
        "check",
        "--config",
        str(p.config),
        "--baseline",
        str(bad),
        "--results",
        str(p.results),
        "--out",
        str(p.root / "out-bad"),
        "--no-progress",
    ]


def baseline_pass_row_relabelled_fail(p: Project):
    def edit(row):
        row["status"] = "FAIL"

    return _baseline_variant(p, "baseline-relabelled-fail.json", edit), ["status FAIL contradicts the row"]


def baseline_pass_row_without_dq(p: Project):
    def edit(row):
        del row["tensors"]["dq"]

    return _baseline_variant(p, "baseline-without-dq.json", edit), ["status PASS without dq"]


# ---------------------------------------------------------------- merge: shard notes and file kinds


def _shard_folder(p: Project, name: str, data: dict) -> Path:
    folder = p.root / name
    folder.mkdir()
    (folder / f"sweep-sdpa-cpu-{SUITE}.json").write_text(json.dumps(data))
    return folder


def _merge(p: Project, *folders: Path) -> list[str]:
    return ["merge", *map(str, folders), "--config", str(p.config), "--out", str(p.root / "out-bad")]


def shard_note_of_a_trillion(p: Project):
    data = p.results_json()
    data["notes"] = [*data["notes"], "shard 1/1000000000000"]
    return _merge(p, _shard_folder(p, "shard-huge", data)), ["notes", "'shard 1/1000000000000'", "N <= 1000"]


def shard_note_of_zero(p: Project):
    data = p.results_json()
    data["notes"] = [*data["notes"], "shard 1/0"]
    return _merge(p, _shard_folder(p, "shard-zero", data)), ["notes", "'shard 1/0'", "K <= N"]


def shard_of_another_kind(p: Project):
    data = p.results_json()
    data["notes"] = [*data["notes"], "shard 1/1"]
    data["kind"] = "attn-gate perf"
    return _merge(p, _shard_folder(p, "shard-perf", data)), ["kind = 'attn-gate perf' is not 'attn-gate sweep'"]


# ---------------------------------------------------------------- rows of another case


def results_row_of_another_case(p: Project):
    def edit(row):
        row["case"]["seeds"] = [0, 1]  # not part of the id: the row claims seeds the suite does not run

    return p.check(p.write("other-case.json", _first_row(p, edit))), [
        "rows measured a case that is not the suite's case"
    ]


def baseline_row_with_forged_case_hash(p: Project):
    def edit(row):
        row["case_hash"] = "0123456789abcdef"

    return _baseline_variant(p, "baseline-forged-hash.json", edit), ["case_hash of 1 rows names another case"]


# ---------------------------------------------------------------- regexes that backtrack without bound


def only_regex_that_backtracks(p: Project):
    return [
        "sweep",
        "--config",
        str(p.config),
        "--suite",
        SUITE,
        "--kernel",
        "sdpa-cpu",
        "--device",
        "cpu",
        "--only",
        "(x+x+)+y",
        "--out",
        str(p.root / "out-bad"),
        "--no-progress",
    ], ["--only '(x+x+)+y' holds a quantifier inside a repeated group"]


def scope_regex_that_backtracks(p: Project):
    data = p.results_json()
    data["scope"] = "(.*)*$"
    return p.check(p.write("scope-backtracks.json", data)), [
        "scope = '(.*)*$' holds a quantifier inside a repeated group"
    ]


def headroom_step_1e308(p: Project):
    cfg = p.write(
        "huge-step.toml", config_text(p.root / "baselines", "[tool.attn-gate.verdict]\nheadroom_step = 1e308\n")
    )
    return p.check(p.results, cfg), ["verdict", "headroom_step = 1e+308 must be a number in [0, 0.5]"]


# ---------------------------------------------------------------- configs


def multiplier_1e300(p: Project):
    cfg = p.write("huge-mult.toml", config_text(p.root / "baselines", "[tool.attn-gate.tolerance]\nmult_dq = 1e300\n"))
    return p.check(p.results, cfg), ["tolerance", "mult_dq", "must be a number in (0, 100]"]


def suite_name_with_a_path(p: Project):
    cfg = p.write("path-suite.toml", config_text(p.root / "baselines", suite="../../x"))
    return [
        "sweep",
        "--config",
        str(cfg),
        "--suite",
        "../../x",
        "--kernel",
        "sdpa-cpu",
        "--device",
        "cpu",
        "--out",
        str(p.root / "out-bad"),
        "--no-progress",
    ], ["suite name = '../../x' is not a plain name"]


def profile_kernel_unknown(p: Project):
    cfg = p.write("bad-profile.toml", config_text(p.root / "baselines", '[tool.attn-gate.cpu]\nkernel = "nope"\n'))
    return [
        "sweep",
        "--config",
        str(cfg),
        "--suite",
        SUITE,
        "--device",
        "cpu",
        "--out",
        str(p.root / "out-bad"),
        "--no-progress",
    ], [f"{cfg} [tool.attn-gate.cpu] kernel 'nope' is not a known kernel"]


CLASSES = {
    f.__name__: f
    for f in (
        pass_row_with_failed_check,
        bound_zero,
        ratio_not_err_over_bound,
        pass_row_at_ratio_50,
        checks_passed_not_a_bool,
        huge_int,
        tolerance_null,
        bad_scope_regex,
        scope_excludes_own_cases,
        notes_not_strings,
        results_of_another_tolerance,
        results_of_another_suite_definition,
        results_without_cases,
        update_from_pass_row_over_bound,
        update_with_another_tolerance,
        baseline_pass_row_relabelled_fail,
        baseline_pass_row_without_dq,
        multiplier_1e300,
        suite_name_with_a_path,
        profile_kernel_unknown,
        shard_note_of_a_trillion,
        shard_note_of_zero,
        shard_of_another_kind,
        results_row_of_another_case,
        baseline_row_with_forged_case_hash,
        only_regex_that_backtracks,
        scope_regex_that_backtracks,
        headroom_step_1e308,
    )
}
