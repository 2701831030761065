"""Renderers given a decided verdict print exactly the text they printed before findings carried
their rule, subject and advice as values: the headline, the findings JSON, the terminal table,
the failure lines and the PR comment of eight real-rule scenarios (tests/render_scenarios.py),
against golden copies in tests/data/golden."""

from __future__ import annotations

import difflib
import gzip

import pytest

from tests.render_scenarios import DATA, rendered, scenarios

NAMES = (
    "pass",
    "pass-env",
    "fail",
    "fail-env",
    "pass-speed",
    "pass-speed-calm",
    "pass-env-speed",
    "pass-env-speed-calm",
    "quiet",
    "quiet-speed",
    "quiet-speed-calm",
)


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    return scenarios(tmp_path_factory.mktemp("golden"))


@pytest.mark.parametrize("name", NAMES)
def test_a_decided_verdict_renders_the_golden_text(judged, name):
    golden = gzip.decompress((DATA / "golden" / f"{name}.txt.gz").read_bytes()).decode()
    now = rendered(*judged[name])
    diff = "\n".join(difflib.unified_diff(golden.splitlines(), now.splitlines(), "golden", "now", lineterm="", n=1))
    assert now == golden, diff[:4000]


def test_the_scenarios_reach_every_tempering(judged):
    """The goldens are only worth their bytes if they hold the advice cases: a refresh WARN, the
    same advice taken back in a failing run and beside an environment change, for both halves."""
    texts = {
        name: rendered(*judged[name])
        for name in ("quiet", "fail", "quiet-speed", "pass-env-speed", "pass-env-speed-calm")
    }
    assert "refresh the baseline so the gate keeps its teeth" in texts["quiet"]
    assert "(the run fails: do not refresh the baseline now)" in texts["fail"]
    assert "faster, the whole interval below -10% (the run fails" in texts["quiet-speed"]
    assert "faster, the whole interval below -10%; coincides with an environment change" in texts["pass-env-speed-calm"]
    assert "now 9.9.9; ratios may shift (the run fails: do not refresh the baseline now)" in texts["pass-env-speed"]
    assert set(NAMES) == set(judged)


@pytest.mark.parametrize("width", [80, 200])
def test_the_terminal_table_holds_the_worst_findings_and_counts_the_rest(judged, width):
    """63 findings (improvements to refresh): the table shows the worst MAX_ROWS, then how many more
    the findings JSON holds; at 80 columns a row wraps, so a table of all of them ran to 200 lines."""
    import io

    from rich.console import Console

    from gate.compare.diagnosis import diagnose
    from gate.report.check_report import MAX_ROWS, print_check

    verdict, sweep, _ = judged["pass"]
    shown = [f for f in verdict.findings if f.severity.blocks or f.severity.value == "WARN"]
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False)
    print_check(verdict, diagnose(verdict, sweep), sweep, console=console)
    lines = console.file.getvalue().splitlines()
    rows = [line for line in lines if line.startswith("│") and line.split("│")[1].strip()]  # a row's first line
    assert len(shown) > MAX_ROWS and len(rows) == MAX_ROWS
    assert f"... and {len(shown) - MAX_ROWS} more in the findings JSON" in lines
    assert len(lines) <= 4 * MAX_ROWS + 20, len(lines)


def test_the_table_chooser_skips_a_form_that_wraps_rows_into_columns_of_words():
    """At 80 columns the five-column form fitted with every word whole but wrapped its `what` cell to
    six or seven lines a row; the two-column form holds each row in two."""
    import io

    from rich.console import Console
    from rich.table import Table

    from gate.report.check_report import MAX_LINES_PER_ROW, fits, print_table

    what = "dk error is 40516.596 x its bound (must be <= 1)"

    def table(columns):
        t = Table(title="t")
        for col in columns:
            t.add_column(col, no_wrap=col == "case")
        for i in range(4):
            cells = {"severity": "FAIL", "case": f"fp32-b2-h2-s65x33-d{i}", "metric": "ratio:dk", "now": "40516.596"}
            t.add_row(*(cells.get(c, what) for c in columns))
        return t

    wide, narrow = table(("severity", "case", "metric", "now", "what")), table(("case", "what"))
    console = Console(file=io.StringIO(), width=80, color_system=None, force_terminal=False)
    lines = len(console.render_lines(wide, console.options, pad=False))
    assert fits(console, wide) and lines > 6 + MAX_LINES_PER_ROW * 4  # it fits, as columns of words
    assert print_table(console, [wide, narrow])
    printed = console.file.getvalue().splitlines()
    assert "severity" not in printed[2] and "case" in printed[2]
    assert len(printed) <= 6 + MAX_LINES_PER_ROW * 4
    # where no form is readable, the one of fewest lines
    console = Console(file=io.StringIO(), width=80, color_system=None, force_terminal=False)
    assert print_table(console, [wide]) and len(console.file.getvalue().splitlines()) == lines
