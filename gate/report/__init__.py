"""Rendering only: terminal tables, Markdown, plots. Reads findings and results; decides nothing."""

import os


def terminal_console():
    """A rich Console for tables: the terminal's width on a TTY; in a CI log (not a TTY, no
    COLUMNS set) 200 columns, since rich would otherwise squeeze every table into 80."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=200)
    return console
