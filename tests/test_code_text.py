"""Code speaks of the code: comments and docstrings in gate/, tests/, scripts/ and benchmarks/ say
why, never which tracker issue, run or date found it, and never point into run folders (history
lives in git and CHANGELOG.md; measurements in docs/results/)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("gate", "tests", "scripts", "benchmarks", ".ci")
# A tracker reference ("issue #12", "(#9)", "#15:"), a run date, a session or a notebook path.
HISTORY = re.compile(
    r"\bissues? #\d+|(?<![\w&/])#\d{1,2}\b(?![\w;])|\b20\d\d-\d\d-\d\d\b|\bsession[- ]\d"
    r"|\b(?:reports|evidence)/"
)


def prose_of_python(text: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a Python source."""
    found = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(text).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                found.append((node.body[0].lineno, doc))
    return found


def prose_of_hash_comments(text: str) -> list[tuple[int, str]]:
    """(line, text) of every `#` comment of a shell or TOML file (a `#` inside a quoted string
    is rare in these files and would only make the check stricter)."""
    return [(n, line[line.index("#") :]) for n, line in enumerate(text.splitlines(), 1) if "#" in line]


def history_in(path: Path, root: Path = REPO) -> list[str]:
    text = path.read_text(encoding="utf-8")
    prose = prose_of_python(text) if path.suffix == ".py" else prose_of_hash_comments(text)
    return [
        f"{path.relative_to(root)}:{line}: {m.group(0)!r}" for line, chunk in prose for m in HISTORY.finditer(chunk)
    ]


def source_files() -> list[Path]:
    files = []
    for folder in FOLDERS:
        for path in sorted((REPO / folder).rglob("*")):
            if (
                path.is_file()
                and (path.suffix in (".py", ".toml", ".sh") or path.name == "run")
                and "vendor" not in path.relative_to(REPO).parts
            ):
                files.append(path)
    return files


def test_no_comment_or_docstring_narrates_history():
    found = [hit for path in source_files() if path.name != Path(__file__).name for hit in history_in(path)]
    assert not found, "say why, not when or which issue:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source, bad",
    [
        ("x = 1  # issue #16: the bias\n", True),
        ("x = 1  # the bias (#16)\n", True),
        ('def f():\n    """Measured on 2026-12-01 on the H200."""\n', True),
        ("# see reports/h200/depth.md\nx = 1\n", True),
        ("x = 1  # run in session-2026-12-01b, call 3\n", True),
        ("x = 1  # flash-attention #895: -1 becomes seqlen_k\n", False),
        ("x = 1  # pytorch #162588: scores past 2^32\n", False),  # an upstream link names its project
        ("x = 1  # the bias, as the kernel reads it\n", False),
        ('s = "2026-01-01"  # data, not prose\n', False),
        ("x = '&#64;someone'  # an escaped mention\n", False),
    ],
)
def test_the_history_check_tells_narration_from_code(tmp_path, source, bad):
    path = tmp_path / "m.py"
    path.write_text(source)
    assert bool(history_in(path, tmp_path)) is bad
