"""The command line reads alike everywhere: --version; every command's --help has a
description, examples and exit codes; `suites --cases` explains the case-id grammar; the same
defaults everywhere (drift's --kernel defaults to the profile's like the others)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import gate
from gate.commands.main import build_parser, main

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = [
    ["check"],
    ["sweep"],
    ["perf"],
    ["baseline"],
    ["baseline", "update"],
    ["baseline", "show"],
    ["bench"],
    ["publish"],
    ["drift"],
    ["kernels"],
    ["suites"],
    ["init"],
    ["probe"],
]


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"attn-gate {gate.__version__}"


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_help_has_a_description_examples_and_exit_codes(command, capsys):
    assert main([*command, "--help"]) == 0
    text = capsys.readouterr().out
    assert "examples:\n  attn-gate " in text and "exit codes:\n  0" in text
    description = text.split("\n\n")[1]
    assert len(description.split()) >= 5, description


def test_suites_cases_prints_a_legend_of_every_id_part(capsys):
    assert main(["suites", "--cases", "--config", str(ROOT / "pyproject.toml")]) == 0
    out = capsys.readouterr().out
    legend, listing = out.split("\n\n", 1)
    ids = [line.strip().split()[0] for line in listing.splitlines() if line.startswith("    ")]
    assert len(ids) > 100
    # every word an id uses (bf16, b, h, s, d, causal, win, cap, alibi, varlen, k_sliced, bias, dense,
    # fp32, grad ...) is explained: split on '-' and '.', drop the numbers, look the word up; the
    # leading dtype whole (e4m3 has digits inside)
    words = {re.sub(r"\d+(x\d+)?|/\d+", "", w) for cid in ids for w in re.split(r"[-.]", cid)[1:]} - {""}
    words |= {cid.split("-")[0] for cid in ids}
    for word in words:
        assert re.search(rf"(?<![\w]){re.escape(word)}(\d|\b)", legend), word


def test_the_coverage_page_has_the_case_id_legend():
    from gate.commands.help_text import CASE_ID_LEGEND

    assert CASE_ID_LEGEND in (ROOT / "docs" / "coverage.md").read_text()


def test_drift_kernel_defaults_like_every_other_command():
    parser = build_parser()
    for command in (["check"], ["sweep"], ["perf"], ["drift"], ["baseline", "update"]):
        assert parser.parse_args(command).kernel is None, command
