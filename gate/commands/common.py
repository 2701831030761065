"""Arguments several subcommands share, declared once."""

from __future__ import annotations

import argparse
from pathlib import Path

from gate.workflow.shards import parse_shard


def add_config(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config", type=Path, default=None, help="pyproject.toml holding [tool.attn-gate] (default ./pyproject.toml)"
    )


def add_kernel_suite(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--kernel",
        default=None,
        help="kernel name (attn-gate kernels lists them) or package.module:function; "
        "default: the config's gpu/cpu profile",
    )
    p.add_argument("--suite", default=None, help="suite name (attn-gate suites lists them); default: the profile's")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when a GPU is visible")
    p.add_argument("--only", default=None, metavar="REGEX", help="run only cases whose id matches")


def add_run_options(p: argparse.ArgumentParser, shard: bool = True) -> None:
    """Where the kernel runs and what a run keeps (gate/workflow/isolation.py)."""
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="worker processes the kernel runs in (default: one per visible GPU, 1 on a CPU); "
        "0 runs it in this process without isolation (debugging, overhead measurement)",
    )
    p.add_argument(
        "--case-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="kill a case's worker after this long and record an ERROR row "
        "(default: sized per case from [tool.attn-gate.isolation])",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="skip the cases the journal in --out already holds (same kernel, suite, config, machine)",
    )
    if shard:
        p.add_argument(
            "--shard",
            default=None,
            metavar="K/N",
            help="run only part K of N (balanced by expected cost); join the parts with `attn-gate merge`",
        )


def run_options(args: argparse.Namespace):
    from gate.workflow.sweep import SweepOptions

    return SweepOptions(
        workers=args.workers,
        case_timeout=args.case_timeout,
        out_dir=args.out,
        resume=args.resume,
        shard=parse_shard(getattr(args, "shard", None)),
    )
