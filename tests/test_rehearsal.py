"""A rehearsal of the PR gate: gate.yml's `gate` job, its `run:` steps in order, on this CPU, and
the chain around it: a fork PR's own events reach no GPU job, a comment is vetted (or not) by
vet.yml's script, main's gate.yml runs on the vetted commit, and report.yml's scripts accept that
run and post its summary.

First the runner guard runs as the runner's job-started hook would (the real script, with the
recorded workflow_dispatch payload and a canary in a temporary folder), under a fake runner that
keeps the real runner's semantics (actions/runner JobExtension.cs, StepsRunner.cs): processes
named Runner.Listener and Runner.Worker, the hook a pre-job step of the worker, a failed hook
marking the job failed while the worker still runs every action's `pre:` step (pre-if defaults to
always()) and every later step whose condition holds (`always()`, `failure()`, `!cancelled()`);
only a worker that is gone runs nothing. What the guard writes to GITHUB_ENV (HOME and the caches
under RUNNER_TEMP) is the job's environment. Then the steps run as
the runner runs them (`bash --noprofile --norc -eo pipefail`, from the repository root) with
GITHUB_STEP_SUMMARY, GITHUB_OUTPUT, GITHUB_ENV and RUNNER_TEMP pointing at temporary files, the job's and step's `env:` with their expressions filled in from a table of known
values (an expression the table does not know fails the test: the rehearsal must learn it), and
GitHub's rule for which steps run after a failure, including `steps.<id>.outcome` conditions.
A local action (`uses: ./...`) runs its `pre:` and main script under node; other `uses:` steps
are GitHub's own actions and are skipped (the checkout too: the rehearsal gates this
working tree's HEAD, passed as the vetted sha); so is the set-up step (scripts/setup.sh,
which .ci/run has just run). On a CPU `attn-gate check` takes the config's cpu profile (sdpa-cpu,
suite smoke, baselines/cpu/); the repository variables the workflow reads select the kernel and a
few cases, so a buggy kernel can be swapped in. The asv step runs in its own test (real asv).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests import test_runner_guard as guard
from tests import test_workflows as wf
from tests.tools import interpreter_path_prefix, require

ROOT = Path(__file__).resolve().parents[1]
GATE = ROOT / ".github" / "workflows" / "gate.yml"
EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
CASES = "^fp32-b2-h2-s65x33-d40"  # two small fp32 cases of the smoke suite (causal and not): seconds
PERF_CASE = "^bf16-b2-h4-s256-d64$"  # one perf case of the smoke suite: what asv times on a CPU
SKIPPED_RUN_STEPS = {"setup", "asv"}  # step ids not run by default; their reasons are in the module docstring
PR_NUMBER = "123"
HEAD_SHA = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def gate_job() -> dict:
    return yaml.safe_load(GATE.read_text())["jobs"]["gate"]


@dataclass
class StepRun:
    name: str
    kind: str  # "run", "uses" (skipped: a GitHub action), "skipped" (set-up, or not run after a failure)
    returncode: int | None = None
    output: str = ""
    outputs: dict[str, str] = field(default_factory=dict)


@dataclass
class Rehearsal:
    steps: list[StepRun]
    failed: bool
    step_summary: str
    runner_temp: Path
    rendered: dict  # the job's `uses:` steps' `with:` as they would be passed, by step name
    hook: str = ""  # the runner guard's output
    job_ended: bool = False  # the guard killed the worker: no step of the job ran
    listener_stopped: bool = False  # ... and the listener: the host takes no other job

    def step(self, name_or_id: str) -> StepRun:
        return next(s for s in self.steps if s.name == name_or_id)


def fill(value, known: dict[str, str], where: str) -> str:
    def sub(m: re.Match) -> str:
        expr = m.group(1)
        default = re.fullmatch(r"(vars\.\w+) \|\| '([^']*)'", expr)
        if default:  # `vars.X || 'default'`
            return known.get(default[1]) or default[2]
        if expr.startswith("vars.") and expr not in known:
            return ""  # an unset repository variable reads as the empty string
        assert expr in known, f"{where}: expression `{expr}` is not in the rehearsal's table; add its CPU value"
        return known[expr]

    return EXPRESSION.sub(sub, str(value))


def should_run(condition: str | None, failed: bool, outcomes: dict[str, str], where: str) -> bool:
    """GitHub's step condition: none means success(); `!cancelled()`/`always()` run after a failure;
    `failure()` only after one; `steps.<id>.outcome == '<value>'` reads an earlier step's outcome.
    Other forms fail the test."""
    if condition is None:
        return not failed
    terms = [t.strip() for t in EXPRESSION.sub(lambda m: m.group(1), condition).split("&&")]
    result = True
    for term in terms:
        outcome = re.fullmatch(r"steps\.([\w-]+)\.outcome == '(\w+)'", term)
        if term in ("!cancelled()", "always()"):
            continue
        if term in ("failure()", "success()"):
            result = result and failed == (term == "failure()")
            continue
        assert outcome, f"{where}: condition term {term!r} is not modelled here"
        result = result and outcomes.get(outcome[1]) == outcome[2]
    return result


def parse_outputs(text: str) -> dict[str, str]:
    """$GITHUB_OUTPUT's two forms: `key=value` and `key<<DELIM` ... `DELIM`."""
    out, lines = {}, iter(text.splitlines())
    for line in lines:
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            key, delim = line.split("<<", 1)
            out[key] = "\n".join(iter(lambda: next(lines), delim))
        elif "=" in line:
            key, value = line.split("=", 1)
            out[key] = value
    return out


@dataclass
class HookRun:
    returncode: int | None  # None: the worker was gone before the hook returned
    output: str
    worker_alive: bool
    listener_alive: bool
    github_env: dict[str, str]


FAKE_PROCESS = """case "$(readlink /proc/$$/exe)" in */{name}) ;; *) echo "not named {name}" >&2; exit 97;; esac
"""


def run_hook_under_fake_runner(
    tmp_path: Path, event: str, workflow: str, ref: str, payload: dict, config: Path, runner_temp: Path
) -> HookRun:
    """The job-started hook as the runner runs it: a Runner.Listener process starts a Runner.Worker
    (copies of bash under those names, so the guard finds them among its ancestors in /proc as it
    finds the real ones), and the worker runs the hook (job_started.sh's command line) as the job's
    first step. The worker then waits for the job's steps (run by the caller while it lives); the
    listener, like a persistent runner's, stays to take the next job."""
    bin_dir, state = tmp_path / "actions-runner" / "bin", tmp_path / "fake-runner"
    bin_dir.mkdir(parents=True)
    state.mkdir()
    bash = os.path.realpath(shutil.which("bash"))
    for name in ("Runner.Listener", "Runner.Worker"):
        shutil.copy(bash, bin_dir / name)
    (tmp_path / "event.json").write_text(json.dumps(payload))
    github_env = tmp_path / "github-env-hook"
    github_env.touch()
    hook = [sys.executable, "-I", str(guard.GUARD), "--config", str(config)]  # the real /proc: finds the fake runner
    (state / "hook.sh").write_text(f"exec {shlex.join(hook)}\n")
    (state / "worker.sh").write_text(
        FAKE_PROCESS.format(name="Runner.Worker")
        + f"""
bash "{state}/hook.sh" > "{state}/hook.out" 2>&1
echo $? > "{state}/hook.rc"
while [ ! -e "{state}/job.done" ]; do sleep 0.05; done
"""
    )
    (state / "listener.sh").write_text(
        FAKE_PROCESS.format(name="Runner.Listener")
        + f"""
"{bin_dir}/Runner.Worker" "{state}/worker.sh"
echo $? > "{state}/worker.rc"
while :; do sleep 0.05; done
"""
    )
    env = {
        "PATH": "/usr/bin:/bin",
        **guard.env_for(event, workflow, ref),
        "GITHUB_EVENT_PATH": str(tmp_path / "event.json"),
        "GITHUB_ENV": str(github_env),
        "RUNNER_TEMP": str(runner_temp),
    }
    listener = subprocess.Popen(
        [str(bin_dir / "Runner.Listener"), str(state / "listener.sh")],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if (state / "hook.rc").exists() or (state / "worker.rc").exists() or listener.poll() is not None:
            break
        time.sleep(0.05)
    time.sleep(0.2)  # a listener the guard signalled is reaped by now
    worker_rc = (state / "worker.rc").read_text().strip() if (state / "worker.rc").exists() else None
    assert worker_rc != "97", "the fake worker is not named Runner.Worker in /proc"
    hook_rc = int((state / "hook.rc").read_text()) if (state / "hook.rc").exists() else None
    alive = listener.poll() is None
    result = HookRun(
        hook_rc,
        (state / "hook.out").read_text() if (state / "hook.out").exists() else "",
        hook_rc is not None and worker_rc is None and alive,
        alive,
        dict(line.split("=", 1) for line in github_env.read_text().splitlines() if "=" in line),
    )
    (state / "job.done").touch()  # the steps are the caller's; the worker's wait ends here
    if alive:
        os.killpg(listener.pid, signal.SIGKILL)
    listener.wait(timeout=30)
    return result


def run_pre_steps(job: dict, cwd: Path, env: dict, failed: bool, tmp_path: Path) -> list[StepRun]:
    """Every local action's `pre:` step, before the job's own steps, under its `pre-if` (default
    always(): it runs after a failed hook too). Remote actions are GitHub's own, without pre."""
    runs = []
    for i, step in enumerate(job["steps"]):
        uses = step.get("uses", "")
        if not uses.startswith("./"):
            continue
        manifest = yaml.safe_load((cwd / uses / "action.yml").read_text())["runs"]
        if "pre" not in manifest or not should_run(manifest.get("pre-if", "always()"), failed, {}, f"pre {uses}"):
            continue
        proc = subprocess.run(
            ["node", str(cwd / uses / manifest["pre"])], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
        )
        runs.append(StepRun(f"pre {uses}", "run", proc.returncode, proc.stdout + proc.stderr))
    return runs


def rehearse(
    tmp_path: Path,
    variables: dict[str, str],
    *,
    cwd: Path = ROOT,
    skip: set[str] = SKIPPED_RUN_STEPS,
    pr: str = PR_NUMBER,
    sha: str = HEAD_SHA,
    extra_env: dict | None = None,
    canary: str | None = None,
    job: dict | None = None,
    event: str = "workflow_dispatch",
    workflow: str = "gate.yml",
    ref: str = "refs/heads/main",
    payload: dict | None = None,
    job_id: str = "gate",
    inputs: dict[str, str] | None = None,
    group: str = "attn-gate-gpu",
) -> Rehearsal:
    """The runner guard, then the gate job's steps; `variables` are the repository variables (vars.*)
    it reads. The run is what vet.yml dispatches: main's gate.yml with inputs pr and sha. `canary`:
    what an earlier job on this host left (None: a fresh machine). `job`, `event`, `workflow`,
    `ref`, `payload`: another job, as the runner reports it to the hook; another dispatched
    workflow's job: `workflow`, `job_id`, its `inputs` and the runner `group` whose settings admit it."""
    temp = tmp_path / "runner-temp"
    temp.mkdir()
    summary, github_env = tmp_path / "step-summary.md", tmp_path / "github-env"
    summary.touch()
    hook_dir = tmp_path / "hook"
    hook_dir.mkdir()
    config = guard.write_config(hook_dir, **{k: guard.shipped(group)[k] for k in ("group", "allow")})
    if canary is not None:
        (hook_dir / "state").mkdir()
        (hook_dir / "state" / "canary").write_text(canary)
    inputs = {"pr": pr, "sha": sha} if inputs is None else inputs
    if payload is None:
        payload = {**guard.DISPATCH_GATE, "workflow": f".github/workflows/{workflow}", "inputs": inputs}
    hook = run_hook_under_fake_runner(hook_dir, event, workflow, ref, payload, config, temp)
    guard_env = hook.github_env
    github_env.touch()  # the job's own GITHUB_ENV, empty at its first step
    known = {
        "runner.temp": str(temp),
        **{f"inputs.{k}": v for k, v in inputs.items()},
        # the checkout's ref, as GitHub evaluates it for a dispatch
        "github.event_name == 'merge_group' && github.sha || format('refs/pull/{0}/head', inputs.pr)": f"refs/pull/{pr}/head",
        **{f"vars.{k}": v for k, v in variables.items()},
    }
    job = job or yaml.safe_load((ROOT / ".github" / "workflows" / workflow).read_text())["jobs"][job_id]
    base_env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GITHUB_", "RUNNER_", "ATTN_GATE_", "PIP_")) and k not in ("PYTHONNOUSERSITE", "HOME")
    }
    base_env.update({"HOME": str(tmp_path / "runner-home")})  # the runner's own HOME, replaced by the guard's
    base_env.update(guard_env)
    base_env.update({k: fill(v, known, "job env") for k, v in job.get("env", {}).items()})
    base_env.update(
        {
            "RUNNER_TEMP": str(temp),
            "GITHUB_STEP_SUMMARY": str(summary),
            "GITHUB_ENV": str(github_env),
            "CI": "true",
            "GITHUB_ACTIONS": "true",
            "GITHUB_REF_NAME": "main",
            "GITHUB_REF": "refs/heads/main",
            "GITHUB_EVENT_NAME": "workflow_dispatch",
            "GITHUB_SHA": "c" * 40,
            "GITHUB_REPOSITORY": "o/r",
            "GITHUB_RUN_ID": "55",
            "GITHUB_JOB": "gate",
            **(extra_env or {}),
        }
    )
    if not hook.worker_alive:  # the guard ended the job: the worker runs nothing more
        return Rehearsal(
            [StepRun(s.get("id") or s.get("name") or s.get("uses"), "never ran") for s in job["steps"]],
            True,
            summary.read_text(),
            temp,
            {},
            hook.output,
            True,
            not hook.listener_alive,
        )
    # a hook that failed without ending the job fails it, and the runner goes on as for any failed step
    failed = hook.returncode != 0
    steps, rendered, outcomes = run_pre_steps(job, cwd, base_env, failed, tmp_path), {}, {}
    for i, step in enumerate(job["steps"]):
        name = step.get("id") or step.get("name") or step.get("uses")
        if not should_run(step.get("if"), failed, outcomes, f"step {name}"):
            steps.append(StepRun(name, "skipped"))
            outcomes[name] = "skipped"
            continue
        if str(step.get("uses", "")).startswith("./"):  # a local action's main step (node)
            manifest = yaml.safe_load((cwd / step["uses"] / "action.yml").read_text())["runs"]
            proc = subprocess.run(
                ["node", str(cwd / step["uses"] / manifest["main"])],
                cwd=cwd,
                env=base_env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            steps.append(StepRun(name, "run", proc.returncode, proc.stdout + proc.stderr))
            outcomes[name] = "success" if proc.returncode == 0 else "failure"
            failed = failed or proc.returncode != 0
            continue
        if "uses" in step:
            rendered[name] = {
                k: fill(v, known, f"step {name}")
                for k, v in step.get("with", {}).items()
                if "steps." not in str(v) and "hashFiles" not in str(v)
            }
            steps.append(StepRun(name, "uses"))
            outcomes[name] = "success"
            continue
        if step.get("id") in skip:
            steps.append(StepRun(name, "skipped"))
            outcomes[name] = "success" if step.get("id") == "setup" else "skipped"
            continue
        assert "${{" not in step["run"], f"step {name}: an expression inside run:"
        output_file = tmp_path / f"output-{i}"
        output_file.touch()
        env = dict(base_env)
        env.update(dict(line.split("=", 1) for line in github_env.read_text().splitlines() if "=" in line))
        env.update({k: fill(v, known, f"step {name} env") for k, v in step.get("env", {}).items()})
        env["GITHUB_OUTPUT"] = str(output_file)
        script = tmp_path / f"step-{i}.sh"
        # the steps' `. .venv/bin/activate`, for whichever venv runs the tests (setup.sh's .venv or another)
        script.write_text(step["run"].replace(". .venv/bin/activate", interpreter_path_prefix()))
        proc = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        steps.append(
            StepRun(name, "run", proc.returncode, proc.stdout + proc.stderr, parse_outputs(output_file.read_text()))
        )
        outcomes[name] = "success" if proc.returncode == 0 else "failure"
        failed = failed or proc.returncode != 0
    return Rehearsal(steps, failed, summary.read_text(), temp, rendered, hook.output)


def assert_artifacts_complete(r: Rehearsal, pr_number: str = PR_NUMBER, sha: str = HEAD_SHA) -> Path:
    """What report.yml reads is where the upload steps pick it up: the small summary artifact."""
    summary = Path(r.rendered["Upload the summary for the report workflow (small)"]["path"])
    results = Path(r.rendered["Upload results, findings, plots and asv results"]["path"])
    assert (summary, results) == (r.runner_temp / "gate-summary", r.runner_temp / "gate-results")
    assert (summary / "pr-number").read_text().strip() == pr_number
    assert (summary / "head-sha").read_text().strip() == sha
    assert (summary / "summary.md").read_text().strip()
    assert (summary / "summary.md").read_text() == (results / "summary.md").read_text()[:60000]
    return results


KINDS = ["run", "run", "uses", "run", "run", "uses", "skipped", "run", "run", "run", "skipped", "run", "uses", "uses"]


FORK_PR = "7"  # the fork PR of test_fork_pr_end_to_end, whose vetted dispatch asks for the passing run


@pytest.fixture(scope="module")
def passing(tmp_path_factory, cpu_baseline) -> Rehearsal:
    """The gate job on a passing kernel, dispatched for PR 7 at this commit."""
    variables = {
        "ATTN_GATE_KERNEL": "sdpa-cpu",
        "ATTN_GATE_ONLY": CASES,
        "ATTN_GATE_DEVICE": "cpu",
        "ATTN_GATE_BASELINE": str(cpu_baseline.path),
    }
    return rehearse(tmp_path_factory.mktemp("passing"), variables, pr=FORK_PR, sha=HEAD_SHA)


@pytest.mark.slow
@pytest.mark.xdist_group("rehearsal_passing")
def test_rehearsal_passing_kernel(passing):
    r = passing
    gate = r.step("gate")
    assert gate.returncode == 0, gate.output[-3000:]
    assert not r.failed
    assert [s.kind for s in r.steps] == KINDS
    assert "user site off" in r.step("Check that the venv ignores the user site").output
    assert "gating on cpu" in r.step("gpu").output
    assert gate.outputs == {"exit-code": "0"}
    assert r.step_summary.startswith("## attn-gate check: PASS")
    assert r.step_summary.count("## attn-gate") == 1  # check wrote it once; the fallback note stayed quiet
    results = assert_artifacts_complete(r, pr_number=FORK_PR)
    assert (results / "summary.md").read_text().strip() == r.step_summary.strip()
    assert list(results.glob("findings-*.json")) and list(results.glob("sweep-*.json")) and list(results.glob("*.png"))


@pytest.mark.slow
def test_rehearsal_buggy_kernel_fails_the_job_and_still_uploads(tmp_path):
    # a wrong softmax scale, gated against the good kernel's baseline
    r = rehearse(
        tmp_path,
        {
            "ATTN_GATE_KERNEL": "tests.buggy_kernels:scale_one_over_d",
            "ATTN_GATE_BASELINE": "baselines/cpu/sdpa-cpu-smoke.json",
            "ATTN_GATE_ONLY": CASES,
            "ATTN_GATE_DEVICE": "cpu",
        },
    )
    gate = r.step("gate")
    assert gate.returncode == 1, gate.output[-3000:]  # a verdict, not a usage error
    assert r.failed
    assert gate.outputs == {"exit-code": "1"}
    assert [s.kind for s in r.steps[-2:]] == ["uses", "uses"]  # the uploads still run (if: !cancelled())
    assert r.step_summary.startswith("## attn-gate check: FAIL")
    assert "tolerance" in r.step_summary
    assert "FAIL" in (assert_artifacts_complete(r) / "summary.md").read_text().splitlines()[0]


@pytest.mark.slow
def test_rehearsal_usage_error_still_leaves_a_summary(tmp_path):
    r = rehearse(
        tmp_path, {"ATTN_GATE_KERNEL": "no_such_module:attention", "ATTN_GATE_ONLY": CASES, "ATTN_GATE_DEVICE": "cpu"}
    )
    gate = r.step("gate")
    assert gate.returncode == 2 and "no_such_module" in gate.output
    assert r.failed
    assert r.step_summary.startswith("## attn-gate: no verdict")
    assert_artifacts_complete(r)


@pytest.mark.slow
def test_rehearsal_without_a_gpu_fails_closed(tmp_path):
    # no variables at all (the defaults): device cuda; a runner whose torch sees no GPU must not gate on CPU
    r = rehearse(tmp_path, {})
    guard = r.step("gpu")
    assert guard.returncode == 1 and "::error::" in guard.output and "sees no CUDA GPU" in guard.output
    assert r.step("gate").kind == "skipped"
    assert r.step_summary.startswith("## attn-gate: no verdict")
    assert_artifacts_complete(r)


def test_rehearsal_on_a_reused_runner_never_starts_the_job(tmp_path):
    r = rehearse(
        tmp_path,
        {"ATTN_GATE_KERNEL": "sdpa-cpu", "ATTN_GATE_ONLY": CASES, "ATTN_GATE_DEVICE": "cpu"},
        canary="repo=o/r run=54 job=gate\n",
    )
    assert r.failed and "this host already ran a job (repo=o/r run=54 job=gate)" in r.hook
    # gate.yml's !cancelled() steps (the summary note, the uploads) would run after a failed hook
    assert r.job_ended and r.listener_stopped
    assert all(s.kind == "never ran" for s in r.steps)  # no step, so no project code, ran


HOSTILE_JOB = {  # a fork's edited ci.yml asking for the PR pool, as "Approve and run" starts it
    "runs-on": {"group": "attn-gate-gpu", "labels": ["self-hosted", "linux", "gpu", "h200"]},
    "steps": [
        {"uses": "./.github/actions/evil"},  # its pre: step runs before any step (pre-if: always())
        {"name": "always", "if": "${{ always() }}", "run": 'touch "$MARKS/always"'},
        {"name": "not cancelled", "if": "${{ !cancelled() }}", "run": 'touch "$MARKS/not-cancelled"'},
        {"name": "failure", "if": "${{ failure() }}", "run": 'touch "$MARKS/failure"'},
        {"name": "plain", "run": 'touch "$MARKS/plain"'},
    ],
}


def hostile_checkout(tmp_path: Path) -> Path:
    work = tmp_path / "fork"
    action = work / ".github" / "actions" / "evil"
    action.mkdir(parents=True)
    (action / "action.yml").write_text("name: evil\nruns:\n  using: node24\n  pre: pre.js\n  main: main.js\n")
    for part in ("pre", "main"):
        (action / f"{part}.js").write_text(
            f"require('fs').writeFileSync(require('path').join(process.env.MARKS, '{part}'), 'ran')\n"
        )
    return work


@pytest.mark.parametrize("why", ["pull_request", "reused host"])
def test_a_refused_jobs_always_and_pre_steps_never_run(tmp_path, why):
    """The runner runs a failed hook's job on: every pre: step, then each step whose condition
    holds after a failure. The guard's refusal ends the job, so none of them runs on the host."""
    require("node", "apt install nodejs")
    marks = tmp_path / "marks"
    marks.mkdir()
    (tmp_path / "run").mkdir()
    work = hostile_checkout(tmp_path)
    if why == "pull_request":
        r = rehearse(
            tmp_path / "run",
            {},
            cwd=work,
            job=HOSTILE_JOB,
            event="pull_request",
            workflow="ci.yml",
            ref="refs/pull/7/merge",
            payload=guard.FORK_PULL_REQUEST,
            extra_env={"MARKS": str(marks)},
        )
        assert "refused: event pull_request" in r.hook
    else:
        r = rehearse(
            tmp_path / "run",
            {},
            cwd=work,
            job=HOSTILE_JOB,
            canary="repo=o/r run=54 job=gate\n",
            extra_env={"MARKS": str(marks)},
        )
        assert "this host already ran a job" in r.hook
    assert sorted(p.name for p in marks.iterdir()) == []  # not pre, not always, not !cancelled, not failure
    assert r.job_ended and r.listener_stopped and r.failed


def test_the_fake_runner_runs_a_failed_hooks_steps_as_the_real_one(tmp_path):
    """The model is the real runner's: after a hook that only exits 1 (a failed job whose worker
    lives on), the worker runs the local action's pre: step and the always()/!cancelled()/
    failure() steps, not the plain one. (The guard before it ended the job ran all four here.)"""
    require("node", "apt install nodejs")
    marks = tmp_path / "marks"
    marks.mkdir()
    work = hostile_checkout(tmp_path)
    base = {**os.environ, "MARKS": str(marks)}
    steps = run_pre_steps(HOSTILE_JOB, work, base, True, tmp_path)
    assert [s.name for s in steps] == ["pre ./.github/actions/evil"] and (marks / "pre").exists()
    ran = [s["name"] for s in HOSTILE_JOB["steps"][1:] if should_run(s.get("if"), True, {}, "x")]
    assert ran == ["always", "not cancelled", "failure"]


def test_rehearsal_of_a_commit_other_than_the_vetted_one_stops_before_setup(tmp_path):
    r = rehearse(
        tmp_path, {"ATTN_GATE_KERNEL": "sdpa-cpu", "ATTN_GATE_ONLY": CASES, "ATTN_GATE_DEVICE": "cpu"}, sha="f" * 40
    )
    commit = r.step("commit")
    assert commit.returncode == 1 and f"not the vetted {'f' * 40}" in commit.output
    assert r.step("gate").kind == "skipped" and r.failed


def test_rehearsal_refuses_bad_inputs(tmp_path):
    r = rehearse(tmp_path, {"ATTN_GATE_DEVICE": "cpu"}, pr="7; id")
    assert r.failed and "dispatch input pr" in r.hook  # the guard refuses before the job's own check


@pytest.mark.parametrize(
    "text,expected",
    [
        ("a=1\nb=two words\n", {"a": "1", "b": "two words"}),
        ("body<<EOF\nline 1\nx=y\nEOF\nc=3\n", {"body": "line 1\nx=y", "c": "3"}),
    ],
)
def test_output_file_parsing(text, expected):
    assert parse_outputs(text) == expected


def test_unknown_expression_is_an_error():
    with pytest.raises(AssertionError, match="github.event.pull_request.title"):
        fill("${{ github.event.pull_request.title }}", {}, "step x")


# ---- the two jobs that write, rehearsed against a local bare repository as "GitHub" ------------


def job_step(workflow: str, job: str, name: str) -> dict:
    doc = yaml.safe_load((ROOT / ".github" / "workflows" / workflow).read_text())
    return next(s for s in doc["jobs"][job]["steps"] if s.get("name") == name)


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def run_script(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ["PATH"], "HOME": str(cwd.parent), "GIT_CONFIG_NOSYSTEM": "1", "GH_TOKEN": "not-a-token"}
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
        cwd=cwd,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def github(tmp_path):
    """A bare repository standing in for github.com/<owner>/repo: "$GITHUB_SERVER_URL/$GITHUB_REPOSITORY.git"."""
    seed = tmp_path / "seed"
    seed.mkdir()
    git("init", "-q", "-b", "main", cwd=seed)
    (seed / "baselines" / "cpu").mkdir(parents=True)
    (seed / "baselines" / "cpu" / "k-smoke.json").write_text('{"ratio": 0.5}\n')
    git("add", ".", cwd=seed)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "seed", cwd=seed)
    git("clone", "-q", "--bare", str(seed), str(tmp_path / "repo.git"), cwd=tmp_path)
    return {"GITHUB_SERVER_URL": f"file://{tmp_path}", "GITHUB_REPOSITORY": "repo", "bare": tmp_path / "repo.git"}


def history_run(tmp_path: Path, github: dict, files: dict[str, str], sha: str):
    work = tmp_path / f"work-{sha}"
    results = work / "temp" / "asv-results"
    for name, text in files.items():
        (results / name).parent.mkdir(parents=True, exist_ok=True)
        (results / name).write_text(text)
    script = job_step("publish.yml", "history", "Commit them to the branch asv-results")["run"]
    env = {k: v for k, v in github.items() if k != "bare"}
    return run_script(
        script, work, {**env, "RUNNER_TEMP": str(work / "temp"), "GITHUB_SHA": sha, "GITHUB_EVENT_NAME": "push"}
    )


def test_publish_history_starts_and_extends_the_results_branch(tmp_path, github):
    first = {"benchmarks.json": "{}", "h200/machine.json": "{}", "h200/aaa-existing.json": '{"v": 1}'}
    r = history_run(tmp_path, github, first, "aaa")
    assert r.returncode == 0, r.stdout + r.stderr
    second = {**first, "h200/bbb-existing.json": '{"v": 2}'}  # the bench job restored the history, added one
    r = history_run(tmp_path, github, second, "bbb")
    assert r.returncode == 0, r.stdout + r.stderr
    bare = github["bare"]
    assert git("log", "--format=%s", "asv-results", cwd=bare).splitlines() == [
        "asv results for bbb (push)",
        "asv results for aaa (push)",
    ]
    assert sorted(git("ls-tree", "-r", "--name-only", "asv-results", cwd=bare).split()) == [
        "results/benchmarks.json",
        "results/h200/aaa-existing.json",
        "results/h200/bbb-existing.json",
        "results/h200/machine.json",
    ]
    assert git("rev-parse", "main", cwd=bare) != git("rev-parse", "asv-results", cwd=bare)  # main untouched
    r = history_run(tmp_path, github, second, "ccc")  # nothing new: no empty commit
    assert r.returncode == 0 and "nothing new for asv-results" in r.stdout
    assert len(git("log", "--format=%s", "asv-results", cwd=bare).splitlines()) == 2


@pytest.mark.parametrize("files", [{"h200/evil.sh": "rm -rf /"}, {"a/b/c.json": "{}"}])
def test_publish_history_refuses_what_is_not_an_asv_result(tmp_path, github, files):
    r = history_run(tmp_path, github, files, "ddd")
    assert r.returncode == 1 and "::error::" in r.stdout
    assert "asv-results" not in git("branch", "--list", cwd=github["bare"])


def test_publish_history_refuses_a_symlink(tmp_path, github):
    work = tmp_path / "work-link" / "temp" / "asv-results" / "h200"
    work.mkdir(parents=True)
    (work / "x.json").symlink_to("/etc/passwd")
    script = job_step("publish.yml", "history", "Commit them to the branch asv-results")["run"]
    r = run_script(
        script,
        tmp_path / "work-link",
        {
            "GITHUB_SERVER_URL": github["GITHUB_SERVER_URL"],
            "GITHUB_REPOSITORY": "repo",
            "RUNNER_TEMP": str(tmp_path / "work-link" / "temp"),
            "GITHUB_SHA": "eee",
            "GITHUB_EVENT_NAME": "push",
        },
    )
    assert r.returncode == 1 and "not a plain file" in r.stdout


def baseline_branch_run(tmp_path: Path, github: dict, files: dict[str, str]):
    """The branch job's script in a clone of "GitHub"; a fake `gh` records any call (there must be none)."""
    work = tmp_path / "checkout"
    git("clone", "-q", str(github["bare"]), str(work), cwd=tmp_path)
    temp = tmp_path / "temp"
    for name, text in {"summary.md": "## Baseline diff\n\nk: dk ratio 0.50 -> 0.40\n", **files}.items():
        (temp / "baseline-update" / name).parent.mkdir(parents=True, exist_ok=True)
        (temp / "baseline-update" / name).write_text(text)
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "gh").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$GH_ARGS"\n')
    (fake_bin / "gh").chmod(0o755)
    summary, output = tmp_path / "step-summary.md", tmp_path / "output"
    output.touch()
    script = job_step("baselines.yml", "branch", "Commit it on a branch and link the PR to open")["run"]
    env = {k: v for k, v in github.items() if k != "bare"}
    r = run_script(
        script,
        work,
        {
            **env,
            "PATH": f"{fake_bin}:{os.environ['PATH']}",
            "GH_ARGS": str(tmp_path / "gh-args"),
            "RUNNER_TEMP": str(temp),
            "GITHUB_RUN_ID": "42",
            "GITHUB_REF_NAME": "main",
            "GITHUB_STEP_SUMMARY": str(summary),
            "GITHUB_OUTPUT": str(output),
            "SUITE": "smoke",
            "KERNEL": "k",
        },
    )
    assert not (tmp_path / "gh-args").exists(), "the branch job must not call gh (no PR with GITHUB_TOKEN)"
    return r, summary.read_text() if summary.exists() else "", parse_outputs(output.read_text()), temp


def test_baseline_branch_is_pushed_with_a_compare_link_and_no_pr(tmp_path, github):
    r, summary, outputs, temp = baseline_branch_run(
        tmp_path, github, {"baselines/cpu/k-smoke.json": '{"ratio": 0.4}\n'}
    )
    assert r.returncode == 0, r.stdout + r.stderr
    bare = github["bare"]
    branch = "attn-gate/baseline-update-42"
    assert git("show", f"{branch}:baselines/cpu/k-smoke.json", cwd=bare) == '{"ratio": 0.4}\n'
    assert git("log", "-1", "--format=%s", branch, cwd=bare).strip() == "Baseline update: suite smoke, kernel k"
    assert f"{github['GITHUB_SERVER_URL']}/repo/compare/main...{branch}?expand=1" in summary
    assert "0.50 -> 0.40" in summary  # the diff summary, to paste as the PR body
    assert outputs == {"branch": branch, "title": "Baseline update: suite smoke, kernel k"}  # for the optional App step
    assert (temp / "pr-body.md").read_text().startswith("## Baseline diff")


def test_baseline_branch_skips_an_unchanged_baseline(tmp_path, github):
    r, summary, outputs, _ = baseline_branch_run(tmp_path, github, {"baselines/cpu/k-smoke.json": '{"ratio": 0.5}\n'})
    assert r.returncode == 0 and "did not change" in summary and outputs == {}
    assert "baseline-update" not in git("branch", "--list", cwd=github["bare"])


def test_baseline_branch_refuses_files_that_are_not_baselines(tmp_path, github):
    r, _, _, _ = baseline_branch_run(tmp_path, github, {"baselines/cpu/k-smoke.json": "{}", "baselines/hook.sh": "id"})
    assert r.returncode == 1 and "not baselines" in r.stdout


@pytest.mark.slow
def test_publish_history_retries_a_push_rejected_by_a_concurrent_run(tmp_path, github):
    """Another run pushes to asv-results between this run's fetch and its push: the push is
    rejected (non-fast-forward), the script refetches, re-applies its files and pushes again;
    both runs' results end up on the branch."""
    assert history_run(tmp_path, github, {"h200/aaa-x.json": "{}"}, "aaa").returncode == 0
    rival = tmp_path / "rival"
    git("clone", "-q", "-b", "asv-results", str(github["bare"]), str(rival), cwd=tmp_path)
    (rival / "results" / "h200" / "zzz-x.json").write_text('{"rival": 1}')
    git("add", ".", cwd=rival)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "rival", cwd=rival)
    real_git = subprocess.run(["which", "git"], capture_output=True, text=True).stdout.strip()
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    # the first push of the script lets the rival push first
    (fake_bin / "git").write_text(f"""#!/bin/sh
case " $* " in *" push "*)
  if [ ! -e "{tmp_path}/raced" ]; then touch "{tmp_path}/raced"; "{real_git}" -C "{rival}" push -q origin asv-results; fi;;
esac
exec "{real_git}" "$@"
""")
    (fake_bin / "git").chmod(0o755)
    work = tmp_path / "work-bbb"
    (work / "temp" / "asv-results" / "h200").mkdir(parents=True)
    (work / "temp" / "asv-results" / "h200" / "bbb-x.json").write_text('{"v": 2}')
    script = job_step("publish.yml", "history", "Commit them to the branch asv-results")["run"]
    r = run_script(
        script,
        work,
        {
            "GITHUB_SERVER_URL": github["GITHUB_SERVER_URL"],
            "GITHUB_REPOSITORY": "repo",
            "RUNNER_TEMP": str(work / "temp"),
            "GITHUB_SHA": "bbb",
            "GITHUB_EVENT_NAME": "push",
            "PATH": f"{fake_bin}:{os.environ['PATH']}",
        },
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rejected (attempt 1 of 5)" in r.stdout and "pushed to asv-results (attempt 2)" in r.stdout
    bare = github["bare"]
    assert sorted(git("ls-tree", "-r", "--name-only", "asv-results", cwd=bare).split()) == [
        "results/h200/aaa-x.json",
        "results/h200/bbb-x.json",
        "results/h200/zzz-x.json",
    ]
    assert git("log", "--format=%s", "asv-results", cwd=bare).splitlines() == [
        "asv results for bbb (push)",
        "rival",
        "asv results for aaa (push)",
    ]


def selftest_history_run(tmp_path: Path, github: dict, files: dict[str, str], sha: str):
    work = tmp_path / f"selftest-{sha}"
    for name, text in files.items():
        (work / "temp" / "selftest" / name).parent.mkdir(parents=True, exist_ok=True)
        (work / "temp" / "selftest" / name).write_text(text)
    script = job_step("selftest.yml", "history", "Commit it to the branch asv-results")["run"]
    return run_script(
        script,
        work,
        {
            "GITHUB_SERVER_URL": github["GITHUB_SERVER_URL"],
            "GITHUB_REPOSITORY": "repo",
            "RUNNER_TEMP": str(work / "temp"),
            "GITHUB_SHA": sha * 4,
            "GITHUB_EVENT_NAME": "schedule",
        },
    )


def test_selftest_report_is_kept_beside_the_asv_history(tmp_path, github):
    assert history_run(tmp_path, github, {"h200/aaa-x.json": "{}"}, "aaa").returncode == 0
    r = selftest_history_run(tmp_path, github, {"selftest.md": "# kill matrix 1\n", "selftest.json": "{}"}, "abc")
    assert r.returncode == 0, r.stdout + r.stderr
    r = selftest_history_run(tmp_path, github, {"selftest.md": "# kill matrix 2\n", "selftest.json": "{}"}, "def")
    assert r.returncode == 0, r.stdout + r.stderr
    files = git("ls-tree", "-r", "--name-only", "asv-results", cwd=github["bare"]).split()
    assert "results/h200/aaa-x.json" in files  # the asv history is untouched
    assert (
        len([f for f in files if re.fullmatch(r"selftest/\d{4}-\d\d-\d\d-(abcabcabcabc|defdefdefdef)/selftest\.md", f)])
        == 2
    )
    assert git("show", "asv-results:selftest/latest/selftest.md", cwd=github["bare"]) == "# kill matrix 2\n"


@pytest.mark.parametrize("files", [{"selftest.md": "x", "run.sh": "id"}, {"selftest.json": "{}"}])
def test_selftest_history_refuses_what_is_not_a_report(tmp_path, github, files):
    r = selftest_history_run(tmp_path, github, files, "abc")
    assert r.returncode == 1 and "::error::" in r.stdout
    assert "asv-results" not in git("branch", "--list", cwd=github["bare"])


# ---- a fork PR from its first event to the report ---------------------------------------------


def workflows_started_by(event: str) -> dict[str, dict]:
    found = {}
    for path in wf.WORKFLOW_FILES:
        doc = wf.load(path)
        if event in wf.triggers(doc):
            found[path.name] = doc
    return found


@pytest.mark.slow
@pytest.mark.xdist_group("rehearsal_passing")
def test_fork_pr_end_to_end(tmp_path, passing):
    """mallory/r opens PR 7 against o/r. (1) Its pull_request event, in which every repository
    variable reads empty, starts only hosted jobs that read no variable, and the runner guard
    refuses it anyway. (2) Mallory's own `/attn-gate run` comment and a maintainer's comment naming
    a stale SHA vet nothing. (3) A maintainer's comment naming the head dispatches main's gate.yml
    with pr=7 and the sha; the guard admits it and this rehearsal runs it on the CPU; (4) report.yml
    accepts that run by its title and posts its summary on PR 7."""
    head = HEAD_SHA  # the PR head is this working tree's commit, which the rehearsal checks out
    pr = {**wf.FORK_PR, "head": {"sha": head, "repo": {"full_name": "mallory/r"}}}
    # (1) the fork's own event: vars empty, head repository another
    started = workflows_started_by("pull_request")
    assert set(started) == {"ci.yml"}
    for name, doc in started.items():
        for job in doc["jobs"].values():
            assert job["runs-on"] == "ubuntu-latest"
            assert fill(json.dumps(job), {}, name) == json.dumps(job)  # nothing that reads vars (or anything) to fill
    refused = guard.guard.decide(
        guard.GPU, guard.env_for("pull_request", "ci.yml", "refs/pull/7/merge"), guard.FORK_PULL_REQUEST
    )
    assert not refused.allowed  # had mallory's ci.yml asked for the GPU group
    # (2) vetting refused
    perms = {
        "mallory": {"permission": "read", "role_name": "read"},
        "maint": {"permission": "admin", "role_name": "admin"},
    }
    for login, sha in (("mallory", head), ("maint", wf.OTHER)):
        calls = wf.vet(
            wf.subdir(tmp_path, f"vet-{login}"), f"/attn-gate run {sha}", login=login, permissions=perms, pr=pr
        )
        assert wf.named(calls, *wf.VET_WRITES) == []
    # (3) vetted: main's gate runs with the inputs vet.yml passed
    calls = wf.vet(wf.subdir(tmp_path, "vet-ok"), f"/attn-gate run {head}", login="maint", permissions=perms, pr=pr)
    [(_, dispatch)] = wf.named(calls, "actions.createWorkflowDispatch")
    assert dispatch["ref"] == "main"
    # the dispatch asks for the passing run: PR 7 at the head, the gate job on the CPU
    assert (dispatch["inputs"]["pr"], dispatch["inputs"]["sha"]) == (FORK_PR, head)
    r = passing
    assert not r.failed, r.hook + r.step("gate").output[-2000:]
    assert_artifacts_complete(r, pr_number="7", sha=head)
    summary_dir = r.runner_temp / "gate-summary"
    # (4) the report: the run as GitHub describes it to report.yml (the title is gate.yml's run-name)
    run = wf.gate_run(
        display_title=f"attn-gate PR #{dispatch['inputs']['pr']} at {dispatch['inputs']['sha']}", conclusion="success"
    )
    out = wf.report_check(wf.subdir(tmp_path, "report-check"), run, prs={"7": pr})
    assert out["ok"] == "true" and out["pr"] == "7" and out["sha"] == head
    post = wf.run_node(
        wf.subdir(tmp_path, "report-post"),
        wf.script_of("report.yml", "report", 2),
        {
            "payload": {"workflow_run": run, "repository": wf.REPORT_PAYLOAD_REPO},
            "prs": {"7": pr},
            "lists": {"pulls.listFiles": [{"filename": "gate/kernels/x.py"}]},
        },
        env={"RESULTS_DIR": str(summary_dir), "PR_NUMBER": out["pr"], "GATED_SHA": out["sha"]},
    )
    status = wf.named(post, "repos.createCommitStatus")[0][1]
    assert status["state"] == "success" and status["sha"] == head
    body = wf.comment_body(post)
    assert "**attn-gate passed**" in body and "## attn-gate check: PASS" in body and "`gate/`" in body


# ---- the asv step with real asv: this commit against the stored history ------------------------


@pytest.mark.slow
def test_rehearsal_asv_compares_the_head_with_stored_history(tmp_path):
    """The gate job with its asv step (real asv, one CPU perf case), twice, in a clone of this
    branch with one more commit (the PR head): on the parent commit before any history exists (a
    note, not a failure), then, with the parent's results stored as publish.yml leaves them on
    asv-results, on the head commit: `asv compare` parent -> head."""
    work = tmp_path / "checkout"
    git("clone", "-q", str(ROOT), str(work), cwd=tmp_path)  # CI's own checkout may be shallow: one commit is enough
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "the PR head", cwd=work)
    head, base = git("rev-parse", "HEAD", cwd=work).strip(), git("rev-parse", "HEAD^", cwd=work).strip()
    variables = {"ATTN_GATE_KERNEL": "sdpa-cpu", "ATTN_GATE_ONLY": PERF_CASE, "ATTN_GATE_DEVICE": "cpu"}
    fast = {"ATTN_GATE_ROUNDS": "3"}

    git("checkout", "-q", "--detach", base, cwd=work)
    first = rehearse(
        wf.subdir(tmp_path, "first"), variables, cwd=work, skip={"setup", "gate"}, sha=base, extra_env=fast
    )
    assert first.step("asv").returncode == 0, first.step("asv").output[-3000:]
    note = (first.runner_temp / "gate-summary" / "asv-compare.md").read_text()
    assert note.startswith("### asv history (not the verdict)")
    assert f"No stored asv results for an ancestor of {base[:12]} on machine cpu" in note
    stored = first.runner_temp / "gate-results" / "asv-results"  # the parent's results, filed under its SHA
    assert list((stored / "cpu").glob(f"{base[:8]}-*.json"))

    git("checkout", "-q", "-", cwd=work)
    stored.rename(work / ".asv-history")  # what the history checkout of asv-results brings ...
    (work / ".asv-history").rename(work / "results")
    (work / ".asv-history").mkdir()
    (work / "results").rename(work / ".asv-history" / "results")  # ... as .asv-history/results/<machine>/
    (work / ".asv").rename(tmp_path / "first-run-asv")  # a fresh runner: nothing else of the first run
    second = rehearse(
        wf.subdir(tmp_path, "second"), variables, cwd=work, skip={"setup", "gate"}, sha=head, extra_env=fast
    )
    asv = second.step("asv")
    assert asv.returncode == 0, asv.output[-3000:]
    note = (second.runner_temp / "gate-summary" / "asv-compare.md").read_text()
    assert (
        f"asv compare {base[:12]} (newest ancestor with stored results) -> {head[:12]} (this commit), machine cpu"
        in note
    )
    assert f"Before [{base[:8]}]" in note and f"After [{head[:8]}]" in note  # asv's own table
    # kernel and anchor are part of a benchmark's identity (one history line per pair)
    assert re.search(r"track_fwd_speed_ratio\('sdpa-cpu', 'sdpa-math', 'bf16-b2-h4-s256-d64'\)", note)
    assert note in second.step_summary
    assert list((second.runner_temp / "gate-results" / "asv-results" / "cpu").glob(f"{head[:8]}-*.json"))
    assert second.step("gate").kind == "skipped" and second.failed is False


# ---- bisect.yml: the dispatched bisect on the trusted group, in a synthetic kernel repository ---


@pytest.mark.slow
def test_rehearsal_bisect_names_the_first_bad_commit(tmp_path):
    from gate.core.cases import exact_regex
    from tests import test_bisect as tb

    # three commits, the second plants dK x1.02; the repository's locked install step is a compile check
    repo, commits = tb.make_repo(
        tmp_path, {2: tb.plant}, commits=3, files={"scripts/setup.sh": "python3 -m py_compile tinyk/__init__.py\n"}
    )
    r = rehearse(
        tmp_path,
        {"ATTN_GATE_DEVICE": "cpu"},
        cwd=repo,
        workflow="bisect.yml",
        job_id="bisect",
        inputs={"good": commits[0], "bad": "", "only": exact_regex(tb.CASES)},
        group="attn-gate-trusted",
    )
    step = r.step("bisect")
    assert step.returncode == 0 and not r.failed, step.output[-3000:]
    assert f"FIRST BAD COMMIT: {commits[1]} commit 2" in step.output
    assert "## attn-gate bisect" in r.step_summary and commits[1] in r.step_summary
    assert (r.runner_temp / "bisect" / "bisect-tinyk_flash_attn_func-mini.json").is_file()
    assert [s.kind for s in r.steps][-1] == "uses"  # the record is uploaded


def test_rehearsal_bisect_refuses_an_input_with_a_shell_in_it(tmp_path):
    r = rehearse(
        tmp_path,
        {"ATTN_GATE_DEVICE": "cpu"},
        workflow="bisect.yml",
        job_id="bisect",
        inputs={"good": "v1", "bad": "", "only": "x'; id; '"},
        group="attn-gate-trusted",
    )
    assert r.failed and "dispatch input only" in r.hook and r.job_ended
    assert all(s.kind == "never ran" for s in r.steps)


def test_bisect_validation_step_refuses_what_the_guard_would(tmp_path):
    """The job's own check of the inputs (defence in depth behind the guard), run for real."""
    step = next(
        s
        for s in yaml.safe_load((ROOT / ".github" / "workflows" / "bisect.yml").read_text())["jobs"]["bisect"]["steps"]
        if s.get("id") == "validate"
    )
    for good, bad, only, ok in (
        ("v1.2", "", "^(?:bf16-b2-h8/2-s127-d80|fp16-b2-h8-s97-d64-causal)$", True),
        ("3f2a1c0", "main~3", "bf16-.*causal", True),
        ("--exec=id", "", "x", False),
        ("v1", "a b", "x", False),
        ("v1", "", "x; id", False),
        ("v1", "", "-k", False),
        ("v1", "", "", False),
    ):
        proc = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
            capture_output=True,
            text=True,
            env={"PATH": os.environ["PATH"], "GOOD": good, "BAD": bad, "ONLY": only},
        )
        assert (proc.returncode == 0) == ok, (good, bad, only, proc.stdout)
