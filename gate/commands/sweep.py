"""`attn-gate sweep`: correctness of one kernel over one suite; exit 0 pass, 1 fail."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from gate.commands.common import add_config, add_kernel_suite, add_run_options, run_options
from gate.commands.help_text import parser_kwargs
from gate.commands.main import DONE_FILE_ENV
from gate.core.config import load_config
from gate.core.errors import EXIT_FAIL, EXIT_PASS, UserError
from gate.core.files import FolderLock, refuse_inside_baselines, require_writable
from gate.correctness.probes.registry import parse_names
from gate.report.sweep_report import print_table, write_sweep_outputs


def register(sub) -> None:
    p = sub.add_parser("sweep", help="correctness sweep of one kernel over one suite", **parser_kwargs("sweep"))
    add_kernel_suite(p)
    add_config(p)
    p.add_argument("--out", type=Path, default=Path("out"), help="folder for the JSON report and validation note")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--checks",
        default=None,
        metavar="NAMES",
        help="extra checks on every case, comma-separated: determinism, race, batch_invariance, dropout "
        "(added to those the suite names)",
    )
    add_run_options(p)
    p.set_defaults(main=main)


def run_supervised(argv: list[str]) -> int:
    """`--workers 0` runs the kernel in the sweep's own process, so a kernel that ends the process
    (os._exit(0)) would end the run with exit 0 and nothing written: the sweep runs in a child
    process instead, and its exit code counts only when it returned normally (it wrote the file
    DONE_FILE_ENV names)."""

    with tempfile.TemporaryDirectory(prefix="attn-gate-") as tmp:
        done = Path(tmp) / "exit-code"
        proc = subprocess.run([sys.executable, "-m", "gate", *argv], env={**os.environ, DONE_FILE_ENV: str(done)})
        if done.is_file():
            return proc.returncode
    how = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
    print(
        f"attn-gate: error: the sweep ended ({how}) before it wrote its report: with --workers 0 the kernel runs "
        f"in the sweep's own process, so a kernel that exits or crashes ends the run; rerun without --workers 0 "
        f"to get an ERROR row for the case instead",
        file=sys.stderr,
    )
    return EXIT_FAIL


def main(args: argparse.Namespace) -> int:
    from gate.workflow.plan import resolve_plan
    from gate.workflow.sweep import sweep_plan

    require_writable(args.out, "--out")  # before the sweep, not after minutes of it
    config = load_config(args.config)

    refuse_inside_baselines(args.out, config.baselines_dir)
    options = run_options(args)

    # a supervised run imports the kernel in its child only: this process stays free of its code
    supervised = options.workers == 0 and not os.environ.get(DONE_FILE_ENV)
    plan = resolve_plan(
        config,
        args.kernel,
        args.suite,
        args.device,
        args.only,
        options,
        kernel_in_worker=options.workers != 0 or supervised,
    )
    check_names = parse_names(args.checks)
    if supervised:
        return run_supervised(args.argv)

    with FolderLock(args.out, "--out"):
        result = sweep_plan(plan, progress=not args.no_progress, check_names=check_names)
        try:
            paths = write_sweep_outputs(result, args.out)
        except OSError as exc:
            raise UserError(
                f"--out {args.out}: cannot write the report there ({exc.strerror or exc}); pass a writable folder"
            ) from None
    print_table(result)
    print(f"wrote {paths['json']} and {paths['note']}")
    return EXIT_PASS if result.passed else EXIT_FAIL
