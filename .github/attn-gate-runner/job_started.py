"""attn-gate's runner guard: the self-hosted runner runs it before every job
(ACTIONS_RUNNER_HOOK_JOB_STARTED -> job_started.sh -> this file).

The runner adds the hook as an ordinary pre-job step: a non-zero exit fails the job but does NOT
stop it (later steps with `if: always()`, `failure()` or `!cancelled()` and every action's `pre:`
step still run). So a refusal ends the job itself: after printing why, the guard kills the
Runner.Worker among its ancestors and the Runner.Listener above it, and a just-in-time host is
torn down before any step of the job runs.

First the persistence canary: every job that reaches the hook marks the host, before anything
is decided, and a marker left by an earlier job (admitted or refused) refuses this one. Then it
decides from what the runner itself provides, never from the workflow's YAML: the event name,
the event payload (GITHUB_EVENT_PATH), the workflow file and ref (GITHUB_WORKFLOW_REF), the
repository and ref. A `pull_request*` event, another repository, or a workflow@ref outside this
runner group's allow-list is refused, whatever `runs-on`, `if:` or `environment:` the YAML asks
for. Then the host: the guard, its settings, the base Python and the runner's install must be
read-only to the runner user (every file in them), and the cloud metadata service unreachable.
Last, the job's HOME, caches and pip settings are pointed into its own $RUNNER_TEMP through
$GITHUB_ENV (every value checked against its field first), ATTN_GATE_PYTHON names the interpreter
vouched for, and ATTN_GATE_GUARD tells the job's first step that the guard ran.

Settings come from one JSON file whose path is an argument (job_started.sh fixes it), owned by
root like this file: the runner's job env does not reach hooks, and nothing here reads an
ATTN_GATE_* variable, so no repository or job variable can switch a check off. Every file the
guard reads or writes is opened without blocking and must be a regular file; any malformed
payload or setting is one line and a refused job, never a traceback.

Stdlib only, Python 3.8+: the runner host needs no attn-gate install. Also usable as a module:
`decide()` is the pure decision over (config, env, payload), tested with recorded payloads.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field

SCHEMA_VERSION = 1
REFUSED_EVENT_PREFIX = "pull_request"  # pull_request, _target, _review, _review_comment
WORKFLOW_REF = re.compile(r"^(?P<repo>[^/]+/[^/]+)/(?P<path>\.github/workflows/[^@]+)@(?P<ref>refs/\S+)$")
SAFE_LABEL = re.compile(r"[^A-Za-z0-9 ._/=@-]")  # no ":": a stored label never forms a "::command"
CONFIG_KEYS = {
    "schema_version",
    "repository",
    "group",
    "allow",
    "canary",
    "canary_sudo",
    "persistent_runner_accepted",
    "read_only_paths",
    "index_url",
    "metadata_address",
    "metadata_reachable_accepted",
}
USED = 3  # --mark-canary's exit code for "this host already ran a job"
RULE_KEYS = {"workflow", "events", "ref", "ref_prefix", "inputs", "base_ref"}
GROUP = re.compile(r"[A-Za-z0-9._-]{0,64}")
# one index, https, no credentials, no whitespace or control character (it lands in $GITHUB_ENV)
INDEX_URL = re.compile(r"https://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~%/+-]*)?")
ADDRESS = re.compile(r"(?P<host>[0-9.]{7,15}|\[[0-9a-fA-F:]+\]):(?P<port>[0-9]{1,5})")
METADATA_ADDRESS = "169.254.169.254:80"  # the cloud metadata service (AWS, GCP, Azure, OCI): instance credentials
MAX_JSON_BYTES = 32 * 1024 * 1024  # GitHub's payloads stop at 25 MB
MAX_INPUT_CHARS = 4096  # a dispatch input longer than this matches no rule (bounded regex work)
MAX_WALK = 1_000_000  # files the read-only walk vouches for before it gives up (and refuses)
# what the runner itself writes in its install folder: a just-in-time runner writes its
# registration there at start (.runner, .credentials, .credentials_rsaparams: data, not code)
RUNNER_DATA = {"_work", "_diag", ".runner", ".credentials", ".credentials_rsaparams"}


class ConfigError(Exception):
    """The guard's settings file is wrong: the message names the key and the fix."""


class PayloadError(Exception):
    """The event payload has a shape GitHub never sends: the job is refused."""


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
    metadata_address: str = METADATA_ADDRESS  # host:port that must not accept a connection from this host
    metadata_reachable_accepted: bool = False  # the admin vouches for this host's network (docs/ci.md)


@dataclass
class Decision:
    allowed: bool
    reasons: list[str] = field(default_factory=list)  # why refused, or what matched
    warnings: list[str] = field(default_factory=list)


def _typed(raw: dict, key: str, kind: type, default, where: str = ""):
    value = raw.get(key, default)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(
            f"{where}{key} must be {kind.__name__ if kind is not tuple else 'a list'}, not {str(value)[:60]!r}"
        )
    return value


def _strings(value, where: str) -> tuple[str, ...]:
    """A list of non-empty strings; any other type (0, false, a string) is an error, never "none"."""
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where} must be a list of non-empty strings, not {str(value)[:60]!r}")
    return tuple(value)


def parse_rule(i: int, r) -> Rule:
    where = f"allow[{i}]"
    if not isinstance(r, dict):
        raise ConfigError(
            f"{where} must be an object with workflow, events and ref (or ref_prefix), not {str(r)[:60]!r}"
        )
    bad = set(r) - RULE_KEYS
    if bad:
        raise ConfigError(f"{where}: unknown keys {sorted(bad)}")
    workflow = _typed(r, "workflow", str, "", f"{where}.")
    if not workflow.startswith(".github/workflows/"):
        raise ConfigError(f"{where}.workflow must be a path .github/workflows/NAME.yml")
    ref, prefix, base = (_typed(r, k, str, "", f"{where}.") for k in ("ref", "ref_prefix", "base_ref"))
    if bool(ref) == bool(prefix):
        raise ConfigError(f"{where}: give exactly one of ref (refs/heads/main) and ref_prefix")
    events = _strings(r.get("events", []), f"{where}.events")
    if not events or any(e.startswith(REFUSED_EVENT_PREFIX) for e in events):
        raise ConfigError(f"{where}.events must be a non-empty list without pull_request* events")
    given = _typed(r, "inputs", dict, {}, f"{where}.")
    inputs = []
    for name, pattern in sorted(given.items()):
        if not isinstance(pattern, str):
            raise ConfigError(f"{where}.inputs.{name} must be a regex string, not {str(pattern)[:60]!r}")
        try:
            re.compile(pattern)
        except (re.error, RecursionError, OverflowError) as err:
            raise ConfigError(f"{where}.inputs.{name}: {pattern[:60]!r} is not a regex ({err})") from None
        inputs.append((name, pattern))
    return Rule(workflow, events, ref, prefix, tuple(inputs), base)


def parse_config(raw: dict) -> Config:
    if not isinstance(raw, dict):
        raise ConfigError("the settings file must hold one JSON object")
    unknown = set(raw) - CONFIG_KEYS
    if unknown:
        raise ConfigError(f"unknown keys {sorted(unknown)}; known: {sorted(CONFIG_KEYS)}")
    if raw.get("schema_version") != SCHEMA_VERSION or isinstance(raw.get("schema_version"), bool):
        raise ConfigError(f"schema_version must be {SCHEMA_VERSION}, not {str(raw.get('schema_version'))[:60]!r}")
    repo = raw.get("repository", "")
    if not isinstance(repo, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", repo) or repo == "OWNER/REPO":
        raise ConfigError(f"repository must be this runner's OWNER/REPO, not {str(repo)[:60]!r}")
    group = _typed(raw, "group", str, "")
    if not GROUP.fullmatch(group):
        raise ConfigError(f"group must be the runner group's name (letters, digits, . _ -), not {group[:60]!r}")
    allow = _typed(raw, "allow", list, [])
    rules = [parse_rule(i, r) for i, r in enumerate(allow)]
    if not rules:
        raise ConfigError("allow is empty: this runner group would run nothing")
    flags = {}
    for key in ("persistent_runner_accepted", "metadata_reachable_accepted"):
        flags[key] = raw.get(key, False)
        if not isinstance(flags[key], bool):
            raise ConfigError(f"{key} must be true or false")
    canary, sudo = _typed(raw, "canary", str, ""), _typed(raw, "canary_sudo", str, "")
    for key, value in (("canary", canary), ("canary_sudo", sudo)):
        if value and (not os.path.isabs(value) or CONTROL.search(value)):
            raise ConfigError(f"{key} must be an absolute path, not {value[:60]!r}")
    read_only = _strings(raw.get("read_only_paths", []), "read_only_paths")  # false or 0 does not turn it off
    index_url = _typed(raw, "index_url", str, "") or Config.index_url
    if not INDEX_URL.fullmatch(index_url):
        raise ConfigError(f"index_url must be one https:// URL without credentials or spaces, not {index_url[:80]!r}")
    address = _typed(raw, "metadata_address", str, "") or METADATA_ADDRESS
    if not ADDRESS.fullmatch(address):
        raise ConfigError(f"metadata_address must be IP:PORT, e.g. {METADATA_ADDRESS}, not {address[:60]!r}")
    return Config(
        repo,
        group,
        tuple(rules),
        canary,
        sudo,
        flags["persistent_runner_accepted"],
        read_only,
        index_url,
        address,
        flags["metadata_reachable_accepted"],
    )


def read_regular(path: str, limit: int = MAX_JSON_BYTES) -> bytes:
    """A regular file's bytes, opened without blocking (a FIFO or a device is refused, not waited on)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file")
        if st.st_size > limit:
            raise OSError(f"{path} holds {st.st_size} bytes, more than {limit}")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise OSError(f"{path} grew past {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_json(path: str):
    try:
        return json.loads(read_regular(path).decode("utf-8"))
    except RecursionError:
        raise ValueError("nested too deeply") from None


def load_config(path: str) -> Config:
    try:
        raw = read_json(path)
    except (OSError, ValueError) as err:
        raise ConfigError(f"cannot read {path}: {err}") from err
    return parse_config(raw)


def _object(parent: dict, key: str) -> dict:
    """parent[key] as an object ({} when absent or null); any other type refuses the job."""
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PayloadError(f"the payload's {key} is a {type(value).__name__}, not an object")
    return value


def _text(parent: dict, key: str) -> str | None:
    value = parent.get(key)
    if value is not None and not isinstance(value, str):
        raise PayloadError(f"the payload's {key} is a {type(value).__name__}, not a string")
    return value


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
        if _text(payload, "workflow") not in (None, rule.workflow) or _text(payload, "ref") not in (None, ref):
            return "the dispatch payload names another workflow or ref than the runner reports"
        given = _object(payload, "inputs")
        wanted = dict(rule.inputs)
        if rule.inputs and set(given) - set(wanted):
            return f"dispatch inputs {sorted(set(given) - set(wanted))} are not among {sorted(wanted)}"
        for name, pattern in rule.inputs:
            value = given.get(name, "")
            if not isinstance(value, str) or len(value) > MAX_INPUT_CHARS:  # the allow-listed inputs are strings
                return f"dispatch input {name} is not a string of at most {MAX_INPUT_CHARS} characters"
            if not re.fullmatch(pattern, str(value)):
                return f"dispatch input {name}={str(value)[:80]!r} does not match {pattern}"
    if event == "merge_group":
        group = _object(payload, "merge_group")
        if _text(group, "head_ref") != ref:
            return f"the merge-group payload's head_ref {str(group.get('head_ref'))[:80]!r} is not {ref}"
        if rule.base_ref and _text(group, "base_ref") != rule.base_ref:
            return f"the merge queue targets {str(group.get('base_ref'))[:80]!r}, not {rule.base_ref}"
    if event == "push" and _text(payload, "ref") not in (None, ref):
        return "the push payload names another ref than the runner reports"
    return None


def decide(config: Config, env: dict, payload: dict) -> Decision:
    """Whether this runner group may run the job described by the runner's env and event payload."""
    try:
        return _decide(config, env, payload)
    except PayloadError as err:
        return Decision(False, [f"{err}: GitHub sends no such payload"])


def _decide(config: Config, env: dict, payload: dict) -> Decision:
    event = env.get("GITHUB_EVENT_NAME", "")
    repo = env.get("GITHUB_REPOSITORY", "")
    if not event or not repo or not env.get("GITHUB_WORKFLOW_REF"):
        return Decision(False, ["the runner gave no GITHUB_EVENT_NAME, GITHUB_REPOSITORY or GITHUB_WORKFLOW_REF"])
    if not isinstance(payload, dict):
        raise PayloadError(f"the payload is a {type(payload).__name__}, not an object")
    if event.startswith(REFUSED_EVENT_PREFIX) or "pull_request" in payload:
        return Decision(
            False,
            [
                f"event {event}: a pull_request run uses the PR's own workflow file, so no "
                "self-hosted job of this repository runs on it (vet the PR: /attn-gate run <sha>)"
            ],
        )
    if repo.lower() != config.repository.lower():
        return Decision(False, [f"repository {repo} is not {config.repository}"])
    full = _text(_object(payload, "repository"), "full_name") or repo
    if full.lower() != repo.lower():
        return Decision(False, [f"the payload's repository {SAFE_LABEL.sub('', full)[:100]} is not {repo}"])
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
    return Decision(
        False, [f"{path}@{ref} on {event} is not on runner group {config.group or '(unnamed)'}'s allow-list ({why})"]
    )


def label(env: dict) -> str:
    text = "repo={} run={} job={} workflow={}".format(
        env.get("GITHUB_REPOSITORY", "?"),
        env.get("GITHUB_RUN_ID", "?"),
        env.get("GITHUB_JOB", "?"),
        env.get("GITHUB_WORKFLOW_REF", "?"),
    )
    return SAFE_LABEL.sub("", text)[:300]


def mark_canary(path: str, text: str) -> tuple[bool, str]:
    """(fresh, earlier label): creates the marker with O_EXCL, so two jobs never both find the host fresh."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        try:  # whatever is there (a FIFO a job planted too) marks a used host; read it without blocking
            return False, SAFE_LABEL.sub("", read_regular(path, 1 << 16)[:300].decode("utf-8", "replace"))
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
    writable = (
        os.access(directory, os.W_OK)
        or not os.path.exists(directory)
        and os.access(os.path.dirname(directory) or ".", os.W_OK)
    )
    try:
        if config.canary_sudo:
            if writable:
                return Decision(
                    False,
                    [
                        f"canary_sudo is set but this user can write {directory}: make it root-owned "
                        "(mode 0755) so a job cannot delete the marker"
                    ],
                )
            # the exact command of the sudoers line: no argument the caller chooses; the label goes by stdin
            cmd = [
                config.canary_sudo,
                "-n",
                sys.executable,
                "-I",
                os.path.abspath(__file__),
                "--config",
                config_path,
                "--mark-canary",
            ]
            r = subprocess.run(cmd, input=label(env), capture_output=True, text=True, timeout=60)
            if r.returncode not in (0, USED):
                return Decision(
                    False,
                    [
                        f"the canary helper ({' '.join(cmd[:2])}) failed with {r.returncode}: "
                        f"{SAFE_LABEL.sub('', (r.stdout + r.stderr)[-300:])}"
                    ],
                )
            fresh, earlier = r.returncode == 0, SAFE_LABEL.sub("", r.stdout.strip())[:300]
        else:
            if writable:
                warnings.append(
                    f"the canary's folder {directory} is writable by this user, so a job could delete the "
                    "marker: only a re-imaged host (or canary_sudo) makes it hold (docs/ci.md)"
                )
            fresh, earlier = mark_canary(config.canary, label(env))
    except (OSError, subprocess.SubprocessError) as err:
        return Decision(False, [f"cannot check the canary {config.canary}: {err}"], warnings)
    if fresh:
        return Decision(True, [], warnings)
    if config.persistent_runner_accepted:
        return Decision(
            True,
            [],
            warnings
            + [
                f"this host is not fresh: it ran ({earlier}) before. The admin "
                "accepted that in the guard's settings; what an earlier job left "
                "can run in this one"
            ],
        )
    return Decision(
        False,
        [
            f"this host already ran a job ({earlier}): GPU runners must be fresh machines, one "
            "job each (docs/ci.md); persistent_runner_accepted in the guard's settings on the "
            "host is the only opt-out"
        ],
        warnings,
    )


WORKER, LISTENER = "Runner.Worker", "Runner.Listener"
RUNNER_PROCESSES = (WORKER, LISTENER)


def runner_ancestors(pid: int | None = None, proc: str = "/proc") -> list[tuple[str, int, str]]:
    """(name, pid, exe) of the nearest Runner.Worker among this process's ancestors and the nearest
    Runner.Listener above it (the runner that started this job), nearest first; [] when none is
    found (not under a runner, or no /proc)."""
    pid = os.getppid() if pid is None else pid
    found: list[tuple[str, int, str]] = []
    for _ in range(64):
        if pid <= 1:
            break
        try:
            exe = os.readlink(f"{proc}/{pid}/exe")
            with open(f"{proc}/{pid}/stat", encoding="ascii") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        name = os.path.basename(exe)
        if name in RUNNER_PROCESSES and name not in [n for n, _, _ in found]:
            found.append((name, pid, exe))
            if name == LISTENER:
                break
        pid = ppid
    return found


def runner_root(pid: int | None = None, proc: str = "/proc") -> str | None:
    """The runner's install folder (the one holding `.env`, `bin/` and `externals/`): the parent of
    the `bin/` of the Runner.Worker or Runner.Listener among this process's ancestors; None when
    none is found."""
    found = runner_ancestors(pid, proc)
    return os.path.dirname(os.path.dirname(found[0][2])) if found else None


def end_job(proc: str = "/proc", kill=os.kill) -> list[str]:
    """End the job this hook runs in: stop the Runner.Listener (it takes no other job, and a
    just-in-time host whose listener exits is torn down), kill the Runner.Worker (no later step, no
    `always()` step, no action's `pre:` step runs), then kill the listener. SIGKILL, not SIGTERM: a
    cancelled job would still run its `always()` steps. Returns the signals that failed."""
    pids = {name: pid for name, pid, _ in runner_ancestors(proc=proc)}
    steps = []
    if LISTENER in pids:
        steps.append((pids[LISTENER], signal.SIGSTOP))
    if WORKER in pids:
        steps.append((pids[WORKER], signal.SIGKILL))
    if LISTENER in pids:
        steps.append((pids[LISTENER], signal.SIGKILL))
    failed = []
    for pid, sig in steps:
        try:
            kill(pid, sig)
        except OSError as err:
            failed.append(f"pid {pid} ({sig.name}): {err}")
    return failed


def metadata_reachable(address: str, timeout: float = 1.0, connect=socket.create_connection) -> bool:
    """Whether a TCP connection to `address` (host:port) succeeds within `timeout`: a refused or
    timed-out connection is what a fenced host gives."""
    m = ADDRESS.fullmatch(address)
    if m is None:
        return True  # fail closed: an address the guard cannot read is not proven blocked
    try:
        conn = connect((m["host"].strip("[]"), int(m["port"])), timeout)
    except (OSError, ValueError, OverflowError):
        return False
    conn.close()
    return True


def check_network(config: Config, reachable=metadata_reachable) -> Decision:
    if config.metadata_reachable_accepted:
        return Decision(
            True,
            [],
            [
                "the metadata service check is off (metadata_reachable_accepted): the admin "
                "vouches for this host's network"
            ],
        )
    if reachable(config.metadata_address):
        return Decision(
            False,
            [
                f"this host reaches the cloud metadata service ({config.metadata_address}): a job "
                "could take the instance's credentials. Block it for the runner (docs/ci.md, the PR "
                "pool's network), or set metadata_reachable_accepted in the guard's settings on a "
                "host whose network you vouch for"
            ],
        )
    return Decision(True)


def _python_paths() -> list[str]:
    """This interpreter and every folder it imports from (run with -I: stdlib, lib-dynload,
    site-packages, Debian's dist-packages), plus its scripts folder."""
    sp = sysconfig.get_paths()
    paths = [
        sys.executable,
        os.path.realpath(sys.executable),
        sp["stdlib"],
        sp["purelib"],
        sp["platlib"],
        sp["scripts"],
    ]
    return paths + [p for p in sys.path if p and os.path.isabs(p)]


def _runner_paths(root: str) -> list[str]:
    """The runner's install: the folder itself (not walked: `.` marks it) and everything in it
    except what the runner writes."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        names = []
    return [os.path.join(root, ".")] + [os.path.join(root, n) for n in names if n not in RUNNER_DATA]


def _problem(path: str, st: os.stat_result, euid: int, access) -> str | None:
    """Why the runner user could change `path` (lstat'ed), or None."""
    if stat.S_ISLNK(st.st_mode):
        return None if not os.path.exists(path) or not access(path, os.W_OK) else "a link to a writable target"
    if st.st_uid == euid and euid != 0:
        return f"owned by this user (mode {stat.S_IMODE(st.st_mode):04o})"
    if st.st_mode & stat.S_IWOTH and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
        return f"writable by everyone (mode {stat.S_IMODE(st.st_mode):04o})"
    if access(path, os.W_OK):
        return (
            f"writable by this user (owner uid {st.st_uid}, group gid {st.st_gid}, mode {stat.S_IMODE(st.st_mode):04o})"
        )
    return None


def writable_paths(
    config: Config,
    root: str | None = None,
    proc: str = "/proc",
    limit: int = MAX_WALK,
    euid: int | None = None,
    access=os.access,
) -> list[str]:
    """Paths a job must not be able to change, each walked to its last file: the guard, its
    settings, the base Python, and the runner's own install (its `.env` names this hook: a job that
    could edit it could switch the guard off for the next job on the host). `@python` stands for
    this interpreter and every folder it imports from; `@runner` for the runner's install folder and
    everything in it but `_work/`, `_diag/` and the JIT registration files (`root`, else found
    among this process's ancestors; not found, it is reported as such: the guard cannot vouch for a
    runner it cannot see). Each entry is checked by owner and mode (owned by this user, writable by
    everyone, or writable by this user through its group) without following links into folders."""
    paths = []
    for p in config.read_only_paths:
        if p == "@python":
            paths += _python_paths()
        elif p == "@runner":
            found = root or runner_root(proc=proc)
            if found is None:
                return ["@runner (no Runner.Worker among this process's ancestors to find the runner's install)"]
            paths += _runner_paths(found)
        else:
            paths.append(p)
    euid = os.geteuid() if euid is None else euid
    problems, seen = [], 0
    for given in dict.fromkeys(paths):
        top = os.path.normpath(given)
        entries = [top]
        if os.path.isdir(top) and not os.path.islink(top) and not given.endswith("/."):
            for folder, dirs, files in os.walk(top):
                entries += [os.path.join(folder, n) for n in dirs + files]
                if len(entries) + seen > limit:
                    return problems + [f"{top} (more than {limit} files to vouch for: list narrower folders)"]
        seen += len(entries)
        for entry in entries:
            try:
                why = _problem(entry, os.lstat(entry), euid, access)
            except OSError:
                continue  # gone since the walk, or never there
            if why:
                problems.append(f"{entry} ({why})")
    return problems


ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
SAFE_PATH = re.compile(r"/[A-Za-z0-9._+@%,:/ -]*")


def job_env(config: Config, env: dict) -> dict[str, str]:
    """What the job's steps see: HOME and every cache in this job's own $RUNNER_TEMP (emptied by the
    runner at each job's start and end), pip reading no config file and one index only, and the
    interpreter this guard vouched for (setup.sh builds the job's venv on it)."""
    temp = env.get("RUNNER_TEMP", "")
    if not temp:
        return {}
    home, cache = f"{temp}/home", f"{temp}/cache"
    return {
        "ATTN_GATE_GUARD": config.group or "unnamed",
        "ATTN_GATE_PYTHON": sys.executable,
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
        # CuTe DSL's and FA4's compile caches (FA4's is on when FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1)
        "CUTE_DSL_CACHE_DIR": f"{cache}/cute_dsl",
        "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": f"{cache}/flash_attn_cute",
        "MPLCONFIGDIR": f"{cache}/matplotlib",
    }


def env_problems(values: dict[str, str], temp: str) -> list[str]:
    """Every value is one line and what its field allows; `temp` (RUNNER_TEMP) must be a plain
    absolute path, and every path but the interpreter and /dev/null lies under it. A newline
    would add a line (LD_PRELOAD=...) to $GITHUB_ENV for every later step."""
    problems = []
    if not SAFE_PATH.fullmatch(temp) or os.path.normpath(temp) != temp.rstrip("/") or temp == "/":
        problems.append(f"RUNNER_TEMP {temp[:80]!r} is not a plain absolute path")
    for key, value in values.items():
        if not ENV_NAME.fullmatch(key) or CONTROL.search(value):
            problems.append(f"{key}: a name or value with a control character (newline) cannot go to $GITHUB_ENV")
        elif key == "PIP_INDEX_URL" and not INDEX_URL.fullmatch(value):
            problems.append(f"PIP_INDEX_URL {value[:80]!r} is not one https:// URL")
        elif key == "ATTN_GATE_GUARD" and not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", value):
            problems.append(f"ATTN_GATE_GUARD {value[:80]!r} is not a group name")
        elif key == "ATTN_GATE_PYTHON" and not (SAFE_PATH.fullmatch(value) and os.path.isfile(value)):
            problems.append(f"ATTN_GATE_PYTHON {value[:80]!r} is not an interpreter's absolute path")
        elif (
            value.startswith("/")
            and key not in ("ATTN_GATE_PYTHON", "PIP_CONFIG_FILE")
            and not (SAFE_PATH.fullmatch(value) and value.startswith(temp.rstrip("/") + "/"))
        ):
            problems.append(f"{key} {value[:80]!r} is not a path under RUNNER_TEMP")
        elif key == "PIP_CONFIG_FILE" and value != os.devnull:
            problems.append(f"PIP_CONFIG_FILE {value[:80]!r} is not {os.devnull}")
    return problems


def append_env(path: str, values: dict[str, str]) -> None:
    """Append KEY=VALUE lines to the runner's $GITHUB_ENV file in one write; a path that is not a
    regular file (a FIFO, a folder, /dev/full) is refused without blocking or writing."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        data = "".join(f"{k}={v}\n" for k, v in values.items()).encode("utf-8")
        if os.write(fd, data) != len(data):
            raise OSError(f"a short write to {path}")
    finally:
        os.close(fd)


def say(kind: str, text: str) -> None:
    print(f"::{kind}::attn-gate guard: {CONTROL.sub(' ', text)}", flush=True)  # one line each


def refuse(reasons: list[str], code: int = 1, proc: str = "/proc", kill=os.kill) -> int:
    """Print why, then end the job: a hook's non-zero exit alone would let the job's later steps run."""
    for r in reasons:
        say("error", f"refused: {r}")
    try:  # a record on the host too: the job's log may not be uploaded once its worker is gone
        import syslog

        syslog.openlog("attn-gate-guard")
        for r in reasons:
            syslog.syslog(syslog.LOG_WARNING, CONTROL.sub(" ", f"refused: {r}")[:2000])
    except (ImportError, OSError):
        pass
    found = runner_ancestors(proc=proc)
    if not found:
        say("error", "no Runner.Worker among this process's ancestors: nothing to end (not run by a runner?)")
        return code
    say("error", "ending the job and this runner: " + ", ".join(f"{n} (pid {p})" for n, p, _ in found))
    failed = end_job(proc, kill)
    try:  # the worker held the other end of stdout: report on stderr while it may still be read, then nowhere
        if failed:
            print(f"attn-gate guard: could not signal {'; '.join(failed)}", file=sys.stderr, flush=True)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    except OSError:
        pass
    return code


def run(config_path: str, env: dict, proc: str = "/proc", kill=os.kill, reachable=metadata_reachable) -> int:
    def no(reasons: list[str], code: int = 1) -> int:
        return refuse(reasons, code, proc, kill)

    try:
        config = load_config(config_path)
    except ConfigError as err:
        return no([f"{err} (settings file {config_path})"], 2)
    # the canary first: this job marks the host whatever is decided below, so a refused job
    # leaves its mark too and the next job on a reused host is refused
    canary = check_canary(config, env, config_path)
    for w in canary.warnings:
        say("warning", w)
    if not canary.allowed:
        return no(canary.reasons)
    event_path = env.get("GITHUB_EVENT_PATH", "")
    try:
        payload = read_json(event_path)
    except (OSError, ValueError, UnicodeDecodeError) as err:
        return no([f"cannot read the event payload {event_path!r}: {err}"])
    if not isinstance(payload, dict):
        return no(["the event payload is not a JSON object"])
    decision = decide(config, env, payload)
    if not decision.allowed:
        return no(decision.reasons)
    writable = writable_paths(config, proc=proc)
    if writable:
        shown = ", ".join(writable[:8]) + (f" and {len(writable) - 8} more" if len(writable) > 8 else "")
        return no(
            [
                f"this user can write {shown}; a job could change the guard, the base Python or the runner "
                "for the jobs after it (docs/ci.md, runner host)"
            ]
        )
    network = check_network(config, reachable)
    for w in network.warnings:
        say("warning", w)
    if not network.allowed:
        return no(network.reasons)
    values = job_env(config, env)
    if not values:
        return no(["the runner gave no RUNNER_TEMP"])
    problems = env_problems(values, env.get("RUNNER_TEMP", ""))
    if problems:
        return no([f"nothing written to $GITHUB_ENV: {'; '.join(problems)}"])
    try:
        for d in ("HOME", "XDG_CACHE_HOME", "TMPDIR"):
            os.makedirs(values[d], exist_ok=True)
        append_env(env.get("GITHUB_ENV", ""), values)
    except OSError as err:
        return no([f"cannot write the job's environment to $GITHUB_ENV: {err}"])
    print(f"attn-gate guard: {decision.reasons[0]}; HOME and caches under $RUNNER_TEMP", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the guard's JSON settings (root-owned)")
    parser.add_argument(
        "--mark-canary",
        action="store_true",
        help="(run as root through canary_sudo) create the canary named in the settings, labelled "
        f"with stdin; exit 0 when the host was fresh, {USED} with the earlier label when not",
    )
    parser.add_argument("--proc", default="/proc", help=argparse.SUPPRESS)  # tests: a fake process table
    args = parser.parse_args(argv)
    if args.mark_canary:
        try:
            config = load_config(args.config)
            fresh, earlier = mark_canary(config.canary, sys.stdin.read(300))
        except (ConfigError, OSError, ValueError) as err:
            print(SAFE_LABEL.sub("", str(err)), file=sys.stderr)
            return 2
        print(earlier)
        return 0 if fresh else USED
    env = {k: v for k, v in os.environ.items() if k.startswith(("GITHUB_", "RUNNER_"))}
    try:
        if "GITHUB_ENV" not in env:
            return refuse(["not run by a runner (no GITHUB_ENV)"], 1, args.proc)
        return run(args.config, env, args.proc)
    except Exception as err:  # fail closed in one line: whatever went wrong, the job does not run
        return refuse([f"the guard failed ({type(err).__name__}: {str(err)[:200]})"], 1, args.proc)


if __name__ == "__main__":
    sys.exit(main())
