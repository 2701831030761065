"""The GitHub workflows are correct and safe: schema-valid, zero zizmor findings (regular and
pedantic; the auditor persona's findings are the ones docs/ci.md explains), and the project's own
rules that a linter alone does not state: pinned actions on node24 majors, no expressions in
scripts, least privilege, no GPU work reachable from a pull_request event, the runner guard
required, trusted jobs on their own runner group with hash-locked installs and no caches. Each rule
is a small function shown failing on a bad workflow and passing on ours; vet.yml's and report.yml's
scripts run under node against a fake GitHub API, and the guard check runs in bash after the real
guard (tests/test_runner_guard.py tests the guard itself).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.tools import interpreter_path_prefix, require

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
WORKFLOW_FILES = sorted(WORKFLOWS.glob("*.yml"))
GPU_DEFAULT_LABELS = ["self-hosted", "linux", "gpu", "h200"]


def tool(name: str) -> str:
    """A console script of the test extra, next to this interpreter (the venv) or on PATH."""
    return require(name, "`pip install -e '.[test]'`; scripts/setup.sh does it")


def load(path: Path) -> dict:
    doc = yaml.safe_load(path.read_text())
    if True in doc:  # YAML 1.1 reads the key `on` as a boolean
        doc["on"] = doc.pop(True)
    return doc


def workflow(name: str) -> dict:
    return load(WORKFLOWS / name)


# ---- the rules, as functions over workflow text or parsed workflows --------------------------

USES_LINE = re.compile(r"^\s*(?:-\s+)?uses:\s*(?P<ref>\S+)(?P<rest>.*)$")
PINNED = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_./-]+@[0-9a-f]{40}$")
VERSION_COMMENT = re.compile(r"#\s*v\d+\.\d+\.\d+\b")


def unpinned_uses(text: str) -> list[str]:
    """`uses:` lines not pinned to a full commit SHA with a `# vX.Y.Z` comment (local ./ actions are fine)."""
    bad = []
    for line in text.splitlines():
        m = USES_LINE.match(line)
        if not m or m["ref"].startswith("./"):
            continue
        if not PINNED.match(m["ref"]) or not VERSION_COMMENT.search(m["rest"]):
            bad.append(line.strip())
    return bad


def steps_of(doc: dict):
    for job_id, job in doc.get("jobs", {}).items():
        for step in job.get("steps", []):
            yield job_id, step


def expressions_in_scripts(doc: dict) -> list[str]:
    """`${{ }}` inside a `run:` script or a github-script `script:`: the template-injection shape.
    Values reach scripts through `env:` only, even trusted ones, so the rule has no exceptions."""
    bad = []
    for job_id, step in steps_of(doc):
        scripts = [step.get("run", "")]
        if str(step.get("uses", "")).startswith("actions/github-script@"):
            scripts.append(step.get("with", {}).get("script", ""))
        for script in scripts:
            if "${{" in str(script):
                bad.append(f"{job_id}: {step.get('name', step.get('uses'))}")
    return bad


def dangerous_triggers(doc: dict) -> list[str]:
    on = doc.get("on", {})
    names = [on] if isinstance(on, str) else list(on)
    return [t for t in names if t == "pull_request_target"]


def permission_problems(doc: dict) -> list[str]:
    """Workflow-level `permissions: {}` and every job declaring its own, so no job inherits the
    repository default (which may be read-write)."""
    bad = []
    if doc.get("permissions", None) != {}:
        bad.append("workflow: permissions must be {} (each job asks for what it needs)")
    for job_id, job in doc.get("jobs", {}).items():
        if "permissions" not in job:
            bad.append(f"{job_id}: no permissions block")
    return bad


def checkouts_keeping_credentials(doc: dict) -> list[str]:
    return [
        f"{job_id}: {step.get('name', step['uses'])}"
        for job_id, step in steps_of(doc)
        if str(step.get("uses", "")).startswith("actions/checkout@")
        and step.get("with", {}).get("persist-credentials") is not False
    ]


def default_runner_labels(runs_on) -> list[str] | None:
    """The label list of `fromJSON(vars.X || '[...]')`, or the literal list, also inside a
    `{group, labels}` mapping; None for hosted runners."""
    if isinstance(runs_on, dict):
        runs_on = runs_on.get("labels")
    if isinstance(runs_on, list):
        return runs_on
    m = re.search(r"'(\[.*?\])'", str(runs_on))
    return json.loads(m[1]) if m else None


def runner_groups(runs_on) -> set[str]:
    """The runner groups a job can land in (both branches of a `cond && 'a' || 'b'` expression)."""
    if not isinstance(runs_on, dict):
        return set()
    group = runs_on["group"]
    return set(re.findall(r"&& '([^']+)' \|\| '([^']+)'", group)[0]) if "${{" in group else {group}


def self_hosted_jobs():
    for path in WORKFLOW_FILES:
        for job_id, job in load(path)["jobs"].items():
            labels = default_runner_labels(job["runs-on"])
            if labels and "self-hosted" in labels:
                yield path.name, job_id, job


def triggers(doc: dict) -> set[str]:
    on = doc.get("on", {})
    return {on} if isinstance(on, str) else set(on)


def gpu_reachable_from_pull_requests(doc: dict) -> list[str]:
    """A pull_request run uses the PR's own copy of the file: no job of such a workflow may run on
    a self-hosted runner, whatever its `if:` says (the PR author can edit that)."""
    if not triggers(doc) & {"pull_request", "pull_request_target"}:
        return []
    return [
        job_id
        for job_id, job in doc.get("jobs", {}).items()
        if job.get("runs-on") != "ubuntu-latest" and "ubuntu" not in str(job.get("runs-on"))
    ]


def vars_in_fork_context(doc: dict, text: str) -> list[str]:
    """Repository variables and secrets are empty in a fork's pull_request run: a workflow that
    such a run can start must not read them (a routing decision would silently see '')."""
    if not triggers(doc) & {"pull_request", "pull_request_target"}:
        return []
    return re.findall(r"(?:vars|secrets)\.[A-Za-z_]+", text)


# ---- the rules fail on bad workflows ---------------------------------------------------------


def caches(doc: dict) -> list[str]:
    """Steps that save or restore a cache: actions/cache, and the `cache:` of a setup-* action
    (setup-node caches on its own unless told not to). What a PR job saved would reach the next
    job through main's cache scope."""
    found = []
    for job_id, step in steps_of(doc):
        uses, given = str(step.get("uses", "")), step.get("with") or {}
        action = uses.split("@")[0]
        if action.startswith("actions/cache"):
            found.append(f"{job_id}: {action}")
        elif re.fullmatch(r"[^/]+/setup-[\w-]+", action):
            keys = sorted(k for k in given if k.startswith("cache") or k == "package-manager-cache")
            if any(k != "package-manager-cache" and given[k] not in ("", False) for k in keys):
                found.append(f"{job_id}: {action} with {', '.join(keys)}")
            elif action == "actions/setup-node" and given.get("package-manager-cache") is not False:
                found.append(f"{job_id}: {action} without package-manager-cache: false")
    return found


BAD_WORKFLOW = """\
name: bad
on:
  pull_request_target:
jobs:
  build:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
        with:
          ref: ${{ github.event.pull_request.head.sha }}
      - run: echo "${{ github.event.pull_request.title }}"
      - uses: actions/setup-python@v6
        with:
          python-version: "3.12"
          cache: pip
      - uses: actions/setup-node@v6
"""


def test_rules_fail_a_bad_workflow():
    doc = yaml.safe_load(BAD_WORKFLOW)
    doc["on"] = doc.pop(True)
    assert unpinned_uses(BAD_WORKFLOW) == [
        "- uses: actions/checkout@v4",
        "- uses: actions/setup-python@v6",
        "- uses: actions/setup-node@v6",
    ]
    # a SHA without its version comment, or a short SHA, is not pinned either
    assert unpinned_uses("- uses: actions/cache@5a3ec84eff668545956fd18022155c47e93e2684\n")
    assert unpinned_uses("- uses: actions/cache@5a3ec84 # v4.2.3\n")
    assert expressions_in_scripts(doc) == ["build: None"]
    assert dangerous_triggers(doc) == ["pull_request_target"]
    assert permission_problems(doc) == [
        "workflow: permissions must be {} (each job asks for what it needs)",
        "build: no permissions block",
    ]
    assert checkouts_keeping_credentials(doc) == ["build: actions/checkout@v4"]
    assert caches(doc) == [
        "build: actions/setup-python with cache",
        "build: actions/setup-node without package-manager-cache: false",
    ]


def test_schema_and_zizmor_fail_a_bad_workflow(tmp_path):
    bad = tmp_path / ".github" / "workflows"
    bad.mkdir(parents=True)
    (bad / "bad.yml").write_text(BAD_WORKFLOW)
    (bad / "invalid.yml").write_text("name: invalid\non: push\njobs:\n  build:\n    steps: []\n")
    schema = subprocess.run(
        [tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(bad / "invalid.yml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert schema.returncode != 0, schema.stdout  # a job with neither runs-on nor uses
    z = subprocess.run(
        [tool("zizmor"), "--offline", "--format", "json", str(bad / "bad.yml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = {f["ident"] for f in json.loads(z.stdout)}
    assert z.returncode != 0
    assert {"dangerous-triggers", "template-injection", "unpinned-uses"} <= found, found


# ---- and pass on ours ------------------------------------------------------------------------

PINS = {  # current majors, all on node24; each SHA is the commit its release tag points at
    "actions/checkout": ("3d3c42e5aac5ba805825da76410c181273ba90b1", "v7.0.1"),
    "actions/setup-python": ("5fda3b95a4ea91299a34e894583c3862153e4b97", "v7.0.0"),
    "actions/upload-artifact": ("043fb46d1a93c77aae656e7c1c64a875d1fc6a0a", "v7.0.1"),
    "actions/download-artifact": ("3e5f45b2cfb9172054b4087a40e8e0b5a5461e7c", "v8.0.1"),
    "actions/github-script": ("3a2844b7e9c422d3c10d287c895573f7108da1b3", "v9.0.0"),
    "actions/upload-pages-artifact": ("fc324d3547104276b827a68afc52ff2a11cc49c9", "v5.0.0"),
    "actions/deploy-pages": ("cd2ce8fcbc39b97be8ca5fce6e763baed58fa128", "v5.0.0"),
    "actions/create-github-app-token": ("bcd2ba49218906704ab6c1aa796996da409d3eb1", "v3.2.0"),
}
GPU_GROUP, TRUSTED_GROUP = "attn-gate-gpu", "attn-gate-trusted"


def test_the_workflows_exist():
    assert [p.name for p in WORKFLOW_FILES] == [
        "baselines.yml",
        "bisect.yml",
        "ci.yml",
        "gate.yml",
        "nightly.yml",
        "publish.yml",
        "report.yml",
        "selftest.yml",
        "vet.yml",
    ]


def test_workflows_match_the_github_workflow_schema():
    r = subprocess.run(
        [tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", *map(str, WORKFLOW_FILES)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("persona", ["regular", "pedantic"])
def test_zizmor_offline_finds_nothing(persona):
    r = subprocess.run(
        [tool("zizmor"), "--offline", "--persona", persona, "--format", "json", str(WORKFLOWS)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and json.loads(r.stdout) == [], r.stdout + r.stderr


# What the auditor persona still reports, each explained in docs/ci.md ("zizmor").
AUDITOR_EXPLAINED = {
    ("self-hosted-runner", "baselines.yml"),
    ("self-hosted-runner", "bisect.yml"),
    ("self-hosted-runner", "gate.yml"),
    ("self-hosted-runner", "nightly.yml"),
    ("self-hosted-runner", "publish.yml"),
    ("self-hosted-runner", "selftest.yml"),
}


def test_zizmor_auditor_findings_are_the_explained_ones():
    r = subprocess.run(
        [tool("zizmor"), "--offline", "--persona", "auditor", "--format", "json", str(WORKFLOWS)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = {
        (f["ident"], Path(f["locations"][0]["symbolic"]["key"]["Local"]["verbatim_path"]).name)
        for f in json.loads(r.stdout)
    }
    assert found == AUDITOR_EXPLAINED, r.stdout[-3000:]
    docs = (ROOT / "docs" / "ci.md").read_text()
    assert all(ident in docs for ident, _ in found)


TEMPLATE_WORKFLOWS = sorted((ROOT / "gate" / "workflow" / "templates" / "workflows").glob("*.yml"))


@pytest.mark.parametrize("path", WORKFLOW_FILES + TEMPLATE_WORKFLOWS, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_no_workflow_or_template_saves_or_restores_a_cache(path):
    """Not actions/cache, not a setup-* action's `cache:`: a PR job's code runs in main's cache
    scope, and what it saved (or an action's JS it rewrote) would run in a later trusted job."""
    doc = yaml.safe_load(path.read_text().replace("@@", "x"))  # a template's placeholders, made plain
    assert caches(doc) == []


@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=lambda p: p.name)
def test_project_rules_hold(path):
    doc = load(path)
    assert unpinned_uses(path.read_text()) == []
    assert expressions_in_scripts(doc) == []
    assert dangerous_triggers(doc) == []
    assert permission_problems(doc) == []
    assert checkouts_keeping_credentials(doc) == []
    assert gpu_reachable_from_pull_requests(doc) == []
    assert vars_in_fork_context(doc, path.read_text()) == []
    for job_id, job in doc["jobs"].items():
        assert "timeout-minutes" in job, (
            f"{path.name}/{job_id}: no timeout-minutes (a hung job holds its runner for 6 h)"
        )


def test_actions_are_the_current_node24_majors_pinned_to_one_sha_everywhere():
    pins: dict[str, set[tuple[str, str]]] = {}
    for path in WORKFLOW_FILES:
        for line in path.read_text().splitlines():
            m = USES_LINE.match(line)
            if m:
                action, sha = m["ref"].split("@")
                pins.setdefault(action, set()).add((sha, VERSION_COMMENT.search(m["rest"])[0].lstrip("# ").strip()))
    assert pins == {action: {pin} for action, pin in PINS.items()}
    assert "actions/cache" not in pins  # no cache: what a PR job saved never reaches another job


# The old gate.yml shape: routing of fork PRs decided inside a pull_request run, from vars.
FORK_ROUTED = """\
name: gate
on: pull_request
permissions: {}
jobs:
  gate:
    if: github.event.pull_request.head.repo.full_name == github.repository || vars.ATTN_GATE_FORK_PRS == 'review'
    runs-on: ${{ fromJSON(vars.ATTN_GATE_RUNNER || '["self-hosted","linux","gpu","h200"]') }}
    permissions: {}
    steps: [{run: "true"}]
"""


def test_fork_routing_rules_fail_the_old_gate():
    doc = yaml.safe_load(FORK_ROUTED)
    doc["on"] = doc.pop(True)
    assert gpu_reachable_from_pull_requests(doc) == ["gate"]
    assert vars_in_fork_context(doc, FORK_ROUTED) == ["vars.ATTN_GATE_FORK_PRS", "vars.ATTN_GATE_RUNNER"]


def test_permissions_are_exactly_these():
    """Least privilege, written out: any new write permission must be added here on purpose."""
    got = {p.name: {j: job["permissions"] for j, job in load(p)["jobs"].items()} for p in WORKFLOW_FILES}
    assert got == {
        "baselines.yml": {"update": {"contents": "read"}, "branch": {"contents": "write"}},
        "bisect.yml": {"bisect": {"contents": "read"}},
        "ci.yml": {"tests": {"contents": "read"}},
        "gate.yml": {"gate": {"contents": "read"}},
        "nightly.yml": {"shard": {"contents": "read"}, "verdict": {"contents": "read"}},
        "publish.yml": {
            "bench": {"contents": "read"},
            "history": {"contents": "write"},
            "deploy": {"pages": "write", "id-token": "write"},
        },
        "report.yml": {"report": {"actions": "read", "pull-requests": "write", "statuses": "write"}},
        "selftest.yml": {"selftest": {"contents": "read"}, "history": {"contents": "write"}},
        "vet.yml": {"vet": {"actions": "write", "statuses": "write", "pull-requests": "write"}},  # writes no branch
    }


def test_jobs_that_write_run_no_project_code_and_not_on_a_self_hosted_runner():
    for path in WORKFLOW_FILES:
        for job_id, job in load(path)["jobs"].items():
            if "write" not in job["permissions"].values():
                continue
            assert job["runs-on"] == "ubuntu-latest", f"{path.name}/{job_id}"
            assert not any(
                str(s.get("uses", "")).startswith("actions/checkout@") and "ref" in s.get("with", {})
                for s in job["steps"]
            ), f"{path.name}/{job_id}: checks out another ref"
            scripts = "\n".join(s.get("run", "") for s in job.get("steps", []))
            assert not re.search(r"^\s*attn-gate |setup\.sh|\.venv|pip install|python", scripts, re.MULTILINE), (
                f"{path.name}/{job_id}"
            )


def test_gate_runs_only_vetted_commits_on_the_gpu_group():
    doc = workflow("gate.yml")
    # main's copy, dispatched with the vetted PR and commit, or the merge queue; no pull_request, no push
    assert set(doc["on"]) == {"workflow_dispatch", "merge_group"}
    inputs = doc["on"]["workflow_dispatch"]["inputs"]
    assert {k: (v["required"], v["type"]) for k, v in inputs.items()} == {
        "pr": (True, "string"),
        "sha": (True, "string"),
    }
    assert doc["run-name"].endswith(
        "format('attn-gate PR #{0} at {1}', inputs.pr, inputs.sha) }}"
    )  # report.yml reads it
    assert "concurrency" not in doc  # job-level, keyed on the maintainer's PR number or the run id
    assert doc["jobs"]["gate"]["concurrency"] == {
        "group": "gate-${{ inputs.pr || github.run_id }}",
        "cancel-in-progress": True,
    }
    steps = doc["jobs"]["gate"]["steps"]
    checkout = next(s for s in steps if str(s.get("uses", "")).startswith("actions/checkout@"))
    assert (
        checkout["with"]["ref"]
        == "${{ github.event_name == 'merge_group' && github.sha || format('refs/pull/{0}/head', inputs.pr) }}"
    )
    ids = [s.get("id") for s in steps]
    assert ids.index("inputs") < steps.index(checkout) < ids.index("commit") < ids.index("setup")  # verified before use
    job = doc["jobs"]["gate"]
    assert runner_groups(job["runs-on"]) == {GPU_GROUP}
    assert default_runner_labels(job["runs-on"]) == GPU_DEFAULT_LABELS
    assert "vars.ATTN_GATE_RUNNER" in job["runs-on"]["labels"]
    assert "if" not in job and "environment" not in job
    assert "pull-request/" not in GATE_TEXT()  # no branch route left
    gate_step = next(s for s in job["steps"] if s.get("id") == "gate")
    assert "attn-gate check" in gate_step["run"] and "--no-progress" not in gate_step["run"]
    uploads = {
        s["with"]["name"]: s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact@")
    }
    assert set(uploads) == {"gate-summary", "gate-results"}
    assert all(u["if"] == "${{ !cancelled() }}" for u in uploads.values())  # uploaded when the gate fails too


def GATE_TEXT() -> str:
    return (WORKFLOWS / "gate.yml").read_text()


def test_no_workflow_passes_no_progress():
    """Non-TTY progress is a plain line every few seconds with the time left; workflow logs keep it."""
    assert [p.name for p in WORKFLOW_FILES if "--no-progress" in p.read_text()] == []


def test_self_hosted_jobs_require_the_guard_and_are_grouped():
    """Every self-hosted job starts by checking that the runner guard ran (the guard itself checks
    the event, the workflow@ref and the canary), ignores the user site, and runs in a runner group:
    main's trusted jobs only on the trusted group, with hash-locked installs and no pip cache; the
    PR gate on the GPU group; nothing restores a cache; no variable relaxes any check."""
    guard_step = workflow("gate.yml")["jobs"]["gate"]["steps"][0]
    seen = {}
    for name, job_id, job in self_hosted_jobs():
        first = job["steps"][0]
        assert first["id"] == "guard" and first["run"] == guard_step["run"], f"{name}/{job_id}"
        assert job["env"]["PYTHONNOUSERSITE"] == "1", f"{name}/{job_id}"
        assert "PERSISTENT_RUNNER_ACCEPTED" not in json.dumps(job), f"{name}/{job_id}"
        names = [s.get("name") for s in job["steps"]]
        assert names.index("Check that the venv ignores the user site") < names.index("Check that torch sees the GPU")
        seen[f"{name}/{job_id}"] = runner_groups(job["runs-on"])
        setup = next(s for s in job["steps"] if s.get("id") == "setup")["run"]
        # every GPU job, the PR gate too: what the vetted commit installs is its hash-locked list,
        # never what the index resolves at run time (no pip upgrade, no resolver)
        assert setup == "bash scripts/setup.sh --locked", f"{name}/{job_id}"
        if TRUSTED_GROUP in seen[f"{name}/{job_id}"]:
            assert job["env"]["PIP_NO_CACHE_DIR"] == "1", f"{name}/{job_id}"
            assert "github.ref == 'refs/heads/main'" in job["if"], f"{name}/{job_id}"  # the guard refuses the rest
    assert seen == {
        "baselines.yml/update": {TRUSTED_GROUP},
        "bisect.yml/bisect": {TRUSTED_GROUP},
        "gate.yml/gate": {GPU_GROUP},
        "nightly.yml/shard": {TRUSTED_GROUP},
        "nightly.yml/verdict": {TRUSTED_GROUP},
        "publish.yml/bench": {TRUSTED_GROUP},
        "selftest.yml/selftest": {TRUSTED_GROUP},
    }
    assert not any("actions/cache" in p.read_text() for p in WORKFLOW_FILES)


def test_trusted_lock_is_hash_pinned_and_matches_its_input():
    """.ci/requirements-trusted.txt (uv pip compile --generate-hashes) pins every package to one
    version with hashes, holds every name of its input, and the input holds attn-gate's runtime
    dependencies but torch (the runner's own)."""
    lock = (ROOT / ".ci" / "requirements-trusted.txt").read_text()
    entries = re.split(
        r"\n(?=[A-Za-z0-9])", "\n".join(line for line in lock.splitlines() if not line.lstrip().startswith("#")).strip()
    )
    pinned = {}
    for entry in entries:
        m = re.match(r"^([A-Za-z0-9_.-]+)==([^\s;\\]+)", entry)
        assert m and "--hash=sha256:" in entry, f"not pinned with a hash: {entry[:80]}"
        pinned[m[1].lower().replace("_", "-")] = m[2]
    wanted = [
        re.split(r"[<>=!~;\s]", line)[0].lower()
        for line in (ROOT / ".ci" / "requirements-trusted.in").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert set(wanted) <= set(pinned), set(wanted) - set(pinned)
    project = __import__("tomllib").loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    runtime = {re.split(r"[<>=!~;\s]", d)[0].lower() for d in project} - {"torch"}
    assert runtime | {"setuptools"} == set(wanted)
    assert "torch" not in pinned and "nvidia-cudnn-cu12" not in pinned
    from packaging.requirements import Requirement

    for line in (ROOT / ".ci" / "requirements-trusted.in").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            assert req.specifier.contains(pinned[req.name.lower()]), f"{req} vs {pinned[req.name.lower()]}"


def test_self_hosted_labels_are_declared_for_actionlint():
    declared = set(yaml.safe_load((ROOT / ".github" / "actionlint.yaml").read_text())["self-hosted-runner"]["labels"])
    used = set()
    for _, _, job in self_hosted_jobs():
        used |= set(default_runner_labels(job["runs-on"])) - {"self-hosted", "linux", "x64"}
    assert used == {"gpu", "h200"} and used <= declared


def test_variables_read_are_declared_for_actionlint():
    declared = set(yaml.safe_load((ROOT / ".github" / "actionlint.yaml").read_text())["config-variables"])
    used = set()
    for path in WORKFLOW_FILES:
        used |= set(re.findall(r"vars\.([A-Z_]+)", path.read_text()))
    assert used == declared


def test_vet_runs_from_the_default_branch_and_checks_out_nothing():
    doc = workflow("vet.yml")
    assert doc["on"] == {"issue_comment": {"types": ["created"]}}  # always the default branch's file
    job = doc["jobs"]["vet"]
    assert job["runs-on"] == "ubuntu-latest"
    assert [s["uses"].split("@")[0] for s in job["steps"]] == ["actions/github-script"]
    assert job["if"] == "github.event.issue.pull_request && startsWith(github.event.comment.body, '/attn-gate run')"


def test_report_reads_only_the_small_artifact_without_running_pr_code():
    doc = workflow("report.yml")
    assert doc["on"] == {"workflow_run": {"workflows": [workflow("gate.yml")["name"]], "types": ["completed"]}}
    steps = doc["jobs"]["report"]["steps"]
    assert not any(str(s.get("uses", "")).startswith("actions/checkout@") for s in steps)
    assert not any("run" in s for s in steps)  # nothing from the artifact reaches a shell
    download = steps[1]
    assert download["if"] == "steps.run.outputs.artifact-id != ''"  # only after the size check
    assert download["with"]["artifact-ids"] == "${{ steps.run.outputs.artifact-id }}"
    assert download["with"]["run-id"] == "${{ github.event.workflow_run.id }}"
    assert "name" not in download["with"]


def test_publish_keeps_history_and_deploys_pages():
    doc = workflow("publish.yml")
    assert set(doc["on"]) == {"push", "schedule", "workflow_dispatch"}
    assert doc["on"]["push"] == {"branches": ["main"]}
    assert doc["concurrency"]["cancel-in-progress"] is False
    bench = doc["jobs"]["bench"]
    history = next(s for s in bench["steps"] if s.get("id") == "history")
    assert history["with"]["ref"] == "asv-results"
    runs = "\n".join(s.get("run", "") for s in bench["steps"])
    assert "attn-gate bench" in runs and "attn-gate publish" in runs
    assert ".asv-history/selftest/latest/" in runs  # the self-test report beside asv's site
    assert doc["jobs"]["deploy"]["environment"]["name"] == "github-pages"


def test_ci_runs_the_same_command_as_ci_run():
    steps = workflow("ci.yml")["jobs"]["tests"]["steps"]
    assert [s["run"] for s in steps if "run" in s] == ["bash .ci/run"]
    assert (ROOT / ".ci" / "run").exists()


def test_nightly_shards_then_merges_and_checks():
    """The iso branch's contract: sweep --shard K/N --out, merge DIR... --out, check --results."""
    doc = workflow("nightly.yml")
    assert set(doc["on"]) == {"schedule", "workflow_dispatch"}
    shard, verdict = doc["jobs"]["shard"], doc["jobs"]["verdict"]
    shards = shard["strategy"]["matrix"]["shard"]
    assert shards == list(range(1, len(shards) + 1)) and shard["env"]["SHARDS"] == str(len(shards))
    assert shard["strategy"]["fail-fast"] is False
    sweep = next(s for s in shard["steps"] if s.get("id") == "sweep")["run"]
    assert re.search(
        r'attn-gate sweep --suite nightly --shard "\$SHARD/\$SHARDS" --device "\$ATTN_GATE_DEVICE" --out "\$out"', sweep
    )
    upload = next(s for s in shard["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact@"))
    assert upload["with"]["name"] == "nightly-shard-${{ matrix.shard }}"
    assert verdict["needs"] == "shard" and verdict["if"] == "${{ !cancelled() && github.ref == 'refs/heads/main' }}"
    download = next(s for s in verdict["steps"] if str(s.get("uses", "")).startswith("actions/download-artifact@"))
    assert download["with"]["pattern"] == "nightly-shard-*"
    merge = next(s for s in verdict["steps"] if "attn-gate merge" in s.get("run", ""))["run"]
    assert f"-ne {len(shards)} ]" in merge  # a missing shard fails closed, not a smaller suite judged
    assert merge.index("attn-gate merge") < merge.index("attn-gate check --results")


def test_nightly_times_its_speed_cases_and_gates_them_in_the_check():
    """Speed in the nightly is a gate: perf's files go to the check, and a perf run that timed
    nothing fails the job after the correctness verdict is written."""
    step = next(s for s in workflow("nightly.yml")["jobs"]["verdict"]["steps"] if s.get("id") == "check")["run"]
    perf = 'attn-gate perf --suite nightly --device "$ATTN_GATE_DEVICE" --out "$out/perf" || perf_rc=$?'
    assert perf in step and 'speed=(--perf-results "$out"/perf/perf-*.json)' in step
    check = 'attn-gate check --results "${results[0]}" "${speed[@]}" --device "$ATTN_GATE_DEVICE" --out "$out"'
    assert step.index("attn-gate merge") < step.index(perf) < step.index(check)
    assert 'if [ "$perf_rc" -le 1 ]; then' in step  # exit 1 (an errored case) is judged by the check
    tail = step[step.index(check) :]
    assert 'if [ "$perf_rc" -gt 1 ]; then' in tail and "exit 1" in tail  # nothing timed: fail closed


def test_selftest_reports_on_the_run_page_and_beside_the_history():
    """The selftest branch's contract: selftest --out DIR writes DIR/selftest.md and .json, exit 0 only if all killed."""
    doc = workflow("selftest.yml")
    assert set(doc["on"]) == {"schedule", "workflow_dispatch"}
    assert doc["on"]["schedule"][0]["cron"].split()[2:] == ["*", "*", "1"]  # weekly
    job, history = doc["jobs"]["selftest"], doc["jobs"]["history"]
    step = next(s for s in job["steps"] if s.get("id") == "selftest")["run"]
    assert 'attn-gate selftest --device "$ATTN_GATE_DEVICE" --out "$out"' in step
    assert '"$out/selftest.md" >> "$GITHUB_STEP_SUMMARY"' in step and 'exit "$status"' in step
    assert history["needs"] == "selftest" and "github.ref == 'refs/heads/main'" in history["if"]
    push = history["steps"][-1]["run"]
    assert "selftest/latest/" in push and "asv-results" in push


# ---- the guard check and the user-site check, run for real -------------------------------------


def guard_check(env: dict[str, str]) -> subprocess.CompletedProcess:
    step = workflow("gate.yml")["jobs"]["gate"]["steps"][0]["run"]
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_guard_check_fails_on_a_runner_without_the_guard(tmp_path):
    from tests import test_runner_guard as g

    bare = guard_check({"HOME": "/home/runner", "RUNNER_TEMP": str(tmp_path / "runner-temp")})
    assert bare.returncode == 1 and "::error::this runner has no attn-gate guard" in bare.stdout
    r, values = g.run_guard(tmp_path, g.write_config(tmp_path))  # the hook, as the runner runs it first
    assert r.returncode == 0, r.stdout + r.stderr
    guarded = guard_check({**values, "RUNNER_TEMP": str(tmp_path / "runner-temp")})
    assert guarded.returncode == 0 and "runner guard ran (group attn-gate-gpu)" in guarded.stdout
    moved = guard_check({**values, "RUNNER_TEMP": str(tmp_path / "runner-temp"), "HOME": "/home/runner"})
    assert moved.returncode == 1  # a HOME that outlives the job is refused too


def test_setup_builds_the_venv_on_the_interpreter_the_guard_vouched_for(tmp_path):
    """scripts/setup.sh takes ATTN_GATE_PYTHON (the guard writes it to $GITHUB_ENV), not the first
    python3 on PATH, and not PYTHON when both are set."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    log = tmp_path / "calls"
    for name in ("vouched", "python3", "other"):
        fake = tmp_path / "bin" / name
        fake.parent.mkdir(exist_ok=True)
        fake.write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\nexit 1\n')
        fake.chmod(0o755)
    env = {
        "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin",
        "ATTN_GATE_PYTHON": str(tmp_path / "bin" / "vouched"),
        "PYTHON": str(tmp_path / "bin" / "other"),
    }
    r = subprocess.run(
        ["bash", "scripts/setup.sh", "--locked"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode != 0 and log.read_text().splitlines() == ["vouched -m venv --system-site-packages .venv"]


def test_the_venv_ignores_the_user_site_only_with_the_job_env():
    step = next(
        s
        for s in workflow("gate.yml")["jobs"]["gate"]["steps"]
        if s.get("name") == "Check that the venv ignores the user site"
    )["run"]
    step = step.replace(". .venv/bin/activate", interpreter_path_prefix())  # whichever venv runs the tests
    base = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONNOUSERSITE"}
    probe = subprocess.run(
        [sys.executable, "-c", "import site; print(site.ENABLE_USER_SITE)"], env=base, capture_output=True, text=True
    )
    if probe.stdout.strip() != "True":  # scripts/setup.sh's venv sees system site-packages, so it does
        pytest.skip(
            "this interpreter never loads the user site (a venv without --system-site-packages): "
            "the step's failure branch cannot be shown here"
        )
    with_env = subprocess.run(
        ["bash", "-eo", "pipefail", "-c", step],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**base, "PYTHONNOUSERSITE": workflow("gate.yml")["jobs"]["gate"]["env"]["PYTHONNOUSERSITE"]},
    )
    assert with_env.returncode == 0 and "user site off" in with_env.stdout, with_env.stdout + with_env.stderr
    without = subprocess.run(
        ["bash", "-eo", "pipefail", "-c", step], cwd=ROOT, capture_output=True, text=True, env=base
    )
    assert without.returncode == 1 and "loads the user site" in without.stderr  # the venv has --system-site-packages


# ---- baselines.yml: the input validation step, run for real ----------------------------------


def run_validation(suite: str, kernel: str) -> int:
    step = next(s for s in workflow("baselines.yml")["jobs"]["update"]["steps"] if s.get("id") == "validate")
    r = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
        env={"PATH": "/usr/bin:/bin", "SUITE": suite, "KERNEL": kernel},
        capture_output=True,
        text=True,
        timeout=30,
    )
    return r.returncode


@pytest.mark.parametrize(
    "suite,kernel",
    [
        ("", ""),
        ("pr", "sdpa-flash"),
        ("nightly", "fa4"),
        ("my_suite-2", "mypkg.kernels:attn_fwd"),
    ],
)
def test_baseline_inputs_accepted(suite, kernel):
    assert run_validation(suite, kernel) == 0


@pytest.mark.parametrize(
    "suite,kernel",
    [
        ("pr; rm -rf ~", ""),
        ("$(id)", ""),
        ("--help", ""),
        ("pr\nnightly", ""),
        ("", "sdpa-flash `id`"),
        ("", "-x"),
        ("", "a:b:c"),
        ("", "pkg.mod:fn --out /etc"),
        ("", "../../x"),
    ],
)
def test_baseline_inputs_rejected(suite, kernel):
    assert run_validation(suite, kernel) == 2


def test_baseline_update_pushes_a_branch_and_never_opens_a_pr_with_github_token():
    jobs = workflow("baselines.yml")["jobs"]
    assert set(workflow("baselines.yml")["on"]) == {"workflow_dispatch"}
    assert "attn-gate baseline update" in "\n".join(s.get("run", "") for s in jobs["update"]["steps"])
    branch = jobs["branch"]
    assert branch["needs"] == "update" and "pull-requests" not in branch["permissions"]
    push = next(s for s in branch["steps"] if s.get("id") == "push")
    assert "/compare/" in push["run"] and "gh pr" not in push["run"]
    # the optional PR is opened with the GitHub App's token, never github.token
    app = next(s for s in branch["steps"] if s.get("id") == "app-token")
    assert "vars.ATTN_GATE_APP_CLIENT_ID != ''" in app["if"]
    opener = next(s for s in branch["steps"] if "gh pr create" in s.get("run", ""))
    assert opener["env"]["GH_TOKEN"] == "${{ steps.app-token.outputs.token }}"
    assert opener["if"] == "steps.app-token.outcome == 'success'"


def test_ci_docs_enable_no_token_self_approval_and_no_push_route():
    docs = (ROOT / "docs" / "ci.md").read_text()
    assert "Allow GitHub Actions to create and approve pull requests" in docs  # named, to say: leave it off
    assert "Tick *Allow GitHub Actions" not in docs
    assert re.search(r"leave[^.\n]*off|stays off|keep[^.\n]*off", docs, re.IGNORECASE)
    assert "ephemeral" in docs.lower() and "recommended" not in docs.lower()
    for path in (ROOT / "README.md", ROOT / "docs" / "ci.md"):  # nobody is asked to push to pull-request/*
        assert not re.search(
            r"push[^\n]*refs/heads/pull-request|git push origin [^\n]*pull-request", path.read_text()
        ), path
    for needle in (
        "ACTIONS_RUNNER_HOOK_JOB_STARTED",
        "prevent self-review",
        "attn-gate-app",
        "re-imaged",
        "requirements-trusted.txt",
        "/attn-gate run <sha>",
    ):
        assert needle.lower() in docs.lower(), needle


def test_codeowners_cover_what_decides_a_verdict():
    owners = (ROOT / ".github" / "CODEOWNERS").read_text()
    rules = dict(line.split(None, 1) for line in owners.splitlines() if line.strip() and not line.startswith("#"))
    assert list(rules)[0] == "*"  # a default owner: nothing is unowned, a new folder included
    assert set(rules) == {
        "*",
        "/.github/",
        "/.ci/",
        "/gate/",
        "/tests/",
        "/benchmarks/",
        "/baselines/",
        "/scripts/",
        "/pyproject.toml",
        "/asv.conf.json",
        "/setup.py",
        "/setup.cfg",
        "/conftest.py",
        "/requirements*",
    }
    assert len(set(rules.values())) == 1 and all(owner.strip().startswith("@") for owner in rules.values())
    # report.yml warns about the same paths
    sensitive = re.search(r"const SENSITIVE = \[(.*?)\];", (WORKFLOWS / "report.yml").read_text())[1]
    assert {p.strip(" '") for p in sensitive.split(",")} == {r.lstrip("/") for r in rules if r != "*"}


# ---- vet.yml's and report.yml's scripts under node, against a fake GitHub API ----------------

NODE_DRIVER = r"""
const fs = require('fs');
const script = fs.readFileSync(process.argv[2], 'utf8');
const s = JSON.parse(fs.readFileSync(process.argv[3], 'utf8'));
const calls = [];
const record = (name, result) => async (args) => {
  calls.push([name, args]);
  if ((s.fail || {})[name]) { const e = new Error(s.fail[name].message); e.status = s.fail[name].status; throw e; }
  return { data: typeof result === 'function' ? result(args) : result };
};
const notFound = () => { const e = new Error('Not Found'); e.status = 404; throw e; };
const core = {
  setFailed: (m) => calls.push(['setFailed', m]),
  warning: (m) => calls.push(['warning', m]),
  info: (m) => calls.push(['info', m]),
  setOutput: (k, v) => calls.push(['setOutput', k, v]),
};
const github = {
  rest: {
    pulls: {
      get: record('pulls.get', ({ pull_number }) => {
        const pr = s.prs[String(pull_number)];
        return Array.isArray(pr) ? (pr.length > 1 ? pr.shift() : pr[0]) : (pr || notFound());
      }),
      listFiles: 'pulls.listFiles',
    },
    repos: {
      getCollaboratorPermissionLevel: record('repos.getCollaboratorPermissionLevel',
        ({ username }) => s.permissions[username] || notFound()),
      createCommitStatus: record('repos.createCommitStatus', {}),
    },
    git: { updateRef: record('git.updateRef', {}), createRef: record('git.createRef', {}) },
    actions: { createWorkflowDispatch: record('actions.createWorkflowDispatch', {}), listWorkflowRunArtifacts: 'artifacts' },
    issues: {
      listComments: 'comments',
      updateComment: record('issues.updateComment', {}),
      createComment: record('issues.createComment', { id: 99 }),
    },
  },
  paginate: async (fn, args) => { calls.push(['paginate', fn, args]); return s.lists[fn] || []; },
};
const context = { payload: s.payload, repo: { owner: 'o', repo: 'r' } };
// as actions/github-script calls the script: the body of an async function of these names
const AsyncFunction = Object.getPrototypeOf(async function () {}).constructor;
new AsyncFunction('require', 'github', 'context', 'core', script)(require, github, context, core)
  .then(() => console.log(JSON.stringify(calls)))
  .catch((e) => { console.log(JSON.stringify([...calls, ['threw', String(e)]])); });
"""

SHA, OTHER = "a" * 40, "b" * 40
BOT = {"login": "github-actions[bot]", "type": "Bot"}


def script_of(name: str, job: str, index: int) -> str:
    step = workflow(name)["jobs"][job]["steps"][index]
    assert step["uses"].startswith("actions/github-script@")
    return step["with"]["script"]


def run_node(tmp_path: Path, script: str, scenario: dict, env: dict[str, str] | None = None) -> list:
    node = require("node", "the workflows' github-script steps run under it: apt-get install nodejs")
    (tmp_path / "script.js").write_text(script)
    (tmp_path / "driver.js").write_text(NODE_DRIVER)
    scenario = {"prs": {}, "permissions": {}, "lists": {}, "fail": {}, **scenario}
    (tmp_path / "scenario.json").write_text(json.dumps(scenario))
    r = subprocess.run(
        [node, str(tmp_path / "driver.js"), str(tmp_path / "script.js"), str(tmp_path / "scenario.json")],
        env={"PATH": "/usr/bin:/bin", **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def subdir(tmp_path: Path, name: str) -> Path:
    (tmp_path / name).mkdir()
    return tmp_path / name


def named(calls, *names):
    return [c for c in calls if c[0] in names]


# vet.yml: a comment on PR 7 whose head is SHA; the fork context (head repo another) as GitHub sends it

FORK_PR = {
    "number": 7,
    "state": "open",
    "head": {"sha": SHA, "repo": {"full_name": "mallory/r"}},
    "base": {"repo": {"full_name": "o/r"}},
}


def vet(tmp_path, body: str, login: str = "maint", permissions=None, pr=None, fail=None) -> list:
    payload = {
        "repository": {"full_name": "o/r", "default_branch": "main"},
        "issue": {"number": 7, "pull_request": {"url": "https://api.github.com/repos/o/r/pulls/7"}},
        "comment": {
            "body": body,
            "user": {"login": login},
            "author_association": "OWNER" if login == "owner-but-read" else "NONE",
        },
    }
    perms = (
        permissions
        if permissions is not None
        else {
            "maint": {"permission": "write", "role_name": "maintain"},
            "writer": {"permission": "write", "role_name": "write"},
            "reader": {"permission": "read", "role_name": "read"},
            "triager": {"permission": "read", "role_name": "triage"},
            "owner-but-read": {"permission": "read", "role_name": "read"},
        }
    )
    return run_node(
        tmp_path,
        script_of("vet.yml", "vet", 0),
        {"payload": payload, "permissions": perms, "prs": {"7": pr or FORK_PR}, "fail": fail or {}},
    )


VET_WRITES = (
    "git.updateRef",
    "git.createRef",
    "repos.createCommitStatus",
    "actions.createWorkflowDispatch",
)  # the first two: never


@pytest.mark.parametrize("login", ["maint", "writer"])
def test_vet_hands_a_maintainers_sha_of_a_fork_pr_to_mains_gate(tmp_path, login):
    calls = vet(tmp_path, f"/attn-gate run {SHA}\n", login=login)
    assert [c[0] for c in named(calls, *VET_WRITES)] == ["repos.createCommitStatus", "actions.createWorkflowDispatch"]
    status = named(calls, "repos.createCommitStatus")[0][1]
    assert (status["sha"], status["state"], status["context"]) == (SHA, "pending", "attn-gate/gpu")
    # main's gate.yml, told which PR and commit: no branch is written, whatever the PR changed
    assert named(calls, "actions.createWorkflowDispatch")[0][1] == {
        "owner": "o",
        "repo": "r",
        "workflow_id": "gate.yml",
        "ref": "main",
        "inputs": {"pr": "7", "sha": SHA},
    }
    assert not named(calls, "setFailed") and f"Vetted {SHA}" in named(calls, "issues.createComment")[0][1]["body"]


def test_vet_dispatches_a_commit_that_changes_workflows_the_same_way(tmp_path):
    """No push route: main's gate.yml runs it; the report warns that the PR changes .github/."""
    text = (WORKFLOWS / "vet.yml").read_text()
    assert "updateRef" not in text and "createRef" not in text and "git push" not in text
    calls = vet(tmp_path, f"/attn-gate run {SHA}")
    assert named(calls, "actions.createWorkflowDispatch")[0][1]["ref"] == "main"


@pytest.mark.parametrize("login", ["reader", "triager", "owner-but-read", "stranger"])
def test_vet_refuses_a_commenter_without_write_access(tmp_path, login):
    # owner-but-read: author_association says OWNER, the API says read; the API decides
    calls = vet(tmp_path, f"/attn-gate run {SHA}", login=login)
    assert named(calls, *VET_WRITES) == []
    assert named(calls, "repos.getCollaboratorPermissionLevel")[0][1]["username"] == login
    assert "needs write access" in named(calls, "issues.createComment")[0][1]["body"]
    assert named(calls, "setFailed")


def test_vet_refuses_a_stale_sha(tmp_path):
    calls = vet(tmp_path, f"/attn-gate run {OTHER}")  # reviewed an older head; the PR moved on
    assert named(calls, *VET_WRITES) == []
    body = named(calls, "issues.createComment")[0][1]["body"]
    assert "is not the head of this PR" in body and f"/attn-gate run {SHA}" in body


def test_vet_refuses_a_closed_pr(tmp_path):
    calls = vet(tmp_path, f"/attn-gate run {SHA}", pr={**FORK_PR, "state": "closed"})
    assert named(calls, *VET_WRITES) == [] and named(calls, "setFailed")


@pytest.mark.parametrize(
    "body",
    [
        f"/attn-gate run {SHA[:12]}",
        f"/attn-gate run {SHA.upper()}",
        "/attn-gate run",
        f"/attn-gate run {SHA} extra",
        f"/attn-gate run {SHA}\n/attn-gate run {OTHER}",
        "/attn-gate run main",
    ],
)
def test_vet_accepts_only_one_full_sha(tmp_path, body):
    calls = vet(tmp_path, body)
    assert named(calls, *VET_WRITES) == [] and not named(calls, "repos.getCollaboratorPermissionLevel")
    assert "Usage" in named(calls, "issues.createComment")[0][1]["body"]


# report.yml: main's gate.yml dispatched by vet.yml for fork PR 7 at SHA (main itself is at MAIN)

MAIN = "c" * 40
REPORT_PAYLOAD_REPO = {"full_name": "o/r", "default_branch": "main"}


def gate_run(**over) -> dict:
    return {
        "id": 55,
        "path": ".github/workflows/gate.yml",
        "event": "workflow_dispatch",
        "head_branch": "main",
        "head_sha": MAIN,
        "display_title": f"attn-gate PR #7 at {SHA}",
        "head_repository": {"full_name": "o/r"},
        "conclusion": "failure",
        "html_url": "https://example.invalid/run/55",
        **over,
    }


SMALL_ARTIFACT = [
    {"id": 901, "name": "gate-summary", "size_in_bytes": 2048, "expired": False},
    {"id": 902, "name": "gate-results", "size_in_bytes": 50_000_000, "expired": False},
]


def report_check(tmp_path, run: dict, prs=None, artifacts=SMALL_ARTIFACT) -> dict:
    calls = run_node(
        tmp_path,
        script_of("report.yml", "report", 0),
        {
            "payload": {"workflow_run": run, "repository": REPORT_PAYLOAD_REPO},
            "prs": prs if prs is not None else {"7": FORK_PR},
            "lists": {"artifacts": artifacts},
        },
    )
    outputs = {c[1]: c[2] for c in named(calls, "setOutput")}
    outputs["warnings"] = [c[1] for c in named(calls, "warning")]
    return outputs


def test_report_accepts_the_vetted_run_and_picks_the_small_artifact(tmp_path):
    out = report_check(tmp_path, gate_run())
    assert out == {
        "ok": "true",
        "pr": "7",
        "sha": SHA,
        "artifact-id": "901",
        "warnings": [],
    }  # the PR's commit, not main's
    merge = report_check(
        tmp_path,
        gate_run(
            event="merge_group",
            head_branch="gh-readonly-queue/main/pr-7-" + OTHER,
            head_sha=OTHER,
            display_title="attn-gate merge queue " + OTHER,
        ),
    )
    assert (
        merge["ok"] == "true" and merge["pr"] == "" and merge["sha"] == OTHER
    )  # the merge queue: a status, no comment


@pytest.mark.parametrize(
    "change,why",
    [
        ({"path": ".github/workflows/evil.yml"}, "not .github/workflows/gate.yml"),  # a workflow merely named gate
        ({"head_repository": {"full_name": "mallory/r"}}, "not o/r"),  # a fork's run
        ({"event": "pull_request"}, "never carries a vetted commit"),  # a fork's own pull_request workflow
        ({"event": "push"}, "never carries a vetted commit"),  # no push route any more
        ({"head_branch": "feature"}, "not main's copy"),  # a branch's edited gate.yml, dispatched by a writer
        ({"head_branch": "pull-request/7"}, "not main's copy"),
        ({"display_title": f"attn-gate PR #7 at {SHA} "}, 'not "attn-gate PR #<N> at <sha>"'),
        ({"display_title": f"attn-gate PR #7x at {SHA}"}, 'not "attn-gate PR #<N> at <sha>"'),
        ({"display_title": f"attn-gate PR #7 at {OTHER}"}, "a newer push?"),  # the PR moved on since the vetted run
        ({"event": "merge_group", "head_branch": "gh-readonly-queue/dev/x"}, "merge-group run"),
    ],
)
def test_report_refuses_a_run_that_is_not_the_vetted_gate(tmp_path, change, why):
    out = report_check(tmp_path, gate_run(**change))
    assert out["ok"] == "false" and "pr" not in out and "artifact-id" not in out
    assert any(why in w for w in out["warnings"]), out


def test_report_refuses_a_forged_pr_number(tmp_path):
    # a title naming PR 8 with PR 7's commit: PR 8's head is another commit, nothing goes to PR 8
    out = report_check(
        tmp_path,
        gate_run(display_title=f"attn-gate PR #8 at {SHA}"),
        prs={"7": FORK_PR, "8": {**FORK_PR, "number": 8, "head": {"sha": OTHER}}},
    )
    assert out["ok"] == "false"


def test_report_skips_an_oversized_summary_artifact(tmp_path):
    big = [{"id": 901, "name": "gate-summary", "size_in_bytes": 10_000_000, "expired": False}]
    out = report_check(tmp_path, gate_run(), artifacts=big)
    assert out["ok"] == "true" and "artifact-id" not in out and any("over" in w for w in out["warnings"])


def report_post(
    tmp_path, artifact: dict[str, str] | None, run=None, files=(), comments=(), pr="7", sha=SHA, prs=None
) -> list:
    results = tmp_path / "gate-summary"
    if artifact is not None:
        results.mkdir()
        for name, text in artifact.items():
            (results / name).write_text(text)
    scenario = {
        "payload": {"workflow_run": run or gate_run(), "repository": REPORT_PAYLOAD_REPO},
        "prs": prs if prs is not None else {"7": FORK_PR},
        "lists": {"pulls.listFiles": [{"filename": f} for f in files], "comments": list(comments)},
    }
    return run_node(
        tmp_path,
        script_of("report.yml", "report", 2),
        scenario,
        env={"RESULTS_DIR": str(results), "PR_NUMBER": pr, "GATED_SHA": sha},
    )


def comment_body(calls) -> str:
    [(_, args)] = named(calls, "issues.createComment", "issues.updateComment")
    return args["body"]


def test_report_sets_the_status_and_labels_pr_made_text(tmp_path):
    calls = report_post(
        tmp_path,
        {"summary.md": "## attn-gate check: PASS\n\nall good", "asv-compare.md": "### asv history (not the verdict)\n"},
    )
    [(_, status)] = named(calls, "repos.createCommitStatus")
    assert (status["sha"], status["state"], status["context"]) == (
        SHA,
        "failure",
        "attn-gate/gpu",
    )  # the run's conclusion
    body = comment_body(calls)
    assert body.startswith("<!-- attn-gate-report -->\n**attn-gate failed** on aaaaaaaaaaaa")
    # the PR-made "PASS" sits below the label, after the report's own verdict line, as literal text
    assert body.index("written by the PR's code") < body.index("```text\n## attn-gate check: PASS")
    assert "### asv history (not the verdict)" in body
    assert named(calls, "issues.createComment")[0][1]["issue_number"] == 7


def test_report_fences_pr_text_longer_than_its_longest_backtick_run(tmp_path):
    evil = "ok\n`````\n![badge](https://evil.invalid/pass.svg) [click](https://evil.invalid)\n``````\nend"
    body = comment_body(report_post(tmp_path, {"summary.md": evil}))
    made = body[body.index("written by the PR's code") :]
    fence = "`" * 7  # one longer than the 6-backtick run inside
    assert f"{fence}text\n" in made and made.rstrip().endswith(fence)
    inside = made[made.index(fence) + len(fence) : made.rindex(fence)]
    assert "![badge]" in inside  # shown as text, inside the fence, never rendered
    assert not re.search(r"^`{7,}", inside, re.MULTILINE)  # nothing inside can close the fence


@pytest.mark.parametrize(
    "evil",
    [
        "@someone",
        "&#64;someone",
        "&#x40;someone",
        "&commat;someone",
        "\uff20someone",
        "other/repo#12",
        "#12",
        "GH-12",
        "https://github.com/other/repo/issues/12",
    ],
)
def test_report_neutralises_mentions_and_references(tmp_path, evil):
    body = comment_body(report_post(tmp_path, {"summary.md": f"## attn-gate: FAIL\n\ncc {evil} please"}))
    made = body[body.index("## attn-gate: FAIL") :]
    assert evil not in made
    assert not re.search(r"(^|[^\w])@\w|&#|&commat;|#\d|GH-\d|github\.com/", made)


def test_report_flags_prs_that_touch_what_decides_the_verdict(tmp_path):
    body = comment_body(
        report_post(
            tmp_path,
            {"summary.md": "x"},
            files=[
                ".github/workflows/gate.yml",
                "gate/compare/rule.py",
                "baselines/h200/k.json",
                "tests/t.py",
                "README.md",
            ],
        )
    )
    warning = body[body.index("[!WARNING]") : body.index("[!NOTE]")]
    assert "`.github/`" in warning and "`gate/`" in warning and "`baselines/`" in warning and "`tests/`" in warning
    assert "README" not in warning and "Main's workflow files ran" in warning
    # true about what ran: the PR's own gate, tests and baselines produced the result, not "after merge"
    assert "produced this result" in warning and "changes to them run only after merge" not in warning
    assert "[!WARNING]" not in comment_body(
        report_post(subdir(tmp_path, "b"), {"summary.md": "x"}, files=["README.md", "kernels/x.py"])
    )
    body = comment_body(report_post(subdir(tmp_path, "c"), {"summary.md": "x"}, files=["requirements-dev.txt"]))
    assert "`requirements*`" in body[body.index("[!WARNING]") : body.index("[!NOTE]")]
    assert "[!WARNING]" not in comment_body(
        report_post(subdir(tmp_path, "d"), {"summary.md": "x"}, files=["docs/requirements.md"])
    )


@pytest.mark.parametrize(
    "text",
    ["&lt;" * 12500, "@a" * 25000, "#1" * 25000, "`" * 30000 + "x" + "`" * 20000, "&" * 20000 + "\U0001f600" * 15000],
    ids=["ampersands", "mentions", "references", "backtick runs", "astral"],
)
def test_report_caps_the_comment_after_escaping(tmp_path, text):
    """The summary is read capped (50,000 characters), then escaped: `&` becomes `&amp;`, a mention
    gains a zero-width space, a fence grows with the backtick runs inside. The body posted stays
    within GitHub's 65,536 (else the update fails and an older "passed" comment stays)."""
    body = comment_body(
        report_post(tmp_path, {"summary.md": text, "asv-compare.md": "&" * 12000}, files=[".github/workflows/gate.yml"])
    )
    assert len(body) <= 65536 and len(body.encode("utf-16-le")) // 2 <= 65536
    assert "(truncated; the full summary is in the run)" in body
    assert body.startswith("<!-- attn-gate-report -->\n**attn-gate failed**") and "[!WARNING]" in body
    assert not re.search(r"(^|[^\w])@\w|&#|#\d", body[body.index("[!NOTE]") :])


def test_report_treats_over_3000_changed_files_as_sensitive(tmp_path):
    files = [f"kernels/k{i}.py" for i in range(3000)]  # all the API lists; the rest is unseen
    body = comment_body(report_post(tmp_path, {"summary.md": "x"}, files=files))
    warning = body[body.index("[!WARNING]") : body.index("[!NOTE]")]
    assert "over 3000 files" in warning and "`.github/`" in warning


def test_report_rechecks_the_head_before_each_write(tmp_path):
    moved = {"7": {**FORK_PR, "head": {"sha": OTHER}}}  # a push landed after the run check
    calls = report_post(tmp_path, {"summary.md": "x"}, prs=moved)
    assert named(calls, "repos.createCommitStatus", "issues.createComment", "issues.updateComment") == []
    assert any("moved to" in c[1] for c in named(calls, "warning"))
    # the head moves between the status and the comment: the status is written, the comment is not
    calls = report_post(subdir(tmp_path, "b"), {"summary.md": "x"}, prs={"7": [FORK_PR, moved["7"]]})
    assert named(calls, "repos.createCommitStatus") and not named(calls, "issues.createComment", "issues.updateComment")


def test_report_updates_its_own_comment_not_someone_elses(tmp_path):
    comments = [
        {"id": 1, "user": {"login": "mallory", "type": "User"}, "body": "<!-- attn-gate-report -->\nfake"},
        {"id": 2, "user": BOT, "body": "<!-- attn-gate-report -->\nold"},
    ]
    calls = report_post(tmp_path, {"summary.md": "## attn-gate check: PASS"}, comments=comments)
    [(kind, args)] = named(calls, "issues.createComment", "issues.updateComment")
    assert kind == "issues.updateComment" and args["comment_id"] == 2


def test_report_without_artifact_says_so(tmp_path):
    body = comment_body(report_post(tmp_path, None))
    assert "without a summary" in body


def test_report_reads_a_huge_summary_only_up_to_its_limit(tmp_path):
    body = comment_body(report_post(tmp_path, {"summary.md": "x" * 1_000_000, "asv-compare.md": "y" * 1_000_000}))
    assert len(body) < 65536 and body.count("truncated") == 2


def test_report_refuses_a_symlinked_summary(tmp_path):
    (tmp_path / "gate-summary").mkdir()
    (tmp_path / "secret").write_text("TOKEN=abc")
    (tmp_path / "gate-summary" / "summary.md").symlink_to(tmp_path / "secret")
    body = comment_body(report_post(tmp_path, None))
    assert "TOKEN" not in body and "without a summary" in body


def test_report_merge_queue_sets_the_status_only(tmp_path):
    run = gate_run(event="merge_group", head_branch="gh-readonly-queue/main/x", head_sha=OTHER, conclusion="success")
    calls = report_post(tmp_path, {"summary.md": "x"}, run=run, pr="", sha=OTHER)
    status = named(calls, "repos.createCommitStatus")[0][1]
    assert status["state"] == "success" and status["sha"] == OTHER
    assert named(calls, "issues.createComment", "issues.updateComment") == []


def test_every_gpu_job_refuses_to_run_without_a_gpu():
    """A GPU runner whose torch sees no GPU would gate (or baseline, or benchmark) the CPU instead."""
    for name, job_id, job in self_hosted_jobs():
        assert job["env"]["ATTN_GATE_DEVICE"] == "${{ vars.ATTN_GATE_DEVICE || 'cuda' }}", f"{name}/{job_id}"
        names = [s.get("name", "") for s in job["steps"]]
        first_use = next(
            i for i, s in enumerate(job["steps"]) if re.search(r"^\s*attn-gate \w", s.get("run", ""), re.MULTILINE)
        )
        assert names.index("Check that torch sees the GPU") < first_use, f"{name}/{job_id}"
        gpu_runs = [
            s["run"]
            for s in job["steps"]
            if re.search(r"attn-gate (check|bench|baseline|sweep|selftest|bisect)", s.get("run", ""))
        ]
        assert gpu_runs and all('--device "$ATTN_GATE_DEVICE"' in r for r in gpu_runs), f"{name}/{job_id}"
