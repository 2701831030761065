"""Progress of a sweep on stderr: a bar with an ETA on a terminal, a plain line every few seconds
elsewhere; the ETA scales the time so far by the expected cost still to run."""

from __future__ import annotations

import io
import re

import pytest

from gate.workflow.progress import Eta, Progress, clock_text

PLAIN = re.compile(r"^\[(\d+)/(\d+)\] (\d+:\d\d) elapsed, ~(\d+:\d\d|\?) left( \(.*\))?$")


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("seconds, text", [(0, "0:00"), (5.4, "0:05"), (65, "1:05"), (720, "12:00"), (3723, "1:02:03")])
def test_clock_text(seconds, text):
    assert clock_text(seconds) == text


def test_the_eta_is_weighted_by_expected_cost_not_by_case_count():
    eta = Eta(total=5, total_cost=11.0)
    assert eta.left() is None  # nothing done yet: no pace to scale
    eta.add(1.0, 20.0)  # the first case: 20 s of worker start, import and first compile
    assert eta.left() is None and eta.line() == "[1/5] 0:20 elapsed, ~? left"  # start-up is not pace
    eta.add(1.0, 25.0)  # the next small case took 5 s: the 9 units left take 45 s, not 3 cases x 5 s
    assert eta.left() == pytest.approx(45.0)
    eta.add(0.0, 25.0)  # a SKIP: done, costs nothing, moves nothing
    assert eta.left() == pytest.approx(45.0)
    assert eta.line() == "[3/5] 0:25 elapsed, ~0:45 left"
    assert eta.line(now=35.0) == "[3/5] 0:35 elapsed, ~0:35 left"  # redrawn 10 s later
    eta.skip(4.0, 25.0)  # found unsupported when it came to run: its cost leaves the total
    assert eta.total_cost == 7.0 and eta.left() == pytest.approx(25.0)
    eta.add(5.0, 50.0)
    assert eta.left() == 0.0 and eta.line({"PASS": 2, "FAIL": 1}) == "[5/5] 0:50 elapsed, ~0:00 left (1 FAIL)"
    counts = {"SKIP": 3, "known FAIL": 16, "FAIL": 2, "known ERROR": 1, "PASS": 9}
    assert eta.line(counts).endswith("(1 known ERROR, 2 FAIL, 16 known FAIL, 3 SKIP)")


def test_a_slow_first_case_is_not_taken_for_the_pace_of_the_run():
    """A kernel whose first call compiles for 15 s, then runs each case in 0.1 s: the estimate
    after the second case is the remaining cases at 0.1 s, not 15 s each."""
    eta = Eta(total=100, total_cost=100.0)
    eta.add(1.0, 15.1)
    eta.add(1.0, 15.2)
    assert eta.left() == pytest.approx(9.8)


def test_without_a_terminal_a_plain_line_every_interval_not_one_per_case():
    stream, clock = io.StringIO(), Clock()
    costs = [1.0] * 100
    with Progress(True, "k / pr", costs, stream=stream, terminal=False, clock=clock, every_s=15.0) as advance:
        for i in range(100):
            clock.now += 1.0
            advance(f"case-{i}", "FAIL" if i == 3 else "PASS", 1.0)
    lines = stream.getvalue().splitlines()
    assert 6 <= len(lines) <= 8, lines  # 100 s at one line per 15 s, and the last
    parsed = [PLAIN.match(line) for line in lines]
    assert all(parsed), lines
    assert lines[0] == "[15/100] 0:15 elapsed, ~1:25 left (1 FAIL)"
    assert lines[-1] == "[100/100] 1:40 elapsed, ~0:00 left (1 FAIL)"
    assert "case-" not in stream.getvalue() and "\x1b" not in stream.getvalue()


def test_on_a_terminal_a_bar_with_count_elapsed_and_time_left():
    stream, clock = io.StringIO(), Clock()
    with Progress(True, "mykernel / pr", [2.0, 2.0, 2.0, 0.0], stream=stream, terminal=True, clock=clock) as advance:
        clock.now += 4.0
        advance("bf16-b2-h8-s64-d64", "PASS", 2.0)
        clock.now += 4.0
        advance("bf16-b2-h8-s97-d64", "PASS", 2.0)
        out = stream.getvalue()
    text = stream.getvalue()
    assert "mykernel / pr" in text and "\x1b" in text  # drawn with terminal control codes
    assert re.search(r"\[2/4\] 0:08 elapsed, ~0:04 left", text), text
    assert "PASS bf16-b2-h8-s97-d64" in text
    assert out  # drawn while the run goes, not only at the end


def test_no_progress_writes_nothing():
    stream = io.StringIO()
    with Progress(False, "k / pr", [1.0], stream=stream, terminal=False) as advance:
        advance("a", "PASS", 1.0)
    assert stream.getvalue() == ""


def test_the_speed_stage_moves_the_same_progress_over_the_plans_perf_cases(capsys):
    """Each timed case advances the count, a SKIP is counted and costs nothing; the measure's
    results pass through unchanged."""
    from types import SimpleNamespace

    from gate.core.config import load_config
    from gate.workflow.plan import plan_run
    from gate.workflow.speed_check import _measured_with_progress, perf_target

    plan = plan_run(load_config(None), "sdpa-cpu", "pr", "cpu")
    cases = plan.perf_cases
    assert len(cases) >= 3
    answers = iter(["OK", "SKIP"] + ["OK"] * (len(cases) - 2))
    with _measured_with_progress(
        perf_target(plan), lambda case, anchor, tp: SimpleNamespace(label=next(answers), case=case)
    ) as measure:
        got = [measure(c, "matmul", None) for c in cases]
    assert [g.case for g in got] == list(cases)
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"[{len(cases)}/{len(cases)}] ") and err[-1].endswith("~0:00 left (1 SKIP)"), err


def test_a_case_that_runs_long_is_named_while_it_runs():
    """A case that hangs toward its timeout: without a terminal, a line every interval names it and
    its time so far, instead of the last count standing for minutes."""
    stream, clock = io.StringIO(), Clock()
    progress = Progress(True, "k / smoke", [1.0] * 3, stream=stream, terminal=False, clock=clock, beat_s=None)
    with progress as advance:
        advance.started("quick")
        clock.now += 1.0
        advance("quick", "PASS", 1.0)
        advance.started("bf16-b16385-h4-s2x3-d8")
        clock.now += 10.0
        progress.beat()
        assert stream.getvalue() == ""  # 10 s: not long yet
        clock.now += 50.0
        progress.beat()
        progress.beat()  # once per interval, not per beat
        assert stream.getvalue().splitlines() == [
            "[1/3] 1:01 elapsed, ~? left; running bf16-b16385-h4-s2x3-d8 for 1:00"
        ]
        clock.now += 15.0
        progress.beat()
        assert stream.getvalue().splitlines()[-1].endswith("running bf16-b16385-h4-s2x3-d8 for 1:15")
        advance("bf16-b16385-h4-s2x3-d8", "ERROR", 1.0)  # a line was printed just now: none
        clock.now += 30.0
        progress.beat()  # nothing runs now: no line
    assert len(stream.getvalue().splitlines()) == 2, stream.getvalue()


def test_on_a_terminal_the_bar_names_a_case_that_runs_long():
    stream, clock = io.StringIO(), Clock()
    with Progress(True, "k / pr", [1.0] * 3, stream=stream, terminal=True, clock=clock) as advance:
        advance.started("slow-case")
        clock.now += 20.0
        advance.started("quick")
        advance("quick", "PASS", 1.0)
    assert "running slow-case for 0:20" in stream.getvalue(), stream.getvalue()
