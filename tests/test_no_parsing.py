"""Decide once, carry the decision typed: after a rule has spoken, no code under gate/ recovers its
meaning from text. A finding's subject is a `Subject` (never a "quantity:item" string split
apart), its advice an `Advice` (never found in the message or trimmed off it), a case's traits
come from its Case (never from a regex over its id), a run's scope from a field (never from a note).

The only allowed place is the findings-file reader: `Subject.parse` in gate/compare/findings.py
turns the "metric" a findings JSON holds back into a Subject (reading a file is not a decision)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

GATE = Path(__file__).resolve().parent.parent / "gate"

# the one reader of a findings file's "metric": a file read, not a decision re-made
ALLOWED = {("compare/findings.py", "Subject.parse")}

PATTERNS = {
    "a finding's metric split into quantity and item": re.compile(
        r"\bmetric\b[\]'\"]*\.(split|rsplit|partition|rpartition|startswith|endswith|removeprefix|removesuffix)\("
    ),
    "advice searched for in a message": re.compile(r"""(refresh the baseline["']|\bREFRESH)\s+(not\s+)?in\b"""),
    "advice trimmed off a message": re.compile(r"""remove(suffix|prefix)\([^)]*(refresh|purpose|baseline)"""),
    "a message cut at its advice": re.compile(r"""\.partition\(\s*(REFRESH|["']refresh)"""),
    "--only read back from a note": re.compile(r"""["']--only["']\s+in\b"""),
    "case traits read off a case id": re.compile(r"\bcase_id\.split\(|_is_decode_id|_has_bias_grad_id"),
}


def _functions(text: str) -> list[tuple[int, str]]:
    """(line number, qualified name) of each def/class opening, to name where a hit lives."""
    out, stack = [], []
    for n, line in enumerate(text.splitlines(), 1):
        m = re.match(r"(\s*)(def|class) (\w+)", line)
        if m:
            depth = len(m.group(1)) // 4
            stack = stack[:depth] + [m.group(3)]
            out.append((n, ".".join(stack)))
    return out


def hits(pattern: re.Pattern, root: Path = GATE) -> list[str]:
    """'path:line (function): text' for each match outside ALLOWED and outside comments and docstrings' prose."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        text = path.read_text()
        defs = _functions(text)
        for n, line in enumerate(text.splitlines(), 1):
            code = line.split("#", 1)[0]
            if not pattern.search(code):
                continue
            where = next((name for start, name in reversed(defs) if start <= n), "")
            if (rel, where) in ALLOWED:
                continue
            found.append(f"{rel}:{n} ({where}): {line.strip()}")
    return found


@pytest.mark.parametrize("what", sorted(PATTERNS))
def test_no_meaning_is_parsed_out_of_text_after_a_decision(what):
    assert hits(PATTERNS[what]) == [], what


@pytest.mark.parametrize(
    "line",
    [
        'tensor = f.metric.split(":", 1)[-1]',
        'if f.metric.startswith("ratio:"):',
        'pass_ = d["metric"].partition(":")[2]',
        "elif f.severity is Severity.WARN and failing and REFRESH in f.message:",
        'if "refresh the baseline" in f.message:',
        'head.rstrip(" ;,:(").removesuffix("; if it was removed on purpose,")',
        "head, sep, _ = message.partition(REFRESH)",
        'filtered = any("--only" in n for n in result.notes)',
        'return any(part.startswith("bias.") for part in case_id.split("-"))',
    ],
)
def test_each_pattern_catches_what_it_names(tmp_path, line):
    """The grep is only as good as its patterns: each of the old forms is caught, the typed forms are not."""
    (tmp_path / "old.py").write_text(f"def render(f):\n    {line}\n")
    assert any(hits(p, tmp_path) for p in PATTERNS.values()), line


@pytest.mark.parametrize(
    "line",
    [
        "tensor = f.subject.item",
        "if f.subject.quantity is Quantity.RATIO:",
        "elif f.severity is Severity.WARN and failing and f.advice is Advice.REFRESH_BASELINE:",
        "message = f.statement + ' (the run fails: do not refresh the baseline now)'",
        'name = name.removesuffix(".md")',
    ],
)
def test_the_typed_forms_pass(tmp_path, line):
    (tmp_path / "new.py").write_text(f"def render(f):\n    {line}\n")
    assert not any(hits(p, tmp_path) for p in PATTERNS.values()), line


def test_the_allowed_reader_is_where_it_is_said_to_be():
    """An allowance that names nothing would hide a moved parser: the reader exists and parses."""
    text = (GATE / "compare" / "findings.py").read_text()
    start = text.index("    def parse(cls, metric: str)")
    assert 'metric.partition(":")' in text[start : start + 400]
