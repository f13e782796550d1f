"""The parts of ``jax`` that JAX's colocated Python tests use, mapped onto
``colocated`` and numpy, so that those tests run here by changing their imports
only (``import jax_shim as jax``, ``from jax_shim import numpy as jnp``, ...).

What has no counterpart here (``jax.jit``, PRNG key arrays) is absent: the tests
that need it are skipped where they are defined, with the reason.

``worker_host()`` runs the tests against the devices of a worker host: it starts
``python -m colocated.worker``, connects a client to it that is *not* the
default one, and makes ``devices()`` and ``local_devices()`` that client's
devices while it lasts. The worker imports this module (and nothing of the test
modules): it is started with this directory on its ``PYTHONPATH``, and the
functions the tests ship to it refer to this module by name.
"""

import contextlib
import os
import sys
import tempfile
import types
import unittest

import cloudpickle
import numpy as np
import optree
from absl.testing import parameterized
from workers import Worker, write_token

import colocated
from colocated import _colocated, _colocated_python

_HERE = os.path.dirname(os.path.abspath(__file__))

#: The client whose devices ``devices()`` gives (None: the default client).
_CLIENT = None


def _namespace(name, doc, **attrs):
    """A module ``jax_shim.<name>`` holding ``attrs`` (registered, so that
    cloudpickle sends it by name and a worker finds it by importing this module)."""
    module = types.ModuleType(f"{__name__}.{name}", doc)
    module.__dict__.update(attrs)
    sys.modules[module.__name__] = module
    return module


# -- jax -------------------------------------------------------------------------------


def _client():
    return _CLIENT if _CLIENT is not None else colocated.client()


def devices(backend=None):
    """``jax.devices()``: the devices of the client in use (see ``worker_host``)."""
    return [d for d in _client().devices() if backend is None or d.platform == backend]


def local_devices(process_index=None, backend=None):
    """``jax.local_devices()``: the devices this process addresses, of the client in use."""
    del process_index
    return [d for d in _client().local_devices() if backend is None or d.platform == backend]


def make_mesh(axis_shapes, axis_names, axis_types=None, *, devices=None):
    """``jax.make_mesh``, by default over the devices of the client in use."""
    if devices is None:
        devices = _client().devices()
    return colocated.make_mesh(axis_shapes, axis_names, axis_types, devices=devices)


Array = colocated.Array
ShapeDtypeStruct = colocated.ShapeDtypeStruct
NamedSharding = colocated.NamedSharding
P = colocated.P
device_put = colocated.device_put
device_get = colocated.device_get
block_until_ready = colocated.block_until_ready
make_array_from_callback = colocated.make_array_from_callback
make_array_from_single_device_arrays = colocated.make_array_from_single_device_arrays


def make_single_device_sharding(device, memory_kind=None):
    """``jax._src.sharding_impls.make_single_device_sharding``."""
    return colocated.SingleDeviceSharding(device, memory_kind=memory_kind)


sharding = _namespace(
    "sharding",
    "jax.sharding",
    AxisType=colocated.AxisType,
    Mesh=colocated.Mesh,
    NamedSharding=colocated.NamedSharding,
    PartitionSpec=colocated.PartitionSpec,
    Sharding=colocated.Sharding,
    SingleDeviceSharding=colocated.SingleDeviceSharding,
)

tree = _namespace(
    "tree",
    "jax.tree",
    map=optree.tree_map,
    leaves=optree.tree_leaves,
    flatten=optree.tree_flatten,
    unflatten=optree.tree_unflatten,
)


def _jnp_array(value, dtype=None):
    return colocated.device_put(np.asarray(value, dtype=dtype))


numpy = _namespace("numpy", "jax.numpy: numpy, whose arrays ``array`` places on the default device", array=_jnp_array)
# Everything else is numpy's (dtypes, issubdtype, ...).
numpy.__getattr__ = lambda name: getattr(np, name)


# -- jax.experimental.colocated_python.serialization and jax.extend.ifrt_programs -------

serialization = _namespace(
    "serialization",
    "jax.experimental.colocated_python.serialization: cloudpickle (devices travel by id)",
    _serialize=cloudpickle.dumps,
    _deserialize=cloudpickle.loads,
)


def _make_colocated_python_program(name, fun, device_list, in_specs, out_specs):
    """A colocated Python program of pickled ``fun`` (compiled: loaded on its hosts)."""
    return _colocated.Executable.compile(
        name,
        fun,
        [_colocated_python._spec_leaf(s) for s in in_specs],
        [_colocated_python._spec_leaf(s) for s in out_specs],
        list(device_list),
    )


ifrt_programs = _namespace(
    "ifrt_programs", "jax.extend.ifrt_programs", make_colocated_python_program=_make_colocated_python_program
)


# -- jax._src.config and jax._src.test_util -----------------------------------------


config = _namespace("config", "jax._src.config", parse_flags_with_absl=lambda: None)


class JaxTestCase(parameterized.TestCase):
    """``jtu.JaxTestCase``: absl's parameterized test case with JAX's array assertions."""

    def assertArraysEqual(self, actual, desired):
        """Same dtype, shape and values."""
        actual = np.asarray(actual)
        desired = np.asarray(desired)
        self.assertEqual(actual.dtype, desired.dtype)
        np.testing.assert_array_equal(actual, desired)


_SPECIALIZATION_MISS = "colocated_python_func._get_specialized_func"


def count_events(event):
    """``jtu.count_events``. The one event JAX's colocated Python tests count,
    a miss of a function's cache of specializations, is a miss of the cache of
    compiled programs per input spec here (``cache_info().misses``), summed over
    every colocated function."""
    if event != _SPECIALIZATION_MISS:
        raise ValueError(f"no counter for the event {event!r}")

    @contextlib.contextmanager
    def count_event():
        before = {state: state.cache_info()[1] for state in list(_colocated_python._STATES)}
        yield lambda: sum(state.cache_info()[1] - before.get(state, 0) for state in list(_colocated_python._STATES))

    return count_event


def _request_cpu_devices(n):
    """``jtu.request_cpu_devices``: the default client gets ``n`` CPU devices
    unless it exists already."""
    with contextlib.suppress(colocated.FailedPreconditionError):
        colocated.configure(num_cpu_devices=n)


test_util = _namespace(
    "test_util",
    "jax._src.test_util",
    JaxTestCase=JaxTestCase,
    JaxTestLoader=unittest.TestLoader,
    count_events=count_events,
    request_cpu_devices=_request_cpu_devices,
    thread_unsafe_test=lambda: (lambda test: test),
)


# -- worker hosts ------------------------------------------------------------------------

@contextlib.contextmanager
def worker_host(num_devices=8):
    """Runs the block against a worker host with ``num_devices`` CPU devices:
    ``devices()`` and ``local_devices()`` give the devices of a client
    connected to it (not the default client). Yields that client."""
    global _CLIENT
    with tempfile.TemporaryDirectory() as tmp:
        token_file = os.path.join(tmp, "token")
        write_token(token_file)
        worker = Worker(token_file, devices=num_devices)
        try:
            client = colocated.connect([worker.address], token_file=token_file, default=False)
            previous, _CLIENT = _CLIENT, client
            try:
                yield client
            finally:
                _CLIENT = previous
        finally:
            worker.stop()
