"""User errors of the command line: `CliError`, the argparse parser that raises it instead of
printing its usage, and the one line `main` prints for it (exit code `EXIT_ERROR`)."""

from __future__ import annotations

import argparse
from typing import NoReturn

EXIT_ERROR = 2


class CliError(Exception):
    """A user error: printed as one line, exit code 2."""


class CliParser(argparse.ArgumentParser):
    """argparse, but a usage error raises `CliError` (one line) instead of printing the usage
    and exiting; subparsers inherit this class."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see `{self.prog} --help`)")


def one_line(error: BaseException) -> str:
    """The error's message with its whitespace (newlines too) folded to single spaces."""
    return " ".join(str(error).split()) or type(error).__name__
