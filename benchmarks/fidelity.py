"""The fidelity section: every published figure `ipujax.fidelity` knows, compiled and read as
`ipujax fidelity` does, with its ratio to the published value; the full run also rewrites
docs/fidelity.md. With `--quick` only the figures `Setup.fidelity` names run."""

from __future__ import annotations

from measuring import log
from results import Section, goal
from setups import Setup
from spmd_compare import REPO

from ipujax import fidelity

DOCUMENT = REPO / "docs" / "fidelity.md"


def fidelity_section(setup: Setup) -> Section:
    figures = [f for f in fidelity.FIGURES if setup.fidelity in f.name]
    log(f"fidelity: {len(figures)} published figures")
    rows = fidelity.run(figures)
    within = all(row.within for row in rows)
    worst = max(rows, key=lambda r: abs(r.ratio - 1))
    whole = len(figures) == len(fidelity.FIGURES)  # only the whole table goes to the docs
    return Section(
        name="fidelity",
        title="Fidelity: the cost model against published figures",
        table=fidelity.markdown(rows),
        meaning=(
            "Each row compiles the program behind a published IPU measurement and reads the "
            "same quantity from its cost report; ratio = ipujax / published. docs/fidelity.md "
            "holds the latest full table with notes; `ipujax fidelity` prints it."
        ),
        goals=(
            (f"every ratio within its band ({fidelity.LOW}-{fidelity.HIGH} by default)", within),
        ),
        notes=(f"{goal(within)}: the farthest from 1 is {worst.figure.name} at {worst.ratio:.2f}",),
        files=((DOCUMENT, fidelity.document(rows)),) if whole else (),
    )
