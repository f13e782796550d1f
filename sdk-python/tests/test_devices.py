import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import colocated


def run_python(code: str, env_extra=None) -> subprocess.CompletedProcess:
    import os

    env = {k: v for k, v in os.environ.items() if k != "COLOCATED_NUM_CPU_DEVICES"}
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def test_devices_follow_the_configured_count_in_id_order():
    devices = colocated.devices()
    assert [d.id for d in devices] == list(range(8))
    assert colocated.local_devices() == devices
    assert colocated.client().platform_name == "colocated"


def test_device_attributes_match_jax():
    d = colocated.devices()[3]
    assert d.id == 3
    assert d.platform == "cpu"
    assert d.device_kind == "cpu"
    assert d.process_index == 0
    assert d.local_hardware_id == 3
    assert repr(d) == "CpuDevice(id=3)"
    assert d.debug_string() == "cpu:3 (process 0, host 0, local 3)"


def test_devices_are_equal_and_hashed_by_id():
    a, b = colocated.devices()[2], colocated.devices()[2]
    assert a == b and hash(a) == hash(b) == 2
    assert a != colocated.devices()[1]
    assert a != 2
    assert len({*colocated.devices(), *colocated.devices()}) == 8


def test_devices_pickle_as_global_ids():
    d = colocated.devices()[5]
    assert pickle.loads(pickle.dumps(d)) == d


def test_colocated_cpu_devices_maps_cpu_devices_to_themselves():
    devices = colocated.devices()[:3][::-1]
    assert colocated.colocated_cpu_devices(devices) == devices


def test_colocated_cpu_devices_of_a_mesh_keeps_shape_and_axis_names(mesh):
    cpu_mesh = colocated.colocated_cpu_devices(mesh)
    assert isinstance(cpu_mesh, colocated.Mesh)
    assert cpu_mesh == mesh
    assert cpu_mesh.axis_names == ("x", "y")
    assert cpu_mesh.devices.shape == (2, 2)


def test_colocated_cpu_devices_rejects_non_devices():
    with pytest.raises(colocated.InvalidArgumentError, match="expects devices or a Mesh, got int"):
        colocated.colocated_cpu_devices([1, 2])


def test_configure_after_first_use_is_a_failed_precondition():
    colocated.devices()
    with pytest.raises(colocated.FailedPreconditionError) as info:
        colocated.configure(num_cpu_devices=2)
    assert isinstance(info.value, RuntimeError)
    assert info.value.code == "failed_precondition"
    assert "must be called before the first use" in str(info.value)
    assert "already exists with 8 devices" in str(info.value)


def test_configure_rejects_non_positive_counts():
    with pytest.raises(colocated.InvalidArgumentError, match="num_cpu_devices must be a positive integer, got 0"):
        colocated.configure(num_cpu_devices=0)


def test_configure_before_first_use_sets_the_device_count():
    out = run_python(
        """
        import colocated
        colocated.configure(num_cpu_devices=3)
        print([d.id for d in colocated.devices()])
        """,
        {"COLOCATED_NUM_CPU_DEVICES": "5"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[0, 1, 2]"


def test_environment_variable_sets_the_device_count():
    out = run_python("import colocated; print(len(colocated.devices()))", {"COLOCATED_NUM_CPU_DEVICES": "5"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "5"


def test_bad_environment_variable_is_an_invalid_argument():
    out = run_python(
        """
        import colocated
        try:
            colocated.devices()
        except ValueError as e:
            print(type(e).__name__, e)
        """,
        {"COLOCATED_NUM_CPU_DEVICES": "many"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "InvalidArgumentError COLOCATED_NUM_CPU_DEVICES must be a positive integer, got 'many'"


def test_too_many_devices_is_an_invalid_argument_from_core():
    with pytest.raises(colocated.InvalidArgumentError, match="num_cpu_devices must be between 1 and 4096, got 5000"):
        colocated.client().__class__(5000)


def test_mesh_devices_accept_nested_lists_and_arrays():
    d = colocated.devices()
    nested = colocated.Mesh([[d[0], d[1]], [d[2], d[3]]], ("a", "b"))
    from_array = colocated.Mesh(np.array(d[:4]).reshape(2, 2), ("a", "b"))
    assert nested == from_array and hash(nested) == hash(from_array)
    assert nested.shape == {"a": 2, "b": 2}
    assert nested.devices.dtype == object
    assert nested.device_ids.tolist() == [[0, 1], [2, 3]]


def test_the_default_client_is_cores_whoever_changes_it():
    """The package keeps no default client of its own: when core's default
    changes behind it (another SDK of the process, a reset), ``client()``
    follows, with one wrapper per client."""
    from colocated import _colocated

    first = colocated.client()
    assert colocated.client() is first
    other = colocated.Client(num_cpu_devices=2)
    try:
        _colocated.set_default_client(other)
        assert colocated.client() is other
        assert colocated.devices() == other.devices()
        _colocated.set_default_client(None)
        fresh = colocated.client()
        assert fresh.id not in (first.id, other.id)
    finally:
        _colocated.set_default_client(first)
    assert colocated.client() is first
