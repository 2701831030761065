"""The known_failures declarations that applied to a verdict, grouped with what each covered, for
the terminal, the Markdown summary and the PR comment alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gate.compare.findings import Finding, Rule, Severity, Verdict


@dataclass(frozen=True)
class KnownGroup:
    """One known_failures declaration that applied to the run, with what it covered and what passes now."""

    entry: dict[str, Any]  # verdict.context["known_failures"] item: index, reason, link, cases, tensors ...
    known: tuple[Finding, ...]  # KNOWN findings it covered
    xpass: tuple[Finding, ...]  # its cases that pass now

    @property
    def cases(self) -> list[str]:
        return sorted({f.case_id for f in self.known})

    @property
    def covers(self) -> str:
        return ", ".join(self.entry.get("tensors") or ["any failure"])


def known_groups(verdict: Verdict) -> list[KnownGroup]:
    """The declarations that applied, in file order, each with its KNOWN and XPASS findings."""
    groups = []
    for entry in verdict.context.get("known_failures") or []:
        mine = [f for f in verdict.findings if f.entry == entry["index"]]
        groups.append(
            KnownGroup(
                entry,
                tuple(f for f in mine if f.severity is Severity.KNOWN),
                tuple(f for f in mine if f.rule is Rule.XPASS),
            )
        )
    return groups
