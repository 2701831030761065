"""`attn-gate init`: bring the gate into a kernel repository, and `init --check` for drift.

One set of templates ships in the package (gate/workflow/templates/): the workflows, CODEOWNERS,
actionlint's settings, the runner guard, asv.conf.json and the benchmarks/ wrapper. `render_files`
is the pure function from the parameters (`[tool.attn-gate.ci]`, a CiConfig) to the files;
attn-gate's own repository is rendered from the same templates with its own parameters, so what
is hardened here is what users get. `init` writes what is absent, keeps what exists unless told to
replace it, appends `[tool.attn-gate]` to pyproject.toml without touching the rest, and says what
it did; run twice, it changes nothing.
"""

from __future__ import annotations

import difflib
import json
import re
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from gate.core.config import CiConfig, FAMILY_ENTRIES, load_config
from gate.core.errors import UserError

TEMPLATES = Path(__file__).with_name("templates")
WORKFLOWS = ("baselines", "bisect", "ci", "gate", "nightly", "publish", "report", "selftest", "vet")
RUNNER_FILES = ("job_started.sh", "job_started.py", "attn-gate-gpu.json", "attn-gate-trusted.json")
RUNNER_DIR = ".github/attn-gate-runner"
PLACEHOLDER = re.compile(r"@@([a-z_]+)@@")
# Runner labels GitHub or the runner adds itself; actionlint knows them.
BUILTIN_LABELS = {"self-hosted", "linux", "x64", "arm64", "windows", "macos"}
# Other GPU classes a runner may carry (actionlint must know every label a workflow can ask for).
KNOWN_CLASSES = ("h200", "h100", "a100", "b200", "l40s")
DOCS_URL = "https://github.com/attn-gate/attn-gate/blob/v{version}/docs/ci.md"
USER_PROTECTED = (".github/", "baselines/", "benchmarks/", "tests/", "pyproject.toml", "asv.conf.json")
REPOSITORY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]*/[A-Za-z0-9._-]+$")
REMOTE = re.compile(r"github\.com[:/](?P<repo>[A-Za-z0-9][A-Za-z0-9-]*/[A-Za-z0-9._-]+?)(?:\.git)?/?$")


def render(template: str, values: dict[str, str]) -> str:
    """Fill `@@name@@` placeholders. A placeholder alone on its line takes a multi-line value with
    that line's indent on every line. Every name must be known: a typo fails, never renders empty."""
    out = []
    for line in template.splitlines(keepends=True):
        stripped = line.strip()
        whole = PLACEHOLDER.fullmatch(stripped)
        if whole and whole[1] in values:
            indent = line[: len(line) - len(line.lstrip())]
            out.extend(f"{indent}{v}\n" if v else "\n" for v in values[whole[1]].split("\n"))
            continue
        missing = [m for m in PLACEHOLDER.findall(line) if m not in values]
        if missing:
            raise KeyError(f"template placeholder @@{missing[0]}@@ has no value")
        out.append(PLACEHOLDER.sub(lambda m: values[m[1]], line))
    return "".join(out)


def template_values(ci: CiConfig) -> dict[str, str]:
    labels = [l for l in ci.runner_labels if l not in BUILTIN_LABELS]
    width = max(len(f"/{p}") for p in ("*",) + ci.protected)
    owners = [f"{'*':{width}} {ci.owners}"] + [f"{'/' + p:{width}} {ci.owners}" for p in ci.protected]
    project = ci.repository.rsplit("/", 1)[-1]
    return {
        "runner_labels": json.dumps(list(ci.runner_labels), separators=(",", ":")),
        "setup": ci.setup, "setup_locked": ci.setup_locked, "ci_run": ci.ci_run,
        "nightly_suite": ci.nightly_suite, "ci_docs": ci.docs,
        "protected_js": "[" + ", ".join(f"'{p}'" for p in ci.protected) + "]",
        "codeowners": "\n".join(owners),
        "actionlint_labels": "\n".join(f"- {l}" for l in dict.fromkeys(labels + list(KNOWN_CLASSES))),
        "project": project, "project_url": f"https://github.com/{ci.repository}",
    }


def check_ci(ci: CiConfig, where: str = "[tool.attn-gate.ci]") -> None:
    """Refuse parameters that would render a broken or unsafe file (the values land in YAML and shell)."""
    for key in ("repository", "owners", "setup", "setup_locked", "ci_run", "docs"):
        if not getattr(ci, key):
            raise UserError(f"{where}: {key} is empty; run `attn-gate init` to write the section")
    if not REPOSITORY.match(ci.repository):
        raise UserError(f"{where}: repository = {ci.repository!r} should be OWNER/REPO")
    if not ci.runner_labels or not all(re.fullmatch(r"[A-Za-z0-9._-]+", l) for l in ci.runner_labels):
        raise UserError(f"{where}: runner_labels = {list(ci.runner_labels)!r} should be runner labels "
                        f"(letters, digits, . _ -), e.g. [\"self-hosted\", \"linux\", \"gpu\", \"h200\"]")
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,63}", ci.nightly_suite):
        raise UserError(f"{where}: nightly_suite = {ci.nightly_suite!r} should be a suite name")
    if not ci.protected or not all(re.fullmatch(r"[A-Za-z0-9._/-]+", p) for p in ci.protected):
        raise UserError(f"{where}: protected should list repository paths (a folder ends with /)")
    if not re.fullmatch(r"(@[A-Za-z0-9._/-]+|[^@\s]+@[^@\s]+)( (@[A-Za-z0-9._/-]+|[^@\s]+@[^@\s]+))*", ci.owners):
        raise UserError(f"{where}: owners = {ci.owners!r} should be @user, @org/team or an email, space-separated")
    for key in ("setup", "setup_locked", "ci_run", "docs"):
        value = getattr(ci, key)
        # one plain YAML scalar on a `run:` line or inside a message: no expressions, no comment starts
        if "${{" in value or " #" in value or ": " in value or value[:1] in "!&*{[|>'\"%@`#-?,":
            raise UserError(f"{where}: {key} = {value!r} cannot stand in a workflow as it is "
                            f"(no '${{{{', ' #', ': ' or a leading YAML indicator); wrap it in a script")


def render_files(ci: CiConfig) -> dict[str, str]:
    """Repository path -> content of every file the templates give, for these parameters."""
    check_ci(ci)
    values = template_values(ci)
    files = {f".github/workflows/{w}.yml": render((TEMPLATES / "workflows" / f"{w}.yml").read_text(), values)
             for w in WORKFLOWS}
    files[".github/CODEOWNERS"] = render((TEMPLATES / "CODEOWNERS").read_text(), values)
    files[".github/actionlint.yaml"] = render((TEMPLATES / "actionlint.yaml").read_text(), values)
    for name in RUNNER_FILES:
        text = (TEMPLATES / "runner" / name).read_text()
        if name.endswith(".json"):  # the guard admits this repository only
            text = text.replace('"repository": "OWNER/REPO"', f'"repository": "{ci.repository}"')
        files[f"{RUNNER_DIR}/{name}"] = text
    files["asv.conf.json"] = render((TEMPLATES / "asv.conf.json").read_text(), values)
    for name in ("__init__.py", "bench_attention.py"):
        files[f"benchmarks/{name}"] = (TEMPLATES / "benchmarks" / name).read_text()
    return files


# --- what init asks for ----------------------------------------------------------------------


@dataclass(frozen=True)
class InitOptions:
    """What `attn-gate init` was told (flags, answers); None = ask, or take the default."""

    kernel: str | None = None  # a built-in name or package.module:function
    family: str | None = None  # the family's name when entry points are given
    entries: tuple[tuple[str, str], ...] = ()  # (dense|varlen|kvcache, package.module:function)
    forward_only: bool = False
    gpu_class: str | None = None
    runner_labels: tuple[str, ...] = ()
    suite: str | None = None
    cpu_suite: str | None = None
    nightly_suite: str | None = None
    repository: str | None = None
    owners: str | None = None
    install: str | None = None  # pip requirement of attn-gate in the generated jobs
    force: bool = False


Ask = Callable[[str, str], str]  # (question, default) -> answer


def git_repository(root: Path) -> str | None:
    """OWNER/REPO of the `origin` remote on GitHub, if there is one."""
    try:
        url = subprocess.run(["git", "remote", "get-url", "origin"], cwd=root, capture_output=True, text=True,
                             timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    m = REMOTE.search(url)
    return m["repo"] if m else None


def resolve(options: InitOptions, root: Path, version: str, ask: Ask | None) -> InitOptions:
    """Fill every open choice: from the flags, else the answer (interactive), else the default.
    Non-interactive (`ask` None) without a kernel is a usage error: there is no sensible default."""
    def pick(value, question, default):
        if value:
            return value
        return (ask(question, default).strip() or default) if ask else default

    kernel, family, entries = options.kernel, options.family, options.entries
    if not kernel and not entries:
        answer = ask("kernel (package.module:function, or dense=..,varlen=..,kvcache=.. for a family)", "") if ask else ""
        if not answer:
            raise UserError("init needs the kernel: --kernel package.module:function, or --dense/--varlen/--kvcache "
                            "package.module:function for a kernel family (see `attn-gate init --help`)")
        if "=" in answer:
            entries = tuple(tuple(p.strip().split("=", 1)) for p in answer.split(","))  # type: ignore[misc]
        else:
            kernel = answer
    for entry, target in entries:
        if entry not in FAMILY_ENTRIES:
            raise UserError(f"kernel family entry {entry!r}: use one of {', '.join(FAMILY_ENTRIES)}")
        if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*", target):
            raise UserError(f"--{entry} {target!r} should name a function as package.module:function")
    if entries and not family:
        family = entries[0][1].split(".")[0].split(":")[0].replace("_", "-")
    if kernel and entries:
        raise UserError("give either --kernel or the family's entry points (--dense/--varlen/--kvcache), not both")
    gpu_class = pick(options.gpu_class, "GPU class of the runners (h200, h100, ...)", "h200")
    labels = options.runner_labels or ("self-hosted", "linux", "gpu", gpu_class)
    suite = pick(options.suite, "suite gated on every PR (smoke, pr, nightly)", "pr")
    repository = options.repository or git_repository(root) or "OWNER/REPO"
    repository = pick(options.repository, "GitHub repository (OWNER/REPO)", repository)
    owner = repository.split("/")[0]
    return replace(options, kernel=kernel, family=family, entries=tuple(entries), gpu_class=gpu_class,
                   runner_labels=tuple(labels), suite=suite, cpu_suite=options.cpu_suite or "smoke",
                   nightly_suite=options.nightly_suite or "nightly", repository=repository,
                   owners=pick(options.owners, "code owners of the gate's files", f"@{owner}/maintainers"),
                   install=options.install or f"attn-gate=={version}")


def ci_config(options: InitOptions, version: str) -> CiConfig:
    """A user repository's parameters: attn-gate from the package index, the repository itself
    editable, on top of the runner's own torch (a venv with system site-packages)."""
    install = f'python3 -m venv --system-site-packages .venv && .venv/bin/python -m pip install -q "{options.install}" -e .'
    ci_run = ('python -m pip install -q --index-url "$ATTN_GATE_TORCH_INDEX_URL" torch && '
              f'python -m pip install -q "{options.install}" -e . && attn-gate check --device cpu')
    return CiConfig(repository=options.repository or "", runner_labels=options.runner_labels, owners=options.owners or "",
                    setup=install, setup_locked=install, ci_run=ci_run, nightly_suite=options.nightly_suite or "nightly",
                    protected=USER_PROTECTED, docs=DOCS_URL.format(version=version))


def toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string of printable ASCII is a TOML basic string


def pyproject_section(options: InitOptions, ci: CiConfig) -> str:
    kernel = options.family if options.entries else options.kernel
    lines = ["", "# attn-gate: the kernel it gates, the suites, and the parameters of the CI files",
             "# `attn-gate init` wrote (every key: attn-gate's docs/configuration.md)",
             "[tool.attn-gate]", 'baselines_dir = "baselines"', "",
             "[tool.attn-gate.gpu]", f"kernel = {toml_str(kernel or '')}", f"suite = {toml_str(options.suite or 'pr')}", "",
             "[tool.attn-gate.cpu]", f"kernel = {toml_str(kernel or '')}", f"suite = {toml_str(options.cpu_suite or 'smoke')}", ""]
    if options.entries:
        lines.append(f"[tool.attn-gate.kernels.{options.family}]")
        lines += [f"{entry} = {toml_str(target)}" for entry, target in options.entries]
        if options.forward_only:
            lines.append("backward = false")
        lines.append("")
    lines.append("[tool.attn-gate.ci]")
    for key in ("repository", "runner_labels", "owners", "setup", "setup_locked", "ci_run", "nightly_suite", "protected",
                "docs"):
        value = getattr(ci, key)
        shown = "[" + ", ".join(toml_str(v) for v in value) + "]" if isinstance(value, tuple) else toml_str(value)
        lines.append(f"{key} = {shown}")
    return "\n".join(lines) + "\n"


SECTION = re.compile(r"^\s*\[\[?\s*tool\.attn-gate[\].]", re.MULTILINE)
HEADER = re.compile(r"^\s*\[")


def without_section(text: str) -> str:
    """pyproject.toml text with every [tool.attn-gate...] table removed (for --force)."""
    out, inside = [], False
    for line in text.splitlines(keepends=True):
        if HEADER.match(line):
            inside = bool(SECTION.match(line))
        if not inside:
            out.append(line)
    return "".join(out).rstrip("\n") + "\n"


# --- writing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    path: str
    what: str  # wrote, replaced, unchanged, kept (differs), appended, kept (exists)


def write_files(root: Path, files: dict[str, str], force: bool) -> list[Action]:
    actions = []
    for rel, text in files.items():
        path = root / rel
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            actions.append(Action(rel, "unchanged"))
            continue
        if path.exists() and not force:
            actions.append(Action(rel, "kept (differs from the template; --force replaces it)"))
            continue
        existed = path.exists()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        if rel.endswith(".sh"):
            path.chmod(0o755)
        actions.append(Action(rel, "replaced" if existed else "wrote"))
    return actions


def write_pyproject(root: Path, section: str, force: bool) -> Action:
    path = root / "pyproject.toml"
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    if SECTION.search(text):
        if not force:
            return Action("pyproject.toml", "kept [tool.attn-gate] (exists; --force rewrites the section)")
        text = without_section(text)
        what = "rewrote [tool.attn-gate]"
    else:
        what = "appended [tool.attn-gate]" if text else "wrote (with [tool.attn-gate])"
    if text and not text.endswith("\n"):
        text += "\n"
    path.write_text(text + section, encoding="utf-8")
    return Action("pyproject.toml", what)


def init(root: Path, options: InitOptions, version: str) -> tuple[list[Action], CiConfig]:
    """Write the section and the files; options already resolved. The CI parameters are the ones
    the repository's pyproject holds when it has them (a second run renders the same files)."""

    ci = ci_config(options, version)
    action = write_pyproject(root, pyproject_section(options, ci), options.force)
    config = load_config(root / "pyproject.toml")
    if config.ci.repository:
        ci = config.ci
    return [action] + write_files(root, render_files(ci), options.force), ci


@dataclass(frozen=True)
class Drift:
    path: str
    diff: tuple[str, ...]  # unified diff lines; ("missing",) when the file is absent


def load_ci(root: Path) -> CiConfig:
    """The repository's [tool.attn-gate.ci], checked."""

    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        raise UserError(f"{pyproject}: no such file; run `attn-gate init` in the repository root")
    ci = load_config(pyproject).ci
    check_ci(ci, f"{pyproject} [tool.attn-gate.ci]")
    return ci


def check(root: Path) -> list[Drift]:
    """The files that differ from the installed templates rendered with [tool.attn-gate.ci]."""
    drift = []
    for rel, want in render_files(load_ci(root)).items():
        path = root / rel
        if not path.is_file():
            drift.append(Drift(rel, ("missing",)))
            continue
        have = path.read_text(encoding="utf-8")
        if have != want:
            diff = difflib.unified_diff(have.splitlines(), want.splitlines(), f"a/{rel}", f"b/{rel} (template)",
                                        lineterm="", n=1)
            drift.append(Drift(rel, tuple(diff)))
    return drift


def admin_checklist(ci: CiConfig) -> list[str]:
    """The one-time settings an admin clicks (the docs' "One-time setup"), with this repository's names."""
    labels = json.dumps(list(ci.runner_labels))
    r = RUNNER_DIR
    return [
        "Admin checklist (once per repository; details: " + ci.docs + "):",
        f"1. Runners: fresh machines, one job each (just-in-time runners), labels {labels}; a root-owned",
        "   python3 with CUDA torch. Put the guard in the image (as root):",
        "     install -d -m 0755 /opt/attn-gate-runner /etc/attn-gate-runner /var/lib/attn-gate-runner",
        f"     install -m 0755 {r}/job_started.sh {r}/job_started.py /opt/attn-gate-runner/",
        f"     install -m 0644 {r}/attn-gate-gpu.json /etc/attn-gate-runner/guard.json   # trusted machines: attn-gate-trusted.json",
        "     echo 'ACTIONS_RUNNER_HOOK_JOB_STARTED=/opt/attn-gate-runner/job_started.sh' >> ~runner/actions-runner/.env",
        "     plus the canary's sudoers line from the docs",
        "2. Organization settings > Actions > Runner groups: `attn-gate-gpu` (PR gate) and `attn-gate-trusted`",
        f"   (main's jobs), both limited to {ci.repository}, on separate machines.",
        "3. Settings > Actions > General: Fork pull request workflows: Require approval for all external",
        "   contributors; Workflow permissions: Read repository contents; leave 'Allow GitHub Actions to",
        "   create and approve pull requests' OFF.",
        "4. Settings > Pages > Source: GitHub Actions.",
        "5. Settings > Rules > Rulesets, on main: require status checks `attn-gate/gpu` and `CPU tests`;",
        "   require a pull request with 1 approval, Require review from Code Owners, Dismiss stale",
        "   approvals, Require approval of the most recent reviewable push. On `asv-results`: restrict",
        "   updates and deletions (bypass: GitHub Actions only), block force pushes.",
        "6. Settings > Environments > New environment `attn-gate-app`: deployment branches `main` only;",
        "   Required reviewers: your maintainers, with Prevent self-review on.",
        f"7. CODEOWNERS names {ci.owners}: make it a team or user with write access.",
        "Then: commit, push, record the baseline (Actions > baselines > Run workflow), and vet a PR",
        "with the comment `/attn-gate run <full head sha>`.",
    ]
