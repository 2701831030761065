"""docs/configuration.md's settings tables, generated from the declarations in gate/core/config.py.

The page holds each table between two markers; `render` replaces what lies between them, so the
prose around the tables stays hand-written and the tables cannot drift from what the code checks.
`python scripts/settings_doc.py` rewrites the page; tests/test_config.py fails while it differs.
"""

from __future__ import annotations

import re

from gate.core.config import SETTINGS

HEADER = "<!-- generated from gate/core/config.py by scripts/settings_doc.py: edit the declarations -->"


def _default(value: object) -> str:
    """A default as it is written in TOML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def settings_table() -> list[str]:
    """Every declared setting: its default, unit and meaning."""
    from gate.core.config import SECTIONS

    defaults = {f"{s}.{k}": v for s, cls in SECTIONS.items() for k, v in vars(cls()).items()}
    lines = ["| setting | default | unit | meaning |", "|---|---|---|---|"]
    for key, declared in SETTINGS.items():
        lines.append(f"| `{key}` | `{_default(defaults[key])}` | {declared.unit} | {declared.meaning} |")
    return lines


def ranges_table() -> list[str]:
    """Every numeric setting's valid range and the reason for its bound."""
    lines = ["| setting | valid range | why this bound |", "|---|---|---|"]
    for key, declared in SETTINGS.items():
        if declared.range is not None:
            lines.append(f"| `{key}` | {declared.range.text()} | {declared.why} |")
    return lines


TABLES = {"settings": settings_table, "ranges": ranges_table}


def render(page: str) -> str:
    """The page with each generated table replaced by its text now. A marker pair missing is a
    ValueError: the page would silently stop being checked."""
    for name, table in TABLES.items():
        begin, end = f"<!-- begin {name} table -->", f"<!-- end {name} table -->"
        block = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.S)
        if len(block.findall(page)) != 1:
            raise ValueError(f"the page needs exactly one {begin} ... {end} pair")
        text = "\n".join([begin, HEADER, *table(), end])
        page = block.sub(lambda _: text, page)
    return page
