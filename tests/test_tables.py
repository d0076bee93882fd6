"""Every per-op table covers exactly the op vocabulary, in every stage, with no default: an op
added to the vocabulary without a decision in a table, or an entry removed, fails here."""

import pytest

import lowering
import partitioner

TABLES = {
    "IMPORT_RULES": lowering.IMPORT_RULES,
    "SHAPE_RULES": lowering.SHAPE_RULES,
    "EVAL_RULES": lowering.EVAL_RULES,
    "COST_RULES": lowering.COST_RULES,
    "FACTOR_RULES": partitioner.FACTOR_RULES,
    "TILE_RULES": partitioner.TILE_RULES,
    "OP_VERTEX_KINDS": partitioner.OP_VERTEX_KINDS,
}


def mismatch(table: dict) -> tuple[set[str], set[str]]:
    """(ops of the vocabulary the table lacks, keys of the table outside the vocabulary)."""
    vocabulary = set(lowering.VOCABULARY)
    return vocabulary - set(table), set(table) - vocabulary


@pytest.mark.parametrize("name", sorted(TABLES))
def test_table_covers_vocabulary(name: str) -> None:
    missing, extra = mismatch(TABLES[name])
    assert not missing, f"{name} misses {sorted(missing)}"
    assert not extra, f"{name} has ops outside the vocabulary: {sorted(extra)}"


@pytest.mark.parametrize("name", sorted(TABLES))
def test_removing_any_entry_is_caught(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The coverage check fails for every op whose entry goes missing (the tables are built
    without a fallback, so the entry is all that stands for the op)."""
    table = TABLES[name]
    for op in sorted(lowering.VOCABULARY):
        with monkeypatch.context() as patch:
            patch.delitem(table, op)
            assert mismatch(table) == ({op}, set())
            with pytest.raises(AssertionError, match=op):
                test_table_covers_vocabulary(name)
    assert mismatch(table) == (set(), set())
