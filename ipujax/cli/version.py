"""`ipujax --version`: the installed package's version."""

from __future__ import annotations

import argparse
from importlib.metadata import PackageNotFoundError, version


def package_version() -> str:
    try:
        return version("ipujax")
    except PackageNotFoundError:
        return "unknown (not installed; run `make venv`)"


def add_version(parser: argparse.ArgumentParser) -> None:
    """`--version`: argparse prints `ipujax VERSION` and exits with 0."""
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
