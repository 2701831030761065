"""Kernels run in worker processes; the gate's process measures and decides.

    gate process (this module)                      worker (gate/workflow/worker_main.py)
      inputs, references, errors, verdict  <-file--   imports the kernel, runs fwd+bwd per seed,
      never imports the kernel under test   -json->   sends raw out/lse/dq/dk/dv (torch.save)

A worker is forked from a process that imported torch already (gate/workflow/zygote.py; a fresh
interpreter where it cannot be). It is persistent (cases run one after another in it: the kernel
is imported and compiled once), and it is replaced when it dies (any exit code, any signal), hangs
past the case's timeout (it is killed with its process group), reports a CUDA fault (the context
is poisoned) or changes its working directory. Each of those is an ERROR row naming the case, the exit code or
signal and the last lines of the worker's stderr; the next case runs in a fresh worker. It is also
replaced after any ERROR row (but in the probe, whose trials are meant to raise: there a raise
keeps the worker when nothing below calls for a fresh one), after a row the worker itself refused
(a non-finite or misshapen output) and whenever the kernel changed the process's state (grad mode, default dtype, a patched
torch function; worker_main.py compares a fingerprint before and after every case): a kernel that
breaks its own process must not make a later, correct case misreport. A FAIL judged here (wrong
numbers) keeps the worker when its fingerprint is unchanged: that is the kernel's answer, and a
restart per failing case would cost a CUDA context and the kernel's JIT caches each time.

Each request carries an id (a per-worker nonce and a counter) that its reply must echo: a line
without it, a reply to another request or an extra line (a kernel wrote to the reply pipe) makes
the case an ERROR and the worker is killed; bytes that arrive between cases retire the worker
before its next case.

A worker dies with the gate: it asks Linux for SIGKILL when the thread that started it ends
(PR_SET_PDEATHSIG; workers are started from one long-lived thread for that reason), runs in a
process group of its own that `kill` ends with every descendant (the worker is their subreaper,
so its /proc tree holds even those in a session of their own with an empty environment; the tree
is stopped, then killed), and the gate's SIGTERM handler
(gate/commands/main.py) calls `kill_all_workers` before the gate exits. While waiting
for a reply the gate polls the worker's exit: a dead worker whose detached grandchild still holds
the reply pipe is reported at once, not after the case's timeout.

Raw outputs come back through `torch.load(weights_only=True)`: a worker can send wrong numbers
(any kernel can), never code. The temp folder is made by `tempfile` outside the repository and
removed at the end.

`--workers N` runs N slots at once, each with its own worker; on a GPU machine slot i's worker
sees only GPU i (CUDA_VISIBLE_DEVICES) and the references of its cases run on that GPU here.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import itertools
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gate.core.cases import Case
from gate.core.config import IsolationConfig, KernelFamily, ToleranceConfig
from gate.core.errors import UserError, first_line
from gate.core.results import CaseResult, CheckResult, Status
from gate.kernels.capabilities import Capabilities
from gate.speed.runs import PerfCaseResult
from gate.workflow.worker_main import kill_tree
from gate.workflow.zygote import forked_worker

STDERR_LINES = 8  # how much of a dead worker's stderr an ERROR row carries
POLL_S = 0.25  # how often a wait for a reply looks at whether the worker is still alive
WORKER_TOKEN = "ATTN_GATE_WORKER_TOKEN"


def _descendants_by_token(token: str) -> list[int]:
    """Processes (Linux: /proc) whose environment carries this worker's token: the worker's
    descendants, including those that left its process group (setsid, a double fork)."""
    needle = f"{WORKER_TOKEN}={token}".encode()
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    with open(f"/proc/{entry.name}/environ", "rb") as fh:
                        if needle in fh.read().split(b"\0"):
                            found.append(int(entry.name))
    return found


@dataclass(frozen=True)
class KernelInfo:
    """What the worker says about the kernel: the parent needs it and never imports the kernel."""

    version: str
    devices: tuple[str, ...]
    unavailable: str | None
    notes: tuple[str, ...]
    returns_lse: bool
    sink_grad: bool = True
    backward: bool = True  # False = forward-only kernel

    @property
    def traits(self):
        from gate.correctness.run_case import KernelTraits

        return KernelTraits(returns_lse=self.returns_lse, sink_grad=self.sink_grad, backward=self.backward)


class WorkerGone(Exception):
    """The worker died, hung or could not answer; the message says how, `stderr` holds the last
    lines of its stderr (one per line)."""

    def __init__(self, message: str, stderr: str = ""):
        super().__init__(message)
        self.stderr = stderr


# How a message names the timeout a case ran under when --case-timeout was not given.
CASE_TIMEOUT_SETTING = "[tool.attn-gate.isolation] case_timeout_s + timeout_s_per_gflop x its GFLOPs"


def case_timeout(case: Case, cfg: IsolationConfig, check_names: tuple[str, ...] = ()) -> float:
    """Seconds a case may take in its worker: a base plus time per GFLOP of its forward+backward on
    every seed, times the extra runs its probes make (determinism runs it 10 more times)."""
    return cfg.case_timeout_s + cfg.timeout_s_per_gflop * case.work(check_names) / 1e9


def visible_gpus() -> list[str]:
    """The GPU ids a worker may be pinned to (CUDA_VISIBLE_DEVICES entries, else 0..count-1)."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    listed = [g.strip() for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    return listed[:count] if listed else [str(i) for i in range(count)]


def default_workers(device: str) -> int:
    return max(1, len(visible_gpus())) if device == "cuda" else 1


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


# Every worker alive in this process, so that a SIGTERM of the gate can end them all.
_LIVE: set["Worker"] = set()
_LIVE_LOCK = threading.Lock()


class _Spawner:
    """Starts every worker from one thread that lives as long as the gate: PR_SET_PDEATHSIG fires
    when the *thread* that forked the child ends, and a case thread of the sweep's executor ends
    with the sweep, which would kill a warm worker kept for the next run."""

    def __init__(self):
        self._lock = threading.Lock()
        self._requests: list = []
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None

    def popen(self, *args, **kwargs) -> subprocess.Popen:
        done = threading.Event()
        box: dict = {}
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="attn-gate-spawner", daemon=True)
                self._thread.start()
            self._requests.append((args, kwargs, box, done))
            self._wake.notify()
        done.wait()
        if "error" in box:
            raise box["error"]
        return box["proc"]

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._requests:
                    self._wake.wait()
                args, kwargs, box, done = self._requests.pop(0)
            try:
                box["proc"] = subprocess.Popen(*args, **kwargs)
            except BaseException as exc:  # handed to the caller, who raises it
                box["error"] = exc
            done.set()


_SPAWNER = _Spawner()


class Worker:
    """One worker process and its reply channel."""

    def __init__(self, kernel: str, device: str, tmpdir: Path, label: str, gpu: str | None):
        self.kernel, self.device, self.tmpdir, self.label = kernel, device, tmpdir, label
        env = dict(os.environ)
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        env["ATTN_GATE_PARENT_PID"] = str(os.getpid())  # the worker checks it after asking for PDEATHSIG
        # inherited by whatever the kernel starts, even in a session of its own: `kill` finds them by it
        self.token = f"{os.getpid()}-{label}-{time.monotonic_ns()}"
        env[WORKER_TOKEN] = self.token
        tmpdir.mkdir(parents=True, exist_ok=True)  # a kernel may have deleted it
        self.stderr_path = tmpdir / f"worker-{label}.stderr"
        with open(self.stderr_path, "wb") as err:
            # forked from a process that imported torch already where it can be (gate/workflow/zygote.py)
            self.proc = forked_worker(env, err.fileno(), _SPAWNER.popen) or _SPAWNER.popen(
                [sys.executable, "-m", "gate.workflow.worker_main"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                start_new_session=True,
            )
        with _LIVE_LOCK:
            _LIVE.add(self)
        self._buf = b""
        self._ids = itertools.count(1)
        self._nonce = secrets.token_hex(8)

    def stderr_tail(self) -> str:
        try:
            lines = [ln.strip() for ln in self.stderr_path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        tail = lines[-STDERR_LINES:]
        fatal = [ln for ln in lines if ln.startswith("Fatal Python error")]  # faulthandler: what happened
        if fatal and fatal[-1] not in tail:
            tail = [fatal[-1], "..."] + [ln for ln in tail if not ln.startswith("Extension modules:")]
        return " | ".join(ln[:200] for ln in tail)

    def _gone(self, what: str) -> WorkerGone:
        self.kill()
        code = self.proc.returncode
        how = (
            what
            if code is None
            else (f"{what}: killed by {_signal_name(-code)}" if code < 0 else f"{what}: exited with code {code}")
        )
        tail = self.stderr_tail()
        return WorkerGone(how + (f"; stderr: {tail}" if tail else "; stderr empty"), stderr=tail.replace(" | ", "\n"))

    def stray_output(self) -> bool:
        """Whether the reply channel holds bytes no request asked for (a kernel wrote to it after
        the last reply): a worker whose channel is not its own again runs no case."""
        if self._buf:
            return True
        with contextlib.suppress(OSError, ValueError):
            return bool(select.select([self.proc.stdout.fileno()], [], [], 0)[0]) and self.proc.poll() is None
        return False

    def call(self, request: dict, timeout: float, setting: str = "--case-timeout") -> dict:
        """The worker's reply to `request`: the one line that echoes the request's id, alone. A line
        without it, or one more line after it, was not written by the worker's loop (a kernel wrote
        to the reply pipe): the worker is garbled, killed, and the case is an ERROR."""
        rid = f"{self._nonce}-{next(self._ids)}"
        request = {**request, "id": rid}
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._gone("the worker was gone before the case started") from None
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._gone(f"timed out after {timeout:.0f} s ({setting}); the worker was killed")
            exited = self.proc.poll() is not None  # before the read: a reply sent just before exiting still counts
            ready, _, _ = select.select([fd], [], [], 0 if exited else min(left, POLL_S))
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self.proc.wait(timeout=10)
                    raise self._gone("the worker died during the case")
                self._buf += chunk
            elif exited:  # dead, and whatever still holds the pipe open (a detached grandchild) will not answer
                raise self._gone("the worker died during the case")
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            reply = json.loads(line)
        except (ValueError, RecursionError):
            raise self._gone("the worker sent a garbled reply") from None
        if not isinstance(reply, dict):
            raise self._gone("the worker sent a garbled reply")
        if reply.get("id") != rid:
            raise self._gone(
                "the reply channel carried a line that is not the worker's answer to this case (a kernel "
                "wrote to it?); the worker was killed"
            )
        if self._buf:
            raise self._gone(
                "the reply channel carried more than the worker's answer to this case (a kernel wrote "
                "to it?); the worker was killed"
            )
        return reply

    def kill(self) -> None:
        # the worker's tree first (it is its descendants' subreaper: a process in a session of its
        # own with an empty environment is still in it), then the whole group, also when the worker
        # itself is gone: what the kernel started (a grandchild holding the reply pipe, a hung
        # helper) goes with it
        _kill_worker_tree(self.proc)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in _descendants_by_token(self.token):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        with _LIVE_LOCK:
            _LIVE.discard(self)


def _kill_worker_tree(proc: subprocess.Popen) -> None:
    """The worker stopped, then every descendant of it killed (stopped first, so none forks away)."""
    if proc.poll() is not None:  # reaped or dead: its pid may not be its own any more, its orphans went up
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(proc.pid, signal.SIGSTOP)
    kill_tree(proc.pid)


def kill_all_workers() -> None:
    """Every worker this process started, with its process group (the gate is going away)."""
    with _LIVE_LOCK:
        workers = list(_LIVE)
    for worker in workers:
        _kill_worker_tree(worker.proc)
        for kill, pid in [(os.killpg, worker.proc.pid)] + [(os.kill, p) for p in _descendants_by_token(worker.token)]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(pid, signal.SIGKILL)


class Slot:
    """One place a case can run: a (replaceable) worker, pinned to one GPU on a GPU machine."""

    def __init__(self, pool: "WorkerPool", index: int, gpu: str | None):
        self.pool, self.index, self.gpu = pool, index, gpu
        self.worker: Worker | None = None
        self.generation = 0
        self.retired = 0  # the generation whose worker must not run another case (after a FAIL or ERROR)
        # where this slot's references run: the GPU its worker sees
        self.ref_device = "cpu" if pool.device == "cpu" else f"cuda:{index if gpu is not None else 0}"

    def ensure(self) -> tuple[Worker, dict]:
        if self.worker is not None and (self.retired == self.generation or self.worker.stray_output()):
            self.discard()
        if self.worker is not None and self.worker.proc.poll() is None:
            return self.worker, {}
        self.generation += 1
        self.worker = Worker(
            self.pool.kernel, self.pool.device, self.pool.tmpdir, f"{self.index}-{self.generation}", self.gpu
        )
        family = self.pool.family
        hello = self.worker.call(
            {
                "op": "hello",
                "kernel": self.pool.kernel,
                "device": self.pool.device,
                "family": None if family is None else dataclasses.asdict(family),
            },
            self.pool.cfg.worker_start_timeout_s,
            "[tool.attn-gate.isolation] worker_start_timeout_s",
        )
        return self.worker, hello

    def discard(self) -> None:
        if self.worker is not None:
            self.worker.kill()
            self.worker = None


class WorkerPool:
    """N slots and the temp folder their raw outputs pass through. Use as a context manager."""

    def __init__(
        self, kernel: str, device: str, workers: int, cfg: IsolationConfig, family: KernelFamily | None = None
    ):
        self.kernel, self.device, self.cfg, self.family = kernel, device, cfg, family
        self.tmpdir = Path(tempfile.mkdtemp(prefix="attn-gate-"))
        gpus = visible_gpus() if device == "cuda" else []
        if device == "cuda" and workers > max(1, len(gpus)):
            raise UserError(
                f"--workers {workers}: only {len(gpus)} GPU(s) visible; a worker needs a GPU of its own "
                f"(pass --workers {max(1, len(gpus))} or fewer)"
            )
        self.slots = [Slot(self, i, gpus[i] if device == "cuda" and workers > 1 else None) for i in range(workers)]
        self._free: list[Slot] = list(self.slots)
        self._cond = threading.Condition()
        self._files = itertools.count()  # one temp file per case: a case being judged keeps its own
        self._info: KernelInfo | None = None

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    def close(self) -> None:
        for slot in self.slots:
            slot.discard()
        shutil.rmtree(self.tmpdir, ignore_errors=True)

    def kernel_info(self) -> KernelInfo:
        """Start the first worker and ask it about the kernel (an unknown or broken kernel is a UserError)."""
        if self._info is not None:
            return self._info
        try:
            _, hello = self.slots[0].ensure()
        except WorkerGone as exc:
            raise UserError(f"--kernel {self.kernel!r}: the worker process could not load it ({exc})") from None
        if "user_error" in hello:
            self.slots[0].discard()
            raise UserError(str(hello["user_error"]))
        self._info = KernelInfo(
            version=str(hello.get("version", "")),
            devices=tuple(hello.get("devices", ())),
            unavailable=hello.get("unavailable"),
            notes=tuple(hello.get("notes", ())),
            returns_lse=bool(hello.get("returns_lse", False)),
            sink_grad=bool(hello.get("sink_grad", True)),
            backward=bool(hello.get("backward", True)),
        )
        return self._info

    def triage(self, cases: list[Case]) -> dict[str, str]:
        """{case id: reason} for the cases the kernel does not support, asked of one worker in one
        request (the adapter's own unsupported_reason, as the worker asks it before each case): a
        SKIP then costs no round trip, no inputs and no references. A worker that cannot answer
        leaves every case to run as usual, where the same question is asked again."""
        if not cases:
            return {}
        slot = self.slots[0]
        try:
            worker, hello = slot.ensure()
            if "user_error" in hello:
                return {}
            reply = worker.call(
                {"op": "triage", "cases": [c.to_dict() for c in cases]}, self.cfg.worker_start_timeout_s
            )
        except WorkerGone:
            slot.discard()
            return {}
        if reply.get("restart"):
            slot.discard()
        skips = reply.get("skips")
        if reply.get("status") != "TRIAGED" or not isinstance(skips, dict):
            return {}
        known = {c.id for c in cases}
        return {str(k): str(v)[:1500] for k, v in skips.items() if k in known and v}

    @contextlib.contextmanager
    def slot(self):
        with self._cond:
            while not self._free:
                self._cond.wait()
            slot = self._free.pop(0)
        try:
            yield slot
        finally:
            with self._cond:
                self._free.append(slot)
                self._cond.notify()

    def run_case(
        self,
        case: Case,
        tol: ToleranceConfig,
        check_names: tuple[str, ...],
        timeout: float | None,
        traits=None,
        started: Callable[[str], None] | None = None,
        keep_after_raise: bool = False,
    ) -> CaseResult:
        """`traits` (run_case.KernelTraits): what the worker's hello declared; None asks kernel_info.
        `started(case_id)` is told when the case has its worker (the progress names a long one).
        `keep_after_raise`: a kernel that raised keeps its worker unless the worker found its
        process changed or its CUDA context faulted (the probe, whose trials are meant to raise).

        The slot (its worker) is held only while the kernel runs; the outputs are judged after it
        is released, so with two callers per slot (the sweep's `judging_threads`) the worker runs
        the next case while this process computes the references of the last one: the float64
        references and the kernel overlap instead of taking turns (the pr tier's time budget)."""
        traits = traits if traits is not None else self.kernel_info().traits
        with self._cond:
            file = self.tmpdir / f"case-{next(self._files)}.pt"
        with self.slot() as slot:
            start = time.perf_counter()  # a case's seconds: its own run and judging, not its wait for the slot
            if started is not None:
                started(case.id)
            self.tmpdir.mkdir(parents=True, exist_ok=True)  # a kernel of an earlier case may have deleted it
            ran = run_in_worker(
                slot,
                case,
                check_names,
                timeout or case_timeout(case, self.cfg, check_names),
                file,
                "--case-timeout" if timeout else CASE_TIMEOUT_SETTING,
                keep_after_raise,
            )
            ref_device, generation = slot.ref_device, slot.generation
        if isinstance(ran, CaseResult):
            return ran
        try:
            result = judge_raw_outputs(case, file, ref_device, tol, ran, traits, start)
            if result.status is Status.ERROR:
                # outputs that could not be judged may come from a process the kernel broke. A wrong
                # number is the kernel's answer, not a broken process: whether the process is still
                # sound is the worker's state fingerprint's call (it asks for a restart), so a kernel
                # with many failing cases does not pay a worker start (a CUDA context, its JIT caches)
                # per case
                slot.retired = max(slot.retired, generation)
            return result
        finally:
            with contextlib.suppress(OSError):
                file.unlink()
            from gate.core.environment import release_cached_gpu_memory

            release_cached_gpu_memory(ref_device)  # the float64 references' blocks, back to the GPU the worker shares


# Pools kept warm between runs of one process, keyed by everything a worker inherits: the sweep's
# workers then time the speed cases of the same `check` (after the sweep: no GPU is shared), and a
# test session does not pay a worker start (importing torch) per command. A pool is owned by one
# run at a time (taken out of the cache while in use); a worker that died is replaced on next use.
_WARM: dict[tuple, WorkerPool] = {}
_WARM_LOCK = threading.Lock()
MAX_WARM_POOLS = 2


def _close_warm() -> None:
    with _WARM_LOCK:
        pools = list(_WARM.values())
        _WARM.clear()
    for pool in pools:
        pool.close()


atexit.register(_close_warm)


@contextlib.contextmanager
def worker_pool(kernel: str, device: str, workers: int, cfg: IsolationConfig, family: KernelFamily | None = None):
    """A WorkerPool for this run: a warm one of an earlier run in this process with the same kernel
    (and kernel family definition), device, worker count, working directory and environment,
    or a new one."""
    # the working directory matters to a user kernel (`package.module:function` imports from it) only
    user_code = ":" in kernel or family is not None
    key = (kernel, repr(family), device, workers, os.getcwd() if user_code else "", tuple(sorted(os.environ.items())))
    with _WARM_LOCK:
        pool = _WARM.pop(key, None)
    if pool is None:
        pool = WorkerPool(kernel, device, workers, cfg, family)
    pool.cfg = cfg
    try:
        yield pool
    except BaseException:
        pool.close()
        raise
    with _WARM_LOCK:
        _WARM[key] = pool
        evicted = [_WARM.pop(k) for k in list(_WARM)[:-MAX_WARM_POOLS]]
    for old in evicted:
        old.close()


def _error(case: Case, reason: str, start: float, traceback: str = "") -> CaseResult:
    return CaseResult(
        case=case,
        status=Status.ERROR,
        reason=reason[:1500],
        seconds=time.perf_counter() - start,
        traceback=traceback[-2000:],
    )


def run_in_worker(
    slot: Slot,
    case: Case,
    check_names: tuple[str, ...],
    timeout: float,
    file: Path,
    setting: str = "--case-timeout",
    keep_after_raise: bool = False,
) -> "CaseResult | dict":
    """One case's kernel run in the slot's worker, its raw outputs written to `file`: the worker's
    reply (status RAN) for judge_raw_outputs, or the case's row when there is nothing to judge (a
    SKIP, the kernel's FAIL or ERROR, a dead or hung worker)."""
    start = time.perf_counter()
    try:
        worker, hello = slot.ensure()
        if "user_error" in hello:
            return _error(case, f"a fresh worker could not load the kernel: {hello['user_error']}", start)
        request = {
            "op": "case",
            "case": case.to_dict(),
            "checks": list(check_names),
            "file": str(file),
            "keep_after_raise": keep_after_raise,
        }
        reply = worker.call(request, timeout, setting)
    except WorkerGone as exc:
        slot.discard()
        # a dead worker has no Python traceback to send: its stderr's last lines (faulthandler's
        # stack after a segfault) are the ERROR row's traceback
        return _error(case, f"case {case.id}: {exc}", start, traceback=exc.stderr)
    status = reply.get("status")
    if reply.get("restart") or status == "FAIL" or (status == "ERROR" and not keep_after_raise):
        # a CUDA fault, a moved working directory, a changed process state, or a FAIL or ERROR
        # row (the kernel may have broken its process; the probe's raising trials excepted): the
        # next case gets a clean one
        slot.discard()
    if status in ("SKIP", "FAIL", "ERROR"):
        # an ERROR row carries the kernel's traceback tail, as run_case makes it in the worker
        return CaseResult(
            case=case,
            status=Status(status),
            reason=str(reply.get("reason", ""))[:1500],
            seconds=0.0 if status == "SKIP" else time.perf_counter() - start,
            traceback=str(reply.get("traceback", ""))[-2000:] if status == "ERROR" else "",
        )
    if status != "RAN":
        slot.discard()
        return _error(case, f"case {case.id}: the worker answered {status!r}", start)
    return reply


def judge_raw_outputs(
    case: Case, file: Path, device: str, tol: ToleranceConfig, reply: dict, traits, start: float
) -> CaseResult:
    """The kernel's raw outputs, judged in this process against references computed here, by the
    same `seed_loop` of `judge_seed` an in-process run makes. What is judged follows from the case
    and the kernel's declared `traits` (KernelTraits, from the worker's hello before any case ran),
    never from the case's reply: a worker cannot make a case forward-only or drop a gradient from
    the measurement."""
    import torch

    from gate.correctness.run_case import (
        Ended,
        SeedOutputs,
        grad_names,
        is_forward_only,
        judge_seed,
        judged_row,
        seed_loop,
    )

    try:
        payload = torch.load(file, map_location=device, weights_only=True)
        seeds = payload["seeds"]
        got = [s.get("seed") for s in seeds]
        if got != list(case.seeds):
            return _error(case, f"the worker returned seeds {got}, expected {list(case.seeds)}", start)
        checks = tuple(CheckResult.from_dict(c) for c in reply.get("checks", ()))
        forward_only = is_forward_only(traits, case)
        entries = iter(seeds)  # in the case's seed order, as checked above

        def step(inputs):
            # dbias, dsink only where the case measures them; one the worker did not send is None
            names = None if forward_only else grad_names(traits, case, inputs)
            raw = SeedOutputs.from_payload(next(entries), names)
            return judge_seed(case, inputs, raw, tol, traits, device)

        judged = seed_loop(case, device, step)
        if isinstance(judged, Ended):
            return judged.row(case, time.perf_counter() - start)
        return judged_row(case, judged, checks, traits, time.perf_counter() - start)
    except Exception as exc:  # a payload that is not what a worker writes: the case is not measured
        return _error(case, f"the kernel's outputs could not be judged ({first_line(exc)})", start)


class PerfWorker:
    """Speed cases timed in one worker of their own (`with PerfWorker(...) as pw: run_perf(target, pw.measure, pw.info.version)`):
    the sweep's workers are gone by then, so a timed case never shares its GPU with other work. A
    worker that dies or hangs makes that case an ERROR row (fail closed); a fresh one times the next."""

    def __init__(self, kernel: str, device: str, cfg: IsolationConfig, family: KernelFamily | None = None):
        self._ctx = worker_pool(kernel, device, 1, cfg, family)
        self.pool: WorkerPool | None = None
        self.info: KernelInfo | None = None
        self.device = device
        # a case outside the declared envelope is a SKIP decided here: no worker call
        self.declared = (
            Capabilities.from_declaration(family.supports, family.supports_table)
            if family is not None and family.supports
            else None
        )

    def __enter__(self) -> "PerfWorker":
        self.pool = self._ctx.__enter__()
        try:
            self.info = self.pool.kernel_info()
            if self.info.unavailable:
                raise UserError(f"kernel {self.pool.kernel!r} is unavailable here: {self.info.unavailable}")
        except BaseException as exc:
            self._ctx.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    def __exit__(self, *exc) -> bool:
        return bool(self._ctx.__exit__(*exc))

    def measure(self, case: Case, anchor: str, plan):
        declared = self.declared.unsupported_reason(case, self.device) if self.declared is not None else None
        if declared:
            return PerfCaseResult(case=case, status="SKIP", reason=declared, anchor=anchor)
        slot = self.pool.slots[0]
        timeout = case_timeout(case, self.pool.cfg) + 5.0 * plan.rounds * len(plan.passes)
        try:
            worker, hello = slot.ensure()
            if "user_error" in hello:
                return PerfCaseResult(case=case, status="ERROR", reason=str(hello["user_error"])[:300], anchor=anchor)
            reply = worker.call(
                {"op": "perf_case", "case": case.to_dict(), "anchor": anchor, "plan": plan.to_dict()},
                timeout,
                CASE_TIMEOUT_SETTING + " + 5 s per timed round and pass",
            )
            if reply.get("restart"):
                slot.discard()
            return PerfCaseResult.from_dict(reply["result"])
        except WorkerGone as exc:
            slot.discard()
            return PerfCaseResult(case=case, status="ERROR", reason=f"case {case.id}: {exc}"[:1500], anchor=anchor)
        except (KeyError, TypeError, ValueError) as exc:
            slot.discard()
            return PerfCaseResult(
                case=case,
                status="ERROR",
                reason=f"case {case.id}: the worker's timing is unreadable ({exc})",
                anchor=anchor,
            )
