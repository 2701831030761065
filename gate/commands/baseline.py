"""`attn-gate baseline update|carry|show`: rewrite this GPU class's baseline on purpose, carry
baselines to their suites as changed with no run (gate/workflow/carry.py), or print one.

update: exit 0 written, 1 refused because the run itself fails its bounds on a case no
[[tool.attn-gate.known_failures]] declaration covers (nothing written; the message names the rows
and the tensors to declare), 2 usage or environment error: among them a run
that lacks cases of the suite (a truncated results file would delete them from the baseline),
--only without an existing baseline, an --out or --summary that cannot be written (checked before
the sweep; the summary is written before the baseline).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gate.commands.common import add_config, add_kernel_suite
from gate.commands.help_text import parser_kwargs
from gate.compare.baselines import baseline_path, read_baseline
from gate.core.config import load_config
from gate.core.errors import UserError
from gate.core.identity import Scope
from gate.core.results import EXTRA_TENSORS, TENSORS
from gate.workflow.validate import check_device, require_initialised, validate_target


class RemovedFlag(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(
            f"{option_string} was removed: declare each failing case as an upstream bug in "
            f"[[tool.attn-gate.known_failures]] (kernel, cases, tensors, reason, link) and run "
            f"`attn-gate baseline update` again; see docs/known-failures.md"
        )


def register(sub) -> None:
    p = sub.add_parser(
        "baseline", help="update or show the committed baseline of this GPU class", **parser_kwargs("baseline")
    )
    bsub = p.add_subparsers(dest="baseline_command", required=True, metavar="ACTION")
    u = bsub.add_parser(
        "update",
        help="rewrite baselines/<gpu-class>/<kernel>-<suite>.json from a fresh run or a results file",
        **parser_kwargs("baseline update"),
    )
    add_kernel_suite(u)
    add_config(u)
    u.add_argument(
        "--from-results",
        type=Path,
        default=None,
        metavar="FILE",
        help="a sweep JSON (from `attn-gate sweep` or `check`, e.g. a CI artifact) instead of a fresh run",
    )
    # gone: a failing row is recorded only under a declaration with a reason and a link. Kept as a
    # hidden flag so an old CI script gets the way forward, not just "unrecognized arguments".
    u.add_argument("--allow-failing", nargs=0, action=RemovedFlag, help=argparse.SUPPRESS)
    u.add_argument(
        "--known",
        default=None,
        metavar="REASON",
        help="record the failing cases as known failures: appends a [[tool.attn-gate.known_failures]] "
        "declaration with this reason that covers exactly them to pyproject.toml, then writes the baseline",
    )
    u.add_argument(
        "--link",
        default="",
        metavar="URL",
        help="with --known: the upstream issue (https://...); required unless the kernel is your own "
        "([tool.attn-gate.kernels.NAME] or package.module:function)",
    )
    u.add_argument(
        "--summary", type=Path, default=None, metavar="FILE", help="also write the change summary (Markdown) here"
    )
    u.add_argument(
        "--out", type=Path, default=Path("out"), metavar="DIR", help="where a fresh run's sweep JSON is saved"
    )
    u.add_argument("--no-progress", action="store_true", help="no progress bar")
    u.add_argument(
        "--perf",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also record speed ratios with their noise (default: on with a GPU, off on a CPU; off keeps the old section)",
    )
    u.add_argument(
        "--perf-from",
        type=Path,
        default=None,
        metavar="FILE",
        help="take the speed section from a perf JSON (`attn-gate perf --rounds 30` on a machine of this GPU class)",
    )
    u.add_argument(
        "--accept-noisy",
        action="store_true",
        help="record a speed section noisier than max_noise_pct, or with a pass whose rounds cannot pass against "
        "themselves, those passes marked noisy (refused without it: exit 2)",
    )
    u.add_argument(
        "--widen",
        action="store_true",
        help="merge this run into the committed baseline keeping each tensor's larger ratio (a class whose "
        "machines differ, e.g. CI runners of several CPU models)",
    )
    u.set_defaults(main=update)
    c = bsub.add_parser(
        "carry",
        help="bring baselines to their suites as defined now, with no run (after cases were "
        "removed or made timing-only)",
        **parser_kwargs("baseline carry"),
    )
    c.add_argument("files", nargs="+", type=Path, metavar="FILE", help="baseline files, e.g. baselines/h200/*-pr.json")
    add_config(c)
    c.set_defaults(main=carry)
    s = bsub.add_parser(
        "show", help="print a baseline: fingerprint and each case's ratios", **parser_kwargs("baseline show")
    )
    add_kernel_suite(s)
    add_config(s)
    s.add_argument(
        "--file", type=Path, default=None, help="a baseline file (default: this machine's for the kernel and suite)"
    )
    s.set_defaults(main=show)


def update(args: argparse.Namespace) -> int:
    from gate.workflow.check import FreshSweep, UpdateFlags, run_baseline_update, saved_sweep, update_outputs
    from gate.workflow.plan import resolve_plan

    config = load_config(args.config)
    require_initialised(config, args.kernel, writes=args.from_results is None)  # a results file names its kernel
    if args.link and args.known is None:
        raise UserError("--link goes with --known REASON (the declaration it links); add --known or drop --link")
    kernel, suite, device = args.kernel, args.suite, args.device
    plan = None
    if args.from_results is None:  # names first: a typo is a typo; its sweep runs in workers
        plan = resolve_plan(config, kernel, suite, device, args.only, perf=args.perf)
    else:
        check_device(device)
        if args.only is not None:
            raise UserError("--only filters a fresh run; a --from-results file is taken as it is (drop --only)")
    out = update_outputs(args.out, args.summary, config, fresh=plan is not None)
    if plan is None:  # the plan the results file stands for
        plan, source = saved_sweep(config, args.from_results, kernel, suite, perf=args.perf)
    else:
        source = FreshSweep(progress=not args.no_progress)
    flags = UpdateFlags(args.perf_from, args.widen, args.known, args.link, args.accept_noisy)
    return run_baseline_update(plan, source, out, flags).exit_code


def carry(args: argparse.Namespace) -> int:
    from gate.workflow.carry import carry_baseline

    config = load_config(args.config)
    for path in args.files:  # each file whole or not at all; a refusal stops before the next
        diff = carry_baseline(path, config)
        print(f"{path}: matches suite as defined now; nothing to carry" if diff is None else diff.markdown())
    return 0


def show(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from gate.workflow.check import resolve_target

    scope = Scope.of_only(args.only)  # an invalid regex is a one-line usage error, before anything is read
    config = load_config(args.config)
    if args.file is not None:
        path = args.file
    else:
        valid = validate_target(config, args.kernel, args.suite, args.device, args.only, check_kernel_runs=False)
        target = resolve_target(config, valid.kernel, valid.suite, valid.device, None)
        path = baseline_path(config.baselines_dir, target.gpu_class, target.kernel, target.suite)
    b = read_baseline(path)
    console = Console()
    console.print(
        f"{path}: {b.kernel} on {b.suite} (suite hash {b.suite_hash}), GPU class {b.gpu_class}, measured {b.measured_at}",
        highlight=False,
    )
    console.print("environment: " + ", ".join(f"{k}={v}" for k, v in sorted(b.environment.items())), highlight=False)
    table = Table(title="error ratio per tensor (pass <= 1)")
    table.add_column("case")
    table.add_column("status")
    # the usual five, plus dbias/dsink/k_cache/v_cache where a case has them
    names = TENSORS + tuple(n for n in EXTRA_TENSORS if any(n in c.tensors for c in b.correctness.values()))
    for name in names:
        table.add_column(name, justify="right")
    for cid, c in sorted(b.correctness.items()):
        if not scope.admits(cid):
            continue
        table.add_row(cid, c.status.value, *(f"{c.tensors[n].ratio:.3f}" if n in c.tensors else "-" for n in names))
    console.print(table)
    console.print(f"perf section: {'none' if b.perf is None else f'{len(b.perf)} entries'}", highlight=False)
    return 0
