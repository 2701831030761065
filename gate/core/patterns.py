"""User regular expressions (`--only`, a known failure's `cases`, a results file's `scope`),
compiled only when their matching time is bounded.

Python's `re` backtracks: `(a+)+$`, `(a|a)*$` or `.*.*.*.*x` take exponential or high-polynomial
time on a case id that almost matches, and a match holds the GIL, so it cannot be interrupted. A
timeout would need a process per match and would make the selection depend on the machine's speed;
refusing the few shapes that backtrack without bound, before any work, is deterministic and costs
nothing. Refused: a quantifier inside a repeated group, an alternation inside a repeated group,
two repeats side by side, a backreference, and a pattern longer than MAX_PATTERN characters. What
users write to pick cases (`causal.*d128`, `^bf16-.*-s(512|1024)`, `(fwd|bwd)`) is none of these.
"""

from __future__ import annotations

import re

try:  # Python 3.11+
    from re import _constants as C  # type: ignore[attr-defined]
    from re import _parser as P
except ImportError:  # pragma: no cover - older Pythons
    import sre_constants as C  # type: ignore[no-redef]
    import sre_parse as P  # type: ignore[no-redef]

MAX_PATTERN = 100_000  # an exact list of a few thousand ids (--last-failed, known failures) fits
_REPEATS = {C.MAX_REPEAT, C.MIN_REPEAT} | ({C.POSSESSIVE_REPEAT} if hasattr(C, "POSSESSIVE_REPEAT") else set())


def _children(op, av) -> list:
    """The sub-patterns of one parsed item."""
    if op in _REPEATS:
        return [av[2]]
    if op is C.SUBPATTERN:
        return [av[-1]]
    if op is C.BRANCH:
        return list(av[1])
    if op in (C.ASSERT, C.ASSERT_NOT):
        return [av[1]]
    if op is C.GROUPREF_EXISTS:
        return [p for p in av[1:] if p is not None]
    if getattr(C, "ATOMIC_GROUP", None) is op:
        return [av]
    return []


def _risky_inside(items) -> str:
    """What, inside a repeated group, makes it backtrack without bound ("" for nothing)."""
    for op, av in items:
        if op in _REPEATS and av[1] > 1:
            return "a quantifier inside a repeated group (like (a+)+)"
        if op is C.BRANCH:
            return "an alternation inside a repeated group (like (a|ab)*)"
        for child in _children(op, av):
            why = _risky_inside(child)
            if why:
                return why
    return ""


def _why_unbounded(items) -> str:
    previous_repeat = False
    for op, av in items:
        if op in (C.GROUPREF, C.GROUPREF_EXISTS):
            return "a backreference"
        repeat = op in _REPEATS and av[1] > 1
        if repeat and previous_repeat:
            return "two repeats side by side (like .*.* or [ab]+c*; put a literal between them)"
        if repeat:
            why = _risky_inside(av[2])
            if why:
                return why
        for child in _children(op, av):
            why = _why_unbounded(child)
            if why:
                return why
        previous_repeat = repeat
    return ""


def bounded_regex(text: str) -> re.Pattern[str]:
    """`text` compiled; a ValueError when it is no
    regular expression or one whose matching could backtrack without bound. The error's text
    follows the pattern in a message: f"--only {text!r} {exc}"."""
    if not isinstance(text, str):
        raise ValueError("is not a string")
    if len(text) > MAX_PATTERN:
        raise ValueError(f"is longer than {MAX_PATTERN} characters")
    try:
        parsed = P.parse(text)
        pattern = re.compile(text)
    except (re.error, RecursionError, OverflowError) as exc:
        raise ValueError(f"is not a regular expression ({exc})") from None
    why = _why_unbounded(list(parsed))
    if why:
        raise ValueError(f"holds {why}, whose matching can backtrack for hours on a case id; write it without that")
    return pattern
