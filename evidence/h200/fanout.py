"""Many correctness sweeps at once on one GPU, across as many device calls as it takes (issue #9).

A correctness sweep is bound by the CPU far more than by the H200: FlexAttention and FA4 compile every
new shape (Inductor, CuTe DSL), and the gate draws inputs and launches float64 references from one
Python thread. One sweep at a time leaves the GPU mostly idle, so this runs every job's shards side by
side, each its own `attn-gate sweep --shard k/N` process with its own worker. Correctness does not
depend on what else the GPU runs; timing does, so no speed case is measured here (`attn-gate perf` on a
quiet GPU does that).

    python3 evidence/h200/fanout.py --budget-s 540 --job flex:pr:6 --job fa4:pr:3 --job sdpa-cudnn:nightly:2

Every shard journals each case as it ends (into the git-ignored --state folder, kept between calls
while the machine is warm; carry it after a cold start), so a call cut by the budget goes on with
`--resume` in the next call. A journal that `--resume` refuses (another machine or other code) is set
aside and that shard starts afresh. Once all shards of a job have written their sweep JSON they are
joined with `attn-gate merge` into <state>/<kernel>-<suite>/merged/.

Many shards on one GPU can exhaust its memory (each process's caching allocator keeps what it once
held; a 131,072-key float64 reference peaks at 7 GiB): a case that raised an out-of-memory error, or
another error matching --retry (RETRY_DEFAULT), is therefore run once more after the parallel phase, alone on the GPU
(its journal row set aside, the shard resumed), so such an ERROR is either the kernel's or goes away.
--max-procs caps how many shard processes run at once.

On a host with several GPUs the shards are spread over them (--gpus, default every GPU nvidia-smi
lists), each shard on the GPU running the fewest. With --perf, a job whose sweep is whole then runs
its speed cases (`attn-gate perf`) with nothing else on the machine, once.

$OUT gets status.md (one row per job: shards finished, cases journalled by status, the worst rows)
and fanout.tar.gz (the whole state folder: sweep JSON, validation notes, journals, logs).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from gate.core.files import safe_name  # the gate's own file naming of a kernel (a user kernel is module:function)
from gate.core.errors import UserError
from gate.workflow.journal import drop_cases, journal_results


@dataclass(frozen=True)
class Shard:
    kernel: str
    suite: str
    index: int  # 1-based
    count: int
    folder: Path
    only: str = ""  # a --only regex (a recheck job: the case ids of a file)

    @property
    def label(self) -> str:
        return f"{self.kernel}:{self.suite}:{self.index}/{self.count}"

    @property
    def sweep_json(self) -> Path:
        return self.folder / f"sweep-{safe_name(self.kernel)}-{self.suite}.json"

    @property
    def journal(self) -> Path:
        return self.folder / f"journal-{safe_name(self.kernel)}-{self.suite}.jsonl"


def parse_job(text: str, state: Path) -> list[Shard]:
    """KERNEL:SUITE:SHARDS, or KERNEL:SUITE:SHARDS@FILE: only the case ids FILE lists (one a line), e.g.
    the ERROR rows of an earlier run checked again on a quiet GPU; such a job has its own folder."""
    spec, _, ids_file = text.partition("@")
    parts = spec.rsplit(":", 2)  # a user kernel is package.module:function
    if len(parts) != 3 or not parts[2].isdigit() or int(parts[2]) < 1:
        raise SystemExit(f"--job {text!r}: expected KERNEL:SUITE:SHARDS[@IDS_FILE], e.g. flex:pr:6")
    kernel, suite, count = parts[0], parts[1], int(parts[2])
    only, job = "", state / f"{safe_name(kernel)}-{suite}"
    if ids_file:
        try:
            ids = [line.strip() for line in Path(ids_file).read_text().splitlines() if line.strip()]
        except OSError as exc:
            raise SystemExit(f"--job {text!r}: cannot read {ids_file}: {exc.strerror}") from None
        if not ids:
            raise SystemExit(f"--job {text!r}: {ids_file} lists no case ids")
        only = "^(?:" + "|".join(re.escape(i) for i in ids) + ")$"
        job = state / f"{safe_name(kernel)}-{suite}-{Path(ids_file).stem}"
    return [Shard(kernel, suite, i, count, job / f"shard-{i}-of-{count}", only) for i in range(1, count + 1)]


def journal_counts(path: Path) -> tuple[Counter, list[tuple[str, str, str]]]:
    """Statuses of the cases a journal holds, and its FAIL/ERROR rows (id, status, reason)."""
    try:
        results = journal_results(path).values()
    except UserError as exc:  # a damaged line: said in the status, the other jobs still reported and packed
        return Counter({"damaged journal": 1}), [(path.name, "ERROR", str(exc)[:200])]
    bad = [(r.case_id, r.status.value, r.reason[:200]) for r in results if r.status.value in ("FAIL", "ERROR")]
    return Counter(r.status.value for r in results), bad


# ERRORs that sharing the GPU and CPU can cause: out of memory (not Triton's "OutOfMemoryError: out of resource",
# a shared-memory limit of the compiled kernel that recurs alone), cuDNN refusing to execute, and a case past
# --case-timeout (2026-12-01e: flex's s97 GQA cases compiling beside 15 other sweeps took > 300 s; with 8 processes
# on 2026-12-01d the same kind ended in 31-186 s). Inductor's NoValidChoicesError is no longer retried: all 41 flex
# pr rows re-run alone (2026-12-01d/e) recurred.
RETRY_DEFAULT = (r"out of memory|OutOfMemoryError(?!: out of resource)|mha_graph\.execute"
                 r"|timed out after \d+ s \(--case-timeout\)")


def set_aside_for_retry(shard: Shard, pattern: "re.Pattern[str]") -> list[str]:
    """Drop the journal's ERROR rows whose reason matches (each case once: <job>/retried.txt), so a
    --resume runs them again; the journal as it was is kept beside it. Returns the case ids."""
    done_file = shard.folder.parent / "retried.txt"
    done = set(done_file.read_text().split()) if done_file.is_file() else set()
    again = [cid for cid, r in journal_results(shard.journal).items()
             if r.status.value == "ERROR" and pattern.search(r.reason) and cid not in done]
    if again:
        drop_cases(shard.journal, set(again), shard.journal.with_suffix(f".before-retry-{int(time.time())}.jsonl"))
        shard.sweep_json.unlink(missing_ok=True)
        with open(done_file, "a") as fh:
            fh.write("".join(f"{cid}\n" for cid in again))
    return again


def visible_gpus() -> int:
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in listing.splitlines())


def launch(shard: Shard, device: str, threads: int, gpu: int | None = None) -> tuple[subprocess.Popen, Path]:
    shard.folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "gate", "sweep", "--kernel", shard.kernel, "--suite", shard.suite, "--device", device,
           "--no-progress", "--out", str(shard.folder)]
    if shard.count > 1:
        cmd += ["--shard", f"{shard.index}/{shard.count}"]
    if shard.only:
        cmd.append(f"--only={shard.only}")
    if shard.journal.is_file():
        cmd.append("--resume")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               TORCHINDUCTOR_COMPILE_THREADS="1", PYTHONUNBUFFERED="1")
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    log = shard.folder / f"sweep-{int(time.time())}.log"
    with open(log, "w") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return proc, log


def stop(proc: subprocess.Popen) -> None:
    """The shard's process group (the gate and its worker): SIGTERM, then SIGKILL after 15 s."""
    for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass


def perf_once(shard: Shard, folder: Path, args: argparse.Namespace, deadline: float) -> str:
    """A whole job's speed cases, once, into its merged folder; run only when no sweep is running, so
    the timed kernels have the machine to themselves."""
    target = folder / f"perf-{safe_name(shard.kernel)}-{shard.suite}.json"
    if target.is_file():
        return f"done ({target.name})"
    left = deadline - time.time()
    if left < 60:
        return "not run: budget spent"
    t0 = time.time()
    with open(folder / "perf.log", "w") as fh:
        try:
            rc = subprocess.run([sys.executable, "-m", "gate", "perf", "--kernel", shard.kernel, "--suite", shard.suite,
                                 "--device", args.device, "--out", str(folder)], stdout=fh, stderr=subprocess.STDOUT,
                                timeout=left).returncode
        except subprocess.TimeoutExpired:
            return f"cut at the budget after {time.time() - t0:.0f} s"
    return f"rc={rc}, {time.time() - t0:.0f} s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--job", action="append", required=True, help="KERNEL:SUITE:SHARDS[@IDS_FILE] (repeatable)")
    ap.add_argument("--budget-s", type=float, default=540)
    ap.add_argument("--state", default="out/fanout")
    ap.add_argument("--out", default=os.environ.get("OUT", "out/fanout-out"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--threads", type=int, default=2, help="OMP threads per shard process")
    ap.add_argument("--max-procs", type=int, default=0, help="shard processes at once (0: all)")
    ap.add_argument("--gpus", type=int, default=-1, help="GPUs to spread the shards over (default: all nvidia-smi lists)")
    ap.add_argument("--perf", action="store_true", help="then each whole job's speed cases, alone on the machine")
    ap.add_argument("--retry", default=RETRY_DEFAULT,
                    help="regex: ERROR rows whose reason matches run once more, alone on the GPU, after the parallel phase "
                         "('' for none)")
    args = ap.parse_args()
    state, out = Path(args.state), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.budget_s
    jobs = {j: parse_job(j, state) for j in args.job}
    shards = [s for js in jobs.values() for s in js]
    running: dict[Shard, tuple[subprocess.Popen, Path, float]] = {}
    on_gpu: dict[Shard, int | None] = {}
    gpus = (visible_gpus() if args.gpus < 0 else args.gpus) if args.device == "cuda" else 0
    notes: list[str] = []

    def start(s: Shard) -> None:
        load = Counter(on_gpu[r] for r in running)
        gpu = min(range(gpus), key=lambda g: load[g]) if gpus > 1 else None
        proc, log = launch(s, args.device, args.threads, gpu)
        running[s], on_gpu[s] = (proc, log, time.time()), gpu

    pending = [s for s in shards if not s.sweep_json.is_file()]
    cap = args.max_procs if args.max_procs > 0 else len(pending) or 1
    print(f"fanout: {len(pending)} shards to run ({cap} at once), {len(shards) - len(pending)} already finished; "
          f"budget {args.budget_s:.0f} s", flush=True)
    t0, last = time.time(), time.time()

    def reap() -> None:
        for s, (proc, log, started) in list(running.items()):
            if proc.poll() is None:
                continue
            del running[s]
            text = log.read_text(errors="replace")
            if proc.returncode == 2 and "--resume:" in text and s.journal.is_file():
                aside = s.journal.with_suffix(f".refused-{int(time.time())}.jsonl")
                s.journal.rename(aside)
                pending.append(s)  # afresh, in this call
                notes.append(f"{s.label}: --resume refused (another machine or other code), journal set aside as {aside.name}")
            elif proc.returncode not in (0, 1):  # 0 PASS, 1 FAIL: anything else ended the sweep itself
                last_line = next((ln for ln in reversed(text.splitlines()) if ln.strip()), "")
                notes.append(f"{s.label}: the sweep exited rc={proc.returncode}: {last_line[:200]}")
            verdict = next((ln for ln in reversed(text.splitlines()) if ln.startswith(("PASS", "FAIL"))), "")
            print(f"[{time.time() - t0:5.0f}s] {s.label} rc={proc.returncode} {time.time() - started:.0f}s {verdict[:120]}",
                  flush=True)

    while (running or pending) and time.time() < deadline:
        while pending and len(running) < cap:
            start(pending.pop(0))
        time.sleep(2)
        reap()
        if time.time() - last > 60:
            last = time.time()
            done = sum(sum(journal_counts(s.journal)[0].values()) for s in shards)
            print(f"[{time.time() - t0:5.0f}s] {len(running)} shards running, {len(pending)} waiting, {done} cases journalled",
                  flush=True)
    notes += [f"{s.label}: not started (budget spent)" for s in pending]
    retried: dict[str, list[str]] = {}
    if args.retry and not running and not pending:  # the quiet phase: one shard at a time, nothing else on the GPU
        pattern = re.compile(args.retry)
        for s in shards:
            if time.time() > deadline - 30:
                break
            again = set_aside_for_retry(s, pattern)
            if not again:
                continue
            retried[s.label] = again
            print(f"[{time.time() - t0:5.0f}s] {s.label}: {len(again)} ERROR rows run again alone", flush=True)
            start(s)
            while running and time.time() < deadline:
                time.sleep(2)
                reap()
    for s, (proc, _log, _started) in running.items():
        stop(proc)
        notes.append(f"{s.label}: stopped at the budget (its journal keeps every finished case)")
    lines = [f"# fanout on {args.device}, budget {args.budget_s:.0f} s, wall {time.time() - t0:.0f} s", "",
             "| job | shards finished | PASS | FAIL | ERROR | SKIP | journalled | merged | speed |",
             "|---|---|---|---|---|---|---|---|---|"]
    bad_rows: list[str] = []
    for name, js in jobs.items():
        counts: Counter = Counter()
        for s in js:
            c, bad = journal_counts(s.journal)
            counts += c
            bad_rows += [f"- {s.kernel} {cid}: {st} {reason}" for cid, st, reason in bad]
        finished = sum(s.sweep_json.is_file() for s in js)
        merged = ""
        if finished == len(js):
            target = js[0].folder.parent / "merged"
            if len(js) == 1:
                merged = str(js[0].folder)
            else:
                r = subprocess.run([sys.executable, "-m", "gate", "merge", "--out", str(target), *[str(s.folder) for s in js]],
                                   capture_output=True, text=True)
                merged = str(target) if r.returncode in (0, 1) else f"merge rc={r.returncode}: {(r.stderr or r.stdout)[-200:]}"
        speed = perf_once(js[0], Path(merged), args, deadline) if args.perf and merged and not merged.startswith("merge rc") else ""
        lines.append(f"| {name} | {finished}/{len(js)} | {counts['PASS']} | {counts['FAIL']} | {counts['ERROR']} | "
                     f"{counts['SKIP']} | {sum(counts.values())} | {merged} | {speed} |")
    for label, ids in retried.items():
        shard = next(s for s in shards if s.label == label)
        now = {cid: r.status.value for cid, r in journal_results(shard.journal).items()}
        outcome = Counter(now.get(cid, "not reached") for cid in ids)
        notes.append(f"{label}: {len(ids)} ERROR rows run again alone: " + ", ".join(f"{k} {v}" for k, v in sorted(outcome.items())))
    lines += ["", *([f"- {n}" for n in notes]), "", "## FAIL / ERROR rows", "", *(bad_rows or ["none"])]
    (out / "status.md").write_text("\n".join(lines) + "\n")
    state.mkdir(parents=True, exist_ok=True)
    (state / "status.md").write_text("\n".join(lines) + "\n")
    with tarfile.open(out / "fanout.tar.gz", "w:gz") as tar:
        tar.add(state, arcname=state.name)
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
