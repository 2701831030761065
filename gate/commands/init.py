"""`attn-gate init`: write the gate's configuration and CI files into a kernel repository, or with
--check say whether they drifted from the installed attn-gate's templates.

init: exit 0 (what it wrote, kept or left unchanged is printed, then the admin checklist),
2 usage error (no kernel when it cannot ask, a bad value). --check: exit 0 the files equal the
templates, 1 they drift (a diff summary per file), 2 not initialised.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import gate
from gate.commands.help_text import parser_kwargs
from gate.core.errors import EXIT_FAIL, EXIT_PASS, UserError
from gate.report import terminal_width, wrapped
from gate.workflow import init as I
from gate.workflow.install_source import installed_source
from gate.workflow.probe import probe_for_init


def register(sub) -> None:
    p = sub.add_parser(
        "init",
        help="set up a kernel repository: [tool.attn-gate], workflows, CODEOWNERS, runner guard, "
        "asv; --check shows drift from the installed templates",
        **parser_kwargs("init"),
    )
    p.add_argument("--dir", type=Path, default=Path("."), help="the repository root (default: here)")
    p.add_argument(
        "--kernel",
        default=None,
        help="the kernel: package.module:function in the flash_attn_func convention, or a built-in name",
    )
    for entry, convention in (
        ("dense", "flash_attn_func"),
        ("varlen", "flash_attn_varlen_func"),
        ("kvcache", "flash_attn_with_kvcache"),
    ):
        p.add_argument(
            f"--{entry}",
            default=None,
            metavar="MODULE:FUNCTION",
            help=f"a kernel family's {entry} entry point ({convention} convention)",
        )
    p.add_argument("--family", default=None, metavar="NAME", help="the family's name (default: from its package)")
    p.add_argument("--forward-only", action="store_true", help="the family has no backward (an inference kernel)")
    p.add_argument("--gpu-class", default=None, help="GPU class of the runners and baselines/<class>/ (default h200)")
    p.add_argument(
        "--runner-labels",
        default=None,
        metavar="L1,L2,..",
        help="the GPU runners' labels (default: self-hosted,linux,gpu,<gpu class>)",
    )
    p.add_argument("--suite", default=None, help="suite gated on every PR (default pr)")
    p.add_argument("--cpu-suite", default=None, help="suite of the CPU gate in the hosted job (default smoke)")
    p.add_argument("--nightly-suite", default=None, help="suite of the nightly sharded run (default nightly)")
    p.add_argument("--repository", default=None, metavar="OWNER/REPO", help="default: the origin remote on GitHub")
    p.add_argument(
        "--owners",
        default=None,
        help="CODEOWNERS owner of the gate's files (default @OWNER/maintainers of the repository's owner)",
    )
    p.add_argument(
        "--placeholders",
        action="store_true",
        help="write OWNER/REPO and @OWNER/maintainers where the "
        "repository or owners cannot be inferred (listed as the first TODO) instead of refusing",
    )
    p.add_argument(
        "--install",
        default=None,
        metavar="REQUIREMENT",
        help="how the jobs install attn-gate (default: where this attn-gate came from: "
        "'attn-gate @ git+URL@COMMIT', or attn-gate==<version> from the package index)",
    )
    p.add_argument(
        "--yes", "-y", action="store_true", help="ask nothing; take the defaults (also when stdin is not a TTY)"
    )
    p.add_argument("--force", action="store_true", help="replace files and the [tool.attn-gate] section that differ")
    p.add_argument("--check", action="store_true", help="only compare the files with the templates; exit 1 on drift")
    p.add_argument(
        "--probe",
        action="store_true",
        help="probe the kernel (`attn-gate probe`) and write the envelope "
        "it finds into the section as [tool.attn-gate.kernels.NAME.supports]",
    )
    p.set_defaults(main=main)


def ask(question: str, default: str) -> str:
    return input(f"{question} [{default}]: " if default else f"{question}: ")


def main(args: argparse.Namespace) -> int:
    root = args.dir.resolve()
    if not root.is_dir():
        raise UserError(f"--dir {args.dir}: no such folder")
    source = installed_source(gate.__version__)
    if args.check:
        drift = I.check(root)
        problems = I.value_problems(I.load_ci(root), source, gate.__version__)
        for d in drift:
            print(f"drift: {d.path}" + (" (missing)" if d.diff == ("missing",) else ""))
            for line in d.diff[:40] if d.diff != ("missing",) else ():
                print(f"    {line}")
            if len(d.diff) > 40:
                print(f"    ... {len(d.diff) - 40} more diff lines")
        for problem in problems:
            print(problem)
        n = len(I.render_files(I.load_ci(root)))
        print(
            f"attn-gate {gate.__version__} templates: {n - len(drift)} of {n} files equal"
            + (f", {len(drift)} drift: `attn-gate init --force` rewrites them" if drift else "")
            + (f"; {len(problems)} value{'s' if len(problems) > 1 else ''} to fix (above)" if problems else "")
        )
        return EXIT_FAIL if drift or problems else EXIT_PASS
    entries = tuple((e, getattr(args, e)) for e in ("dense", "varlen", "kvcache") if getattr(args, e))
    labels = tuple(lb.strip() for lb in args.runner_labels.split(",") if lb.strip()) if args.runner_labels else ()
    options = I.InitOptions(
        kernel=args.kernel,
        family=args.family,
        entries=entries,
        forward_only=args.forward_only,
        gpu_class=args.gpu_class,
        runner_labels=labels,
        suite=args.suite,
        cpu_suite=args.cpu_suite,
        nightly_suite=args.nightly_suite,
        repository=args.repository,
        owners=args.owners,
        install=args.install,
        force=args.force,
        placeholders=args.placeholders,
    )
    interactive = not args.yes and sys.stdin.isatty()
    options = I.resolve(options, root, source, ask if interactive else None)
    if args.probe:
        # a line per call on stderr while it runs: a kernel's first compile can take a while
        report = probe_for_init(
            root,
            options.kernel,
            options.family,
            options.entries,
            options.forward_only,
            lambda result: print(result.line(), file=sys.stderr, flush=True),
        )
        for finding in report.findings:
            print(wrapped(f"probe finding: {finding}"))
        # the table as init writes it, so the first baseline's SKIPs are no surprise
        print(wrapped(f"probe: {report.counts()}; the envelope goes into"))
        print(f"  {report.table}:")
        body = report.toml().splitlines()[1:] or ["(empty: every probed axis runs, nothing to narrow)"]
        print("".join(f"    {line}\n" for line in body), end="")
        options = replace(options, supports=report.supports)
    result = I.init(root, options)
    for a in result.actions:
        print(f"{a.what:>10}  {a.path}" if len(a.what) <= 10 else f"{a.path}: {a.what}")
    changed = sum(a.what not in ("unchanged",) and not a.what.startswith("kept") for a in result.actions)
    print(f"{changed} written, {len(result.actions) - changed} unchanged or kept\n")
    if result.todo:
        print("TODO before the files work:")
        print("\n".join(f"{i}. {line}" for i, line in enumerate(result.todo, 1)) + "\n")
    print("\n".join(I.render_checklist(I.admin_checklist(result.ci), terminal_width())))
    return EXIT_PASS
