"""Progress of a run on stderr: a rich bar with an ETA on a terminal, a plain line every
`PLAIN_EVERY_S` seconds elsewhere (a CI log shows the run moving without a line per case).

The ETA is the seconds per unit of expected cost so far (gate/workflow/shards.py `expected_cost`:
FLOPs plus a fixed cost per seed) times the cost still to run: a suite whose big cases come last
is not promised the pace of its small ones. A SKIP costs nothing and counts as done at once. The
pace leaves out the first case to finish: its time holds the worker's start, the kernel's import and
its first compile, which a kernel that compiles for 15 s would otherwise multiply over the suite.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, TextIO

PLAIN_EVERY_S = 15.0  # a plain progress line at most this often (and one at the end)


def clock_text(seconds: float) -> str:
    """1:05, 12:00, 1:02:03."""
    s = max(0, int(round(seconds)))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


@dataclass
class Eta:
    """Cases done of `total`, and the time left estimated from the cost done so far."""

    total: int
    total_cost: float
    done: int = 0
    done_cost: float = 0.0
    elapsed: float = 0.0
    first: tuple[float, float] | None = None  # (cost, elapsed) when the first case with a cost finished

    def add(self, cost: float, elapsed: float) -> None:
        self.done += 1
        self.done_cost += cost
        self.elapsed = elapsed
        if self.first is None and cost > 0:
            self.first = (cost, elapsed)

    def skip(self, cost: float, elapsed: float) -> None:
        """A case found unsupported when it came to run: done, and its cost was never spent."""
        self.done += 1
        self.total_cost -= cost
        self.elapsed = elapsed

    def left(self) -> float | None:
        """Seconds left, or None before a second case with a cost has finished (the first one's
        time is start-up, not pace: nothing to scale from yet)."""
        if self.done >= self.total:
            return 0.0
        if self.first is None or self.done_cost <= self.first[0]:
            return None
        first_cost, first_elapsed = self.first
        pace = (self.elapsed - first_elapsed) / (self.done_cost - first_cost)
        return pace * max(0.0, self.total_cost - self.done_cost)

    def line(self, counts: dict[str, int] | None = None, now: float | None = None) -> str:
        """`[123/459] 2:10 elapsed, ~1:40 left`, then the non-PASS counts so far. `now`: the
        elapsed seconds at this moment, between two finished cases (a terminal redraws meanwhile)."""
        left = self.left()
        elapsed = self.elapsed if now is None else max(now, self.elapsed)
        if left is not None:
            left = max(0.0, left - (elapsed - self.elapsed))
        text = f"[{self.done}/{self.total}] {clock_text(elapsed)} elapsed, " + (
            "~? left" if left is None else f"~{clock_text(left)} left"
        )
        shown = {k: v for k, v in (counts or {}).items() if v and k not in ("PASS", "OK")}  # OK: a timed case
        if shown:
            text += " (" + ", ".join(f"{v} {k}" for k, v in sorted(shown.items())) + ")"
        return text


class Progress:
    """`with Progress(enabled, title, costs) as advance: ... advance(case_id, status, cost)`.

    `costs`: the expected cost of every case still to run (0 for one known to SKIP); a case that
    comes back SKIP takes its cost off the total. `stream` None is stderr;
    `terminal` None asks rich whether it is a terminal; `clock` is time.monotonic (tests pass
    their own)."""

    def __init__(
        self,
        enabled: bool,
        title: str,
        costs: list[float],
        stream: TextIO | None = None,
        terminal: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        every_s: float = PLAIN_EVERY_S,
    ):
        self.enabled, self.title = enabled, title
        self.eta = Eta(total=len(costs), total_cost=float(sum(costs)))
        self.stream, self.terminal, self.clock, self.every_s = stream, terminal, clock, every_s
        self.counts: dict[str, int] = {}
        self._bar = None

    def __enter__(self) -> Callable[[str, str, float], None]:
        if not self.enabled:
            return lambda *_: None
        from rich.console import Console

        console = Console(
            file=self.stream, stderr=self.stream is None, force_terminal=self.terminal, highlight=False, soft_wrap=True
        )
        self._start = self.clock()
        if not console.is_terminal:
            return self._plain(console)
        return self._rich(console)

    def _count(self, status: str, cost: float) -> None:
        self.counts[status] = self.counts.get(status, 0) + 1
        (self.eta.skip if status == "SKIP" else self.eta.add)(cost, self.clock() - self._start)

    def _plain(self, console):
        self._last_line = self._start

        def advance(case_id: str, status: str, cost: float) -> None:
            self._count(status, cost)
            now = self.clock()
            if now - self._last_line >= self.every_s or self.eta.done == self.eta.total:
                self._last_line = now
                console.print(self.eta.line(self.counts), markup=False)

        return advance

    def _rich(self, console):
        from rich.progress import BarColumn, ProgressColumn, TextColumn
        from rich.progress import Progress as Bar
        from rich.table import Column
        from rich.text import Text

        outer = self

        class EtaColumn(ProgressColumn):  # redrawn live: the elapsed time moves during a long case
            def render(self, task) -> Text:
                return Text(outer.eta.line(outer.counts, outer.clock() - outer._start), no_wrap=True)

        # the bar fills by expected cost; the count and ETA are Eta's, as in the plain line; at 80
        # columns the last case's id is cut, never the count or the time left
        self._bar = Bar(
            TextColumn("{task.description}", table_column=Column(no_wrap=True)),
            BarColumn(bar_width=20),
            EtaColumn(table_column=Column(no_wrap=True)),
            TextColumn("{task.fields[last]}", table_column=Column(no_wrap=True, overflow="ellipsis")),
            console=console,
            transient=True,
        )
        self._bar.__enter__()
        task = self._bar.add_task(self.title, total=max(self.eta.total_cost, 1e-9), last="")

        def advance(case_id: str, status: str, cost: float) -> None:
            self._count(status, cost)
            self._bar.update(task, completed=self.eta.done_cost, last=f"{status} {case_id}")

        return advance

    def __exit__(self, *exc) -> bool:
        if self._bar is not None:
            self._bar.__exit__(*exc)
        return False
