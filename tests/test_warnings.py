"""Warnings go through one reporter (gate/core/warn.py) to stderr: stdout stays the report's."""

from __future__ import annotations

from pathlib import Path

from gate.core.files import append_step_summary
from gate.core.warn import PREFIX, warn

GATE = Path(__file__).resolve().parent.parent / "gate"


def test_a_warning_is_one_line_on_stderr(capsys):
    warn("the plot was not drawn (OSError: disk full)")
    out, err = capsys.readouterr()
    assert out == "" and err == "attn-gate: warning: the plot was not drawn (OSError: disk full)\n"


def test_an_unwritable_step_summary_warns_on_stderr(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "missing" / "summary.md"))
    append_step_summary("## attn-gate")
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(PREFIX + "$GITHUB_STEP_SUMMARY ") and "was not written" in err


def test_no_module_prints_its_own_warning_prefix():
    """A warning printed by hand may go to stdout (the speed plot's did) or lose its prefix."""
    own = [
        f"{p.relative_to(GATE)}:{n}"
        for p in sorted(GATE.rglob("*.py"))
        if p != GATE / "core" / "warn.py"
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if PREFIX.strip() in line
    ]
    assert own == []
