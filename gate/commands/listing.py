"""`attn-gate kernels` and `attn-gate suites`: what can be run here."""

from __future__ import annotations

import argparse

from gate.commands.common import add_config
from gate.commands.help_text import CASE_ID_LEGEND, parser_kwargs
from gate.core.cases import suite_names
from gate.core.config import load_config
from gate.core.envelope import render_supports
from gate.core.errors import UserError
from gate.kernels.capabilities import Feature


def register(sub) -> None:
    p = sub.add_parser(
        "kernels", help="list kernels, whether each runs here, and what it supports", **parser_kwargs("kernels")
    )
    add_config(p)  # the config's kernel families are listed too
    p.set_defaults(main=kernels)
    p = sub.add_parser("suites", help="list suites and their case counts", **parser_kwargs("suites"))
    add_config(p)
    p.add_argument("--cases", action="store_true", help="print every case id, with a legend of the id grammar")
    p.set_defaults(main=suites)


def kernels(args: argparse.Namespace) -> int:
    from gate.kernels.registry import get_adapter, kernel_entry, kernel_names

    config = load_config(getattr(args, "config", None))
    for name in config.kernels:  # families first; one that does not load says why
        try:
            adapter = kernel_entry(name, config).adapter()
        except UserError as exc:
            print(f"{name:15} unavailable: {exc}")
            continue
        caps = adapter.capabilities()
        entries = ", ".join(getattr(adapter, "entries", None) or ["dense"])
        print(
            f"{name:15} {'available' if adapter.unavailable_reason() is None else 'unavailable'}\n{'':15} "
            f"{adapter.description}; entry points: {entries}{'' if caps.backward else '; forward-only'}"
        )
        family = config.kernels[name]
        if family.supports:  # the declaration as written, then what it leaves of the signature's envelope
            print(f"{'':15} declared {family.supports_table}: {_inline(family.supports)}")
            print(f"{'':15} envelope: {_envelope_line(caps if family.declaration_only else _family_caps(adapter))}")
    for name in kernel_names():
        adapter = get_adapter(name)
        why = adapter.unavailable_reason()
        caps = adapter.capabilities()
        has = {f.value: caps.supports(f) for f in Feature} | {
            "deterministic_mode": caps.deterministic_mode,
            "returns_lse": caps.returns_lse,
        }
        feats = [
            f
            for f in (
                "window",
                "softcap",
                "alibi",
                "dropout",
                "varlen",
                "gqa",
                "deterministic_mode",
                "returns_lse",
                "kvcache",
                "paged",
                "sinks",
            )
            if has[f]
        ]
        state = "available" if why is None else f"unavailable: {why}"
        print(f"{name:15} {state}\n{'':15} {adapter.description}; {'/'.join(caps.dtypes)}; {', '.join(feats)}")
        print(f"{'':15} envelope: {_envelope_line(caps)}")
    return 0


def _inline(values: dict) -> str:
    return "; ".join(render_supports(values, "x").splitlines()[1:])


def _family_caps(adapter):
    """A family's envelope as its dense (else first) entry point sees it."""
    entries = adapter.entries
    return (entries.get("dense") or next(iter(entries.values()))).capabilities()


def _envelope_line(caps) -> str:
    """Capabilities in the declaration's vocabulary: its limits, then the features it lacks."""
    env = caps.envelope()
    limits = {k: v for k, v in env.items() if not isinstance(v, bool)}
    off = [k for k, v in env.items() if v is False]
    return _inline(limits) + (f"; off: {', '.join(off)}" if off else "")


def suites(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if args.cases:
        print(CASE_ID_LEGEND + "\n")
    for name in suite_names(config.suites):
        suite = config.suite(name)
        only = len(suite.cases) - len(suite.swept_cases)
        print(
            f"{name:10} {len(suite.cases):4} cases ({len(suite.perf_cases)} timing{f', {only} of them timing only' if only else ''}) "
            f"from {suite.source}"
        )
        if args.cases:
            for c in suite.cases:
                print(f"    {c.id}{'  [perf only]' if not c.swept else '  [perf]' if c.perf else ''}")
    return 0
