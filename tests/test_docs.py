"""The README and docs/ stay a product: links resolve, the README stays short and starts with the two
commands, no references to this project's tracker or run folders, and every measured row in
docs/results/ names the commit it ran on. Each rule is also shown failing on a small bad input."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_MAX_LINES = 250
ADOPT = ROOT / "docs" / "adopt.md"
WALK_HEADING = "## The walk-through, measured"
WALK_MAX_COMMANDS = 6

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
TRACKER_ISSUE = re.compile(r"\bissues?\s+#(\d+)|\(#(\d+)\)", re.I)
RUN_FOLDER = re.compile(r"session-20\d\d")
# A commit: 7-40 hex digits after the word "commit(s)" in prose, or in a table's "commit" column.
COMMIT_IN_PROSE = re.compile(r"\bcommits?\b[\s:`(]*[0-9a-f]{7,40}\b")
SHA = re.compile(r"\b[0-9a-f]{7,40}\b")


def doc_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code, where brackets are code, not links."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def broken_links(text: str, where: Path) -> list[str]:
    """Relative link targets in `text` (a file at `where`) that name no existing file; anchors are
    ignored (only the file part is resolved), as are http(s) and mailto links."""
    broken = []
    for target in LINK.findall(prose(text)):
        if re.match(r"(https?|mailto):", target) or target.startswith("#"):
            continue
        path = (where.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            broken.append(target)
    return broken


def tracker_references(text: str) -> list[str]:
    """'issue #N' and '(#N)' with N < 100 (this project's tracker; upstream numbers are larger and are
    written owner/repo#N), and paths into per-run folders."""
    found = [m.group(0) for m in TRACKER_ISSUE.finditer(text) if int(m.group(1) or m.group(2)) < 100]
    return found + RUN_FOLDER.findall(text)


def tables_by_section(text: str) -> list[tuple[str, list[list[str]]]]:
    """(section prose, tables) per '## ' section; a table is its rows, header first, separator dropped."""
    sections = []
    for chunk in re.split(r"^(?=## )", FENCE.sub("", text), flags=re.M):
        lines = chunk.splitlines()
        tables, current, rest = [], [], []
        for line in lines + [""]:
            if line.lstrip().startswith("|"):
                if not re.fullmatch(r"\s*\|[\s:|-]*\|\s*", line):
                    current.append(line)
            else:
                if current:
                    tables.append(current)
                    current = []
                rest.append(line)
        sections.append(("\n".join(rest), tables))
    return sections


def cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def rows_without_commit(text: str) -> list[str]:
    """Table rows that carry a number but name no commit: neither in the table's 'commit' column nor,
    for a table without one, after the word 'commit' in its section's prose."""
    missing = []
    for section_prose, tables in tables_by_section(text):
        prose_has_commit = bool(COMMIT_IN_PROSE.search(section_prose))
        for header, *body in tables:
            names = [c.lower() for c in cells(header)]
            column = names.index("commit") if "commit" in names else None
            for row in body:
                if not re.search(r"\d", row):
                    continue
                values = cells(row)
                if column is not None:
                    ok = column < len(values) and bool(SHA.search(values[column]))
                else:
                    ok = prose_has_commit
                if not ok:
                    missing.append(row.strip())
    return missing


@dataclass(frozen=True)
class Walk:
    """docs/adopt.md's walk-through as tests/test_adoption.py runs it: the set-up lines, the
    kernel module and the commands, one a line (blank lines and whole-line comments dropped)."""

    setup: tuple[str, ...]
    kernel: str
    commands: tuple[str, ...]


def walk_through(text: str) -> Walk:
    """The walk-through section's three fenced blocks: set-up (bash), kernel (python), walk (bash)."""
    parts = text.split(f"\n{WALK_HEADING}\n", 1)
    assert len(parts) == 2, f"no '{WALK_HEADING}' section"
    section = re.split(r"^## ", parts[1], maxsplit=1, flags=re.M)[0]
    blocks = re.findall(r"^```(\w*)\n(.*?)^```$", section, re.M | re.S)
    assert [lang for lang, _ in blocks] == ["bash", "python", "bash"], (
        f"'{WALK_HEADING}' needs three fenced blocks, bash (set-up), python (the kernel), bash (the walk); "
        f"found {[lang for lang, _ in blocks]}"
    )

    def lines(body: str) -> tuple[str, ...]:
        return tuple(ln for ln in body.splitlines() if ln.strip() and not ln.lstrip().startswith("#"))

    return Walk(setup=lines(blocks[0][1]), kernel=blocks[1][1], commands=lines(blocks[2][1]))


# ---- the rules on the real files ----------------------------------------------------------------


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(path):
    assert broken_links(path.read_text(), path) == [], f"{path.relative_to(ROOT)}: links to missing files"


def test_readme_is_short_and_starts_with_the_two_commands():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines, at most {README_MAX_LINES}"
    commands = [ln.strip() for ln in lines[:6] if ln.strip().startswith("bash ")]
    assert [c.split("#")[0].strip() for c in commands] == ["bash scripts/gate.sh", "bash scripts/test.sh"]


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_tracker_numbers_or_run_folders(path):
    assert tracker_references(path.read_text()) == []


@pytest.mark.parametrize("path", sorted((ROOT / "docs" / "results").glob("*.md")), ids=lambda p: p.name)
def test_every_measured_row_names_its_commit(path):
    assert rows_without_commit(path.read_text()) == []


def test_the_walk_through_is_at_most_six_commands():
    walk = walk_through(ADOPT.read_text())
    assert 1 <= len(walk.commands) <= WALK_MAX_COMMANDS, walk.commands
    assert "def attn(" in walk.kernel


def test_results_pages_exist():
    assert {p.name for p in (ROOT / "docs" / "results").glob("*.md")} >= {"cpu.md", "h200.md"}


# ---- each rule fails on a bad input -------------------------------------------------------------


def test_link_rule_fails_on_a_missing_file(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "there.md").write_text("x")
    page = tmp_path / "docs" / "index.md"
    text = (
        "[ok](there.md) [ok](there.md#a-section) [web](https://example.org/x.md) [mail](mailto:a@b)\n"
        "[gone](missing.md) [gone too](../nowhere/readme.md#top)\n"
        "`[code](not-a-link.md)`\n```\n[fenced](not-a-link-either.md)\n```\n"
    )
    assert broken_links(text, page) == ["missing.md", "../nowhere/readme.md#top"]


def test_tracker_rule_fails_on_our_numbers_not_upstream_ones():
    text = (
        "fixed in issue #27; see (#9). Upstream: pytorch/pytorch#162588, (#186075), issue #895 of "
        "flash-attention. Raw runs: reports/h200/session-2026-12-01/."
    )
    assert tracker_references(text) == ["issue #27", "(#9)", "session-2026"]


def test_commit_rule_fails_on_a_row_without_one():
    good = (
        "## Tier times\n\n| what | commit | wall |\n|---|---|---|\n| pr | 5913112 | 167.7 s |\n\n"
        "## Speed\n\nCommand: `attn-gate check`, commit cf213a9.\n\n| pass | change |\n|---|---|\n"
        "| fwd | +2.9% |\n"
    )
    assert rows_without_commit(good) == []
    bad = (
        "## Tier times\n\n| what | commit | wall |\n|---|---|---|\n| pr | today | 167.7 s |\n\n"
        "## Speed\n\nCommand: `attn-gate check` on the H200.\n\n| pass | change |\n|---|---|\n"
        "| fwd | +2.9% |\n| name only | - |\n"
    )
    assert rows_without_commit(bad) == ["| pr | today | 167.7 s |", "| fwd | +2.9% |"]


def test_walk_rule_fails_on_seven_commands_or_a_missing_block():
    kernel = "```python\ndef attn(q, k, v): ...\n```\n"
    good = f"# A\n\n{WALK_HEADING}\n\n```bash\ngit init k\n```\n\n{kernel}\n```bash\n# two\na\n\nb\n```\n\n## Next\n"
    assert walk_through(good) == Walk(("git init k",), "def attn(q, k, v): ...\n", ("a", "b"))
    seven = good.replace("a\n\nb\n", "".join(f"c{i}\n" for i in range(7)))
    assert len(walk_through(seven).commands) == 7 > WALK_MAX_COMMANDS
    with pytest.raises(AssertionError, match="three fenced blocks"):
        walk_through(good.replace(kernel, ""))
    with pytest.raises(AssertionError, match="no '## The walk-through, measured' section"):
        walk_through(good.replace(WALK_HEADING, "## Another"))
