"""`attn-gate probe KERNEL`: find a kernel's envelope, print it as a declaration, and with --write
put it into pyproject.toml (gate/workflow/probe.py decides; this prints)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gate.commands.common import add_config
from gate.commands.help_text import parser_kwargs
from gate.core.config import load_config
from gate.core.errors import EXIT_PASS, UserError
from gate.report import wrapped
from gate.workflow.probe import probe, write_declaration
from gate.workflow.validate import check_device


def register(sub) -> None:
    p = sub.add_parser(
        "probe",
        help="find what a kernel supports by calling it on tiny inputs; print (--write: save) the declaration",
        **parser_kwargs("probe"),
    )
    p.add_argument(
        "kernel", metavar="KERNEL", help="a built-in name, package.module:function, or a kernel family of the config"
    )
    add_config(p)
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when a GPU is visible")
    p.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds one probe call may take before it counts as a hang (default 60: a JIT kernel compiles)",
    )
    p.add_argument("--write", action="store_true", help="write the declaration into the config file (pyproject.toml)")
    p.add_argument("--quiet", "-q", action="store_true", help="no line per probe call")
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    if not args.timeout > 0:
        raise UserError(f"--timeout {args.timeout}: give seconds > 0")
    config = load_config(args.config)
    device = check_device(args.device)

    def show(result) -> None:
        if not args.quiet:
            print(result.line(), file=sys.stderr, flush=True)

    report = probe(args.kernel, config, device, args.timeout, show)
    print(wrapped(f"probed {args.kernel} on {device}: {report.counts()}"))
    for finding in report.findings:
        print(wrapped(f"finding: {finding}"))
    print()
    print(report.toml() + ("# every probed axis runs: nothing to narrow\n" if not report.supports else ""), end="")
    if args.write:
        path = Path(args.config) if args.config else Path("pyproject.toml")
        write_declaration(path, report)
        print(f"\nwrote {report.table} into {path}")
    return EXIT_PASS
