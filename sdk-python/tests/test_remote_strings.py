"""String arrays on worker hosts: a controller driving real ``python -m
colocated.worker`` processes puts string arrays on their devices, reads them
back, and runs colocated Python functions over them that return strings (JAX's
string and binary-data colocated_python tests, on workers)."""

import base64
import os
import struct
import sys

import cloudpickle
import numpy as np
import pytest

import colocated

# Functions of this module travel by value: the workers cannot import it.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

STRING = np.dtypes.StringDType()

#: Empty strings, non-ASCII, and one longer than a transfer chunk (2 MiB).
SAMPLES = ["", "a", "héllo", "naïve 🙂", "日本語", "", "tab\tand\nnewline", "ü" * (1 << 20) + "!"]


def over(devices, value):
    """``value`` (a numpy string array) split on its first axis over ``devices``."""
    mesh = colocated.Mesh(devices, ("x",))
    return colocated.device_put(np.asarray(value, dtype=STRING), colocated.NamedSharding(mesh, colocated.P("x")))


def test_a_string_array_round_trips_through_the_workers(cluster):
    client, _ = cluster(2)
    devices = client.devices()
    value = np.array(SAMPLES, dtype=STRING)
    x = over(devices, value)
    assert x.dtype == STRING
    back = np.asarray(x)
    assert back.dtype == STRING
    assert back.tolist() == SAMPLES
    # Each shard reads back from its own worker.
    assert [np.asarray(s.data).tolist() for s in x.addressable_shards] == [SAMPLES[2 * i : 2 * i + 2] for i in range(4)]
    # A 2-D array, a scalar and an empty array on one worker's device.
    matrix = colocated.device_put(np.array([["ab", ""], ["ç", "d"]], dtype=STRING), devices[3])
    assert np.asarray(matrix).tolist() == [["ab", ""], ["ç", "d"]]
    scalar = colocated.device_put(np.array("só", dtype=STRING), devices[1])
    assert np.asarray(scalar).item() == "só"
    empty = colocated.device_put(np.array([], dtype=STRING), devices[2])
    assert np.asarray(empty).shape == (0,) and np.asarray(empty).dtype == STRING
    # Copies between workers.
    moved = colocated.device_put(matrix, devices[0])
    assert np.asarray(moved).tolist() == [["ab", ""], ["ç", "d"]]
    # Deleted: the workers free the shards, and reading is an error.
    x.delete()
    with pytest.raises(colocated.ColocatedError, match="deleted"):
        np.asarray(x)


def upper_with_pid(x):
    """Each shard of ``x`` in upper case, tagged with the host's pid."""
    to_upper = np.vectorize(lambda s: f"{s.upper()}@{os.getpid()}", otypes=[STRING])
    shards = [colocated.device_put(to_upper(np.asarray(s.data)), s.device) for s in x.addressable_shards]
    return colocated.make_array_from_single_device_arrays(x.shape, x.sharding, shards)


def expected_upper(rows, workers):
    """``upper_with_pid`` of ``rows``, one row per worker."""
    return [[f"{s.upper()}@{w.pid}" for s in row] for row, w in zip(rows, workers)]


@pytest.mark.parametrize("with_out_specs", [False, True], ids=["discovered", "out_specs_fn"])
def test_a_colocated_function_takes_and_returns_strings_on_the_workers(cluster, with_out_specs):
    client, workers = cluster(2, devices=1)
    rows = [["abcd", "éfgh"], ["", "mnop"]]
    mesh = colocated.Mesh(np.array(client.devices()).reshape((2, 1)), ("x", "y"))
    sharding = colocated.NamedSharding(mesh, colocated.P("x"))
    x = colocated.device_put(np.array(rows, dtype=STRING), sharding)
    upper = colocated.colocated_python(upper_with_pid)
    if with_out_specs:
        upper = upper.specialize(out_specs_fn=lambda spec: spec)
    out = upper(x)
    assert out.sharding == sharding
    back = np.asarray(out)
    assert back.dtype == STRING
    assert back.tolist() == expected_upper(rows, workers)
    # Again (the compiled program, asynchronous), and on its own output.
    again = upper(x)
    twice = upper(again)
    assert np.asarray(again).tolist() == expected_upper(rows, workers)
    assert np.asarray(twice).tolist() == [
        [f"{s.upper()}@{w.pid}@{w.pid}" for s in row] for row, w in zip(rows, workers)
    ]
    assert upper.cache_info().hits == 2


def test_binary_data_travels_as_base64_strings_to_a_worker_and_back(cluster):
    client, _ = cluster(1, devices=1)

    def pack(a, b):
        return base64.b64encode(struct.pack("<ii", a, b)).decode("ascii")

    @colocated.colocated_python
    def increment_packed(x):
        shards = []
        for shard in x.addressable_shards:
            a, b = struct.unpack("<ii", base64.b64decode(str(np.asarray(shard.data)[0]).encode("ascii")))
            packed = base64.b64encode(struct.pack("<ii", a + 1, b + 1)).decode("ascii")
            shards.append(colocated.device_put(np.array([packed], dtype=STRING), shard.device))
        return colocated.make_array_from_single_device_arrays(x.shape, x.sharding, shards)

    x = colocated.device_put(np.array([pack(1001, 1002)], dtype=STRING), client.devices()[0])
    out = np.asarray(increment_packed(x))
    assert struct.unpack("<ii", base64.b64decode(str(out[0]).encode("ascii"))) == (1002, 1003)
