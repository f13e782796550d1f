"""What JAX's colocated Python tests import from JAX's own colocated Python,
for ``colocated`` with real JAX (``test_jax_colocated_python_with_jax.py``):
the tests' arrays are ``jax.Array``s on JAX's CPU devices, and ``colocated``
runs the functions on its CPU devices of the same numbers.

- ``test_util``: JAX's ``jax._src.test_util``, whose ``request_cpu_devices``
  also gives the default client that many CPU devices, and whose
  ``count_events`` counts the one event the tests count (a miss of a
  function's cache of specializations) as misses of the cache of compiled
  programs per input spec here, as ``jax_shim`` does.
- ``serialization``: ``_serialize``/``_deserialize`` with cloudpickle,
  JAX's devices by platform and id.
- ``ifrt_programs.make_colocated_python_program``: a colocated Python
  program of JAX specs on JAX's devices.
"""

import contextlib
import io
import pickle
import sys
import types

import cloudpickle
import jax
from jax._src import test_util as _jtu

import colocated
from colocated import _colocated, _colocated_python


def _namespace(name, doc, **attrs):
    module = types.ModuleType(f"{__name__}.{name}", doc)
    module.__dict__.update(attrs)
    sys.modules[module.__name__] = module
    return module


def _request_cpu_devices(n):
    _jtu.request_cpu_devices(n)
    with contextlib.suppress(colocated.FailedPreconditionError):
        colocated.configure(num_cpu_devices=n)


_SPECIALIZATION_MISS = "colocated_python_func._get_specialized_func"


def _count_events(event):
    if event != _SPECIALIZATION_MISS:
        return _jtu.count_events(event)

    @contextlib.contextmanager
    def count_event():
        before = {state: state.cache_info()[1] for state in list(_colocated_python._STATES)}
        yield lambda: sum(state.cache_info()[1] - before.get(state, 0) for state in list(_colocated_python._STATES))

    return count_event


test_util = _namespace("test_util", "jax._src.test_util, with colocated's devices and counters")
test_util.__dict__.update({k: v for k, v in vars(_jtu).items() if not k.startswith("__")})
test_util.request_cpu_devices = _request_cpu_devices
test_util.count_events = _count_events


def _jax_device(platform, device_id):
    return next(d for d in jax.devices(platform) if d.id == device_id)


class _Pickler(cloudpickle.Pickler):
    def reducer_override(self, obj):
        if isinstance(obj, jax.Device):
            return _jax_device, (obj.platform, obj.id)
        return super().reducer_override(obj)


def _serialize(obj) -> bytes:
    buffer = io.BytesIO()
    _Pickler(buffer).dump(obj)
    return buffer.getvalue()


serialization = _namespace(
    "serialization",
    "jax.experimental.colocated_python.serialization: cloudpickle, JAX's devices by platform and id",
    _serialize=_serialize,
    _deserialize=pickle.loads,
)


def _make_colocated_python_program(name, fun, device_list, in_specs, out_specs):
    devices = [colocated.device_put(0, d).sharding._device_assignment[0] for d in device_list]
    return _colocated.Executable.compile(
        name,
        fun,
        [_colocated_python._spec_leaf(s) for s in in_specs],
        [_colocated_python._spec_leaf(s) for s in out_specs],
        devices,
    )


ifrt_programs = _namespace(
    "ifrt_programs", "jax.extend.ifrt_programs", make_colocated_python_program=_make_colocated_python_program
)
