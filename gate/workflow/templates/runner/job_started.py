"""attn-gate's runner guard: the self-hosted runner runs it before every job
(ACTIONS_RUNNER_HOOK_JOB_STARTED -> job_started.sh -> this file) and the job does not start unless
it exits 0.

It decides from what the runner itself provides, never from the workflow's YAML: the event name,
the event payload (GITHUB_EVENT_PATH), the workflow file and ref (GITHUB_WORKFLOW_REF), the
repository and ref. A `pull_request*` event, another repository, or a workflow@ref outside this
runner group's allow-list is refused, whatever `runs-on`, `if:` or `environment:` the YAML asks
for. Then the persistence canary: a marker left by an earlier job on this host means the host was
reused, and the job is refused. Last, the job's HOME, caches and pip settings are pointed into its
own $RUNNER_TEMP through $GITHUB_ENV, and ATTN_GATE_GUARD tells the job's first step that the guard ran.

Settings come from one JSON file whose path is an argument (job_started.sh fixes it), owned by
root like this file: the runner's job env does not reach hooks, and nothing here reads an
ATTN_GATE_* variable, so no repository or job variable can switch a check off.

Stdlib only, Python 3.8+: the runner host needs no attn-gate install. Also usable as a module:
`decide()` is the pure decision over (config, env, payload), tested with recorded payloads.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field

SCHEMA_VERSION = 1
REFUSED_EVENT_PREFIX = "pull_request"  # pull_request, _target, _review, _review_comment
WORKFLOW_REF = re.compile(r"^(?P<repo>[^/]+/[^/]+)/(?P<path>\.github/workflows/[^@]+)@(?P<ref>refs/\S+)$")
SAFE_LABEL = re.compile(r"[^A-Za-z0-9 ._/=@-]")  # no ":": a stored label never forms a "::command"
CONFIG_KEYS = {"schema_version", "repository", "group", "allow", "canary", "canary_sudo", "persistent_runner_accepted",
               "read_only_paths", "index_url"}
USED = 3  # --mark-canary's exit code for "this host already ran a job"
RULE_KEYS = {"workflow", "events", "ref", "ref_prefix", "inputs", "base_ref"}


class ConfigError(Exception):
    """The guard's settings file is wrong: the message names the key and the fix."""


@dataclass(frozen=True)
class Rule:
    workflow: str  # .github/workflows/NAME.yml
    events: tuple[str, ...]
    ref: str = ""  # exact ref the workflow file must come from ...
    ref_prefix: str = ""  # ... or a prefix (the merge queue's gh-readonly-queue/<base>/ branches)
    inputs: tuple[tuple[str, str], ...] = ()  # workflow_dispatch: no other inputs; each (absent: '') matches its regex
    base_ref: str = ""  # merge_group: the queue's target branch


@dataclass(frozen=True)
class Config:
    repository: str
    group: str
    allow: tuple[Rule, ...]
    canary: str = ""
    canary_sudo: str = ""  # e.g. /usr/bin/sudo: the marker is written by root, out of the job's reach
    persistent_runner_accepted: bool = False
    read_only_paths: tuple[str, ...] = ()
    index_url: str = "https://pypi.org/simple"


@dataclass
class Decision:
    allowed: bool
    reasons: list[str] = field(default_factory=list)  # why refused, or what matched
    warnings: list[str] = field(default_factory=list)


def parse_config(raw: dict) -> Config:
    if not isinstance(raw, dict):
        raise ConfigError("the settings file must hold one JSON object")
    unknown = set(raw) - CONFIG_KEYS
    if unknown:
        raise ConfigError(f"unknown keys {sorted(unknown)}; known: {sorted(CONFIG_KEYS)}")
    if raw.get("schema_version") != SCHEMA_VERSION:
        raise ConfigError(f"schema_version must be {SCHEMA_VERSION}, not {raw.get('schema_version')!r}")
    repo = raw.get("repository", "")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", str(repo)) or repo == "OWNER/REPO":
        raise ConfigError(f"repository must be this runner's OWNER/REPO, not {repo!r}")
    rules = []
    for i, r in enumerate(raw.get("allow") or []):
        bad = set(r) - RULE_KEYS
        if bad:
            raise ConfigError(f"allow[{i}]: unknown keys {sorted(bad)}")
        if not str(r.get("workflow", "")).startswith(".github/workflows/"):
            raise ConfigError(f"allow[{i}].workflow must be a path .github/workflows/NAME.yml")
        if bool(r.get("ref")) == bool(r.get("ref_prefix")):
            raise ConfigError(f"allow[{i}]: give exactly one of ref (refs/heads/main) and ref_prefix")
        events = tuple(r.get("events") or ())
        if not events or any(e.startswith(REFUSED_EVENT_PREFIX) for e in events):
            raise ConfigError(f"allow[{i}].events must be a non-empty list without pull_request* events")
        inputs = tuple(sorted((str(k), str(v)) for k, v in (r.get("inputs") or {}).items()))
        for _, pattern in inputs:
            re.compile(pattern)
        rules.append(Rule(r["workflow"], events, r.get("ref", ""), r.get("ref_prefix", ""), inputs,
                          r.get("base_ref", "")))
    if not rules:
        raise ConfigError("allow is empty: this runner group would run nothing")
    accepted = raw.get("persistent_runner_accepted", False)
    if not isinstance(accepted, bool):
        raise ConfigError("persistent_runner_accepted must be true or false")
    return Config(repo, str(raw.get("group", "")), tuple(rules), str(raw.get("canary", "")),
                  str(raw.get("canary_sudo", "")), accepted,
                  tuple(raw.get("read_only_paths") or ()), str(raw.get("index_url") or Config.index_url))


def load_config(path: str) -> Config:
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, ValueError) as err:
        raise ConfigError(f"cannot read {path}: {err}") from err
    return parse_config(raw)


def _matches(rule: Rule, event: str, path: str, ref: str, payload: dict) -> str | None:
    """None when the rule admits the job, else why not (the last rule's reason is reported)."""
    if path != rule.workflow:
        return f"workflow {path} is not {rule.workflow}"
    if event not in rule.events:
        return f"event {event} is not one of {', '.join(rule.events)} for {rule.workflow}"
    if rule.ref and ref != rule.ref:
        return f"{rule.workflow} comes from {ref}, not {rule.ref}"
    if rule.ref_prefix and not ref.startswith(rule.ref_prefix):
        return f"{rule.workflow} comes from {ref}, not {rule.ref_prefix}*"
    if event == "workflow_dispatch":
        if payload.get("workflow") not in (None, rule.workflow) or payload.get("ref") not in (None, ref):
            return "the dispatch payload names another workflow or ref than the runner reports"
        given = payload.get("inputs") or {}
        if not isinstance(given, dict):
            return "the dispatch inputs are not an object"
        wanted = dict(rule.inputs)
        if rule.inputs and set(given) - set(wanted):
            return f"dispatch inputs {sorted(set(given) - set(wanted))} are not among {sorted(wanted)}"
        for name, pattern in rule.inputs:
            if not re.fullmatch(pattern, str(given.get(name, ""))):
                return f"dispatch input {name}={str(given.get(name, ''))[:80]!r} does not match {pattern}"
    if event == "merge_group":
        group = payload.get("merge_group") or {}
        if group.get("head_ref") != ref:
            return f"the merge-group payload's head_ref {group.get('head_ref')!r} is not {ref}"
        if rule.base_ref and group.get("base_ref") != rule.base_ref:
            return f"the merge queue targets {group.get('base_ref')!r}, not {rule.base_ref}"
    if event == "push" and payload.get("ref") not in (None, ref):
        return "the push payload names another ref than the runner reports"
    return None


def decide(config: Config, env: dict, payload: dict) -> Decision:
    """Whether this runner group may run the job described by the runner's env and event payload."""
    event = env.get("GITHUB_EVENT_NAME", "")
    repo = env.get("GITHUB_REPOSITORY", "")
    if not event or not repo or not env.get("GITHUB_WORKFLOW_REF"):
        return Decision(False, ["the runner gave no GITHUB_EVENT_NAME, GITHUB_REPOSITORY or GITHUB_WORKFLOW_REF"])
    if event.startswith(REFUSED_EVENT_PREFIX) or "pull_request" in payload:
        return Decision(False, [f"event {event}: a pull_request run uses the PR's own workflow file, so no "
                                "self-hosted job of this repository runs on it (vet the PR: /attn-gate run <sha>)"])
    if repo.lower() != config.repository.lower():
        return Decision(False, [f"repository {repo} is not {config.repository}"])
    full = ((payload.get("repository") or {}).get("full_name") or repo) if isinstance(payload, dict) else repo
    if full.lower() != repo.lower():
        return Decision(False, [f"the payload's repository {full} is not {repo}"])
    m = WORKFLOW_REF.match(env["GITHUB_WORKFLOW_REF"])
    if m is None or m["repo"].lower() != repo.lower():
        return Decision(False, [f"workflow ref {env['GITHUB_WORKFLOW_REF']!r} is not a workflow of {repo}"])
    path, ref = m["path"], m["ref"]
    if env.get("GITHUB_REF") and env["GITHUB_REF"] != ref:
        return Decision(False, [f"GITHUB_REF {env['GITHUB_REF']} differs from the workflow's ref {ref}"])
    whys = []
    for rule in config.allow:
        why = _matches(rule, event, path, ref, payload)
        if why is None:
            return Decision(True, [f"{path}@{ref} on {event} is allowed in runner group {config.group or '(unnamed)'}"])
        whys.append((rule.workflow == path, event in rule.events, why))
    # the reason from the closest rule: same workflow and event first, then same workflow
    why = max(whys, key=lambda w: (w[0], w[0] and w[1]))[2] if any(w[0] for w in whys) else "no rule names it"
    return Decision(False, [f"{path}@{ref} on {event} is not on runner group {config.group or '(unnamed)'}'s "
                            f"allow-list ({why})"])


def label(env: dict) -> str:
    text = "repo={} run={} job={} workflow={}".format(env.get("GITHUB_REPOSITORY", "?"), env.get("GITHUB_RUN_ID", "?"),
                                                      env.get("GITHUB_JOB", "?"), env.get("GITHUB_WORKFLOW_REF", "?"))
    return SAFE_LABEL.sub("", text)[:300]


def mark_canary(path: str, text: str) -> tuple[bool, str]:
    """(fresh, earlier label): creates the marker with O_EXCL, so two jobs never both find the host fresh."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return False, SAFE_LABEL.sub("", f.read(300))
        except OSError:
            return False, "unreadable"
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(SAFE_LABEL.sub("", text)[:300] + "\n")
    return True, ""


def check_canary(config: Config, env: dict, config_path: str = "") -> Decision:
    """The host ran no job before this one, or the admin accepted a persistent host in the settings.
    With canary_sudo the marker is written by root (`--mark-canary`, one sudoers line) in a folder the
    runner user cannot write, so a job cannot delete it; without, it is a tripwire for a host that was
    meant to be fresh, and says so."""
    if not config.canary:
        return Decision(False, ["no canary path in the settings: the guard cannot tell a reused host"])
    directory = os.path.dirname(config.canary) or "."
    warnings = []
    writable = os.access(directory, os.W_OK) or not os.path.exists(directory) and os.access(
        os.path.dirname(directory) or ".", os.W_OK)
    try:
        if config.canary_sudo:
            if writable:
                return Decision(False, [f"canary_sudo is set but this user can write {directory}: make it root-owned "
                                        "(mode 0755) so a job cannot delete the marker"])
            # the exact command of the sudoers line: no argument the caller chooses; the label goes by stdin
            cmd = [config.canary_sudo, "-n", sys.executable, "-I", os.path.abspath(__file__), "--config", config_path,
                   "--mark-canary"]
            r = subprocess.run(cmd, input=label(env), capture_output=True, text=True, timeout=60)
            if r.returncode not in (0, USED):
                return Decision(False, [f"the canary helper ({' '.join(cmd[:2])}) failed with {r.returncode}: "
                                        f"{SAFE_LABEL.sub('', (r.stdout + r.stderr)[-300:])}"])
            fresh, earlier = r.returncode == 0, SAFE_LABEL.sub("", r.stdout.strip())[:300]
        else:
            if writable:
                warnings.append(f"the canary's folder {directory} is writable by this user, so a job could delete the "
                                "marker: only a re-imaged host (or canary_sudo) makes it hold (docs/ci.md)")
            fresh, earlier = mark_canary(config.canary, label(env))
    except (OSError, subprocess.SubprocessError) as err:
        return Decision(False, [f"cannot check the canary {config.canary}: {err}"], warnings)
    if fresh:
        return Decision(True, [], warnings)
    if config.persistent_runner_accepted:
        return Decision(True, [], warnings + [f"this host is not fresh: it ran ({earlier}) before. The admin "
                                              "accepted that in the guard's settings; what an earlier job left "
                                              "can run in this one"])
    return Decision(False, [f"this host already ran a job ({earlier}): GPU runners must be fresh machines, one "
                            "job each (docs/ci.md); persistent_runner_accepted in the guard's settings on the "
                            "host is the only opt-out"], warnings)


RUNNER_PROCESSES = ("Runner.Worker", "Runner.Listener")


def runner_root(pid: int | None = None, proc: str = "/proc") -> str | None:
    """The runner's install folder (the one holding `.env`, `bin/` and `externals/`): the parent of
    the `bin/` of the Runner.Worker or Runner.Listener among this process's ancestors; None when
    none is found (not under a runner, or no /proc)."""
    pid = os.getppid() if pid is None else pid
    for _ in range(32):
        if pid <= 1:
            return None
        try:
            exe = os.readlink(f"{proc}/{pid}/exe")
            with open(f"{proc}/{pid}/stat", encoding="ascii") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None
        if os.path.basename(exe) in RUNNER_PROCESSES:
            return os.path.dirname(os.path.dirname(exe))
        pid = ppid
    return None


def writable_paths(config: Config, root: str | None = None) -> list[str]:
    """Paths a job must not be able to change: the guard, its settings, the base Python, and the
    runner's own install (its `.env` names this hook: a job that could edit it could switch the
    guard off for the next job on the host). `@python` stands for this interpreter's stdlib,
    site-packages and scripts folders; `@runner` for the runner's install folder, its `.env`,
    `bin/` and `externals/` (`root`, else found among this process's ancestors; not found, it is
    reported as such: the guard cannot vouch for a runner it cannot see)."""
    paths = []
    for p in config.read_only_paths:
        if p == "@python":
            sp = sysconfig.get_paths()
            paths += [sys.executable, sp["stdlib"], sp["purelib"], sp["platlib"], sp["scripts"]]
        elif p == "@runner":
            found = root or runner_root()
            if found is None:
                return ["@runner (no Runner.Worker among this process's ancestors to find the runner's install)"]
            paths += [found] + [os.path.join(found, name) for name in (".env", "bin", "externals")]
        else:
            paths.append(p)
    return [p for p in dict.fromkeys(paths) if os.path.exists(p) and os.access(p, os.W_OK)]


def job_env(config: Config, env: dict) -> dict[str, str]:
    """What the job's steps see: HOME and every cache in this job's own $RUNNER_TEMP (emptied by the
    runner at each job's start and end), pip reading no config file and one index only."""
    temp = env.get("RUNNER_TEMP", "")
    if not temp:
        return {}
    home, cache = f"{temp}/home", f"{temp}/cache"
    return {
        "ATTN_GATE_GUARD": config.group or "unnamed",
        "HOME": home,
        "XDG_CACHE_HOME": cache,
        "XDG_CONFIG_HOME": f"{home}/.config",
        "TMPDIR": f"{temp}/tmp",
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": config.index_url,
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_FIND_LINKS": "",
        "PIP_CACHE_DIR": f"{cache}/pip",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PYTHONNOUSERSITE": "1",
        "TORCH_HOME": f"{cache}/torch",
        "TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor",
        "TRITON_CACHE_DIR": f"{cache}/triton",
        "TORCH_EXTENSIONS_DIR": f"{cache}/torch_extensions",
        "CUDA_CACHE_PATH": f"{cache}/nv",
        "MPLCONFIGDIR": f"{cache}/matplotlib",
    }


def run(config_path: str, env: dict) -> int:
    def say(kind: str, text: str) -> None:
        print(f"::{kind}::attn-gate guard: {text}", flush=True)

    try:
        config = load_config(config_path)
    except ConfigError as err:
        say("error", f"{err} (settings file {config_path})")
        return 2
    payload: dict = {}
    event_path = env.get("GITHUB_EVENT_PATH", "")
    try:
        with open(event_path, encoding="utf-8") as f:
            payload = json.load(f)
    except (OSError, ValueError) as err:
        say("error", f"cannot read the event payload {event_path!r}: {err}")
        return 1
    if not isinstance(payload, dict):
        say("error", "the event payload is not a JSON object")
        return 1
    decision = decide(config, env, payload)
    if not decision.allowed:
        for r in decision.reasons:
            say("error", f"refused: {r}")
        return 1
    writable = writable_paths(config)
    if writable:
        say("error", f"refused: this user can write {', '.join(writable)}; a job could change the guard or the "
                     "base Python for the jobs after it (docs/ci.md, runner host)")
        return 1
    canary = check_canary(config, env, config_path)
    for w in canary.warnings:
        say("warning", w)
    if not canary.allowed:
        for r in canary.reasons:
            say("error", f"refused: {r}")
        return 1
    values = job_env(config, env)
    if not values:
        say("error", "the runner gave no RUNNER_TEMP")
        return 1
    for d in ("HOME", "XDG_CACHE_HOME", "TMPDIR"):
        os.makedirs(values[d], exist_ok=True)
    with open(env["GITHUB_ENV"], "a", encoding="utf-8") as f:
        f.writelines(f"{k}={v}\n" for k, v in values.items())
    print(f"attn-gate guard: {decision.reasons[0]}; HOME and caches under $RUNNER_TEMP", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the guard's JSON settings (root-owned)")
    parser.add_argument("--mark-canary", action="store_true",
                        help="(run as root through canary_sudo) create the canary named in the settings, labelled "
                        f"with stdin; exit 0 when the host was fresh, {USED} with the earlier label when not")
    args = parser.parse_args(argv)
    if args.mark_canary:
        try:
            config = load_config(args.config)
            fresh, earlier = mark_canary(config.canary, sys.stdin.read(300))
        except (ConfigError, OSError) as err:
            print(err, file=sys.stderr)
            return 2
        print(earlier)
        return 0 if fresh else USED
    env = {k: v for k, v in os.environ.items() if k.startswith(("GITHUB_", "RUNNER_"))}
    if "GITHUB_ENV" not in env:
        print("::error::attn-gate guard: not run by a runner (no GITHUB_ENV)", flush=True)
        return 1
    return run(args.config, env)


if __name__ == "__main__":
    sys.exit(main())
