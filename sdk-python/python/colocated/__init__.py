"""colocated: run programs on the hosts that own a set of devices.

The Python SDK of the ``colocated`` runtime, shaped after JAX so that code
written for ``jax.experimental.colocated_python`` ports by changing imports.
This module gives the data plane: devices, meshes and shardings, ``Array`` and
``device_put``, waiting (blocking, asyncio, ``concurrent.futures``) and the
exception classes.

The default client (the local host with CPU devices) is created on first use;
call ``configure(num_cpu_devices=...)`` before that, or set
``COLOCATED_NUM_CPU_DEVICES``.
"""

from ._array import (
    Array,
    Shard,
    block_until_ready,
    device_put,
    make_array_from_callback,
    make_array_from_single_device_arrays,
    wait,
)
from ._client import client, colocated_cpu_devices, configure, devices, local_devices
from ._colocated import Device, __version__
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
from ._sharding import (
    Mesh,
    NamedSharding,
    P,
    PartitionSpec,
    ShapeDtypeStruct,
    Sharding,
    SingleDeviceSharding,
)

__all__ = [
    "AlreadyExistsError",
    "Array",
    "CancelledError",
    "ColocatedError",
    "ColocatedFunction",
    "DeadlineExceededError",
    "Device",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "Mesh",
    "NamedSharding",
    "NotFoundError",
    "P",
    "PartitionSpec",
    "PermissionDeniedError",
    "RemoteError",
    "ResourceExhaustedError",
    "ShapeDtypeStruct",
    "Shard",
    "Sharding",
    "SingleDeviceSharding",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "__version__",
    "block_until_ready",
    "clear_caches",
    "client",
    "colocated_cpu_devices",
    "colocated_python",
    "colocated_python_class",
    "configure",
    "device_put",
    "devices",
    "local_devices",
    "make_array_from_callback",
    "make_array_from_single_device_arrays",
    "wait",
]
