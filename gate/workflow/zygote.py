"""Workers forked from a process that has imported torch already: a worker starts in hundredths of
a second instead of the second or more a fresh interpreter spends importing torch.

    gate process (Zygote, ForkedProcess)          zygote (`python -m gate.workflow.zygote FD`)
      pipes for stdin/stdout, the stderr file,  -fds->  imports torch and the worker's modules once,
      the environment and working directory            never touches CUDA; forks one worker a request
      the worker's exit status                  <-pipe-  reaps its workers, writes each one's status

The gate starts many workers: one per slot, a fresh one after every ERROR row and state change,
one per planted bug of the selftest, one after every probe call that raised. A forked worker is what
`python -m gate.workflow.worker_main` would be: a session of its own, its stdin/stdout/stderr, the
gate's environment for it (CUDA_VISIBLE_DEVICES, its token), the working directory as sys.path[0],
the warnings filters of a fresh interpreter, Python's random reseeded (the random module does that
after a fork). torch's CUDA state is untouched in the zygote: the child initialises CUDA itself.

It dies with the gate: it asks for PR_SET_PDEATHSIG, as a worker does, and it ends when the gate's
end of its socket closes; its workers ask for the same signal against it, so a SIGKILL of the gate
ends the zygote and then every worker. It is its workers' subreaper: what a worker that ended had
started comes to it and is killed (kill_tree, sparing the live workers).

A zygote serves one environment: torch read its variables while it loaded (AFTER_FORK names those
nothing it imported reads; they are set in the worker). Another environment gets a zygote of its
own, and the older of two retires: it forks no more and ends when its last worker has. A fresh
interpreter (isolation.Worker) starts the worker where no zygote can serve: no fork or fd passing
on the platform, a zygote that did not start or imported another `gate` package than the gate's,
or ATTN_GATE_FRESH_WORKERS=1.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable

import gate
import gate.workflow.worker_main as worker_main
from gate.workflow.worker_main import die_with_parent, enable_subreaper, kill_tree

# Variables nothing the zygote imports reads: set per worker by the gate, the terminal's, pytest's
# (changed at every test), the gate's own (read when called). They do not make another zygote; the
# worker gets them all. Any other difference might have changed what torch read while it loaded.
AFTER_FORK = frozenset({"CUDA_VISIBLE_DEVICES", "COLUMNS", "LINES", "TERM", "NO_COLOR", "FORCE_COLOR"})
AFTER_FORK_PREFIXES = ("ATTN_GATE_", "PYTEST_")
FRESH_WORKERS = "ATTN_GATE_FRESH_WORKERS"
READY_TIMEOUT_S = 120.0  # importing torch on a loaded machine
STATUS = struct.Struct("i")


def _after_fork(name: str) -> bool:
    return name in AFTER_FORK or name.startswith(AFTER_FORK_PREFIXES)


def _env_key(env: dict[str, str]) -> tuple:
    return tuple(sorted((k, v) for k, v in env.items() if not _after_fork(k)))


def _answer(sock: socket.socket) -> dict:
    """The zygote's next message (OSError: none in time, or not one it writes)."""
    ready, _, _ = select.select([sock], [], [], READY_TIMEOUT_S)
    if not ready:
        raise OSError(f"the zygote did not answer in {READY_TIMEOUT_S:.0f} s")
    try:
        message = json.loads(sock.recv(1 << 16) or b"null")
    except ValueError:
        message = None
    if not isinstance(message, dict):
        raise OSError("the zygote is gone, or its answer is garbled")
    return message


class ForkedProcess:
    """The part of subprocess.Popen a Worker uses, for a worker the zygote forked: the gate is not
    its parent, so its exit status arrives on a pipe the zygote writes when it reaps it."""

    def __init__(self, pid: int, stdin, stdout, status_fd: int):
        self.pid, self.stdin, self.stdout = pid, stdin, stdout
        self.returncode: int | None = None
        self._status_fd = status_fd
        self._lock = threading.Lock()

    def _collect(self, timeout: float | None) -> None:
        # non-blocking: a signal handler that polls while another thread waits must not deadlock
        if not self._lock.acquire(blocking=timeout != 0):
            return
        try:
            if self.returncode is not None:
                return
            ready, _, _ = select.select([self._status_fd], [], [], timeout)
            if not ready:
                return
            data = os.read(self._status_fd, STATUS.size)
            # no status: the zygote died, and its workers with it (PR_SET_PDEATHSIG, SIGKILL)
            status = STATUS.unpack(data)[0] if len(data) == STATUS.size else None
            self.returncode = -signal.SIGKILL if status is None else os.waitstatus_to_exitcode(status)
            os.close(self._status_fd)
        finally:
            self._lock.release()

    def poll(self) -> int | None:
        self._collect(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
            self._collect(left)
        return self.returncode


class Zygote:
    """The gate's side of one zygote, for workers of one environment (but what is set after the
    fork); started from the thread that starts every worker (its PR_SET_PDEATHSIG is tied to it)."""

    def __init__(self, env: dict[str, str], popen: Callable[..., subprocess.Popen]):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.env = {k: v for k, v in env.items() if not _after_fork(k)}
        self.env["ATTN_GATE_PARENT_PID"] = str(os.getpid())  # its die-with-parent check, and how tests find it
        self._sock = ours
        self._lock = threading.Lock()
        try:
            self.proc = popen(
                [sys.executable, "-m", "gate.workflow.zygote", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,  # Ctrl-C reaches the gate, which ends its workers itself
            )
        finally:
            theirs.close()
        try:
            hello = _answer(ours)
        except OSError:
            self.close()
            raise
        if hello.get("gate") != gate.__file__:  # it imported another gate package than ours
            self.close()
            raise OSError(f"the zygote did not start: {hello or 'no answer'}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def retire(self) -> None:
        """No more workers from it; it ends when the last of its workers has (they may be warm)."""
        with self._lock, contextlib.suppress(OSError):
            self._sock.send(b'{"retire": true}')
            self._sock.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def fork(self, env: dict[str, str], stderr_fd: int) -> ForkedProcess | None:
        """A worker with this environment and the gate's working directory; None: the zygote could
        not fork this one; OSError: the zygote is gone or garbled."""
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        status_r, status_w = os.pipe()
        request = json.dumps({"env": env, "cwd": os.getcwd()}).encode()
        try:
            with self._lock:
                socket.send_fds(self._sock, [request], [in_r, out_w, stderr_fd, status_w])
                reply = _answer(self._sock)
        except OSError:
            for fd in (in_w, out_r, status_r):
                os.close(fd)
            raise
        finally:
            for fd in (in_r, out_w, status_w):
                os.close(fd)
        if not isinstance(reply.get("pid"), int):
            for fd in (in_w, out_r, status_r):
                os.close(fd)
            if "error" in reply:  # it could not fork this once (no more processes); it still serves
                return None
            raise OSError(f"the zygote did not fork: {reply or 'no answer'}")
        return ForkedProcess(reply["pid"], os.fdopen(in_w, "wb"), os.fdopen(out_r, "rb"), status_r)


# Zygotes by the environment they imported torch under (_env_key); the oldest retires when a
# third is needed. One that did not start is not tried again for that environment.
_ZYGOTES: dict[tuple, Zygote] = {}
_FAILED: set[tuple] = set()
_ZYGOTES_LOCK = threading.Lock()
MAX_ZYGOTES = 2


def _zygote_for(env: dict[str, str], popen: Callable[..., subprocess.Popen]) -> Zygote | None:
    key = _env_key(env)
    with _ZYGOTES_LOCK:
        zygote = _ZYGOTES.pop(key, None)
        if zygote is not None and not zygote.alive():
            zygote.close()
            zygote = None
        if zygote is None and key not in _FAILED:
            try:
                zygote = Zygote(env, popen)
            except OSError:
                _FAILED.add(key)
        if zygote is not None:
            _ZYGOTES[key] = zygote  # the most recently used last
        retired = [_ZYGOTES.pop(k) for k in list(_ZYGOTES)[:-MAX_ZYGOTES]]
    for old in retired:
        old.retire()
    return zygote


def forked_worker(env: dict[str, str], stderr_fd: int, popen: Callable[..., subprocess.Popen]) -> ForkedProcess | None:
    """A worker forked from the zygote of its environment (started on first use through `popen`),
    or None where a fresh interpreter must start it."""
    if os.environ.get(FRESH_WORKERS) or not hasattr(socket, "send_fds") or not hasattr(os, "fork"):
        return None
    zygote = _zygote_for(env, popen)
    if zygote is None:
        return None
    try:
        return zygote.fork(env, stderr_fd)
    except OSError:
        with _ZYGOTES_LOCK:
            if _ZYGOTES.get(_env_key(env)) is zygote:
                del _ZYGOTES[_env_key(env)]
        zygote.close()
        return None


# ---------------------------------------------------------------- the zygote's own process


def _child(fds: list[int], request: dict, keep_closed: list[int], filters: list) -> None:
    """In the forked worker: become what `python -m gate.workflow.worker_main` would be, then run it."""
    code = 1
    try:
        for fd in keep_closed:
            with contextlib.suppress(OSError):
                os.close(fd)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        for target, fd in zip((0, 1, 2), fds[:3]):
            os.dup2(fd, target)
        for fd in fds:
            os.close(fd)
        sys.stdin = open(0, encoding="utf-8", closefd=False)
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ["ATTN_GATE_PARENT_PID"] = str(os.getppid())  # its parent is this zygote
        os.chdir(request["cwd"])
        sys.path[0] = request["cwd"]  # what `python -m` puts first
        importlib.invalidate_caches()  # modules written into that folder since the zygote started
        warnings.filters[:] = filters
        sys.argv = [worker_main.__file__]
        sys.modules["__main__"] = worker_main  # what `python -m` makes it: the fingerprint watches it
        code = worker_main.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def serve(sock: socket.socket) -> int:
    die_with_parent()
    # the fork below is of a process torch started a thread in; the worker never uses that thread
    warnings.filterwarnings("ignore", message=r".*multi-threaded.*fork", category=DeprecationWarning)
    ours = warnings.filters[0]
    import torch

    import gate.attention.inputs  # noqa: F401
    import gate.correctness.run_case  # noqa: F401
    import gate.kernels.registry  # noqa: F401
    import gate.kernels.user  # noqa: F401

    # a worker's filters: a fresh interpreter's after these imports (torch and numpy add some)
    filters = [f for f in warnings.filters if f is not ours]
    if torch.cuda.is_initialized():  # a forked child could not use CUDA: serve nothing
        return 1
    enable_subreaper()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    status_of: dict[int, int] = {}  # worker pid -> the write end of its status pipe

    def reap() -> None:
        ended = False
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            fd = status_of.pop(pid, None)
            if fd is not None:
                ended = True
                with contextlib.suppress(OSError):
                    os.write(fd, STATUS.pack(status))
                os.close(fd)
        if ended:
            # what a worker that ended had started came to this process (its subreaper): it ends too
            kill_tree(os.getpid(), spare=tuple(status_of))

    sock.send(json.dumps({"gate": gate.__file__}).encode())
    retired = False
    while not (retired and not status_of):
        ready, _, _ = select.select([wake_r] if retired else [sock, wake_r], [], [])
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
        reap()
        if retired or sock not in ready:
            continue
        try:
            message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 4)
        except OSError:
            return 0
        if not message:  # the gate is gone; its workers go with this process
            return 0
        request = json.loads(message)
        if request.get("retire"):  # the gate starts no more workers here; those running finish
            retired = True
            continue
        if len(fds) != 4:
            for fd in fds:
                os.close(fd)
            sock.send(b'{"error": "a request without its four file descriptors"}')
            continue
        try:
            pid = os.fork()
        except OSError as exc:  # no more processes: this worker starts fresh, the others keep running
            for fd in fds:
                os.close(fd)
            sock.send(json.dumps({"error": f"fork: {exc}"}).encode())
            continue
        if pid == 0:
            _child(fds, request, [sock.fileno(), wake_r, wake_w, *status_of.values()], filters)
        for fd in fds[:3]:
            os.close(fd)
        status_of[pid] = fds[3]
        sock.send(json.dumps({"pid": pid}).encode())
    return 0


if __name__ == "__main__":
    sys.exit(serve(socket.socket(fileno=int(sys.argv[1]))))
