"""The runner guard (gate/workflow/templates/runner/job_started.py), which the self-hosted runner
runs before every job: recorded event payloads, as GitHub writes them to GITHUB_EVENT_PATH, are
allowed or refused per runner group whatever the workflow's YAML asks for; the persistence canary
and the job's environment are checked by running the script as the runner runs it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "gate" / "workflow" / "templates" / "runner"
GUARD = RUNNER / "job_started.py"
SHA, MAIN_SHA = "a" * 40, "c" * 40

spec = importlib.util.spec_from_file_location("job_started", GUARD)
guard = importlib.util.module_from_spec(spec)
sys.modules["job_started"] = guard  # dataclasses look their module up by name
spec.loader.exec_module(guard)


def shipped(group: str) -> dict:
    raw = json.loads((RUNNER / f"{group}.json").read_text())
    return {**raw, "repository": "o/r"}


GPU, TRUSTED = guard.parse_config(shipped("attn-gate-gpu")), guard.parse_config(shipped("attn-gate-trusted"))
REPO = {"full_name": "o/r", "fork": False}

# ---- recorded payloads (the fields GitHub sends that the guard reads, with their neighbours) ----

FORK_PULL_REQUEST = {  # mallory/r opened PR 7; "Approve and run" on her edited ci.yml
    "action": "synchronize",
    "number": 7,
    "pull_request": {
        "number": 7,
        "head": {"sha": SHA, "ref": "main", "repo": {"full_name": "mallory/r", "fork": True}},
        "base": {"ref": "main", "repo": REPO},
    },
    "repository": REPO,
    "sender": {"login": "mallory"},
}
DISPATCH_GATE = {
    "inputs": {"pr": "7", "sha": SHA},
    "ref": "refs/heads/main",
    "repository": REPO,
    "sender": {"login": "github-actions[bot]"},
    "workflow": ".github/workflows/gate.yml",
}
MERGE_GROUP = {
    "action": "checks_requested",
    "repository": REPO,
    "merge_group": {
        "head_sha": MAIN_SHA,
        "head_ref": f"refs/heads/gh-readonly-queue/main/pr-7-{SHA}",
        "base_sha": "d" * 40,
        "base_ref": "refs/heads/main",
    },
}
PUSH_MAIN = {"ref": "refs/heads/main", "before": "d" * 40, "after": MAIN_SHA, "repository": REPO}
SCHEDULE = {"schedule": "41 1 * * *", "repository": REPO}
ISSUE_COMMENT = {
    "action": "created",
    "issue": {"number": 7, "pull_request": {"url": "x"}},
    "comment": {"body": f"/attn-gate run {SHA}"},
    "repository": REPO,
}


def env_for(event: str, workflow: str, ref: str, repo: str = "o/r") -> dict:
    return {
        "GITHUB_EVENT_NAME": event,
        "GITHUB_REPOSITORY": repo,
        "GITHUB_REF": ref,
        "GITHUB_WORKFLOW_REF": f"{repo}/.github/workflows/{workflow}@{ref}",
        "GITHUB_RUN_ID": "55",
        "GITHUB_JOB": "gate",
    }


CASES = [  # (id, group, event, workflow, ref, payload, allowed, why)
    ("pull_request job", GPU, "pull_request", "ci.yml", "refs/pull/7/merge", FORK_PULL_REQUEST, False, "pull_request"),
    (
        "fork's edited ci.yml asks for the GPU group",
        GPU,
        "pull_request",
        "ci.yml",
        "refs/pull/7/merge",
        FORK_PULL_REQUEST,
        False,
        "PR's own workflow file",
    ),
    (
        "fork's edited ci.yml asks for the trusted group",
        TRUSTED,
        "pull_request",
        "ci.yml",
        "refs/pull/7/merge",
        FORK_PULL_REQUEST,
        False,
        "pull_request",
    ),
    (
        "pull_request_target",
        GPU,
        "pull_request_target",
        "gate.yml",
        "refs/heads/main",
        FORK_PULL_REQUEST,
        False,
        "pull_request_target",
    ),
    (
        "pull_request payload under another name",
        GPU,
        "workflow_dispatch",
        "gate.yml",
        "refs/heads/main",
        {**DISPATCH_GATE, "pull_request": FORK_PULL_REQUEST["pull_request"]},
        False,
        "pull_request",
    ),
    (
        "main's gate.yml dispatched with inputs",
        GPU,
        "workflow_dispatch",
        "gate.yml",
        "refs/heads/main",
        DISPATCH_GATE,
        True,
        "allowed in runner group attn-gate-gpu",
    ),
    (
        "main's gate.yml on the trusted group",
        TRUSTED,
        "workflow_dispatch",
        "gate.yml",
        "refs/heads/main",
        DISPATCH_GATE,
        False,
        "allow-list",
    ),
    (
        "a branch's gate.yml",
        GPU,
        "workflow_dispatch",
        "gate.yml",
        "refs/heads/feature",
        {**DISPATCH_GATE, "ref": "refs/heads/feature"},
        False,
        "comes from refs/heads/feature, not refs/heads/main",
    ),
    (
        "a branch's gate.yml on push",
        GPU,
        "push",
        "gate.yml",
        "refs/heads/pull-request/7",
        {**PUSH_MAIN, "ref": "refs/heads/pull-request/7"},
        False,
        "event push is not one of workflow_dispatch",
    ),
    (
        "gate.yml with a short sha",
        GPU,
        "workflow_dispatch",
        "gate.yml",
        "refs/heads/main",
        {**DISPATCH_GATE, "inputs": {"pr": "7", "sha": SHA[:12]}},
        False,
        "dispatch input sha",
    ),
    (
        "gate.yml without inputs",
        GPU,
        "workflow_dispatch",
        "gate.yml",
        "refs/heads/main",
        {**DISPATCH_GATE, "inputs": {}},
        False,
        "dispatch input pr",
    ),
    (
        "gate.yml with an extra input",
        GPU,
        "workflow_dispatch",
        "gate.yml",
        "refs/heads/main",
        {**DISPATCH_GATE, "inputs": {"pr": "7", "sha": SHA, "kernel": "x"}},
        False,
        "['kernel'] are not among",
    ),
    (
        "payload names another workflow",
        GPU,
        "workflow_dispatch",
        "gate.yml",
        "refs/heads/main",
        {**DISPATCH_GATE, "workflow": ".github/workflows/evil.yml"},
        False,
        "names another workflow",
    ),
    (
        "merge queue",
        GPU,
        "merge_group",
        "gate.yml",
        MERGE_GROUP["merge_group"]["head_ref"],
        MERGE_GROUP,
        True,
        "allowed",
    ),
    (
        "merge queue of another base",
        GPU,
        "merge_group",
        "gate.yml",
        "refs/heads/gh-readonly-queue/main/pr-7-x",
        {"merge_group": {"head_ref": "refs/heads/gh-readonly-queue/main/pr-7-x", "base_ref": "refs/heads/dev"}},
        False,
        "targets 'refs/heads/dev'",
    ),
    ("publish on push to main", TRUSTED, "push", "publish.yml", "refs/heads/main", PUSH_MAIN, True, "allowed"),
    (
        "publish from a branch",
        TRUSTED,
        "push",
        "publish.yml",
        "refs/heads/x",
        {**PUSH_MAIN, "ref": "refs/heads/x"},
        False,
        "not refs/heads/main",
    ),
    ("nightly schedule", TRUSTED, "schedule", "nightly.yml", "refs/heads/main", SCHEDULE, True, "allowed"),
    (
        "baselines dispatched from main",
        TRUSTED,
        "workflow_dispatch",
        "baselines.yml",
        "refs/heads/main",
        {**DISPATCH_GATE, "workflow": ".github/workflows/baselines.yml", "inputs": {"suite": "pr", "kernel": ""}},
        True,
        "allowed",
    ),
    (
        "baselines with a shell in an input",
        TRUSTED,
        "workflow_dispatch",
        "baselines.yml",
        "refs/heads/main",
        {**DISPATCH_GATE, "workflow": ".github/workflows/baselines.yml", "inputs": {"suite": "$(id)"}},
        False,
        "dispatch input suite",
    ),
    (
        "baselines on the PR group",
        GPU,
        "workflow_dispatch",
        "baselines.yml",
        "refs/heads/main",
        {**DISPATCH_GATE, "workflow": ".github/workflows/baselines.yml", "inputs": {}},
        False,
        "allow-list",
    ),
    (
        "bisect dispatched from main",
        TRUSTED,
        "workflow_dispatch",
        "bisect.yml",
        "refs/heads/main",
        {
            **DISPATCH_GATE,
            "workflow": ".github/workflows/bisect.yml",
            "inputs": {"good": "v1.2", "bad": "", "only": "^(?:bf16-b2-h8-s97-d64-causal|fp16-b2-h8/2-s127-d80)$"},
        },
        True,
        "allowed",
    ),
    (
        "bisect with a shell in an input",
        TRUSTED,
        "workflow_dispatch",
        "bisect.yml",
        "refs/heads/main",
        {**DISPATCH_GATE, "workflow": ".github/workflows/bisect.yml", "inputs": {"good": "v1", "only": "x'; id; '"}},
        False,
        "dispatch input only",
    ),
    (
        "bisect with a flag for a commit",
        TRUSTED,
        "workflow_dispatch",
        "bisect.yml",
        "refs/heads/main",
        {**DISPATCH_GATE, "workflow": ".github/workflows/bisect.yml", "inputs": {"good": "--exec=id", "only": "x"}},
        False,
        "dispatch input good",
    ),
    (
        "bisect from a branch",
        TRUSTED,
        "workflow_dispatch",
        "bisect.yml",
        "refs/heads/x",
        {
            **DISPATCH_GATE,
            "ref": "refs/heads/x",
            "workflow": ".github/workflows/bisect.yml",
            "inputs": {"good": "v1", "only": "x"},
        },
        False,
        "not refs/heads/main",
    ),
    (
        "bisect on the PR group",
        GPU,
        "workflow_dispatch",
        "bisect.yml",
        "refs/heads/main",
        {**DISPATCH_GATE, "workflow": ".github/workflows/bisect.yml", "inputs": {"good": "v1", "only": "x"}},
        False,
        "allow-list",
    ),
    (
        "main's vet.yml asks for a GPU",
        GPU,
        "issue_comment",
        "vet.yml",
        "refs/heads/main",
        ISSUE_COMMENT,
        False,
        "allow-list",
    ),
]


@pytest.mark.parametrize("name,config,event,workflow,ref,payload,allowed,why", CASES, ids=[c[0] for c in CASES])
def test_guard_decides_from_the_runners_facts(name, config, event, workflow, ref, payload, allowed, why):
    d = guard.decide(config, env_for(event, workflow, ref), payload)
    assert d.allowed is allowed, d.reasons
    assert any(why in r for r in d.reasons), d.reasons


def test_guard_refuses_another_repository_and_inconsistent_facts():
    other = guard.decide(
        GPU,
        env_for("workflow_dispatch", "gate.yml", "refs/heads/main", repo="mallory/r"),
        {**DISPATCH_GATE, "repository": {"full_name": "mallory/r"}},
    )
    assert not other.allowed and "is not o/r" in other.reasons[0]
    env = {**env_for("workflow_dispatch", "gate.yml", "refs/heads/main"), "GITHUB_REF": "refs/heads/feature"}
    assert not guard.decide(GPU, env, DISPATCH_GATE).allowed  # the workflow's ref and the run's ref disagree
    env = {
        **env_for("workflow_dispatch", "gate.yml", "refs/heads/main"),
        "GITHUB_WORKFLOW_REF": "mallory/r/.github/workflows/gate.yml@refs/heads/main",
    }
    assert not guard.decide(GPU, env, DISPATCH_GATE).allowed  # a workflow of another repository
    assert not guard.decide(GPU, {}, DISPATCH_GATE).allowed  # nothing from the runner: refuse


@pytest.mark.parametrize(
    "change,message",
    [
        ({"repository": "OWNER/REPO"}, "repository must be"),
        ({"surprise": 1}, "unknown keys"),
        ({"allow": []}, "allow is empty"),
        (
            {"allow": [{"workflow": ".github/workflows/ci.yml", "events": ["pull_request"], "ref": "refs/heads/main"}]},
            "without pull_request",
        ),
        ({"allow": [{"workflow": "gate.yml", "events": ["push"], "ref": "refs/heads/main"}]}, "must be a path"),
        ({"persistent_runner_accepted": "yes"}, "true or false"),
        ({"schema_version": 2}, "schema_version"),
    ],
)
def test_guard_settings_errors_name_the_key(change, message):
    with pytest.raises(guard.ConfigError, match=message):
        guard.parse_config({**shipped("attn-gate-gpu"), **change})


def test_shipped_settings_list_exactly_the_workflows_each_group_runs():
    """The templates and the workflows agree: every self-hosted job's workflow is allowed on the
    group its runs-on names, with exactly the workflow's triggers, from main."""
    wanted: dict[str, set[tuple[str, str]]] = {}
    for path in sorted((ROOT / ".github" / "workflows").glob("*.yml")):
        doc = yaml.safe_load(path.read_text())
        on = doc.get(True, doc.get("on"))
        for job in doc["jobs"].values():
            runs_on = job["runs-on"]
            if isinstance(runs_on, dict):
                for event in on:
                    wanted.setdefault(runs_on["group"], set()).add((f".github/workflows/{path.name}", event))
    for config in (GPU, TRUSTED):
        got = {(r.workflow, e) for r in config.allow for e in r.events}
        assert got == wanted[config.group], config.group
        assert all(
            r.ref == "refs/heads/main" or r.ref_prefix == "refs/heads/gh-readonly-queue/main/" for r in config.allow
        )
    assert set(wanted) == {"attn-gate-gpu", "attn-gate-trusted"}


# ---- the script as the runner runs it ------------------------------------------------------------

CLOSED = "127.0.0.1:1"  # a local port nothing listens on: the "metadata service" of a fenced host, no network used


def write_config(tmp_path: Path, **over) -> Path:
    raw = {
        **shipped("attn-gate-gpu"),
        "canary": str(tmp_path / "state" / "canary"),
        "canary_sudo": "",
        "read_only_paths": [],
        "metadata_address": CLOSED,
        **over,
    }
    path = tmp_path / "guard.json"
    path.write_text(json.dumps(raw))
    return path


def run_guard(
    tmp_path: Path,
    config: Path,
    payload: dict = DISPATCH_GATE,
    extra: dict | None = None,
    event: str = "workflow_dispatch",
    workflow: str = "gate.yml",
    ref: str = "refs/heads/main",
):
    temp = tmp_path / "runner-temp"
    temp.mkdir(exist_ok=True)
    (tmp_path / "event.json").write_text(json.dumps(payload))
    github_env = tmp_path / "github-env"
    github_env.write_text("")
    env = {
        "PATH": "/usr/bin:/bin",
        **env_for(event, workflow, ref),
        "GITHUB_EVENT_PATH": str(tmp_path / "event.json"),
        "GITHUB_ENV": str(github_env),
        "RUNNER_TEMP": str(temp),
        **(extra or {}),
    }
    # an empty process table: under CI the real Runner.Worker is among pytest's ancestors, and a
    # refusal here must not end the CI job itself (the fake runner's tests use the real one)
    (tmp_path / "no-proc").mkdir(exist_ok=True)
    r = subprocess.run(
        [sys.executable, "-I", str(GUARD), "--config", str(config), "--proc", str(tmp_path / "no-proc")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    values = dict(line.split("=", 1) for line in github_env.read_text().splitlines())
    return r, values


def test_guard_script_confines_the_job_to_its_temp_dir(tmp_path):
    r, values = run_guard(tmp_path, write_config(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    temp = str(tmp_path / "runner-temp")
    assert values["ATTN_GATE_GUARD"] == "attn-gate-gpu"
    for key in (
        "HOME",
        "XDG_CACHE_HOME",
        "PIP_CACHE_DIR",
        "TORCH_HOME",
        "TORCHINDUCTOR_CACHE_DIR",
        "TRITON_CACHE_DIR",
        "CUDA_CACHE_PATH",
        "CUTE_DSL_CACHE_DIR",
        "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR",
        "TMPDIR",
    ):
        assert values[key].startswith(temp + "/"), key
    assert values["PIP_CONFIG_FILE"] == os.devnull and values["PIP_EXTRA_INDEX_URL"] == ""
    assert values["PIP_INDEX_URL"] == "https://pypi.org/simple" and values["PYTHONNOUSERSITE"] == "1"
    assert (tmp_path / "runner-temp" / "home").is_dir()


def test_guard_script_refuses_a_pull_request_and_writes_nothing(tmp_path):
    r, values = run_guard(
        tmp_path,
        write_config(tmp_path),
        FORK_PULL_REQUEST,
        event="pull_request",
        workflow="ci.yml",
        ref="refs/pull/7/merge",
    )
    assert r.returncode == 1 and "::error::attn-gate guard: refused: event pull_request" in r.stdout
    assert values == {}
    # the canary came first: the refused job marked the host, so the next job on it is refused too
    assert (tmp_path / "state" / "canary").read_text().startswith("repo=o/r run=55 job=gate")
    again, values = run_guard(tmp_path, write_config(tmp_path))
    assert again.returncode == 1 and "this host already ran a job (repo=o/r run=55 job=gate" in again.stdout
    assert values == {}


def test_canary_refuses_a_reused_host_and_no_job_variable_turns_it_off(tmp_path):
    config = write_config(tmp_path)
    assert run_guard(tmp_path, config)[0].returncode == 0
    assert (tmp_path / "state" / "canary").read_text().startswith("repo=o/r run=55 job=gate")
    # the old opt-out, a job variable, and an attempt to point the guard at other settings: all ignored
    sneaky = {
        "ATTN_GATE_PERSISTENT_RUNNER_ACCEPTED": "yes",
        "PERSISTENT_RUNNER_ACCEPTED": "yes",
        "PYTHONPATH": str(tmp_path),
        "ATTN_GATE_GUARD_CONFIG": "/dev/null",
    }
    (tmp_path / "json.py").write_text("raise SystemExit(0)\n")  # would shadow json without -I
    again, values = run_guard(tmp_path, config, extra=sneaky)
    assert again.returncode == 1 and values == {}
    assert "this host already ran a job (repo=o/r run=55 job=gate" in again.stdout
    accepted = write_config(tmp_path, persistent_runner_accepted=True)  # only the host's settings opt out
    r, values = run_guard(tmp_path, accepted)
    assert r.returncode == 0 and "::warning::attn-gate guard: this host is not fresh" in r.stdout and values


def test_canary_does_not_echo_a_planted_marker_as_a_command(tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "canary").write_text("x\n::set-env name=EVIL::1\n$(id)")
    r, _ = run_guard(tmp_path, write_config(tmp_path))
    assert r.returncode == 1 and "::set-env" not in r.stdout and "$(id)" not in r.stdout


def test_canary_in_a_folder_the_job_can_write_is_named_as_a_tripwire(tmp_path):
    r, _ = run_guard(tmp_path, write_config(tmp_path))
    if os.access(tmp_path / "state", os.W_OK):
        assert "::warning::attn-gate guard: the canary's folder" in r.stdout
    # with canary_sudo, a writable folder is refused: the root-written marker must be out of the job's reach
    r, values = run_guard(
        tmp_path, write_config(tmp_path, canary_sudo="/usr/bin/sudo", canary=str(tmp_path / "c2" / "x"))
    )
    assert r.returncode == 1 and "canary_sudo is set but this user can write" in r.stdout and values == {}


def test_mark_canary_takes_no_argument_from_its_caller(tmp_path):
    """The helper run through sudo: fixed command, label from stdin, exit 0 then 3."""
    config = write_config(tmp_path)
    cmd = [sys.executable, "-I", str(GUARD), "--config", str(config), "--mark-canary"]
    first = subprocess.run(cmd, input="repo=o/r run=1\n::evil::", capture_output=True, text=True, timeout=60)
    assert first.returncode == 0
    second = subprocess.run(cmd, input="repo=o/r run=2", capture_output=True, text=True, timeout=60)
    assert second.returncode == guard.USED and "repo=o/r run=1" in second.stdout and "::evil" not in second.stdout
    assert subprocess.run([*cmd, "/tmp/elsewhere"], capture_output=True, timeout=60).returncode == 2  # argparse


def test_guard_refuses_a_writable_guard_or_base_python(tmp_path):
    writable = tmp_path / "opt"
    writable.mkdir()
    r, values = run_guard(tmp_path, write_config(tmp_path, read_only_paths=[str(writable)]))
    if os.access(writable, os.W_OK):
        assert r.returncode == 1 and f"this user can write {writable}" in r.stdout and values == {}
    assert guard.parse_config(shipped("attn-gate-gpu")).read_only_paths[-1] == "@python"


def test_guard_refuses_bad_settings_and_a_missing_payload(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**shipped("attn-gate-gpu"), "repository": "OWNER/REPO"}))
    r, _ = run_guard(tmp_path, bad)
    assert r.returncode == 2 and "repository must be this runner's OWNER/REPO" in r.stdout
    config = write_config(tmp_path)
    r, values = run_guard(tmp_path, config, extra={"GITHUB_EVENT_PATH": str(tmp_path / "missing.json")})
    assert r.returncode == 1 and "cannot read the event payload" in r.stdout and values == {}


def test_wrapper_fixes_its_paths_and_runs_python_isolated():
    text = (RUNNER / "job_started.sh").read_text()
    exec_line = [line for line in text.splitlines() if line.startswith("exec ")]
    assert exec_line == [
        "exec /usr/bin/python3 -I /opt/attn-gate-runner/job_started.py --config /etc/attn-gate-runner/guard.json"
    ]
    assert "$" not in exec_line[0]  # no variable decides what runs or which settings apply


def _fake_proc(tmp_path, chain):
    """A /proc with `chain` as (pid, exe, ppid) rows: what runner_root walks up."""
    proc = tmp_path / "proc"
    for pid, exe, ppid in chain:
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "exe").symlink_to(exe)
        (proc / str(pid) / "stat").write_text(f"{pid} (x y) S {ppid} 0 0\n")
    return str(proc)


def test_the_runner_install_is_found_among_the_ancestors_and_must_be_read_only(tmp_path):
    root = tmp_path / "actions-runner"
    (root / "bin").mkdir(parents=True)
    (root / ".env").write_text("ACTIONS_RUNNER_HOOK_JOB_STARTED=/opt/attn-gate-runner/job_started.sh\n")
    proc = _fake_proc(
        tmp_path,
        [(300, "/usr/bin/python3", 200), (200, "/usr/bin/bash", 100), (100, str(root / "bin" / "Runner.Worker"), 1)],
    )
    assert guard.runner_root(300, proc) == str(root)
    assert guard.runner_root(300, _fake_proc(tmp_path / "other", [(300, "/usr/bin/python3", 1)])) is None
    config = guard.parse_config({**json.loads(json.dumps(shipped("attn-gate-gpu"))), "read_only_paths": ["@runner"]})
    if os.access(root / ".env", os.W_OK):  # a job could remove the hook line for the next job on the host
        assert any(p.startswith(f"{root / '.env'} (") for p in guard.writable_paths(config, str(root)))
    lost = guard.writable_paths(config, None) if guard.runner_root() is None else ["@runner"]
    assert lost and lost[0].startswith("@runner")  # not under a runner: the guard cannot vouch for it
    assert "@runner" in guard.parse_config(shipped("attn-gate-gpu")).read_only_paths


# ---- a refusal ends the job; the canary first; the host's network -------------------------------


def test_a_refusal_kills_the_worker_and_the_listener(tmp_path):
    """The runner runs a failed hook's job on (always() steps, pre: steps): the guard ends it. The
    listener is stopped first (it takes no other job), the worker killed, then the listener."""
    root = tmp_path / "actions-runner"
    proc = _fake_proc(
        tmp_path,
        [
            (400, "/usr/bin/python3", 300),
            (300, "/usr/bin/bash", 200),
            (200, str(root / "bin" / "Runner.Worker"), 100),
            (100, str(root / "bin" / "Runner.Listener"), 50),
            (50, "/usr/bin/bash", 1),
        ],
    )
    assert [(n, p) for n, p, _ in guard.runner_ancestors(400, proc)] == [
        ("Runner.Worker", 200),
        ("Runner.Listener", 100),
    ]
    sent = []
    config = write_config(tmp_path)
    (tmp_path / "event.json").write_text(json.dumps(FORK_PULL_REQUEST))
    env = {
        **env_for("pull_request", "ci.yml", "refs/pull/7/merge"),
        "GITHUB_EVENT_PATH": str(tmp_path / "event.json"),
        "GITHUB_ENV": str(tmp_path / "github-env"),
        "RUNNER_TEMP": str(tmp_path),
    }
    import signal

    orig = guard.runner_ancestors
    guard.runner_ancestors = lambda pid=None, proc="/proc": orig(400, proc)  # this process as pid 400
    try:
        assert guard.run(str(config), env, proc=proc, kill=lambda pid, sig: sent.append((pid, sig))) == 1
    finally:
        guard.runner_ancestors = orig
    assert sent == [(100, signal.SIGSTOP), (200, signal.SIGKILL), (100, signal.SIGKILL)]
    assert not (tmp_path / "github-env").exists()


def test_the_metadata_service_must_be_unreachable(tmp_path):
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    listening = f"127.0.0.1:{server.getsockname()[1]}"
    try:
        assert guard.metadata_reachable(listening) and not guard.metadata_reachable(CLOSED)
        assert guard.metadata_reachable("not an address")  # fail closed
        r, values = run_guard(tmp_path, write_config(tmp_path, metadata_address=listening))
        assert r.returncode == 1 and f"reaches the cloud metadata service ({listening})" in r.stdout and values == {}
        (tmp_path / "state" / "canary").unlink()
        r, values = run_guard(
            tmp_path, write_config(tmp_path, metadata_address=listening, metadata_reachable_accepted=True)
        )
        assert r.returncode == 0 and "::warning::attn-gate guard: the metadata service check is off" in r.stdout
        assert values
    finally:
        server.close()
    assert guard.parse_config(shipped("attn-gate-gpu")).metadata_address == "169.254.169.254:80"
    assert guard.parse_config(shipped("attn-gate-gpu")).metadata_reachable_accepted is False
    timed_out = guard.metadata_reachable("169.254.169.254:80", connect=lambda *a: (_ for _ in ()).throw(TimeoutError()))
    assert timed_out is False  # a dropped connection is a fenced host: no network used here


@pytest.mark.parametrize(
    "extra,over,why",
    [
        ({"RUNNER_TEMP": "/tmp/x\nLD_PRELOAD=/x.so"}, {}, "RUNNER_TEMP"),
        ({"RUNNER_TEMP": "relative/temp"}, {}, "RUNNER_TEMP"),
        ({}, {"index_url": "https://pypi.org/simple\nLD_PRELOAD=/x.so"}, "index_url must be one https:// URL"),
        ({}, {"index_url": "http://evil.example/simple"}, "index_url must be one https:// URL"),
        ({}, {"group": "g\nLD_PRELOAD=/x.so"}, "group must be"),
    ],
)
def test_no_value_injects_a_line_into_github_env(tmp_path, extra, over, why):
    temp = extra.get("RUNNER_TEMP")
    if temp and not temp.startswith("/tmp/x"):
        extra = {"RUNNER_TEMP": temp}
    r, values = run_guard(tmp_path, write_config(tmp_path, **over), extra=extra)
    assert r.returncode in (1, 2) and why in r.stdout, r.stdout + r.stderr
    assert values == {} and "LD_PRELOAD" not in (tmp_path / "github-env").read_text()
    assert "Traceback" not in r.stdout + r.stderr


def test_every_value_written_is_what_its_field_allows():
    config = guard.parse_config(shipped("attn-gate-gpu"))
    values = guard.job_env(config, {"RUNNER_TEMP": "/r/_work/_temp"})
    assert guard.env_problems(values, "/r/_work/_temp") == []
    assert values["ATTN_GATE_PYTHON"] == sys.executable
    for key, bad in (
        ("HOME", "/elsewhere/home"),
        ("PIP_INDEX_URL", "https://x\nY=1"),
        ("ATTN_GATE_GUARD", "a b"),
        ("PIP_CONFIG_FILE", "/r/_work/_temp/pip.conf"),
        ("ATTN_GATE_PYTHON", "/no/such/python"),
    ):
        assert guard.env_problems({**values, key: bad}, "/r/_work/_temp"), key


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


@pytest.mark.parametrize(
    "what",
    ["event FIFO", "GITHUB_ENV FIFO", "GITHUB_ENV folder", "GITHUB_ENV /dev/full", "canary FIFO", "settings FIFO"],
)
def test_special_files_are_refused_without_blocking(tmp_path, what):
    config = write_config(tmp_path)
    extra = {}
    if what == "event FIFO":
        extra["GITHUB_EVENT_PATH"] = str(_fifo(tmp_path / "event-fifo"))
    elif what == "GITHUB_ENV FIFO":
        extra["GITHUB_ENV"] = str(_fifo(tmp_path / "env-fifo"))
    elif what == "GITHUB_ENV folder":
        (tmp_path / "env-dir").mkdir()
        extra["GITHUB_ENV"] = str(tmp_path / "env-dir")
    elif what == "GITHUB_ENV /dev/full":
        extra["GITHUB_ENV"] = "/dev/full"
    elif what == "canary FIFO":
        (tmp_path / "state").mkdir()
        _fifo(tmp_path / "state" / "canary")  # a job on a reused host planted it where the marker goes
    else:
        config = _fifo(tmp_path / "settings-fifo")
    r, values = run_guard(tmp_path, config, extra=extra)  # run_guard's own timeout: a blocking open fails the test
    assert r.returncode in (1, 2) and "::error::attn-gate guard:" in r.stdout and values == {}, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr


@pytest.mark.parametrize(
    "payload",
    [
        {**DISPATCH_GATE, "repository": "o/r"},
        {**DISPATCH_GATE, "repository": ["o/r"]},
        {**DISPATCH_GATE, "repository": {"full_name": ["o/r"]}},
        {**DISPATCH_GATE, "inputs": ["7", SHA]},
        {**DISPATCH_GATE, "inputs": {"pr": {"x": 1}, "sha": SHA}},
        {**DISPATCH_GATE, "workflow": 5},
        "[" * 100_000 + "]" * 100_000,
        '{"a": ' * 50_000 + "1" + "}" * 50_000,
        [1, 2],
        "not json",
    ],
    ids=[
        "repository str",
        "repository list",
        "full_name list",
        "inputs list",
        "input object",
        "workflow int",
        "deep list",
        "deep object",
        "a list",
        "not json",
    ],
)
def test_malformed_payloads_refuse_the_job_in_one_line(tmp_path, payload):
    config = write_config(tmp_path)
    r, values = run_guard(tmp_path, config, payload)
    if isinstance(payload, str):  # raw text, not JSON-encoded
        (tmp_path / "event.json").write_text(payload)
        (tmp_path / "state" / "canary").unlink()
        r, values = run_guard_raw(tmp_path, config)
    assert r.returncode == 1 and "::error::attn-gate guard: refused:" in r.stdout, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr and values == {}


def run_guard_raw(tmp_path: Path, config: Path):
    """run_guard with the event file as it is (not rewritten from a payload)."""
    temp = tmp_path / "runner-temp"
    github_env = tmp_path / "github-env"
    github_env.write_text("")
    env = {
        "PATH": "/usr/bin:/bin",
        **env_for("workflow_dispatch", "gate.yml", "refs/heads/main"),
        "GITHUB_EVENT_PATH": str(tmp_path / "event.json"),
        "GITHUB_ENV": str(github_env),
        "RUNNER_TEMP": str(temp),
    }
    r = subprocess.run(
        [sys.executable, "-I", str(GUARD), "--config", str(config), "--proc", str(tmp_path / "no-proc")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return r, dict(line.split("=", 1) for line in github_env.read_text().splitlines())


@pytest.mark.parametrize(
    "change,message",
    [
        ({"allow": [5]}, "allow[0] must be an object"),
        ({"allow": "gate.yml"}, "allow must be list"),
        (
            {"allow": [{"workflow": ".github/workflows/gate.yml", "events": "push", "ref": "refs/heads/main"}]},
            "allow[0].events must be a list",
        ),
        (
            {
                "allow": [
                    {
                        "workflow": ".github/workflows/gate.yml",
                        "events": ["workflow_dispatch"],
                        "ref": "refs/heads/main",
                        "inputs": {"pr": "(["},
                    }
                ]
            },
            "allow[0].inputs.pr: '([' is not a regex",
        ),
        (
            {
                "allow": [
                    {
                        "workflow": ".github/workflows/gate.yml",
                        "events": ["workflow_dispatch"],
                        "ref": "refs/heads/main",
                        "inputs": {"pr": 5},
                    }
                ]
            },
            "allow[0].inputs.pr must be a regex string",
        ),
        ({"allow": [{"workflow": 5, "events": ["push"], "ref": "refs/heads/main"}]}, "allow[0].workflow must be str"),
        ({"read_only_paths": "/opt"}, "read_only_paths must be a list"),
        ({"canary": ["x"]}, "canary must be str"),
        ({"canary": "relative/canary"}, "canary must be an absolute path"),
        ({"metadata_address": "metadata.internal"}, "metadata_address must be IP:PORT"),
        ({"metadata_reachable_accepted": "yes"}, "metadata_reachable_accepted must be true or false"),
        ({"schema_version": True}, "schema_version"),
    ],
)
def test_malformed_settings_are_one_line_and_refuse_the_job(tmp_path, change, message):
    with pytest.raises(guard.ConfigError) as err:
        guard.parse_config({**shipped("attn-gate-gpu"), **change})
    assert message in str(err.value)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**shipped("attn-gate-gpu"), **change}))
    r, values = run_guard(tmp_path, bad)
    assert r.returncode == 2 and message in r.stdout and "Traceback" not in r.stdout + r.stderr and values == {}
    assert len([line for line in r.stdout.splitlines() if "refused" in line]) == 1


def test_the_read_only_walk_checks_every_file_by_owner_and_mode(tmp_path):
    """Not only the listed folder: a file deep inside it, by its owner and mode (injected: these
    tests may run as root, for whom every path is writable)."""
    opt = tmp_path / "opt"
    (opt / "sub").mkdir(parents=True)
    (opt / "sub" / "job_started.py").write_text("")
    (opt / "sub" / "job_started.py").chmod(0o644)
    config = guard.parse_config({**shipped("attn-gate-gpu"), "read_only_paths": [str(opt)]})
    nobody = dict(euid=65534, access=lambda p, m: False)
    assert guard.writable_paths(config, **nobody) == []
    (opt / "sub" / "job_started.py").chmod(0o666)
    assert guard.writable_paths(config, **nobody) == [
        f"{opt / 'sub' / 'job_started.py'} (writable by everyone (mode 0666))"
    ]
    (opt / "sub" / "job_started.py").chmod(0o644)
    owner = os.stat(opt / "sub" / "job_started.py").st_uid
    if owner != 0:
        assert guard.writable_paths(config, euid=owner, access=lambda p, m: False)  # its owner can chmod it
    group = [str(opt / "sub")]
    assert guard.writable_paths(config, euid=65534, access=lambda p, m: p in group) == [
        f"{opt / 'sub'} (writable by this user (owner uid {owner}, group gid {os.stat(opt / 'sub').st_gid}, mode "
        f"{os.stat(opt / 'sub').st_mode & 0o7777:04o}))"
    ]


def test_the_runner_install_is_walked_except_what_the_runner_writes(tmp_path):
    root = tmp_path / "actions-runner"
    for d in ("bin", "externals/node24/bin", "_work/_temp", "_diag"):
        (root / d).mkdir(parents=True)
    for f in (
        "run.sh",
        "config.sh",
        ".env",
        ".path",
        "bin/Runner.Worker",
        "externals/node24/bin/node",
        ".runner",
        ".credentials",
        ".credentials_rsaparams",
        "_work/x",
        "_diag/log",
    ):
        (root / f).write_text("")
        (root / f).chmod(0o644)
    config = guard.parse_config({**shipped("attn-gate-gpu"), "read_only_paths": ["@runner"]})
    nobody = dict(euid=65534, access=lambda p, m: False)
    assert guard.writable_paths(config, str(root), **nobody) == []
    for f in (".runner", ".credentials", ".credentials_rsaparams", "_work/x", "_diag/log"):
        (root / f).chmod(0o666)  # the JIT runner writes its registration; jobs write _work
    assert guard.writable_paths(config, str(root), **nobody) == []
    for f in ("run.sh", "externals/node24/bin/node"):
        (root / f).chmod(0o666)
    assert [p.split(" ")[0] for p in guard.writable_paths(config, str(root), **nobody)] == [
        str(root / "externals/node24/bin/node"),
        str(root / "run.sh"),
    ]


def test_python_paths_cover_every_folder_it_imports_from():
    paths = guard._python_paths()
    assert sys.executable in paths
    assert all(p in paths for p in sys.path if p and os.path.isabs(p))  # Debian's dist-packages among them


# ---- fuzz: payload and settings ----------------------------------------------------------------

ODD_VALUES = [
    None,
    0,
    7,
    -1,
    1.5,
    True,
    "",
    "x",
    "o/r\n",
    "7\nLD_PRELOAD=/x.so",
    [],
    ["o/r"],
    {},
    {"full_name": "o/r"},
    "a" * 10_000,
    "\u202e",
    "refs/heads/main",
]
USED_PATHS = [("repository", "full_name"), ("inputs", "pr"), ("inputs", "sha"), ("workflow",), ("ref",)]


def _mutated(payload: dict, path: tuple, value):
    out = json.loads(json.dumps(payload))
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


@pytest.mark.parametrize("path", USED_PATHS + [("repository",), ("inputs",), ("sender",)], ids=lambda p: ".".join(p))
def test_fuzz_the_payload_fields_the_guard_reads(path):
    """Oracle: a field the guard reads, changed to any other value or type, never admits the job
    (nor raises); an unread field (sender) changes nothing."""
    env = env_for("workflow_dispatch", "gate.yml", "refs/heads/main")
    original = DISPATCH_GATE
    for node in path[:-1]:
        original = original[node]
    for value in ODD_VALUES:
        d = guard.decide(GPU, env, _mutated(DISPATCH_GATE, path, value))
        same = value == original.get(path[-1]) if isinstance(original, dict) else False
        if path == ("sender",):
            assert d.allowed, (value, d.reasons)
        elif path in (("workflow",), ("ref",)) and value is None:
            assert d.allowed  # absent: the runner's own GITHUB_WORKFLOW_REF decides
        elif path == ("repository", "full_name") and value in (None, ""):
            assert d.allowed  # absent: GITHUB_REPOSITORY decides
        elif path == ("repository",) and value in (None, {}, {"full_name": "o/r"}):
            assert d.allowed
        elif not same:
            assert not d.allowed and d.reasons, (path, value)


@pytest.mark.parametrize("key", sorted(guard.CONFIG_KEYS))
def test_fuzz_the_settings(key):
    """Oracle: any value of any type is either a Config the guard can use or one ConfigError that
    names the key; never another exception, and never a Config whose check is off without the
    key saying so."""
    for value in ODD_VALUES:
        raw = {**shipped("attn-gate-gpu"), key: value}
        try:
            config = guard.parse_config(raw)
        except guard.ConfigError as err:
            assert key.split("_")[0] in str(err) or "allow" in str(err), (key, value, str(err))
            continue
        if key == "read_only_paths":  # a wrong type never reads as "no paths": the check stays on
            assert isinstance(value, list) and config.read_only_paths == tuple(value), value
        assert config.allow and config.repository == "o/r"
        assert isinstance(config.persistent_runner_accepted, bool) and isinstance(
            config.metadata_reachable_accepted, bool
        )
        assert config.persistent_runner_accepted is (value is True and key == "persistent_runner_accepted")
        assert config.metadata_reachable_accepted is (value is True and key == "metadata_reachable_accepted")
        assert guard.INDEX_URL.fullmatch(config.index_url) and "\n" not in config.group + config.canary
