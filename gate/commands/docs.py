"""`attn-gate docs [PAGE]`: the documentation shipped with this attn-gate (the pages the workflows'
messages and `init` name). Exit 0, or 2 for an unknown page."""

from __future__ import annotations

import argparse

from gate.commands.help_text import parser_kwargs
from gate.core import docs


def register(sub) -> None:
    p = sub.add_parser(
        "docs",
        help="print a page of the documentation shipped with this attn-gate (or list them)",
        **parser_kwargs("docs"),
    )
    p.add_argument("page", nargs="?", default=None, help="a page name, e.g. ci, adopt, configuration")
    p.add_argument("--path", action="store_true", help="print the page's file path instead of its text")
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    if args.page is None:
        print(f"documentation of this attn-gate, in {docs.DOCS}:")
        print("\n".join(f"  {name}" for name in docs.pages()))
        print("`attn-gate docs NAME` prints one; --path gives its file")
        return 0
    path = docs.page(args.page)
    print(path if args.path else path.read_text(encoding="utf-8"), end="\n" if args.path else "")
    return 0
