"""The environment record is read through its typed form (gate/core/identity.py `Environment`):
outside that module no code under gate/ reads a key out of an environment dict (`.get(...)` or
`[...]` on `x.environment`, on a name ending in `_env`, or on a name bound to `x.environment`).
Writing one (describe, a merged record) is not a read."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

GATE = Path(__file__).resolve().parent.parent / "gate"
THE_RECORD = "core/identity.py"


def _receiver(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def dict_reads(text: str) -> list[int]:
    """Line numbers of the environment dict reads in one module's source."""
    tree = ast.parse(text)
    aliases = {  # `env = sweep.environment`: env is the dict under another name
        t.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Attribute) and n.value.attr == "environment"
        for t in n.targets
        if isinstance(t, ast.Name)
    }

    def is_env(node: ast.AST) -> bool:
        name = _receiver(node)
        return name is not None and (name == "environment" or name.endswith("_env") or name in aliases)

    lines = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load) and is_env(n.value):
            lines.append(n.lineno)
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get":
            if is_env(n.func.value):
                lines.append(n.lineno)
    return sorted(lines)


def hits() -> list[str]:
    found = []
    for path in sorted(GATE.rglob("*.py")):
        rel = path.relative_to(GATE).as_posix()
        if rel == THE_RECORD:
            continue
        text = path.read_text(encoding="utf-8")
        found += [f"{rel}:{n}: {text.splitlines()[n - 1].strip()}" for n in dict_reads(text)]
    return found


def test_no_environment_dict_is_read_outside_the_typed_record():
    assert hits() == []


@pytest.mark.parametrize(
    "line",
    [
        'version = str(sweep.environment.get("kernel_version", ""))',
        "shown = old.environment[key]",
        "drift = rule(key, base_env.get(key), cur_env.get(key))",
        "env = result.environment\n    name = env.get('gpu_name', 'cpu')",
        "env = result.environment\n    name = env['gpu_name']",
    ],
)
def test_each_dict_read_is_counted(line):
    assert dict_reads(f"def f(sweep, old, result, key):\n    {line}\n"), line


@pytest.mark.parametrize(
    "line",
    [
        "version = sweep.env.kernel_version or ''",
        "shown = old.env.value(key)",
        "env = os.environ\n    token = env.get('GITHUB_TOKEN', '')",
        "env = {**old.environment, **new.environment}",
        "environment['host'] = host_id(device)",
    ],
)
def test_typed_reads_and_writes_are_not_counted(line):
    assert not dict_reads(f"def f(sweep, old, new, os, environment, device):\n    {line}\n"), line
