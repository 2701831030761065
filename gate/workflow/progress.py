"""Progress of a run on stderr: a rich bar with an ETA on a terminal, a plain line every
`PLAIN_EVERY_S` seconds elsewhere (a CI log shows the run moving without a line per case).

The ETA is the seconds per unit of expected cost so far (gate/workflow/shards.py `expected_cost`:
FLOPs plus a fixed cost per seed) times the cost still to run: a suite whose big cases come last
is not promised the pace of its small ones. A SKIP costs nothing and counts as done at once. The
pace leaves out the first case to finish: its time holds the worker's start, the kernel's import and
its first compile, which a kernel that compiles for 15 s would otherwise multiply over the suite.
"""

from __future__ import annotations

import threading
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
        if shown:  # a known FAIL (a declared upstream bug) beside the FAILs
            ordered = sorted(shown.items(), key=lambda kv: (kv[0].removeprefix("known "), kv[0]))
            text += " (" + ", ".join(f"{v} {k}" for k, v in ordered) + ")"
        return text


class Advance:
    """What `with Progress(...)` gives: `advance(case_id, status, cost)` when a case is done, and
    `advance.started(case_id)` when it starts, so a case that runs long is named while it runs."""

    def __init__(self, done: Callable[[str, str, float], None], started: Callable[[str], None]):
        self._done, self.started = done, started

    def __call__(self, case_id: str, status: str, cost: float) -> None:
        self._done(case_id, status, cost)


class Progress:
    """`with Progress(enabled, title, costs) as advance: ... advance(case_id, status, cost)`.

    `costs`: the expected cost of every case still to run (0 for one known to SKIP); a case that
    comes back SKIP takes its cost off the total. `stream` None is stderr;
    `terminal` None asks rich whether it is a terminal; `clock` is time.monotonic (tests pass
    their own). A case still running after `every_s` is named with its time so far (the oldest of
    those that started and have not finished): on a terminal in the bar, elsewhere in a line every
    `every_s` while no case finishes, checked every `beat_s` (None: never, a test calls `beat`)."""

    def __init__(
        self,
        enabled: bool,
        title: str,
        costs: list[float],
        stream: TextIO | None = None,
        terminal: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        every_s: float = PLAIN_EVERY_S,
        beat_s: float | None = 1.0,
    ):
        self.enabled, self.title = enabled, title
        self.eta = Eta(total=len(costs), total_cost=float(sum(costs)))
        self.stream, self.terminal, self.clock, self.every_s = stream, terminal, clock, every_s
        self.counts: dict[str, int] = {}
        self._bar = None
        self._running: dict[str, float] = {}  # case id -> when it started, in order of starting
        self._lock = threading.Lock()
        self._beat_s, self._stop = beat_s, threading.Event()
        self._beater: threading.Thread | None = None
        self._plain_console = None

    def _line(self, now: float | None = None) -> str:
        """Eta's line from a consistent view: judging threads count cases while the beat (or the
        terminal's refresh) thread reads the counts."""
        with self._lock:
            return self.eta.line(self.counts, now)

    def _started(self, case_id: str) -> None:
        with self._lock:
            self._running.setdefault(case_id, self.clock())

    def running(self) -> str:
        """`; running <case> for 1:05` for the oldest case in flight once it has run `every_s`, else ''."""
        with self._lock:
            oldest = next(iter(self._running.items()), None)
        ran = self.clock() - oldest[1] if oldest is not None else 0.0
        return f"; running {oldest[0]} for {clock_text(ran)}" if oldest is not None and ran >= self.every_s else ""

    def beat(self) -> None:
        """Without a terminal: a line when none was printed for `every_s` and a case is running."""
        if self._plain_console is None:
            return
        now, suffix = self.clock(), self.running()
        if not suffix:
            return
        with self._lock:  # checked and claimed at once: a case finishing now prints its own line
            if now - self._last_line < self.every_s:
                return
            self._last_line = now
        self._plain_console.print(self._line(now - self._start) + suffix, markup=False)

    def _beating(self) -> None:
        while not self._stop.wait(self._beat_s):
            self.beat()

    def __enter__(self) -> Advance:
        if not self.enabled:
            return Advance(lambda *_: None, lambda _: None)
        from rich.console import Console

        console = Console(
            file=self.stream, stderr=self.stream is None, force_terminal=self.terminal, highlight=False, soft_wrap=True
        )
        self._start = self.clock()
        if not console.is_terminal:
            return self._plain(console)
        return self._rich(console)

    def _count(self, case_id: str, status: str, cost: float) -> None:
        elapsed = self.clock() - self._start
        with self._lock:
            self._running.pop(case_id, None)
            self.counts[status] = self.counts.get(status, 0) + 1
            (self.eta.skip if status == "SKIP" else self.eta.add)(cost, elapsed)

    def _plain(self, console):
        self._last_line = self._start
        self._plain_console = console
        if self._beat_s is not None:
            self._beater = threading.Thread(target=self._beating, name="attn-gate-progress", daemon=True)
            self._beater.start()

        def advance(case_id: str, status: str, cost: float) -> None:
            self._count(case_id, status, cost)
            now = self.clock()
            with self._lock:
                due = now - self._last_line >= self.every_s or self.eta.done == self.eta.total
                if due:
                    self._last_line = now
            if due:
                console.print(self._line(), markup=False)

        return Advance(advance, self._started)

    def _rich(self, console):
        from rich.progress import BarColumn, ProgressColumn, TextColumn
        from rich.progress import Progress as Bar
        from rich.table import Column
        from rich.text import Text

        outer = self

        class EtaColumn(ProgressColumn):  # redrawn live: the elapsed time moves during a long case
            def render(self, task) -> Text:
                line = outer._line(outer.clock() - outer._start) + outer.running()
                return Text(line, no_wrap=True)

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
            self._count(case_id, status, cost)
            self._bar.update(task, completed=self.eta.done_cost, last=f"{status} {case_id}")

        return Advance(advance, self._started)

    def __exit__(self, *exc) -> bool:
        self._stop.set()
        if self._beater is not None:
            self._beater.join()
        if self._bar is not None:
            self._bar.__exit__(*exc)
        return False
