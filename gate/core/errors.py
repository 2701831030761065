"""The one exception type for mistakes a user can fix (exit code 2).

Every message names the file or option at fault and says what to do; the CLI prints it as one
line with no traceback.
"""


class UserError(Exception):
    """Bad input or environment: unknown kernel, malformed config or baseline, missing file."""


EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
