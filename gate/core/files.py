"""Output names and paths shared by every command that writes: one file-name rule, one writability check.

Kept at the bottom of the package so that readers of results (baselines, reports, drift) do not
import the sweep that produced them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import tempfile
from pathlib import Path

from gate.core.errors import UserError
from gate.core.warn import warn


def safe_name(kernel: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", kernel)


def require_writable(path: Path, option: str = "--out", kind: str = "folder") -> None:
    """Refuse, before minutes of measuring, an output path that cannot be written: `kind` "folder"
    (--out) or "file" (--summary). The nearest existing folder on the way must be a writable
    directory; nothing is left behind here."""
    path = Path(path)
    if kind == "file" and path.is_dir():
        raise UserError(f"{option} {path}: is a directory; pass a file name")
    if kind == "file" and (path.exists() or path.is_symlink()) and not path.is_file():
        # a device file or FIFO would be replaced by the atomic write's rename
        raise UserError(
            f"{option} {path}: exists and is not a regular file (a device, FIFO or socket); pass a file name"
        )
    probe = path.parent if kind == "file" else path
    while not probe.exists() and probe.parent != probe:  # exists() is False under a file too (/dev/null/x)
        probe = probe.parent
    if not probe.is_dir():
        where = "exists" if probe == path else f"{probe} exists"
        raise UserError(
            f"{option} {path}: {where} and is not a directory; "
            f"pass a {'folder' if kind == 'folder' else 'file in a folder'}"
        )
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"{option} {path}: {probe} is not writable; pass a writable {kind}")
    # access() says yes to root on /proc and on read-only mounts: a file made and removed at once answers

    try:
        with tempfile.TemporaryFile(dir=probe, prefix=".attn-gate-probe-"):
            pass
    except OSError as exc:
        raise UserError(
            f"{option} {path}: cannot write in {probe} ({exc.strerror or exc}); pass a writable {kind}"
        ) from None


def refuse_inside_baselines(out: Path, baselines_dir: str | Path, option: str = "--out") -> None:
    """Run outputs never go into the committed baselines folder (`git add -A` there would commit them)."""
    out_real, base_real = os.path.realpath(out), os.path.realpath(baselines_dir)
    if out_real == base_real or out_real.startswith(base_real.rstrip(os.sep) + os.sep):
        raise UserError(
            f"{option} {out}: is inside the baselines folder {baselines_dir}, which holds committed baselines "
            f"only; pass another folder (e.g. --out out)"
        )


class FolderLock:
    """An exclusive lock on a folder that a run writes to (`--out`, a baselines folder), held while it
    writes: a second run on the same folder is refused at once instead of interleaving files with the
    first (two `baseline update` runs would lose one update). The lock is flock(2) on a file named
    after the folder's real path in the system temp folder: nothing is written in (or creates) the
    folder itself, and the lock ends with the process, so a killed run never leaves a stale lock."""

    def __init__(self, folder: Path, option: str = "--out"):
        self.folder, self.option = Path(folder), option
        self._fd: int | None = None

    def __enter__(self) -> "FolderLock":
        # fsencode: a folder name that is not UTF-8 (surrogate escapes) encodes as the filesystem spells it
        key = hashlib.sha256(os.fsencode(os.path.realpath(self.folder))).hexdigest()[:24]
        locks = Path(tempfile.gettempdir()) / "attn-gate-locks"
        locks.mkdir(exist_ok=True)
        self._fd = os.open(locks / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._fd)
            self._fd = None
            raise UserError(
                f"{self.option} {self.folder}: another attn-gate run is writing there; wait for it to end "
                f"or pass another folder"
            ) from None
        return self

    def __exit__(self, *exc) -> bool:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the flock
            self._fd = None
        return False


def append_step_summary(text: str) -> None:
    """Append to $GITHUB_STEP_SUMMARY when it is set. A convenience beside files already written:
    an unwritable summary is a warning on stderr, never a changed exit code."""

    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(text + "\n")
    except OSError as exc:
        warn(f"$GITHUB_STEP_SUMMARY {path} was not written ({exc.strerror or exc})")


@contextlib.contextmanager
def writing(fix: str):
    """An OSError while writing an output (full disk, read-only folder) -> a one-line UserError."""
    try:
        yield
    except OSError as exc:
        raise UserError(f"cannot write {exc.filename or 'the output'} ({exc.strerror or exc}); {fix}") from None
