"""The collective combiner: all-reduces over the same mesh axes that can run at one point of
the program go as one.

Graphcore's TensorFlow held cross-replica sums back until `maximum_cross_replica_sum_buffer_size`
bytes had gathered, then ran them as one (fewer collectives, "and therefore less control code";
its CNN examples set 10 MiB), and XLA's all-reduce combiner merges independent all-reduces the
same way. The partitioner puts each all-reduce just before the first op that reads its sum; it
could run anywhere from just after its operands are made. Of those ranges, the combiner picks
few points that every range holds (the first range to close first: the greedy choice that
needs the fewest points), with the same axes, group and reduction at each point and at most
the buffer's bytes, and emits each point's all-reduces as one variadic `all_reduce` there. One
ring then carries their bytes with one latency and one sync (`cost.links`).

Values never change: each operand is reduced on its own over the same IPUs. Results keep their
values' names, so nothing after the combiner is renamed. Phased programs keep their all-reduces
apart: replicated tensor sharding turns each gradient's into a reduce-scatter (`rts`).
"""

from __future__ import annotations

import dataclasses

from lowering import Graph, Op, Value, op_reads

BUFFER_BYTES = 10 * 1024 * 1024  # D: Graphcore's CNN examples' max_cross_replica_sum_buffer_size

_Key = tuple[tuple[str, ...], int, str]


def combine_all_reduces(graph: Graph, buffer_bytes: int = BUFFER_BYTES) -> Graph:
    """`graph` with its all-reduces merged (`buffer_bytes` 0 keeps each apart)."""
    if buffer_bytes <= 0:
        return graph
    groups = _groups(graph, buffer_bytes)
    if not groups:
        return graph
    at = {group[0]: _combined([graph.ops[i] for i in group]) for group in groups}
    gone = {i for group in groups for i in group[1:]}
    ops = tuple(at.get(i, op) for i, op in enumerate(graph.ops) if i not in gone)
    return dataclasses.replace(graph, ops=ops)


def _groups(graph: Graph, buffer_bytes: int) -> list[list[int]]:
    """Indices of the all-reduces run together, each group's first the point where it runs:
    by the end of their ranges, each joins the open group of its kind when its operands are
    made by that group's point and the bytes fit, else opens one at its own place."""
    ready = _earliest(graph)
    open_groups: dict[_Key, list[int]] = {}
    filled: dict[_Key, int] = {}  # the open group's bytes
    groups: list[list[int]] = []
    for i, op in enumerate(graph.ops):
        if op.name != "all_reduce":
            continue
        key, size = _key(op), sum(x.nbytes for x in op.operands)
        group = open_groups.get(key)
        if group is not None and filled[key] + size <= buffer_bytes and ready[i] <= group[0]:
            group.append(i)
            filled[key] += size
            continue
        open_groups[key], filled[key] = [i], size
        groups.append(open_groups[key])
    return [g for g in groups if len(g) > 1]


def _earliest(graph: Graph) -> list[int]:
    """For each op, the first place it could run: just after the last op making its reads."""
    made: dict[Value, int] = {}
    earliest: list[int] = []
    for i, op in enumerate(graph.ops):
        earliest.append(max((made[v] + 1 for v in op_reads(op) if v in made), default=0))
        made.update(dict.fromkeys(op.results, i))
    return earliest


def _key(op: Op) -> _Key:
    return (tuple(op.attrs["axes"]), op.attrs["group_size"], op.attrs.get("reduction", "sum"))


def _combined(group: list[Op]) -> Op:
    """One all-reduce of every operand of `group`, at the first one's place and line."""
    first = group[0]
    why = first.attrs.get("why", "")
    attrs = {**first.attrs, "why": f"{why}; {len(group)} all-reduces combined"}
    return dataclasses.replace(
        first,
        operands=tuple(x for op in group for x in op.operands),
        results=tuple(r for op in group for r in op.results),
        attrs=attrs,
    )
