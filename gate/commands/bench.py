"""`attn-gate bench` (asv run on this commit) and `attn-gate publish` (asv publish): history, not the verdict."""

from __future__ import annotations

import argparse
from pathlib import Path

from gate.commands.help_text import parser_kwargs
from gate.core.config import load_config
from gate.core.errors import EXIT_FAIL, EXIT_PASS, UserError
from gate.speed import asv as A
from gate.speed.entries import MAX_ROUNDS
from gate.workflow.validate import check_device, check_kernel, check_suite


def register(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="run the asv suites (benchmarks/) on this commit: `asv run --python=same "
        "--set-commit-hash`; history only, the PR verdict is `attn-gate check`",
        **parser_kwargs("bench"),
    )
    p.add_argument("--asv-config", type=Path, default=None, help="asv.conf.json (default: ./asv.conf.json)")
    p.add_argument("--commit", default="HEAD", help="commit the results are filed under (default HEAD)")
    p.add_argument("--machine", default=None, help="asv machine name (default: the GPU class, e.g. h200, or 'cpu')")
    p.add_argument("--quick", action="store_true", help="asv --quick: one measurement, no repeats")
    p.add_argument("--bench", default=None, metavar="REGEX", help="only asv benchmarks matching (asv --bench)")
    p.add_argument("--kernel", default=None, help="kernel to time (default: the config profile's)")
    p.add_argument("--suite", default=None, help="suite whose perf cases are timed (default: the profile's)")
    p.add_argument("--anchor", default=None, help="anchor adapter or 'matmul' (default: the config's)")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None)
    p.add_argument("--only", default=None, metavar="REGEX", help="only perf cases whose id matches")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds per pass (default: the config's)")
    p.add_argument("--config", type=Path, default=None, help="pyproject.toml holding [tool.attn-gate]")
    p.set_defaults(main=bench_main)
    p = sub.add_parser(
        "publish",
        help="render asv's HTML history (`asv publish`) into the asv html_dir, readable offline",
        **parser_kwargs("publish"),
    )
    p.add_argument("--asv-config", type=Path, default=None, help="asv.conf.json (default: ./asv.conf.json)")
    p.set_defaults(main=publish_main)


def bench_main(args: argparse.Namespace) -> int:
    if args.rounds is not None and not 1 <= args.rounds <= MAX_ROUNDS:  # perf.rounds's range: 1e9 would hang
        raise UserError(f"--rounds {args.rounds}: must be an integer in [1, {MAX_ROUNDS}]")
    conf = A.asv_conf(args.asv_config)
    device = check_device(args.device)  # names first: a typo is a typo, not an asv failure
    config = load_config((args.config or A.CONFIG_FILE).resolve())
    if args.kernel is not None:
        check_kernel(args.kernel, device, config=config)  # a kernel family of the config too
    if args.anchor not in (None, "matmul"):
        check_kernel(args.anchor, device, "--anchor")
    if args.suite is not None:
        check_suite(config, args.suite)
    settings = A.BenchSettings(
        config_path=(args.config or A.CONFIG_FILE).resolve(),
        kernel=args.kernel,
        suite=args.suite,
        anchor=args.anchor,
        device=args.device,
        only=args.only,
        rounds=args.rounds,
    )
    commit = A.git_commit(args.commit, A.asv_repo(conf))
    machine = args.machine or A.machine_name(args.device)
    rc = A.bench(conf, settings, machine, commit, quick=args.quick, bench_regex=args.bench)
    rows = A.read_results(conf, machine, commit)
    for row in rows:
        value = row["value"]
        shown = "n/a" if value is None or value != value else f"{value:.4g}"
        print(f"{row['benchmark']:45} {' '.join(row['params']):40} {shown:>10} {row['unit']}")
    print(
        f"asv results for {commit[:12]} on machine {machine!r}: {len(rows)} values"
        + ("" if rc == 0 else f"; asv exited {rc}")
    )
    return EXIT_PASS if rc == 0 and rows else EXIT_FAIL


def publish_main(args: argparse.Namespace) -> int:
    conf = A.asv_conf(args.asv_config)
    rc = A.publish(conf)
    html = Path(conf.parent) / A.load_asv_conf(conf).html_dir / "index.html"
    if rc == 0 and html.is_file():
        print(f"published {html}")
        return EXIT_PASS
    print(f"asv publish exited {rc}; {html} {'exists' if html.is_file() else 'was not written'}")
    return EXIT_FAIL
