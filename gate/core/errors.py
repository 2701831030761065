"""The one exception type for mistakes a user can fix (exit code 2).

Every message names the file or option at fault and says what to do; the CLI prints it as one
line with no traceback.
"""


class UserError(Exception):
    """Bad input or environment: unknown kernel, malformed config or baseline, missing file."""


def first_line(exc: BaseException) -> str:
    """An exception as one short line (`Type: first line of its message`), for a results row."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
