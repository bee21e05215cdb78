"""``self.all_gather`` moves tensors only: what happens to the other leaves of a collection.

``LightningModule.all_gather(data)`` first converts leaves with ``convert_to_tensors``
(lightning_fabric/utilities/apply_func.py ``CONVERSION_DTYPES``: ``bool`` -> uint8, ``int`` -> int32,
``float`` -> float32, ``numpy.ndarray`` -> a tensor of its dtype), then gathers every tensor with
``apply_to_collection(data, Tensor, strategy.all_gather)``; any other leaf (a ``str``, a list of strings,
``None``, an object) is passed through untouched. So a string comes back as *this rank's* string, with no
error and no warning, next to tensors that hold every rank's values, and a NumPy array comes back as a
``torch.Tensor`` of shape ``(W, *shape)``. The fix for what is not a tensor:
``torch.distributed.all_gather_object`` (pickles; every rank gets the list of every rank's object, types
kept), or encode it to tensors first. (tests/facts/test_collectives.py covers tensors, 0-d tensors, Python
floats and dicts of tensors.)

Each rank gathers ``hidden_collectives.leaves(rank)``: a (2,) tensor, a float, an int, a bool, a (3,)
float64 NumPy array, a list of two strings and a string, all functions of the rank.
The probe is ddpprobe/probes/hidden_collectives.py (``all_gather_leaves``).
Sources: pytorch_lightning/core/module.py ``LightningModule.all_gather``;
lightning_fabric/utilities/apply_func.py ``convert_to_tensors``, ``_from_numpy``;
torch/distributed/distributed_c10d.py ``all_gather_object``.
"""

import re

import pytest

from ddpprobe.probes import hidden_collectives as hidden
from tests.support import oracle


def _stacked(world_size: int, key: str, dtype: str) -> dict:
    values = [hidden.leaves(r)[key] for r in range(world_size)]
    values = [v.tolist() if hasattr(v, "tolist") else v for v in values]
    values = [int(v) if isinstance(v, bool) else v for v in values]  # bool -> uint8: 1 / 0
    inner = list(hidden.leaves(0)[key].shape) if hasattr(hidden.leaves(0)[key], "shape") else []
    return {"type": "Tensor", "shape": [world_size, *inner], "dtype": dtype, "values": values}


@pytest.mark.parametrize("world_size", [2, 3])
def test_all_gather_stacks_tensors_numbers_and_numpy_arrays_and_returns_strings_unchanged_and_rank_local(
    run_world, semantics, world_size
):
    """``self.all_gather(leaves(rank))`` on every rank: the tensor, the Python float (float32), int
    (int32), bool (uint8) and the NumPy array (a float64 ``torch.Tensor``, no longer an ndarray) come
    back stacked, shape ``(W, ...)``, identical on every rank; the list of strings and the string come
    back as they went in: each rank holds its own, with no error and no warning about them."""
    world = run_world(hidden.all_gather_leaves, world_size)

    shared = {
        "tensor": _stacked(world_size, "tensor", "float32"),
        "python_float": _stacked(world_size, "python_float", "float32"),
        "python_int": _stacked(world_size, "python_int", "int32"),
        "python_bool": _stacked(world_size, "python_bool", "uint8"),
        "numpy": _stacked(world_size, "numpy", "float64"),
    }
    expected = [
        {
            **shared,
            "strings": {"type": "list", "values": hidden.leaves(r)["strings"]},
            "string": {"type": "str", "values": hidden.leaves(r)["string"]},
        }
        for r in range(world_size)
    ]
    got = [rec["gathered"] for rec in world.records]
    semantics.number(
        "strings on rank 1", str(got[1]["strings"]["values"]), vs=("rank 0's", str(hidden.leaves(0)["strings"]))
    )
    assert got == expected, (
        oracle.side_by_side("strings", [g["strings"] for g in got])
        + "\n"
        + oracle.side_by_side("numpy", [g["numpy"] for g in got])
    )
    # torch 2.13 warns once per gathered tensor that torch.distributed.nn.functional.all_gather is deprecated;
    # nothing mentions a string leaf or its type
    about_strings = [
        [w["message"] for w in rec["warnings"] if re.search(r"\bstr(ing)?s?\b|rank\d-", w["message"])]
        for rec in world.records
    ]
    assert about_strings == [[]] * world_size, oracle.side_by_side("warnings", about_strings)


@pytest.mark.parametrize("world_size", [2, 3])
def test_all_gather_object_gives_every_rank_every_ranks_strings_and_arrays_with_their_types(
    run_world, semantics, world_size
):
    """The fix: ``torch.distributed.all_gather_object(objects, leaves(rank))`` (every rank calls it; it
    pickles). Every rank gets the list of every rank's dict in rank order, each leaf of its original
    type: strings, Python numbers, the NumPy array as an ndarray, the tensor as a tensor."""
    world = run_world(hidden.all_gather_leaves, world_size)

    def described(rank: int) -> dict:
        leaf = hidden.leaves(rank)
        return {
            "tensor": {"type": "Tensor", "shape": [2], "dtype": "float32", "values": leaf["tensor"].tolist()},
            "python_float": {"type": "float", "values": leaf["python_float"]},
            "python_int": {"type": "int", "values": leaf["python_int"]},
            "python_bool": {"type": "bool", "values": leaf["python_bool"]},
            "numpy": {"type": "ndarray", "shape": [3], "dtype": "float64", "values": leaf["numpy"].tolist()},
            "strings": {"type": "list", "values": leaf["strings"]},
            "string": {"type": "str", "values": leaf["string"]},
        }

    expected = [described(r) for r in range(world_size)]
    got = [rec["objects"] for rec in world.records]
    semantics.number("objects on rank 0", len(got[0]), vs=("world size", world_size))
    assert got == [expected] * world_size, oracle.side_by_side("objects", got)
