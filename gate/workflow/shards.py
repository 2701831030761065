"""`--shard K/N`: a deterministic split of a suite's cases into N parts of about equal expected cost.

Greedy longest-processing-time: cases by decreasing expected cost (ties in suite order), each to
the part with the least cost so far (ties to the lowest part). The same suite and N always give
the same parts on any machine, so shards run as independent jobs (a CI matrix) and `attn-gate
merge` can check that every shard ran exactly its part.
"""

from __future__ import annotations

import re

from gate.core.cases import Case
from gate.core.errors import UserError

MAX_SHARDS = 1000
CASE_OVERHEAD_FLOPS = 2e8  # a case's fixed cost (inputs, references, launch) in FLOP-equivalents


def parse_shard(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    shard = shard_numbers(str(text))
    if shard is None:
        raise UserError(f"--shard {text!r}: expected K/N with 1 <= K <= N <= {MAX_SHARDS}, e.g. --shard 1/2")
    return shard


def shard_numbers(text: str) -> tuple[int, int] | None:
    """K/N with 1 <= K <= N <= MAX_SHARDS, or None: the one bound for `--shard` and for the shard
    note `merge` reads back (a note of 1/1000000000000 would make merge plan a trillion parts)."""
    m = re.fullmatch(r"\s*(\d{1,7})\s*/\s*(\d{1,7})\s*", text)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)) <= MAX_SHARDS:
        return None
    return int(m.group(1)), int(m.group(2))


def expected_cost(case: Case, check_names: tuple[str, ...] = ()) -> float:
    """Case.work (the FLOPs a sweep runs for it, with the run-wide `check_names`) plus a fixed cost
    per seed and run, so tiny cases are not free."""
    return case.work(check_names) + CASE_OVERHEAD_FLOPS * len(case.seeds) * case.runs(check_names)


def assign(cases: tuple[Case, ...] | list[Case], n: int) -> list[int]:
    """The part (1..n) of each case, in the order given."""
    loads = [0.0] * n
    part = [0] * len(cases)
    for i in sorted(range(len(cases)), key=lambda i: (-expected_cost(cases[i]), i)):
        target = min(range(n), key=lambda p: (loads[p], p))
        loads[target] += expected_cost(cases[i])
        part[i] = target + 1
    return part


def shard_cases(cases, shard: tuple[int, int] | None) -> list[Case]:
    if shard is None:
        return list(cases)
    k, n = shard
    return [c for c, p in zip(cases, assign(list(cases), n)) if p == k]


def shard_note(shard: tuple[int, int]) -> str:
    return f"shard {shard[0]}/{shard[1]}"


def note_shard(note: str) -> tuple[int, int] | None:
    """The K/N of a shard note; None for another note. A shard note out of bounds (1/0,
    1/1000000000000) is a ValueError: the file's reader reports it as a bad field."""
    m = re.fullmatch(r"shard (\S+)", note)
    if not m:
        return None
    shard = shard_numbers(m.group(1))
    if shard is None:
        raise ValueError(f"notes: {note!r} is not a shard K/N with 1 <= K <= N <= {MAX_SHARDS}")
    return shard
