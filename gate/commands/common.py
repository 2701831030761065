"""Arguments several subcommands share, declared once."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_config(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, default=None, help="pyproject.toml holding [tool.attn-gate] (default ./pyproject.toml)")


def add_kernel_suite(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kernel", default=None, help="kernel name (attn-gate kernels lists them) or package.module:function; "
                   "default: the config's gpu/cpu profile")
    p.add_argument("--suite", default=None, help="suite name (attn-gate suites lists them); default: the profile's")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when a GPU is visible")
    p.add_argument("--only", default=None, metavar="REGEX", help="run only cases whose id matches")
