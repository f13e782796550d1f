"""JAX's arrays in and out of ``colocated``.

A ``jax.Array`` of this process goes wherever an ``Array`` goes (``device_put``,
colocated functions, XLA executables) and ``to_jax`` turns an ``Array`` into a
``jax.Array``. The devices correspond by platform and index on this process's
host: JAX's CPU device ``k`` is the CPU device with local hardware id ``k``
that colocated Python runs on, and JAX's device ``k`` of a plugin's platform
(``cuda``) is the device of that platform with local hardware id ``k``.

JAX is never imported here unless the caller has imported it (a
``jax.Array`` exists) or asks for one (``to_jax``).
"""

from __future__ import annotations

import sys

import numpy as np

from . import _colocated
from ._array import Array, _wrap, device_put
from ._client import client as _client_default
from ._device_put import _host_value
from ._dtypes import STRING, core_name
from ._errors import FailedPreconditionError, InvalidArgumentError, UnimplementedError
from ._sharding import AxisType, Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding


def is_jax_array(x) -> bool:
    """Whether ``x`` is a ``jax.Array`` (without importing JAX)."""
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(x, jax.Array)


def is_prng_key(x) -> bool:
    """Whether ``x`` is a ``jax.Array`` of PRNG keys (an extended dtype)."""
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


class PrngKeys:
    """An array of JAX PRNG keys crossing a colocated call, as a tree node:
    its key data (``jax.random.key_data``, an unsigned integer array that
    travels as any array) and its implementation (the node's metadata, in
    the call's tree structure). ``colocated`` turns it back into keys
    (``jax.random.wrap_key_data``) wherever the tree is rebuilt with arrays:
    for the function on its host and for the caller. A tree of specs keeps
    the node, with the data's spec."""

    __slots__ = ("data", "impl")

    def __init__(self, data, impl) -> None:
        self.data = data
        self.impl = impl

    def __repr__(self) -> str:
        return f"PrngKeys({self.data!r}, impl={self.impl!r})"

    @staticmethod
    def of(key) -> PrngKeys:
        jax = sys.modules["jax"]
        return PrngKeys(jax.random.key_data(key), key.dtype._impl)

    def flatten(self):
        return (self.data,), self.impl

    @staticmethod
    def unflatten(impl, children):
        """Keys from a ``jax.Array`` or an Array of this process (a worker's
        Array, or a spec, stays a node: it goes back to the worker as it is)."""
        (data,) = children
        local = isinstance(data, Array) and all(_is_local(d) for d in data.sharding.device_set)
        if is_jax_array(data) or local:
            jax = _import_jax()
            return jax.random.wrap_key_data(to_jax(data) if local else data, impl=impl)
        return PrngKeys(data, impl)


def _import_jax():
    try:
        import jax
    except ImportError as e:
        raise FailedPreconditionError("to_jax needs JAX: pip install jax") from e
    return jax


def _is_local(device: _colocated.Device) -> bool:
    """Whether ``device`` is of this process's host (process 0 of its client;
    workers are 1 and up)."""
    return device.process_index == 0


def _jax_index(jax_device) -> int:
    index = getattr(jax_device, "local_hardware_id", None)
    return jax_device.id if index is None else index


def device_of(jax_device, client: _colocated.Client | None = None) -> _colocated.Device:
    """The device of ``client`` (default: the default client) on this
    process's host that corresponds to ``jax_device``: by platform and index
    (see the module's doc). ``InvalidArgumentError`` when there is none."""
    client = client or _client_default()
    platform = jax_device.platform
    index = _jax_index(jax_device)
    jax = sys.modules["jax"]
    if jax_device.process_index != jax.process_index():
        raise InvalidArgumentError(f"{jax_device} belongs to JAX process {jax_device.process_index}, not this one")
    # JAX calls CUDA and ROCm devices "gpu"; their plugins say which.
    platforms = {"cuda", "rocm"} if platform == "gpu" else {platform}
    for d in client.devices() + client.devices("cpu"):
        if d.local_hardware_id != index or not _is_local(d):
            continue
        # JAX's CPU devices are where colocated Python runs: this runtime's own.
        if (platform == "cpu" and d.backend == "cpu") or (platform != "cpu" and d.platform in platforms):
            return d
    raise InvalidArgumentError(
        f"JAX's {jax_device} has no {platform} device with local hardware id {index} in this process's client"
    )


def jax_device_of(device: _colocated.Device):
    """JAX's device that corresponds to ``device`` (of this process's host);
    ``InvalidArgumentError`` when JAX has none (a worker's device, or a platform
    JAX was not started with)."""
    jax = _import_jax()
    if not _is_local(device):
        raise InvalidArgumentError(
            f"{device} is a worker's device, which JAX in this process cannot address; "
            "give to_jax a JAX device to copy it to"
        )
    try:
        candidates = jax.local_devices(backend=device.platform)
    except RuntimeError as e:
        raise InvalidArgumentError(f"JAX has no {device.platform} devices for {device}: {e}") from e
    for j in candidates:
        if _jax_index(j) == device.local_hardware_id:
            return j
    raise InvalidArgumentError(
        f"JAX has no {device.platform} device with local hardware id {device.local_hardware_id} for {device}"
    )


def is_jax_devices(x) -> bool:
    """Whether ``x`` is a JAX ``Mesh`` or a sequence that starts with a JAX
    device (without importing JAX)."""
    jax = sys.modules.get("jax")
    if jax is None:
        return False
    if isinstance(x, jax.sharding.Mesh):
        return True
    if isinstance(x, list | tuple) and x:
        return isinstance(x[0], jax.Device)
    return False


def colocated_cpu_devices_of_jax(devices_or_mesh):
    """``colocated_cpu_devices`` of JAX's devices or mesh, in JAX's terms."""
    jax = sys.modules["jax"]
    client = _client_default()
    if isinstance(devices_or_mesh, jax.sharding.Mesh):
        mesh = devices_or_mesh
        flat = colocated_cpu_devices_of_jax(list(mesh.devices.flat))
        grid = np.empty(len(flat), dtype=object)
        grid[:] = flat
        return jax.sharding.Mesh(grid.reshape(mesh.devices.shape), mesh.axis_names, axis_types=mesh.axis_types)
    for d in devices_or_mesh:
        if not isinstance(d, jax.Device):
            raise InvalidArgumentError(f"colocated_cpu_devices expects devices or a Mesh, got {type(d).__name__}")
    ours = [device_of(d, client) for d in devices_or_mesh]
    return [jax_device_of(cpu) for cpu in client.colocated_cpu_devices(ours)]


def is_jax_placement(x) -> bool:
    """Whether ``x`` is a JAX ``Device`` or ``Sharding`` (without importing JAX)."""
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(x, jax.Device | jax.sharding.Sharding)


def placement_of(x, client: _colocated.Client | None = None):
    """The ``colocated`` sharding for a JAX ``Device`` or ``Sharding``."""
    jax = sys.modules["jax"]
    if isinstance(x, jax.Device):
        return SingleDeviceSharding(device_of(x, client))
    return sharding_of(x, client)


def sharding_of(jax_sharding, client: _colocated.Client | None = None):
    """The ``colocated`` sharding that lays an array out as ``jax_sharding``
    does, on the corresponding devices (``NamedSharding`` and
    ``SingleDeviceSharding``, with their memory kind)."""
    jax = sys.modules.get("jax") or _import_jax()
    kind = getattr(jax_sharding, "memory_kind", None)
    if isinstance(jax_sharding, jax.sharding.SingleDeviceSharding):
        (device,) = jax_sharding.device_set
        return SingleDeviceSharding(device_of(device, client), memory_kind=kind)
    if isinstance(jax_sharding, jax.sharding.NamedSharding):
        mesh = jax_sharding.mesh
        devices = np.vectorize(lambda d: device_of(d, client), otypes=[object])(mesh.devices)
        types = tuple(AxisType[t.name] for t in mesh.axis_types)
        ours = Mesh(devices, mesh.axis_names, types)
        return NamedSharding(ours, PartitionSpec(*jax_sharding.spec), memory_kind=kind)
    raise InvalidArgumentError(
        f"{type(jax_sharding).__name__} has no colocated equivalent; use a NamedSharding or SingleDeviceSharding"
    )


def is_jax_spec(x) -> bool:
    """Whether ``x`` is a ``jax.ShapeDtypeStruct`` (without importing JAX)."""
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(x, jax.ShapeDtypeStruct)


def spec_of_jax(x, client: _colocated.Client | None = None):
    """A ``jax.ShapeDtypeStruct`` as ``colocated.ShapeDtypeStruct``, its
    sharding on the corresponding devices."""
    from ._sharding import ShapeDtypeStruct

    jax = sys.modules["jax"]
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        raise InvalidArgumentError(
            f"a spec of PRNG keys ({x.dtype}) is not a colocated spec: the keys travel as their key data, "
            "a colocated.PrngKeys of that data's spec and the keys' implementation"
        )
    sharding = None if x.sharding is None else sharding_of(x.sharding, client)
    return ShapeDtypeStruct(x.shape, x.dtype, sharding)


def has_equivalent(jax_sharding) -> bool:
    """Whether ``sharding_of`` takes ``jax_sharding``."""
    jax = sys.modules["jax"]
    return isinstance(jax_sharding, jax.sharding.SingleDeviceSharding | jax.sharding.NamedSharding)


#: Platforms whose devices' memory another client of this process can
#: address (a GPU plugin's), which DLPack names.
_DLPACK_PLATFORMS = ("cuda", "rocm")


def _device_view(x, sharding) -> Array | None:
    """``x``, a ``jax.Array`` on one GPU, as an Array of the corresponding
    plugin device that views JAX's device memory (through DLPack: JAX's
    capsule keeps the memory while the runtime uses it), or None where the
    plugin cannot view it."""
    x.block_until_ready()
    try:
        impl = _colocated.ArrayImpl.from_device_dlpack(
            sharding._core_sharding(), core_name(np.dtype(x.dtype)), list(x.shape), x.__dlpack__()
        )
    except (ValueError, UnimplementedError):
        # Not a view the plugin takes (a layout DLPack describes otherwise,
        # a plugin without views, an address it refuses): copied instead.
        return None
    return _wrap(impl, sharding)


class _DeviceCapsule:
    """A DLPack producer of one capsule of the runtime's device memory, for
    ``jax.dlpack.from_dlpack``."""

    def __init__(self, capsule, device) -> None:
        self._capsule = capsule
        self._device = (2 if device.platform == "cuda" else 10, device.local_hardware_id)

    def __dlpack__(self, **_kwargs):
        # The shard was ready when the capsule was made: no stream to order.
        capsule, self._capsule = self._capsule, None
        return capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device


def from_jax(x, client: _colocated.Client | None = None) -> Array:
    """A ``jax.Array`` of this process as an ``Array`` of the corresponding
    devices and sharding: reading JAX's buffer in place for an array on one
    CPU device (the ``jax.Array`` stays alive while the runtime reads it) or
    on one GPU (JAX's device memory, through DLPack, where the runtime's
    plugin can view it), else one copy of the data."""
    sharding = sharding_of(x.sharding, client)
    if len(sharding.device_set) == 1:
        (device,) = sharding.device_set
        if device.platform in _DLPACK_PLATFORMS and sharding.memory_kind in (None, "device"):
            view = _device_view(x, sharding)
            if view is not None:
                return view
    value = _host_value(x)
    if len(sharding.device_set) != 1 or value.dtype == STRING or not value.flags.c_contiguous:
        return device_put(value, sharding)
    impl = _colocated.ArrayImpl.from_host_view(
        sharding._core_sharding(),
        core_name(value.dtype),
        list(value.shape),
        value.ctypes.data,
        value.nbytes,
        (x, value),
        sharding._placement,
    )
    return _wrap(impl, sharding)


def to_jax(x: Array, device=None):
    """``x`` as a ``jax.Array``.

    ``device``: a JAX ``Device`` or ``Sharding`` to put it on (the data is
    copied there unless JAX can alias it); by default JAX's devices that
    correspond to ``x``'s, with the same layout. An array of one buffer in
    this process's host memory becomes a ``jax.Array`` of JAX's CPU device
    without a copy (when its address is aligned as XLA needs, which the
    runtime's buffers are): JAX reads the same memory, which stays alive
    while either array uses it. The ``jax.Array`` is in JAX's default memory
    of its devices, whatever memory kind ``x`` is in.

    Raises ``InvalidArgumentError`` when JAX has no corresponding device (a
    worker's array: give ``device``).
    """
    jax = _import_jax()
    if device is not None and not is_jax_placement(device):
        raise InvalidArgumentError(f"to_jax's device must be a JAX Device or Sharding, got {type(device).__name__}")
    if is_jax_array(x):
        return x if device is None else jax.device_put(x, device)
    if not isinstance(x, Array):
        raise InvalidArgumentError(f"to_jax takes a colocated Array, got {type(x).__name__}")
    if device is not None:
        return jax.device_put(x._value(), device)
    sharding = x.sharding
    if isinstance(sharding, SingleDeviceSharding) or len(sharding.device_set) == 1:
        (ours,) = sharding.device_set
        target = jax_device_of(ours)
        if ours.platform in _DLPACK_PLATFORMS and sharding.memory_kind in (None, "device"):
            # JAX reads the plugin's device memory in place (pinned until
            # JAX's array is gone).
            capsule = x._impl.device_dlpack(0)
            if capsule is not None:
                return jax.dlpack.from_dlpack(_DeviceCapsule(capsule, ours))
        return jax.device_put(x._value(), target)
    if isinstance(sharding, NamedSharding):
        mesh = sharding.mesh
        devices = np.vectorize(jax_device_of, otypes=[object])(mesh.devices)
        types = tuple(getattr(jax.sharding.AxisType, t.name) for t in mesh.axis_types)
        jax_mesh = jax.sharding.Mesh(devices, mesh.axis_names, axis_types=types)
        target = jax.sharding.NamedSharding(jax_mesh, jax.sharding.PartitionSpec(*sharding.spec))
        return jax.device_put(x._value(), target)
    raise InvalidArgumentError(f"{type(sharding).__name__} has no JAX equivalent; give to_jax a device")
