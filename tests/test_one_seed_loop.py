"""One seed loop, one exception ladder, one SweepResult build: read from the source, so a second
copy in any executor is found (tests/test_isolation_features.py shows the rows they make agree)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def sites(source: str, wanted) -> list[str]:
    """The function (innermost, dotted through enclosing ones) of each node `wanted` accepts."""
    found: list[str] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = f"{where}.{child.name}".lstrip(".") if isinstance(child, ast.FunctionDef | ast.ClassDef) else where
            if wanted(child):
                found.append(inner)
            visit(child, inner)

    visit(ast.parse(source), "")
    return found


def in_gate(wanted) -> set[tuple[str, str]]:
    return {
        (str(path.relative_to(ROOT)), where)
        for path in sorted((ROOT / "gate").rglob("*.py"))
        for where in sites(path.read_text(), wanted)
    }


def loops_over_seeds(node: ast.AST) -> bool:
    return isinstance(node, ast.For) and isinstance(node.iter, ast.Attribute) and node.iter.attr == "seeds"


def catches(*names: str):
    def wanted(node: ast.AST) -> bool:
        return isinstance(node, ast.ExceptHandler) and isinstance(node.type, ast.Name) and node.type.id in names

    return wanted


def builds_sweep_result(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "SweepResult"


def test_the_finders_find_a_planted_copy():
    planted = (
        "def run(case):\n    for seed in case.seeds:\n        try:\n            pass\n"
        "        except NoKernel:\n            pass\n    return SweepResult(kernel=1)\n"
    )
    assert sites(planted, loops_over_seeds) == ["run"]
    assert sites(planted, catches("NoKernel", "BadOutput")) == ["run"]
    assert sites(planted, builds_sweep_result) == ["run"]
    assert sites("def run(case):\n    for seed in seeds:\n        pass\n", loops_over_seeds) == []


def test_a_cases_seeds_are_looped_over_in_one_place():
    assert in_gate(loops_over_seeds) == {("gate/correctness/run_case.py", "seed_loop")}


def test_the_kernels_refusal_and_bad_output_are_caught_in_one_ladder():
    """The seed loop and the kernel's side of a case around it; the timing of a case (one call,
    no seeds) answers a refusal with a SKIP of its own."""
    assert in_gate(catches("NoKernel", "BadOutput")) == {
        ("gate/correctness/run_case.py", "seed_loop"),
        ("gate/correctness/run_case.py", "run_seeds"),
        ("gate/speed/runs.py", "measure_case"),
    }


def test_a_runs_sweep_result_is_built_in_one_place():
    """From a plan in sweep_result; the merge of shards joins results that have no plan."""
    assert in_gate(builds_sweep_result) == {
        ("gate/workflow/sweep.py", "sweep_result"),
        ("gate/workflow/merge.py", "merge_shards"),
    }
