"""`attn-gate selftest`: would the gate catch it, here, with this config? Exit 0 every control passed
and every planted bug was killed, 1 otherwise, 2 usage error."""

from __future__ import annotations

import argparse
from pathlib import Path

from gate.commands.common import add_config
from gate.core.config import load_config
from gate.report.selftest_report import headline_parts, selftest_table


def register(sub) -> None:
    p = sub.add_parser(
        "selftest", help="plant bugs and slowdowns in the configured kernel and check the gate catches them"
    )
    p.add_argument("--kernel", default=None, help="kernel to plant into (default: the config's gpu/cpu profile)")
    p.add_argument("--suite", default=None, help="suite the gate runs (default: the profile's)")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when a GPU is visible")
    add_config(p)
    p.add_argument(
        "--out", type=Path, default=Path("out"), help="folder for selftest.md (the kill matrix) and selftest.json"
    )
    p.add_argument(
        "--bugs", default=None, metavar="NAMES", help="only these planted bugs, comma-separated (default: all)"
    )
    p.add_argument("--no-slowdowns", action="store_true", help="skip the planted slowdowns (GPU only anyway)")
    p.add_argument(
        "--reps",
        type=int,
        default=None,
        help="repetitions of each planted slowdown (default 5, fewer when the time budget runs out; at least 1)",
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="time budget in seconds; the slowdown repetitions stop "
        "when the next one would not fit (default 330 on a GPU, none on a CPU)",
    )
    p.add_argument(
        "--slowdown-case",
        default=None,
        metavar="REGEX",
        help="plant the slowdowns in the cheapest perf case whose id matches (default: the cheapest perf "
        "case with a backward); a decode case is slowed in its forward, the only pass it has",
    )
    p.add_argument(
        "--rehearse-slowdowns-on-cpu",
        action="store_true",
        help="run the slowdown part on a CPU with a busy-wait: checks the plumbing, measures nothing about GPUs, "
        "never decides the exit code",
    )
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    from gate.workflow.selftest import DEFAULT_REPS, output_paths, run_selftest

    config = load_config(args.config)
    bugs = tuple(n.strip() for n in (args.bugs or "").split(",") if n.strip())
    report = run_selftest(
        config,
        args.kernel,
        args.suite,
        args.device,
        args.out,
        bugs=bugs,
        slowdowns=not args.no_slowdowns,
        budget_s=args.budget_s,
        reps=DEFAULT_REPS if args.reps is None else args.reps,
        rehearse_slowdowns_on_cpu=args.rehearse_slowdowns_on_cpu,
        slowdown_case=args.slowdown_case,
    )

    paths = output_paths(args.out)  # written by the run after every step
    print(selftest_table(report))
    problems = report.problems()
    print(f"{'PASS' if not problems else 'FAIL'}: selftest of {report.kernel} on {report.suite} ({report.wall_s:.0f}s)")
    for part in headline_parts(report):  # the gate's own teeth apart from what ran against the user's kernel
        print(f"  {part}")
    for line in problems:
        print(f"  - {line}")
    print(f"wrote {paths['md']} and {paths['json']}")
    return report.exit_code
