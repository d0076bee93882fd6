"""The `ipujax` command line. Subcommands arrive with the runtime and the cost report."""

import argparse
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version


def _version() -> str:
    try:
        return version("ipujax")
    except PackageNotFoundError:
        return "unknown (not installed; run `make venv`)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ipujax",
        description="Compile JAX programs for a virtual Graphcore IPU and report their cost.",
        epilog="Only --version exists so far; the compile and report commands are in progress.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    parser.parse_args(argv)
    parser.print_help()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
