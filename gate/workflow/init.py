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
import tempfile
import textwrap
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from gate.core.cases import suite_names
from gate.core.config import FAMILY_ENTRIES, CiConfig, Config, load_config
from gate.core.envelope import render_supports
from gate.core.errors import UserError
from gate.core.jsonio import checked_name, write_text_atomic
from gate.workflow.install_source import InstallSource, checkout_requirement, mismatch, requirement_in

TEMPLATES = Path(__file__).with_name("templates")
WORKFLOWS = ("baselines", "bisect", "ci", "gate", "nightly", "publish", "report", "selftest", "vet")
RUNNER_FILES = ("job_started.sh", "job_started.py", "attn-gate-gpu.json", "attn-gate-trusted.json")
RUNNER_DIR = ".github/attn-gate-runner"
PLACEHOLDER = re.compile(r"@@([a-z_]+)@@")
# Runner labels GitHub or the runner adds itself; actionlint knows them.
BUILTIN_LABELS = {"self-hosted", "linux", "x64", "arm64", "windows", "macos"}
# Other GPU classes a runner may carry (actionlint must know every label a workflow can ask for).
KNOWN_CLASSES = ("h200", "h100", "a100", "b200", "l40s")
# Where the workflows' messages and the checklist send a reader: a page shipped in the package
# (a runner's log has no link to follow; a URL would have to exist for every version).
DOCS = "attn-gate docs ci"
# What init writes where it could not infer a value and --placeholders allowed it.
PLACEHOLDER_REPOSITORY = "OWNER/REPO"
PLACEHOLDER_OWNERS = "@OWNER/maintainers"
# what decides a user repository's verdict: its CI, baselines, benchmarks, tests and what pip
# runs or reads when it installs the repository
USER_PROTECTED = (
    ".github/",
    "baselines/",
    "benchmarks/",
    "tests/",
    "pyproject.toml",
    "asv.conf.json",
    "setup.py",
    "setup.cfg",
    "conftest.py",
    "requirements*",
)
# a CODEOWNERS owner GitHub accepts: @user, @org/team or an email (an owner it cannot read makes
# it skip the line, and "require review from code owners" then protects nothing)
OWNER = (
    r"(?:@[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})(?:/[A-Za-z0-9][A-Za-z0-9._-]{0,99})?"
    r"|[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63})+)"
)
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
    labels = [lb for lb in ci.runner_labels if lb not in BUILTIN_LABELS]
    width = max(len(f"/{p}") for p in ("*",) + ci.protected)
    owners = [f"{'*':{width}} {ci.owners}"] + [f"{'/' + p:{width}} {ci.owners}" for p in ci.protected]
    project = ci.repository.rsplit("/", 1)[-1]
    return {
        "runner_labels": json.dumps(list(ci.runner_labels), separators=(",", ":")),
        "setup": ci.setup,
        "setup_locked": ci.setup_locked,
        "ci_run": ci.ci_run,
        "nightly_suite": ci.nightly_suite,
        "ci_docs": ci.docs,
        "protected_js": "[" + ", ".join(f"'{p}'" for p in ci.protected) + "]",
        "codeowners": "\n".join(owners),
        "actionlint_labels": "\n".join(f"- {lb}" for lb in dict.fromkeys(labels + list(KNOWN_CLASSES))),
        "project": project,
        "project_url": f"https://github.com/{ci.repository}",
    }


def check_ci(ci: CiConfig, where: str = "[tool.attn-gate.ci]") -> None:
    """Refuse parameters that would render a broken or unsafe file (the values land in YAML and shell)."""
    for key in ("repository", "owners", "setup", "setup_locked", "ci_run", "docs"):
        if not getattr(ci, key):
            raise UserError(f"{where}: {key} is empty; run `attn-gate init` to write the section")
    if not REPOSITORY.match(ci.repository):
        raise UserError(f"{where}: repository = {ci.repository!r} should be OWNER/REPO")
    if not ci.runner_labels or not all(re.fullmatch(r"[A-Za-z0-9._-]+", lb) for lb in ci.runner_labels):
        raise UserError(
            f"{where}: runner_labels = {list(ci.runner_labels)!r} should be runner labels "
            f'(letters, digits, . _ -), e.g. ["self-hosted", "linux", "gpu", "h200"]'
        )
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,63}", ci.nightly_suite):
        raise UserError(f"{where}: nightly_suite = {ci.nightly_suite!r} should be a suite name")
    if not ci.protected or not all(re.fullmatch(r"[A-Za-z0-9._/-]+\*?", p) for p in ci.protected):
        raise UserError(f"{where}: protected should list repository paths (a folder ends with /, a prefix with *)")
    if not re.fullmatch(f"{OWNER}( {OWNER})*", ci.owners):
        raise UserError(f"{where}: owners = {ci.owners!r} should be @user, @org/team or an email, space-separated")
    for key in ("setup", "setup_locked", "ci_run", "docs"):
        value = getattr(ci, key)
        # one plain YAML scalar on a `run:` line or inside a message: no expressions, no comment starts
        if "${{" in value or " #" in value or ": " in value or value[:1] in "!&*{[|>'\"%@`#-?,":
            raise UserError(
                f"{where}: {key} = {value!r} cannot stand in a workflow as it is "
                f"(no '${{{{', ' #', ': ' or a leading YAML indicator); wrap it in a script"
            )


def render_files(ci: CiConfig) -> dict[str, str]:
    """Repository path -> content of every file the templates give, for these parameters."""
    check_ci(ci)
    values = template_values(ci)
    files = {
        f".github/workflows/{w}.yml": render((TEMPLATES / "workflows" / f"{w}.yml").read_text(), values)
        for w in WORKFLOWS
    }
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
    placeholders: bool = False  # write OWNER/REPO where the repository cannot be inferred
    supports: dict | None = None  # `--probe`: the envelope found (gate/workflow/probe.py), written as its table


Ask = Callable[[str, str], str]  # (question, default) -> answer
KERNEL_TARGET = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
# An --install value lands inside a double-quoted shell word of a workflow line.
INSTALL_VALUE = re.compile(r"[A-Za-z0-9_.,:/@+=<>!~#%\[\] -]+")


def git_repository(root: Path) -> str | None:
    """OWNER/REPO of the `origin` remote on GitHub, if there is one."""
    try:
        url = subprocess.run(
            ["git", "remote", "get-url", "origin"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    m = REMOTE.search(url)
    return m["repo"] if m else None


def existing_config(root: Path) -> Config | None:
    """The repository's configuration when pyproject.toml already has [tool.attn-gate] (its values
    are the defaults of a re-run), else None. A pyproject.toml init cannot read is refused here."""
    text = read_pyproject(root)
    if text is None or "attn-gate" not in tool_table(text):
        return None
    return load_config(root / "pyproject.toml")


def install_requirement(options: InitOptions, source: InstallSource) -> str:
    """The attn-gate requirement the jobs install: --install, else where this attn-gate came from."""
    if options.install:
        if not INSTALL_VALUE.fullmatch(options.install):
            raise UserError(
                f"--install {options.install!r}: give one pip requirement, e.g. "
                f"'attn-gate @ git+<attn-gate repository URL>@<commit>' (no quotes, $, `, ; or |)"
            )
        return options.install
    if source.requirement is None:
        pushed = checkout_requirement(source.where)
        example = (
            f"--install '{pushed}' (once that commit is pushed)"
            if pushed
            else "--install 'attn-gate @ git+<attn-gate repository URL>@<commit>'"
        )
        raise UserError(
            f"attn-gate was installed from {source.where}, which a CI runner cannot reach: pass "
            f'--install REQUIREMENT, e.g. {example} (`attn-gate docs adopt`, "Install")'
        )
    return source.requirement


def check_names(kernel: str | None, family: str | None, suites: dict[str, str | None], config: Config | None) -> None:
    """Refuse a kernel or suite name the gate could not run, before anything is written."""
    from gate.kernels.registry import kernel_names

    families = config.kernels if config is not None else {}
    if kernel and not (KERNEL_TARGET.fullmatch(kernel) or kernel in kernel_names() or kernel in families):
        raise UserError(
            f"--kernel {kernel!r} should be package.module:function or a built-in kernel "
            f"(`attn-gate kernels` lists them)"
        )
    if family:
        try:
            checked_name(family, "--family")
        except ValueError as exc:
            raise UserError(str(exc)) from None
    known = suite_names(config.suites if config is not None else None)
    for flag, name in suites.items():
        if name is not None and name not in known:
            raise UserError(f"{flag} {name!r} is not a suite; choose one of: {', '.join(known)}")


def resolve(options: InitOptions, root: Path, source: InstallSource, ask: Ask | None) -> InitOptions:
    """Fill every open choice: from the flags, else the answer (interactive), else the default.
    Non-interactive (`ask` None) without a kernel is a usage error: there is no sensible default.
    A repository that already has the section gives its repository and owners as defaults; one
    that cannot be inferred is refused unless `placeholders` (then it is OWNER/REPO)."""

    def pick(value, question, default):
        if value:
            return value
        return (ask(question, default).strip() or default) if ask else default

    existing = existing_config(root)
    kernel, family, entries = options.kernel, options.family, options.entries
    if not kernel and not entries:
        answer = (
            ask("kernel (package.module:function, or dense=..,varlen=..,kvcache=.. for a family)", "") if ask else ""
        )
        if not answer:
            raise UserError(
                "init needs the kernel: --kernel package.module:function, or --dense/--varlen/--kvcache "
                "package.module:function for a kernel family (see `attn-gate init --help`)"
            )
        if "=" in answer:
            entries = tuple(tuple(p.strip().split("=", 1)) for p in answer.split(","))  # type: ignore[misc]
        else:
            kernel = answer
    for entry, target in entries:
        if entry not in FAMILY_ENTRIES:
            raise UserError(f"kernel family entry {entry!r}: use one of {', '.join(FAMILY_ENTRIES)}")
        if not KERNEL_TARGET.fullmatch(target):
            raise UserError(f"--{entry} {target!r} should name a function as package.module:function")
    if entries and not family:
        family = entries[0][1].split(".")[0].split(":")[0].replace("_", "-")
    if kernel and entries:
        raise UserError("give either --kernel or the family's entry points (--dense/--varlen/--kvcache), not both")
    gpu_class = pick(options.gpu_class, "GPU class of the runners (h200, h100, ...)", "h200")
    try:
        checked_name(gpu_class, "--gpu-class")
    except ValueError as exc:
        raise UserError(str(exc)) from None
    labels = options.runner_labels or ("self-hosted", "linux", "gpu", gpu_class)
    suite = pick(options.suite, "suite gated on every PR (smoke, pr, nightly)", "pr")
    check_names(
        kernel,
        family if entries else None,
        {"--suite": suite, "--cpu-suite": options.cpu_suite, "--nightly-suite": options.nightly_suite},
        existing,
    )
    known_repository = (
        existing.ci.repository if existing is not None and existing.ci.repository else git_repository(root)
    )
    # every option init cannot infer here is named in one refusal, not one per run
    missing: list[str] = []
    repository = pick(options.repository, "GitHub repository (OWNER/REPO)", known_repository or "")
    if not repository:
        if not options.placeholders:
            missing.append(
                "init cannot infer the repository (no GitHub `origin` remote): pass --repository OWNER/REPO "
                "(and --owners @org/team), or --placeholders to write OWNER/REPO and fill it in later"
            )
        else:
            repository = PLACEHOLDER_REPOSITORY
    if repository and not REPOSITORY.match(repository):
        raise UserError(f"--repository {repository!r} should be OWNER/REPO, e.g. myorg/mykernels")
    known_owners = existing.ci.owners if existing is not None and existing.ci.owners else None
    if known_owners is None and repository and repository != PLACEHOLDER_REPOSITORY:
        known_owners = f"@{repository.split('/')[0]}/maintainers"
    owners = pick(options.owners, "code owners of the gate's files", known_owners or "")
    if not owners:
        if options.placeholders:
            owners = PLACEHOLDER_OWNERS
        elif repository:  # without one, the repository's line names --owners too
            missing.append("init cannot infer the code owners: pass --owners @org/team, or --placeholders")
    try:
        install = install_requirement(options, source)
    except UserError as exc:
        if not missing:
            raise
        missing.append(str(exc))
    if missing:
        raise UserError("; and ".join(missing))
    return replace(
        options,
        kernel=kernel,
        family=family,
        entries=tuple(entries),
        gpu_class=gpu_class,
        runner_labels=tuple(labels),
        suite=suite,
        cpu_suite=options.cpu_suite or "smoke",
        nightly_suite=options.nightly_suite or "nightly",
        repository=repository,
        owners=owners,
        install=install,
    )


def ci_config(options: InitOptions) -> CiConfig:
    """A user repository's parameters: attn-gate as `install` names it, the repository itself
    editable, on top of the runner's own torch (a venv with system site-packages)."""
    install = (
        f'python3 -m venv --system-site-packages .venv && .venv/bin/python -m pip install -q "{options.install}" -e .'
    )
    ci_run = (
        'python -m pip install -q --index-url "$ATTN_GATE_TORCH_INDEX_URL" torch && '
        f'python -m pip install -q "{options.install}" -e . && attn-gate check --device cpu'
    )
    return CiConfig(
        repository=options.repository or "",
        runner_labels=options.runner_labels,
        owners=options.owners or "",
        setup=install,
        setup_locked=install,
        ci_run=ci_run,
        nightly_suite=options.nightly_suite or "nightly",
        protected=USER_PROTECTED,
        docs=DOCS,
    )


def placeholders(ci: CiConfig) -> list[str]:
    """The `[tool.attn-gate.ci]` values that are placeholders init wrote, not a real name."""
    found = []
    if ci.repository == PLACEHOLDER_REPOSITORY:
        found.append(f"repository = {ci.repository!r}")
    if "@OWNER/" in ci.owners:
        found.append(f"owners = {ci.owners!r}")
    return found


def toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string of printable ASCII is a TOML basic string


def pyproject_section(options: InitOptions, ci: CiConfig) -> str:
    kernel = options.family if options.entries else options.kernel
    lines = [
        "",
        "# attn-gate: the kernel it gates, the suites, and the parameters of the CI files",
        "# `attn-gate init` wrote (every key: `attn-gate docs configuration`)",
        "[tool.attn-gate]",
        'baselines_dir = "baselines"',
        "",
        "[tool.attn-gate.gpu]",
        f"kernel = {toml_str(kernel or '')}",
        f"suite = {toml_str(options.suite or 'pr')}",
        "",
        "[tool.attn-gate.cpu]",
        f"kernel = {toml_str(kernel or '')}",
        f"suite = {toml_str(options.cpu_suite or 'smoke')}",
        "",
    ]
    if options.entries:
        lines.append(f"[tool.attn-gate.kernels.{options.family}]")
        lines += [f"{entry} = {toml_str(target)}" for entry, target in options.entries]
        if options.forward_only:
            lines.append("backward = false")
        lines.append("")
    if options.supports is not None:
        name = options.family if options.entries else json.dumps(options.kernel)
        lines.append("# the envelope `attn-gate init --probe` found; cases outside it SKIP (docs/kernels.md)")
        lines += render_supports(options.supports, f"tool.attn-gate.kernels.{name}.supports").splitlines() + [""]
    lines.append("[tool.attn-gate.ci]")
    for key in (
        "repository",
        "runner_labels",
        "owners",
        "setup",
        "setup_locked",
        "ci_run",
        "nightly_suite",
        "protected",
        "docs",
    ):
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


@dataclass(frozen=True)
class InitResult:
    actions: tuple[Action, ...]
    ci: CiConfig  # the parameters the files were rendered with
    todo: tuple[str, ...]  # what the user still has to do before the files work (placeholders first)


def read_pyproject(root: Path) -> str | None:
    """pyproject.toml's text (None when absent); one line and exit 2 for anything init cannot edit."""
    path = root / "pyproject.toml"
    if path.is_symlink():
        raise UserError(f"{path} is a symbolic link: init edits no file through a link; run it where the file is")
    if not path.exists():
        return None
    if not path.is_file():
        raise UserError(f"{path} is not a file: remove or rename it, then run `attn-gate init` again")
    try:
        text = path.read_text(encoding="utf-8")
        tomllib.loads(text)
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text (TOML must be): re-save it as UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: invalid TOML ({exc}); fix it, then run `attn-gate init` again") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read it ({exc.strerror})") from None
    return text


def tool_table(text: str) -> dict:
    """pyproject.toml's [tool] table ({} when absent or not a table: appending to it then fails the
    parse of the result, which names the problem)."""
    tool = tomllib.loads(text).get("tool")
    return tool if isinstance(tool, dict) else {}


def new_pyproject(text: str | None, section: str, force: bool) -> tuple[str | None, str]:
    """(pyproject.toml's new text or None to keep it, what happened). The section is either tables
    init can find and replace or absent: dotted keys (`[tool] attn-gate.x = ..`) are refused, since
    appending a table would make the file invalid."""
    text = text or ""
    tables = bool(SECTION.search(text))
    remaining = without_section(text) if tables else text
    if "attn-gate" in tool_table(remaining):
        raise UserError(
            "pyproject.toml sets tool.attn-gate with dotted keys or an inline table, which init cannot "
            "rewrite: move those keys under a [tool.attn-gate] table header, then run init again"
        )
    if tables and not force:
        existing = tool_table(text).get("attn-gate")
        if isinstance(existing, dict) and "ci" not in existing:  # written by hand: add what the files need
            ci_table = section[section.index("[tool.attn-gate.ci]") :]
            return text + ("\n" if not text.endswith("\n") else "") + "\n" + ci_table, "appended [tool.attn-gate.ci]"
        return None, "kept [tool.attn-gate] (exists; --force rewrites the section)"
    what = (
        "rewrote [tool.attn-gate]"
        if tables
        else "appended [tool.attn-gate]"
        if text
        else "wrote (with [tool.attn-gate])"
    )
    if remaining and not remaining.endswith("\n"):
        remaining += "\n"
    before = remaining if tables else text + ("\n" if text and not text.endswith("\n") else "")
    return before + (section if before else section.lstrip("\n")), what  # a new file starts with its first line


def parsed_config(text: str) -> Config:
    """The configuration a pyproject.toml text would give (read from a scratch copy)."""
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"pyproject.toml would not be valid TOML after init ({exc}); nothing was written") from None
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "pyproject.toml"
        path.write_text(text, encoding="utf-8")
        return load_config(path)


def target_problem(root: Path, rel: str) -> str | None:
    """Why init may not write `rel` under `root` (a link or a file on its way), or None.
    A link to the file itself is replaced, never written through; a link among its folders is refused."""
    parts = Path(rel).parts
    for i in range(1, len(parts)):
        folder = root.joinpath(*parts[:i])
        if folder.is_symlink():
            return f"{folder} is a symbolic link: init writes no file through a link; replace it with a folder"
        if folder.exists() and not folder.is_dir():
            return f"{folder} is a file where init needs a folder ({rel}): move it away, then run init again"
    path = root / rel
    if path.exists() and not path.is_symlink() and not path.is_file():
        return f"{path} is not a file: move it away, then run init again"
    return None


def plan_files(root: Path, files: dict[str, str], force: bool) -> list[tuple[str, str, bool]]:
    """(path, what, write?) for each file; refuses (writing nothing) a path it may not write."""
    for rel in files:
        problem = target_problem(root, rel)
        if problem:
            raise UserError(problem)
    plan = []
    for rel, text in files.items():
        path = root / rel
        if path.is_symlink():
            plan.append(
                (rel, "replaced (was a symbolic link)", True)
                if force
                else (rel, "kept (a symbolic link; --force replaces the link, never its target)", False)
            )
        elif path.is_file() and path.read_bytes() == text.encode("utf-8"):
            plan.append((rel, "unchanged", False))
        elif path.exists():
            plan.append(
                (rel, "replaced", True)
                if force
                else (rel, "kept (differs from the template; --force replaces it)", False)
            )
        else:
            plan.append((rel, "wrote", True))
    return plan


def write_file(root: Path, rel: str, text: str) -> None:
    path = root / rel
    if path.is_symlink():
        path.unlink()  # the link goes; its target is never opened
    write_text_atomic(path, text)
    if rel.endswith(".sh"):
        path.chmod(0o755)


GITIGNORE_LINE = "out/"


def gitignore_text(root: Path) -> str | None:
    """.gitignore with `out/` (the reports' default folder) added; None when it already ignores it."""
    path = root / ".gitignore"
    try:
        text = path.read_text(encoding="utf-8") if path.is_file() else ""
    except (UnicodeDecodeError, OSError):
        raise UserError(f"{path} is not readable UTF-8 text: add the line {GITIGNORE_LINE} yourself") from None
    if any(line.strip() in ("out", "out/", "/out", "/out/") for line in text.splitlines()):
        return None
    return text + ("\n" if text and not text.endswith("\n") else "") + GITIGNORE_LINE + "\n"


def changed_keys(old: Config, new: Config) -> list[str]:
    """The keys init sets whose value in the repository differs from what these flags give, one
    `key: old -> new` each; the install lines by the attn-gate requirement they name."""
    show = lambda v: list(v) if isinstance(v, tuple) else v  # noqa: E731
    keys = [
        ("gpu.kernel", old.gpu.kernel, new.gpu.kernel),
        ("gpu.suite", old.gpu.suite, new.gpu.suite),
        ("cpu.kernel", old.cpu.kernel, new.cpu.kernel),
        ("cpu.suite", old.cpu.suite, new.cpu.suite),
    ]
    keys += [
        (f"ci.{k}", getattr(old.ci, k), getattr(new.ci, k))
        for k in ("repository", "runner_labels", "owners", "nightly_suite")
    ]
    keys += [(f"kernels.{n}", old.kernels.get(n), new.kernels.get(n)) for n in new.kernels]
    lines = [f"{k}: {show(a)!r} -> {show(b)!r}" for k, a, b in keys if a != b]
    install = [k for k in ("setup", "setup_locked", "ci_run") if getattr(old.ci, k) != getattr(new.ci, k)]
    if install:
        was, now = (requirement_in(getattr(c, install[0])) or getattr(c, install[0]) for c in (old.ci, new.ci))
        lines.append(f"{', '.join(f'ci.{k}' for k in install)}: install {was!r} -> {now!r}")
    return lines


def init(root: Path, options: InitOptions) -> InitResult:
    """Write the section, the files and `out/` into .gitignore; options already resolved. Everything
    is decided and checked first, then written: a refusal writes nothing. The CI parameters are the
    ones the repository's pyproject holds when it has them (a second run renders the same files);
    where the flags would give other values, the result says which, and what --force rewrites."""
    text = read_pyproject(root)
    ci = ci_config(options)
    pyproject, what = new_pyproject(text, pyproject_section(options, ci), options.force)
    # what the flags give (the new text, or the kept section's stand-in) and what stays on disk
    wanted = parsed_config(
        pyproject if pyproject is not None else without_section(text or "") + pyproject_section(options, ci)
    )
    current = wanted if pyproject is not None else parsed_config(text or "")
    if pyproject is not None and current.ci != ci:  # the file's own ci keys would win over init's
        raise UserError("pyproject.toml's [tool.attn-gate.ci] would not be the one init writes; nothing was written")
    files = render_files(current.ci)
    plan = plan_files(root, files, options.force)
    gitignore = gitignore_text(root)
    problem = target_problem(root, ".gitignore") or (
        (root / ".gitignore").is_symlink()
        and f"{root / '.gitignore'} is a symbolic link: add {GITIGNORE_LINE} yourself"
    )
    if gitignore is not None and problem:
        raise UserError(problem)
    todo = []
    holders = placeholders(current.ci)
    if holders:
        todo.append(
            f"replace the placeholders in pyproject.toml [tool.attn-gate.ci] ({', '.join(holders)}): "
            f"`attn-gate init --repository OWNER/REPO --owners @org/team --force` (the files name them too)"
        )
    if pyproject is None:
        differ = changed_keys(current, wanted)
        if differ:
            rewrite = [rel for rel, text_ in render_files(wanted.ci).items() if files.get(rel) != text_]
            todo.append(
                "pyproject.toml [tool.attn-gate] is kept; the flags give other values:\n"
                + "".join(f"     {line}\n" for line in differ)
                + "   `attn-gate init --force` rewrites the section"
                + (f" and {len(rewrite)} files: {', '.join(rewrite)}" if rewrite else "")
            )

    if pyproject is not None:
        write_text_atomic(root / "pyproject.toml", pyproject)
    actions = [Action("pyproject.toml", what)]
    for rel, what_file, write in plan:
        if write:
            write_file(root, rel, files[rel])
        actions.append(Action(rel, what_file))
    if gitignore is not None:
        existed = (root / ".gitignore").exists()
        write_text_atomic(root / ".gitignore", gitignore)
        actions.append(Action(".gitignore", f"added {GITIGNORE_LINE}" if existed else "wrote"))
    else:
        actions.append(Action(".gitignore", "unchanged"))
    return InitResult(tuple(actions), current.ci, tuple(todo))


@dataclass(frozen=True)
class Drift:
    path: str
    diff: tuple[str, ...]  # unified diff lines; ("missing",) when the file is absent


def load_ci(root: Path) -> CiConfig:
    """The repository's [tool.attn-gate.ci], checked."""

    pyproject = root / "pyproject.toml"
    if read_pyproject(root) is None:
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
            diff = difflib.unified_diff(
                have.splitlines(), want.splitlines(), f"a/{rel}", f"b/{rel} (template)", lineterm="", n=1
            )
            drift.append(Drift(rel, tuple(diff)))
    return drift


def value_problems(ci: CiConfig, source: InstallSource, version: str) -> list[str]:
    """What makes the files wrong though they equal their templates: a placeholder init wrote, or
    an install line that cannot give the attn-gate installed here (the jobs would test another)."""
    found = [
        f"placeholder {p}: `attn-gate init --repository OWNER/REPO --owners @org/team --force` replaces it"
        for p in placeholders(ci)
    ]
    for key in ("setup", "setup_locked", "ci_run"):
        why = mismatch(getattr(ci, key), source, version)
        if why:
            found.append(
                f"install line [tool.attn-gate.ci] {key} {why}: `attn-gate init --force` rewrites it "
                f"(or pass --install REQUIREMENT)"
            )
    return found


def admin_checklist(ci: CiConfig) -> list[tuple[str, str]]:
    """The one-time settings an admin clicks (the docs' "One-time setup"), with this repository's
    names, as (kind, text): "head" and "item" are prose (an item numbered in its text), "more" a
    paragraph continuing the item above, "cmd" a shell line; `render_checklist` wraps them."""
    labels = json.dumps(list(ci.runner_labels))
    r = RUNNER_DIR
    return [
        ("head", f"Admin checklist (once per repository; details: {ci.docs}):"),
        (
            "item",
            f"1. Runners: fresh machines, one job each (just-in-time runners), labels {labels}; a root-owned "
            "python3 with CUDA torch. Put the guard in the image (as root):",
        ),
        ("cmd", "install -d -m 0755 /opt/attn-gate-runner /etc/attn-gate-runner /var/lib/attn-gate-runner"),
        ("cmd", f"install -m 0755 {r}/job_started.sh {r}/job_started.py /opt/attn-gate-runner/"),
        ("cmd", f"install -m 0644 {r}/attn-gate-gpu.json /etc/attn-gate-runner/guard.json"),
        (
            "cmd",
            "echo 'ACTIONS_RUNNER_HOOK_JOB_STARTED=/opt/attn-gate-runner/job_started.sh' >> ~runner/actions-runner/.env",
        ),
        (
            "more",
            "On the trusted machines the guard's settings are attn-gate-trusted.json. Add the canary's sudoers "
            "line from the docs. The runner install root-owned, except _work/, _diag/ and the JIT registration "
            "files .runner, .credentials, .credentials_rsaparams (pre-create them owned by the runner user, mode "
            "0600: the JIT runner writes them at start). Keep @runner in read_only_paths.",
        ),
        (
            "item",
            "2. Organization settings > Actions > Runner groups: `attn-gate-gpu` (PR gate) and `attn-gate-trusted` "
            f"(main's jobs), both limited to {ci.repository}, on separate machines.",
        ),
        (
            "more",
            "The PR pool runs vetted PR code, which is arbitrary code: give it its own network segment, no "
            "instance role or cloud credentials, the metadata service (169.254.169.254) blocked for the runner, "
            "egress only to GitHub, the Actions service and the package index, and no route to the trusted pool. "
            "The guard refuses a job on a host that reaches the metadata service.",
        ),
        (
            "item",
            "3. Settings > Actions > General: Fork pull request workflows: Require approval for all external "
            "contributors; Workflow permissions: Read repository contents; leave 'Allow GitHub Actions to "
            "create and approve pull requests' OFF.",
        ),
        ("item", "4. Settings > Pages > Source: GitHub Actions."),
        (
            "item",
            "5. Settings > Rules > Rulesets, on main: require status checks `attn-gate/gpu` and `CPU tests`; "
            "require a pull request with 1 approval, Require review from Code Owners, Dismiss stale approvals, "
            "Require approval of the most recent reviewable push. On `asv-results`: restrict updates and "
            "deletions (bypass: GitHub Actions only), block force pushes.",
        ),
        (
            "item",
            "6. Settings > Environments > New environment `attn-gate-app`: deployment branches `main` only; "
            "Required reviewers: your maintainers, with Prevent self-review on.",
        ),
        ("item", f"7. CODEOWNERS names {ci.owners}: make it a team or user with write access."),
        (
            "head",
            "Then: commit, push, record the baseline (Actions > baselines > Run workflow), and vet a PR with "
            "the comment `/attn-gate run <full head sha>`.",
        ),
    ]


def _command_lines(command: str, width: int, indent: str) -> list[str]:
    """A shell line cut at spaces into lines of at most `width` (a word longer stays whole), each
    but the last ending in ` \\`: pasted into a shell, it is the same command."""
    lines, line = [], ""
    for word in command.split(" "):
        if line and len(indent) + len(line) + 1 + len(word) + 2 > width:
            lines.append(f"{indent}{line} \\")
            line = "  " + word
        else:
            line = f"{line} {word}" if line else word
    return lines + [f"{indent}{line}"]


def render_checklist(items: list[tuple[str, str]], width: int) -> list[str]:
    """The checklist as lines of at most `width` columns: prose wrapped at words, items' following
    lines indented under their text, shell lines cut with continuations."""
    out = []
    for kind, text in items:
        if kind == "cmd":
            out += _command_lines(text, width, "     ")
        else:
            first = "" if kind in ("head", "item") else "   "
            rest = "   " if kind in ("item", "more") else ""
            out += textwrap.wrap(text, width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False)
    return out
