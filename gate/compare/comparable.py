"""May this run be judged against that one? One table of checked keys (pyperf's checked metadata).

Two runs (a sweep and its baseline, two shards, a results file and the config as it is now) are
compared only when the keys the caller asks about agree. Each row of CHECKED says how one key of
a `RunKey` is compared and what its refusal says; `why_not_comparable` walks the table in its order and
returns the first key that differs as a typed `Refusal` (the key, both values, what changed), or
None. No caller compares a suite hash or tolerance multipliers itself: each asks here and turns
the refusal into its one-line error, naming its own file and fix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gate.core.config import ToleranceConfig
from gate.core.identity import RunKey


def tolerance_changes(a: dict[str, float], b: dict[str, float]) -> list[str]:
    """The multipliers that differ between two recorded tolerance dicts. A key one of them lacks
    was added later (mult_dsink) and counts at its default, so files written before a new
    tensor's multiplier existed stay comparable without special-casing each new key."""
    defaults = ToleranceConfig().as_dict()
    a, b = {**defaults, **a}, {**defaults, **b}
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def _unequal(ours: Any, theirs: Any) -> tuple[str, ...]:
    return () if ours == theirs else (f"{theirs} -> {ours}",)


def _multipliers(ours: tuple, theirs: tuple) -> tuple[str, ...]:
    return tuple(tolerance_changes(dict(theirs), dict(ours)))


@dataclass(frozen=True)
class CheckedKey:
    key: str  # a RunKey field
    differs: Callable[[Any, Any], tuple[str, ...]]  # what differs (empty: comparable)
    refusal: str  # the one-line refusal with its fix, for a caller without a message of its own


CHECKED = (
    CheckedKey(
        "gpu_class",
        _unequal,
        "GPU class {theirs!r} is not {ours!r}: attn-gate never compares across GPU classes; "
        "run on a {theirs} machine, or make a {ours} baseline",
    ),
    CheckedKey("kernel", _unequal, "kernel {theirs!r} is not {ours!r}: pass --kernel {theirs} or the right file"),
    CheckedKey("suite", _unequal, "suite {theirs!r} is not {ours!r}: pass --suite {theirs} or the right file"),
    CheckedKey(
        "suite_hash",
        _unequal,
        "suite changed (hash {theirs} -> {ours}): compare runs of one definition of the suite",
    ),
    CheckedKey(
        "tolerance",
        _multipliers,
        "tolerance multipliers changed ({changed}): ratios of other multipliers are not comparable",
    ),
)
KEYS = tuple(c.key for c in CHECKED)


@dataclass(frozen=True)
class Refusal:
    """Why two runs must not be compared: the first checked key that differs."""

    key: str
    ours: Any  # the run being judged (or written)
    theirs: Any  # what it is judged against (a baseline, the first shard, the config now)
    changed: tuple[str, ...]  # for tolerance the multipliers that differ; else "theirs -> ours"

    def __str__(self) -> str:
        row = next(c for c in CHECKED if c.key == self.key)
        return row.refusal.format(ours=self.ours, theirs=self.theirs, changed=", ".join(self.changed))


def why_not_comparable(ours: RunKey, theirs: RunKey, keys: Iterable[str] = KEYS) -> Refusal | None:
    """The first of `keys` (in CHECKED's order) on which the two keys differ, or None."""
    wanted = set(keys)
    unknown = wanted - set(KEYS)
    if unknown:
        raise ValueError(f"not a checked key: {', '.join(sorted(unknown))} (one of {', '.join(KEYS)})")
    for row in CHECKED:
        if row.key not in wanted:
            continue
        a, b = getattr(ours, row.key), getattr(theirs, row.key)
        changed = row.differs(a, b)
        if changed:
            if row.key == "tolerance":
                a, b = dict(a), dict(b)
            return Refusal(row.key, a, b, changed)
    return None


def same(ours: RunKey, theirs: RunKey, *keys: str) -> bool:
    """Whether the two agree on `keys` (all checked keys when none are named)."""
    return why_not_comparable(ours, theirs, keys or KEYS) is None
