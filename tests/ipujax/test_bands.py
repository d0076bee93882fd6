"""Error bars from the evidence: the checked-in band table is what the fidelity rows of
docs/fidelity.md give, every backing row lies inside its term's band, and every report's
`seconds_range` holds its `seconds` (a property test), combined from the terms by hand."""

from __future__ import annotations

import dataclasses
import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from helpers import target
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

import ipujax
from ipujax import band_evidence, band_table, bands
from ipujax import terms as t
from ipujax.fidelity_doc import doc_rows
from ipujax.views.html import render_html
from partitioner import CollectiveCost, Superstep

REGENERATE = (
    "ipujax/band_table.py is not what docs/fidelity.md's rows give (a fidelity row was added "
    "or changed): run `.venv/bin/python -m ipujax.band_evidence` after `ipujax fidelity "
    "--markdown docs/fidelity.md`"
)


def test_the_checked_in_table_is_what_the_rows_give() -> None:
    rows = doc_rows()
    assert band_evidence.band_table(rows) == band_table.BANDS, REGENERATE
    assert band_evidence.unused(rows) == band_table.UNUSED, REGENERATE


def test_every_term_has_a_band_and_every_backing_row_lies_inside_it() -> None:
    assert set(band_table.BANDS) == {*t.TIME_TERMS, t.MEMORY, t.SYSTEM}
    rows = {r.figure.name: r for r in doc_rows()}
    for term, (low, high, evidence, names) in band_table.BANDS.items():
        assert 0 < low <= 1 <= high, term
        assert bool(names) == (evidence != band_evidence.DEFAULT), term
        for name in names:
            assert low <= band_evidence.time_factor(rows[name]) <= high, (term, name)


def test_the_bands_by_hand() -> None:
    # The matmul vertices' worst row is the ViT Q.K^T, 9,706 cycles against 8,488 published:
    # ln(9,706 / 8,488) = 0.1341, so exp(-+0.1341) = 0.874510 and 1.143497, to 4 decimals
    # outwards (0.8745, 1.1435).
    assert bands.band(t.MATMUL).low == 0.8745 and bands.band(t.MATMUL).high == 1.1435
    # The Bow Pod64's ResNet-50 reads 123,281 images/s for 145,287 published: a rate, so the
    # published time over ipujax's is 124,046 / 145,287 = 0.853799, its inverse 1.171236
    # (0.8537, 1.1713, to 4 decimals outwards), the worst of the rows on a Pod64.
    assert band_table.BANDS[t.POD64][:2] == (0.8537, 1.1713)
    # No row runs a halo exchange: the default is the loosest band a row is held to (a whole
    # system's 0.5-1.5), both ways in log terms: max(|ln 0.5|, |ln 1.5|) = ln 2 -> (0.5, 2.0).
    halo = bands.band(t.HALOS)
    assert (halo.low, halo.high, halo.default) == (0.5, 2.0, True)
    assert halo.text() == "0.50-2.00x (default: no row checks it)"
    # The memory rows' worst is the serialized matmul's fullest tile, 113,687 B for 86,813:
    # 86,813 / 113,687 = 0.763614 -> 0.7636, its inverse 1.309564 -> 1.3096; 100,000 B.
    assert bands.memory_range(100_000) == (76_360, 130_960)


def _step(name: str, kind: str, **cycles: int) -> Superstep:
    figures = dict(compute_cycles=0, exchange_cycles=0, sync_cycles=0, link_cycles=0)
    return Superstep(name, "op", "f.py:1", 1, 0, 0, **{**figures, **cycles}, kind=kind)


def _report(steps: list[Superstep], ipus: int = 1, **changes: object) -> ipujax.CostReport:
    base = ipujax.CostReport(
        "bow", "single IPU", ipus, 4, 1e9, 1000, 0, 0, 64, 0, 0, 0,
        np.zeros((ipus, 4), np.int64), np.zeros((ipus, 4), np.int64), (),
    )  # fmt: skip
    total = sum(s.cycles for s in steps)
    return dataclasses.replace(base, supersteps=tuple(steps), total_cycles=total, **changes)


def test_the_range_by_hand() -> None:
    # 1,000 cycles of matmul vertices (0.8745-1.1435) and 1,000 of host transfers (the ResNet
    # rows', worst the Bow Pod64's 0.8537-1.1713), at 1 GHz: 2 us, and every term erring the
    # same way, (0.8745 + 0.8537) / 2 = 0.8641 and (1.1435 + 1.1713) / 2 = 1.1574 of it.
    steps = [
        _step("dot.matmul", "compute", compute_cycles=1000),
        _step("in", "host", link_cycles=1000),
    ]
    low, high = _report(steps).seconds_range
    assert np.isclose(low, 0.8641 * 2e-6) and np.isclose(high, 1.1574 * 2e-6)
    # On 4 IPUs the range spans at least the whole systems' band: its worst row, ResNet-50's
    # inference at batch 8 (8,266 images/s for 9,805 published: 0.8430-1.1862).
    low, high = _report(steps, ipus=4).seconds_range
    assert np.isclose(low, 0.8430 * 2e-6) and np.isclose(high, 1.1862 * 2e-6)
    # A collective's ring within a machine takes the default band, a factor of 2 either way.
    ring = dataclasses.replace(_step("all_reduce(dp)", "collective", link_cycles=2000))
    why = "gradients; over IPU-Links within a machine"
    record = CollectiveCost("all_reduce", ("dp",), 2, 8, 2000, "all_reduce", "f.py:1", why)
    low, high = _report([ring], ipus=2, collectives=(record,)).seconds_range
    assert np.isclose(low, 0.5 * 2e-6) and np.isclose(high, 2.0 * 2e-6)


_KINDS = ("compute", "copy", "collective", "stream", "host", "pipeline")
_steps = st.lists(
    st.builds(
        lambda name, kind, c, x, s, link: _step(
            name, kind, compute_cycles=c, exchange_cycles=x, sync_cycles=s, link_cycles=link
        ),
        st.sampled_from(("dot.matmul", "add", "fusion(add, mul)")),
        st.sampled_from(_KINDS),
        *[st.integers(0, 10**9)] * 4,
    ),
    max_size=12,
)
_routes = st.sampled_from(
    ("IPU-Links within a Pod16", "IPU-Links within a Pod64, then Gateway-Links between Pod64s")
)


@given(_steps, st.integers(1, 1024), st.lists(_routes, max_size=3), st.integers(0, 10**10))
def test_the_range_always_holds_the_prediction(steps, ipus, routes, total) -> None:
    records = tuple(
        CollectiveCost("all_reduce", ("dp",), ipus, 8, 100, "x", "", f"g; over {r}") for r in routes
    )
    report = dataclasses.replace(_report(steps, ipus, collectives=records), total_cycles=total)
    low, high = report.seconds_range
    assert 0 <= low <= report.seconds <= high


def _compiled_report() -> ipujax.CostReport:
    def step(w, x):
        return jnp.tanh(x @ w).sum()

    mesh = ipujax.make_mesh((2,), ("dp",), target=target(16))
    w, x = jax.ShapeDtypeStruct((32, 32), jnp.float32), jax.ShapeDtypeStruct((64, 32), jnp.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        jitted = ipujax.jit(jax.grad(step), mesh=mesh, in_shardings=(P(), P("dp")))
        return jitted.lower(w, x).compile().cost_report()


def test_a_report_shows_its_range_in_the_summary_json_and_html() -> None:
    report = _compiled_report()
    low, high = report.seconds_range
    assert low <= report.seconds <= high and low < high
    assert f"time range      {bands.range_text(report)}" in report.summary()
    data = json.loads(report.to_json())
    assert data["seconds_range"] == [low, high]
    assert ipujax.CostReport.from_json(report.to_json()) == report  # derived, not read back
    html = render_html(report)
    assert "How far to trust the time" in html and "collectives within a machine" in html


def test_every_term_says_its_assumption_when_no_row_checks_it() -> None:
    from ipujax.assumptions import ASSUMED

    assert set(ASSUMED) == set(t.TIME_TERMS)
    # The gather's ring of the 2-IPU program is within one machine: no row checks it, so the
    # report names it; a Pod16's rings are checked by the ResNet-50 and BERT rows: not named.
    caveats = _compiled_report().caveats
    assert any(c.startswith("collectives within a machine (") for c in caveats), caveats
    assert not bands.band(t.POD16).default


def _int_matmul(a, b):
    return a @ b  # the caveat names this line


def test_an_integer_matmul_is_a_caveat() -> None:
    mesh = ipujax.make_mesh((1,), ("ipu",), target=target(16))
    a = jax.ShapeDtypeStruct((8, 8), jnp.int32)
    report = ipujax.jit(_int_matmul, mesh=mesh).lower(a, a).compile().cost_report()
    line = _int_matmul.__code__.co_firstlineno + 1
    assert report.caveats == (
        f"integer matmuls (1, first at tests/ipujax/test_bands.py:{line}): a multiply and an "
        "add per product on the vector path, as docs/target.md assumes (A), 'Matmuls on the AMP'",
    )
    floats = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    assert (
        ipujax.jit(_int_matmul, mesh=mesh).lower(floats, floats).compile().cost_report().caveats
        == ()
    )
