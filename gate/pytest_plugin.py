"""The gate's suites as pytest tests: `pytest --attn-gate [--attn-gate-suite S] [--attn-gate-kernel K]`.

Each case of the suite is an item named by its case id (node id `attn-gate::<case id>`, marker
`attn_gate`), so `-k`, `-x`, `--lf`, `-m attn_gate`, pytest-xdist and `--junitxml` work as for any
test. An item runs its case as `attn-gate check` runs it (in the gate's isolated worker process,
kept warm between items; gate/workflow/pytest_cases.py) and takes the check's verdict on it
(gate/workflow/check.py `case_verdicts`: tolerance, headroom against the committed baseline, status): FAIL fails the item
with the gate's one-line reason, SKIP skips it with the gate's reason, a declared known failure is
an xfail. At the end the process that reports (the xdist controller, or the only process) joins
every item's row into one sweep and judges it with `attn-gate check --results`'s own code, which
writes the findings JSON, the Markdown report and the plot into --attn-gate-out; a run-wide
blocking finding (no case measured, for example) fails the session. Without --attn-gate nothing
happens: this module imports only pytest until the option is given.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

ROW = "attn_gate_row"  # the report attribute that carries an item's result row (xdist serialises it)
MARKER = "attn_gate: a case of an attn-gate suite (pytest --attn-gate)"


def pytest_addoption(parser) -> None:
    group = parser.getgroup("attn-gate", "attn-gate: the gate's suite cases as tests")
    group.addoption(
        "--attn-gate",
        action="store_true",
        default=False,
        help="add the cases of the gate's suite as tests (one per case id; select them alone with -m attn_gate)",
    )
    group.addoption(
        "--attn-gate-suite",
        default=None,
        metavar="SUITE",
        help="suite (attn-gate suites); default: the config's profile",
    )
    group.addoption(
        "--attn-gate-kernel",
        default=None,
        metavar="KERNEL",
        help="kernel name or package.module:function; default: the config's profile",
    )
    group.addoption(
        "--attn-gate-device", default=None, choices=("cuda", "cpu"), help="default: cuda when a GPU is visible"
    )
    group.addoption(
        "--attn-gate-config",
        default=None,
        metavar="PYPROJECT",
        help="pyproject.toml holding [tool.attn-gate] (default ./pyproject.toml)",
    )
    group.addoption(
        "--attn-gate-baseline",
        default=None,
        metavar="FILE",
        help="compare with this baseline (default: baselines/<gpu-class>/<kernel>-<suite>.json)",
    )
    group.addoption(
        "--attn-gate-out",
        default="out",
        metavar="DIR",
        help="where the findings JSON, report and plot of the run are written (default: out)",
    )


def pytest_configure(config) -> None:
    if not config.getoption("attn_gate", False):
        return
    config.addinivalue_line("markers", MARKER)
    config.pluginmanager.register(GateSession(config), "attn-gate-session")


class GateSession:
    """The run (gate/workflow/pytest_cases.py), resolved once per process; the rows it reports."""

    def __init__(self, config) -> None:
        from gate.workflow import pytest_cases  # the one deferred import: the gate loads only with --attn-gate

        self.lib = pytest_cases
        self.config = config
        self.run = None  # pytest_cases.GateRun
        self.rows: dict[str, dict] = {}  # case id -> {"row": CaseResult dict, "environment", "notes"}
        self.started = time.time()
        self.summary: list[str] = []  # the verdict's lines, printed with pytest's own summary

    def _resolve(self) -> None:
        opt = self.config.getoption
        try:
            self.run = self.lib.resolve(
                opt("attn_gate_config"),
                opt("attn_gate_kernel"),
                opt("attn_gate_suite"),
                opt("attn_gate_device"),
                opt("attn_gate_baseline"),
            )
        except self.lib.UserError as exc:
            raise pytest.UsageError(f"attn-gate: {exc}") from None

    @pytest.hookimpl(tryfirst=True)  # before -k / -m / --lf select among the items
    def pytest_collection_modifyitems(self, session, config, items) -> None:
        self._resolve()
        parent = GateCollector.from_parent(session, name="attn-gate", nodeid="attn-gate")
        cases = [GateCase.from_parent(parent, name=case.id, gate=self, case=case) for case in self.run.plan.cases]
        items.extend(cases)
        # reported as collected, so the terminal's "N tests collected" counts them too
        config.hook.pytest_collectreport(report=pytest.CollectReport(parent.nodeid, "passed", None, cases))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        payload = getattr(item, "_attn_gate_row", None)
        if call.when == "call" and payload is not None:
            setattr(report, ROW, payload)
        return report

    def pytest_runtest_logreport(self, report) -> None:
        payload = getattr(report, ROW, None)
        if payload is not None:
            self.rows[report.nodeid.split("::", 1)[1]] = json.loads(payload)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus) -> None:
        """The reporting process writes the run's files as `attn-gate check` does; an xdist worker
        only sends its rows."""
        if hasattr(self.config, "workerinput") or not self.rows:
            return
        try:
            if self.run is None:  # the xdist controller collects nothing itself
                self._resolve()
            outcome = self.run.judge(self.rows, self.started, Path(self.config.getoption("attn_gate_out")))
        except (self.lib.UserError, pytest.UsageError) as exc:
            self._say(f"attn-gate: error: {exc}")
            session.exitstatus = pytest.ExitCode.USAGE_ERROR
            return
        self._say(f"attn-gate: {outcome.verdict.headline}")
        self._say("attn-gate: wrote " + ", ".join(str(p) for p in outcome.paths.values()))
        if not outcome.verdict.passed and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED  # a run-wide finding no item carries

    def _say(self, line: str) -> None:
        self.summary.append(line)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        """The verdict's lines where pytest prints a plugin's summary: on a line of their own, after
        the progress dots (written from sessionfinish, they joined its `[100%]`)."""
        from gate.report import wrap_words

        width = terminalreporter.config.get_terminal_writer().fullwidth
        for line in self.summary:
            for piece in wrap_words(line, width):
                terminalreporter.write_line(piece)


class GateCollector(pytest.Collector):
    """The parent of the case items (their node ids are `attn-gate::<case id>`)."""

    def collect(self):
        return []


class GateCase(pytest.Item):
    def __init__(self, *, gate: GateSession, case, **kwargs) -> None:
        super().__init__(**kwargs)
        self.gate, self.case = gate, case
        self.add_marker("attn_gate")

    def runtest(self) -> None:
        try:
            verdict, payload = self.gate.run.run_case(self.case)
        except self.gate.lib.UserError as exc:  # e.g. a run another GPU class than the baseline's
            raise CaseFailed(f"attn-gate: {exc}") from None
        self._attn_gate_row = payload
        if verdict.outcome == "FAIL":
            raise CaseFailed(verdict.reason)
        if verdict.outcome == "SKIP":
            pytest.skip(verdict.reason)
        if verdict.outcome == "KNOWN":
            pytest.xfail(verdict.reason)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CaseFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.gate.run.plan.config.source, None, f"attn-gate {self.gate.run.plan.kernel} / {self.case.id}"


class CaseFailed(Exception):
    """The gate's FAIL verdict on a case; its message is the gate's one line."""
