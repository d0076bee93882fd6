"""`ipujax` and `python -m ipujax`: the command line lives in `ipujax.cli` (docs/cli.md)."""

from ipujax.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
