"""JAX's arrays on a GPU in and out of colocated without a copy, with JAX
and colocated each holding a client of the GPU plugin in this process:
``from_jax`` views JAX's device memory (DLPack), ``to_jax`` gives JAX a view
of the runtime's. Runs where ``COLOCATED_TEST_PJRT=cuda`` and JAX has the
GPU (``tests/gpu/run.sh``); skipped elsewhere."""

import json
import os

import numpy as np
import pytest

import colocated

jax = pytest.importorskip("jax")

PLATFORM = os.environ.get("COLOCATED_TEST_PJRT", "cpu")


@pytest.fixture(scope="module")
def gpu_client():
    if PLATFORM not in ("cuda", "rocm"):
        pytest.skip("needs a GPU plugin: COLOCATED_TEST_PJRT=cuda (tests/gpu/run.sh)")
    try:
        jax.devices(PLATFORM)
    except RuntimeError:
        pytest.skip(f"JAX has no {PLATFORM} backend here")
    options = json.loads(os.environ.get("COLOCATED_TEST_PJRT_OPTIONS", "{}"))
    plugin = colocated.find_pjrt_plugin(PLATFORM)
    return colocated.Client(num_cpu_devices=1, pjrt_plugin=plugin, pjrt_options=list(options.items()))


def test_a_jax_array_on_a_gpu_goes_in_and_back_out_in_place(gpu_client):
    gpu = jax.devices(PLATFORM)[0]
    value = np.arange(1 << 20, dtype=np.float32)
    x = jax.device_put(value, gpu)
    a = colocated.from_jax(x, gpu_client)
    (device,) = a.sharding.device_set
    assert (device.platform, device.local_hardware_id) == (PLATFORM, gpu.local_hardware_id)
    # Back to JAX: the same device memory, both ways.
    back = colocated.to_jax(a)
    assert back.devices() == {gpu}
    assert back.unsafe_buffer_pointer() == x.unsafe_buffer_pointer()
    np.testing.assert_array_equal(np.asarray(back), value)
    # The runtime's XLA program reads JAX's memory; JAX reads its result in place.
    y = colocated.jit(lambda v: v * 2)(a)
    out = colocated.to_jax(y)
    assert out.devices() == {gpu}
    np.testing.assert_array_equal(np.asarray(out), value * 2)
    # JAX's array may be deleted: what the runtime viewed stays readable.
    x.delete()
    del back
    np.testing.assert_array_equal(np.asarray(a)[[0, 1, -1]], value[[0, 1, -1]])


def test_every_width_of_dtype_goes_both_ways_on_a_gpu(gpu_client):
    gpu = jax.devices(PLATFORM)[0]
    value = np.arange(12, dtype=np.int32).reshape(3, 4)
    x = jax.device_put(value, gpu).T
    a = colocated.from_jax(x, gpu_client)
    np.testing.assert_array_equal(np.asarray(a), value.T)
    for dtype in (np.bool_, np.int8, np.uint16, np.float16, np.int64, np.float64):
        v = (np.arange(6) % 2).astype(dtype)
        j = jax.device_put(v, gpu)
        np.testing.assert_array_equal(np.asarray(colocated.to_jax(colocated.from_jax(j, gpu_client))), j)
