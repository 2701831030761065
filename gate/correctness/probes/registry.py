"""Depth checks (probes) beyond the error ratio, by name: the registry a suite or the CLI turns on.

A check is a callable (adapter, case, device) -> tuple[CheckResult]; `run_case` runs the ones a
case asks for after its error measurement, and a CheckResult with passed=False makes the case
FAIL (passed=None is information: measured, not judged). Two ways to turn checks on:

  * in a suite, per matrix block:   checks = [["determinism", "batch_invariance"]]
  * for a whole run, from the CLI:  attn-gate sweep --checks determinism,dropout

This module imports no torch: suites name checks without loading any kernel.
"""

from __future__ import annotations

from typing import Callable

# The names and what each proves are case vocabulary (gate/core/cases.py); this registry maps a
# name to the function that runs it, so it knows cases and not the other way round.
from gate.core.cases import CHECKS
from gate.core.errors import UserError


def check_function(name: str) -> Callable:
    """The callable behind a check name (imports torch-side modules lazily)."""
    if name == "determinism":
        from gate.correctness.probes.determinism import determinism_check

        return determinism_check
    if name == "race":
        from gate.correctness.probes.determinism import race_check

        return race_check
    if name == "batch_invariance":
        from gate.correctness.probes.determinism import batch_invariance_check

        return batch_invariance_check
    if name == "dropout":
        from gate.correctness.probes.dropout import dropout_check

        return dropout_check
    raise UserError(f"unknown check {name!r}; known checks: {', '.join(CHECKS)}")


def parse_names(text: str | None, option: str = "--checks") -> tuple[str, ...]:
    """'determinism,dropout' -> ('determinism', 'dropout'); unknown names are a UserError."""
    if not text:
        return ()
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise UserError(f"{option} {text!r}: unknown check {unknown[0]!r}; known checks: {', '.join(CHECKS)}")
    return names


def checks_for(case, extra_names: tuple[str, ...] = ()) -> tuple[Callable, ...]:
    """The callables to run on `case`: its own checks, then the run-wide ones, each once."""
    names = tuple(dict.fromkeys(tuple(case.checks) + tuple(extra_names)))
    return tuple(check_function(n) for n in names)
