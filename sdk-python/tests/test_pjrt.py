"""PJRT plugins as devices (XLA's CPU plugin from PyPI) and XLA programs on them.

By default the tests run on XLA's CPU plugin with four devices. On a machine
with a GPU, ``COLOCATED_TEST_PJRT=cuda`` runs them on the installed CUDA
plugin's devices, with the create options of ``COLOCATED_TEST_PJRT_OPTIONS``
(JSON), as tests/gpu/run.sh does.
"""

import importlib.util
import json
import os

import ml_dtypes
import numpy as np
import pytest
from test_devices import run_python

import colocated

ADD_ONE = """
module @add_one {
  func.func public @main(%arg0: tensor<8xf32>) -> tensor<8xf32> {
    %c = stablehlo.constant dense<1.0> : tensor<8xf32>
    %0 = stablehlo.add %arg0, %c : tensor<8xf32>
    return %0 : tensor<8xf32>
  }
}
"""

PLATFORM = os.environ.get("COLOCATED_TEST_PJRT", "cpu")
#: The plugin's backend name ("cpu" names the CPU devices colocated Python runs on).
BACKEND = "pjrt_cpu" if PLATFORM == "cpu" else PLATFORM
EXTRA_OPTIONS = json.loads(os.environ.get("COLOCATED_TEST_PJRT_OPTIONS", "{}"))


def plugin_options(count: int) -> list:
    """Create options: ``count`` devices of XLA's CPU plugin; the given ones for another."""
    if PLATFORM == "cpu":
        return [("cpu_device_count", count)]
    return list(EXTRA_OPTIONS.items())


def sharded_add_one(n: int) -> str:
    """x + 1 over f32[8] split along "x" of an ``n``-device mesh (Shardy, as JAX 0.10 lowers it)."""
    return ADD_ONE_SHARDED.replace("= 4 : i32", f"= {n} : i32").replace('"x"=4', f'"x"={n}')


ADD_ONE_SHARDED = """
module @jit_add_one attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["x"=4]>
  func.func public @main(%arg0: tensor<8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}]>})
      -> (tensor<8xf32> {jax.result_info = "result", sdy.sharding = #sdy.sharding<@mesh, [{"x"}]>}) {
    %c = stablehlo.constant dense<1.0> : tensor<8xf32>
    %0 = stablehlo.add %arg0, %c : tensor<8xf32>
    return %0 : tensor<8xf32>
  }
}
"""


def cpu_plugin() -> str:
    """The plugin under test: XLA's CPU plugin, which `make test` installs (never
    skipped in CI), or the one ``COLOCATED_TEST_PJRT`` names."""
    try:
        return colocated.find_pjrt_plugin(PLATFORM)
    except colocated.NotFoundError:
        if os.environ.get("CI"):
            raise
        pytest.skip("XLA's CPU PJRT plugin is not installed (pip install lammps-jax-pjrt-cpu)")


@pytest.fixture(scope="module")
def client():
    return colocated.Client(num_cpu_devices=2, pjrt_plugin=cpu_plugin(), pjrt_options=plugin_options(4))


def test_the_plugin_is_the_default_backend_beside_the_cpu_devices(client):
    assert client.default_backend() == BACKEND
    plugin = client.devices()
    cpus = client.devices("cpu")
    n = len(plugin)
    assert [d.id for d in cpus] == [0, 1]
    assert [d.id for d in plugin] == list(range(2, 2 + n))
    assert n == 4 or PLATFORM != "cpu"
    for d in plugin:
        assert (d.platform, d.backend) == (PLATFORM, BACKEND)
        assert d.device_kind == "cpu" or (PLATFORM != "cpu" and d.device_kind)
        assert d.default_memory_kind == "device"
    assert [d.local_hardware_id for d in plugin] == list(range(n))
    assert all(d.backend == "cpu" for d in cpus)
    assert client.colocated_cpu_devices(plugin) == [cpus[i % 2] for i in range(n)]
    with pytest.raises(colocated.NotFoundError, match=BACKEND):
        client.devices("tpu")


@pytest.mark.parametrize(
    "dtype",
    [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
    + [np.float16, ml_dtypes.bfloat16, np.float32, np.float64],
)
def test_every_dtype_round_trips_through_a_plugin_device(client, dtype):
    value = (np.arange(12).reshape(3, 4) % 7).astype(dtype)
    x = colocated.device_put(value, client.devices()[-1])
    assert x.sharding.device_set == {client.devices()[-1]}
    out = np.asarray(x)
    assert out.dtype == value.dtype
    np.testing.assert_array_equal(out, value)


def test_strings_stay_on_cpu_devices(client):
    with pytest.raises(colocated.InvalidArgumentError, match="CPU devices only"):
        colocated.device_put(np.array(["a", "b"], dtype=np.dtypes.StringDType()), client.devices()[0])


def test_copies_between_plugin_and_cpu_devices_keep_the_data(client):
    plugin, cpu = client.devices(), client.devices("cpu")
    value = np.linspace(0, 1, 16, dtype=np.float32)
    a = colocated.device_put(value, plugin[0])
    b = colocated.device_put(a, plugin[-1])
    c = colocated.device_put(b, cpu[1])
    d = colocated.device_put(c, plugin[len(plugin) // 2])
    for x, device in [(b, plugin[-1]), (c, cpu[1]), (d, plugin[len(plugin) // 2])]:
        assert x.sharding.device_set == {device}
        np.testing.assert_array_equal(np.asarray(x), value)


def test_add_one_runs_and_results_match_numpy(client):
    f = colocated.compile_stablehlo(ADD_ONE, client.devices()[:1])
    value = np.arange(8, dtype=np.float32) / 3
    y = f(colocated.device_put(value, client.devices()[0]))
    np.testing.assert_allclose(np.asarray(y), value + 1)
    # Calls chain without waits; each result is an Array on the plugin device.
    z = f(f(y))
    np.testing.assert_allclose(np.asarray(z), value + 3)
    assert z.sharding.device_set == {client.devices()[0]}
    # A long chain queued without waits, each input deleted once its call is
    # queued: on an accelerator each call is queued on a result the device
    # is still making, and the plugin keeps what it still reads.
    w = z
    for _ in range(100):
        previous, w = w, f(w)
        previous.delete()
    np.testing.assert_allclose(np.asarray(w), value + 103)


def test_xla_programs_take_jax_arrays(client):
    jax = pytest.importorskip("jax")
    f = colocated.compile_stablehlo(ADD_ONE, client.devices()[:1])
    y = f(jax.numpy.arange(8, dtype=jax.numpy.float32))
    assert y.sharding.device_set == {client.devices()[0]}
    np.testing.assert_array_equal(np.asarray(y), np.arange(1, 9, dtype=np.float32))
    if len(client.devices()) >= 2:
        spmd = colocated.compile_stablehlo(sharded_add_one(2), client.devices()[:2])
        with pytest.raises(colocated.InvalidArgumentError, match="runs on 2 devices: device_put it"):
            spmd(jax.numpy.zeros(8, dtype=jax.numpy.float32))
    with pytest.raises(colocated.InvalidArgumentError, match=r"or a jax.Array, got list"):
        f([1.0] * 8)


def test_jit_traces_with_jax_and_runs_on_the_arguments_devices(client):
    jax = pytest.importorskip("jax")
    device = client.devices()[0]
    x = colocated.device_put(np.arange(8, dtype=np.float32), device)

    @colocated.jit
    def step(a, b):
        return {"scaled": a * 2 + b.sum(), "mean": a.mean()}

    out = step(x, x)
    assert out["scaled"].sharding.device_set == {device}
    np.testing.assert_allclose(np.asarray(out["scaled"]), np.arange(8) * 2 + 28)
    np.testing.assert_allclose(np.asarray(out["mean"]), 3.5)
    step(x, x)
    assert step.cache_info() == (1, 1, 1)
    # Another shape after the last call's: compiled for it, then both hit.
    y = colocated.device_put(np.ones((2, 2), dtype=np.float32), device)
    np.testing.assert_allclose(np.asarray(step(y, y)["scaled"]), np.full((2, 2), 6.0))
    np.testing.assert_allclose(np.asarray(step(x, x)["mean"]), 3.5)
    np.testing.assert_allclose(np.asarray(step(y, y)["mean"]), 1.0)
    assert step.cache_info() == (3, 2, 2)
    # Another shape compiles again; a jax.Array or numpy argument goes to the
    # default backend's first device (this client's is not the default one:
    # in_shardings says where).
    to_device = colocated.SingleDeviceSharding(device)
    again = colocated.jit(lambda a: a + 1, in_shardings=to_device)
    np.testing.assert_array_equal(np.asarray(again(jax.numpy.ones((2, 3)))), np.full((2, 3), 2.0))
    assert again(np.zeros(4, np.float32)).sharding.device_set == {device}
    assert again.cache_info() == (0, 2, 2)
    # Static arguments are baked in, one program per value.
    scale = colocated.jit(lambda a, n: a * n, static_argnums=1)
    np.testing.assert_array_equal(np.asarray(scale(x, 3)), np.arange(8) * 3)
    np.testing.assert_array_equal(np.asarray(scale(x, 4)), np.arange(8) * 4)
    assert scale.cache_info() == (0, 2, 2)
    with pytest.raises(colocated.InvalidArgumentError, match="static arguments must be hashable"):
        scale(x, [1])
    rows = colocated.jit(lambda a, n: a.reshape(n, -1), static_argnums=-1)
    assert rows(x, 2).shape == (2, 4)
    # clear_caches() reaches jitted functions too: the next call compiles.
    colocated.clear_caches()
    assert step.cache_info() == (0, 0, 0)
    np.testing.assert_allclose(np.asarray(step(x, x)["mean"]), 3.5)
    assert step.cache_info() == (0, 1, 1)


def test_jit_types_and_places_values_as_jax_jit_does(client):
    pytest.importorskip("jax")
    device = client.devices()[-1]
    x = colocated.device_put(np.arange(8, dtype=np.float32), device)
    # A Python scalar is weakly typed (the result stays float32) and goes
    # where the Array arguments are; numpy's float64 becomes float32 there.
    times = colocated.jit(lambda a, b: a * b)
    out = times(x, 2.0)
    assert out.dtype == np.float32 and out.sharding.device_set == {device}
    np.testing.assert_array_equal(np.asarray(out), np.arange(8) * 2)
    out = times(x, np.full(8, 0.5))
    assert out.dtype == np.float32 and out.sharding.device_set == {device}
    # An Array of a 64-bit type runs as it is.
    wide = colocated.device_put(np.arange(8), device)
    out = colocated.jit(lambda a: a + 1)(wide)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(np.asarray(out), np.arange(1, 9))


def test_jit_takes_its_tree_keys_from_core(client):
    pytest.importorskip("jax")
    from colocated import _colocated

    x = colocated.device_put(np.arange(8, dtype=np.float32), client.devices()[0])
    # A call of positional arrays alone takes core's flat key; a weakly typed
    # scalar, a keyword or a static value makes another form, whose key core
    # hands out: unique in the process, so two functions' never meet (as a
    # count of each function's own forms would, from 0 in each).
    times = colocated.jit(lambda a, b: a * b)
    times(x, x)
    times(x, 2.0)
    times(x, b=x)
    plus = colocated.jit(lambda a, b: a + b)
    plus(x, 2.0)
    plus(x, b=x)
    flat = _colocated.flat_tree_key(2)
    assert list(times._tree_keys.values()).count(flat) == 1
    others = [k for f in (times, plus) for k in f._tree_keys.values() if k != flat]
    assert len(others) == 4 == len(set(others))
    assert _colocated.new_tree_key() > max(others)
    # Equal forms still share their program: hits and misses as before.
    times(x, 3.0)
    times(x, b=x)
    assert times.cache_info() == (2, 3, 3)


def test_jit_runs_an_spmd_program_over_the_arguments_mesh(client):
    pytest.importorskip("jax")
    if len(client.devices()) < 2:
        pytest.skip("one plugin device: an SPMD program needs two")
    mesh = colocated.Mesh(client.devices()[:2], ("x",))
    split = colocated.NamedSharding(mesh, colocated.P("x"))
    x = colocated.device_put(np.arange(8, dtype=np.float32), split)
    # Results are replicated over the mesh unless out_shardings says otherwise.
    total = colocated.jit(lambda a: a * 2 + a.sum())(x)
    assert total.sharding == colocated.NamedSharding(mesh, colocated.P())
    np.testing.assert_array_equal(np.asarray(total), np.arange(8) * 2 + 28)
    # A scalar goes over the mesh with them, replicated.
    np.testing.assert_array_equal(np.asarray(colocated.jit(lambda a, b: a * b)(x, 3)), np.arange(8) * 3)
    plus = colocated.jit(lambda a: a + 1, out_shardings=split)(x)
    assert plus.sharding == split
    np.testing.assert_array_equal(np.asarray(plus.addressable_shards[1].data), np.arange(4, 8) + 1)
    # Arguments on two meshes, or on this runtime's CPU devices, are refused.
    other = colocated.device_put(np.zeros(8, np.float32), colocated.NamedSharding(
        colocated.Mesh(client.devices()[2:4], ("x",)), colocated.P("x")))
    with pytest.raises(colocated.InvalidArgumentError, match="over one mesh"):
        colocated.jit(lambda a, b: a + b)(x, other)
    on_cpu = colocated.device_put(np.zeros(8, np.float32), client.devices("cpu")[0])
    with pytest.raises(colocated.InvalidArgumentError, match="this runtime's CPU devices"):
        colocated.jit(lambda a: a + 1)(on_cpu)


def test_an_xla_program_refuses_an_input_in_host_memory(client):
    f = colocated.compile_stablehlo(ADD_ONE, client.devices()[:1])
    device = client.devices()[0]
    if "pinned_host" not in device.memory_kinds:
        pytest.skip("the plugin's devices have no pinned_host memory")
    pinned = colocated.device_put(
        np.arange(8, dtype=np.float32), colocated.SingleDeviceSharding(device, memory_kind="pinned_host")
    )
    with pytest.raises(colocated.InvalidArgumentError, match="argument 0 is in pinned_host memory but the program takes it in device memory"):
        np.asarray(f(pinned))
    # Copied to the device's memory, it runs.
    np.testing.assert_array_equal(np.asarray(f(colocated.device_put(pinned, device))), np.arange(1, 9))


def test_numpy_views_a_host_platform_plugin_buffer_in_place(client):
    device = client.devices()[0]
    value = np.arange(1 << 20, dtype=np.float32)
    x = colocated.device_put(value, device)
    y = colocated.compile_stablehlo(ADD_ONE.replace("tensor<8x", f"tensor<{1 << 20}x"), [device])(x)
    for array, expected in ((x, value), (y, value + 1)):
        a, b = np.asarray(array), np.asarray(array)
        np.testing.assert_array_equal(a, expected)
        assert not a.flags.writeable
        # XLA's CPU plugin keeps its buffers in host memory: numpy views them
        # (both reads see the same bytes); an accelerator's are copied.
        assert np.shares_memory(a, b) == (PLATFORM == "cpu")
        array.delete()
        # A view keeps the plugin's buffer pinned past the delete.
        np.testing.assert_array_equal(a[[0, 1, -1]], expected[[0, 1, -1]])


def test_a_result_the_module_lays_out_column_major_reads_row_major(client):
    module = ADD_ONE.replace("tensor<8xf32>", "tensor<2x4xf32>").replace(
        ") -> tensor<2x4xf32> {", ') -> (tensor<2x4xf32> {mhlo.layout_mode = "{0,1}"}) {'
    )
    assert "layout_mode" in module
    device = client.devices()[0]
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    y = colocated.compile_stablehlo(module, [device])(colocated.device_put(x, device))
    a = np.asarray(y)
    np.testing.assert_array_equal(a, x + 1)
    # Not a view of the plugin's column-major bytes: a row-major copy.
    assert not np.shares_memory(a, np.asarray(y))


def test_a_sharded_program_runs_over_all_plugin_devices(client):
    n = next(k for k in (8, 4, 2, 1) if k <= len(client.devices()))
    if n == 1:
        pytest.skip("one plugin device: an SPMD program needs two")
    devices = client.devices()[:n]
    f = colocated.compile_stablehlo(sharded_add_one(n), devices)
    assert f.devices == devices
    mesh = colocated.Mesh(devices, ("x",))
    sharding = colocated.NamedSharding(mesh, colocated.P("x"))
    x = colocated.device_put(np.arange(8, dtype=np.float32), sharding)
    y = f(x)
    np.testing.assert_array_equal(np.asarray(y), np.arange(1, 9, dtype=np.float32))
    assert [s.device for s in y.addressable_shards] == devices
    per = 8 // n
    np.testing.assert_array_equal(np.asarray(y.addressable_shards[1].data), np.arange(per, 2 * per) + 1.0)


def test_an_xla_program_and_colocated_python_feed_each_other(client):
    plugin = client.devices()[0]
    cpu = client.colocated_cpu_devices([plugin])[0]
    f = colocated.compile_stablehlo(ADD_ONE, [plugin])

    @colocated.colocated_python
    def double(x):
        return x * 2

    value = np.arange(8, dtype=np.float32)
    a = f(colocated.device_put(value, plugin))
    b = double(colocated.device_put(a, cpu))
    c = f(colocated.device_put(b, plugin))
    np.testing.assert_array_equal(np.asarray(c), (value + 1) * 2 + 1)

    @colocated.colocated_python
    def fail(x):
        raise ValueError("the CPU step failed on purpose")

    broken = fail.specialize(out_specs_fn=lambda s: s)(colocated.device_put(a, cpu))
    last = f(colocated.device_put(broken, plugin))
    with pytest.raises(Exception, match="failed on purpose"):
        np.asarray(last)


def test_bad_modules_and_arguments_get_typed_errors(client):
    plugin = client.devices()
    with pytest.raises(colocated.InvalidArgumentError):
        colocated.compile_stablehlo(
            "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> { this is not stablehlo }", plugin[:1]
        )
    with pytest.raises(colocated.InvalidArgumentError, match="@main"):
        colocated.compile_stablehlo("not mlir", plugin[:1])
    with pytest.raises(colocated.InvalidArgumentError, match="CPU devices"):
        colocated.compile_stablehlo(ADD_ONE, client.devices("cpu")[:1])
    with pytest.raises(colocated.InvalidArgumentError, match="4 device"):
        colocated.compile_stablehlo(ADD_ONE_SHARDED, plugin[:1])
    with pytest.raises(colocated.UnimplementedError, match="text"):
        colocated.compile_stablehlo(b"ML\xefR\xff\x00", plugin[:1])
    f = colocated.compile_stablehlo(ADD_ONE, plugin[:1])
    with pytest.raises(colocated.InvalidArgumentError):
        f(colocated.device_put(np.zeros(8, np.int32), plugin[0]))
    with pytest.raises(colocated.InvalidArgumentError):
        f(colocated.device_put(np.zeros(4, np.float32), plugin[0]))
    with pytest.raises(colocated.InvalidArgumentError):
        f(np.zeros(8, np.float32))


def test_a_missing_or_foreign_plugin_is_a_typed_error(tmp_path):
    with pytest.raises(colocated.NotFoundError, match="does not exist"):
        colocated.Client(num_cpu_devices=1, pjrt_plugin=str(tmp_path / "nowhere.so"))
    not_a_library = tmp_path / "plugin.so"
    not_a_library.write_bytes(b"not an ELF file")
    with pytest.raises(colocated.InvalidArgumentError, match="cannot load"):
        colocated.Client(num_cpu_devices=1, pjrt_plugin=str(not_a_library))
    with pytest.raises(colocated.InvalidArgumentError, match="need a PJRT plugin"):
        colocated.Client(num_cpu_devices=1, pjrt_options=[("cpu_device_count", 2)])
    # A name is looked up in PJRT_NAMES_AND_LIBRARY_PATHS (here: none has it).
    with pytest.raises(colocated.NotFoundError, match="no PJRT plugin named 'nosuchplugin'"):
        colocated.Client(num_cpu_devices=1, pjrt_plugin="nosuchplugin")
    with pytest.raises(colocated.InvalidArgumentError, match="cpu_device_count"):
        colocated.Client(num_cpu_devices=1, pjrt_plugin=cpu_plugin(), pjrt_options=[("cpu_device_count", object())])


def test_configure_names_the_plugin_of_the_default_client():
    plugin = cpu_plugin()
    options = dict(plugin_options(2))
    result = run_python(
        f"""
        import numpy as np, colocated
        colocated.configure(num_cpu_devices=1, pjrt_plugin={PLATFORM!r}, pjrt_options={options!r})
        assert colocated.default_backend() == {BACKEND!r}, colocated.default_backend()
        assert len(colocated.devices()) >= 1 and len(colocated.devices("cpu")) == 1
        x = colocated.device_put(np.ones(3, np.float32))
        assert x.sharding.device_set == {{colocated.devices()[0]}}
        print("ok", {plugin!r} != "")
        """
    )
    assert result.returncode == 0, result.stderr
    assert "ok True" in result.stdout
    # The environment names the default client's plugin, by path or by JAX's names.
    code = "import colocated; print(colocated.default_backend(), len(colocated.devices()))"
    by_path = run_python(code, {"COLOCATED_PJRT_PLUGIN": plugin})
    assert by_path.stdout.split()[0] == BACKEND, by_path.stderr
    by_name = run_python(
        code, {"COLOCATED_PJRT_PLUGIN": "xla_cpu", "PJRT_NAMES_AND_LIBRARY_PATHS": f"other:/x.so,xla_cpu:{plugin}"}
    )
    assert by_name.stdout.split()[0] == BACKEND, by_name.stderr
    unknown = run_python(code, {"COLOCATED_PJRT_PLUGIN": "rocm"})
    assert unknown.returncode != 0
    assert "NotFoundError" in unknown.stderr and "rocm" in unknown.stderr


@pytest.mark.parametrize("isolation", ["--shared-interpreter", "--isolate"])
def test_a_python_worker_serves_a_plugin_and_runs_xla_programs(token_file, isolation):
    from workers import Worker

    cpu_plugin()
    options = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in plugin_options(2)]
    args = (isolation, "--pjrt-plugin", PLATFORM, *(a for o in options for a in ("--pjrt-option", o)))
    worker = Worker(token_file, devices=1, extra_args=args)
    try:
        client = colocated.connect(worker.address, token_file=token_file, default=False)
        assert client.default_backend() == BACKEND
        plugin = client.devices()
        assert [(d.platform, d.backend) for d in plugin] == [(PLATFORM, BACKEND)] * len(plugin)
        assert len(plugin) == 2 or PLATFORM != "cpu"
        assert [d.backend for d in client.devices("cpu")] == ["cpu"]
        f = colocated.compile_stablehlo(ADD_ONE, plugin[:1])
        value = np.arange(8, dtype=np.float32)
        x = colocated.device_put(value, plugin[0])
        np.testing.assert_array_equal(np.asarray(f(f(x))), value + 2)
        # The worker's colocated Python runs next to the plugin's data.
        cpu = client.colocated_cpu_devices(plugin[:1])[0]

        @colocated.colocated_python
        def negate(a):
            return -a

        back = colocated.device_put(negate(colocated.device_put(f(x), cpu)), plugin[0])
        np.testing.assert_array_equal(np.asarray(f(back)), -(value + 1) + 1)
        # colocated.jit compiles on the worker, for its plugin's devices.
        if importlib.util.find_spec("jax") is not None:
            jitted = colocated.jit(lambda a: (a * 3).sum())
            np.testing.assert_allclose(np.asarray(jitted(x)), value.sum() * 3)
        # The plugin's host memories on the worker, as JAX names them.
        assert plugin[0].memory_kinds == ["device", "pinned_host", "unpinned_host"] or PLATFORM != "cpu"
        assert "pinned_host" in plugin[0].memory_kinds
        pinned = colocated.SingleDeviceSharding(plugin[0], memory_kind="pinned_host")
        offloaded = colocated.device_put(value, pinned)
        assert offloaded.sharding.memory_kind == "pinned_host"
        np.testing.assert_array_equal(np.asarray(offloaded), value)
        on_device = colocated.device_put(offloaded, plugin[0])
        np.testing.assert_array_equal(np.asarray(f(on_device)), value + 1)
        # 256 MiB in and out of the worker's plugin device.
        big = np.arange(64 << 20, dtype=np.float32)
        on_plugin = colocated.device_put(big, plugin[-1])
        np.testing.assert_array_equal(np.asarray(on_plugin)[[0, 1, -1]], big[[0, 1, -1]])
        client.close()
    finally:
        worker.stop()


@pytest.fixture(scope="module")
def two_plugin_hosts(tmp_path_factory):
    """A controller's client of two Python workers, each serving the plugin's
    devices (two of XLA's CPU plugin)."""
    from workers import Worker, write_token

    cpu_plugin()
    pytest.importorskip("jax")
    token_file = tmp_path_factory.mktemp("hosts") / "token"
    write_token(token_file)
    options = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in plugin_options(2)]
    args = ("--shared-interpreter", "--pjrt-plugin", PLATFORM, *(a for o in options for a in ("--pjrt-option", o)))
    workers = [Worker(token_file, devices=1, extra_args=args) for _ in range(2)]
    try:
        client = colocated.connect([w.address for w in workers], token_file=token_file, default=False)
        yield client
        client.close()
    finally:
        for w in workers:
            w.stop()


def _host_mesh(client):
    """The plugin devices of both hosts as a ("hosts", "x") mesh (a single
    GPU per host makes "x" of size 1)."""
    devices = client.devices()
    per_host = len(devices) // 2
    assert [d.process_index for d in devices] == sorted(d.process_index for d in devices)
    return colocated.Mesh(np.array(devices, dtype=object).reshape(2, per_host), ("hosts", "x"))


def test_jit_per_host_runs_on_each_hosts_part_and_assembles_the_outputs(two_plugin_hosts):
    mesh = _host_mesh(two_plugin_hosts)
    rows = 4 * mesh.shape["x"]
    value = np.arange(2 * rows * 3, dtype=np.float32).reshape(2 * rows, 3)
    x = colocated.device_put(value, colocated.NamedSharding(mesh, colocated.P(("hosts", "x"))))
    w = colocated.device_put(np.ones(3, np.float32), colocated.NamedSharding(mesh, colocated.P()))
    step = colocated.jit(lambda a, b: (a * b + a.sum(0), (a.sum() * b)[None]), per_host=True)
    y, total = step(x, w)
    halves = value.reshape(2, rows, 3)
    # Each host saw its half: the column sums are the half's, not the whole's.
    np.testing.assert_array_equal(np.asarray(y), np.concatenate([h + h.sum(0) for h in halves]))
    assert y.sharding == colocated.NamedSharding(mesh, colocated.P("hosts"))
    assert {d.process_index for d in y.sharding.device_set} == {d.process_index for d in mesh.devices.flat}
    # The hosts' parts side by side, along the first axis.
    np.testing.assert_array_equal(np.asarray(total), [[h.sum()] * 3 for h in halves])
    assert total.shape == (2, 3)
    step(x, w)
    assert step.cache_info() == (1, 1, 1)
    # out_shardings that names no host axis: each host's replica (equal here).
    replicated = colocated.NamedSharding(mesh, colocated.P())
    mean = colocated.jit(lambda b: b * 2, per_host=True, out_shardings=replicated)(w)
    assert mean.sharding == replicated
    np.testing.assert_array_equal(np.asarray(mean), [2, 2, 2])


def test_jit_per_host_errors_say_what_a_per_host_program_cannot_do(two_plugin_hosts):
    import jax

    mesh = _host_mesh(two_plugin_hosts)
    rows = 2 * mesh.shape["x"]
    x = colocated.device_put(
        np.ones((2 * rows, 2), np.float32), colocated.NamedSharding(mesh, colocated.P(("hosts", "x")))
    )
    # Without per_host, several hosts are refused: jax.jit's semantics would
    # need communication between them.
    with pytest.raises(colocated.UnimplementedError, match="per_host=True"):
        colocated.jit(lambda a: a + 1)(x)
    # A collective over the host axis.
    with pytest.raises(colocated.UnimplementedError, match="'hosts' across hosts"):
        colocated.jit(lambda a: jax.lax.psum(a, "hosts"), per_host=True)(x)
    # The function's own NameError stays what it is.
    with pytest.raises(NameError, match="hosts_count"):
        colocated.jit(lambda a: a * hosts_count, per_host=True)(x)  # noqa: F821
    # An argument on one device of the mesh is not laid out over it.
    one = colocated.device_put(np.float32(2), mesh.devices.flat[0])
    with pytest.raises(colocated.InvalidArgumentError, match="array argument 1"):
        colocated.jit(lambda a, b: a * b, per_host=True)(x, one)
    # A scalar has no axis to put the hosts' parts along.
    with pytest.raises(colocated.InvalidArgumentError, match="scalar"):
        colocated.jit(lambda a: a.sum(), per_host=True)(x)
    # The host axis after another in a dimension: a host's part is not a block.
    if mesh.shape["x"] > 1:
        strided = colocated.device_put(
            np.ones((2 * rows, 2), np.float32), colocated.NamedSharding(mesh, colocated.P(("x", "hosts")))
        )
        with pytest.raises(colocated.InvalidArgumentError, match="must come first"):
            colocated.jit(lambda a: a + 1, per_host=True)(strided)
    # A mesh whose hosts interleave along its one axis has no block per host.
    devices = list(mesh.devices.T.flat)
    if len(devices) > 2:
        flat = colocated.Mesh(devices, ("d",))
        y = colocated.device_put(np.ones(len(devices), np.float32), colocated.NamedSharding(flat, colocated.P("d")))
        with pytest.raises(colocated.InvalidArgumentError, match="one block of devices per host"):
            colocated.jit(lambda a: a + 1, per_host=True)(y)
    # out_shardings over another mesh.
    other = colocated.NamedSharding(colocated.Mesh(mesh.devices, ("hosts", "y")), colocated.P())
    with pytest.raises(colocated.InvalidArgumentError, match="NamedSharding of the arguments' mesh"):
        colocated.jit(lambda a: a, per_host=True, out_shardings=other)(x)


def test_a_module_that_jax_lowered_runs_with_its_shardings(client):
    from pathlib import Path

    devices = client.devices()
    if len(devices) < 4:
        pytest.skip("the module runs on a 2x2 mesh: four plugin devices")
    module = (Path(__file__).parents[2] / "tests" / "xla" / "jax_step.mlir").read_text()
    step = colocated.compile_stablehlo(module, devices[:4])
    mesh = colocated.Mesh(np.array(devices[:4]).reshape(2, 2), ("data", "model"))
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((8, 4), (4, 6), (6,)))
    P = colocated.P
    args = [
        colocated.device_put(x, colocated.NamedSharding(mesh, P("data", None))),
        colocated.device_put(w, colocated.NamedSharding(mesh, P(None, "model"))),
        colocated.device_put(b, colocated.NamedSharding(mesh, P("model"))),
    ]
    h, total = step(*args)
    expected = np.tanh(x @ w + b)
    np.testing.assert_allclose(np.asarray(h), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(total), np.sum(expected * expected), rtol=1e-5)
    assert h.sharding.spec == P("data", "model")
    assert [s.data.shape for s in h.addressable_shards] == [(4, 3)] * 4
    assert total.is_fully_replicated
    # Arguments of other shardings than the module's are refused.
    with pytest.raises(colocated.InvalidArgumentError):
        step(colocated.device_put(x, colocated.NamedSharding(mesh, P())), *args[1:])


def test_what_jax_lowers_and_exports_compiles_as_given(client):
    jax = pytest.importorskip("jax")
    from jax import export

    def step(x, y):
        return x @ y + 1.0, x.sum()

    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    args = [colocated.device_put(v, client.devices()[0]) for v in (x, x.T)]
    lowered = jax.jit(step).lower(x, x.T)
    exported = export.export(jax.jit(step))(x, x.T)
    for module in (lowered, exported):
        product, total = colocated.compile_stablehlo(module, client.devices()[:1])(*args)
        np.testing.assert_allclose(np.asarray(product), x @ x.T + 1.0)
        np.testing.assert_allclose(np.asarray(total), x.sum())
    # Bytecode is refused with what to give instead.
    with pytest.raises(colocated.UnimplementedError, match="as_text"):
        colocated.compile_stablehlo(exported.mlir_module_serialized, client.devices()[:1])
    with pytest.raises(colocated.InvalidArgumentError, match="Lowered"):
        colocated.compile_stablehlo(42, client.devices()[:1])


def test_a_serialized_xla_program_loads_and_runs_again(client):
    device = client.devices()[0]
    f = colocated.compile_stablehlo(ADD_ONE, [device])
    data = f.serialize()
    assert b"colocated-xla-artifact" in data
    g = colocated.deserialize_and_load(data, client)
    assert g.devices == [device]
    x = colocated.device_put(np.arange(8, dtype=np.float32), device)
    np.testing.assert_array_equal(np.asarray(g(x)), np.arange(1, 9, dtype=np.float32))
    with pytest.raises(colocated.InvalidArgumentError, match="corrupted|truncated"):
        colocated.deserialize_and_load(data[:-5], client)
    with pytest.raises(colocated.InvalidArgumentError):
        colocated.deserialize_and_load("not bytes", client)
