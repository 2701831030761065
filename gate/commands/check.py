"""`attn-gate check`: run (or read) the sweep, compare with the committed baseline, decide.

Exit 0 pass, 1 fail (a blocking finding: FAIL or INCONCLUSIVE), 2 usage or environment error: no
baseline yet (the message gives the command that creates one), an unreadable baseline or results
file, a results file with a case id twice, another GPU class, a changed suite, an --out that
cannot be written (checked before the sweep), a --perf-results file of another kernel, suite, GPU
class or run environment.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gate.commands.common import add_config, add_kernel_suite, add_run_options, run_options
from gate.commands.help_text import parser_kwargs
from gate.core.cases import exact_regex
from gate.core.config import load_config
from gate.core.errors import UserError
from gate.core.files import FolderLock
from gate.report import wrapped
from gate.workflow.validate import check_device, require_initialised


def register(sub) -> None:
    p = sub.add_parser(
        "check",
        help="gate a kernel: sweep, compare with baselines/<gpu-class>/, exit 0 pass / 1 fail",
        **parser_kwargs("check"),
    )
    add_kernel_suite(p)
    add_config(p)
    p.add_argument(
        "--results",
        type=Path,
        default=None,
        metavar="FILE",
        help="compare this sweep JSON (from `attn-gate sweep`) instead of running the sweep",
    )
    p.add_argument(
        "--perf-results",
        type=Path,
        nargs="+",
        default=None,
        metavar="PERF",
        help="with --results: judge the speed of these perf JSONs (from `attn-gate perf`, merged; e.g. one "
        "per GPU job) against the baseline's perf section; without them speed is not checked",
    )
    p.add_argument(
        "--baseline",
        type=Path,
        default=None,
        metavar="FILE",
        help="compare with this baseline file (default: baselines/<gpu-class>/<kernel>-<suite>.json)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("out"),
        metavar="DIR",
        help="folder for the Markdown summary, findings JSON, sweep JSON and plot (default: out)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--perf",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also gate speed ratios against the baseline's perf section (default: on with a GPU, off on a CPU)",
    )
    p.add_argument(
        "--last-failed",
        action="store_true",
        help="rerun only the cases that failed in the last check written to --out (its findings JSON); "
        "every case where none failed",
    )
    add_run_options(p, shard=False)  # a shard is judged after `attn-gate merge`, with --results
    p.set_defaults(main=main)


def last_failed(out: Path, kernel: str | None, suite: str | None) -> tuple[str | None, dict]:
    """An exact `--only` regex of the cases that failed (or were inconclusive) in the last check
    written to `out` (its findings JSON, the one of this kernel and suite where several are there),
    and that check's context: the kernel, suite, config and baseline it ran with. None where no
    case failed: every case runs again, as `pytest --last-failed` does after a passing run."""
    data, failed, _ = _last_findings(out, kernel, suite)
    context = data.get("context") if isinstance(data.get("context"), dict) else {}
    return (exact_regex(failed) if failed else None), context


def last_failed_ids(out: Path, kernel: str | None, suite: str | None) -> list[str]:
    """The ids `last_failed` matches (`attn-gate bisect --last-failed` names them); a bisect
    needs a failing case, so none is an error."""
    _, failed, path = _last_findings(out, kernel, suite)
    if not failed:
        raise UserError(
            f"--last-failed: no case failed in the last check in {out} ({path.name}); nothing to bisect: "
            f"pass --only REGEX of the cases to follow"
        )
    return failed


def _last_findings(out: Path, kernel: str | None, suite: str | None) -> tuple[dict, list[str], Path]:
    found = sorted(Path(out).glob("findings-*.json"), key=lambda p: p.stat().st_mtime)
    if kernel is not None or suite is not None:

        def matches(path: Path) -> bool:
            try:
                ctx = json.loads(path.read_text(encoding="utf-8")).get("context", {})
            except (OSError, ValueError, AttributeError):
                return False
            return kernel in (None, ctx.get("kernel")) and suite in (None, ctx.get("suite"))

        found = [p for p in found if matches(p)]
    if not found:
        raise UserError(
            f"--last-failed: no findings JSON of an earlier check in {out}; run the check once without "
            f"--last-failed (or pass its --out folder)"
        )
    from gate.compare.findings import rerun_case_ids

    try:
        data = json.loads(found[-1].read_text(encoding="utf-8"))
        failed = rerun_case_ids(data)
    except (OSError, ValueError, RecursionError) as exc:
        raise UserError(
            f"--last-failed: {found[-1]} is not a findings JSON attn-gate wrote ({str(exc)[:200]}); "
            f"run without --last-failed"
        ) from None
    return (data if isinstance(data, dict) else {}), failed, found[-1]


def main(args: argparse.Namespace) -> int:
    from gate.workflow.check import FreshSweep, outputs, refuse_check_flags, run_check, saved_sweep
    from gate.workflow.plan import resolve_plan

    context = {}
    if args.last_failed:
        if args.only is not None or args.results is not None:
            raise UserError("--last-failed picks the cases itself: drop --only (and --results)")
        args.only, context = last_failed(args.out, args.kernel, args.suite)
        if args.only is None:
            print(
                wrapped(f"attn-gate: --last-failed: no case failed in the last check in {args.out}: every case runs"),
                file=sys.stderr,
            )
        # what the last check ran with, where not given again: `attn-gate check --last-failed` alone reruns it
        args.kernel = args.kernel or context.get("kernel") or None
        args.suite = args.suite or context.get("suite") or None
        if args.baseline is None and context.get("baseline_option"):
            args.baseline = Path(context["baseline_option"])
        if args.device is None and context.get("gpu_class") == "cpu":
            args.device = "cpu"
        if args.config is None and context.get("config") not in (None, "", "defaults", "pyproject.toml"):
            args.config = Path(context["config"])
    config = load_config(args.config)
    require_initialised(config, args.kernel)
    options = run_options(args)
    if options.workers == 0:  # the gate's verdict never comes from a process the kernel ran in
        raise UserError(
            "--workers 0 runs the kernel in the deciding process, unisolated: `check` refuses it; "
            "pass --workers 1 or more (or use `attn-gate sweep --workers 0` to debug)"
        )
    kernel, suite, device = args.kernel, args.suite, args.device
    plan = None
    if args.results is None:  # names first: a typo is a typo, not "no baseline"; the plan is resolved once, here
        plan = resolve_plan(config, kernel, suite, device, args.only, options, args.perf, args.baseline)
    else:
        check_device(device)
    refuse_check_flags(args.results, args.only, args.perf, args.perf_results)
    out = outputs(args.out, config)  # before the sweep, not after minutes of it
    with FolderLock(args.out, "--out"):
        if plan is None:  # the plan a results file stands for, judged under the config as it is now
            plan, source = saved_sweep(config, args.results, kernel, suite, args.baseline, args.perf, args.perf_results)
        else:
            source = FreshSweep(progress=not args.no_progress)
        outcome = run_check(plan, source, out)
    # wrapped at whole paths to the terminal's width (COLUMNS), as the summary lines above are
    print(wrapped("wrote " + ", ".join(str(p) for p in outcome.paths.values())))
    return outcome.exit_code
