"""`attn-gate perf`: time a kernel against an anchor over a suite's perf cases (no asv needed)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gate.commands.common import add_config, add_kernel_suite
from gate.commands.help_text import parser_kwargs
from gate.core.config import load_config
from gate.core.errors import EXIT_FAIL, EXIT_PASS, UserError
from gate.report.speed_report import print_perf_table
from gate.speed.entries import MAX_ROUNDS
from gate.speed.runs import PerfTarget, run_perf_here, write_perf_outputs
from gate.workflow.validate import check_kernel, validate_target


def register(sub) -> None:
    p = sub.add_parser(
        "perf",
        help="speed ratios (fwd, bwd) of a kernel against an anchor over a suite's perf cases",
        **parser_kwargs("perf"),
    )
    add_kernel_suite(p)
    add_config(p)
    p.add_argument(
        "--anchor",
        default=None,
        help="adapter name or 'matmul' (equal-FLOPs dense matmul); "
        "default: [tool.attn-gate.perf] anchor (cpu_anchor without a GPU)",
    )
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds per pass (default: the config's)")
    p.add_argument("--out", type=Path, default=Path("out"), help="folder for perf-<kernel>-<suite>.json")
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    if args.rounds is not None and not 1 <= args.rounds <= MAX_ROUNDS:  # perf.rounds's range: 1e9 would hang
        raise UserError(f"--rounds {args.rounds}: must be an integer in [1, {MAX_ROUNDS}]")
    config = load_config(args.config)

    target = validate_target(config, args.kernel, args.suite, args.device, args.only)
    device = target.device
    if args.anchor is not None and args.anchor != "matmul":
        check_kernel(args.anchor, device, "--anchor")
    result = run_perf_here(
        PerfTarget.of(target.kernel, config.suite(target.suite), config.perf, device, args.anchor, args.only),
        target.adapter,
        rounds=args.rounds,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    path = write_perf_outputs(result, args.out)
    print_perf_table(result)
    print(f"wrote {path}")
    return EXIT_FAIL if result.any_error else EXIT_PASS
