"""The package's plan, enforced: imports run one way, and the pure decision code stays pure.

Every `import` in gate/ is read with ast (module level and inside functions alike, since a lazy
import is still a dependency), so a cycle or a layer breach fails here, not in review.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "gate"

# Subpackages bottom-up: a package may import itself and anything listed before it, nothing after.
LAYERS = ("core", "attention", "kernels", "correctness", "speed", "compare", "report", "workflow", "commands")
# The statistics and verdict code: plain floats and dataclasses in, decisions out.
PURE = ("gate.speed.stats", "gate.speed.rule", "gate.compare", "gate.kernels.capabilities")


def package_files() -> list[Path]:
    """The package's modules; templates/ holds scripts shipped as data to run elsewhere (the runner
    hook runs on the runner host with the standard library alone), not modules of these layers."""
    return [p for p in ROOT.rglob("*.py") if "templates" not in p.relative_to(ROOT).parts]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, resolved to full dotted names (relative imports included)."""
    tree = ast.parse(path.read_text(), str(path))
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from gate.speed import stats`
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in package_files()}
    edges = {}
    for name, path in modules.items():
        edges[name] = {m for m in imports_of(path) if m in modules and m != name}
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A cycle as a list of nodes (first == last), or None. Iterative DFS with colours."""
    colour = {n: 0 for n in edges}
    for start in sorted(edges):
        if colour[start]:
            continue
        stack = [(start, iter(sorted(edges[start])))]
        path = [start]
        colour[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour.get(child, 2) == 1:
                return path[path.index(child) :] + [child]
            elif colour.get(child) == 0:
                colour[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(edges[child]))))
    return None


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in LAYERS else None


def test_no_module_import_cycle():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_find_cycle_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_layers_import_downwards_only():
    breaches = []
    for mod, deps in graph().items():
        own = layer(mod)
        if own is None:
            continue
        for dep in deps:
            other = layer(dep)
            if other is not None and LAYERS.index(other) > LAYERS.index(own):
                breaches.append(f"{mod} ({own}) imports {dep} ({other})")
    assert not breaches, "imports that run upwards:\n" + "\n".join(sorted(breaches))


def test_argparse_only_in_commands():
    users = [module_name(p) for p in package_files() if "argparse" in imports_of(p)]
    assert users and all(u.startswith("gate.commands") for u in users), users


def test_pure_code_never_reaches_torch():
    """Statistics and verdict modules, and every gate module they import (transitively), have no
    torch import anywhere, lazy ones included."""
    edges = graph()
    paths = {module_name(p): p for p in package_files()}
    roots = [m for m in edges if any(m == p or m.startswith(p + ".") for p in PURE)]
    assert roots
    seen, todo = set(), list(roots)
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        todo.extend(edges[mod])
    torchy = sorted(m for m in seen if any(i == "torch" or i.startswith("torch.") for i in imports_of(paths[m])))
    assert not torchy, f"pure decision code reaches torch through: {torchy}"


@pytest.mark.parametrize("layer_name", LAYERS)
def test_every_layer_is_a_package(layer_name):
    assert (ROOT / layer_name / "__init__.py").is_file()


# Folders of gate/ that hold no code: the shipped docs (a link to docs/) and vendored files.
DATA_ROOMS = ("docs", "vendor")
VENDORED = (".js", ".css", ".woff", ".ttf", ".map")


def test_every_folder_is_a_layer_or_a_data_room_and_vendored_files_live_in_vendor():
    """Third-party web assets are not code of any layer: they live in gate/vendor/, with no module."""
    folders = {p.name for p in ROOT.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders - set(LAYERS) <= set(DATA_ROOMS), sorted(folders - set(LAYERS) - set(DATA_ROOMS))
    in_code = [p for layer in LAYERS for p in (ROOT / layer).rglob("*") if p.suffix in VENDORED]
    assert not in_code, f"vendored files in a code room (move them to gate/vendor/): {in_code[:5]}"
    assert not list((ROOT / "vendor").rglob("*.py"))
    for folder in (p for p in (ROOT / "vendor").iterdir() if p.is_dir()):
        assert (folder / "README.md").is_file() and list((folder / "licenses").iterdir()), folder


def test_speed_judging_modules_load_without_torch():
    """`check --results` and `baseline update --perf-from` read and judge files: importing the speed
    modules they use must not load torch (~0.7 s; it once came in through a helper of run_case)."""
    import subprocess
    import sys

    code = (
        "import sys, gate.speed.runs, gate.workflow.speed_check, gate.report.speed_report; "
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT.parent).returncode == 0


# What may stay a function-level import: torch and the kernels' libraries, and the heavy helpers
# (plots, asv, tables, arrays) a command loads only when it needs them.
HEAVY_ROOTS = {
    "torch",
    "triton",
    "flash_attn",
    "flash_attn_interface",
    "flash_attn_config",
    "matplotlib",
    "asv",
    "pandas",
    "numpy",
    "rich",
    "pynvml",
    "yaml",
    "packaging",
}
MAX_NEEDLESS_LAZY_IMPORTS = 20


def module_level_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in tree.body:
        for n in (
            [node]
            if isinstance(node, (ast.Import, ast.ImportFrom))
            else ast.walk(node)
            if isinstance(node, (ast.If, ast.Try))
            else ()
        ):
            if isinstance(n, ast.Import):
                found |= {a.name for a in n.names}
            elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
                found |= {n.module} | {f"{n.module}.{a.name}" for a in n.names}
    return found


def heavy_modules(paths: dict[str, Path]) -> set[str]:
    """The gate modules whose module-level imports reach a heavy library, directly or through
    other gate modules: importing one is what a lazy import puts off."""
    direct = {m: module_level_imports(p) for m, p in paths.items()}
    heavy = {
        m
        for m, imps in direct.items()
        if any(
            i.split(".")[0] in HEAVY_ROOTS or i.split(".")[0] not in {"gate", "__future__", *sys.stdlib_module_names}
            for i in imps
        )
    }
    changed = True
    while changed:
        changed = False
        for m, imps in direct.items():
            if m not in heavy and any(i in heavy for i in imps):
                heavy.add(m)
                changed = True
    return heavy


def needless_lazy_imports(
    paths: dict[str, Path], stdlib: frozenset[str] = frozenset(sys.stdlib_module_names)
) -> list[str]:
    """Imports inside functions of a module that could stand at its top: a standard-library module,
    or a gate module that loads nothing heavy (or nothing the importer does not load already)."""
    heavy = heavy_modules(paths)
    found = []
    for m, p in sorted(paths.items()):
        for f in ast.walk(ast.parse(p.read_text(), str(p))):
            if not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for n in ast.walk(f):
                if isinstance(n, ast.Import):
                    targets = [a.name for a in n.names]
                elif isinstance(n, ast.ImportFrom) and not n.level and n.module:  # `from pkg import module` too
                    targets = [n.module] + [f"{n.module}.{a.name}" for a in n.names if f"{n.module}.{a.name}" in paths]
                else:
                    continue
                for t in targets:
                    root = t.split(".")[0]
                    if root in HEAVY_ROOTS:
                        continue
                    if root == "gate":
                        if t in paths and t in heavy and m not in heavy:
                            continue
                    elif root not in stdlib:
                        continue  # an optional third-party module: lazy on purpose
                    found.append(f"{m}:{n.lineno} {t}")
    return found


def test_imports_stand_at_the_top_unless_they_must_be_lazy():
    paths = {module_name(p): p for p in package_files()}
    needless = needless_lazy_imports(paths)
    assert len(needless) <= MAX_NEEDLESS_LAZY_IMPORTS, "\n".join(needless)


def test_the_lazy_import_count_tells_a_needless_one_from_a_needed_one(tmp_path):
    light = tmp_path / "light.py"
    light.write_text("import json\n\ndef f():\n    import os\n    import torch\n    from gate.heavy import x\n")
    heavy = tmp_path / "heavy.py"
    heavy.write_text("import torch\n\ndef g():\n    import re\n    from gate.light import f\n")
    found = needless_lazy_imports({"gate.light": light, "gate.heavy": heavy})
    # os (stdlib) and gate.light (light) need not be lazy; torch and a heavy module from a light one must be
    assert found == ["gate.heavy:4 re", "gate.heavy:5 gate.light", "gate.light:4 os"]
