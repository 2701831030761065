"""The adoption path, end to end on a CPU, the way a kernel maintainer takes it: attn-gate from a
wheel built here, installed into a fresh venv, used in a copy of examples/tiny-attn outside this
repository (nothing may read this checkout's files). From the empty kernel repository to a passing
`attn-gate check` and validated workflow files in at most six commands, each timed; then a planted
regression (dK scaled by 1.02 in the backward, committed) fails `check` with the worst case on top,
and `baseline update` after accepting the change shows what moved. docs/adopt.md's walk-through
(a stranger's one-file kernel, `init --probe`, the planted dK x1.02 FAIL) runs as the page prints it.

Torch is not downloaded again: the fresh venv sees the system site-packages and, through a .pth,
this interpreter's (where CI's CPU torch lives); attn-gate itself comes only from the wheel."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

# slow; its two tests share the built wheel and venv: one worker makes them (--dist loadgroup)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("adoption")]

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MAX_COMMANDS = 6
ONLY = "bf16-b2-h4-s128-d64"  # the planted bug's bf16 cases: headroom catches both, the mean rule the non-causal one
PLANT = ("        dk = scale * ds.transpose(-1, -2) @ q\n", "        dk = 1.02 * scale * ds.transpose(-1, -2) @ q\n")


def tool(name: str) -> str:
    found = BIN / name if (BIN / name).exists() else shutil.which(name)
    assert found, f"{name} is not installed: `pip install -e '.[test]'`"
    return str(found)


def sh(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    print(f"$ {' '.join(cmd)}  -> exit {proc.returncode}\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    return proc


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=repo, check=True, capture_output=True
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """attn-gate's wheel, built from a copy of the sources (the checkout stays clean)."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "gate", src / "gate", ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(src), "-w", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr.lower(), proc.stderr  # a second user setup must be quiet too
    (built,) = out.glob("attn_gate-*.whl")
    return built


def fresh_venv(path: Path, pip: bool = True) -> Path:
    """A venv that sees this interpreter's site-packages (torch, attn-gate's dependencies) through a
    .pth, so nothing is downloaded. Without its own pip (and the old setuptools that comes with it)
    it uses this environment's, whose versions are the ones torch was installed against."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", *([] if pip else ["--without-pip"]), str(path)],
        check=True,
        timeout=120,
    )
    site = Path(
        subprocess.run(
            [str(path / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    outer = [sysconfig.get_paths()["purelib"]] + [p for p in sys.path if p.endswith("site-packages")]
    (site / "_outer_site.pth").write_text("\n".join(dict.fromkeys(outer)) + "\n")
    return path


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh venv that reuses the installed torch and attn-gate's dependencies, without attn-gate."""
    return fresh_venv(tmp_path_factory.mktemp("venv") / "v")


def test_from_an_empty_kernel_repository_to_a_gated_one(wheel, venv, tmp_path):
    repo = tmp_path / "tiny-attn"
    shutil.copytree(ROOT / "examples" / "tiny-attn", repo, ignore=shutil.ignore_patterns("__pycache__"))
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "tiny-attn")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "ATTN_GATE"))}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", COLUMNS="200")
    workflows = sorted(str(p) for p in (ROOT / "gate/workflow/templates/workflows").glob("*.yml"))
    steps = [
        (
            "install",
            [
                str(venv / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--ignore-installed",
                "--no-index",
                str(wheel),
            ],
        ),
        # installed from a local wheel, which a runner cannot reach: the jobs' install is named
        (
            "init",
            [
                "attn-gate",
                "init",
                "--dense",
                "tiny_attn:flash_attn_func",
                "--varlen",
                "tiny_attn:flash_attn_varlen_func",
                "--repository",
                "example/tiny-attn",
                "--install",
                f"attn-gate @ {wheel.as_uri()}",
                "--yes",
            ],
        ),
        ("baseline", ["attn-gate", "baseline", "update", "--no-progress"]),
        ("check", ["attn-gate", "check", "--no-progress"]),
        (
            "schema",
            [
                tool("check-jsonschema"),
                "--builtin-schema",
                "vendor.github-workflows",
                *[f".github/workflows/{Path(w).name}" for w in workflows],
            ],
        ),
        ("zizmor", [tool("zizmor"), "--offline", ".github/workflows"]),
    ]
    assert len(steps) <= MAX_COMMANDS
    times = {}
    for name, cmd in steps:
        start = time.monotonic()
        proc = sh(cmd, repo, env)
        times[name] = time.monotonic() - start
        assert proc.returncode == 0, f"{name}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    print(
        "adoption path: "
        + ", ".join(f"{n} {t:.1f} s" for n, t in times.items())
        + f"; {len(steps)} commands, {sum(times.values()):.1f} s"
    )
    assert (repo / "baselines" / "cpu" / "tiny-attn-smoke.json").is_file()

    # everything came from the wheel, nothing from this checkout
    where = sh(
        ["python", "-c", "import gate, gate.workflow.init as i; print(gate.__file__); print(i.TEMPLATES)"], repo, env
    )
    assert all(line.startswith(str(venv)) for line in where.stdout.split()), where.stdout
    suites = sh(["attn-gate", "suites"], repo, env)
    assert suites.returncode == 0 and re.search(r"^smoke\s+\d+ cases", suites.stdout, re.MULTILINE)
    again = sh(["attn-gate", "init", "--check"], repo, env)
    assert again.returncode == 0 and "18 of 18 files equal" in again.stdout
    if shutil.which("actionlint"):  # optional: not every machine has it
        assert sh(["actionlint"], repo, env).returncode == 0

    # a planted regression, committed: check fails, the worst case first
    source = repo / "tiny_attn" / "__init__.py"
    text = source.read_text()
    assert text.count(PLANT[0]) == 1
    source.write_text(text.replace(*PLANT))
    git(repo, "commit", "-q", "-am", "scale dK by 1.02")
    failed = sh(["attn-gate", "check", "--no-progress", "--only", ONLY], repo, env)
    assert failed.returncode == 1
    rows = [line.split("│") for line in failed.stdout.splitlines() if line.startswith("│ FAIL")]
    # dK x1.02 grows dK's ratio past the headroom and, where it is the whole error, its mean past the mean bound
    assert len(rows) >= 2 and all("dk" in r[4] or "dk" in r[8] for r in rows), failed.stdout
    now = [float(r[6]) for r in rows if r[3].strip() == "headroom"]
    assert len(now) >= 2 and now[0] == max(now), f"worst case not on top: {now}"

    # a failing row is never recorded: the non-causal case fails the mean rule outright
    refused = sh(["attn-gate", "baseline", "update", "--no-progress", "--only", ONLY], repo, env)
    assert refused.returncode == 1 and "bf16-b2-h4-s128-d64" in refused.stderr, refused.stderr
    # the change accepted on purpose where it is within every bound: the baseline update shows what moved
    updated = sh(["attn-gate", "baseline", "update", "--no-progress", "--only", f"{ONLY}-causal"], repo, env)
    assert updated.returncode == 0, updated.stdout + updated.stderr
    assert "1 tensor ratios moved" in updated.stdout, updated.stdout
    assert len(re.findall(r"\| `bf16-b2-h4-s128-d64-causal` \| dk \| 0\.\d+ \| 0\.\d+ \|", updated.stdout)) == 1


# A kernel repository's own build backend, with no requirements: `pip install -e .` of it needs no index.
BACKEND = """
import base64, hashlib, pathlib, zipfile

def _wheel(directory, files):
    dist = "kern-0.dist-info"
    files = {**files, f"{dist}/METADATA": "Metadata-Version: 2.1\\nName: kern\\nVersion: 0\\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\\nGenerator: kern\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}
    digest = lambda t: base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b"=").decode()
    record = [f"{p},sha256={digest(t)},{len(t.encode())}" for p, t in files.items()] + [f"{dist}/RECORD,,"]
    with zipfile.ZipFile(pathlib.Path(directory) / "kern-0-py3-none-any.whl", "w") as z:
        for p, t in {**files, f"{dist}/RECORD": "\\n".join(record) + "\\n"}.items():
            z.writestr(p, t)
    return "kern-0-py3-none-any.whl"

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, {})

def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, {"_kern.pth": str(pathlib.Path.cwd()) + "\\n"})
"""


def test_the_install_line_init_writes_installs_attn_gate_in_a_fresh_venv(wheel, venv, tmp_path):
    """attn-gate from a wheel, offline; `init` in a new kernel repository refuses to guess how a
    runner installs it, takes --install, and the setup line it renders installs attn-gate (and the
    repository) in another fresh venv with no package index."""
    import tomllib

    repo = tmp_path / "kern"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "kern_backend.py").write_text(BACKEND)
    (repo / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "kern_backend"\nbackend-path = ["."]\n\n'
        '[project]\nname = "kern"\nversion = "0"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "ATTN_GATE", "PIP_"))}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", PIP_NO_INDEX="1")
    assert (
        sh(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed", str(wheel)],
            repo,
            env,
        ).returncode
        == 0
    )
    init = ["attn-gate", "init", "--kernel", "sdpa-cpu", "--repository", "example/kern", "--yes"]
    before = (repo / "pyproject.toml").read_text()
    refused = sh(init, repo, env)
    assert refused.returncode == 2 and "--install REQUIREMENT" in refused.stderr and wheel.as_uri() in refused.stderr
    assert (repo / "pyproject.toml").read_text() == before and not (repo / ".github").exists()
    requirement = f"attn-gate @ {wheel.as_uri()}"
    assert sh([*init, "--install", requirement], repo, env).returncode == 0
    assert sh(["attn-gate", "init", "--check"], repo, env).returncode == 0
    setup = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["attn-gate"]["ci"]["setup"]
    make_venv, install = setup.split(" && ", 1)
    assert make_venv == "python3 -m venv --system-site-packages .venv" and f'"{requirement}"' in install
    fresh_venv(repo / ".venv", pip=False)  # what `make_venv` does on a runner, plus this machine's torch
    proc = subprocess.run(["bash", "-c", install], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    probe = "import gate, importlib.metadata as m; print(gate.__file__); print(m.distribution('attn-gate').read_text('direct_url.json'))"
    where = sh([str(repo / ".venv" / "bin" / "python"), "-c", probe], repo, env)
    assert where.stdout.startswith(str(repo / ".venv")) and wheel.as_uri() in where.stdout, where.stdout
    page = sh([str(repo / ".venv" / "bin" / "attn-gate"), "docs", "ci", "--path"], repo, env)
    assert page.returncode == 0 and Path(page.stdout.strip()).is_file()


# What each command of docs/adopt.md's walk-through exits with: the planted bug's check fails.
WALK_EXITS = (0, 0, 0, 0, 1)
FAIL_LINE = re.compile(r"^FAIL (\S+)  dk ([\d,.]+)x its bound$", re.M)


def test_the_walk_through_of_adopt_md_as_printed(wheel, venv, tmp_path):
    """docs/adopt.md "The walk-through, measured", run as printed: its kernel module in an empty git
    repository, then its commands, each in bash from the repository root with the venv first on
    PATH and `WHEEL` set (the doc's set-up). pip is kept offline by its environment variables."""
    import tomllib

    from tests.test_docs import ADOPT, WALK_MAX_COMMANDS, walk_through

    walk = walk_through(ADOPT.read_text())
    assert len(walk.commands) == len(WALK_EXITS) <= WALK_MAX_COMMANDS, walk.commands
    assert walk.setup[-1] == "git init mykern && cd mykern"
    repo = tmp_path / "mykern"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "mykern.py").write_text(walk.kernel)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "ATTN_GATE", "PIP_"))}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        VIRTUAL_ENV=str(venv),
        WHEEL=str(wheel),
        PIP_NO_INDEX="1",
        PIP_NO_DEPS="1",
        PIP_IGNORE_INSTALLED="1",
    )
    procs, times = [], []
    for command, want in zip(walk.commands, WALK_EXITS):
        start = time.monotonic()
        procs.append(sh(["bash", "-c", command], repo, env, timeout=600))
        times.append(time.monotonic() - start)
        assert procs[-1].returncode == want, f"{command}: exit {procs[-1].returncode}, not {want}"
    print("".join(f"walk-through: {t:6.1f} s  {c}\n" for c, t in zip(walk.commands, times)), end="")
    print(f"walk-through: {len(times)} commands, {sum(times):.1f} s")
    _, init, _, passed, failed = procs

    # attn-gate came from the wheel, into the venv
    where = sh(["python", "-c", "import gate; print(gate.__file__)"], repo, env)
    assert where.stdout.startswith(str(venv)), where.stdout
    # the probe found the envelope and init wrote it where check reads it
    table = '[tool.attn-gate.kernels."mykern:attn".supports]:\n    dtypes = ["bf16", "fp32"]\n    gqa = false\n'
    assert "2 unsupported, 0 wrong" in init.stdout and f"; the envelope goes into\n  {table}" in init.stdout, (
        init.stdout
    )
    section = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["attn-gate"]
    assert section["kernels"]["mykern:attn"]["supports"] == {"dtypes": ["bf16", "fp32"], "gqa": False}
    assert section["cpu"]["kernel"] == "mykern:attn"
    assert (repo / "baselines" / "cpu" / "mykern_attn-smoke.json").is_file()
    assert "PASS: correctness PASS" in passed.stdout and not FAIL_LINE.search(passed.stdout), passed.stdout
    # the planted dK x1.02: one line per failing case, dK against its bound, the worst first
    lines = FAIL_LINE.findall(failed.stdout)
    assert lines, failed.stdout
    ratios = [float(r.replace(",", "")) for _, r in lines]
    assert ratios[0] == max(ratios) > 1, ratios
    assert re.search(r"^FAIL: correctness FAIL in \d+ of \d+ cases", failed.stdout, re.M), failed.stdout
