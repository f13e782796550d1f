"""The cases every SDK answers alike (``tests/cases/colocated.json``): the
same calls of colocated functions give the same outputs, shardings, errors and
cache counts in Python, Node and C, because core decides them. This is the
Python runner; Node's is ``sdk-node/tests/shared_cases.test.js``, C's
``tests/c/test_shared_cases.c``. Each case runs on a local client and on a
client of a real ``python -m colocated.worker`` process (the table's
``runs``); the host code travels to the worker by reference to this module,
which the worker imports (the tests' folder is on its ``PYTHONPATH``), so
that its ``FREED`` is the worker's own."""

import gc
import json
import pathlib
import time

import numpy as np
import pytest
from workers import Worker, write_token

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


def restructures(x):
    return x if np.asarray(x)[0] == 0 else (x,)


FUNCTIONS = {"add_one": add_one, "first": first, "a_of": a_of, "reentrant": reentrant, "restructures": restructures}

#: Destructors of ``Count`` objects that ran in this process (the local host's,
#: or, in a worker's copy of this module, the worker's).
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


#: What the runner lacks, by run (the table's ``needs``): nothing.
LACKS = {}


def host_state(x):
    """The host's destructor count and the objects its store keeps (every
    session's), as an int32 array with ``x``'s sharding: the runner reads a
    host's state through a colocated call, so a worker's too."""
    state = np.array([FREED[0], _colocated.host_objects(every_session=True)], np.int32)
    return colocated.device_put(state, x.sharding)


def sharding_of(a, devices):
    ds = [devices[i] for i in a["devices"]]
    kind = a.get("memory_kind")
    if len(ds) == 1:
        return SingleDeviceSharding(ds[0], memory_kind=kind)
    return NamedSharding(Mesh(np.array(ds), ("x",)), P("x") if a["split"] else P(), memory_kind=kind)


def argument(arg, devices):
    values = np.array(arg["values"], dtype=arg["dtype"])
    return colocated.device_put(values, sharding_of(arg, devices))


def check_output(out, want, devices):
    assert str(out.dtype) == want["dtype"]
    np.testing.assert_array_equal(np.asarray(out), np.array(want["values"], dtype=want["dtype"]))
    assert [d.id for d in out.sharding.devices] == [devices[i].id for i in want["devices"]]
    assert out.sharding.is_equivalent_to(sharding_of(want, devices), out.ndim)
    assert out.sharding.memory_kind == want.get("memory_kind", "device")


@pytest.fixture(scope="module")
def remote_devices(tmp_path_factory):
    """The devices of a client connected to a real worker process on
    127.0.0.1 with the table's devices (not the default client)."""
    token_file = tmp_path_factory.mktemp("shared-cases") / "token"
    write_token(token_file)
    worker = Worker(token_file, devices=TABLE["devices"])
    try:
        client = colocated.connect([worker.address], token_file=token_file, default=False)
        assert all(d.process_index == 1 for d in client.devices())
        yield client.devices()
        client.close()
    finally:
        gc.collect()
        worker.stop()


RUNS = [(run, case) for run in TABLE["runs"] for case in TABLE["cases"] if run == "local" or "local_only" not in case]


@pytest.mark.parametrize(("run", "case"), RUNS, ids=[f"{run}: {case['name']}" for run, case in RUNS])
def test_shared_case(run, case, request):
    lacking = [LACKS[run][need] for need in case.get("needs", []) if need in LACKS.get(run, {})]
    if lacking:
        pytest.skip("; ".join(lacking))
    devices = colocated.devices() if run == "local" else request.getfixturevalue("remote_devices")
    assert len(devices) >= TABLE["devices"]
    probe = colocated.colocated_python(host_state)
    probe_arg = colocated.device_put(np.zeros(2, np.int32), SingleDeviceSharding(devices[0]))

    def state():
        return np.asarray(probe(probe_arg)).tolist()

    gc.collect()
    freed_before, objects_before = state()
    run_calls(case, devices)
    if "freed" in case:
        # The wrapper went with `run_calls`' frame: its host's object goes.
        deadline = time.monotonic() + 10
        while True:
            gc.collect()
            freed, objects = state()
            if (freed - freed_before >= case["freed"] and objects <= objects_before) or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        assert freed - freed_before == case["freed"]
        assert objects == objects_before


def run_calls(case, devices):
    """Makes the case's function (a method of a new object for a method) and
    makes its calls."""
    name = case["function"]
    if name in METHODS:
        fn = getattr(colocated.colocated_python_class(METHODS[name])(), name)
    else:
        fn = colocated.colocated_python(FUNCTIONS[name])
    for step, call in enumerate(case["calls"]):
        args = [argument(a, devices) for a in call["args"]]
        if "tree" in call:
            args = [{key: args[i] for key, i in call["tree"].items()}]
        if "error" in call and call["error"].get("at", "call") == "run":
            # The call returns; its outputs fail (with the host's traceback).
            result = fn(*args)
            with pytest.raises(colocated.ColocatedError, match=call["error"]["fragment"]) as failed:
                colocated.block_until_ready(result)
            assert failed.value.code == call["error"]["code"], f"call {step}"
        elif "error" in call:
            with pytest.raises(ERRORS[call["error"]["code"]], match=call["error"]["fragment"]):
                fn(*args)
        else:
            result = fn(*args)
            outputs = list(result) if isinstance(result, tuple) else [result]
            assert len(outputs) == len(call["outputs"]), f"call {step}"
            for out, want in zip(outputs, call["outputs"]):
                check_output(out, want, devices)
        if "cache" in call:
            info = fn.cache_info()
            assert (info.hits, info.misses) == (call["cache"]["hits"], call["cache"]["misses"]), f"call {step}"
