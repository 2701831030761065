"""The `attn-gate` command (the console-script entry point): parses arguments, calls one library function, maps errors to exit codes.

Exit codes: 0 pass, 1 fail (a tolerance violation, a regression), 2 usage or environment error
(the message names the file or option and the fix; no traceback).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import re
import shlex
import signal
import sys
import threading

import gate
from gate.core.errors import EXIT_FAIL, EXIT_USAGE, UserError

# Each module in gate/commands registers its own subcommands.
COMMANDS = (
    "sweep",
    "listing",
    "check",
    "baseline",
    "perf",
    "bench",
    "drift",
    "selftest",
    "merge",
    "init",
    "docs",
    "probe",
    "bisect",
)
# Set by a run that supervises this process (`sweep --workers 0`, gate/commands/sweep.py): the file
# this process writes its exit code to when it returns; a kernel that ends the process skips it.
DONE_FILE_ENV = "ATTN_GATE_DONE_FILE"


class HintingParser(argparse.ArgumentParser):
    """argparse, plus the nearest names for a misspelled subcommand or flag ("did you mean ...?")."""

    def parse_known_args(self, args=None, namespace=None):
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        stray = self._stray_flags()
        if stray and (message.startswith("the following arguments are required") or "invalid choice" in message):
            # `attn-gate --verison`: argparse names the missing COMMAND, not the misspelt flag
            message = f"unrecognized arguments: {' '.join(stray)}"
        hint = nearest_name_hint(self, message, getattr(self, "_argv", []))
        super().error(message + hint)

    def _stray_flags(self) -> list[str]:
        """Flags before the subcommand that this parser does not know (the top parser only)."""
        if not any(isinstance(a, argparse._SubParsersAction) for a in self._actions):
            return []
        known = {o for a in self._actions for o in a.option_strings}
        stray = []
        for word in getattr(self, "_argv", []):
            if not word.startswith("-"):
                break
            if word.split("=", 1)[0] not in known:
                stray.append(word)
        return stray


def _command_path(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], argparse.ArgumentParser]:
    """The subcommand words argv names (`baseline update`) and the parser that reads their flags."""
    words: list[str] = []
    for word in argv:
        if word.startswith("-"):
            continue
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or word not in subs[0].choices:
            break
        words.append(word)
        parser = subs[0].choices[word]
    return words, parser


def _flag_owners(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, list[str]]:
    """Each long flag -> the subcommands that take it."""
    owners: dict[str, list[str]] = {}
    for action in parser._actions:
        for o in action.option_strings:
            if o.startswith("--"):
                owners.setdefault(o, []).append(prefix.strip() or "attn-gate")
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                for flag, names in _flag_owners(sub, f"{prefix} {name}").items():
                    owners.setdefault(flag, []).extend(names)
    return owners


def nearest_name_hint(parser: argparse.ArgumentParser, message: str, argv: list[str] = ()) -> str:
    choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if choice:
        options = re.findall(r"'?([\w.:-]+)'?", choice.group(2))
        close = difflib.get_close_matches(choice.group(1), options, n=3, cutoff=0.6)
        return f"; did you mean {' or '.join(close)}?" if close else ""
    unknown = re.search(r"unrecognized arguments: (.*)", message)
    if unknown:
        words, command = _command_path(parser, list(argv))
        # the flags of the command typed (and the top-level ones before it), not of every command
        flags = sorted(
            {o for a in command._actions for o in a.option_strings if o.startswith("--")}
            | ({o for a in parser._actions for o in a.option_strings if o.startswith("--")} if words else set())
        )
        owners = _flag_owners(parser)
        hints = []
        for word in unknown.group(1).split():
            if not word.startswith("-"):
                continue
            flag = word.split("=", 1)[0]
            close = [c for c in difflib.get_close_matches(flag, flags, n=2, cutoff=0.6) if c != flag]
            if close:
                hints.append(f"{word}: did you mean {' or '.join(close)}?")
            elif flag in owners and words:
                hints.append(
                    f"`attn-gate {' '.join(words)}` has no {flag} (a flag of {', '.join(sorted(set(owners[flag])))})"
                )
            elif flag in owners:  # `attn-gate --kernel x check`: a command's flag before the command
                hints.append(f"{flag} goes after the command (a flag of {', '.join(sorted(set(owners[flag])))})")
        return ("; " + "; ".join(hints)) if hints else ""
    return ""


def build_parser() -> argparse.ArgumentParser:
    parser = HintingParser(
        prog="attn-gate",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Regression gate for attention kernels: correctness against a float64 reference and speed against "
        "an anchor, compared with committed baselines.",
        epilog="start here:\n  attn-gate kernels && attn-gate suites\n  attn-gate check --device cpu\n\n"
        "exit codes (every command):\n  0  pass\n  1  fail (a tolerance violation, a regression, an "
        "inconclusive measurement)\n  2  usage or environment error; the one-line message names the fix\n\n"
        "`attn-gate COMMAND --help` shows each command's examples.",
    )
    parser.add_argument("--version", action="version", version=f"attn-gate {gate.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=HintingParser)
    for name in COMMANDS:
        importlib.import_module(f"gate.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    code = _main(argv)
    done = os.environ.get(DONE_FILE_ENV)
    if done:  # this process returned normally: the supervising run may trust its exit code
        with open(done, "w", encoding="utf-8") as fh:
            fh.write(str(code))
    return code


def resume_hint(args: argparse.Namespace) -> str:
    """For a run that journals its cases (`--out` and `--resume`): the exact command that goes on
    where it stopped; the case in flight was not journalled, so it runs again."""
    if not hasattr(args, "resume") or getattr(args, "results", None) is not None or getattr(args, "out", None) is None:
        return ""
    journal = sys.modules.get("gate.workflow.journal")
    if journal is None or not journal.started_here(args.out):  # stopped before the journal existed: nothing to resume
        return "; no case had started, so there is nothing to resume: run the command again"

    argv = [a for a in args.argv if a != "--resume"]
    return f"; the finished cases are kept in {args.out}: go on with\n  attn-gate {shlex.join(argv + ['--resume'])}"


def _on_sigterm(signum, frame) -> None:
    """SIGTERM of the gate (a cancelled CI job, `timeout`): its workers go first, then the gate, as
    SIGTERM would have ended it."""
    isolation = sys.modules.get("gate.workflow.isolation")
    if isolation is not None:
        isolation.kill_all_workers()
    jsonio = sys.modules.get("gate.core.jsonio")
    if jsonio is not None:  # a write cut short leaves no temporary file beside the baseline
        jsonio.remove_pending_temps()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _main(argv: list[str]) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help is 0, a usage error is 2
        return int(exc.code or 0)
    args.argv = argv
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return int(args.main(args))
    except UserError as exc:
        print(f"attn-gate: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # a kernel or plugin called sys.exit(): never let it pass as exit 0
        print(
            f"attn-gate: error: the run was cut short by SystemExit({exc.code!r}) (a kernel or plugin called "
            f"sys.exit); no verdict, failing closed",
            file=sys.stderr,
        )
        return EXIT_FAIL
    except KeyboardInterrupt:
        print("attn-gate: interrupted" + resume_hint(args), file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `attn-gate suites --cases | head`: the reader left, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes stdout
        return 0


if __name__ == "__main__":
    sys.exit(main())
