"""The run's journal: every finished case appended to `--out/journal-<kernel>-<suite>.jsonl` as it ends.

Line 1 is the header (what the run is: kernel, suite and its hash, device, environment, tolerance,
--only, --checks, --shard); each further line is one CaseResult, flushed and fsynced, so a run
killed at any point keeps every case it finished. `--resume` reads it back: a header that differs
in any of those keys is refused with the key and both values (a result measured under other
conditions must not be mixed in); a torn last line (killed mid-write) is dropped and that case
runs again. A run without --resume starts a fresh journal.

Format history:
  1  first version.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gate.core.errors import UserError
from gate.core.files import safe_name
from gate.core.identity import RunKey, Scope
from gate.core.jsonio import _clean, bad_field, write_text_atomic
from gate.core.results import CaseResult

SCHEMA_VERSION = 1
KIND = "attn-gate journal"
# header keys that must match for a resume (started_at is the first run's start, kept as it was)
IDENTITY = ("kernel", "suite", "suite_hash", "device", "environment", "tolerance", "only", "checks", "shard")


def journal_header(
    key: RunKey,
    scope: Scope,
    device: str,
    environment: dict[str, Any],
    checks: tuple[str, ...],
    shard: tuple[int, int] | None,
    started_at: str,
) -> dict[str, Any]:
    """Line 1 of a journal: the run's key and scope with the conditions a resume must share."""
    return {
        "kernel": key.kernel,
        "suite": key.suite,
        "suite_hash": key.suite_hash,
        "device": device,
        "environment": environment,
        "tolerance": key.multipliers,
        "only": scope.only,
        "checks": list(checks),
        "shard": list(shard) if shard else None,
        "started_at": started_at,
    }


def journal_path(out_dir: Path, kernel: str, suite: str) -> Path:
    return Path(out_dir) / f"journal-{safe_name(kernel)}-{suite}.jsonl"


def _same(key: str, was: Any, now: Any) -> bool:
    """Whether a header key matches. The environment's git_commit is where the working
    directory's checkout is: it must match when both runs were inside a checkout (another commit is
    other code), and is not compared when one was not (the same machine and code run from another
    folder)."""
    if key == "environment" and isinstance(was, dict) and isinstance(now, dict):
        if not (was.get("git_commit") and now.get("git_commit")):
            was, now = ({k: v for k, v in env.items() if k != "git_commit"} for env in (was, now))
    return was == now


def read_journal(path: Path, header: dict[str, Any], cases=None) -> tuple[str, dict[str, CaseResult]]:
    """(started_at of the journal's run, finished results by case id) for `--resume`. `cases`: the
    run's cases; a row whose case is not the run's case of that id (edited) is refused."""
    if not path.is_file():
        raise UserError(
            f"--resume: there is no journal at {path} (nothing to resume); run without --resume, or pass "
            f"the --out folder of the interrupted run"
        )
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    try:
        first = json.loads(lines[0])
    except (ValueError, RecursionError):  # JSONDecodeError, a huge int, nesting too deep
        first = None
    if not isinstance(first, dict) or first.get("kind") != KIND or first.get("schema_version") != SCHEMA_VERSION:
        raise UserError(
            f"--resume: {path} is not a journal of this attn-gate version; run without --resume to start afresh"
        )
    for key in IDENTITY:
        if not _same(key, first.get(key), header.get(key)):
            raise UserError(
                f"--resume: {path} was written by another run: {key} was {first.get(key)!r}, now "
                f"{header.get(key)!r}; resume with the same kernel, suite, config, options and machine, "
                f"or run without --resume"
            )
    done = _finished(path, lines)
    for case in cases or ():
        if case.id in done and done[case.id].case != case:
            raise UserError(
                f"--resume: {path} holds a row for {case.id} that measured another case than this run's "
                f"case of that id (edited?); run without --resume to start afresh"
            )
    return str(first.get("started_at", "")), done


def _finished(path: Path, lines: list[str]) -> dict[str, CaseResult]:
    done: dict[str, CaseResult] = {}
    complete = lines[1:-1]  # the piece after the last "\n" is empty or torn (killed mid-write): it runs again
    for number, line in enumerate(complete, start=2):
        if not line.strip():
            continue
        try:
            # the same reader as a results file: the row's status is recomputed, never trusted
            result = CaseResult.from_dict(json.loads(line))
        except Exception as exc:  # noqa: BLE001 - a damaged line is a UserError, never a traceback
            raise UserError(
                f"--resume: {path} line {number} is damaged ({bad_field(exc)}); run without --resume to start afresh"
            ) from None
        done[result.case_id] = result
    return done


_STARTED: list[Path] = []  # journals this process wrote a header to or resumed: what --resume can go on with


def started_here(out_dir: Path) -> bool:
    """Whether this process wrote or resumed a journal in `out_dir` that is on disk (a run stopped
    before its journal was written has none: a `--resume` hint would only fail with "no journal")."""
    out = os.path.realpath(out_dir)
    return any(os.path.realpath(p.parent) == out and p.is_file() for p in _STARTED)


class Journal:
    """Append-only: `start` writes the header (fresh run) or keeps the file (resume); `add` appends."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def start(self, header: dict[str, Any], resume: bool) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume:
            with open(self.path, "rb+") as fh:  # drop a torn last line so the next append starts a line
                data = fh.read()
                if data and not data.endswith(b"\n"):
                    fh.truncate(data.rfind(b"\n") + 1)
            _STARTED.append(self.path)
            return
        write_text_atomic(
            self.path, json.dumps({"kind": KIND, "schema_version": SCHEMA_VERSION, **header}, sort_keys=True) + "\n"
        )
        _STARTED.append(self.path)

    def add(self, result: CaseResult) -> None:
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(_clean(result.to_dict()), sort_keys=True, allow_nan=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
