"""`attn-gate init` on the repositories users really have: no `origin` remote, a re-run with other
flags, links, a pyproject.toml it cannot edit, bad names. A refusal is one line, exit 2, and
writes nothing; a link is replaced, never written through."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from gate.commands.main import main
from gate.core.config import load_config
from gate.workflow import init as I

ROOT = Path(__file__).resolve().parents[1]
INSTALL = "attn-gate @ git+https://git.example.com/attn-gate.git@" + "0" * 40
KERNEL = ["--kernel", "tiny_attn:flash_attn_func"]


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()
    }


@pytest.fixture
def repo(tmp_path):
    """The example kernel repository, a git repository without an `origin` remote."""
    dst = tmp_path / "tiny-attn"
    shutil.copytree(ROOT / "examples" / "tiny-attn", dst, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["git", "init", "-q"], cwd=dst, check=True)
    return dst


def init(repo: Path, *args: str) -> int:
    return main(["init", "--dir", str(repo), "--yes", "--install", INSTALL, *args])


def refused(repo: Path, capsys, *args: str) -> str:
    """init's one-line refusal; nothing in the repository changed."""
    before = snapshot(repo)
    assert init(repo, *args) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert snapshot(repo) == before
    return err


# --- placeholders ------------------------------------------------------------------------------


def test_without_an_origin_remote_init_refuses_to_invent_the_repository(repo, capsys):
    err = refused(repo, capsys, *KERNEL)
    assert "--repository OWNER/REPO" in err and "--placeholders" in err


def test_every_option_init_cannot_infer_is_named_in_one_refusal(repo, capsys, monkeypatch):
    """No origin remote and an attn-gate installed from a local wheel: one line names --repository
    and --install, so the second run is the one that works."""
    from gate.commands import init as init_command
    from gate.workflow.install_source import InstallSource

    local = InstallSource("local", None, "file:///tmp/dist/attn_gate-0.1.0-py3-none-any.whl")
    monkeypatch.setattr(init_command, "installed_source", lambda version: local)
    before = snapshot(repo)
    assert main(["init", "--dir", str(repo), "--yes", *KERNEL]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and snapshot(repo) == before, err
    assert "--repository OWNER/REPO" in err and "--install REQUIREMENT" in err and local.where in err
    # each alone is refused as before, naming only itself
    assert main(["init", "--dir", str(repo), "--yes", *KERNEL, "--repository", "a/b"]) == 2
    err = capsys.readouterr().err
    assert "--install REQUIREMENT" in err and "--repository" not in err


def test_placeholders_are_written_only_when_asked_and_are_the_first_todo(repo, capsys):
    assert init(repo, *KERNEL, "--placeholders") == 0
    out = capsys.readouterr().out
    todo = out.split("TODO before the files work:\n", 1)[1].splitlines()
    assert (
        todo[0].startswith("1. replace the placeholders")
        and "'OWNER/REPO'" in todo[0]
        and "@OWNER/maintainers" in todo[0]
    )
    assert load_config(repo / "pyproject.toml").ci.repository == "OWNER/REPO"
    # --check does not call placeholder files "equal"
    assert main(["init", "--check", "--dir", str(repo)]) == 1
    out = capsys.readouterr().out
    assert "placeholder repository = 'OWNER/REPO'" in out and "placeholder owners" in out


def test_owners_follow_a_given_repository(repo):
    assert init(repo, *KERNEL, "--repository", "someone/kern") == 0
    assert load_config(repo / "pyproject.toml").ci.owners == "@someone/maintainers"


def test_a_rerun_with_other_flags_says_what_differs_and_what_force_rewrites(repo, capsys):
    assert init(repo, *KERNEL, "--repository", "me/tiny", "--owners", "@me") == 0
    first = snapshot(repo)
    capsys.readouterr()
    assert init(repo, *KERNEL, "--repository", "me/other", "--owners", "@me/team") == 0
    out = capsys.readouterr().out
    assert snapshot(repo) == first  # kept: nothing rewritten without --force
    todo = out.split("TODO before the files work:\n", 1)[1].split("\n\n", 1)[0]
    assert todo.startswith("1. pyproject.toml [tool.attn-gate] is kept; the flags give other values:")
    assert "ci.repository: 'me/tiny' -> 'me/other'" in todo and "ci.owners: '@me' -> '@me/team'" in todo
    rewrite = todo.splitlines()[-1]
    assert rewrite.startswith("   `attn-gate init --force` rewrites the section and")
    assert ".github/CODEOWNERS" in rewrite and ".github/attn-gate-runner/attn-gate-gpu.json" in rewrite
    assert ".github/workflows/vet.yml" not in rewrite  # a file the flags do not change is not named
    assert init(repo, *KERNEL, "--repository", "me/other", "--owners", "@me/team", "--force") == 0
    assert load_config(repo / "pyproject.toml").ci.repository == "me/other"
    assert '"repository": "me/other"' in (repo / ".github/attn-gate-runner/attn-gate-gpu.json").read_text()
    assert "@me/team" in (repo / ".github/CODEOWNERS").read_text()


def test_a_rerun_without_the_flags_keeps_the_sections_values(repo, capsys):
    """The repository the section names is the default of a re-run (no origin remote needed)."""
    assert init(repo, *KERNEL, "--repository", "me/tiny") == 0
    capsys.readouterr()
    assert init(repo, *KERNEL) == 0
    out = capsys.readouterr().out
    assert "the flags give other values" not in out and "0 written" in out


# --- .gitignore --------------------------------------------------------------------------------


def test_out_is_git_ignored_once(repo):
    (repo / ".gitignore").write_text("*.pyc")  # no final newline
    assert init(repo, *KERNEL, "--repository", "me/tiny") == 0
    assert (repo / ".gitignore").read_text() == "*.pyc\nout/\n"
    assert init(repo, *KERNEL, "--repository", "me/tiny") == 0
    assert (repo / ".gitignore").read_text() == "*.pyc\nout/\n"


def test_a_missing_gitignore_is_created(repo):
    assert init(repo, *KERNEL, "--repository", "me/tiny") == 0
    assert (repo / ".gitignore").read_text() == "out/\n"
    ignored = subprocess.run(["git", "check-ignore", "out/x.json"], cwd=repo, capture_output=True, text=True)
    assert ignored.returncode == 0


# --- links -------------------------------------------------------------------------------------


def test_force_replaces_a_link_and_never_writes_its_target(repo, tmp_path, capsys):
    outside = tmp_path / "outside.yml"
    outside.write_text("mine\n")
    (repo / ".github/workflows").mkdir(parents=True)
    (repo / ".github/workflows/gate.yml").symlink_to(outside)
    assert init(repo, *KERNEL, "--repository", "me/tiny") == 0
    assert "gate.yml: kept (a symbolic link" in capsys.readouterr().out
    assert outside.read_text() == "mine\n" and (repo / ".github/workflows/gate.yml").is_symlink()
    assert init(repo, *KERNEL, "--repository", "me/tiny", "--force") == 0
    assert outside.read_text() == "mine\n"
    gate_yml = repo / ".github/workflows/gate.yml"
    assert (
        not gate_yml.is_symlink()
        and gate_yml.read_text()
        == I.render_files(load_config(repo / "pyproject.toml").ci)[".github/workflows/gate.yml"]
    )


def test_a_linked_folder_is_refused_before_anything_is_written(repo, tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (repo / ".github").symlink_to(elsewhere)
    err = refused(repo, capsys, *KERNEL, "--repository", "me/tiny", "--force")
    assert "symbolic link" in err and ".github" in err
    assert list(elsewhere.iterdir()) == []


def test_a_linked_pyproject_is_refused(repo, tmp_path, capsys):
    real = tmp_path / "real.toml"
    real.write_text((repo / "pyproject.toml").read_text())
    (repo / "pyproject.toml").unlink()
    (repo / "pyproject.toml").symlink_to(real)
    before = real.read_text()
    assert "symbolic link" in refused(repo, capsys, *KERNEL, "--repository", "me/tiny")
    assert real.read_text() == before


# --- a pyproject.toml or a layout init cannot edit ---------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        '\n[tool]\nattn-gate.baselines_dir = "b"\n',
        '\n[tool]\n"attn-gate" = { baselines_dir = "b" }\n',
        '\n[tool.attn-gate.gpu]\nsuite = "pr"\n[tool]\nattn-gate.baselines_dir = "b"\n',
    ],
)
@pytest.mark.parametrize("force", [False, True])
def test_a_section_of_dotted_keys_is_refused_and_the_file_kept(repo, capsys, extra, force):
    with (repo / "pyproject.toml").open("a") as fh:
        fh.write(extra)
    tomllib.loads((repo / "pyproject.toml").read_text())  # valid before
    err = refused(repo, capsys, *KERNEL, "--repository", "me/tiny", *(["--force"] if force else []))
    assert "dotted keys" in err and "[tool.attn-gate]" in err


def test_a_non_utf8_pyproject_is_one_line(repo, capsys):
    (repo / "pyproject.toml").write_bytes(b'[project]\nname = "t\xe9st"\n')
    assert "not UTF-8" in refused(repo, capsys, *KERNEL, "--repository", "me/tiny")
    assert main(["init", "--check", "--dir", str(repo)]) == 2
    assert "not UTF-8" in capsys.readouterr().err


def test_a_pyproject_folder_is_one_line(repo, capsys):
    (repo / "pyproject.toml").unlink()
    (repo / "pyproject.toml").mkdir()
    assert "is not a file" in refused(repo, capsys, *KERNEL, "--repository", "me/tiny")


def test_an_invalid_pyproject_is_one_line(repo, capsys):
    (repo / "pyproject.toml").write_text("[project\n")
    assert "invalid TOML" in refused(repo, capsys, *KERNEL, "--repository", "me/tiny")


def test_a_file_named_github_is_one_line(repo, capsys):
    (repo / ".github").write_text("not a folder\n")
    err = refused(repo, capsys, *KERNEL, "--repository", "me/tiny")
    assert ".github is a file where init needs a folder" in err


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--kernel", "tiny_attn:flash_attn_func", "--suite", "nosuch"], "--suite 'nosuch'"),
        (["--kernel", "tiny_attn:flash_attn_func", "--cpu-suite", "nosuch"], "--cpu-suite 'nosuch'"),
        (["--kernel", "tiny_attn:flash_attn_func", "--nightly-suite", "../x"], "--nightly-suite '../x'"),
        (["--kernel", "not a kernel!"], "--kernel 'not a kernel!'"),
        (["--kernel", "tiny_attn:flash_attn_func", "--gpu-class", "../h200"], "--gpu-class"),
        (["--kernel", "tiny_attn:flash_attn_func", "--repository", "not a repo"], "--repository 'not a repo'"),
        (["--dense", "tiny_attn:flash_attn_func", "--family", "a/b"], "--family"),
    ],
)
def test_a_bad_name_is_refused_naming_its_flag(repo, capsys, args, flag):
    args = args if "--repository" in args else [*args, "--repository", "me/tiny"]
    assert flag in refused(repo, capsys, *args)


# --- before init -------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["check"], ["baseline", "update"]])
def test_before_init_check_and_baseline_update_name_init(repo, monkeypatch, capsys, command):
    """A pyproject.toml without [tool.attn-gate]: not the built-in default kernel gated (and its
    baseline written) against this repository, but the way to set it up."""
    monkeypatch.chdir(repo)
    before = snapshot(repo)
    assert main([*command, "--device", "cpu", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "no [tool.attn-gate] section: run `attn-gate init`" in err and "--kernel" in err
    assert snapshot(repo) == before
    # a kernel named explicitly needs no section: the next check is the suite's
    assert main([*command, "--device", "cpu", "--no-progress", "--kernel", "sdpa-cpu", "--suite", "nosuch"]) == 2
    assert "attn-gate init" not in capsys.readouterr().err


def test_baseline_update_without_pyproject_names_init_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """An empty kernel repository (or one where `init` stopped): not the built-in default's baseline
    written into it, and a `check` after it passing that default, but the way to set it up."""
    (tmp_path / "kern.py").write_text("")
    monkeypatch.chdir(tmp_path)
    assert main(["baseline", "update", "--device", "cpu", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"no pyproject.toml in {tmp_path}: run `attn-gate init`" in err and "--kernel" in err
    assert [p.name for p in tmp_path.iterdir()] == ["kern.py"]
    # a kernel named explicitly needs no file: the next check is the suite's
    assert main(["baseline", "update", "--device", "cpu", "--no-progress", "--kernel", "sdpa-cpu", "--suite", "x"]) == 2
    err = capsys.readouterr().err
    assert "attn-gate init" not in err and "--suite 'x'" in err
    # with a configured file, the refusal is the section's, as before
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "kern"\n')
    assert main(["baseline", "update", "--device", "cpu", "--no-progress"]) == 2
    assert "pyproject.toml has no [tool.attn-gate] section" in capsys.readouterr().err


@pytest.mark.parametrize("tool", ["tool = 5\n", "tool = [1, 2]\n"])
def test_a_tool_key_that_is_no_table_is_one_line(repo, capsys, tool):
    text = (repo / "pyproject.toml").read_text()
    (repo / "pyproject.toml").write_text(tool + text)
    assert "pyproject.toml" in refused(repo, capsys, *KERNEL, "--repository", "me/tiny")


def test_a_hand_written_section_gets_the_ci_table_it_lacks(repo, capsys):
    with (repo / "pyproject.toml").open("a") as fh:
        fh.write('\n[tool.attn-gate.gpu]\nkernel = "tiny_attn:flash_attn_func"\nsuite = "smoke"\n')
    before = (repo / "pyproject.toml").read_text()
    assert init(repo, *KERNEL, "--repository", "me/tiny") == 0
    assert "appended [tool.attn-gate.ci]" in capsys.readouterr().out
    text = (repo / "pyproject.toml").read_text()
    assert text.startswith(before)
    config = load_config(repo / "pyproject.toml")
    assert config.gpu.suite == "smoke" and config.ci.repository == "me/tiny"
    assert main(["init", "--check", "--dir", str(repo)]) == 0
