"""Meshes and shardings, as in JAX: ``Mesh`` (with ``AxisType``) and
``make_mesh``, ``PartitionSpec`` (``P``), ``NamedSharding``,
``SingleDeviceSharding`` and ``ShapeDtypeStruct``.

Each sharding maps to one core sharding (built on first use and cached, so equal
shardings share it); the layout rules (even splits, device uniqueness, ...) are
the core's. A sharding's memory kind names the memory space of each device that
its arrays' buffers are in.

Meshes and shardings pickle by value (devices by id): one pickled in a process
equals the same one made in the process that unpickles it.
"""

from __future__ import annotations

import enum
import math
import threading

import numpy as np

from . import _colocated
from ._client import devices as _default_devices
from ._dtypes import canonicalize
from ._errors import InvalidArgumentError

Device = _colocated.Device

_cache_lock = threading.Lock()
# Python sharding -> core sharding; equal shardings share one core object, whose
# identity is the cheap check of later fast paths.
_core_shardings: dict = {}
# (sharding, shape) -> {device: index}.
_indices_maps: dict = {}


def _clear_sharding_caches() -> None:
    with _cache_lock:
        _core_shardings.clear()
        _indices_maps.clear()


def _core_sharding(sharding) -> _colocated.Sharding:
    core = _core_shardings.get(sharding)
    if core is None:
        core = sharding._make_core()
        if sharding._placement is not None:
            core = core.with_memory_kind(sharding._placement)
        with _cache_lock:
            core = _core_shardings.setdefault(sharding, core)
    return core


class AxisType(enum.Enum):
    """How a mesh axis is used, as ``jax.sharding.AxisType``: ``Auto``,
    ``Explicit`` or ``Manual``. Meshes keep and compare them; layouts do not
    depend on them."""

    Auto = enum.auto()
    Explicit = enum.auto()
    Manual = enum.auto()

    def __repr__(self) -> str:
        return self.name


def _axis_types(axis_names: tuple, axis_types) -> tuple:
    """``axis_types`` as a tuple with one ``AxisType`` per axis (default: ``Auto``)."""
    if axis_types is None:
        return (AxisType.Auto,) * len(axis_names)
    if isinstance(axis_types, AxisType):
        axis_types = (axis_types,)
    axis_types = tuple(axis_types)
    for t in axis_types:
        if not isinstance(t, AxisType):
            raise InvalidArgumentError(f"axis_types must be colocated.AxisType values, got {t!r}")
    if len(axis_types) != len(axis_names):
        raise InvalidArgumentError(
            "Number of axis names should match the number of axis_types. Got "
            f"axis_names={axis_names} and axis_types={axis_types}"
        )
    return axis_types


class Mesh:
    """A named grid of devices: ``Mesh(devices, axis_names, axis_types=None)``.

    ``devices`` is an array-like (nested lists or a numpy array) of devices whose
    rank equals the number of axis names. ``.shape`` maps each axis name to its
    size, ``.devices`` is the numpy array of devices, ``.axis_types`` has one
    ``AxisType`` per axis (default: ``AxisType.Auto``, as in JAX). Meshes are
    equal when their devices, axis names and axis types are.
    """

    __slots__ = ("_hash", "axis_names", "axis_types", "devices")

    def __init__(self, devices, axis_names, axis_types=None) -> None:
        if isinstance(axis_names, str):
            axis_names = (axis_names,)
        axis_names = tuple(axis_names)
        for name in axis_names:
            if not isinstance(name, str):
                raise InvalidArgumentError(f"mesh axis names must be strings, got {name!r}")
        axis_types = _axis_types(axis_names, axis_types)
        grid = np.array(devices, dtype=object)
        if grid.ndim != len(axis_names):
            raise InvalidArgumentError(
                f"the mesh devices have rank {grid.ndim} but {len(axis_names)} axis names were given"
            )
        if len(set(axis_names)) != len(axis_names):
            raise InvalidArgumentError(f"mesh axis names must be unique, got {axis_names}")
        if grid.size == 0:
            raise InvalidArgumentError("a mesh needs at least one device")
        for d in grid.flat:
            if not isinstance(d, Device):
                raise InvalidArgumentError(f"mesh entries must be devices, got {type(d).__name__}")
        ids = [d.id for d in grid.flat]
        if len(set(ids)) != len(ids):
            raise InvalidArgumentError(f"a device appears twice in the mesh: {ids}")
        grid.flags.writeable = False
        self.devices = grid
        self.axis_names = axis_names
        self.axis_types = axis_types
        # A string hash differs between processes: computed again when unpickled.
        self._hash = hash((tuple(ids), grid.shape, axis_names, axis_types))

    @property
    def shape(self) -> dict[str, int]:
        """Axis name -> axis size, in axis order."""
        return dict(zip(self.axis_names, self.devices.shape))

    @property
    def axis_sizes(self) -> tuple[int, ...]:
        """Axis sizes, in axis order."""
        return self.devices.shape

    @property
    def size(self) -> int:
        """Number of devices."""
        return self.devices.size

    @property
    def device_ids(self) -> np.ndarray:
        """The device ids, in the mesh's shape."""
        return np.vectorize(lambda d: d.id, otypes=[int])(self.devices)

    @property
    def local_devices(self) -> list:
        """The mesh's devices in row-major order."""
        return list(self.devices.flat)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Mesh):
            return NotImplemented
        return (
            self._hash == other._hash
            and self.axis_names == other.axis_names
            and self.axis_types == other.axis_types
            and self.devices.shape == other.devices.shape
            and all(a == b for a, b in zip(self.devices.flat, other.devices.flat))
        )

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):
        return (Mesh, (self.devices, self.axis_names, self.axis_types))

    def __repr__(self) -> str:
        shape = ", ".join(f"'{k}': {v}" for k, v in self.shape.items())
        return (
            f"Mesh(device_ids={self.device_ids.tolist()!r}, axis_names={self.axis_names!r}, shape={{{shape}}}, "
            f"axis_types={self.axis_types!r})"
        )


def make_mesh(axis_shapes, axis_names, axis_types=None, *, devices=None) -> Mesh:
    """A ``Mesh`` of shape ``axis_shapes`` over the first ``prod(axis_shapes)``
    of ``devices`` (default: ``colocated.devices()``), in order, as
    ``jax.make_mesh``; ``axis_types`` defaults to ``AxisType.Explicit`` for
    every axis, as in JAX.

    Raises ``InvalidArgumentError`` (a ``ValueError``) when the shape is not a
    sequence of ints or there are fewer devices than the mesh needs.
    """
    try:
        shape = tuple(axis_shapes)
    except TypeError:
        shape = None
    if shape is None or not all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) for n in shape):
        raise InvalidArgumentError(
            f"`axis_sizes` passed to `make_mesh` should be a sequence of ints. Got {axis_shapes}"
        )
    shape = tuple(int(n) for n in shape)
    if any(n < 1 for n in shape):
        raise InvalidArgumentError(f"`axis_sizes` passed to `make_mesh` must be positive. Got {axis_shapes}")
    devices = list(_default_devices() if devices is None else devices)
    size = math.prod(shape)
    if size > len(devices):
        raise InvalidArgumentError(f"Number of devices {len(devices)} must be >= the product of mesh_shape {shape}")
    grid = np.empty(size, dtype=object)
    grid[:] = devices[:size]
    if axis_types is None:
        axis_types = (AxisType.Explicit,) * len(shape)
    return Mesh(grid.reshape(shape), axis_names, axis_types)


class PartitionSpec(tuple):
    """How each array dimension is split over mesh axes (a tuple, as in JAX).

    Entries: ``None`` (not split), an axis name, or a tuple of axis names (split
    over their product, major first). Missing trailing entries mean ``None``.
    """

    def __new__(cls, *partitions):
        for p in partitions:
            ok = p is None or isinstance(p, str) or (
                isinstance(p, tuple) and all(isinstance(a, str) for a in p)
            )
            if not ok:
                raise InvalidArgumentError(
                    f"PartitionSpec entries must be None, an axis name or a tuple of axis names, got {p!r}"
                )
        return super().__new__(cls, partitions)

    def _normalized(self) -> tuple:
        parts = [(p,) if isinstance(p, str) else (p or ()) for p in self]
        while parts and parts[-1] == ():
            parts.pop()
        return tuple(parts)

    def __eq__(self, other) -> bool:
        if isinstance(other, PartitionSpec):
            return self._normalized() == other._normalized()
        if isinstance(other, tuple):
            return self._normalized() == PartitionSpec(*other)._normalized()
        return NotImplemented

    def __ne__(self, other) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return hash(self._normalized())

    def __repr__(self) -> str:
        return "PartitionSpec(" + ", ".join(repr(p) for p in self) + ")"

    def __reduce__(self):
        return (PartitionSpec, tuple(self))


#: Short alias of :class:`PartitionSpec`, as ``jax.sharding.PartitionSpec as P``.
P = PartitionSpec


class Sharding:
    """Base class of shardings: a device assignment plus a layout, and the
    memory kind the shards are in."""

    __slots__ = ("__weakref__", "_core", "_memory_kind", "_placement")

    def _set_memory_kind(self, device, memory_kind) -> None:
        """Sets ``memory_kind`` checked against ``device`` (None: its default
        kind), and what the runtime is told: None for the default memory."""
        if memory_kind is not None and not isinstance(memory_kind, str):
            raise InvalidArgumentError(f"memory_kind must be a string, got {type(memory_kind).__name__}")
        default = device.default_memory_kind
        if memory_kind is None or memory_kind == default:
            self._memory_kind = default
            self._placement = None
            return
        device.check_memory_kind(memory_kind)
        self._memory_kind = self._placement = memory_kind

    def _make_core(self) -> _colocated.Sharding:
        raise NotImplementedError

    def _core_sharding(self) -> _colocated.Sharding:
        core = self._core
        if core is None:
            core = _core_sharding(self)
            self._core = core
        return core

    @property
    def _device_assignment(self) -> tuple:
        """Devices in shard order: shard ``i`` of an array lives on device ``i``."""
        raise NotImplementedError

    @property
    def devices(self) -> tuple:
        """Devices in shard order (same as ``_device_assignment``)."""
        return self._device_assignment

    @property
    def device_set(self) -> set:
        """The set of devices."""
        return set(self._device_assignment)

    @property
    def addressable_devices(self) -> set:
        """The devices this process can address."""
        return self.device_set

    @property
    def num_devices(self) -> int:
        """Number of devices."""
        return len(self._device_assignment)

    @property
    def is_fully_replicated(self) -> bool:
        """True when every device holds the whole array."""
        return self._core_sharding().is_fully_replicated

    @property
    def is_fully_addressable(self) -> bool:
        """True when this process can address every device (always, for now)."""
        return True

    @property
    def memory_kind(self) -> str:
        """Memory kind of the shards: ``"device"`` (the devices' default, as in
        JAX), ``"pinned_host"`` or ``"unpinned_host"``."""
        return self._memory_kind

    def with_memory_kind(self, kind: str) -> Sharding:
        """The same sharding with memory kind ``kind``; ``InvalidArgumentError``,
        naming the kinds the devices have, for a kind they lack."""
        raise NotImplementedError

    def shard_shape(self, global_shape) -> tuple:
        """The shape each device holds; ``InvalidArgumentError`` if the split is uneven."""
        return tuple(self._core_sharding().shard_shape(list(global_shape)))

    def devices_indices_map(self, global_shape) -> dict:
        """Device -> the tuple of slices of ``global_shape`` it holds."""
        key = (self, tuple(global_shape))
        found = _indices_maps.get(key)
        if found is None:
            ranges = self._core_sharding().shard_indices(list(global_shape))
            found = {
                d: tuple(slice(start, stop) for start, stop in r)
                for d, r in zip(self._device_assignment, ranges)
            }
            with _cache_lock:
                _indices_maps[key] = found
        return dict(found)

    def is_equivalent_to(self, other, ndim: int) -> bool:
        """Same devices in the same order, the same split of every dimension and
        the same memory kind."""
        return self._memory_kind == other._memory_kind and self._core_sharding().equivalent(
            other._core_sharding(), ndim
        )


class NamedSharding(Sharding):
    """An array split over a ``Mesh`` by a ``PartitionSpec``, as in JAX, with
    its shards in memory of kind ``memory_kind`` (default: the devices' own)."""

    __slots__ = ("_hash", "_partition", "mesh", "spec")

    def __init__(self, mesh: Mesh, spec: PartitionSpec | None = None, *, memory_kind: str | None = None) -> None:
        if not isinstance(mesh, Mesh):
            raise InvalidArgumentError(f"NamedSharding needs a Mesh, got {type(mesh).__name__}")
        if spec is None:
            spec = PartitionSpec()
        elif not isinstance(spec, PartitionSpec):
            spec = PartitionSpec(*spec) if isinstance(spec, tuple) else PartitionSpec(spec)
        partition = []
        for entry in spec._normalized():
            axes = []
            for name in entry:
                if name not in mesh.axis_names:
                    raise InvalidArgumentError(
                        f"PartitionSpec {spec!r} names axis '{name}', which is not a mesh axis "
                        f"(the mesh has {mesh.axis_names})"
                    )
                axes.append(mesh.axis_names.index(name))
            partition.append(axes)
        self.mesh = mesh
        self.spec = spec
        self._partition = partition
        self._core = None
        self._set_memory_kind(mesh.devices.flat[0], memory_kind)
        self._hash = hash((mesh, spec, self._memory_kind))

    def _make_core(self) -> _colocated.Sharding:
        return _colocated.Sharding.named(
            list(self.mesh.devices.flat),
            list(self.mesh.devices.shape),
            list(self.mesh.axis_names),
            self._partition,
            [t.name for t in self.mesh.axis_types],
        )

    @property
    def _device_assignment(self) -> tuple:
        return tuple(self.mesh.devices.flat)

    def __eq__(self, other) -> bool:
        if not isinstance(other, NamedSharding):
            return NotImplemented
        return self is other or (
            self._hash == other._hash
            and self.mesh == other.mesh
            and self.spec == other.spec
            and self._memory_kind == other._memory_kind
        )

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"NamedSharding(mesh={self.mesh!r}, spec={self.spec!r}, memory_kind={self._memory_kind})"

    def __reduce__(self):
        return (_named_sharding, (self.mesh, self.spec, self._memory_kind))

    def with_memory_kind(self, kind: str) -> NamedSharding:
        """This sharding with its shards in memory of kind ``kind``."""
        return NamedSharding(self.mesh, self.spec, memory_kind=kind)


class SingleDeviceSharding(Sharding):
    """The whole array on one device, in its memory of kind ``memory_kind``
    (default: the device's own)."""

    __slots__ = ("_device",)

    def __init__(self, device, *, memory_kind: str | None = None) -> None:
        if not isinstance(device, Device):
            raise InvalidArgumentError(f"SingleDeviceSharding needs a device, got {type(device).__name__}")
        self._device = device
        self._core = None
        self._set_memory_kind(device, memory_kind)

    def _make_core(self) -> _colocated.Sharding:
        return _colocated.Sharding.single_device(self._device)

    @property
    def _device_assignment(self) -> tuple:
        return (self._device,)

    def __eq__(self, other) -> bool:
        if not isinstance(other, SingleDeviceSharding):
            return NotImplemented
        return self._device == other._device and self._memory_kind == other._memory_kind

    def __hash__(self) -> int:
        return hash(("single", self._device, self._memory_kind))

    def __repr__(self) -> str:
        return f"SingleDeviceSharding(device={self._device!r}, memory_kind={self._memory_kind})"

    def __reduce__(self):
        return (_single_device_sharding, (self._device, self._memory_kind))

    def with_memory_kind(self, kind: str) -> SingleDeviceSharding:
        """This sharding with the array in memory of kind ``kind``."""
        return SingleDeviceSharding(self._device, memory_kind=kind)


def _named_sharding(mesh: Mesh, spec: PartitionSpec, memory_kind: str) -> NamedSharding:
    """Unpickles a ``NamedSharding``."""
    return NamedSharding(mesh, spec, memory_kind=memory_kind)


def _single_device_sharding(device, memory_kind: str) -> SingleDeviceSharding:
    """Unpickles a ``SingleDeviceSharding``."""
    return SingleDeviceSharding(device, memory_kind=memory_kind)


def _sharding_from_core(core: _colocated.Sharding) -> Sharding:
    """The Python sharding for a core one (e.g. of an array the runtime made, or
    an output a worker made), over the devices of the core sharding's own
    client, with shards in memory of the core's kind: a
    ``SingleDeviceSharding`` for a single device's, else a ``NamedSharding``
    with the core's mesh (axis names and types) and spec."""
    memory_kind = core.memory_kind
    devices = core.devices
    if core.is_single_device:
        sharding = SingleDeviceSharding(devices[0], memory_kind=memory_kind)
    else:
        names = core.axis_names
        grid = np.empty(len(devices), dtype=object)
        grid[:] = devices
        types = tuple(AxisType[t] for t in core.axis_types)
        mesh = Mesh(grid.reshape(core.mesh_shape), names, types)
        spec = PartitionSpec(
            *(None if not axes else names[axes[0]] if len(axes) == 1 else tuple(names[a] for a in axes)
              for axes in core.partition)
        )
        sharding = NamedSharding(mesh, spec, memory_kind=memory_kind)
    sharding._core = core
    return sharding


class ShapeDtypeStruct:
    """The spec of an array: shape, dtype and (optionally) sharding."""

    __slots__ = ("dtype", "shape", "sharding")

    def __init__(self, shape, dtype, sharding: Sharding | None = None) -> None:
        self.shape = tuple(int(d) for d in shape)
        self.dtype = canonicalize(dtype)
        if sharding is not None and not isinstance(sharding, Sharding):
            from ._jax import is_jax_placement, placement_of

            if not is_jax_placement(sharding):
                raise InvalidArgumentError(f"sharding must be a Sharding (colocated's or JAX's), got {type(sharding).__name__}")
            sharding = placement_of(sharding)
        self.sharding = sharding

    @property
    def ndim(self) -> int:
        """Rank."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    def __eq__(self, other) -> bool:
        if not isinstance(other, ShapeDtypeStruct):
            return NotImplemented
        return (self.shape, self.dtype, self.sharding) == (other.shape, other.dtype, other.sharding)

    def __hash__(self) -> int:
        return hash((self.shape, self.dtype, self.sharding))

    def __repr__(self) -> str:
        s = f"ShapeDtypeStruct(shape={self.shape}, dtype={self.dtype}"
        if self.sharding is not None:
            s += f", sharding={self.sharding!r}"
        return s + ")"
