"""The partitioner's output (`partition`): the per-IPU program with the shardings of its
inputs, outputs and values, and the ops that ran whole and so gathered a split tensor."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from lowering import Graph, Value
from partitioner.sharding.propagation import Propagated
from partitioner.sharding.specs import Sharding


@dataclass(frozen=True, slots=True)
class ForcedWhole:
    """An op that ran whole on every IPU and so gathered a tensor that was split."""

    op: str
    source: str
    rule: str
    tensor: str  # the split operand, with its type and sharding
    why: str = ""  # why a rule that splits the op could not split it here

    def __str__(self) -> str:
        why = f": {self.why}" if self.why else ""
        return f"{self.op} at {self.source} ({self.rule} rule) gathered {self.tensor}{why}"


@dataclass(frozen=True, slots=True, eq=False)
class Partitioned:
    """The per-IPU program and the shardings of its inputs and outputs."""

    graph: Graph
    input_shardings: tuple[Sharding, ...]
    output_shardings: tuple[Sharding, ...]
    global_graph: Graph
    propagated: Propagated
    # The sharding of each per-IPU value the partitioner made for a global one.
    local_shardings: dict[Value, Sharding] = dataclasses.field(default_factory=dict)
    forced_whole: tuple[ForcedWhole, ...] = ()
