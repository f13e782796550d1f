"""JAX's arrays in and out of colocated, with real JAX on CPU: ``device_put``
and colocated functions take ``jax.Array``s, functions may return them, and
``to_jax`` gives a ``jax.Array`` (without a copy for a buffer in this process's
memory)."""

import textwrap

import numpy as np
import pytest
from test_devices import run_python

import colocated

jax = pytest.importorskip("jax")
jnp = jax.numpy


def test_device_put_of_a_jax_array_keeps_its_device_and_values():
    x = jnp.arange(8, dtype=jnp.float32)
    (jax_device,) = x.devices()
    a = colocated.device_put(x)
    assert isinstance(a, colocated.Array)
    cpu = colocated.devices("cpu")[jax_device.id]
    assert a.sharding == colocated.SingleDeviceSharding(cpu)
    np.testing.assert_array_equal(np.asarray(a), np.arange(8, dtype=np.float32))
    # An explicit device still wins, as for any value.
    b = colocated.device_put(x, colocated.devices()[3])
    assert b.sharding.device_set == {colocated.devices()[3]}
    np.testing.assert_array_equal(np.asarray(b), np.asarray(x))


def test_a_jax_array_on_the_cpu_goes_in_and_back_out_in_place():
    value = np.arange(1 << 18, dtype=np.float32)
    x = jax.device_put(value, jax.devices("cpu")[0])
    a = colocated.from_jax(x)
    assert np.asarray(a).ctypes.data == x.unsafe_buffer_pointer()
    back = colocated.to_jax(a)
    assert back.unsafe_buffer_pointer() == x.unsafe_buffer_pointer()
    # JAX's array may go: the runtime's keeps what it reads.
    x.delete()
    del back
    np.testing.assert_array_equal(np.asarray(a), value)
    # Several devices: one copy, laid out as asked.
    sharding = colocated.NamedSharding(colocated.Mesh(colocated.devices("cpu")[:2], ("x",)), colocated.P("x"))
    split = colocated.device_put(jax.device_put(value), sharding)
    assert [s.data.shape for s in split.addressable_shards] == [(1 << 17,), (1 << 17,)]
    np.testing.assert_array_equal(np.asarray(split), value)


def test_colocated_functions_take_jax_arrays_and_may_return_them():
    import jax as host_jax

    @colocated.colocated_python
    def add_one(v):
        # JAX's arrays in: the function sees them as JAX's arrays.
        assert isinstance(v, host_jax.Array), type(v)
        return v + 1

    x = jnp.arange(4, dtype=jnp.int32)
    out = add_one(x)
    # ... and the caller gets JAX's arrays back, on the same device.
    assert isinstance(out, jax.Array) and out.devices() == x.devices()
    np.testing.assert_array_equal(np.asarray(out), [1, 2, 3, 4])
    assert add_one.cache_info().misses == 1
    # colocated Arrays in: the function gets colocated Arrays, a program of
    # its own.
    @colocated.colocated_python
    def kinds(v):
        return v * 0 + (2 if isinstance(v, host_jax.Array) else 1)

    assert np.asarray(kinds(colocated.device_put(np.zeros(2, np.int32)))).tolist() == [1, 1]
    assert np.asarray(kinds(jnp.zeros(2, jnp.int32))).tolist() == [2, 2]
    assert kinds.cache_info().misses == 2
    # Specialized with JAX's devices, a call without arguments gives JAX's arrays.
    zeros = colocated.colocated_python(lambda: jnp.zeros(3)).specialize(devices=jax.devices("cpu")[:1])
    made = zeros()
    assert isinstance(made, jax.Array) and made.devices() == {jax.devices("cpu")[0]}
    np.testing.assert_array_equal(np.asarray(made), [0, 0, 0])

    @colocated.colocated_python
    def doubled_by_jax(v):
        import jax.numpy as jnp

        return {"twice": jnp.asarray(np.asarray(v)) * 2}

    out = doubled_by_jax(colocated.device_put(np.arange(3, dtype=np.float32)))
    assert isinstance(out["twice"], colocated.Array)
    np.testing.assert_array_equal(np.asarray(out["twice"]), [0, 2, 4])


def test_to_jax_reads_a_buffer_of_this_process_in_place():
    value = np.arange(1 << 16, dtype=np.float32)
    a = colocated.device_put(value, colocated.devices("cpu")[0])
    j = colocated.to_jax(a)
    assert isinstance(j, jax.Array)
    assert j.devices() == {jax.devices("cpu")[0]}
    # The same memory: no copy.
    assert j.unsafe_buffer_pointer() == np.asarray(a).ctypes.data
    np.testing.assert_array_equal(np.asarray(j), value)
    # It stays readable after the colocated array is deleted.
    a.delete()
    np.testing.assert_array_equal(np.asarray(j + 1), value + 1)


def test_jax_devices_and_shardings_place_data():
    value = np.arange(6, dtype=np.int64)
    cpu0 = jax.devices("cpu")[0]
    ours = colocated.devices("cpu")[0]
    for target in [
        cpu0,
        jax.sharding.SingleDeviceSharding(cpu0),
        jax.sharding.NamedSharding(jax.sharding.Mesh([cpu0], ("x",)), jax.sharding.PartitionSpec("x")),
    ]:
        a = colocated.device_put(value, target)
        assert a.sharding.device_set == {ours}, target
        np.testing.assert_array_equal(np.asarray(a), value)
    # A pytree of placements, as device_put takes.
    tree = colocated.device_put({"a": value, "b": value}, {"a": cpu0, "b": colocated.devices()[2]})
    assert tree["a"].sharding.device_set == {ours}
    assert tree["b"].sharding.device_set == {colocated.devices()[2]}
    # colocated_cpu_devices of JAX's devices and meshes answers in JAX's terms.
    assert colocated.colocated_cpu_devices(jax.devices("cpu")) == jax.devices("cpu")
    mesh = jax.sharding.Mesh(jax.devices("cpu")[:1], ("x",))
    cpu_mesh = colocated.colocated_cpu_devices(mesh)
    assert isinstance(cpu_mesh, jax.sharding.Mesh) and cpu_mesh == mesh


def test_jax_specs_declare_and_check_colocated_functions():
    cpu0 = jax.devices("cpu")[0]
    on_cpu0 = jax.sharding.SingleDeviceSharding(cpu0)
    spec = jax.ShapeDtypeStruct((4,), jnp.float32, sharding=on_cpu0)

    @colocated.colocated_python
    def double(v):
        return v * 2

    # out_specs_fn may answer with JAX's specs; in_specs may be JAX's.
    declared = double.specialize(in_specs=((spec,), {}), out_specs_fn=lambda v: spec)
    x = colocated.device_put(np.arange(4, dtype=np.float32), cpu0)
    out = declared(x)
    assert out.sharding == colocated.SingleDeviceSharding(colocated.devices("cpu")[0])
    np.testing.assert_array_equal(np.asarray(out), [0, 2, 4, 6])
    with pytest.raises(colocated.InvalidArgumentError):
        declared(colocated.device_put(np.zeros(3, np.float32), cpu0))
    # Ahead of time, from JAX's specs; colocated's ShapeDtypeStruct takes a JAX sharding.
    compiled = double.specialize(out_specs_fn=lambda v: v).compile(spec)
    assert compiled is not None
    ours = colocated.ShapeDtypeStruct((4,), np.float32, sharding=on_cpu0)
    assert ours.sharding == colocated.SingleDeviceSharding(colocated.devices("cpu")[0])
    with pytest.raises(colocated.InvalidArgumentError, match="colocated's or JAX's"):
        colocated.ShapeDtypeStruct((4,), np.float32, sharding="cpu")


def test_to_jax_puts_on_the_device_given():
    a = colocated.device_put(np.arange(6, dtype=np.int32).reshape(2, 3))
    target = jax.devices("cpu")[0]
    j = colocated.to_jax(a, device=target)
    assert j.devices() == {target} and j.shape == (2, 3)
    np.testing.assert_array_equal(np.asarray(j), np.arange(6).reshape(2, 3))


def test_bad_inputs_get_typed_errors():
    with pytest.raises(colocated.InvalidArgumentError, match="to_jax takes a colocated Array, got str"):
        colocated.to_jax("x")
    with pytest.raises(colocated.InvalidArgumentError, match="device must be a JAX Device or Sharding, got str"):
        colocated.to_jax(colocated.device_put(np.zeros(2)), device="cpu")

    @colocated.colocated_python
    def identity(v):
        return v

    with pytest.raises(colocated.InvalidArgumentError, match="colocated Arrays or jax.Arrays; leaf 0 is a int"):
        identity([1, 2])
    # A device JAX does not have here: a CPU device past JAX's.
    n = len(jax.devices("cpu"))
    client = colocated.Client(num_cpu_devices=n + 1)
    with pytest.raises(colocated.InvalidArgumentError, match=f"JAX has no cpu device with local hardware id {n}"):
        colocated.to_jax(colocated.device_put(np.zeros(2), client.devices("cpu")[n]))


def test_a_worker_s_array_goes_to_jax_with_a_device(cluster):
    cluster(1)
    worker_cpu = colocated.devices("cpu")[0]
    assert worker_cpu.process_index != 0
    a = colocated.device_put(np.arange(5, dtype=np.float64), worker_cpu)
    with pytest.raises(colocated.InvalidArgumentError, match="a worker's device"):
        colocated.to_jax(a)
    j = colocated.to_jax(a, device=jax.devices("cpu")[0])
    np.testing.assert_array_equal(np.asarray(j), np.arange(5))

    # A function on the worker may return JAX's arrays, made by JAX there.
    @colocated.colocated_python
    def plus_one_by_jax(v):
        import jax.numpy as jnp

        return jnp.asarray(np.asarray(v)) + 1

    out = plus_one_by_jax(a)
    assert out.sharding.device_set == {worker_cpu}
    np.testing.assert_array_equal(np.asarray(out), np.arange(1, 6))


def test_sharded_jax_arrays_keep_their_layout_both_ways():
    # JAX with four CPU devices, in a process of its own (JAX's device count
    # is fixed once its backend starts).
    code = textwrap.dedent(
        """
        import jax, numpy as np, colocated
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        colocated.configure(num_cpu_devices=4)
        from jax.sharding import AxisType
        mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("x", "y"), axis_types=(AxisType.Explicit, AxisType.Auto))
        value = np.arange(32, dtype=np.float32).reshape(4, 8)
        x = jax.device_put(value, NamedSharding(mesh, P("x", "y")))
        a = colocated.device_put(x)
        assert isinstance(a.sharding, colocated.NamedSharding), a.sharding
        assert a.sharding.spec == colocated.P("x", "y"), a.sharding
        ours = [[d.id for d in row] for row in a.sharding.mesh.devices]
        assert ours == [[d.id for d in row] for row in mesh.devices], ours
        assert a.sharding.mesh.axis_types == (colocated.AxisType.Explicit, colocated.AxisType.Auto)
        np.testing.assert_array_equal(np.asarray(a), value)

        @colocated.colocated_python
        def negate(v):
            return -v

        back = colocated.to_jax(negate(x))
        assert back.sharding == x.sharding, back.sharding
        np.testing.assert_array_equal(np.asarray(back), -value)
        # JAX's sharding as the placement, and JAX's mesh of CPU devices.
        again = colocated.device_put(value, NamedSharding(mesh, P(None, "y")))
        assert again.sharding == colocated.NamedSharding(a.sharding.mesh, colocated.P(None, "y")), again.sharding
        assert colocated.colocated_cpu_devices(mesh) == mesh
        print("ok")
        """
    )
    result = run_python(code, {"XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "ok", result.stdout


def test_a_jax_device_without_a_counterpart_is_refused():
    code = textwrap.dedent(
        """
        import jax, numpy as np, colocated
        colocated.configure(num_cpu_devices=1)
        x = jax.device_put(np.ones(3), jax.devices()[1])
        try:
            colocated.device_put(x)
        except colocated.InvalidArgumentError as e:
            print("refused:", e)
        """
    )
    result = run_python(code, {"XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"})
    assert result.returncode == 0, result.stderr
    assert "refused:" in result.stdout and "local hardware id 1" in result.stdout, result.stdout


def test_prng_keys_travel_through_functions_on_a_worker(cluster):
    cluster(1)
    worker_cpu = colocated.devices("cpu")[0]
    seeds = colocated.device_put(np.arange(3, dtype=np.uint32), worker_cpu)

    @colocated.colocated_python
    def make_keys(s):
        import jax

        return {"keys": jax.vmap(jax.random.key)(jax.numpy.asarray(np.asarray(s)))}

    @colocated.colocated_python
    def draw(keys):
        import jax

        assert jax.dtypes.issubdtype(keys.dtype, jax.dtypes.prng_key), keys.dtype
        return jax.vmap(lambda k: jax.random.uniform(k, (2,)))(keys)

    # The worker's keys stay there: the caller holds their data and their
    # implementation, and hands them back to the worker as keys.
    keys = make_keys(seeds)["keys"]
    assert isinstance(keys, colocated.PrngKeys)
    assert keys.data.sharding.device_set == {worker_cpu} and keys.data.shape == (3, 2)
    assert keys.impl == jax.random.key(0).dtype._impl
    out = draw(keys)
    assert isinstance(out, colocated.Array) and out.sharding.device_set == {worker_cpu}
    local_keys = jax.vmap(jax.random.key)(jnp.arange(3, dtype=jnp.uint32))
    expected = jax.vmap(lambda k: jax.random.uniform(k, (2,)))(local_keys)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(expected))
    # Brought here, they are JAX's keys again.
    here = jax.random.wrap_key_data(colocated.to_jax(keys.data, device=jax.devices("cpu")[0]), impl=keys.impl)
    assert (jax.random.key_data(here) == jax.random.key_data(local_keys)).all()


def test_jax_in_jax_out_keeps_in_specs_and_jax_devices_on_every_path():
    cpu0 = jax.devices("cpu")[0]
    spec = jax.ShapeDtypeStruct((3,), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(cpu0))

    @colocated.colocated_python
    def add_one(v):
        return v + 1

    # in_specs (JAX's) hold for calls with jax.Arrays and with Arrays alike.
    checked = add_one.specialize(in_specs=((spec,), {}))
    out = checked(jnp.arange(3.0, dtype=jnp.float32))
    assert isinstance(out, jax.Array)
    np.testing.assert_array_equal(np.asarray(out), [1, 2, 3])
    ours = checked(colocated.device_put(np.arange(3, dtype=np.float32), cpu0))
    assert isinstance(ours, colocated.Array)
    with pytest.raises(colocated.InvalidArgumentError):
        checked(jnp.arange(4.0, dtype=jnp.float32))
    # Specialized with JAX's devices: jax.Arrays on every call (the native
    # path included), and after another specialization too.
    on_jax = add_one.specialize(devices=[cpu0])
    a = colocated.device_put(np.zeros(2, np.float32), cpu0)
    assert all(isinstance(on_jax(a), jax.Array) for _ in range(3))
    declared = on_jax.specialize(out_specs_fn=lambda v: v)
    assert all(isinstance(declared(a), jax.Array) for _ in range(3))
    # A spec of PRNG keys is refused with the form keys travel in.
    key_spec = jax.ShapeDtypeStruct.like(jax.random.key(0))
    with pytest.raises(colocated.InvalidArgumentError, match="PrngKeys"):
        add_one.specialize(in_specs=((key_spec,), {}))
