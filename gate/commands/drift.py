"""`attn-gate drift`: train a toy transformer with the kernel and with reference attention; exit 0
when the kernel's loss curve stays inside the band the reference runs span, 1 when it leaves it
(or the kernel raises / the loss goes NaN), 2 on a usage or environment error."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gate.commands.common import add_config
from gate.commands.help_text import parser_kwargs
from gate.core.config import load_config
from gate.core.errors import EXIT_FAIL, EXIT_PASS, UserError
from gate.correctness.drift import default_config, run_drift, write_drift_outputs
from gate.workflow.validate import check_device, checked_kernel


def register(sub) -> None:
    p = sub.add_parser(
        "drift",
        help="training drift: a toy transformer trained with the kernel vs the float32 reference",
        **parser_kwargs("drift"),
    )
    p.add_argument(
        "--kernel",
        default=None,
        help="kernel name (attn-gate kernels lists them) or package.module:function; "
        "default: the config's gpu/cpu profile, as in every other command",
    )
    p.add_argument("--steps", type=int, default=None, help="training steps (default 1000 on a GPU, 100 on a CPU)")
    p.add_argument("--out", type=Path, default=Path("out"), help="folder for drift-KERNEL.json and drift-KERNEL.png")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when a GPU is visible")
    p.add_argument("--dtype", default="bf16", help="dtype the kernel sees: bf16 (default), fp16 or fp32")
    p.add_argument("--seed", type=int, default=0, help="seed of the initialisation and the data")
    add_config(p)  # a kernel family of the config trains through its dense entry point
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    if args.steps is not None and args.steps < 2:
        raise UserError(f"--steps {args.steps}: drift needs at least 2 training steps")

    device = check_device(args.device)
    if args.dtype not in ("bf16", "fp16", "fp32"):
        raise UserError(f"--dtype {args.dtype!r}: choose bf16, fp16 or fp32")
    config = load_config(args.config)
    kernel = args.kernel or config.profile(device).kernel
    entry, adapter = checked_kernel(kernel, device, config=config)
    cfg = default_config(device, steps=args.steps, dtype=args.dtype, seed=args.seed)
    family = adapter if entry.family is not None else None  # a family trains through its dense entry point
    if family is not None and not family.capabilities().backward:
        raise UserError(
            f"--kernel {kernel}: a forward-only family (backward = false) cannot be trained; drift needs a backward"
        )
    result = run_drift(
        kernel, cfg, device, adapter=family, progress=lambda msg: print(msg, file=sys.stderr, flush=True)
    )
    paths = write_drift_outputs(result, args.out)
    verdict = "PASS" if result.passed else "FAIL"
    print(f"{verdict}: drift of {result.kernel} over {cfg.steps} steps ({cfg.dtype}, {device}): {result.reason}")
    print(f"wrote {paths['json']} and {paths['png']}")
    return EXIT_PASS if result.passed else EXIT_FAIL
