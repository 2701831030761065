"""A rehearsal of the PR gate: gate.yml's `gate` job, its `run:` steps in order, on this CPU.

The steps run as the runner runs them (`bash --noprofile --norc -eo pipefail`, from the repository
root) with GITHUB_STEP_SUMMARY, GITHUB_OUTPUT, GITHUB_ENV and RUNNER_TEMP pointing at temporary
files, the job's and step's `env:` with their expressions filled in from a table of known values
(an expression the table does not know fails the test: the rehearsal must learn it), and GitHub's
rule for which steps run after a failure. `uses:` steps are GitHub's own actions and are skipped;
so is the set-up step (scripts/setup.sh, which .ci/run has just run). On a CPU `attn-gate check`
takes the config's cpu profile (sdpa-cpu, suite smoke, baselines/cpu/); the repository variables
the workflow reads select the kernel and a few cases, so a buggy kernel can be swapped in.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
GATE = ROOT / ".github" / "workflows" / "gate.yml"
EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
CASES = "^fp32-b2-h2-s65x33-d40"  # two small fp32 cases of the smoke suite (causal and not): seconds
SKIPPED_RUN_STEPS = {"setup"}  # step ids not run here; their reason is in the module docstring
RUNS_AFTER_FAILURE = {"${{ !cancelled() }}", "${{ always() }}", "always()", "!cancelled()"}
PR_NUMBER, HEAD_SHA = "123", "0123456789abcdef0123456789abcdef01234567"


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


def rehearse(tmp_path: Path, variables: dict[str, str]) -> Rehearsal:
    """Run the gate job's steps; `variables` are the repository variables (vars.*) it reads."""
    temp = tmp_path / "runner-temp"
    temp.mkdir()
    summary, github_env = tmp_path / "step-summary.md", tmp_path / "github-env"
    summary.touch()
    github_env.touch()
    known = {
        "github.event.pull_request.number": PR_NUMBER,
        "github.event.pull_request.head.sha || github.sha": HEAD_SHA,
        "runner.temp": str(temp),
        "runner.os": "Linux",
        "!cancelled()": "true",
        **{f"vars.{k}": v for k, v in variables.items()},
    }
    job = gate_job()
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "RUNNER_", "ATTN_GATE_"))}
    base_env.update({k: fill(v, known, "job env") for k, v in job.get("env", {}).items()})
    base_env.update({"RUNNER_TEMP": str(temp), "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_ENV": str(github_env),
                     "CI": "true", "GITHUB_ACTIONS": "true"})
    steps, failed, rendered = [], False, {}
    for i, step in enumerate(job["steps"]):
        name = step.get("id") or step.get("name") or step.get("uses")
        condition = step.get("if")
        if condition is not None:
            assert condition in RUNS_AFTER_FAILURE, f"step {name}: condition {condition!r} is not modelled here"
        if failed and condition is None:
            steps.append(StepRun(name, "skipped"))
            continue
        if "uses" in step:
            rendered[name] = {k: fill(v, known, f"step {name}") for k, v in step.get("with", {}).items()
                              if "steps." not in str(v) and "hashFiles" not in str(v)}
            steps.append(StepRun(name, "uses"))
            continue
        if step.get("id") in SKIPPED_RUN_STEPS:
            steps.append(StepRun(name, "skipped"))
            continue
        assert "${{" not in step["run"], f"step {name}: an expression inside run:"
        output_file = tmp_path / f"output-{i}"
        output_file.touch()
        env = dict(base_env)
        env.update(dict(line.split("=", 1) for line in github_env.read_text().splitlines() if "=" in line))
        env.update({k: fill(v, known, f"step {name} env") for k, v in step.get("env", {}).items()})
        env["GITHUB_OUTPUT"] = str(output_file)
        script = tmp_path / f"step-{i}.sh"
        script.write_text(step["run"])
        proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
        steps.append(StepRun(name, "run", proc.returncode, proc.stdout + proc.stderr,
                             parse_outputs(output_file.read_text())))
        failed = failed or proc.returncode != 0
    return Rehearsal(steps, failed, summary.read_text(), temp, rendered)


def assert_artifact_complete(r: Rehearsal) -> Path:
    """What report.yml reads is where the upload step picks it up."""
    upload = r.rendered["Upload results, findings and plots"]
    results = Path(upload["path"])
    assert results == r.runner_temp / "gate-results"
    assert (results / "pr-number").read_text().strip() == PR_NUMBER
    assert (results / "head-sha").read_text().strip() == HEAD_SHA
    assert (results / "summary.md").read_text().strip()
    return results


def test_rehearsal_passing_kernel(tmp_path):
    r = rehearse(tmp_path, {"ATTN_GATE_KERNEL": "sdpa-cpu", "ATTN_GATE_ONLY": CASES, "ATTN_GATE_DEVICE": "cpu"})
    gate = r.step("gate")
    assert gate.returncode == 0, gate.output[-3000:]
    assert not r.failed
    assert [s.kind for s in r.steps] == ["uses", "run", "run", "uses", "skipped", "run", "run", "run", "uses"]
    assert "gating on cpu" in r.step("Check that torch sees the GPU").output
    assert gate.outputs == {"exit-code": "0"}
    assert r.step_summary.startswith("## attn-gate check: PASS")
    assert r.step_summary.count("## attn-gate") == 1  # check wrote it once; the fallback note stayed quiet
    results = assert_artifact_complete(r)
    assert (results / "summary.md").read_text().strip() == r.step_summary.strip()
    assert list(results.glob("findings-*.json")) and list(results.glob("sweep-*.json")) and list(results.glob("*.png"))


def test_rehearsal_buggy_kernel_fails_the_job_and_still_uploads(tmp_path):
    # a wrong softmax scale, gated against the good kernel's baseline
    r = rehearse(tmp_path, {"ATTN_GATE_KERNEL": "tests.buggy_kernels:scale_one_over_d",
                            "ATTN_GATE_BASELINE": "baselines/cpu/sdpa-cpu-smoke.json", "ATTN_GATE_ONLY": CASES,
                            "ATTN_GATE_DEVICE": "cpu"})
    gate = r.step("gate")
    assert gate.returncode == 1, gate.output[-3000:]  # a verdict, not a usage error
    assert r.failed
    assert gate.outputs == {"exit-code": "1"}
    assert r.steps[-1].kind == "uses"  # the upload still runs (if: !cancelled())
    assert r.step_summary.startswith("## attn-gate check: FAIL")
    assert "tolerance" in r.step_summary
    assert "FAIL" in (assert_artifact_complete(r) / "summary.md").read_text().splitlines()[0]


def test_rehearsal_usage_error_still_leaves_a_summary(tmp_path):
    r = rehearse(tmp_path, {"ATTN_GATE_KERNEL": "no_such_module:attention", "ATTN_GATE_ONLY": CASES,
                            "ATTN_GATE_DEVICE": "cpu"})
    gate = r.step("gate")
    assert gate.returncode == 2 and "no_such_module" in gate.output
    assert r.failed
    assert r.step_summary.startswith("## attn-gate: no verdict")
    assert_artifact_complete(r)


def test_rehearsal_without_a_gpu_fails_closed(tmp_path):
    # the workflow's default device is cuda: a runner whose torch sees no GPU must not gate on CPU
    r = rehearse(tmp_path, {})
    guard = r.step("Check that torch sees the GPU")
    assert guard.returncode == 1 and "::error::" in guard.output and "sees no CUDA GPU" in guard.output
    assert r.step("gate").kind == "skipped"
    assert r.step_summary.startswith("## attn-gate: no verdict")
    assert_artifact_complete(r)


@pytest.mark.parametrize("text,expected", [
    ("a=1\nb=two words\n", {"a": "1", "b": "two words"}),
    ("body<<EOF\nline 1\nx=y\nEOF\nc=3\n", {"body": "line 1\nx=y", "c": "3"}),
])
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
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=cwd,
                          env={**base, **env}, capture_output=True, text=True, timeout=60)


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
    return run_script(script, work, {**env, "RUNNER_TEMP": str(work / "temp"), "GITHUB_SHA": sha,
                                     "GITHUB_EVENT_NAME": "push"})


def test_publish_history_starts_and_extends_the_results_branch(tmp_path, github):
    first = {"benchmarks.json": "{}", "h200/machine.json": "{}", "h200/aaa-existing.json": '{"v": 1}'}
    r = history_run(tmp_path, github, first, "aaa")
    assert r.returncode == 0, r.stdout + r.stderr
    second = {**first, "h200/bbb-existing.json": '{"v": 2}'}  # the bench job restored the history, added one
    r = history_run(tmp_path, github, second, "bbb")
    assert r.returncode == 0, r.stdout + r.stderr
    bare = github["bare"]
    assert git("log", "--format=%s", "asv-results", cwd=bare).splitlines() == [
        "asv results for bbb (push)", "asv results for aaa (push)"]
    assert sorted(git("ls-tree", "-r", "--name-only", "asv-results", cwd=bare).split()) == [
        "results/benchmarks.json", "results/h200/aaa-existing.json", "results/h200/bbb-existing.json",
        "results/h200/machine.json"]
    assert git("rev-parse", "main", cwd=bare) != git("rev-parse", "asv-results", cwd=bare)  # main untouched
    r = history_run(tmp_path, github, second, "ccc")  # nothing new: no empty commit
    assert r.returncode == 0 and "no new results" in r.stdout
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
    r = run_script(script, tmp_path / "work-link", {"GITHUB_SERVER_URL": github["GITHUB_SERVER_URL"],
                                                    "GITHUB_REPOSITORY": "repo", "RUNNER_TEMP": str(tmp_path / "work-link" / "temp"),
                                                    "GITHUB_SHA": "eee", "GITHUB_EVENT_NAME": "push"})
    assert r.returncode == 1 and "not a plain file" in r.stdout


def baseline_pr_run(tmp_path: Path, github: dict, files: dict[str, str]):
    """The PR job's script in a clone of "GitHub", with a fake `gh` that records its arguments."""
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
    summary = tmp_path / "step-summary.md"
    script = job_step("baselines.yml", "pull-request", "Commit it on a branch and open the PR")["run"]
    env = {k: v for k, v in github.items() if k != "bare"}
    r = run_script(script, work, {**env, "PATH": f"{fake_bin}:{os.environ['PATH']}", "GH_ARGS": str(tmp_path / "gh-args"),
                                  "RUNNER_TEMP": str(temp), "GITHUB_RUN_ID": "42", "GITHUB_REF_NAME": "main",
                                  "GITHUB_STEP_SUMMARY": str(summary), "SUITE": "smoke", "KERNEL": "k"})
    gh_args = (tmp_path / "gh-args").read_text().splitlines() if (tmp_path / "gh-args").exists() else None
    return r, gh_args, summary.read_text() if summary.exists() else ""


def test_baseline_pr_pushes_a_branch_and_opens_a_pr_with_the_summary(tmp_path, github):
    r, gh_args, summary = baseline_pr_run(tmp_path, github, {"baselines/cpu/k-smoke.json": '{"ratio": 0.4}\n'})
    assert r.returncode == 0, r.stdout + r.stderr
    bare = github["bare"]
    branch = "attn-gate/baseline-update-42"
    assert git("show", f"{branch}:baselines/cpu/k-smoke.json", cwd=bare) == '{"ratio": 0.4}\n'
    assert git("log", "-1", "--format=%s", branch, cwd=bare).strip() == "Baseline update: suite smoke, kernel k"
    assert gh_args[:8] == ["pr", "create", "--base", "main", "--head", branch, "--title",
                           "Baseline update: suite smoke, kernel k"]
    body = Path(gh_args[gh_args.index("--body-file") + 1]).read_text()
    assert body.startswith("## Baseline diff") and "0.50 -> 0.40" in body
    assert "Opened the baseline PR" in summary


def test_baseline_pr_skips_an_unchanged_baseline(tmp_path, github):
    r, gh_args, summary = baseline_pr_run(tmp_path, github, {"baselines/cpu/k-smoke.json": '{"ratio": 0.5}\n'})
    assert r.returncode == 0 and gh_args is None and "did not change" in summary
    assert "baseline-update" not in git("branch", "--list", cwd=github["bare"])


def test_baseline_pr_refuses_files_that_are_not_baselines(tmp_path, github):
    r, gh_args, _ = baseline_pr_run(tmp_path, github, {"baselines/cpu/k-smoke.json": "{}", "baselines/hook.sh": "id"})
    assert r.returncode == 1 and "not baselines" in r.stdout and gh_args is None
