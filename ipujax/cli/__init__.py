"""The `ipujax` command line (docs/cli.md).

    ipujax cost-report SPEC [--target bow|mk2|mk1] [--mesh NAME=SIZE,...] [--phases auto]
                            [--json PATH] [--trace PATH] [--html PATH]
    ipujax report show PATH.json [--trace PATH] [--html PATH]
    ipujax report diff A.json B.json
    ipujax fidelity [--only TEXT] [--markdown PATH]
    ipujax plan SPEC [--system pod16|pod64|pod256|bow|...] [--target bow|mk2|mk1] [--json PATH]

SPEC is `path/to/file.py:NAME` or `package.module:NAME`; NAME is a callable returning
`(fun, args)` or `(fun, args, jit_kwargs)`. User errors (a bad spec, bad flags, a malformed report,
any `IpujaxError`) print one line `ipujax: error: ...` on stderr and exit with 2; anything else is a
bug and keeps its traceback.

A module per command (`cost_report`, `reports` for `report show` and `report diff`, `fidelity`,
`plan`, `version`), each with the function that adds its parser and the one that runs it; `app`
gathers them into `main`. Shared: `spec` (loading and calling the workload), `flags` (`--target`,
`--mesh`, `--phases`), `output` (the console and the files written) and `errors`.
"""

from ipujax.cli.app import main

__all__ = ["main"]
