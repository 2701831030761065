"""`attn-gate sweep`: every case of a suite through one kernel -> a SweepResult.

The sweep never dies on a case: crashes are ERROR rows, impossible cases SKIP rows. Only an
environment problem (unknown kernel or suite, kernel not installed) stops it before it starts.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from gate.compare.known import declared_known, for_kernel
from gate.core.config import Config
from gate.core.environment import describe
from gate.core.errors import UserError
from gate.core.identity import Scope
from gate.core.results import CaseResult, Status, SweepResult
from gate.correctness.probes.registry import checks_for
from gate.correctness.run_case import run_case
from gate.workflow.isolation import default_workers, worker_pool
from gate.workflow.journal import Journal, journal_header, journal_path, read_journal
from gate.workflow.plan import RunPlan, plan_run
from gate.workflow.progress import Progress
from gate.workflow.shards import expected_cost, shard_cases, shard_note
from gate.workflow.validate import check_device

JUDGING_THREADS_PER_SLOT = 2  # a case judged here while the next one runs in the worker


@dataclass(frozen=True)
class SweepOptions:
    """How a run is carried out: where the kernel runs and what is kept along the way.

    workers       None: one worker per visible GPU (1 on a CPU); 0: in this process, no isolation
                  (a kernel that exits or crashes then takes the run down: for debugging and for
                  measuring the workers' overhead only)
    case_timeout  seconds a case may take in its worker (None: sized per case from [isolation])
    out_dir       where the journal is streamed (None: no journal)
    resume        skip the cases the journal in out_dir already holds
    shard         (K, N): run only part K of N (gate/workflow/shards.py)
    """

    workers: int | None = None
    case_timeout: float | None = None
    out_dir: Path | None = None
    resume: bool = False
    shard: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.workers is not None and (isinstance(self.workers, bool) or not 0 <= self.workers <= 64):
            raise UserError(f"--workers {self.workers}: expected 0 (in process) to 64")
        if self.case_timeout is not None and not (math.isfinite(self.case_timeout) and self.case_timeout > 0):
            raise UserError(f"--case-timeout {self.case_timeout}: expected a number of seconds > 0")
        if self.resume and self.out_dir is None:
            raise UserError("--resume needs the --out folder of the interrupted run")
        if self.resume and self.workers == 0:  # the in-process run keeps no journal to resume from
            raise UserError(
                "--resume with --workers 0: a run in the gate's own process keeps no journal, so there is "
                "nothing to resume; drop --workers 0 (runs in workers journal every case) or --resume"
            )


def run_sweep(
    kernel: str,
    suite_name: str,
    config: Config,
    device: str | None = None,
    progress: bool = True,
    only: str | None = None,
    check_names: tuple[str, ...] = (),
    options: SweepOptions | None = None,
    adapter=None,
) -> SweepResult:
    """`check_names` (gate/correctness/probes/registry.py) are added to the checks each case of the suite asks for.
    `options` None runs in this process, as a library call from a test does; the CLI always passes
    options, so its runs are isolated in workers unless --workers 0 says otherwise.
    `adapter` (selftest) runs that adapter under the name `kernel`, in this process: a planted
    bug wrapped around the kernel is swept and judged exactly as the kernel itself (an adapter
    object cannot be sent to a worker; the selftest's kernels are attn-gate's own and its wrappers)."""

    device = check_device(device)  # a library call (tests, selftest) gets the CLI's one-line answer too
    if options is not None and options.workers != 0 and adapter is not None:
        raise ValueError("an adapter object runs in-process only (workers=0 or options None); name the kernel instead")
    plan = plan_run(config, kernel, suite_name, device, only, options, adapter=adapter)
    return sweep_plan(plan, progress, check_names)


def sweep_plan(plan: RunPlan, progress: bool = True, check_names: tuple[str, ...] = ()) -> SweepResult:
    """The plan's cases (its suite within --only, its shard) through its kernel: in worker processes
    unless its options say otherwise, else in this process through the plan's adapter."""
    options = plan.options
    shard = options.shard if options is not None else None
    cases = shard_cases(list(plan.cases), shard)
    extra_notes = ((f"extra checks on every case: {', '.join(check_names)}",) if check_names else ()) + (
        (shard_note(shard),) if shard else ()
    )
    if options is not None and options.workers != 0:
        return _run_isolated(plan, progress, check_names, cases, extra_notes)
    kernel, device, config = plan.kernel, plan.device, plan.config
    adapter = plan.in_process_adapter()  # a kernel family of the config, else a built-in or package.module:function
    missing = adapter.unavailable_reason()
    if missing:
        raise UserError(f"kernel {kernel!r} is unavailable here: {missing}")
    if device not in adapter.capabilities().devices:
        raise UserError(
            f"kernel {kernel!r} runs on {'/'.join(adapter.capabilities().devices)}, not {device}; pass --device"
        )

    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    results: list[CaseResult] = []
    skips = {c.id: r for c in cases if (r := adapter.unsupported_reason(c, device))}  # cost 0 for the ETA
    version = adapter.version()
    shown = progress_status(plan, version)
    with Progress(progress, f"{kernel} / {plan.suite.name}", _costs(cases, skips, check_names)) as advance:
        for case in cases:
            advance.started(case.id)
            results.append(run_case(adapter, case, device, config.tolerance, checks_for(case, check_names)))
            advance(case.id, shown(results[-1]), 0.0 if case.id in skips else expected_cost(case, check_names))
    return sweep_result(
        plan,
        environment=describe(device, kernel, version),
        cases=results,
        started_at=started,
        wall_s=time.perf_counter() - t0,
        notes=adapter.capabilities().notes + extra_notes,
        scope=plan.scope,
    )


def sweep_result(
    plan: RunPlan, *, environment: dict, cases, started_at: str, wall_s: float, notes, scope: Scope
) -> SweepResult:
    """The one build of a run's SweepResult (in this process, through workers, or joined from
    pytest items): its kernel, suite and tolerance are the plan's."""
    return SweepResult(
        kernel=plan.kernel,
        suite=plan.suite.name,
        suite_hash=plan.suite_hash,
        environment=environment,
        cases=tuple(cases),
        tolerance=plan.config.tolerance.as_dict(),
        started_at=started_at,
        wall_s=wall_s,
        notes=tuple(notes),
        scope=scope,
    )


def _run_isolated(
    plan: RunPlan, progress: bool, check_names: tuple[str, ...], cases: list, extra_notes: tuple[str, ...]
) -> SweepResult:
    """Every case in a worker process (gate/workflow/isolation.py), streamed to the journal."""
    kernel, suite, config, device, options = (
        plan.kernel,
        plan.suite,
        plan.config,
        plan.device,
        plan.options,
    )

    workers = options.workers if options.workers is not None else default_workers(device)
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    with worker_pool(kernel, device, workers, config.isolation, plan.family) as pool:
        info = pool.kernel_info()
        if info.unavailable:
            raise UserError(f"kernel {kernel!r} is unavailable here: {info.unavailable}")
        if device not in info.devices:
            raise UserError(f"kernel {kernel!r} runs on {'/'.join(info.devices)}, not {device}; pass --device")
        environment = describe(device, kernel, info.version)
        header = journal_header(plan.key, plan.scope, device, environment, check_names, options.shard, started)
        done: dict[str, CaseResult] = {}
        journal = None
        if options.out_dir is not None:
            journal = Journal(journal_path(options.out_dir, kernel, suite.name))
            if options.resume:
                started, done = read_journal(journal.path, header, cases)
                done = {c.id: done[c.id] for c in cases if c.id in done}
                print(
                    f"attn-gate: --resume: {len(done)} of {len(cases)} cases are done in {journal.path}; "
                    f"running the other {len(cases) - len(done)}",
                    file=sys.stderr,
                )
            try:
                journal.start(header, options.resume)
            except OSError as exc:  # checked before the sweep too; a folder can change under a run
                raise UserError(
                    f"--out {options.out_dir}: cannot write the journal there ({exc.strerror or exc}); "
                    f"pass a writable folder"
                ) from None
        todo = [c for c in cases if c.id not in done]
        # outside the declared envelope (decided here), then what the kernel's adapter does not
        # support (asked of the worker once, for all): SKIP rows made here, with no round trip per
        # case, no inputs and no references
        skips = {c.id: r for c in todo if (r := plan.declared_skip(c))}
        skips.update(pool.triage([c for c in todo if c.id not in skips]))
        lock = threading.Lock()
        stopping = threading.Event()  # set on Ctrl-C: a case cut short by it is no result
        fresh: dict[str, CaseResult] = {}
        shown = progress_status(plan, info.version)
        with Progress(progress, f"{kernel} / {suite.name}", _costs(todo, skips, check_names)) as advance:
            for case in todo:
                if case.id in skips:
                    result = CaseResult(case=case, status=Status.SKIP, reason=skips[case.id])
                    if journal is not None:
                        journal.add(result)
                    fresh[case.id] = result
                    advance(case.id, result.status.value, 0.0)
            todo = [c for c in todo if c.id not in skips]

            def one(case):
                # the progress names a case that runs long (a hang, a slow compile) from when it has its worker
                result = pool.run_case(
                    case, config.tolerance, check_names, options.case_timeout, info.traits, advance.started
                )
                with lock:
                    if stopping.is_set():  # its worker was killed by the interrupt: it runs again on --resume
                        return
                    if journal is not None:
                        journal.add(result)
                    fresh[case.id] = result
                    advance(case.id, shown(result), expected_cost(case, check_names))

            # JUDGING_THREADS_PER_SLOT callers per worker: while one judges its case's outputs here,
            # the next case already runs in the worker (gate/workflow/isolation.py WorkerPool.run_case)
            ex = ThreadPoolExecutor(
                max_workers=JUDGING_THREADS_PER_SLOT * len(pool.slots), thread_name_prefix="attn-gate-case"
            )
            try:
                for future in [ex.submit(one, c) for c in todo]:
                    future.result()
            except BaseException:
                with lock:
                    stopping.set()
                ex.shutdown(wait=False, cancel_futures=True)  # Ctrl-C or a broken journal: no case starts after it
                raise
            ex.shutdown(wait=True)
    return sweep_result(
        plan,
        environment=environment,
        cases=[done[c.id] if c.id in done else fresh[c.id] for c in cases],
        started_at=started,
        wall_s=time.perf_counter() - t0,
        notes=info.notes + extra_notes,
        scope=plan.scope,
    )


def progress_status(plan: RunPlan, kernel_version: str):
    """A finished row's word in the live counts: its status, with failures a declaration of the
    config covers counted apart ("known FAIL"), so a run that `check` will pass does not look failing."""
    applied = for_kernel(plan.config.known_failures, plan.kernel, kernel_version or "")

    def shown(result: CaseResult) -> str:
        status = result.status.value
        return f"known {status}" if applied and declared_known(result, applied) else status

    return shown


def _costs(cases, skips: dict[str, str], check_names: tuple[str, ...]) -> list[float]:
    """Each case's expected cost for the ETA; a case skipped before it runs costs nothing."""
    return [0.0 if c.id in skips else expected_cost(c, check_names) for c in cases]


def fresh_sweep(plan: RunPlan, progress: bool) -> SweepResult:
    """The plan's cases swept (in worker processes unless its options say otherwise)."""

    if plan.options is None:
        plan = dataclasses.replace(plan, options=SweepOptions())
    return sweep_plan(plan, progress=progress)
