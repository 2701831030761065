"""Output names and paths shared by every command that writes: one file-name rule, one writability check.

Kept at the bottom of the package so that readers of results (baselines, reports, drift) do not
import the sweep that produced them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gate.core.errors import UserError


def safe_name(kernel: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", kernel)


def require_writable(path: Path, option: str = "--out", kind: str = "folder") -> None:
    """Refuse, before minutes of measuring, an output path that cannot be written: `kind` "folder"
    (--out) or "file" (--summary). The nearest existing folder on the way must be a writable
    directory; nothing is created here."""
    path = Path(path)
    if kind == "file" and path.is_dir():
        raise UserError(f"{option} {path}: is a directory; pass a file name")
    probe = path.parent if kind == "file" else path
    while not probe.exists() and probe.parent != probe:  # exists() is False under a file too (/dev/null/x)
        probe = probe.parent
    if not probe.is_dir():
        where = "exists" if probe == path else f"{probe} exists"
        raise UserError(f"{option} {path}: {where} and is not a directory; "
                        f"pass a {'folder' if kind == 'folder' else 'file in a folder'}")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"{option} {path}: {probe} is not writable; pass a writable {kind}")
