"""Workers forked from the zygote (gate/workflow/zygote.py) are the processes a fresh interpreter
would be, and the gate reads their exit status as it reads a child's."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time

import pytest

from gate.core.cases import Case
from gate.core.config import IsolationConfig, ToleranceConfig
from gate.core.results import Status
from gate.workflow import zygote
from gate.workflow.isolation import WorkerPool
from gate.workflow.worker_main import kill_tree, process_tree
from gate.workflow.zygote import FRESH_WORKERS, ForkedProcess
from tests.test_worker_lifecycle import alive


def status_pipe(payload: bytes | None) -> ForkedProcess:
    r, w = os.pipe()
    if payload is not None:
        os.write(w, payload)
    os.close(w)
    return ForkedProcess(12345, None, None, r)


def test_the_status_the_zygote_writes_is_popens_returncode():
    assert status_pipe(struct.pack("i", 3 << 8)).wait(timeout=1) == 3  # exited with code 3
    assert status_pipe(struct.pack("i", signal.SIGSEGV)).wait(timeout=1) == -signal.SIGSEGV
    # no status at all: the zygote died, and its workers with it (their PR_SET_PDEATHSIG is SIGKILL)
    assert status_pipe(None).wait(timeout=1) == -signal.SIGKILL


def test_a_worker_still_running_polls_none_and_its_wait_times_out():
    r, w = os.pipe()
    proc = ForkedProcess(12345, None, None, r)
    try:
        assert proc.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.05)
        os.write(w, struct.pack("i", 0))
        assert proc.wait(timeout=1) == 0 and proc.poll() == 0
    finally:
        os.close(w)


def test_variables_nothing_the_zygote_imported_reads_do_not_make_another_zygote():
    base = {"PATH": "/bin", "OMP_NUM_THREADS": "2"}
    after_fork = {
        "PYTEST_CURRENT_TEST": "t.py::x (call)",
        "COLUMNS": "80",
        "CUDA_VISIBLE_DEVICES": "1",
        "ATTN_GATE_WORKER_TOKEN": "t",
        "ATTN_GATE_TEST_FAULT": "hang",
    }
    assert zygote._env_key({**base, **after_fork}) == zygote._env_key(base)
    for read_at_import in ({"OMP_NUM_THREADS": "4"}, {"LD_PRELOAD": "x.so"}, {"TORCH_LOGS": "+dynamo"}):
        assert zygote._env_key({**base, **read_at_import}) != zygote._env_key(base)


def _facts(tmp_path, monkeypatch, name: str) -> dict:
    path = tmp_path / f"{name}.json"
    monkeypatch.setenv("ATTN_GATE_TEST_FACTS", str(path))
    case = Case.build(
        batch=1, seqlen_q=8, seqlen_k=8, heads_q=1, heads_kv=1, head_dim=8, head_dim_v=8, dtype="fp32", seeds=(0,)
    )
    with WorkerPool("tests.fault_kernels:describes_its_process", "cpu", 1, IsolationConfig()) as pool:
        row = pool.run_case(case, ToleranceConfig(), (), timeout=120)
        kind = type(pool.slots[0].worker.proc).__name__
    assert row.status is Status.PASS, row.reason
    facts = json.loads(path.read_text())
    facts["kind"] = kind
    for key in ("ATTN_GATE_PARENT_PID", "ATTN_GATE_WORKER_TOKEN", "ATTN_GATE_TEST_FACTS", "PYTEST_CURRENT_TEST"):
        facts["environ"].pop(key)  # this worker's own, or this test's
    return facts


@pytest.mark.slow
def test_a_forked_worker_is_the_process_a_fresh_interpreter_would_be(tmp_path, monkeypatch):
    monkeypatch.delenv(FRESH_WORKERS, raising=False)
    forked = _facts(tmp_path, monkeypatch, "forked")
    monkeypatch.setenv(FRESH_WORKERS, "1")
    fresh = _facts(tmp_path, monkeypatch, "fresh")
    fresh["environ"].pop(FRESH_WORKERS)
    assert (forked.pop("kind"), fresh.pop("kind")) == ("ForkedProcess", "Popen")
    assert forked == fresh
    assert forked["cwd"] == forked["path0"] == os.getcwd() and forked["own_session"]
    assert not forked["cuda_initialized"]


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc to see the zygotes end")
def test_each_environment_gets_its_zygote_and_the_oldest_retires_after_its_last_worker(monkeypatch):
    """Three environments that differ in a variable torch may read at import (any the zygote does
    not know it never reads): three zygotes, at most two serving; the retired one forks no more
    and ends when its warm worker does."""
    monkeypatch.delenv(FRESH_WORKERS, raising=False)
    pools, zygotes = [], []
    try:
        for value in ("1", "2", "3"):
            monkeypatch.setenv("SOME_LIBRARYS_SETTING", value)
            pool = WorkerPool("sdpa-cpu", "cpu", 1, IsolationConfig())
            pools.append(pool)
            worker, _ = pool.slots[0].ensure()
            assert isinstance(worker.proc, ForkedProcess)
            zygotes.append(zygote._ZYGOTES[zygote._env_key(dict(os.environ))])
        assert len({z.proc.pid for z in zygotes}) == 3
        first = zygotes[0]
        assert first not in zygote._ZYGOTES.values() and alive(first.proc.pid)  # retired, its worker alive
        assert pools[0].slots[0].worker.proc.poll() is None
        pools[0].close()
        first.proc.wait(timeout=30)  # its last worker gone: it ends
        assert all(z.alive() for z in zygotes[1:])
    finally:
        for pool in pools:
            pool.close()


def test_a_fork_the_zygote_could_not_make_starts_that_worker_fresh_and_keeps_the_zygote(tmp_path):
    """An error reply (the zygote's fork failed: no more processes) is None for that worker; a
    zygote that answers nothing, or not what it writes, is gone (OSError): the gate stops using it."""
    import socket
    import threading

    def fake(reply: bytes | None) -> zygote.Zygote:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)

        def serve():
            _, fds, _, _ = socket.recv_fds(theirs, 1 << 16, 4)
            for fd in fds:
                os.close(fd)
            if reply is not None:
                theirs.send(reply)
            theirs.close()

        threading.Thread(target=serve, daemon=True).start()
        z = object.__new__(zygote.Zygote)
        z._sock, z._lock = ours, threading.Lock()
        return z

    with open(tmp_path / "err", "wb") as err:
        assert fake(b'{"error": "fork: [Errno 11] Resource temporarily unavailable"}').fork({}, err.fileno()) is None
        for gone in (None, b"[1]", b"not json"):
            with pytest.raises(OSError, match="gone, or its answer is garbled"):
                fake(gone).fork({}, err.fileno())
        with pytest.raises(OSError, match="did not fork"):
            fake(b'{"pid": "12"}').fork({}, err.fileno())


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc to find the processes")
def test_the_orphans_kill_spares_the_live_workers_and_their_children():
    """The zygote ends what a worker that ended left behind with kill_tree(itself, spare=its live
    workers): a spared process and its child live on, the other subtree is gone."""

    code = (
        "import subprocess, sys, time\n"
        "spared = subprocess.Popen([sys.executable, '-c', "
        '\'import subprocess, time; subprocess.Popen(["sleep", "60"]); time.sleep(60)\'])\n'
        "orphan = subprocess.Popen(['sleep', '60'])\n"
        "print(spared.pid, orphan.pid, flush=True); time.sleep(60)\n"
    )
    root = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        spared, orphan = map(int, root.stdout.readline().split())
        time.sleep(0.5)  # the spared process's own child has started
        grandchild = process_tree(spared)
        assert grandchild
        kill_tree(root.pid, spare=(spared,))
        time.sleep(0.2)
        assert not alive(orphan)
        assert alive(spared) and all(alive(p) for p in grandchild)
    finally:
        kill_tree(root.pid)
        root.kill()
        root.wait()
