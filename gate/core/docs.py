"""The documentation shipped in the package: `gate/docs/` is the repository's docs/ (a link in a
checkout, copied into the wheel as package data), so a message can name a page that exists in
every install instead of a URL."""

from __future__ import annotations

import difflib
from pathlib import Path

from gate.core.errors import UserError

DOCS = Path(__file__).resolve().parents[1] / "docs"


def pages() -> list[str]:
    """The page names `attn-gate docs NAME` takes: docs/NAME.md, results/NAME.md."""
    if not DOCS.is_dir():
        return []
    return sorted(str(p.relative_to(DOCS).with_suffix("")) for p in DOCS.rglob("*.md"))


def page(name: str) -> Path:
    """The shipped file of page `name` (`ci`, `adopt`, `results/h200`; a trailing .md is allowed)."""
    name = name.removesuffix(".md").removeprefix("docs/")
    known = pages()
    if not known:
        raise UserError(f"this attn-gate has no documentation in {DOCS}: reinstall it from a wheel or a checkout")
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise UserError(f"no documentation page {name!r}; {hint}`attn-gate docs` lists them")
    return DOCS / f"{name}.md"
