"""`attn-gate merge DIR... --out DIR`: join `sweep --shard K/N` results into one sweep JSON (exit 0 all
cases pass, 1 some fail, 2 the shards do not fit together: the message says which and why)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from gate.commands.common import add_config
from gate.core.config import load_config
from gate.core.errors import EXIT_FAIL, EXIT_PASS, UserError
from gate.core.files import FolderLock, refuse_inside_baselines, require_writable
from gate.report.sweep_report import write_sweep_outputs
from gate.workflow.merge import merge_shards


def register(sub) -> None:
    p = sub.add_parser("merge", help="join the shards of a sweep (sweep --shard K/N) into one sweep JSON")
    p.add_argument("folders", nargs="+", type=Path, metavar="DIR", help="each shard's --out folder")
    add_config(p)
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="DIR",
        help="folder for the merged sweep-<kernel>-<suite>.json (judge it with `attn-gate check --results`)",
    )
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    if any(os.path.realpath(f) == os.path.realpath(args.out) for f in args.folders):
        raise UserError(f"--out {args.out} is one of the shard folders; pass a new folder for the merged result")
    require_writable(args.out, "--out")
    config = load_config(args.config)

    refuse_inside_baselines(args.out, config.baselines_dir)
    merged = merge_shards(list(args.folders), config)
    with FolderLock(args.out, "--out"):
        try:
            paths = write_sweep_outputs(merged, args.out)
        except OSError as exc:
            raise UserError(
                f"--out {args.out}: cannot write there ({exc.strerror or exc}); pass a writable folder"
            ) from None
    print(f"merged {len(args.folders)} shards, {len(merged.cases)} cases: wrote {paths['json']} and {paths['note']}")
    return EXIT_PASS if merged.passed else EXIT_FAIL
