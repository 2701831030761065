"""The GitHub workflows are correct and safe: schema-valid, zero zizmor findings, and the project's
own rules (pinned actions, no expressions in scripts, least privilege, fork safety) that a linter
alone does not state. Each rule is a small function shown failing on a bad workflow and passing
on ours; report.yml's comment script runs under node against a fake GitHub API.
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

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
WORKFLOW_FILES = sorted(WORKFLOWS.glob("*.yml"))
BIN = Path(sys.executable).parent
GPU_DEFAULT_LABELS = ["self-hosted", "linux", "gpu", "h200"]


def tool(name: str) -> str:
    """A console script of the test extra, next to this interpreter (the venv) or on PATH."""
    found = BIN / name if (BIN / name).exists() else shutil.which(name)
    assert found, f"{name} is not installed: `pip install -e '.[test]'` (scripts/setup.sh does it)"
    return str(found)


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
    """The label list of `fromJSON(vars.X || '[...]')`, or the literal list; None for hosted runners."""
    if isinstance(runs_on, list):
        return runs_on
    m = re.search(r"'(\[.*?\])'", str(runs_on))
    return json.loads(m[1]) if m else None


# ---- the rules fail on bad workflows ---------------------------------------------------------

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
"""


def test_rules_fail_a_bad_workflow():
    doc = yaml.safe_load(BAD_WORKFLOW)
    doc["on"] = doc.pop(True)
    assert unpinned_uses(BAD_WORKFLOW) == ["- uses: actions/checkout@v4"]
    # a SHA without its version comment, or a short SHA, is not pinned either
    assert unpinned_uses("- uses: actions/cache@5a3ec84eff668545956fd18022155c47e93e2684\n")
    assert unpinned_uses("- uses: actions/cache@5a3ec84 # v4.2.3\n")
    assert expressions_in_scripts(doc) == ["build: None"]
    assert dangerous_triggers(doc) == ["pull_request_target"]
    assert permission_problems(doc) == [
        "workflow: permissions must be {} (each job asks for what it needs)", "build: no permissions block"]
    assert checkouts_keeping_credentials(doc) == ["build: actions/checkout@v4"]


def test_schema_and_zizmor_fail_a_bad_workflow(tmp_path):
    bad = tmp_path / ".github" / "workflows"
    bad.mkdir(parents=True)
    (bad / "bad.yml").write_text(BAD_WORKFLOW)
    (bad / "invalid.yml").write_text("name: invalid\non: push\njobs:\n  build:\n    steps: []\n")
    schema = subprocess.run([tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows",
                             str(bad / "invalid.yml")], capture_output=True, text=True, timeout=120)
    assert schema.returncode != 0, schema.stdout  # a job with neither runs-on nor uses
    z = subprocess.run([tool("zizmor"), "--offline", "--format", "json", str(bad / "bad.yml")],
                       capture_output=True, text=True, timeout=120)
    found = {f["ident"] for f in json.loads(z.stdout)}
    assert z.returncode != 0
    assert {"dangerous-triggers", "template-injection", "unpinned-uses"} <= found, found


# ---- and pass on ours ------------------------------------------------------------------------

def test_the_five_workflows_exist():
    assert [p.name for p in WORKFLOW_FILES] == ["baselines.yml", "ci.yml", "gate.yml", "publish.yml", "report.yml"]


def test_workflows_match_the_github_workflow_schema():
    r = subprocess.run([tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows",
                        *map(str, WORKFLOW_FILES)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_zizmor_offline_finds_nothing():
    r = subprocess.run([tool("zizmor"), "--offline", "--format", "json", str(WORKFLOWS)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and json.loads(r.stdout) == [], r.stdout + r.stderr


@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=lambda p: p.name)
def test_project_rules_hold(path):
    doc = load(path)
    assert unpinned_uses(path.read_text()) == []
    assert expressions_in_scripts(doc) == []
    assert dangerous_triggers(doc) == []
    assert permission_problems(doc) == []
    assert checkouts_keeping_credentials(doc) == []
    for job_id, job in doc["jobs"].items():
        assert "timeout-minutes" in job, f"{path.name}/{job_id}: no timeout-minutes (a hung job holds its runner for 6 h)"


def test_each_action_is_pinned_to_one_sha_everywhere():
    pins: dict[str, set[str]] = {}
    for path in WORKFLOW_FILES:
        for line in path.read_text().splitlines():
            m = USES_LINE.match(line)
            if m:
                action, sha = m["ref"].split("@")
                pins.setdefault(action, set()).add(f"{sha} {VERSION_COMMENT.search(m['rest'])[0]}")
    assert {a: len(v) for a, v in pins.items() if len(v) != 1} == {}


def test_permissions_are_exactly_these():
    """Least privilege, written out: any new write permission must be added here on purpose."""
    got = {p.name: {j: job["permissions"] for j, job in load(p)["jobs"].items()} for p in WORKFLOW_FILES}
    assert got == {
        "baselines.yml": {"update": {"contents": "read"},
                          "pull-request": {"contents": "write", "pull-requests": "write"}},
        "ci.yml": {"tests": {"contents": "read"}},
        "gate.yml": {"fork-pr-blocked": {}, "gate": {"contents": "read"}},
        "publish.yml": {"bench": {"contents": "read"}, "history": {"contents": "write"},
                        "deploy": {"pages": "write", "id-token": "write"}},
        "report.yml": {"comment": {"actions": "read", "pull-requests": "write"}},
    }


def test_jobs_that_write_run_no_project_code_and_not_on_the_gpu_runner():
    for path in WORKFLOW_FILES:
        for job_id, job in load(path)["jobs"].items():
            if "write" not in job["permissions"].values():
                continue
            assert job["runs-on"] == "ubuntu-latest", f"{path.name}/{job_id}"
            scripts = "\n".join(s.get("run", "") for s in job.get("steps", []))
            assert not re.search(r"attn-gate |setup\.sh|\.venv|pip install|python", scripts), f"{path.name}/{job_id}"


def test_gate_runs_on_pull_requests_on_the_gpu_runner_read_only():
    doc = workflow("gate.yml")
    assert set(doc["on"]) == {"pull_request", "merge_group"}
    assert doc["concurrency"] == {"group": "gate-${{ github.event.pull_request.number || github.ref }}",
                                  "cancel-in-progress": True}
    job = doc["jobs"]["gate"]
    assert default_runner_labels(job["runs-on"]) == GPU_DEFAULT_LABELS
    assert "vars.ATTN_GATE_RUNNER" in job["runs-on"]
    gate_step = next(s for s in job["steps"] if s.get("id") == "gate")
    assert "attn-gate check" in gate_step["run"]
    upload = next(s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact@"))
    assert upload["if"] == "${{ !cancelled() }}"  # results are uploaded when the gate fails too
    assert upload["with"]["name"] == "gate-results"


FORK = "github.event.pull_request.head.repo.full_name != github.repository"
SAME_REPO = "github.event.pull_request.head.repo.full_name == github.repository"


def test_fork_prs_reach_the_gpu_runner_only_through_a_reviewed_environment():
    jobs = workflow("gate.yml")["jobs"]
    gate, blocked = jobs["gate"], jobs["fork-pr-blocked"]
    # the GPU job runs for a fork PR only when maintainers declared the review environment set up
    assert [term.strip() for term in gate["if"].split("||")] == [
        "github.event_name != 'pull_request'", SAME_REPO, "vars.ATTN_GATE_FORK_PRS == 'review'"]
    # and then in the environment whose required reviewers approve each run
    assert gate["environment"] == ("${{ (github.event_name == 'pull_request' && " + FORK
                                   + ") && 'gpu-fork-pr' || 'gpu' }}")
    # otherwise a hosted job fails, so a fork PR cannot go green by skipping the gate
    assert blocked["runs-on"] == "ubuntu-latest"
    assert FORK in blocked["if"] and "vars.ATTN_GATE_FORK_PRS != 'review'" in blocked["if"]
    assert "exit 1" in blocked["steps"][0]["run"]


def test_self_hosted_labels_are_declared_for_actionlint():
    declared = set(yaml.safe_load((ROOT / ".github" / "actionlint.yaml").read_text())["self-hosted-runner"]["labels"])
    used = set()
    for path in WORKFLOW_FILES:
        for job in load(path)["jobs"].values():
            labels = default_runner_labels(job["runs-on"])
            if labels and "self-hosted" in labels:
                used |= set(labels) - {"self-hosted", "linux", "x64"}
    assert used == {"gpu", "h200"} and used <= declared


def test_variables_read_are_declared_for_actionlint():
    declared = set(yaml.safe_load((ROOT / ".github" / "actionlint.yaml").read_text())["config-variables"])
    used = set()
    for path in WORKFLOW_FILES:
        used |= set(re.findall(r"vars\.([A-Z_]+)", path.read_text()))
    assert used == declared


def test_report_reads_the_gates_artifact_without_running_pr_code():
    doc = workflow("report.yml")
    assert doc["on"] == {"workflow_run": {"workflows": [workflow("gate.yml")["name"]], "types": ["completed"]}}
    steps = doc["jobs"]["comment"]["steps"]
    assert not any(str(s.get("uses", "")).startswith("actions/checkout@") for s in steps)
    assert not any("run" in s for s in steps)  # nothing from the artifact reaches a shell
    download = steps[0]
    assert download["with"]["name"] == "gate-results"
    assert download["with"]["run-id"] == "${{ github.event.workflow_run.id }}"


def test_publish_keeps_history_and_deploys_pages():
    doc = workflow("publish.yml")
    assert set(doc["on"]) == {"push", "schedule", "workflow_dispatch"}
    assert doc["on"]["push"] == {"branches": ["main"]}
    assert doc["concurrency"]["cancel-in-progress"] is False
    bench = doc["jobs"]["bench"]
    assert default_runner_labels(bench["runs-on"]) == GPU_DEFAULT_LABELS
    history = next(s for s in bench["steps"] if s.get("id") == "history")
    assert history["with"]["ref"] == "asv-results"
    runs = "\n".join(s.get("run", "") for s in bench["steps"])
    assert "attn-gate bench" in runs and "attn-gate publish" in runs
    assert doc["jobs"]["deploy"]["environment"]["name"] == "github-pages"


def test_ci_runs_the_same_command_as_ci_run():
    steps = workflow("ci.yml")["jobs"]["tests"]["steps"]
    assert [s["run"] for s in steps if "run" in s] == ["bash .ci/run"]
    assert (ROOT / ".ci" / "run").exists()


# ---- baselines.yml: the input validation step, run for real ----------------------------------

def run_validation(suite: str, kernel: str) -> int:
    step = next(s for s in workflow("baselines.yml")["jobs"]["update"]["steps"] if s.get("id") == "validate")
    r = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
                       env={"PATH": "/usr/bin:/bin", "SUITE": suite, "KERNEL": kernel},
                       capture_output=True, text=True, timeout=30)
    return r.returncode


@pytest.mark.parametrize("suite,kernel", [
    ("", ""), ("pr", "sdpa-flash"), ("nightly", "fa4"), ("my_suite-2", "mypkg.kernels:attn_fwd"),
])
def test_baseline_inputs_accepted(suite, kernel):
    assert run_validation(suite, kernel) == 0


@pytest.mark.parametrize("suite,kernel", [
    ("pr; rm -rf ~", ""), ("$(id)", ""), ("--help", ""), ("pr\nnightly", ""),
    ("", "sdpa-flash `id`"), ("", "-x"), ("", "a:b:c"), ("", "pkg.mod:fn --out /etc"), ("", "../../x"),
])
def test_baseline_inputs_rejected(suite, kernel):
    assert run_validation(suite, kernel) == 2


def test_baseline_update_opens_a_pr_from_a_job_that_can_write():
    jobs = workflow("baselines.yml")["jobs"]
    assert set(workflow("baselines.yml")["on"]) == {"workflow_dispatch"}
    assert "attn-gate baseline update" in "\n".join(s.get("run", "") for s in jobs["update"]["steps"])
    assert jobs["pull-request"]["needs"] == "update"
    assert "gh pr create" in jobs["pull-request"]["steps"][-1]["run"]
    assert "--body-file" in jobs["pull-request"]["steps"][-1]["run"]


# ---- report.yml's comment script under node, against a fake GitHub API -----------------------

NODE_DRIVER = r"""
const fs = require('fs');
const script = fs.readFileSync(process.argv[2], 'utf8');
const scenario = JSON.parse(fs.readFileSync(process.argv[3], 'utf8'));
const calls = [];
const core = {
  setFailed: (m) => calls.push(['setFailed', m]),
  warning: (m) => calls.push(['warning', m]),
  info: (m) => calls.push(['info', m]),
};
const github = {
  rest: {
    pulls: { get: async ({ pull_number }) => {
      calls.push(['pulls.get', pull_number]);
      const pr = scenario.prs[String(pull_number)];
      if (!pr) { const e = new Error('Not Found'); e.status = 404; throw e; }
      return { data: pr };
    } },
    issues: {
      listComments: 'listComments',
      updateComment: async (a) => { calls.push(['updateComment', a]); return { data: {} }; },
      createComment: async (a) => { calls.push(['createComment', a]); return { data: { id: 99 } }; },
    },
  },
  paginate: async (fn, args) => { calls.push(['paginate', fn, args.issue_number]); return scenario.comments; },
};
const context = { payload: { workflow_run: scenario.run }, repo: { owner: 'o', repo: 'r' } };
// as actions/github-script calls the script: the body of an async function of these names
const AsyncFunction = Object.getPrototypeOf(async function () {}).constructor;
new AsyncFunction('require', 'github', 'context', 'core', script)(require, github, context, core)
  .then(() => console.log(JSON.stringify(calls)))
  .catch((e) => { console.log(JSON.stringify([...calls, ['threw', String(e)]])); });
"""

SHA = "a" * 40
BOT = {"login": "github-actions[bot]", "type": "Bot"}


def report_script() -> str:
    step = workflow("report.yml")["jobs"]["comment"]["steps"][1]
    assert step["uses"].startswith("actions/github-script@")
    return step["with"]["script"]


def run_report(tmp_path, artifact: dict[str, str] | None, prs: dict, comments=(), run=None) -> list:
    node = shutil.which("node")
    assert node, "node is needed to run report.yml's github-script (apt-get install nodejs)"
    results = tmp_path / "gate-results"
    if artifact is not None:
        results.mkdir()
        for name, text in artifact.items():
            (results / name).write_text(text)
    run = run or {"head_sha": SHA, "conclusion": "failure", "html_url": "https://example.invalid/run/1",
                  "pull_requests": []}
    (tmp_path / "script.js").write_text(report_script())
    (tmp_path / "driver.js").write_text(NODE_DRIVER)
    (tmp_path / "scenario.json").write_text(json.dumps({"prs": prs, "comments": list(comments), "run": run}))
    r = subprocess.run([node, str(tmp_path / "driver.js"), str(tmp_path / "script.js"), str(tmp_path / "scenario.json")],
                       env={"PATH": "/usr/bin:/bin", "RESULTS_DIR": str(results)}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def writes(calls):
    return [c for c in calls if c[0] in ("createComment", "updateComment")]


def test_report_creates_one_comment_for_a_fork_pr(tmp_path):
    calls = run_report(tmp_path, {"pr-number": "7\n", "summary.md": "## attn-gate: FAIL\n\ncc @someone"},
                       prs={"7": {"number": 7, "head": {"sha": SHA}}})
    [(kind, args)] = writes(calls)
    assert kind == "createComment" and args["issue_number"] == 7
    body = args["body"]
    assert body.startswith("<!-- attn-gate-report -->\n**attn-gate failed** on aaaaaaaaaaaa")
    assert "## attn-gate: FAIL" in body and "@someone" not in body  # PR-made text pings nobody


def test_report_updates_its_own_comment_not_someone_elses(tmp_path):
    comments = [
        {"id": 1, "user": {"login": "mallory", "type": "User"}, "body": "<!-- attn-gate-report -->\nfake"},
        {"id": 2, "user": BOT, "body": "<!-- attn-gate-report -->\nold"},
    ]
    calls = run_report(tmp_path, {"pr-number": "7", "summary.md": "## attn-gate: PASS"},
                       prs={"7": {"number": 7, "head": {"sha": SHA}}}, comments=comments)
    [(kind, args)] = writes(calls)
    assert kind == "updateComment" and args["comment_id"] == 2


@pytest.mark.parametrize("claimed", ["7; rm -rf /", "0", "-1", "7.0", "1e3", "${{ github.token }}", "12345678901"])
def test_report_refuses_a_pr_number_that_is_not_one(tmp_path, claimed):
    calls = run_report(tmp_path, {"pr-number": claimed, "summary.md": "x"}, prs={"7": {"number": 7, "head": {"sha": SHA}}})
    assert writes(calls) == [] and not any(c[0] == "pulls.get" for c in calls)
    assert calls[-1][0] == "setFailed" and "not a PR number" in calls[-1][1]


def test_report_posts_nothing_when_the_pr_head_is_not_the_gated_commit(tmp_path):
    # a forged number (another PR) or a run superseded by a newer push
    calls = run_report(tmp_path, {"pr-number": "8", "summary.md": "## attn-gate: PASS"},
                       prs={"8": {"number": 8, "head": {"sha": "b" * 40}}})
    assert writes(calls) == [] and calls[-1][0] == "warning"


def test_report_without_artifact_says_so_on_a_same_repo_pr(tmp_path):
    run = {"head_sha": SHA, "conclusion": "failure", "html_url": "https://example.invalid/run/2",
           "pull_requests": [{"number": 5}]}
    calls = run_report(tmp_path, None, prs={"5": {"number": 5, "head": {"sha": SHA}}}, run=run)
    [(kind, args)] = writes(calls)
    assert kind == "createComment" and args["issue_number"] == 5
    assert "without a summary" in args["body"]


def test_report_truncates_a_huge_summary(tmp_path):
    calls = run_report(tmp_path, {"pr-number": "7", "summary.md": "x" * 100_000},
                       prs={"7": {"number": 7, "head": {"sha": SHA}}})
    [(_, args)] = writes(calls)
    assert len(args["body"]) < 65536 and "truncated" in args["body"]


def test_every_gpu_job_refuses_to_run_without_a_gpu():
    """A GPU runner whose torch sees no GPU would gate (or baseline, or benchmark) the CPU instead."""
    for path in WORKFLOW_FILES:
        for job_id, job in load(path)["jobs"].items():
            labels = default_runner_labels(job["runs-on"])
            if not labels or "gpu" not in labels:
                continue
            assert job["env"]["ATTN_GATE_DEVICE"] == "${{ vars.ATTN_GATE_DEVICE || 'cuda' }}", f"{path.name}/{job_id}"
            names = [s.get("name", "") for s in job["steps"]]
            first_use = next(i for i, s in enumerate(job["steps"])
                             if re.search(r"^\s*attn-gate \w", s.get("run", ""), re.MULTILINE))
            assert names.index("Check that torch sees the GPU") < first_use, f"{path.name}/{job_id}"
            gpu_runs = [s["run"] for s in job["steps"] if re.search(r"attn-gate (check|bench|baseline)", s.get("run", ""))]
            assert gpu_runs and all('--device "$ATTN_GATE_DEVICE"' in r for r in gpu_runs), f"{path.name}/{job_id}"
