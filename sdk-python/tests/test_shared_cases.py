"""The cases every SDK answers alike (``tests/cases/colocated.json``): the
same calls of colocated functions give the same outputs, shardings, errors and
cache counts in Python, Node and C, because core decides them. This is the
Python runner; Node's is ``sdk-node/tests/shared_cases.test.js``."""

import json
import pathlib

import numpy as np
import pytest

import colocated
from colocated import Mesh, NamedSharding, P, SingleDeviceSharding

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


def sharding_of(devices, split):
    ds = [colocated.devices()[i] for i in devices]
    if len(ds) == 1:
        return SingleDeviceSharding(ds[0])
    return NamedSharding(Mesh(np.array(ds), ("x",)), P("x") if split else P())


def argument(arg):
    values = np.array(arg["values"], dtype=arg["dtype"])
    return colocated.device_put(values, sharding_of(arg["devices"], arg["split"]))


def check_output(out, want):
    assert str(out.dtype) == want["dtype"]
    np.testing.assert_array_equal(np.asarray(out), np.array(want["values"], dtype=want["dtype"]))
    assert [d.id for d in out.sharding.devices] == [colocated.devices()[i].id for i in want["devices"]]
    assert out.sharding.is_equivalent_to(sharding_of(want["devices"], want["split"]), out.ndim)


@pytest.mark.parametrize("case", TABLE["cases"], ids=[c["name"] for c in TABLE["cases"]])
def test_shared_case(case):
    assert len(colocated.devices()) >= TABLE["devices"]
    fn = colocated.colocated_python(FUNCTIONS[case["function"]])
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
        info = fn.cache_info()
        assert (info.hits, info.misses) == (call["cache"]["hits"], call["cache"]["misses"]), f"call {step}"
