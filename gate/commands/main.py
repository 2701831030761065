"""The `attn-gate` command (the console-script entry point): parses arguments, calls one library function, maps errors to exit codes.

Exit codes: 0 pass, 1 fail (a tolerance violation, a regression), 2 usage or environment error
(the message names the file or option and the fix; no traceback).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from gate.core.errors import EXIT_FAIL, EXIT_USAGE, UserError

# Each module in gate/commands registers its own subcommands.
COMMANDS = ("sweep", "listing", "check", "baseline", "perf", "bench", "drift", "selftest", "merge", "init")


def build_parser() -> argparse.ArgumentParser:
    import gate

    parser = argparse.ArgumentParser(
        prog="attn-gate", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Regression gate for attention kernels: correctness against a float64 reference and speed against "
                    "an anchor, compared with committed baselines.",
        epilog="start here:\n  attn-gate kernels && attn-gate suites\n  attn-gate check --device cpu\n\n"
               "exit codes (every command):\n  0  pass\n  1  fail (a tolerance violation, a regression, an "
               "inconclusive measurement)\n  2  usage or environment error; the one-line message names the fix\n\n"
               "`attn-gate COMMAND --help` shows each command's examples.")
    parser.add_argument("--version", action="version", version=f"attn-gate {gate.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"gate.commands.{name}").register(sub)
    return parser




def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help is 0, a usage error is 2
        return int(exc.code or 0)
    try:
        return int(args.main(args))
    except UserError as exc:
        print(f"attn-gate: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # a kernel or plugin called sys.exit(): never let it pass as exit 0
        print(f"attn-gate: error: the run was cut short by SystemExit({exc.code!r}) (a kernel or plugin called "
              f"sys.exit); no verdict, failing closed", file=sys.stderr)
        return EXIT_FAIL
    except KeyboardInterrupt:
        print("attn-gate: interrupted", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `attn-gate suites --cases | head`: the reader left, nothing is wrong
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes stdout
        return 0


if __name__ == "__main__":
    sys.exit(main())
