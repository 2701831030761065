"""Rewrite the generated settings tables of docs/configuration.md from gate/core/config.py.

    .venv/bin/python scripts/settings_doc.py [--check]

--check writes nothing and exits 1 when the page differs from what it would write.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from gate.core.settings_doc import render

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the page is out of date; write nothing")
    args = parser.parse_args()
    old = PAGE.read_text()
    new = render(old)
    if args.check:
        if new != old:
            print(f"{PAGE} is out of date: run python scripts/settings_doc.py", file=sys.stderr)
            return 1
        return 0
    if new != old:
        fd, tmp = tempfile.mkstemp(dir=PAGE.parent, prefix=".configuration.", suffix=".md")
        with os.fdopen(fd, "w") as fh:
            fh.write(new)
        os.replace(tmp, PAGE)
        print(f"rewrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
