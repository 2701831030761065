"""The one reporter of warnings: something went wrong beside the verdict (an artifact not drawn, a
summary not written) and the run goes on with its exit code unchanged. Always stderr, one line,
so a log reader and a test find every warning the same way and stdout stays the report's."""

from __future__ import annotations

import sys

PREFIX = "attn-gate: warning: "


def warn(message: str) -> None:
    print(PREFIX + message, file=sys.stderr, flush=True)
