"""`attn-gate sweep`: every case of a suite through one kernel -> a SweepResult.

The sweep never dies on a case: crashes are ERROR rows, impossible cases SKIP rows. Only an
environment problem (unknown kernel or suite, kernel not installed) stops it before it starts.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import time
from pathlib import Path

from gate.cases import Suite, load_suite
from gate.config import Config
from gate.correctness import run_case
from gate.environment import default_device, describe
from gate.errors import UserError
from gate.kernels.registry import get_adapter
from gate.results import CaseResult, SweepResult


def suite_hash(suite: Suite) -> str:
    """Changes when any case of the suite changes: a baseline from another suite is refused."""
    blob = json.dumps([c.to_dict() for c in suite.cases], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def safe_name(kernel: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", kernel)


def only_pattern(only: str | None) -> re.Pattern[str] | None:
    """--only as a compiled regex; an invalid one is a one-line usage error (sweep, check, baseline)."""
    if only is None:
        return None
    try:
        return re.compile(only)
    except re.error as exc:
        raise UserError(f"--only {only!r} is not a regular expression ({exc})") from None


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


def run_sweep(kernel: str, suite_name: str, config: Config, device: str | None = None, progress: bool = True,
              only: str | None = None, extra_checks=(), check_names: tuple[str, ...] = ()) -> SweepResult:
    """`extra_checks` are callables run on every case; `check_names` (gate/checks.py) are added to
    the checks each case of the suite asks for."""
    from gate.checks import checks_for

    device = device or default_device()
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UserError("--device cuda: no CUDA GPU is visible here; leave --device out to use the CPU")
    suite = load_suite(suite_name, config.suites, config.source)
    adapter = get_adapter(kernel)
    missing = adapter.unavailable_reason()
    if missing:
        raise UserError(f"kernel {kernel!r} is unavailable here: {missing}")
    if device not in adapter.capabilities().devices:
        raise UserError(f"kernel {kernel!r} runs on {'/'.join(adapter.capabilities().devices)}, not {device}; pass --device")
    pattern = only_pattern(only)
    cases = [c for c in suite.cases if pattern is None or pattern.search(c.id)]
    if not cases:
        raise UserError(f"--only {only!r} matches no case of suite {suite_name!r}")
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    results: list[CaseResult] = []
    with _progress(progress, len(cases), f"{kernel} / {suite_name}") as advance:
        for case in cases:
            results.append(run_case(adapter, case, device, config.tolerance, tuple(extra_checks) + checks_for(case, check_names)))
            advance(case.id, results[-1].status.value)
    caps = adapter.capabilities()
    return SweepResult(
        kernel=kernel, suite=suite_name, suite_hash=suite_hash(suite),
        environment=describe(device, kernel, adapter.version()), cases=tuple(results),
        tolerance=config.tolerance.as_dict(), started_at=started, wall_s=time.perf_counter() - t0,
        notes=caps.notes + ((f"filtered with --only {only!r}",) if only else ())
        + ((f"extra checks on every case: {', '.join(check_names)}",) if check_names else ()),
    )


class _progress:
    """A rich progress bar on stderr (plain lines when stderr is not a terminal)."""

    def __init__(self, enabled: bool, total: int, title: str):
        self.enabled, self.total, self.title = enabled, total, title

    def __enter__(self):
        if not self.enabled:
            return lambda *_: None
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(stderr=True)
        if not console.is_terminal:
            done = [0]

            def plain(case_id: str, status: str) -> None:
                done[0] += 1
                console.print(f"[{done[0]}/{self.total}] {status:5} {case_id}", highlight=False)

            self._bar = None
            return plain
        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                             TextColumn("{task.fields[last]}"), console=console, transient=True)
        self._bar.__enter__()
        task = self._bar.add_task(self.title, total=self.total, last="")
        return lambda case_id, status: self._bar.update(task, advance=1, last=f"{status} {case_id}")

    def __exit__(self, *exc):
        if self.enabled and getattr(self, "_bar", None) is not None:
            self._bar.__exit__(*exc)
        return False


def write_sweep_outputs(result: SweepResult, out_dir: Path) -> dict[str, Path]:
    from gate.report import validation_note
    from gate.jsonio import write_text_atomic

    stem = f"{safe_name(result.kernel)}-{result.suite}"
    paths = {"json": Path(out_dir) / f"sweep-{stem}.json", "note": Path(out_dir) / f"validation-{stem}.md"}
    result.write(paths["json"])
    write_text_atomic(paths["note"], validation_note(result))
    return paths
