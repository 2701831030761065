"""`attn-gate init` and the one set of templates: this repository's own CI files are the templates
rendered with its [tool.attn-gate.ci] (byte for byte), init writes a user's set without
clobbering anything, a second run changes nothing, and `init --check` reports drift.
The whole path from a wheel in a fresh venv is tests/test_adoption.py (slow)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gate.commands.main import main
from gate.core.config import CiConfig, load_config
from gate.core.errors import UserError
from gate.workflow import init as I
from gate.workflow.install_source import from_direct_url

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tiny-attn"
FAMILY = ["--dense", "tiny_attn:flash_attn_func", "--varlen", "tiny_attn:flash_attn_varlen_func"]


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.parts
    }


@pytest.fixture
def repo(tmp_path):
    """A copy of the example kernel repository, as a user has it before init."""
    dst = tmp_path / "tiny-attn"
    shutil.copytree(EXAMPLE, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


# this checkout is no source a runner can install from: the tests say where attn-gate comes from
INSTALL = "attn-gate @ git+https://git.example.com/attn-gate.git@" + "0" * 40


def run_init(repo: Path, *args: str) -> int:
    return main(["init", "--dir", str(repo), "--yes", "--repository", "example/tiny-attn", "--install", INSTALL, *args])


def test_this_repository_is_the_templates_rendered_with_its_parameters():
    """What we harden is what users get: every generated file equals its template's rendering."""
    ci = load_config(ROOT / "pyproject.toml").ci
    files = I.render_files(ci)
    assert len(files) == 18
    drift = [rel for rel, text in files.items() if (ROOT / rel).read_text(encoding="utf-8") != text]
    assert not drift, (
        f"{drift} differ from gate/workflow/templates/ rendered with [tool.attn-gate.ci]: edit the "
        f"template, then re-render (tests/test_init.py shows how)"
    )
    assert I.check(ROOT) == []


def test_a_users_files_differ_from_ours_only_in_the_parameters(repo):
    """Every line that differs between our rendering and a user's holds a parameter's value."""
    assert run_init(repo, *FAMILY) == 0
    ours, theirs = (
        I.template_values(load_config(ROOT / "pyproject.toml").ci),
        I.template_values(load_config(repo / "pyproject.toml").ci),
    )
    for name in I.WORKFLOWS:
        a = (ROOT / ".github/workflows" / f"{name}.yml").read_text().splitlines()
        b = (repo / ".github/workflows" / f"{name}.yml").read_text().splitlines()
        assert len(a) == len(b), name
        for x, y in zip(a, b):
            if x != y:
                assert any(v in x for v in ours.values()) and any(v in y for v in theirs.values()), (x, y)


def test_render_fills_placeholders_and_refuses_unknown_ones():
    assert I.render("a: @@x@@\n  @@y@@\n", {"x": "1", "y": "- p\n- q"}) == "a: 1\n  - p\n  - q\n"
    with pytest.raises(KeyError, match="@@z@@"):
        I.render("a: @@z@@\n", {"x": "1"})


@pytest.mark.parametrize(
    "change, words",
    [
        ({"repository": "no-slash"}, "OWNER/REPO"),
        ({"setup": "pip install ${{ github.event.comment.body }}"}, "cannot stand in a workflow"),
        ({"setup": "pip install x # y"}, "cannot stand in a workflow"),
        ({"runner_labels": ("self-hosted", "a b")}, "runner labels"),
        ({"owners": "maintainers"}, "@user"),
        ({"owners": 'x$(id)"@y'}, "@user"),  # GitHub skips a line whose owner it cannot read
        ({"owners": "@org/team @x$(id)"}, "@user"),
        ({"owners": "@org/team/sub"}, "@user"),
        ({"owners": "a@b"}, "@user"),  # an email needs a domain with a dot
        ({"protected": ("tests/", "requirements**")}, "protected"),
        ({"ci_run": ""}, "ci_run is empty"),
    ],
)
def test_parameters_that_would_break_a_workflow_are_refused(change, words):
    ci = load_config(ROOT / "pyproject.toml").ci
    with pytest.raises(UserError, match=words):
        I.render_files(CiConfig(**{**ci.__dict__, **change}))


@pytest.mark.parametrize(
    "owners", ["@octocat", "@my-org/gate-maintainers", "@org/team.x @user dev.ops+ci@example.co.uk"]
)
def test_owners_github_accepts_render(owners):
    ci = load_config(ROOT / "pyproject.toml").ci
    assert owners in I.render_files(CiConfig(**{**ci.__dict__, "owners": owners}))[".github/CODEOWNERS"]


def test_a_user_repository_protects_what_pip_runs_when_it_installs():
    assert {"setup.py", "setup.cfg", "conftest.py", "requirements*", "pyproject.toml"} <= set(I.USER_PROTECTED)


def test_init_writes_the_set_appends_the_section_and_keeps_the_rest(repo, capsys):
    before = (repo / "pyproject.toml").read_text()
    assert run_init(repo, *FAMILY, "--gpu-class", "h100") == 0
    out = capsys.readouterr().out
    text = (repo / "pyproject.toml").read_text()
    assert text.startswith(before)  # appended, nothing of the user's changed
    config = load_config(repo / "pyproject.toml")
    assert config.gpu.kernel == config.cpu.kernel == "tiny-attn"
    assert config.kernels["tiny-attn"].varlen == "tiny_attn:flash_attn_varlen_func"
    assert config.ci.runner_labels == ("self-hosted", "linux", "gpu", "h100")
    for rel in I.render_files(config.ci):
        assert (repo / rel).is_file() and f"wrote  {rel}" in out
    gate_yml = yaml.safe_load((repo / ".github/workflows/gate.yml").read_text())
    assert '"h100"' in str(gate_yml["jobs"]["gate"]["runs-on"]["labels"])
    assert os.access(repo / ".github/attn-gate-runner/job_started.sh", os.X_OK)
    assert '"repository": "example/tiny-attn"' in (repo / ".github/attn-gate-runner/attn-gate-gpu.json").read_text()
    words = " ".join(out.split())  # the checklist wraps to the terminal
    assert "Admin checklist" in words and "Require review from Code Owners" in words and "Prevent self-review" in words


def test_init_twice_changes_nothing(repo, capsys):
    assert run_init(repo, *FAMILY) == 0
    first = snapshot(repo)
    capsys.readouterr()
    assert run_init(repo, *FAMILY, "--gpu-class", "b200") == 0  # the section exists: kept, as is
    assert snapshot(repo) == first
    out = capsys.readouterr().out
    assert "0 written" in out and "kept [tool.attn-gate]" in out


def test_init_never_overwrites_without_force(repo, capsys):
    (repo / "asv.conf.json").write_text('{"mine": true}\n')
    assert run_init(repo, "--kernel", "tiny_attn:flash_attn_func") == 0
    assert (repo / "asv.conf.json").read_text() == '{"mine": true}\n'
    assert "asv.conf.json: kept (differs" in capsys.readouterr().out
    assert run_init(repo, "--kernel", "tiny_attn:flash_attn_func", "--force", "--gpu-class", "h100") == 0
    assert (repo / "asv.conf.json").read_text() == I.render_files(load_config(repo / "pyproject.toml").ci)[
        "asv.conf.json"
    ]
    text = (repo / "pyproject.toml").read_text()
    assert text.count("[tool.attn-gate]") == 1 and '"h100"' in text and "[project]" in text


def test_check_is_quiet_when_equal_and_shows_drift_after_a_template_change(repo, tmp_path, monkeypatch, capsys):
    assert run_init(repo, *FAMILY) == 0
    capsys.readouterr()
    assert main(["init", "--check", "--dir", str(repo)]) == 0
    assert "18 of 18 files equal" in capsys.readouterr().out
    # an upgraded attn-gate: one template changed
    templates = tmp_path / "templates"
    shutil.copytree(I.TEMPLATES, templates)
    vet = templates / "workflows" / "vet.yml"
    vet.write_text(vet.read_text().replace("timeout-minutes: 10", "timeout-minutes: 12"))
    monkeypatch.setattr(I, "TEMPLATES", templates)
    assert main(["init", "--check", "--dir", str(repo)]) == 1
    out = capsys.readouterr().out
    assert (
        "drift: .github/workflows/vet.yml" in out
        and "-    timeout-minutes: 10" in out
        and "+    timeout-minutes: 12" in out
    )
    assert "17 of 18 files equal, 1 drift" in out


def test_check_without_init_is_a_usage_error(repo, capsys):
    assert main(["init", "--check", "--dir", str(repo)]) == 2
    assert "run `attn-gate init`" in capsys.readouterr().err


def test_non_interactive_init_without_a_kernel_says_which_flag(repo, capsys):
    assert main(["init", "--dir", str(repo), "--yes"]) == 2
    assert "--kernel package.module:function" in capsys.readouterr().err


def test_interactive_init_asks(repo, monkeypatch):
    answers = iter(
        ["dense=tiny_attn:flash_attn_func,varlen=tiny_attn:flash_attn_varlen_func", "a100", "smoke", "me/tiny", "@me"]
    )
    options = I.resolve(I.InitOptions(), repo, from_direct_url(None, "0.1.0"), lambda q, d: next(answers))
    assert options.entries == (("dense", "tiny_attn:flash_attn_func"), ("varlen", "tiny_attn:flash_attn_varlen_func"))
    assert (options.gpu_class, options.suite, options.repository, options.owners) == ("a100", "smoke", "me/tiny", "@me")


def test_the_repository_defaults_to_the_origin_remote(repo):
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "remote", "add", "origin", "git@github.com:someone/kern.git"], cwd=repo, check=True)
    assert I.git_repository(repo) == "someone/kern"


def test_the_admin_checklist_fences_the_pr_pool_and_keeps_the_runner_read_only():
    text = " ".join(text for _, text in I.admin_checklist(load_config(ROOT / "pyproject.toml").ci))
    for words in (
        "own network segment",
        "169.254.169.254",
        "no instance role",
        "egress only to GitHub",
        "no route to the trusted pool",
        ".credentials",
        "Keep @runner",
    ):
        assert words in text, words


@pytest.mark.parametrize("width", [80, 100, 120])  # below 80 a single path may outgrow a line
def test_the_admin_checklist_fits_the_terminal_and_its_commands_paste_whole(width):
    items = I.admin_checklist(load_config(ROOT / "pyproject.toml").ci)
    lines = I.render_checklist(items, width)
    assert all(len(line) <= width for line in lines), [line for line in lines if len(line) > width]
    # every word of the prose is there, none cut; each shell line reads back as written
    prose = " ".join(text for kind, text in items if kind != "cmd").split()
    rendered = "\n".join(lines)
    assert all(word in rendered for word in prose)
    pasted = rendered.replace(" \\\n", " ").replace("\n", " ")
    for kind, command in items:
        if kind == "cmd":
            assert " ".join(command.split()) in " ".join(pasted.split())


def test_a_long_shell_line_is_cut_with_continuations():
    lines = I.render_checklist([("cmd", "install -m 0755 " + " ".join(f"file{i}" for i in range(30)))], 40)
    assert len(lines) > 1 and all(line.endswith(" \\") for line in lines[:-1])
    assert not lines[-1].endswith("\\")


@pytest.mark.parametrize(
    "text, starts",
    [
        (None, "# attn-gate: the kernel it gates"),  # a new file: no blank first line
        ("", "# attn-gate: the kernel it gates"),
        ('[project]\nname = "k"', '[project]\nname = "k"\n\n# attn-gate: the kernel it gates'),
        ('[project]\nname = "k"\n', '[project]\nname = "k"\n\n# attn-gate: the kernel it gates'),
    ],
)
def test_the_section_starts_a_new_pyproject_and_follows_an_old_one_after_a_blank_line(text, starts):
    section = I.pyproject_section(I.InitOptions(kernel="pkg.mod:fn"), CiConfig())
    new, _ = I.new_pyproject(text, section, force=False)
    assert new.startswith(starts), new[:80]
    assert I.parsed_config(new).cpu.kernel == "pkg.mod:fn"
