"""`attn-gate bisect`: the first commit between a good and a bad one where the gate fails chosen cases.

    resolve    the repository, GOOD and BAD commits (GOOD an ancestor of BAD), the cases (--only or
               the last check's failures), and the judge: the config and the baseline COMMITTED AT
               BAD, checked out once in a worktree of their own. Every step is judged by that one
               config and baseline (the ones the failing check used), so only the kernel's code
               changes along the bisect.
    endpoints  BAD must fail and GOOD must pass under that judge, else there is nothing to bisect.
    bisect     `git bisect run` (in a worktree of its own, --no-checkout) calls `attn-gate bisect-step`:
               a fresh worktree of the commit, its install step, then `attn-gate check` of exactly
               those cases, re-run to catch a flaky verdict.

A step's exit tells git bisect what it saw: 0 good, 1 bad, 125 skip (the install step failed or the
gate could not run the kernel: exit 2), 128 stop (the verdict flipped on the re-run: flaky). Every
step writes one JSON line to the record, which the driver reads to name the first bad commit with
its failing cases and tensors, or the flaky cases. Worktrees and the bisect state are removed on
every exit.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import tomllib
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gate.compare.findings import Subject
from gate.core.errors import UserError

GOOD, BAD, SKIP, FLAKY = "good", "bad", "skip", "flaky"
# the answer to an install step that fails in every worktree, the ends' included
SETUP_FIX = (
    "pass --setup CMD with the command that installs the kernel in a fresh worktree, or --setup none to "
    "install nothing and import the kernel from the worktree"
)
EXIT_OF = {GOOD: 0, BAD: 1, SKIP: 125, FLAKY: 128}  # git bisect run: 125 skips, >= 128 stops the run
SETUP_TIMEOUT_S = 3600.0
MAX_CASE_LINES = 20  # the first bad commit's failing cases named on the terminal, as check names its worst


@dataclass(frozen=True)
class BisectSpec:
    """Everything a step needs, resolved once by the driver and handed to each step as JSON."""

    repo: str  # the repository's top level
    good: str  # full commit ids
    bad: str
    cases: tuple[str, ...]  # the case ids to judge
    only: str  # an exact --only regex of `cases`
    kernel: str
    suite: str
    device: str
    config: str  # the judge: pyproject.toml of the BAD tree's checkout
    baseline: str  # the baseline file committed at BAD (in that checkout)
    setup: str | None  # --setup; None: each commit's own [tool.attn-gate.ci] setup line
    perf: bool = False
    reruns: int = 1
    workdir: str = ""  # the temporary folder the worktrees and records live in
    record: str = ""  # the JSON-lines record every step appends to

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1), encoding="utf-8")

    @classmethod
    def read(cls, path: Path) -> "BisectSpec":
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        data["cases"] = tuple(data["cases"])
        return cls(**data)


@dataclass(frozen=True)
class StepResult:
    commit: str
    subject: str
    verdict: str  # good, bad, skip, flaky
    reason: str  # one line: why skip, what failed, what flipped
    failing: dict[str, list[str]] = field(default_factory=dict)  # case id -> the tensors (metrics) that failed
    flipped: tuple[str, ...] = ()  # flaky: the cases whose verdict changed on the re-run
    fix: str = ""  # a skip the bisect's own options cause: what to pass instead

    @property
    def exit_code(self) -> int:
        return EXIT_OF[self.verdict]


@dataclass(frozen=True)
class BisectOutcome:
    spec: BisectSpec
    steps: tuple[StepResult, ...]
    first_bad: StepResult | None  # None: stopped (flaky), or only skipped commits were left
    candidates: tuple[str, ...] = ()  # where skips hid the answer: the commits it could be
    stopped: StepResult | None = None  # the flaky step that stopped the bisect

    @property
    def exit_code(self) -> int:
        """0: the first bad commit is named; 1: no single commit could be named (flaky, skips)."""
        return 0 if self.first_bad is not None else 1

    def text(self) -> str:
        spec = self.spec
        lines = [
            f"attn-gate bisect: {len(spec.cases)} case{'s' * (len(spec.cases) != 1)} of {spec.kernel} / {spec.suite} "
            f"between {spec.good[:12]} (good) and {spec.bad[:12]} (bad), judged by the config and baseline "
            f"committed at {spec.bad[:12]} ({Path(spec.baseline).relative_to(Path(spec.config).parent)})"
        ]
        for s in self.steps:
            lines.append(f"  {s.commit[:12]} {s.verdict:<5} {s.subject[:60]}" + (f"  ({s.reason})" if s.reason else ""))
        if self.stopped is not None:
            s = self.stopped
            lines.append(
                f"STOPPED: flaky at {s.commit[:12]}: {', '.join(s.flipped)} flipped on a re-run; "
                f"no commit is named (a flaky verdict would point at the wrong one). Fix or exclude the "
                f"flaky case and bisect again"
            )
        elif self.first_bad is not None:
            s = self.first_bad
            lines.append(f"FIRST BAD COMMIT: {s.commit} {s.subject}")
            failing = sorted(s.failing.items())
            if len(failing) > 1:
                counts = Counter(t for _, tensors in failing for t in tensors)
                where = ", ".join(f"{t} in {n}" for t, n in counts.most_common())
                lines.append(f"  {len(failing)} cases fail at it: {where}")
            lines += [f"  {case}: {', '.join(tensors)}" for case, tensors in failing[:MAX_CASE_LINES]]
            if len(failing) > MAX_CASE_LINES:
                lines.append(f"  ... and {len(failing) - MAX_CASE_LINES} more: every one is in the bisect JSON")
        else:
            lines.append(
                "NOT FOUND: only skipped commits (ones that do not build or install) were left; the first bad "
                "commit is one of: " + ", ".join(c[:12] for c in self.candidates)
            )
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "kind": "attn-gate bisect",
            "schema_version": 2,  # 2: a step's `fix`
            "spec": asdict(self.spec),
            "steps": [asdict(s) for s in self.steps],
            "first_bad": asdict(self.first_bad) if self.first_bad else None,
            "candidates": list(self.candidates),
            "stopped": asdict(self.stopped) if self.stopped else None,
        }


# ---------------------------------------------------------------- git


def git(repo: str | Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise UserError(
            f"git {' '.join(args)} failed in {repo}: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}"
        )
    return proc


def repo_root(path: Path) -> str:
    proc = git(path, "rev-parse", "--show-toplevel", check=False)
    if proc.returncode != 0:
        raise UserError(f"{path} is not inside a git repository: run `attn-gate bisect` from the kernel repository")
    return proc.stdout.strip()


def resolve_commit(repo: str, ref: str, option: str) -> str:
    proc = git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
    if proc.returncode != 0:
        raise UserError(f"{option} {ref}: not a commit of {repo}; pass a commit id, branch or tag (git log shows them)")
    return proc.stdout.strip()


def subject(repo: str, commit: str) -> str:
    return git(repo, "log", "-1", "--format=%s", commit).stdout.strip()


def add_worktree(repo: str, path: Path, commit: str, checkout: bool = True) -> None:
    args = ["worktree", "add", "--detach", *(() if checkout else ("--no-checkout",)), str(path), commit]
    git(repo, *args)


def remove_worktree(repo: str, path: Path) -> None:
    """Best effort: a worktree left behind is pruned by the next one removed."""
    git(repo, "worktree", "remove", "--force", str(path), check=False)
    shutil.rmtree(path, ignore_errors=True)
    git(repo, "worktree", "prune", check=False)


@contextlib.contextmanager
def worktree(repo: str, path: Path, commit: str, checkout: bool = True):
    try:
        add_worktree(repo, path, commit, checkout)
        yield path
    finally:
        remove_worktree(repo, path)


# ---------------------------------------------------------------- one step


def setup_line(spec: BisectSpec, tree: Path) -> str:
    """--setup, else the commit's own [tool.attn-gate.ci] setup line ('' when it has none). A
    pyproject.toml that does not parse is the commit's own breakage: raised, the step is a skip."""
    if spec.setup is not None:
        return spec.setup
    path = tree / Path(spec.config).relative_to(Path(spec.workdir) / "judge")  # the config's place in the tree
    if not path.is_file():
        return ""
    raw = tomllib.loads(path.read_text(encoding="utf-8"))
    return str(raw.get("tool", {}).get("attn-gate", {}).get("ci", {}).get("setup", "") or "")


def check_command(spec: BisectSpec, tree: Path, out: Path) -> list[str]:
    """`attn-gate check` of exactly the spec's cases with the BAD tree's config and baseline. The
    interpreter is the one the install step made (tree/.venv) where it made one, else this one;
    -P keeps a `gate/` folder of the commit from shadowing the gate that judges."""
    venv = tree / ".venv" / "bin" / "python"
    python = str(venv) if venv.is_file() else sys.executable
    return [
        python,
        "-P",
        "-m",
        "gate",
        "check",
        "--kernel",
        spec.kernel,
        "--suite",
        spec.suite,
        "--device",
        spec.device,
        "--config",
        spec.config,
        "--baseline",
        spec.baseline,
        "--only",
        spec.only,
        "--out",
        str(out),
        "--no-progress",
        "--perf" if spec.perf else "--no-perf",
    ]


def step_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("GITHUB_STEP_SUMMARY", None)  # the bisect writes one summary, not one per step
    return env


def listed(items: list[str], sep: str, limit: int) -> str:
    """The items joined, as many as fit in `limit` characters, then how many more there are (the
    first one always shows)."""
    for n in range(len(items), 1, -1):
        text = sep.join(items[:n]) + (f"{sep}... {len(items) - n} more" if n < len(items) else "")
        if len(text) <= limit:
            return text
    return sep.join(items[:1]) + (f"{sep}... {len(items) - 1} more" if len(items) > 1 else "")


def step_verdict(
    returncode: int, findings: list[dict] | None, cases: tuple[str, ...]
) -> tuple[str, str, dict[str, list[str]]]:
    """A check's exit (0 or 1) and its findings -> (good/bad/skip, reason, case id -> the tensors it
    FAILed on). FAIL is evidence of a bad commit; INCONCLUSIVE alone (a suspected speed regression
    its confirm re-run could not decide, a measurement that could not judge) is not: a skip."""
    if findings is None:
        return SKIP, f"the check exited {returncode} without a findings JSON", {}
    if returncode == 0:
        return GOOD, "", {}
    failing: dict[str, set[str]] = {}
    undecided, run_wide = set(), []
    for f in findings:
        if f["severity"] == "INCONCLUSIVE":
            undecided.add(f["case_id"] or "the run")
        elif f["severity"] != "FAIL":
            continue
        elif not f["case_id"]:
            run_wide.append(f["message"])
        elif f["case_id"] in cases:
            failing.setdefault(f["case_id"], set()).add(Subject.parse(f["metric"]).name)
    # the tensors a case failed on (ratio:dk -> dk); a status change alone (an ERROR row) names "status"
    tensors = {c: sorted(m - {"status"}) or sorted(m) for c, m in sorted(failing.items())}
    if tensors or run_wide:
        return BAD, listed([f"{c} ({', '.join(t)})" for c, t in tensors.items()] + run_wide, "; ", 300), tensors
    if undecided:
        return SKIP, f"inconclusive, not failing: {listed(sorted(undecided), ', ', 200)}", {}
    return SKIP, "the check failed on no bisected case", {}


def judge_once(spec: BisectSpec, tree: Path, out: Path) -> tuple[str, str, dict[str, list[str]]]:
    """(verdict good/bad/skip, reason, failing) of one `attn-gate check` run in `tree`."""
    proc = subprocess.run(check_command(spec, tree, out), cwd=tree, env=step_env(), capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        last = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["no output"])[-1]
        return SKIP, f"the gate could not run it (exit {proc.returncode}): {last[:200]}", {}
    found = sorted(out.glob("findings-*.json"))
    findings = json.loads(found[0].read_text(encoding="utf-8"))["findings"] if found else None
    return step_verdict(proc.returncode, findings, spec.cases)


def run_step(spec: BisectSpec, commit: str) -> StepResult:
    """One commit: a fresh worktree, its install step, the check and its re-runs."""
    title = subject(spec.repo, commit)
    tree = Path(spec.workdir) / f"step-{commit[:12]}"
    with worktree(spec.repo, tree, commit):
        try:
            line = setup_line(spec, tree)
        except (OSError, ValueError) as exc:
            return StepResult(commit, title, SKIP, f"its pyproject.toml does not parse: {exc}")
        if line:
            try:
                proc = subprocess.run(
                    ["bash", "-c", line],
                    cwd=tree,
                    env=step_env(),
                    capture_output=True,
                    text=True,
                    timeout=SETUP_TIMEOUT_S,
                )
            except subprocess.TimeoutExpired:
                return StepResult(
                    commit, title, SKIP, f"the install step `{line}` ran over {SETUP_TIMEOUT_S:.0f} s", fix=SETUP_FIX
                )
            if proc.returncode != 0:
                # the last lines that say something: pip ends with a note that names no cause
                lines = [ln.strip() for ln in (proc.stderr or proc.stdout or "").splitlines() if ln.strip()]
                said = [ln for ln in lines if not ln.startswith("note: ")][-3:] or lines[-1:] or ["no output"]
                return StepResult(
                    commit,
                    title,
                    SKIP,
                    f"the install step `{line}` failed (exit {proc.returncode}): {' | '.join(said)[:400]}",
                    fix=SETUP_FIX,
                )
        runs = []
        for i in range(1 + spec.reruns):
            out = Path(spec.workdir) / f"out-{commit[:12]}-{i}"
            shutil.rmtree(out, ignore_errors=True)
            runs.append(judge_once(spec, tree, out))
            if runs[0][0] == SKIP:
                return StepResult(commit, title, SKIP, runs[0][1])
    return decide_step(commit, title, runs)


def decide_step(commit: str, title: str, runs: list[tuple[str, str, dict[str, list[str]]]]) -> StepResult:
    """The runs of one commit -> its verdict: the same verdict and the same failing cases every time,
    else FLAKY naming the cases that changed (a skip among re-runs is flaky too: it ran before)."""
    first_verdict, first_reason, first_failing = runs[0]
    for verdict, _, failing in runs[1:]:
        if verdict != first_verdict or set(failing) != set(first_failing):
            flipped = tuple(sorted(set(failing) ^ set(first_failing))) or ("the run-wide verdict",)
            return StepResult(
                commit,
                title,
                FLAKY,
                f"{', '.join(flipped)} flipped: {first_verdict} then {verdict}",
                dict(first_failing or failing),
                flipped,
            )
    return StepResult(commit, title, first_verdict, first_reason, first_failing)


def append_record(spec: BisectSpec, result: StepResult) -> None:
    with open(spec.record, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(asdict(result)) + "\n")


def read_record(path: Path) -> list[StepResult]:
    if not path.is_file():
        return []
    steps = []
    for line in path.read_text(encoding="utf-8").splitlines():
        d = json.loads(line)
        d["flipped"] = tuple(d["flipped"])
        steps.append(StepResult(**d))
    return steps


def bisect_step(spec_path: Path) -> int:
    """`attn-gate bisect-step SPEC`: what `git bisect run` calls. The commit is BISECT_HEAD of the
    bisect worktree (it is the working directory git bisect run gives)."""
    spec = BisectSpec.read(spec_path)
    commit = git(".", "rev-parse", "BISECT_HEAD").stdout.strip()
    try:
        result = run_step(spec, commit)
    except Exception as exc:  # the step's own failure is no verdict on the commit: stop, say why
        result = StepResult(commit, "", FLAKY, f"the step itself failed: {type(exc).__name__}: {exc}")
    append_record(spec, result)
    print(
        f"attn-gate bisect-step: {commit[:12]} {result.verdict}" + (f" ({result.reason})" if result.reason else ""),
        flush=True,
    )
    return result.exit_code


# ---------------------------------------------------------------- the driver


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """A cancelled job (SIGTERM) cleans up like Ctrl-C: the worktrees and the bisect state go."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def run_bisect(spec: BisectSpec, log=print) -> BisectOutcome:
    """Endpoints first, then `git bisect run` over the steps between them."""
    steps: list[StepResult] = []
    for commit, want in ((spec.bad, BAD), (spec.good, GOOD)):
        result = run_step(spec, commit)
        steps.append(result)
        if result.verdict == FLAKY:
            return BisectOutcome(spec, tuple(steps), None, stopped=result)
        if result.verdict != want:  # the error says it all, the step's reason included: not said twice
            end = "--bad" if want == BAD else "--good"
            raise UserError(
                f"{end} {commit[:12]} is {result.verdict}, not {want}, under the baseline committed at {spec.bad[:12]}"
                + (f" ({result.reason})" if result.reason else "")
                + (
                    f"; {result.fix}"
                    if result.fix
                    else "; nothing to bisect: pass the commit where these cases fail as --bad"
                    if want == BAD
                    else "; pass an older --good where these cases pass"
                )
            )
        log(
            f"attn-gate bisect: {commit[:12]} ({'bad' if want == BAD else 'good'} end) is {result.verdict}"
            + (f" ({result.reason})" if result.reason else "")
        )
    if git(spec.repo, "rev-list", "--count", f"{spec.good}..{spec.bad}").stdout.strip() == "1":
        return BisectOutcome(spec, tuple(steps), steps[0])  # BAD is GOOD's child: it is the first bad commit
    tree = Path(spec.workdir) / "bisect"
    spec_path = Path(spec.workdir) / "spec.json"
    spec.write(spec_path)
    with worktree(spec.repo, tree, spec.bad, checkout=False):
        try:
            git(tree, "bisect", "start", "--no-checkout", spec.bad, spec.good)
            step = shlex.join([sys.executable, "-P", "-m", "gate", "bisect-step", str(spec_path)])
            output, returncode = _bisect_run(tree, step, log)
            bad_ref = git(tree, "rev-parse", "--verify", "--quiet", "refs/bisect/bad", check=False).stdout.strip()
        finally:
            git(tree, "bisect", "reset", check=False)
    steps += read_record(Path(spec.record))
    flaky = [s for s in steps if s.verdict == FLAKY]
    if flaky:
        return BisectOutcome(spec, tuple(steps), None, stopped=flaky[-1])
    if re.search(r"is the first bad commit", output) and bad_ref:
        by_commit = {s.commit: s for s in steps}
        return BisectOutcome(spec, tuple(steps), by_commit.get(bad_ref) or run_step(spec, bad_ref))
    candidates = tuple(re.findall(r"^([0-9a-f]{40})$", output, flags=re.M))
    if not candidates:
        raise UserError(
            f"git bisect run ended without naming a commit (exit {returncode}): "
            f"{(output.strip().splitlines() or ['no output'])[-1]}"
        )
    return BisectOutcome(spec, tuple(steps), None, candidates=candidates)


def _bisect_run(tree: Path, step: str, log) -> tuple[str, int]:
    """`git bisect run` in `tree`: its whole output (read for the answer) and exit code; each step's
    one-line verdict is logged as it comes, so a long bisect shows where it is."""
    proc = subprocess.Popen(
        ["git", "-C", str(tree), "bisect", "run", "bash", "-c", step],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=step_env(),
    )
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("attn-gate bisect-step: "):
                log("attn-gate bisect: " + line.removeprefix("attn-gate bisect-step: ").rstrip())
    except BaseException:  # Ctrl-C, a cancelled job: the step goes too, then the cleanup runs
        proc.kill()
        raise
    finally:
        proc.stdout.close()
        proc.wait()
    return "".join(lines), proc.returncode


@contextlib.contextmanager
def bisect_workdir(repo: str):
    """The temporary folder of one bisect: worktrees, step outputs, the record; removed on exit, with
    the repository's record of any worktree a killed step left."""
    path = Path(tempfile.mkdtemp(prefix="attn-gate-bisect-"))
    try:
        with _sigterm_as_interrupt():
            yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        git(repo, "worktree", "prune", check=False)
