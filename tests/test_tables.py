"""Every per-op table covers exactly the op vocabulary, in every stage."""

import pytest

import lowering
from partitioner.tile_rules import TILE_RULES

TABLES = {
    "IMPORT_RULES": lowering.IMPORT_RULES,
    "SHAPE_RULES": lowering.SHAPE_RULES,
    "EVAL_RULES": lowering.EVAL_RULES,
    "COST_RULES": lowering.COST_RULES,
    "TILE_RULES": TILE_RULES,
}


@pytest.mark.parametrize("name", sorted(TABLES))
def test_table_covers_vocabulary(name):
    table = set(TABLES[name])
    vocabulary = set(lowering.VOCABULARY)
    assert not vocabulary - table, f"{name} misses {sorted(vocabulary - table)}"
    assert not table - vocabulary, (
        f"{name} has ops outside the vocabulary: {sorted(table - vocabulary)}"
    )
