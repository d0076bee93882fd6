"""Shardings that cannot apply are `ipujax.ShardingError`s whose messages say what is wrong and
what to do: an axis the mesh lacks, more spec entries than the tensor's rank, an axis used twice,
in_shardings of the wrong length."""

from __future__ import annotations

import re
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from partition_helpers import mesh

import ipujax

X = np.ones((8, 4), np.float32)
W = np.ones((4, 6), np.float32)


def _matmul(x: Any, w: Any) -> Any:
    return x @ w


def _compile(fun: Any, args: tuple, the_mesh: ipujax.Mesh | None = None, **shardings: Any) -> None:
    the_mesh = the_mesh or mesh((2, 2), ("dp", "tp"))
    ipujax.jit(fun, mesh=the_mesh, **shardings).lower(*args).compile()


# ---- an axis the mesh does not have --------------------------------------------------------------


@pytest.mark.parametrize(
    "shardings",
    [
        {"in_shardings": (P("model"), None)},
        {"in_shardings": (P(None, ("dp", "model")), P())},
        {"out_shardings": P("model")},
    ],
    ids=["in", "in-tuple-entry", "out"],
)
def test_unknown_axis_names_the_axis_and_the_mesh_axes(shardings: dict[str, Any]) -> None:
    with pytest.raises(ipujax.ShardingError) as error:
        _compile(_matmul, (X, W), **shardings)
    message = str(error.value)
    assert "['model']" in message
    assert "use the mesh's axes ['dp', 'tp']" in message
    assert "dp=2, tp=2" in message  # the mesh itself


def test_unknown_axis_is_an_error_on_one_ipu_too() -> None:
    with pytest.raises(ipujax.ShardingError, match=r"names the axes \['tp'\]"):
        _compile(jnp.sin, (X,), mesh((1,), ("dp",)), in_shardings=(P("tp"),))


# ---- more entries than the tensor's rank ---------------------------------------------------------


def test_spec_longer_than_the_rank_names_the_rank_and_the_argument() -> None:
    with pytest.raises(ipujax.ShardingError) as error:
        _compile(_matmul, (X, W), in_shardings=(P(None, None, "dp"), None))
    message = str(error.value)
    assert message.startswith("in_shardings for x: ")
    assert "has 3 entries for a tensor of rank 2" in message
    assert "at most one entry per dimension" in message


def test_out_spec_longer_than_the_rank() -> None:
    pattern = r"out_shardings for output 0: .* has 2 entries for a tensor of rank 1"
    with pytest.raises(ipujax.ShardingError, match=pattern):
        _compile(
            lambda x: x.sum(axis=0), (X,), in_shardings=(P("dp"),), out_shardings=P("dp", "tp")
        )


# ---- an axis used twice --------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [P("dp", "dp"), P(("dp", "tp"), "dp"), P(("tp", "tp"))])
def test_duplicate_axis_in_one_spec(spec: P) -> None:
    with pytest.raises(ipujax.ShardingError) as error:
        _compile(_matmul, (X, W), in_shardings=(spec, None))
    message = str(error.value)
    assert message.startswith("in_shardings for x: ")
    assert re.search(r"uses the axes \['(dp|tp)'\] more than once", message)
    assert "an axis can split only one dimension" in message


@pytest.mark.parametrize("spec", [P(None, None, "dp"), P("dp", "dp")], ids=["rank", "duplicate"])
def test_invalid_spec_is_an_error_on_one_ipu_too(spec: P) -> None:
    with pytest.raises(ipujax.ShardingError, match="in_shardings for x"):
        _compile(jnp.sin, (X,), mesh((1,), ("dp",)), in_shardings=(spec,))


# ---- in_shardings and out_shardings of the wrong length ------------------------------------------


@pytest.mark.parametrize("specs", [(P("dp"),), (P("dp"), P(), P())])
def test_in_shardings_tuple_of_the_wrong_length(specs: tuple) -> None:
    with pytest.raises(ipujax.ShardingError) as error:
        _compile(_matmul, (X, W), in_shardings=specs)
    message = str(error.value)
    assert f"in_shardings has {len(specs)} entries for 2 positional arguments" in message
    assert "give one entry (a PartitionSpec, a pytree of them, or None) per argument" in message


def test_in_shardings_list_of_the_wrong_length() -> None:
    with pytest.raises(ipujax.ShardingError, match="in_shardings has 3 entries for 2 positional"):
        _compile(_matmul, (X, W), in_shardings=[P("dp"), None, None])


def test_a_string_instead_of_a_partition_spec() -> None:
    with pytest.raises(ipujax.ShardingError) as error:
        _compile(_matmul, (X, W), in_shardings=("dp", None))
    assert str(error.value) == (
        "in_shardings for x: expected a jax.sharding.PartitionSpec, got str 'dp'"
    )


def test_out_shardings_of_the_wrong_length_names_out_shardings() -> None:
    with pytest.raises(ipujax.ShardingError) as error:
        _compile(lambda x: (x, x), (X,), in_shardings=(P("dp"),), out_shardings=(P(), P(), P()))
    message = str(error.value)
    assert message.startswith("out_shardings has structure")
    assert "2 != 3" in message


def test_out_shardings_mismatch_speaks_of_the_outputs() -> None:
    with pytest.raises(ipujax.ShardingError) as error:
        _compile(lambda x: (x, x), (X,), in_shardings=(P("dp"),), out_shardings=(P(), P(), P()))
    assert "arguments" not in str(error.value)
    assert "output" in str(error.value)


def test_sharding_error_is_an_ipujax_error() -> None:
    assert issubclass(ipujax.ShardingError, ipujax.IpujaxError)
    with pytest.raises(ipujax.IpujaxError):
        _compile(_matmul, (X, W), in_shardings=(P("nope"), None))
