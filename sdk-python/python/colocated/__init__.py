"""colocated: run programs on the hosts that own a set of devices.

The Python SDK of the ``colocated`` runtime, shaped after JAX so that code
written for ``jax.experimental.colocated_python`` ports by changing imports.
This module gives the data plane: devices, meshes and shardings, ``Array``,
``device_put`` and ``device_get``, waiting (blocking, asyncio, ``concurrent.futures``) and the
exception classes; ``colocated_python`` and ``colocated_python_class``; and
``connect`` to drive worker hosts, with ``host_callback`` for functions of the
controller that programs on any host call.

The default client (the local host with CPU devices) is created on first use;
call ``configure(num_cpu_devices=...)`` before that, or set
``COLOCATED_NUM_CPU_DEVICES``; ``connect(...)`` makes a client of worker hosts
the default.
"""

from . import _hooks  # noqa: F401  (registers what the native module calls, first)
from ._array import (
    Array,
    Shard,
    block_until_ready,
    device_get,
    device_put,
    make_array_from_callback,
    make_array_from_single_device_arrays,
    wait,
)
from ._client import (
    client,
    colocated_cpu_devices,
    configure,
    connect,
    default_backend,
    devices,
    find_pjrt_plugin,
    local_devices,
)
from ._colocated import Client, Device, Host, HostEvent, HostStats, __version__
from ._colocated_class import colocated_python_class
from ._colocated_python import ColocatedFunction, clear_caches, colocated_python
from ._errors import (
    AlreadyExistsError,
    CancelledError,
    ColocatedError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    RemoteError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
)
from ._host_callback import HostCallback, host_callback
from ._jax import PrngKeys, from_jax, to_jax
from ._jit import JittedFunction, jit
from ._sharding import (
    AxisType,
    Mesh,
    NamedSharding,
    P,
    PartitionSpec,
    ShapeDtypeStruct,
    Sharding,
    SingleDeviceSharding,
    make_mesh,
)
from ._xla import XlaExecutable, compile_stablehlo, deserialize_and_load

__all__ = [
    "AlreadyExistsError",
    "Array",
    "AxisType",
    "CancelledError",
    "Client",
    "ColocatedError",
    "ColocatedFunction",
    "DeadlineExceededError",
    "Device",
    "FailedPreconditionError",
    "Host",
    "HostCallback",
    "HostEvent",
    "HostStats",
    "InternalError",
    "InvalidArgumentError",
    "JittedFunction",
    "Mesh",
    "NamedSharding",
    "NotFoundError",
    "P",
    "PartitionSpec",
    "PermissionDeniedError",
    "PrngKeys",
    "RemoteError",
    "ResourceExhaustedError",
    "ShapeDtypeStruct",
    "Shard",
    "Sharding",
    "SingleDeviceSharding",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "XlaExecutable",
    "__version__",
    "block_until_ready",
    "clear_caches",
    "client",
    "colocated_cpu_devices",
    "colocated_python",
    "colocated_python_class",
    "compile_stablehlo",
    "configure",
    "connect",
    "default_backend",
    "deserialize_and_load",
    "device_get",
    "device_put",
    "devices",
    "find_pjrt_plugin",
    "from_jax",
    "host_callback",
    "jit",
    "local_devices",
    "make_array_from_callback",
    "make_array_from_single_device_arrays",
    "make_mesh",
    "to_jax",
    "wait",
]
