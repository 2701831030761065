"""The plan of one run, resolved once from config and flags (asv's Config, nox's task tuple).

A RunPlan names the kernel and what resolving it gave (a kernel family of the config, and the
adapter where one was built in this process), the suite's cases, the device and GPU class, the
baseline file, and the config that carries tolerance, isolation and perf settings. `check`,
`baseline update` and the sweep and perf steps read it; none of them loads the suite or resolves
the kernel again.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gate.compare.baselines import baseline_path
from gate.core.cases import Case, Suite, suite_hash
from gate.core.config import Config, IsolationConfig, PerfConfig, ToleranceConfig
from gate.core.errors import UserError
from gate.core.identity import RunKey, Scope
from gate.core.results import SweepResult
from gate.kernels.capabilities import Capabilities
from gate.workflow.validate import validate_target


@dataclass(frozen=True)
class RunPlan:
    config: Config
    entry: Any  # gate.kernels.registry.KernelEntry: the kernel's name and, where the config has one, its family
    suite: Suite
    device: str
    gpu_class: str
    baseline_path: Path | None = None  # None: a run that is not compared (`sweep`, `perf`)
    baseline_option: Path | None = None  # --baseline as given (None: the baselines folder's file)
    only: str | None = None
    options: Any = None  # gate.workflow.sweep.SweepOptions; None: in this process
    perf: bool | None = None  # --perf / --no-perf; None: the device's default (speed_check.perf_wanted)
    # The adapter, where this process built one (a built-in checked here, or an in-process run);
    # None where only a worker process loads the kernel.
    adapter: Any = None

    @property
    def kernel(self) -> str:
        return self.entry.name

    @property
    def family(self):
        """The [tool.attn-gate.kernels] KernelFamily the kernel's name names, or None."""
        return self.entry.family

    @property
    def tolerance(self) -> ToleranceConfig:
        return self.config.tolerance

    @property
    def isolation(self) -> IsolationConfig:
        return self.config.isolation

    @property
    def perf_config(self) -> PerfConfig:
        return self.config.perf

    @functools.cached_property
    def suite_hash(self) -> str:
        return suite_hash(self.suite)

    @functools.cached_property
    def key(self) -> RunKey:
        """What a run of this plan is: the suite as loaded now, the config's tolerance."""
        return RunKey.of(self.kernel, self.suite.name, self.suite_hash, self.tolerance.as_dict(), self.gpu_class)

    @functools.cached_property
    def scope(self) -> Scope:
        """The cases --only admits (an invalid regex is a one-line usage error)."""
        return Scope.of_only(self.only)

    @functools.cached_property
    def cases(self) -> tuple[Case, ...]:
        """The suite's swept cases (all but perf = "only" ones) within --only."""
        return self.scope.select(self.suite.swept_cases)

    @functools.cached_property
    def perf_cases(self) -> tuple[Case, ...]:
        """The suite's perf cases within --only, timing-only ones too (empty when there are none:
        the caller decides)."""
        return self.scope.select(self.suite.perf_cases)

    @functools.cached_property
    def declared(self):
        """The envelope the kernel's table declares ([tool.attn-gate.kernels.NAME.supports]) as
        Capabilities, or None: read from the config alone, so a case outside it is a SKIP row
        decided here, before any worker starts or the kernel is called."""
        family = self.family
        if family is None or not family.supports:
            return None
        return Capabilities.from_declaration(family.supports, family.supports_table)

    def declared_skip(self, case: Case) -> str | None:
        """Why `case` is outside the declared envelope (a SKIP reason), or None."""
        return self.declared.unsupported_reason(case, self.device) if self.declared is not None else None

    def in_process_adapter(self):
        """The adapter for a run in this process: the plan's own, else built from its registry entry
        (once per plan: the answer is kept)."""
        if self.adapter is None:
            object.__setattr__(self, "adapter", self.entry.adapter())
        return self.adapter


@dataclass(frozen=True)
class FreshSweep:
    """The sweep runs now: the plan's cases, in workers as its options say."""

    progress: bool = True


@dataclass(frozen=True)
class SavedSweep:
    """The sweep of a results file, read already (`path` names it in messages), with the
    `attn-gate perf` files (`perf_results`) judged as its speed half."""

    sweep: SweepResult
    path: Path
    perf_results: tuple[Path, ...] = ()


def current_gpu_class(device: str) -> str:
    if device == "cpu":
        return "cpu"
    from gate.core.environment import describe

    return describe(device, "", "")["gpu_class"]


def plan_run(
    config: Config,
    kernel: str,
    suite: str,
    device: str,
    only: str | None = None,
    options: Any = None,
    perf: bool | None = None,
    baseline_file: Path | None = None,
    adapter: Any = None,
    gpu_class: str | None = None,
    entry: Any = None,
) -> RunPlan:
    """A plan from names already checked (validate_target, or a results file's own names);
    `entry`: the kernel's name as validate_target resolved it (else resolved here)."""
    from gate.kernels.registry import kernel_entry  # imports the built-in adapters (torch)

    gpu_class = gpu_class if gpu_class is not None else current_gpu_class(device)
    path = Path(baseline_file) if baseline_file else baseline_path(config.baselines_dir, gpu_class, kernel, suite)
    plan = RunPlan(
        config=config,
        entry=entry if entry is not None else kernel_entry(kernel, config),
        suite=config.suite(suite),
        device=device,
        gpu_class=gpu_class,
        baseline_path=path,
        baseline_option=Path(baseline_file) if baseline_file else None,
        only=only,
        options=options,
        perf=perf,
        adapter=adapter,
    )
    if only is not None and not plan.cases and not plan.perf_cases:
        raise UserError(f"--only {only!r} matches no case of suite {suite!r}")
    return plan


def resolve_plan(
    config: Config,
    kernel: str | None = None,
    suite: str | None = None,
    device: str | None = None,
    only: str | None = None,
    options: Any = None,
    perf: bool | None = None,
    baseline_file: Path | None = None,
    kernel_in_worker: bool = True,
) -> RunPlan:
    """Defaults filled in from the config's profile, every name checked in the order a user reads
    the command line (a typo is a typo, not "no baseline"), then the plan. `kernel_in_worker`: the
    run is isolated, so a user kernel is checked in a worker and never imported here."""
    target = validate_target(config, kernel, suite, device, only, kernel_in_worker=kernel_in_worker)
    return plan_run(
        config,
        target.kernel,
        target.suite,
        target.device,
        only,
        options,
        perf,
        baseline_file,
        adapter=target.adapter,
        entry=target.entry,
    )
