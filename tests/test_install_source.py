"""Where attn-gate came from (the installed distribution's PEP 610 record) decides the install line
`init` writes into the workflows, and `init --check` flags a line that cannot give this attn-gate."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gate.commands import init as init_command
from gate.commands.main import main
from gate.workflow import install_source as S

ROOT = Path(__file__).resolve().parents[1]
COMMIT = "3f5a" * 10
URL = "https://git.example.com/kernels/attn-gate.git"


def record(**fields) -> str:
    return json.dumps(fields)


@pytest.mark.parametrize(
    "text, kind, requirement",
    [
        (None, "index", "attn-gate==0.1.0"),
        (
            record(url=URL, vcs_info={"vcs": "git", "commit_id": COMMIT, "requested_revision": "main"}),
            "vcs",
            f"attn-gate @ git+{URL}@{COMMIT}",
        ),
        (
            record(url="git@github.com:someone/attn-gate.git", vcs_info={"vcs": "git", "commit_id": COMMIT}),
            "vcs",
            f"attn-gate @ git+git@github.com:someone/attn-gate.git@{COMMIT}",
        ),
        (
            record(
                url="https://files.example.com/attn_gate-0.1.0-py3-none-any.whl",
                archive_info={"hashes": {"sha256": "ab" * 32}},
            ),
            "archive",
            "attn-gate @ https://files.example.com/attn_gate-0.1.0-py3-none-any.whl#sha256=" + "ab" * 32,
        ),
        # what a runner cannot reach: a local clone, a local wheel, a checkout (editable or not)
        (record(url="file:///home/me/attn-gate", vcs_info={"vcs": "git", "commit_id": COMMIT}), "local", None),
        (
            record(
                url="file:///tmp/dist/attn_gate-0.1.0-py3-none-any.whl", archive_info={"hashes": {"sha256": "ab" * 32}}
            ),
            "local",
            None,
        ),
        (record(url="file:///home/me/attn-gate", dir_info={"editable": True}), "local", None),
        (record(url=URL, vcs_info={"vcs": "git", "commit_id": "not-a-sha"}), "local", None),
        ("{not json", "local", None),
        ("[1, 2]", "local", None),
    ],
)
def test_the_direct_url_record_gives_the_requirement(text, kind, requirement):
    source = S.from_direct_url(text, "0.1.0")
    assert (source.kind, source.requirement) == (kind, requirement)


@pytest.mark.parametrize(
    "line, source, why",
    [
        ('pip install -q "attn-gate==0.1.0" -e .', S.from_direct_url(None, "0.1.0"), None),
        ('pip install -q "attn-gate==0.0.9" -e .', S.from_direct_url(None, "0.1.0"), "installs 'attn-gate==0.0.9'"),
        (
            'pip install -q "attn-gate==0.1.0" -e .',
            S.InstallSource("vcs", f"attn-gate @ git+{URL}@{COMMIT}", f"git+{URL}@{COMMIT}"),
            f"came from git+{URL}@{COMMIT}",
        ),
        (
            f'pip install -q "attn-gate @ git+{URL}@{COMMIT}" -e .',
            S.InstallSource("vcs", f"attn-gate @ git+{URL}@{COMMIT}", "x"),
            None,
        ),
        (
            f'pip install -q "attn-gate @ git+{URL}@{"0" * 40}" -e .',
            S.InstallSource("vcs", f"attn-gate @ git+{URL}@{COMMIT}", "x"),
            "installs 'attn-gate @ git+",
        ),
        ('pip install -q "attn-gate==0.0.9"', S.InstallSource("local", None, "a source checkout"), "is version 0.1.0"),
        ("bash scripts/setup.sh", S.from_direct_url(None, "0.1.0"), None),  # a script installs it: nothing to compare
    ],
)
def test_an_install_line_that_cannot_give_this_attn_gate_is_named(line, source, why):
    found = S.mismatch(line, source, "0.1.0")
    assert found is None if why is None else why in found


@pytest.fixture
def repo(tmp_path):
    dst = tmp_path / "tiny-attn"
    shutil.copytree(ROOT / "examples" / "tiny-attn", dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def init_args(repo: Path, *more: str) -> list[str]:
    return [
        "init",
        "--dir",
        str(repo),
        "--yes",
        "--repository",
        "me/tiny",
        "--kernel",
        "tiny_attn:flash_attn_func",
        *more,
    ]


def test_init_writes_the_requirement_this_attn_gate_came_from(repo, monkeypatch):
    vcs = S.from_direct_url(record(url=URL, vcs_info={"vcs": "git", "commit_id": COMMIT}), "0.1.0")
    monkeypatch.setattr(init_command, "installed_source", lambda version: vcs)
    assert main(init_args(repo)) == 0
    gate_yml = (repo / ".github/workflows/gate.yml").read_text()
    assert f'pip install -q "attn-gate @ git+{URL}@{COMMIT}" -e .' in gate_yml
    assert "attn-gate==" not in gate_yml + (repo / ".github/workflows/ci.yml").read_text()
    assert main(["init", "--check", "--dir", str(repo)]) == 0


def test_init_from_a_local_install_names_the_install_flag_and_writes_nothing(repo, monkeypatch, capsys):
    local = S.from_direct_url(record(url="file:///tmp/dist/attn_gate-0.1.0-py3-none-any.whl", archive_info={}), "0.1.0")
    monkeypatch.setattr(init_command, "installed_source", lambda version: local)
    before = sorted(p.name for p in repo.rglob("*"))
    assert main(init_args(repo)) == 2
    err = capsys.readouterr().err
    assert "file:///tmp/dist/attn_gate-0.1.0-py3-none-any.whl" in err and "--install REQUIREMENT" in err
    assert sorted(p.name for p in repo.rglob("*")) == before
    assert main(init_args(repo, "--install", f"attn-gate @ git+{URL}@{COMMIT}")) == 0


def test_init_check_flags_an_install_line_the_installed_attn_gate_cannot_come_from(repo, monkeypatch, capsys):
    monkeypatch.setattr(init_command, "installed_source", lambda version: S.from_direct_url(None, "0.1.0"))
    assert main(init_args(repo)) == 0  # attn-gate==0.1.0, from the index
    capsys.readouterr()
    vcs = S.from_direct_url(record(url=URL, vcs_info={"vcs": "git", "commit_id": COMMIT}), "0.1.0")
    monkeypatch.setattr(init_command, "installed_source", lambda version: vcs)
    assert main(["init", "--check", "--dir", str(repo)]) == 1
    out = capsys.readouterr().out
    assert "install line [tool.attn-gate.ci] setup installs 'attn-gate==0.1.0'" in out and COMMIT in out
    assert "18 of 18 files equal" in out and "to fix" in out


@pytest.mark.parametrize(
    "value", ['attn-gate" && curl x | sh', "attn-gate==$(id)", "attn-gate`id`", "attn-gate; rm -rf ."]
)
def test_an_install_value_that_would_escape_its_shell_word_is_refused(repo, capsys, value):
    assert main(init_args(repo, "--install", value)) == 2
    assert "--install" in capsys.readouterr().err
    assert not (repo / ".github").exists()


def test_a_local_checkout_suggests_its_pushed_commit(tmp_path, repo, monkeypatch, capsys):
    """Installed from a git checkout (`pip install -e .`): the refusal names the --install of its
    HEAD at its `origin`, the one line a maintainer can copy once the commit is pushed."""
    src = tmp_path / "attn-gate"
    src.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-C", str(src)]
    import subprocess

    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    subprocess.run([*git, "remote", "add", "origin", URL], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    local = S.from_direct_url(record(url=src.as_uri(), dir_info={"editable": True}), "0.1.0")
    monkeypatch.setattr(init_command, "installed_source", lambda version: local)
    assert main(init_args(repo)) == 2
    assert f"--install 'attn-gate @ git+{URL}@{head}' (once that commit is pushed)" in capsys.readouterr().err
