"""What JAX users expect beyond the colocated Python calls themselves:
``device_get``, shardings that pickle across processes, devices of a client
that is not the default one, memory kinds, ``make_mesh`` with ``AxisType``, and
JAX's words in the errors its tests match."""

import copy
import os
import pickle
import re
import subprocess
import sys
import textwrap

import jax_shim
import numpy as np
import pytest

import colocated
from colocated import AxisType, Mesh, NamedSharding, P, SingleDeviceSharding

JAX_NO_DEVICES = (
    "No devices found. colocated_python function without input arguments must be first specialized with devices."
)

# -- device_get ------------------------------------------------------------------------


def test_device_get_gives_numpy_for_arrays_and_passes_other_leaves():
    mesh = Mesh(colocated.devices()[:4], ("x",))
    sharded = colocated.device_put(np.arange(8.0), NamedSharding(mesh, P("x")))
    scalar = colocated.device_put(np.int32(7))
    host = np.arange(3)
    opaque = object()
    out = colocated.device_get({"a": sharded, "b": [scalar, 3, "s", None], "c": host, "d": opaque})
    assert type(out["a"]) is np.ndarray and out["a"].dtype == np.float64
    np.testing.assert_array_equal(out["a"], np.arange(8.0))
    assert type(out["b"][0]) is np.ndarray and out["b"][0].shape == () and out["b"][0] == 7
    assert out["b"][1:] == [3, "s", None]
    # As jax.device_get: what has __array__ is converted by it, the rest is returned as is.
    assert out["c"] is host and out["d"] is opaque
    assert not out["a"].flags.writeable


def test_device_get_of_a_string_array_and_of_a_shard():
    mesh = Mesh(colocated.devices()[:2], ("x",))
    x = colocated.device_put(np.array(["ab", "cd"], dtype=np.dtypes.StringDType()), NamedSharding(mesh, P("x")))
    np.testing.assert_array_equal(colocated.device_get(x), np.array(["ab", "cd"], dtype=np.dtypes.StringDType()))
    assert colocated.device_get(x.addressable_shards[1].data).tolist() == ["cd"]


def test_device_get_of_a_deleted_array_is_a_typed_error():
    x = colocated.device_put(np.arange(4))
    x.delete()
    with pytest.raises(colocated.FailedPreconditionError, match="was deleted"):
        colocated.device_get([x])


# -- shardings pickled in one process, unpickled in another -----------------------------

_PICKLER = """
import pickle, sys
import numpy as np
import colocated
from colocated import AxisType, Mesh, NamedSharding, P, SingleDeviceSharding
d = colocated.devices()
mesh = Mesh(np.array(d[:4]).reshape(2, 2), ("x", "y"))
objects = [
    mesh,
    NamedSharding(mesh, P("x")),
    NamedSharding(mesh, P(None, ("x", "y")), memory_kind="pinned_host"),
    SingleDeviceSharding(d[7], memory_kind="unpinned_host"),
    Mesh(d[:2], ("long_axis_name",), axis_types=(AxisType.Explicit,)),
    colocated.ShapeDtypeStruct((4, 2), np.float32, NamedSharding(mesh, P("x"))),
]
sys.stdout.buffer.write(pickle.dumps(objects))
"""

_UNPICKLER = """
import pickle, sys
import numpy as np
import colocated
from colocated import AxisType, Mesh, NamedSharding, P, SingleDeviceSharding
d = colocated.devices()
mesh = Mesh(np.array(d[:4]).reshape(2, 2), ("x", "y"))
own = [
    mesh,
    NamedSharding(mesh, P("x")),
    NamedSharding(mesh, P(None, ("x", "y")), memory_kind="pinned_host"),
    SingleDeviceSharding(d[7], memory_kind="unpinned_host"),
    Mesh(d[:2], ("long_axis_name",), axis_types=(AxisType.Explicit,)),
    colocated.ShapeDtypeStruct((4, 2), np.float32, NamedSharding(mesh, P("x"))),
]
theirs = pickle.loads(sys.stdin.buffer.read())
for a, b in zip(theirs, own):
    print(a == b, hash(a) == hash(b), {a: 1}.get(b))
x = colocated.device_put(np.arange(8.0).reshape(4, 2), theirs[1])
print(x.sharding == own[1])
"""


def _python(code, *, seed, num_devices, stdin=None):
    env = dict(os.environ, PYTHONHASHSEED=str(seed), COLOCATED_NUM_CPU_DEVICES=str(num_devices))
    args = [sys.executable, "-c", textwrap.dedent(code)]
    return subprocess.run(args, input=stdin, capture_output=True, env=env, timeout=120, check=False)


def test_meshes_and_shardings_pickled_in_one_process_equal_those_made_in_another():
    pickled = _python(_PICKLER, seed=1, num_devices=8)
    assert pickled.returncode == 0, pickled.stderr.decode()
    # Another string hash: a hash carried in the pickle would differ here.
    unpickled = _python(_UNPICKLER, seed=2, num_devices=8, stdin=pickled.stdout)
    assert unpickled.returncode == 0, unpickled.stderr.decode()
    assert unpickled.stdout.decode().split("\n") == ["True True 1"] * 6 + ["True", ""]


def test_a_pickled_device_that_the_other_process_lacks_is_an_invalid_device_id():
    pickled = _python(_PICKLER, seed=1, num_devices=8)
    assert pickled.returncode == 0, pickled.stderr.decode()
    code = """
    import pickle, sys
    import colocated
    try:
        pickle.loads(sys.stdin.buffer.read())
    except colocated.InvalidArgumentError as e:
        print(isinstance(e, ValueError), e)
    """
    unpickled = _python(code, seed=2, num_devices=4, stdin=pickled.stdout)
    assert unpickled.returncode == 0, unpickled.stderr.decode()
    # JAX's words ("Invalid device ID"), which its tests match.
    assert unpickled.stdout.decode().startswith(
        "True Invalid device ID 7. The client has no such device (its device ids are [0, 1, 2, 3])"
    )


def test_devices_unpickled_in_the_same_process_keep_their_client(worker_client):
    devices = worker_client.devices()
    mesh = Mesh(devices[:2], ("x",), axis_types=AxisType.Explicit)
    sharding = NamedSharding(mesh, P("x"), memory_kind="pinned_host")
    assert pickle.loads(pickle.dumps(devices[1])) == devices[1]
    assert pickle.loads(pickle.dumps(sharding)) == sharding
    assert copy.deepcopy(sharding) == sharding
    # The default client's device 1 is another device.
    assert pickle.loads(pickle.dumps(devices[1])) != colocated.devices()[1]


# -- devices of a client that is not the default one ------------------------------------


@pytest.fixture(scope="module")
def worker_client():
    """A client of one ``python -m colocated.worker`` with 8 CPU devices, made
    with ``connect(..., default=False)``."""
    with jax_shim.worker_host(num_devices=8) as client:
        assert colocated.client() is not client
        yield client


def test_colocated_cpu_devices_of_a_client_that_is_not_the_default(worker_client):
    devices = worker_client.devices()
    assert colocated.colocated_cpu_devices(devices) == devices
    mesh = Mesh(np.array(devices[:4]).reshape(2, 2), ("x", "y"), axis_types=(AxisType.Explicit, AxisType.Auto))
    cpu_mesh = colocated.colocated_cpu_devices(mesh)
    assert cpu_mesh == mesh and cpu_mesh.axis_types == (AxisType.Explicit, AxisType.Auto)
    assert colocated.colocated_cpu_devices([]) == []


def test_devices_of_two_clients_are_an_error(worker_client):
    with pytest.raises(colocated.InvalidArgumentError, match=r"CpuDevice\(id=0\) belongs to another client"):
        colocated.colocated_cpu_devices([worker_client.devices()[1], colocated.devices()[0]])


def test_arrays_on_a_client_that_is_not_the_default(worker_client):
    devices = worker_client.devices()
    sharding = NamedSharding(Mesh(devices[:4], ("x",)), P("x"))
    x = colocated.device_put(np.arange(8), sharding)
    y = colocated.make_array_from_callback((8,), sharding, lambda index: np.arange(8)[index] * 10)
    z = colocated.make_array_from_single_device_arrays(
        (8,), sharding, [colocated.device_put(np.arange(2) + 2 * i, d) for i, d in enumerate(devices[:4])]
    )
    for array, want in ((x, np.arange(8)), (y, np.arange(8) * 10), (z, np.arange(8))):
        assert array.sharding == sharding
        np.testing.assert_array_equal(colocated.device_get(array), want)
    pinned = colocated.device_put(np.arange(4), SingleDeviceSharding(devices[5], memory_kind="pinned_host"))
    assert pinned.addressable_shards[0].data.sharding.memory_kind == "pinned_host"
    np.testing.assert_array_equal(colocated.device_get(pinned), np.arange(4))


def test_a_function_specialized_with_devices_of_a_client_that_is_not_the_default(worker_client):
    devices = worker_client.devices()
    mesh = Mesh(devices[2:4], ("x",))

    def make():
        # Runs on the worker: its shardings are over the worker's own devices.
        local = colocated.devices()
        return colocated.device_put(np.arange(4), NamedSharding(Mesh(local[2:4], ("x",)), P("x")))

    make = colocated.colocated_python(make).specialize(devices=list(mesh.devices.flat))
    for _ in range(2):
        out = make()
        # An output that has no input's sharding, on one host: it keeps its own.
        assert out.sharding == NamedSharding(mesh, P("x"))
        np.testing.assert_array_equal(colocated.device_get(out), np.arange(4))
    assert make.cache_info().misses == 1


# -- memory kinds --------------------------------------------------------------------------


def test_the_default_memory_kind_is_the_devices_own():
    d = colocated.devices()[0]
    mesh = Mesh(colocated.devices()[:2], ("x",))
    assert d.default_memory_kind == "device"
    assert d.memory_kinds == ["device", "pinned_host", "unpinned_host"]
    assert SingleDeviceSharding(d).memory_kind == "device"
    assert NamedSharding(mesh, P("x")).memory_kind == "device"
    # None means the default, as in JAX.
    assert NamedSharding(mesh, P("x")) == NamedSharding(mesh, P("x"), memory_kind="device")
    assert colocated.device_put(np.arange(2)).sharding.memory_kind == "device"


def test_with_memory_kind_gives_an_unequal_sharding_of_that_kind():
    d = colocated.devices()[0]
    mesh = Mesh(colocated.devices()[:2], ("x",))
    for sharding in (SingleDeviceSharding(d), NamedSharding(mesh, P("x"))):
        pinned = sharding.with_memory_kind("pinned_host")
        assert type(pinned) is type(sharding) and pinned.memory_kind == "pinned_host"
        assert pinned != sharding and hash(pinned) != hash(sharding)
        assert pinned == sharding.with_memory_kind("pinned_host")
        assert not pinned.is_equivalent_to(sharding, 1)
        assert pickle.loads(pickle.dumps(pinned)) == pinned
        assert "memory_kind=pinned_host" in repr(pinned)


@pytest.mark.parametrize("kind", ["pinned_host", "unpinned_host", "device"])
def test_device_put_places_buffers_in_the_memory_kind(kind):
    mesh = Mesh(colocated.devices()[:4], ("x",))
    sharding = NamedSharding(mesh, P("x"), memory_kind=kind)
    for value in (np.arange(8.0), np.arange(4096.0), np.array(list("abcdefgh"), dtype=np.dtypes.StringDType())):
        x = colocated.device_put(value, sharding)
        assert x.sharding is sharding
        # The shards report the memory space their buffers are in.
        assert [s.data.sharding.memory_kind for s in x.addressable_shards] == [kind] * 4
        np.testing.assert_array_equal(colocated.device_get(x), value)
    y = colocated.device_put(np.arange(8.0), sharding) + 1
    assert y.sharding.memory_kind == kind
    assert [s.data.sharding.memory_kind for s in y.addressable_shards] == [kind] * 4
    z = colocated.make_array_from_callback((8,), sharding, lambda index: np.arange(8.0)[index])
    assert [s.data.sharding.memory_kind for s in z.addressable_shards] == [kind] * 4


def test_device_put_moves_an_array_to_another_memory_kind():
    d = colocated.devices()[0]
    x = colocated.device_put(np.arange(3), d)
    y = colocated.device_put(x, SingleDeviceSharding(d, memory_kind="pinned_host"))
    assert y.sharding.memory_kind == "pinned_host"
    assert y.addressable_shards[0].data.sharding.memory_kind == "pinned_host"
    back = colocated.device_put(y, SingleDeviceSharding(d))
    assert back.addressable_shards[0].data.sharding.memory_kind == "device"
    np.testing.assert_array_equal(colocated.device_get(back), np.arange(3))


def test_make_array_from_single_device_arrays_checks_the_memory_kind():
    devices = colocated.devices()[:2]
    sharding = NamedSharding(Mesh(devices, ("x",)), P("x"), memory_kind="pinned_host")
    pinned = [
        colocated.device_put(np.arange(2) + 2 * i, SingleDeviceSharding(d, memory_kind="pinned_host"))
        for i, d in enumerate(devices)
    ]
    x = colocated.make_array_from_single_device_arrays((4,), sharding, pinned)
    assert x.sharding == sharding
    np.testing.assert_array_equal(colocated.device_get(x), np.arange(4))
    plain = [colocated.device_put(np.arange(2), d) for d in devices]
    message = "array 0 is in device memory but the sharding's memory kind is pinned_host"
    with pytest.raises(colocated.InvalidArgumentError, match=message):
        colocated.make_array_from_single_device_arrays((4,), sharding, plain)


def test_an_unknown_memory_kind_is_a_value_error_listing_the_devices_kinds():
    d = colocated.devices()[0]
    message = re.escape(
        "Could not find memory addressable by device cpu. Device cpu can address the following memory kinds: "
        "device, pinned_host, unpinned_host. Got memory kind: hbm"
    )
    for make in (
        lambda: SingleDeviceSharding(d, memory_kind="hbm"),
        lambda: NamedSharding(Mesh([d], ("x",)), P(), memory_kind="hbm"),
        lambda: SingleDeviceSharding(d).with_memory_kind("hbm"),
    ):
        with pytest.raises(colocated.InvalidArgumentError, match=message) as info:
            make()
        assert isinstance(info.value, ValueError)
    with pytest.raises(colocated.InvalidArgumentError, match="memory_kind must be a string, got int"):
        SingleDeviceSharding(d, memory_kind=1)


# -- make_mesh and AxisType ------------------------------------------------------------


def test_make_mesh_takes_the_first_devices_in_order_with_explicit_axes():
    devices = colocated.devices()
    mesh = colocated.make_mesh((2, 3), ("x", "y"))
    assert mesh.devices.shape == (2, 3) and list(mesh.devices.flat) == devices[:6]
    assert mesh.axis_names == ("x", "y") and mesh.axis_types == (AxisType.Explicit, AxisType.Explicit)
    mesh = colocated.make_mesh((2,), ("x",), (AxisType.Manual,), devices=devices[4:])
    assert list(mesh.devices.flat) == devices[4:6] and mesh.axis_types == (AxisType.Manual,)
    assert colocated.make_mesh(np.array([4]), "x").shape == {"x": 4}


def test_mesh_axis_types_default_to_auto_and_count_in_equality():
    devices = colocated.devices()[:2]
    assert Mesh(devices, ("x",)).axis_types == (AxisType.Auto,)
    explicit = Mesh(devices, ("x",), axis_types=(AxisType.Explicit,))
    assert explicit.axis_types == (AxisType.Explicit,)
    assert Mesh(devices, ("x",), AxisType.Explicit) == explicit
    assert explicit != Mesh(devices, ("x",))
    assert NamedSharding(explicit, P("x")) != NamedSharding(Mesh(devices, ("x",)), P("x"))
    assert [t.name for t in AxisType] == ["Auto", "Explicit", "Manual"]
    assert repr(AxisType.Explicit) == "Explicit"


def test_make_mesh_and_axis_type_errors():
    message = re.escape("Number of devices 8 must be >= the product of mesh_shape (4, 4)")
    with pytest.raises(colocated.InvalidArgumentError, match=message) as info:
        colocated.make_mesh((4, 4), ("x", "y"))
    assert isinstance(info.value, ValueError)
    with pytest.raises(colocated.InvalidArgumentError, match="should be a sequence of ints. Got 4"):
        colocated.make_mesh(4, ("x",))
    for sizes in [(-1,), (0, 2), (-2, -2)]:
        with pytest.raises(colocated.InvalidArgumentError, match="must be positive"):
            colocated.make_mesh(sizes, ("x", "y")[: len(sizes)])
    message = "Number of axis names should match the number of axis_types"
    with pytest.raises(colocated.InvalidArgumentError, match=message):
        Mesh(colocated.devices()[:2], ("x",), axis_types=(AxisType.Auto, AxisType.Auto))
    message = "axis_types must be colocated.AxisType values, got 'Auto'"
    with pytest.raises(colocated.InvalidArgumentError, match=message):
        Mesh(colocated.devices()[:2], ("x",), axis_types=("Auto",))


# -- JAX's words -----------------------------------------------------------------------


def test_a_call_without_arrays_or_devices_fails_with_jaxs_message():
    @colocated.colocated_python
    def make_zero():
        return colocated.device_put(np.int32(0))

    with pytest.raises(colocated.InvalidArgumentError, match=f"^{re.escape(JAX_NO_DEVICES)}$") as info:
        make_zero()
    assert isinstance(info.value, ValueError)

    @colocated.colocated_python_class
    class Object:
        def fetch(self):
            return colocated.device_put(np.int32(1))

    with pytest.raises(colocated.InvalidArgumentError, match=f"^{re.escape(JAX_NO_DEVICES)}$"):
        Object().fetch()


def test_specializing_a_field_twice_fails_with_jaxs_message():
    f = colocated.colocated_python(lambda: None).specialize(devices=colocated.devices()[:1])
    with pytest.raises(colocated.InvalidArgumentError, match="^devices already specified$"):
        f.specialize(devices=colocated.devices()[:1])
