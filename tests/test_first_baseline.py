"""The first baseline of a kernel that fails somewhere: `baseline update` refuses it naming each
failing case with its reason (worst first), what they share and the ways forward, with a
declaration that works exactly as printed; `--known REASON` records them in one command; then
`check` passes with them KNOWN and the fixed kernel shows XPASS. Runs the real CLI in process on a
six-case suite with a kernel wrong on `shifted` inputs only (tests/regime_kernels.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gate.core.config import load_config
from gate.core.errors import UserError
from tests.minisuite import gate, project, suite

# its tests share one module-scoped run: one worker makes it (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("first_baseline")


SUITE = suite("tiny", inputs=("normal", "shifted", "large"))
SHIFTED = {"bf16-b2-h2-s64-d32-shifted", "bf16-b2-h2-s64-d32-causal-shifted"}


def mine(folder: Path, function: str) -> Path:
    """A repository whose own kernel `mine` is tests.regime_kernels:FUNCTION."""
    return project(folder / "pyproject.toml", "mine", f"tests.regime_kernels:{function}", SUITE)


def run(config: Path, *argv: str) -> int:
    argv = (*argv, "--kernel", "mine", "--suite", "tiny", "--device", "cpu", "--no-progress", "--config", str(config))
    return gate(list(argv), columns=120)


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    """The refused first baseline: its stderr, the saved run, the project."""
    tmp = tmp_path_factory.mktemp("first")
    config = mine(tmp / "repo", "shifted_nan_dv")
    with pytest.MonkeyPatch.context() as mp:
        import io
        import sys

        err = io.StringIO()
        mp.setattr(sys, "stderr", err)
        rc = run(config, "baseline", "update", "--out", str(tmp / "out"))
    return tmp, config, rc, err.getvalue()


def test_the_refusal_names_each_case_worst_first_with_its_reason_and_what_they_share(refused):
    tmp, config, rc, err = refused
    assert rc == 1
    assert not (tmp / "repo" / "baselines").exists()  # nothing recorded
    assert all(len(line) <= 120 for line in err.split("\n\n[[")[0].splitlines())  # wrapped at whole words
    lines = []  # logical lines: a wrapped one continues on a line indented by 4 or more
    for line in err.splitlines():
        if lines and line.startswith("    "):
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    assert lines[0].startswith("attn-gate: refusing to write ") and "2 of 6 measured cases fail" in lines[0]
    # one line per failing case, worst first: the NaN before the finite ratio
    assert lines[1] == "  FAIL bf16-b2-h2-s64-d32-causal-shifted  NaN in dv"
    assert re.fullmatch(r"  FAIL bf16-b2-h2-s64-d32-shifted  dq [\d.]+x its bound", lines[2]), lines[2]
    share = next(line for line in lines if line.startswith("what they share: "))
    assert "every failing case (2) has shifted inputs; none of the 4 passing cases does" in share
    assert "dq in 1 of 2, dv in 1 of 2 failing cases" in share
    assert f"every reason and ratio: {tmp / 'out' / 'validation-mine-tiny.md'}" in lines
    joined = "\n".join(lines)
    assert (
        "1. fix the kernel" in joined and "declare what it supports in [tool.attn-gate.kernels.mine.supports]" in joined
    )
    # recording them starts from the run just saved, not from a second sweep
    assert f'--from-results {tmp / "out" / "sweep-mine-tiny.json"} --known "WHY"`' in joined


def test_the_printed_declaration_works_exactly_as_printed(refused, tmp_path):
    tmp, config, _, err = refused
    block = err[err.index("[[tool.attn-gate.known_failures]]") :]
    repo = tmp_path / "repo"
    pasted = mine(repo, "shifted_nan_dv")
    pasted.write_text(pasted.read_text() + "\n" + block)
    entries = load_config(pasted).known_failures
    assert {e.link for e in entries} == {""} and {e.tensors for e in entries} == {("dq",), ("dv",)}
    saved = tmp / "out" / "sweep-mine-tiny.json"
    assert run(pasted, "baseline", "update", "--from-results", str(saved)) == 0
    rows = json.loads((repo / "baselines" / "cpu" / "mine-tiny.json").read_text())["correctness"]
    assert {cid for cid, row in rows.items() if row["status"] == "FAIL"} == SHIFTED
    # check passes with them KNOWN
    assert run(pasted, "check", "--out", str(tmp_path / "check")) == 0
    known = json.loads((tmp_path / "check" / "findings-mine-tiny.json").read_text())["findings"]
    assert {f["case_id"] for f in known if f["severity"] == "KNOWN"} == SHIFTED
    # the fixed kernel: XPASS for each declared case, naming the entry to delete; still a pass
    fixed = pasted.read_text().replace("regime_kernels:shifted_nan_dv", "regime_kernels:fixed")
    pasted.write_text(fixed)
    assert run(pasted, "check", "--out", str(tmp_path / "fixed")) == 0
    xpass = [
        f
        for f in json.loads((tmp_path / "fixed" / "findings-mine-tiny.json").read_text())["findings"]
        if f["rule"] == "xpass"
    ]
    assert {f["case_id"] for f in xpass} == SHIFTED and all("delete the entry" in f["message"] for f in xpass)


def test_known_records_them_in_one_command(refused, tmp_path, capsys):
    tmp, _, _, _ = refused
    repo = tmp_path / "repo"
    config = mine(repo, "shifted_nan_dv")
    before = config.read_text()
    saved = tmp / "out" / "sweep-mine-tiny.json"
    assert (
        run(config, "baseline", "update", "--from-results", str(saved), "--known", "loses the LSE on shifted inputs")
        == 0
    )
    out = capsys.readouterr().out
    assert f"appended to {config}" in out and 'reason = "loses the LSE on shifted inputs"' in out  # never silently
    # the closing line wraps at whole words to the terminal's width (a long path stays whole)
    tail = out[out.index("wrote ") :].splitlines()
    assert len(tail) > 1 and all(len(line) <= 120 for line in tail), tail
    assert " ".join(x.strip() for x in tail).endswith(": review the summary above and commit it in a PR")
    text = config.read_text()
    assert text.startswith(before) and text.count("[[tool.attn-gate.known_failures]]") == 2
    assert (repo / "baselines" / "cpu" / "mine-tiny.json").exists()
    assert run(config, "check", "--results", str(saved), "--out", str(tmp_path / "check")) == 0


@pytest.mark.parametrize(
    "argv,words",
    [
        (["--known", "x", "--link", "see slack"], "link = 'see slack' should be the upstream issue"),
        (["--known", " "], "--known: give one line saying why"),
        (["--link", "https://x.org/1"], "--link goes with --known"),
    ],
)
def test_a_bad_known_flag_is_a_usage_error_and_writes_nothing(refused, tmp_path, capsys, argv, words):
    tmp, _, _, _ = refused
    repo = tmp_path / "repo"
    config = mine(repo, "shifted_nan_dv")
    before = config.read_text()
    assert run(config, "baseline", "update", "--from-results", str(tmp / "out" / "sweep-mine-tiny.json"), *argv) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1
    assert config.read_text() == before and not (repo / "baselines").exists()


def test_known_for_another_projects_kernel_needs_a_link(refused):
    from gate.core.results import SweepResult
    from gate.workflow.check import declare_known

    tmp, config, _, _ = refused
    sweep = SweepResult.read(tmp / "out" / "sweep-mine-tiny.json")
    other = SweepResult(**{**{f: getattr(sweep, f) for f in sweep.__dataclass_fields__}, "kernel": "sdpa-cpu"})
    with pytest.raises(UserError, match="pass --link with its upstream issue"):
        declare_known(other, load_config(config), "why", "")


@pytest.mark.parametrize(
    "kernel,family,ok",
    [
        ("mine", True, True),  # the project's own kernel family: no upstream to link to
        ("mypkg.attn:*", False, True),  # a package.module:function pattern
        ("fa2", False, False),  # another project's kernel: its upstream issue is required
        ("mine", False, False),  # a name no [tool.attn-gate.kernels] of this file declares
    ],
)
def test_link_is_optional_only_for_the_projects_own_kernel(tmp_path, kernel, family, ok):
    path = tmp_path / "pyproject.toml"
    path.write_text(
        "[tool.attn-gate]\n"
        + ('[tool.attn-gate.kernels.mine]\ndense = "m:f"\n' if family else "")
        + f'[[tool.attn-gate.known_failures]]\nkernel = "{kernel}"\ncases = "x"\nreason = "r"\n'
    )
    if ok:
        assert load_config(path).known_failures[0].link == ""
    else:
        with pytest.raises(UserError, match="#1: link is required"):
            load_config(path)
