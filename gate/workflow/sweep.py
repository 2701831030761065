"""`attn-gate sweep`: every case of a suite through one kernel -> a SweepResult.

The sweep never dies on a case: crashes are ERROR rows, impossible cases SKIP rows. Only an
environment problem (unknown kernel or suite, kernel not installed) stops it before it starts.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

from gate.core.cases import load_suite, only_pattern, suite_hash
from gate.core.config import Config
from gate.correctness.run_case import run_case
from gate.core.environment import default_device, describe
from gate.core.errors import UserError
from gate.core.files import safe_name
from gate.kernels.registry import family_adapter, get_adapter
from gate.core.results import CaseResult, SweepResult




def run_sweep(kernel: str, suite_name: str, config: Config, device: str | None = None, progress: bool = True,
              only: str | None = None, extra_checks=(), check_names: tuple[str, ...] = (),
              adapter=None) -> SweepResult:
    """`extra_checks` are callables run on every case; `check_names` (gate/correctness/probes/registry.py) are added to
    the checks each case of the suite asks for. `adapter` (selftest, #13) runs that adapter under the name `kernel`:
    a planted bug wrapped around the kernel is swept and judged exactly as the kernel itself."""
    from gate.correctness.probes.registry import checks_for

    device = device or default_device()
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UserError("--device cuda: no CUDA GPU is visible here; leave --device out to use the CPU")
    suite = load_suite(suite_name, config.suites, config.source)
    if adapter is None:  # issue #10: a kernel family of the config, else a built-in or package.module:function
        adapter = family_adapter(kernel, config) or get_adapter(kernel)
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
    from gate.report.sweep_report import validation_note
    from gate.core.jsonio import write_text_atomic

    stem = f"{safe_name(result.kernel)}-{result.suite}"
    paths = {"json": Path(out_dir) / f"sweep-{stem}.json", "note": Path(out_dir) / f"validation-{stem}.md"}
    result.write(paths["json"])
    write_text_atomic(paths["note"], validation_note(result))
    return paths
