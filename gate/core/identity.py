"""What a run is, as values: its key (what it may be compared with) and its scope (which cases).

A `RunKey` names what two runs must share to be judged against each other: kernel, suite, the
suite's hash, the tolerance multipliers and the GPU class; gate/compare/comparable.py holds the
table that compares two keys. A `Scope` is the `--only` filter: the one place a case id is
admitted or not, so a check, a baseline update, a merge of shards and the speed step cannot
disagree about which cases a filtered run covers.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from gate.core.errors import UserError
from gate.core.patterns import bounded_regex

T = TypeVar("T")


@dataclass(frozen=True)
class RunKey:
    """Identity of a run or a baseline (torch.utils.benchmark's TaskSpec): frozen and hashable.
    `tolerance` is the recorded multipliers as sorted (name, value) pairs."""

    kernel: str
    suite: str
    suite_hash: str
    tolerance: tuple[tuple[str, float], ...]
    gpu_class: str

    @classmethod
    def of(cls, kernel: str, suite: str, suite_hash: str, tolerance: dict[str, Any], gpu_class: str) -> "RunKey":
        return cls(kernel, suite, suite_hash, tuple(sorted(tolerance.items())), gpu_class)

    @property
    def multipliers(self) -> dict[str, float]:
        return dict(self.tolerance)


@dataclass(frozen=True)
class Scope:
    """The cases of a suite a run covers: the `--only` regex (searched in the case id), or the
    whole suite (`only` None). Compiled only when its matching time is bounded (core/patterns.py)."""

    only: str | None = None

    @classmethod
    def of_only(cls, only: str | None) -> "Scope":
        """--only as a scope; an invalid regex is a one-line usage error naming the flag."""
        scope = cls(only)
        try:
            scope.pattern
        except ValueError as exc:
            raise UserError(f"--only {str(only)[:200]!r} {exc}") from None
        return scope

    @property
    def whole(self) -> bool:
        return self.only is None

    @property
    def pattern(self) -> re.Pattern[str] | None:
        """The compiled regex (None for the whole suite); a ValueError for one refused or invalid."""
        return None if self.only is None else _compiled(self.only)

    def admits(self, case_id: str) -> bool:
        pattern = self.pattern
        return pattern is None or pattern.search(case_id) is not None

    def select(self, cases: Iterable[T]) -> tuple[T, ...]:
        """The cases (anything with an `id`) this scope admits, in their order."""
        return tuple(c for c in cases if self.admits(c.id))  # type: ignore[attr-defined]

    def covers(self, other: "Scope") -> bool:
        """Whether every case `other` admits is sure to be admitted here: the whole suite covers
        any scope; two regexes are only known to agree when they are the same text."""
        return self.whole or self.only == other.only


@functools.lru_cache(maxsize=64)
def _compiled(text: str) -> re.Pattern[str]:
    """bounded_regex, kept per text: a scope is asked once per case id, and the check parses."""
    return bounded_regex(text)


@dataclass(frozen=True)
class Environment:
    """The machine and software a run measured on (gate.core.environment.describe's keys), typed.
    A key the record lacks is None, not invented; a value is read as a string (what every reader
    printed it as); keys this version does not know (a newer writer's) are kept in `extra` as they
    were, so to_dict gives back the record."""

    device: str | None = None
    gpu_name: str | None = None
    gpu_class: str | None = None
    compute_capability: str | None = None
    driver: str | None = None
    cuda: str | None = None
    cudnn: str | None = None
    torch: str | None = None
    python: str | None = None
    attn_gate: str | None = None
    kernel: str | None = None
    kernel_version: str | None = None
    machine: str | None = None
    cpu: str | None = None
    cpu_model: str | None = None
    cpu_capability: str | None = None
    git_commit: str | None = None
    anchor: str | None = None  # perf runs: the anchor kernel the ratios are against
    host: str | None = None  # perf runs: the digest of the host that timed them (environment.host_id)
    extra: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Environment":
        known = {f for f in cls.__dataclass_fields__ if f != "extra"}
        fields = {k: str(v) for k, v in d.items() if k in known}
        return cls(**fields, extra=tuple((k, v) for k, v in d.items() if k not in known))

    def to_dict(self) -> dict[str, Any]:
        known = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "extra"}
        return {**{k: v for k, v in known.items() if v is not None}, **dict(self.extra)}

    def value(self, key: str) -> Any:
        """One key's value by name (None where the record lacks it), for the tables that compare or
        list environments key by key (DRIFT_KEYS, WIDEN_KEYS ...); a key this version does not know
        is read from `extra` as written."""
        if key in self.__dataclass_fields__ and key != "extra":
            return getattr(self, key)
        return dict(self.extra).get(key)

    @property
    def gpu_class_or_unknown(self) -> str:
        """The GPU class a baseline folder is named by ("unknown" for a record without one)."""
        return self.gpu_class if self.gpu_class is not None else "unknown"
