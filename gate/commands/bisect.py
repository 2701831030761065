"""`attn-gate bisect`: the first commit that broke chosen cases (gate/workflow/bisect.py), and the
hidden `attn-gate bisect-step SPEC` that `git bisect run` calls for each commit."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from gate.commands.check import last_failed_ids
from gate.commands.common import add_config
from gate.commands.help_text import parser_kwargs
from gate.core.cases import exact_regex
from gate.core.config import load_config
from gate.core.errors import UserError
from gate.core.files import append_step_summary, require_writable, safe_name
from gate.core.jsonio import write_json_atomic
from gate.report import wrapped
from gate.workflow.bisect import (
    BisectSpec,
    bisect_step,
    bisect_workdir,
    git,
    repo_root,
    resolve_commit,
    run_bisect,
    worktree,
)
from gate.workflow.plan import resolve_plan


def register(sub) -> None:
    p = sub.add_parser(
        "bisect",
        help="name the commit that broke chosen cases (git bisect, each step a clean worktree)",
        **parser_kwargs("bisect"),
    )
    p.add_argument("--good", required=True, metavar="REF", help="a commit where the cases pass")
    p.add_argument(
        "--bad",
        default="HEAD",
        metavar="REF",
        help="a commit where they fail (default: HEAD); its committed config and baseline judge every step",
    )
    p.add_argument("--only", default=None, metavar="REGEX", help="the cases to bisect: ids matching this regex")
    p.add_argument(
        "--last-failed",
        action="store_true",
        help="the cases to bisect: those that failed in the last check written to --out",
    )
    p.add_argument("--kernel", default=None, help="kernel name; default: the config's profile (at --bad)")
    p.add_argument("--suite", default=None, help="suite name; default: the profile's (at --bad)")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when a GPU is visible")
    add_config(p)
    p.add_argument(
        "--setup",
        default=None,
        metavar="CMD",
        help="the install step run in each commit's worktree (default: that commit's [tool.attn-gate.ci] "
        "setup line; `none` or '': nothing is installed, the kernel is imported from the worktree)",
    )
    p.add_argument(
        "--perf",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="bisect a speed finding: each step's check times the cases too (its confirm re-run decides)",
    )
    p.add_argument(
        "--reruns",
        type=int,
        default=1,
        metavar="N",
        help="re-run each step's check N more times; a verdict that changes stops the bisect (default 1)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("out"),
        metavar="DIR",
        help="where --last-failed reads the last check's findings, and bisect-<kernel>-<suite>.json is written",
    )
    p.set_defaults(main=main)
    step = sub.add_parser("bisect-step")  # no help: hidden; `git bisect run` calls it
    step.add_argument("spec", type=Path)
    step.set_defaults(main=lambda args: bisect_step(args.spec))


def main(args: argparse.Namespace) -> int:
    if args.only is not None and args.last_failed:
        raise UserError("--only and --last-failed both pick the cases: pass one of them")
    if args.only is None and not args.last_failed:
        raise UserError(
            "name the cases to bisect: --only REGEX, or --last-failed (the failures of the last check in --out)"
        )
    if not 0 <= args.reruns <= 10:
        raise UserError(f"--reruns {args.reruns}: expected 0 to 10")
    repo = repo_root(Path.cwd())
    bad = resolve_commit(repo, args.bad, "--bad")
    good = resolve_commit(repo, args.good, "--good")
    if good == bad or git(repo, "merge-base", "--is-ancestor", good, bad, check=False).returncode != 0:
        raise UserError(
            f"--good {args.good} is not an older ancestor of --bad {args.bad}; pass a commit from before the "
            f"failure (git log --oneline {args.bad} lists them)"
        )
    config_rel = Path(args.config).resolve() if args.config else Path(repo) / "pyproject.toml"
    try:
        config_rel = config_rel.relative_to(repo)
    except ValueError:
        raise UserError(
            f"--config {args.config}: not inside the repository {repo}; bisect reads it as committed"
        ) from None
    require_writable(args.out, "--out")
    with bisect_workdir(repo) as work:
        judge = work / "judge"
        with worktree(repo, judge, bad):
            config_path = judge / config_rel
            if not config_path.is_file():
                raise UserError(f"{config_rel} is not committed at --bad {args.bad}; commit the gate's config first")
            config = load_config(config_path)
            plan = resolve_plan(config, args.kernel, args.suite, args.device, args.only, perf=args.perf)
            if args.last_failed:  # the plan resolved once: resolving checks the kernel in a worker
                plan = replace(plan, only=exact_regex(last_failed_ids(args.out, plan.kernel, plan.suite.name)))
            only = plan.only
            cases = tuple(
                sorted({c.id for c in plan.cases} | ({c.id for c in plan.perf_cases} if args.perf else set()))
            )
            if not cases:
                raise UserError(
                    f"--only {only!r} matches no {'timed' if args.perf else 'swept'} case of suite {plan.suite.name!r}"
                )
            if not plan.baseline_path.is_file():
                raise UserError(
                    f"no baseline is committed at --bad {args.bad} ({plan.baseline_path.relative_to(judge)}); "
                    f"bisect judges every commit by it: pass the --bad whose check failed"
                )
            spec = BisectSpec(
                repo=repo,
                good=good,
                bad=bad,
                cases=cases,
                only=exact_regex(cases),
                kernel=plan.kernel,
                suite=plan.suite.name,
                device=plan.device,
                config=str(config_path),
                baseline=str(plan.baseline_path),
                setup="" if args.setup in ("none", "") else args.setup,
                perf=bool(args.perf),
                reruns=args.reruns,
                workdir=str(work),
                record=str(work / "record.jsonl"),
            )
            outcome = run_bisect(spec, log=lambda line: print(wrapped(line), file=sys.stderr, flush=True))
    text = outcome.text()
    print(wrapped(text))
    path = args.out / f"bisect-{safe_name(plan.kernel)}-{plan.suite.name}.json"
    write_json_atomic(path, json.loads(json.dumps(outcome.to_dict())))
    append_step_summary("## attn-gate bisect\n\n```\n" + text + "\n```\n")
    print(wrapped(f"wrote {path}"))
    return outcome.exit_code
