"""The cases every SDK answers alike (``tests/cases/colocated.json``): the
same calls of colocated functions give the same outputs, shardings, errors and
cache counts in Python, Node and C, because core decides them. This is the
Python runner; Node's is ``sdk-node/tests/shared_cases.test.js``, C's
``tests/c/test_shared_cases.c``."""

import gc
import json
import pathlib
import time

import numpy as np
import pytest

import colocated
from colocated import Mesh, NamedSharding, P, SingleDeviceSharding, _colocated

TABLE = json.loads((pathlib.Path(__file__).parents[2] / "tests" / "cases" / "colocated.json").read_text())

#: Error codes of the table -> this SDK's exception classes.
ERRORS = {
    "invalid_argument": colocated.InvalidArgumentError,
    "failed_precondition": colocated.FailedPreconditionError,
    "unimplemented": colocated.UnimplementedError,
}


def add_one(*xs):
    out = tuple(x + 1 for x in xs)
    return out[0] if len(out) == 1 else out


def first(*xs):
    return xs[0]


def a_of(tree):
    return tree["a"]


def reentrant(*xs):
    return colocated.colocated_python(add_one)(*xs)


FUNCTIONS = {"add_one": add_one, "first": first, "a_of": a_of, "reentrant": reentrant}

#: Destructors of ``Count`` objects that ran (on this process's own host).
FREED = [0]


class Count:
    """The table's ``count``: a method of an object that counts its calls."""

    def __init__(self):
        self.calls = 0

    def __del__(self):
        FREED[0] += 1

    def count(self, x, *_rest):
        self.calls += 1
        return x + self.calls


#: The table's methods of colocated classes, by name.
METHODS = {"count": Count}


def sharding_of(a):
    ds = [colocated.devices()[i] for i in a["devices"]]
    kind = a.get("memory_kind")
    if len(ds) == 1:
        return SingleDeviceSharding(ds[0], memory_kind=kind)
    return NamedSharding(Mesh(np.array(ds), ("x",)), P("x") if a["split"] else P(), memory_kind=kind)


def argument(arg):
    values = np.array(arg["values"], dtype=arg["dtype"])
    return colocated.device_put(values, sharding_of(arg))


def check_output(out, want):
    assert str(out.dtype) == want["dtype"]
    np.testing.assert_array_equal(np.asarray(out), np.array(want["values"], dtype=want["dtype"]))
    assert [d.id for d in out.sharding.devices] == [colocated.devices()[i].id for i in want["devices"]]
    assert out.sharding.is_equivalent_to(sharding_of(want), out.ndim)
    assert out.sharding.memory_kind == want.get("memory_kind", "device")


@pytest.mark.parametrize("case", TABLE["cases"], ids=[c["name"] for c in TABLE["cases"]])
def test_shared_case(case):
    assert len(colocated.devices()) >= TABLE["devices"]
    FREED[0] = 0
    gc.collect()
    objects_before = _colocated.host_objects(every_session=True)
    run_calls(case)
    if "freed" in case:
        # The wrapper went with `run_calls`' frame: its host's object goes.
        deadline = time.monotonic() + 10
        while (FREED[0] < case["freed"] or _colocated.host_objects(every_session=True) > objects_before) and (
            time.monotonic() < deadline
        ):
            gc.collect()
            time.sleep(0.01)
        assert FREED[0] == case["freed"]
        assert _colocated.host_objects(every_session=True) == objects_before


def run_calls(case):
    """Makes the case's function (a method of a new object for a method) and
    makes its calls."""
    name = case["function"]
    if name in METHODS:
        fn = getattr(colocated.colocated_python_class(METHODS[name])(), name)
    else:
        fn = colocated.colocated_python(FUNCTIONS[name])
    for step, call in enumerate(case["calls"]):
        args = [argument(a) for a in call["args"]]
        if "tree" in call:
            args = [{key: args[i] for key, i in call["tree"].items()}]
        if "error" in call:
            with pytest.raises(ERRORS[call["error"]["code"]], match=call["error"]["fragment"]):
                fn(*args)
        else:
            result = fn(*args)
            outputs = list(result) if isinstance(result, tuple) else [result]
            assert len(outputs) == len(call["outputs"]), f"call {step}"
            for out, want in zip(outputs, call["outputs"]):
                check_output(out, want)
        if "cache" in call:
            info = fn.cache_info()
            assert (info.hits, info.misses) == (call["cache"]["hits"], call["cache"]["misses"]), f"call {step}"
