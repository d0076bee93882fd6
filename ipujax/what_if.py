"""What if the machine were different: the same program's cost on a changed `Target`, and the
step's sensitivity to each of the machine's main rates.

`Compiled.what_if(ipu_link_bytes_per_second="2x")` builds the program again on the mesh with
the changed Target (partitioned, scheduled and planned anew: a matmul plan or a phase cut that
depends on the machine follows it) and returns its `CostReport`. A change is a Target field's
new value, or a factor written `"<number>x"`. `sensitivity` doubles each main parameter in turn
and gives the step's elasticity, d ln(time) / d ln(parameter) measured over that doubling: -1
for a step bound by that rate alone, 0 for one it does not touch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from ipujax.report import CostReport, build_report
from partitioner import Built, ConfigError, Target

Rebuild = Callable[[Target], Built]

# The machine's main parameters, by what they set; each doubled together for `sensitivity`.
PARAMETERS: dict[str, tuple[str, ...]] = {
    "clock": ("clock_hz",),
    "exchange": ("exchange_bytes_per_cycle",),
    "links": ("ipu_link_bytes_per_second", "gateway_link_bytes_per_second"),
    "streaming": ("streaming_bytes_per_second",),
    "host": ("host_bytes_per_second", "host_link_bytes_per_second_per_machine"),
    "memory": ("bytes_per_tile",),
}


def _number(name: str, text: Any) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        raise ConfigError(
            f"{name}={text!r}: give a number, or a factor such as '2x' or '0.5x'"
        ) from None


def _value(target: Target, name: str, given: Any) -> Any:
    """The field's new value: `given`, or its old value times a factor written '<k>x'."""
    old = getattr(target, name)
    if isinstance(old, bool) or not isinstance(old, (int, float)):
        raise ConfigError(f"Target.{name} is not a number ({old!r}); what-if changes rates")
    if isinstance(given, str) and given.strip().lower().endswith("x"):
        value = old * _number(name, given.strip()[:-1])
    else:
        value = _number(name, given)
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(
            f"{name}={given!r} gives {value}; a machine's figure must be positive and finite"
        )
    return max(1, round(value)) if isinstance(old, int) else value


def changed_target(target: Target, changes: Mapping[str, Any]) -> Target:
    """`target` with each named field changed (`ConfigError` for a name it has not)."""
    fields = {f.name for f in dataclasses.fields(Target)}
    unknown = sorted(set(changes) - fields)
    if unknown:
        numeric = sorted(n for n in fields if isinstance(getattr(target, n), (int, float)))
        raise ConfigError(f"Target has no field {unknown}; its figures are: {', '.join(numeric)}")
    values = {name: _value(target, name, given) for name, given in changes.items()}
    return dataclasses.replace(target, **values)


def what_if(rebuild: Rebuild, target: Target, changes: Mapping[str, Any]) -> CostReport:
    """The program's report on `target` with `changes`, built again."""
    return build_report(rebuild(changed_target(target, changes)))


def sensitivity(rebuild: Rebuild, target: Target, base: CostReport) -> dict[str, float]:
    """The step's elasticity to each of `PARAMETERS`, each doubled in turn."""
    result = {}
    for kind, names in PARAMETERS.items():
        doubled = what_if(rebuild, target, dict.fromkeys(names, "2x"))
        result[kind] = math.log(doubled.seconds / base.seconds) / math.log(2)
    return result
