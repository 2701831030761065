"""Rendering only: terminal tables, Markdown, plots. Reads findings and results; decides nothing."""

import os
import re
import shutil
import textwrap


def terminal_console():
    """A rich Console for tables: the terminal's width on a TTY; in a CI log (not a TTY, no
    COLUMNS set) 200 columns, since rich would otherwise squeeze every table into 80."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=200)
    return console


def terminal_width() -> int:
    """The terminal's width for plain printed lines: COLUMNS or the TTY's; in a CI log 200, as
    terminal_console's tables."""
    return shutil.get_terminal_size((200, 24)).columns


def wrap_words(line: str, width: int, indent: str = "  ") -> list[str]:
    """A summary line wrapped at whole words, its continuation indented by `indent`; a word wider
    than the terminal (a long path) is kept whole rather than cut, so it can still be copied, and
    a short `code span` is one word: a setting such as `causal = false` reads as it is pasted (a
    long command still wraps, to stay within the width)."""
    joined = _CODE_SPAN.sub(lambda m: _kept(m.group(0)), line)
    pieces = textwrap.wrap(
        joined, width=max(20, width), subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
    )
    return [piece.replace(_KEPT_SPACE, " ") for piece in pieces] or [line]


def _kept(span: str) -> str:
    return span.replace(" ", _KEPT_SPACE) if len(span) <= SHORT_SPAN else span


# every pair of backquotes in order (a long span's closing one never opens a short one); a span of
# up to SHORT_SPAN characters, backquotes included, stays on one line
_CODE_SPAN = re.compile(r"`[^`\n]+`")
SHORT_SPAN = 42
_KEPT_SPACE = "\ue000"  # a private-use character: no line holds it, and textwrap never breaks at it


def wrap_lines(lines: list[str], width: int, step: int = 2) -> list[str]:
    """Each line wrapped at whole words (wrap_words), continuing `step` columns right of its own indent."""
    return [piece for line in lines for piece in wrap_words(line, width, " " * (len(line) - len(line.lstrip()) + step))]


def wrapped(text: str) -> str:
    """`text` wrapped at whole words to the terminal's width, ready to print: each of its lines
    continues two columns right of its own indent."""
    return "\n".join(wrap_lines(text.splitlines() or [""], terminal_width()))
