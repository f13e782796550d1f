"""Placing values on devices: ``device_put`` (numpy values, scalars, Arrays,
``jax.Array``s and pytrees of them, with optional progress reports for copies
between hosts) and ``make_array_from_callback`` /
``make_array_from_single_device_arrays``.
"""

from __future__ import annotations

import time

import numpy as np
import optree

from . import _colocated
from ._array import Array, _address, _wrap
from ._client import devices
from ._dtypes import STRING, canonicalize, core_name
from ._errors import FailedPreconditionError, InvalidArgumentError
from ._sharding import Device, Sharding, SingleDeviceSharding
from ._waiting import block_until_ready


def _as_sharding(target) -> Sharding:
    if target is None:
        return SingleDeviceSharding(devices()[0])
    if isinstance(target, Sharding):
        return target
    if isinstance(target, Device):
        return SingleDeviceSharding(target)
    from ._jax import is_jax_placement, placement_of

    if is_jax_placement(target):
        return placement_of(target)
    raise InvalidArgumentError(
        f"expected a Sharding or a Device (colocated's or JAX's), got {type(target).__name__}"
    )


def _host_value(x) -> np.ndarray:
    if isinstance(x, Array):
        return x._value()
    value = np.asarray(x)
    if value.dtype.kind == "U":
        value = value.astype(STRING)
    core_name(value.dtype)
    return value


def _put(x, sharding: Sharding) -> Array:
    if isinstance(x, Array):
        return _put_array(x, sharding)[0]
    value = _host_value(x)
    core = sharding._core_sharding()
    shape = list(value.shape)
    kind = sharding._placement
    if value.dtype == STRING:
        impl = _colocated.ArrayImpl.from_host_strings(core, shape, value.ravel().tolist(), kind)
    elif value.nbytes <= _SMALL_BYTES:
        impl = _colocated.ArrayImpl.from_bytes(core, core_name(value.dtype), shape, value.tobytes(), kind)
    else:
        if not value.flags.c_contiguous:
            value = value.copy(order="C")
        impl = _colocated.ArrayImpl.from_host_bytes(
            core, core_name(value.dtype), shape, _address(value), value.nbytes, kind
        )
    return _wrap(impl, sharding)


#: Values up to this size go to the runtime as ``bytes`` (cheaper than an address).
_SMALL_BYTES = 4096


def _put_default(x, first: Sharding) -> Array:
    """``device_put`` without a device: a ``jax.Array`` keeps its layout, on
    the corresponding devices (a ``SingleDeviceSharding`` or
    ``NamedSharding``); anything else goes to ``first``."""
    from ._jax import from_jax, has_equivalent, is_jax_array

    if is_jax_array(x) and has_equivalent(x.sharding):
        return from_jax(x)
    return _put(x, first)


def _put_array(x: Array, sharding: Sharding):
    """``x`` on ``sharding`` (the runtime's ``put_to``: as it is, host to host,
    or gathered and put again), and its ``CopyProgress`` (None when as it is)."""
    impl, tracker = x._impl.put_to(sharding._core_sharding(), sharding._placement)
    if impl is None:
        return x, None
    return _wrap(impl, sharding), tracker


def _is_sharding_leaf(x) -> bool:
    if x is None or isinstance(x, (Sharding, Device)):
        return True
    from ._jax import is_jax_placement

    return is_jax_placement(x)


def device_put(x, device=None, *, progress=None):
    """Places ``x`` on devices; returns an ``Array`` (or a pytree of them).

    ``x``: a numpy array, a Python or numpy scalar, an ``Array``, a
    ``jax.Array``, or a pytree of those. ``device``: a ``Device``, a
    ``Sharding``, ``None`` (the first device; a ``jax.Array`` keeps its layout,
    on the devices that correspond to JAX's: see ``to_jax``), or
    a pytree of those that is a prefix of ``x``; the devices may be of any
    client, and a sharding's ``memory_kind`` says which memory of each device
    the buffers go to. An ``Array`` already laid out that way is returned as is;
    one whose shards keep their index in the new sharding (same layout, other
    devices, default memory) is copied shard by shard, from host to host
    directly; any other is gathered here and put again in the background.
    Either way the call returns at once.
    Raises ``InvalidArgumentError`` (a ``ValueError``) for an unsupported dtype
    or a shape the sharding cannot split evenly.

    ``progress``: for large copies between hosts. ``True`` shows a ``tqdm`` bar
    (``FailedPreconditionError`` without tqdm: ``pip install
    'colocated[progress]'``); a callable gets ``(bytes done, bytes in all)``;
    ``None`` or ``False`` reports nothing. Either makes the call wait
    until the data is in place, reporting from the calling thread: the bytes
    that cross hosts.
    """
    if progress is not None and progress is not False:
        return _put_with_progress(x, device, progress)
    if device is None:
        first = _as_sharding(None)
        return optree.tree_map(lambda leaf: _put_default(leaf, first), x)
    if _is_sharding_leaf(device):
        sharding = _as_sharding(device)
        return optree.tree_map(lambda leaf: _put(leaf, sharding), x)
    return optree.tree_map(
        lambda d, sub: optree.tree_map(lambda leaf: _put(leaf, _as_sharding(d)), sub),
        device,
        x,
        is_leaf=_is_sharding_leaf,
    )


def _put_with_progress(x, device, progress):
    if not _is_sharding_leaf(device):
        raise InvalidArgumentError("device_put(progress=...) takes one Device or Sharding for the whole tree")
    sharding = _as_sharding(device)
    report = _Reporter(progress)
    leaves, treedef = optree.tree_flatten(x)
    copies, trackers = [], []
    for leaf in leaves:
        if isinstance(leaf, Array):
            copy, tracker = _put_array(leaf, sharding)
            copies.append(copy)
            if tracker is not None:
                trackers.append(tracker)
        else:
            copies.append(_put(leaf, sharding))
    try:
        pending = [c._impl.ready_event() for c in copies]
        while not all(e.is_ready() for e in pending):
            report(sum(t.done for t in trackers), sum(t.total for t in trackers))
            time.sleep(_PROGRESS_PERIOD)
        block_until_ready(copies)
        total = sum(t.total for t in trackers) or sum(c.nbytes for c in copies)
        report(total, total)
    finally:
        report.close()
    return optree.tree_unflatten(treedef, copies)


#: How often ``device_put(progress=...)`` reports, in seconds.
_PROGRESS_PERIOD = 0.1


class _Reporter:
    """Reports ``(done, total)`` to a callable, or to a tqdm bar it owns."""

    def __init__(self, progress) -> None:
        self._bar = None
        self._fn = None
        if progress is True:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                raise FailedPreconditionError(
                    "device_put(progress=True) shows a tqdm bar: install tqdm (pip install 'colocated[progress]')"
                ) from None

            self._bar = tqdm(total=0, unit="B", unit_scale=True, unit_divisor=1024, desc="device_put")
        elif callable(progress):
            self._fn = progress
        else:
            raise InvalidArgumentError(f"progress must be a bool or a callable, got {progress!r}")
        self._last = None

    def __call__(self, done: int, total: int) -> None:
        if (done, total) == self._last:
            return
        self._last = (done, total)
        if self._bar is not None:
            if total and self._bar.total != total:
                self._bar.total = total
            self._bar.update(done - self._bar.n)
        else:
            self._fn(done, total)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _from_shard_values(shape, sharding: Sharding, values: list, dtype: np.dtype) -> Array:
    """An array from one numpy value per device of ``sharding`` (in its order)."""
    core = sharding._core_sharding()
    shape = list(shape)
    kind = sharding._placement
    if dtype == STRING:
        shards = [np.asarray(v, dtype=STRING).ravel().tolist() for v in values]
        impl = _colocated.ArrayImpl.from_string_shards(core, shape, shards, kind)
    else:
        keep = []
        for v in values:
            v = np.asarray(v, dtype=dtype)
            keep.append(v if v.flags.c_contiguous else v.copy(order="C"))
        impl = _colocated.ArrayImpl.from_host_shards(
            core, core_name(dtype), shape, [(_address(v), v.nbytes) for v in keep], kind
        )
    return _wrap(impl, sharding)


def make_array_from_callback(shape, sharding: Sharding, data_callback, dtype=None) -> Array:
    """Builds an array of ``shape`` and ``sharding`` from
    ``data_callback(index) -> numpy value``, called once per distinct shard index
    (a tuple of slices of the global array)."""
    if not isinstance(sharding, Sharding):
        raise InvalidArgumentError(f"sharding must be a Sharding, got {type(sharding).__name__}")
    shape = tuple(int(d) for d in shape)
    indices = sharding.devices_indices_map(shape)
    shard_shape = sharding.shard_shape(shape)
    target = None if dtype is None else canonicalize(dtype)
    values = []
    # The callback runs for the first device of each slice; its copies reuse it.
    for (_, first), device in zip(sharding._core_sharding().replicas(list(shape)), sharding._device_assignment):
        if first < len(values):
            values.append(values[first])
            continue
        index = indices[device]
        value = _host_value(data_callback(index))
        if value.shape != shard_shape:
            raise InvalidArgumentError(
                f"data_callback returned shape {value.shape} for index {index}, "
                f"but the shard shape is {shard_shape}"
            )
        target = value.dtype if target is None else target
        values.append(value)
    return _from_shard_values(shape, sharding, values, target)


def make_array_from_single_device_arrays(shape, sharding: Sharding, arrays, *, dtype=None) -> Array:
    """Assembles an array of ``shape`` and ``sharding`` from single-device Arrays,
    one per device of the sharding (matched by device; any order), each in
    memory of the sharding's memory kind. No data is copied: the new array
    shares their buffers."""
    if not isinstance(sharding, Sharding):
        raise InvalidArgumentError(f"sharding must be a Sharding, got {type(sharding).__name__}")
    arrays = list(arrays)
    for a in arrays:
        if not isinstance(a, Array):
            raise InvalidArgumentError(f"expected colocated.Array, got {type(a).__name__}")
    name = core_name(canonicalize(dtype)) if dtype is not None else arrays[0]._impl.dtype if arrays else None
    if name is None:
        raise InvalidArgumentError("no arrays given")
    impl = _colocated.ArrayImpl.assemble(
        sharding._core_sharding(), name, [int(d) for d in shape], [a._impl for a in arrays], sharding.memory_kind
    )
    return _wrap(impl, sharding)
