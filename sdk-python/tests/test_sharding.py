import numpy as np
import pytest

import colocated
from colocated import Mesh, NamedSharding, P, PartitionSpec, ShapeDtypeStruct, SingleDeviceSharding


def test_partition_spec_is_a_tuple_like_jax():
    spec = P("x", None, ("x", "y"))
    assert PartitionSpec is P
    assert isinstance(spec, tuple)
    assert tuple(spec) == ("x", None, ("x", "y"))
    assert repr(spec) == "PartitionSpec('x', None, ('x', 'y'))"
    assert P("x") == P("x", None) and hash(P("x")) == hash(P("x", None))
    assert P(("x",)) == P("x")
    assert P() == P(None)


def test_partition_spec_rejects_other_entries():
    with pytest.raises(colocated.InvalidArgumentError, match="entries must be None, an axis name or a tuple"):
        P(1)


def test_mesh_shape_devices_and_axis_names(mesh):
    assert mesh.shape == {"x": 2, "y": 2}
    assert mesh.axis_names == ("x", "y")
    assert isinstance(mesh.devices, np.ndarray) and mesh.devices.shape == (2, 2)
    assert mesh.size == 4
    assert list(mesh.devices.flat) == colocated.devices()[:4]


def test_mesh_rank_must_match_axis_names():
    with pytest.raises(colocated.InvalidArgumentError, match="rank 1 but 2 axis names"):
        Mesh(colocated.devices()[:4], ("x", "y"))


def test_mesh_rejects_repeated_devices_and_non_devices():
    d = colocated.devices()
    with pytest.raises(colocated.InvalidArgumentError, match="a device appears twice in the mesh"):
        Mesh([d[0], d[0]], ("x",))
    with pytest.raises(colocated.InvalidArgumentError, match="mesh entries must be devices, got int"):
        Mesh([0, 1], ("x",))


def test_named_sharding_devices_in_mesh_order(mesh):
    s = NamedSharding(mesh, P("x"))
    assert s._device_assignment == tuple(colocated.devices()[:4])
    assert s.devices == s._device_assignment
    assert s.device_set == set(colocated.devices()[:4])
    assert s.num_devices == 4
    assert not s.is_fully_replicated
    assert NamedSharding(mesh, P()).is_fully_replicated


def test_named_sharding_equality_and_hash(mesh):
    a = NamedSharding(mesh, P("x"))
    b = NamedSharding(Mesh(np.array(colocated.devices()[:4]).reshape(2, 2), ("x", "y")), P("x", None))
    assert a == b and hash(a) == hash(b)
    assert a != NamedSharding(mesh, P("y"))
    assert len({a, b}) == 1


def test_named_sharding_rejects_unknown_axes(mesh):
    with pytest.raises(colocated.InvalidArgumentError, match="names axis 'z', which is not a mesh axis"):
        NamedSharding(mesh, P("z"))


def test_axis_used_twice_is_rejected_by_core(mesh):
    with pytest.raises(colocated.InvalidArgumentError, match="mesh axis 'x' is used twice in the partition spec"):
        NamedSharding(mesh, P("x", "x")).shard_shape((4, 4))


def test_shard_shape_and_uneven_split(mesh):
    s = NamedSharding(mesh, P(("x", "y")))
    assert s.shard_shape((8, 3)) == (2, 3)
    with pytest.raises(colocated.InvalidArgumentError, match="dimension 0 of size 6 does not split evenly into 4 parts") as info:
        s.shard_shape((6,))
    assert isinstance(info.value, ValueError)


def test_devices_indices_map(mesh):
    s = NamedSharding(mesh, P(None, "y"))
    m = s.devices_indices_map((2, 4))
    d = colocated.devices()
    assert m[d[0]] == (slice(0, 2), slice(0, 2))
    assert m[d[1]] == (slice(0, 2), slice(2, 4))
    assert m[d[2]] == (slice(0, 2), slice(0, 2))
    assert m[d[3]] == (slice(0, 2), slice(2, 4))


def test_single_device_sharding():
    d = colocated.devices()[2]
    s = SingleDeviceSharding(d)
    assert s.device_set == {d}
    assert s._device_assignment == (d,)
    assert s == SingleDeviceSharding(colocated.devices()[2])
    assert hash(s) == hash(SingleDeviceSharding(d))
    assert s.is_fully_replicated
    assert s.shard_shape((3, 5)) == (3, 5)
    with pytest.raises(colocated.InvalidArgumentError, match="needs a device, got str"):
        SingleDeviceSharding("cpu:0")


def test_shape_dtype_struct(mesh):
    s = NamedSharding(mesh, P("x"))
    spec = ShapeDtypeStruct((4, 2), np.float32, sharding=s)
    assert spec.shape == (4, 2) and spec.dtype == np.dtype("float32") and spec.sharding is s
    assert spec.ndim == 2 and spec.size == 8
    assert spec == ShapeDtypeStruct([4, 2], "float32", s)
    assert ShapeDtypeStruct((2,), str).dtype == np.dtypes.StringDType()
    with pytest.raises(colocated.InvalidArgumentError, match="dtype complex64 is not supported"):
        ShapeDtypeStruct((2,), np.complex64)


def test_clear_caches_keeps_shardings_and_arrays_working(mesh):
    s = NamedSharding(mesh, P("x"))
    x = colocated.device_put(np.arange(4), s)
    s.devices_indices_map((4,))
    colocated.clear_caches()
    colocated.clear_caches()
    assert (np.asarray(x + 1) == np.arange(1, 5)).all()
    assert NamedSharding(mesh, P("x")).shard_shape((4,)) == (2,)
