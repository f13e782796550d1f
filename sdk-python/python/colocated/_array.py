"""``Array`` and the data plane: ``device_put``, ``device_get``,
``make_array_from_*``, ``block_until_ready``, asyncio and
``concurrent.futures`` waits.

An ``Array`` is a handle to a core array (one buffer per device of its sharding)
plus its Python sharding. Converting to numpy is zero-copy when one buffer holds
the whole array (single device or fully replicated): the numpy array aliases the
buffer's memory, pinned for as long as the numpy array lives.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import operator as _operator
import time

import numpy as np
import optree
from numpy.lib.mixins import NDArrayOperatorsMixin

from . import _colocated
from ._client import devices
from ._dtypes import STRING, canonicalize, core_name
from ._errors import FailedPreconditionError, InvalidArgumentError
from ._sharding import (
    Device,
    NamedSharding,
    PartitionSpec,
    Sharding,
    SingleDeviceSharding,
    _clear_sharding_caches,
    _sharding_from_core,
)

_DLPACK_CPU = 1


def _address(value: np.ndarray) -> int:
    return value.__array_interface__["data"][0]


class Shard:
    """One device's part of an array: ``.device``, ``.index`` (a tuple of slices of
    the global array), ``.replica_id`` and ``.data`` (a single-device ``Array``)."""

    __slots__ = ("_impl", "_pos", "device", "index", "replica_id")

    def __init__(self, device, index, replica_id, impl, pos) -> None:
        self.device = device
        self.index = index
        self.replica_id = replica_id
        self._impl = impl
        self._pos = pos

    @property
    def data(self) -> Array:
        """The shard as an ``Array`` on its device (sharing the buffer, no copy)."""
        impl = self._impl.shard(self._pos)
        return _wrap(impl, SingleDeviceSharding(self.device, memory_kind=impl.memory_kind))

    def __repr__(self) -> str:
        return f"Shard(device={self.device!r}, index={self.index}, replica_id={self.replica_id})"


class Array(NDArrayOperatorsMixin):
    """A sharded array: a global shape and dtype, a sharding, one buffer per device.

    Made by ``device_put``, ``make_array_from_single_device_arrays`` and
    ``make_array_from_callback`` (not constructed directly). Immutable; numpy
    ufuncs and operators (``x + 1``) give new Arrays with the same sharding.
    """

    __slots__ = ("__weakref__", "_impl", "_sharding")
    __array_priority__ = 100
    __hash__ = None  # mutable-looking like numpy arrays: not hashable

    def __init__(self, *args, **kwargs) -> None:
        raise TypeError("colocated.Array cannot be constructed directly; use colocated.device_put")

    # -- metadata ---------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, ...]:
        """Global shape."""
        return self._impl.shape

    @property
    def dtype(self) -> np.dtype:
        """Element type, as a numpy dtype (``StringDType()`` for strings)."""
        return self._impl.np_dtype

    @property
    def ndim(self) -> int:
        """Rank."""
        return len(self._impl.shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self._impl.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the global array (dense dtypes)."""
        return self.size * self.dtype.itemsize

    @property
    def sharding(self) -> Sharding:
        """How the array is laid out over devices."""
        s = self._sharding
        if s is None:
            s = _sharding_from_core(self._impl.sharding, self._impl.memory_kind)
            self._sharding = s
        return s

    @property
    def is_fully_replicated(self) -> bool:
        """True when every device holds the whole array."""
        return self._impl.sharding.is_fully_replicated

    @property
    def is_fully_addressable(self) -> bool:
        """True when this process can address every shard (always, for now)."""
        return True

    def devices(self) -> set:
        """The set of devices holding shards."""
        return self.sharding.device_set

    @property
    def addressable_shards(self) -> list[Shard]:
        """One ``Shard`` per device, in the sharding's device order."""
        impl = self._impl
        replicas = impl.sharding.replicas(list(impl.shape))
        shards = []
        for pos, device in enumerate(self.sharding._device_assignment):
            index = tuple(slice(start, stop) for start, stop in impl.shard_index(pos))
            shards.append(Shard(device, index, replicas[pos][0], impl, pos))
        return shards

    @property
    def global_shards(self) -> list[Shard]:
        """Every shard (the same as ``addressable_shards`` on one process)."""
        return self.addressable_shards

    # -- readiness ----------------------------------------------------------------

    def block_until_ready(self) -> Array:
        """Waits (releasing the GIL) until every shard is ready; returns ``self``.

        Raises the error of the computation that failed to produce the array.
        """
        self._impl.block_until_ready()
        return self

    def is_ready(self) -> bool:
        """True when every shard is ready (without waiting)."""
        return self._impl.is_ready()

    async def ready(self) -> Array:
        """Awaits (in asyncio, without blocking the loop) until ready; returns ``self``."""
        await _await_event(self._impl.ready_event())
        return self

    def as_future(self) -> concurrent.futures.Future:
        """A ``concurrent.futures.Future`` that resolves to ``self`` when ready."""
        return _event_future(self._impl.ready_event(), self)

    def delete(self) -> None:
        """Frees the shards (in-flight work and live numpy views keep the data)."""
        self._impl.delete()

    def is_deleted(self) -> bool:
        """True after ``delete()``."""
        return self._impl.is_deleted()

    # -- numpy --------------------------------------------------------------------

    def _shard_value(self, pos: int, shard_shape) -> np.ndarray:
        """Shard ``pos`` as a read-only numpy array (zero-copy for dense dtypes)."""
        dtype = self.dtype
        if dtype == STRING:
            return np.array(self._impl.shard(pos).to_host_strings(), dtype=STRING).reshape(shard_shape)
        if math.prod(shard_shape) == 0:
            self._impl.block_until_ready()
            out = np.zeros(shard_shape, dtype)
            out.flags.writeable = False
            return out
        view = None
        if not (self._impl.on_workers and self._impl.shard(pos).on_workers):
            view = self._impl.host_view(pos)
        if view is None:
            # Outside this process (a worker's, a PJRT accelerator's), or in a
            # plugin's own layout: copied.
            return np.frombuffer(self._impl.shard_bytes(pos), dtype).reshape(shard_shape)
        return np.asarray(view).view(dtype).reshape(shard_shape)

    def _operand(self) -> np.ndarray:
        """The value of a one-buffer array as a ufunc operand: a copy when small
        (cheaper than pinning a view; nobody else sees it), else the view."""
        value = self._impl.small_value()
        return self._value() if value is None else value

    def _value(self) -> np.ndarray:
        """The global value as a read-only numpy array; zero-copy when one buffer
        of this process holds the whole array, else gathered (downloaded from
        workers)."""
        impl = self._impl
        if (impl.num_shards == 1 or impl.sharding.is_fully_replicated) and not impl.on_workers:
            return self._shard_value(0, self.shape)
        dtype = self.dtype
        if dtype == STRING:
            out = np.array(impl.to_host_strings(), dtype=STRING).reshape(self.shape)
        else:
            out = np.empty(self.shape, dtype)
            impl.to_host_into(_address(out), out.nbytes)
        out.flags.writeable = False
        return out

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """The value as numpy. Without ``copy=True`` or a new ``dtype``, a
        read-only view of the buffer when one buffer holds the whole array."""
        value = self._value()
        zero_copy = self._impl.num_shards == 1 or self._impl.sharding.is_fully_replicated
        if dtype is not None and np.dtype(dtype) != value.dtype:
            if copy is False:
                raise ValueError(f"converting {self.dtype} to {np.dtype(dtype)} needs a copy")
            return value.astype(dtype)
        if copy:
            return value.copy()
        if copy is False and not zero_copy:
            raise ValueError("this array is split over several buffers; numpy needs a copy")
        return value

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method != "__call__" or "out" in kwargs:
            return NotImplemented
        if not kwargs and self._impl.num_shards == 1:
            out = _single_buffer_ufunc(ufunc, inputs, self)
            if out is not None:
                return out
        return _apply_ufunc(ufunc, inputs, kwargs)

    def astype(self, dtype) -> Array:
        """A copy converted to ``dtype``, with the same sharding."""
        target = canonicalize(dtype)
        return _map_shards(lambda v: v.astype(target), self)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """DLPack export of the host value (zero-copy when ``__array__`` is)."""
        kwargs = {"stream": stream}
        if max_version is not None:
            kwargs["max_version"] = max_version
        if dl_device is not None:
            kwargs["dl_device"] = dl_device
        if copy is not None:
            kwargs["copy"] = copy
        return self._value().__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(kDLCPU, 0)``: the data is in host memory."""
        return (_DLPACK_CPU, 0)

    def item(self):
        """The single element as a Python scalar."""
        return self._value().item()

    def tolist(self):
        """The value as nested Python lists."""
        return self._value().tolist()

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __float__(self) -> float:
        return float(self._value())

    def __int__(self) -> int:
        return int(self._value())

    def __index__(self) -> int:
        return self._value().__index__()

    def __complex__(self) -> complex:
        return complex(self._value())

    def __bool__(self) -> bool:
        return bool(self._value())

    def __repr__(self) -> str:
        if self._impl.is_deleted():
            return f"Array(<deleted>, shape={self.shape}, dtype={self.dtype})"
        body = np.array2string(self._value(), separator=", ", prefix="Array(")
        return f"Array({body}, dtype={self.dtype})"

    def __str__(self) -> str:
        return str(self._value())


def _wrap(impl: _colocated.ArrayImpl, sharding: Sharding | None) -> Array:
    a = object.__new__(Array)
    a._impl = impl
    a._sharding = sharding
    return a


# -- construction --------------------------------------------------------------------


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


# -- ufuncs --------------------------------------------------------------------------


def _map_shards(fn, template: Array, *shard_args) -> Array | tuple:
    """Applies ``fn`` to each shard of ``template`` (and the matching shards of
    ``shard_args``, each a callable ``(pos, index, shard_shape) -> operand``) and
    assembles the results with the template's sharding."""
    impl = template._impl
    sharding = template.sharding
    shard_shape = sharding.shard_shape(template.shape)
    by_index: dict = {}
    results = []
    for pos in range(impl.num_shards):
        ranges = tuple(impl.shard_index(pos))
        out = by_index.get(ranges)
        if out is None:
            index = tuple(slice(a, b) for a, b in ranges)
            operands = [arg(pos, index, shard_shape) for arg in shard_args]
            out = fn(template._shard_value(pos, shard_shape), *operands)
            by_index[ranges] = out
        results.append(out)
    if isinstance(results[0], tuple):
        return tuple(
            _from_shard_values(template.shape, sharding, [r[k] for r in results], canonicalize(results[0][k].dtype))
            for k in range(len(results[0]))
        )
    return _from_shard_values(template.shape, sharding, results, canonicalize(np.asarray(results[0]).dtype))


_SCALARS = (bool, int, float, complex, np.generic)


def _single_buffer_ufunc(ufunc, inputs, template: Array):
    """The common case made cheap: one buffer and scalar operands (``x + 1``).
    None when the general path is needed."""
    values = []
    for x in inputs:
        if x is template:
            values.append(template._operand())
        elif isinstance(x, _SCALARS):
            values.append(x)
        else:
            return None
    out = ufunc(*values)
    if not isinstance(out, (np.ndarray, np.generic)) or out.dtype.kind == "O":
        return None
    impl = template._impl.small_like(out)
    if impl is not None:
        return _wrap(impl, template._sharding)
    return _put(out, template.sharding)


#: Operands of the operator fast path: Python scalars (numpy's "weak" scalars).
_FAST_OPERANDS = frozenset((int, float, bool))


def _fast_operator(name: str, op, reflected: bool):
    """``Array.<name>`` with a fast path for ``x + 1`` on a small one-buffer array:
    ``+ - * /`` on integer and float arrays computed natively where numpy would
    give the same result and no warning, else one native copy in, numpy's
    operator on the value (numpy scalar math for rank 0), one native copy out.
    Everything else takes numpy's dispatch (``NDArrayOperatorsMixin``, then
    ``__array_ufunc__``)."""
    general = getattr(NDArrayOperatorsMixin, name)

    def operator(self, other):
        if type(other) in _FAST_OPERANDS:
            result = self._impl.scalar_op(op, other, reflected)
            if result is not None:
                return _wrap(result, self._sharding)
        return general(self, other)

    operator.__name__ = operator.__qualname__ = name
    operator.__doc__ = general.__doc__
    return operator


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow"):
    _op = getattr(_operator, _name)
    setattr(Array, f"__{_name}__", _fast_operator(f"__{_name}__", _op, reflected=False))
    setattr(Array, f"__r{_name}__", _fast_operator(f"__r{_name}__", _op, reflected=True))
del _name, _op


def _apply_ufunc(ufunc, inputs, kwargs):
    arrays = [x for x in inputs if isinstance(x, Array)]
    template = arrays[0]
    device_set = template.sharding.device_set
    for a in arrays[1:]:
        if a.sharding.device_set != device_set:
            raise InvalidArgumentError(
                f"{ufunc.__name__}: the arrays are on different devices "
                f"({sorted(d.id for d in device_set)} and {sorted(d.id for d in a.sharding.device_set)})"
            )
    shape = template.shape
    shard_wise = not any(isinstance(v, (Array, np.ndarray)) and np.ndim(v) > 0 for v in kwargs.values())
    operands = []
    for x in inputs:
        if isinstance(x, Array):
            same = x.shape == shape and (
                x._sharding is template._sharding or x.sharding.is_equivalent_to(template.sharding, len(shape))
            )
            shard_wise = shard_wise and same
            operands.append(x)
            continue
        if np.ndim(x) == 0:
            # Kept as given: Python scalars are "weak" in numpy's promotion rules.
            operands.append(x)
            continue
        value = np.asarray(x)
        try:
            shard_wise = shard_wise and np.broadcast_shapes(value.shape, shape) == shape
        except ValueError:
            shard_wise = False
        operands.append(np.broadcast_to(value, shape) if shard_wise else value)
    if not shard_wise:
        return _apply_gathered(ufunc, inputs, kwargs, template)

    def operand_getter(op):
        if isinstance(op, Array):
            return lambda pos, index, shard_shape: op._shard_value(pos, shard_shape)
        if np.ndim(op) == 0:
            return lambda pos, index, shard_shape: op
        return lambda pos, index, shard_shape: op[index]

    # The template's own shard is passed first; the other operands follow in order.
    first = next(k for k, x in enumerate(inputs) if x is template)
    getters = [operand_getter(op) for k, op in enumerate(operands) if k != first]

    def apply(template_shard, *rest):
        args = list(rest)
        args.insert(first, template_shard)
        return ufunc(*args, **kwargs)

    return _map_shards(apply, template, *getters)


def _apply_gathered(ufunc, inputs, kwargs, template: Array):
    """Fallback when shapes or layouts differ: compute on the gathered values and
    lay the result out like the template (replicated over its mesh if the result's
    shape does not split that way)."""
    values = [x._value() if isinstance(x, Array) else x for x in inputs]
    kwargs = {k: v._value() if isinstance(v, Array) else v for k, v in kwargs.items()}
    result = ufunc(*values, **kwargs)

    def place(r):
        try:
            return device_put(r, template.sharding)
        except InvalidArgumentError:
            s = template.sharding
            if isinstance(s, NamedSharding):
                return device_put(r, NamedSharding(s.mesh, PartitionSpec(), memory_kind=s.memory_kind))
            raise

    if isinstance(result, tuple):
        return tuple(place(r) for r in result)
    return place(result)


# -- waiting -------------------------------------------------------------------------


def _tree_events(tree) -> list:
    return [leaf._impl.ready_event() for leaf in optree.tree_leaves(tree) if isinstance(leaf, Array)]


def block_until_ready(x):
    """Waits (releasing the GIL) until every Array in the pytree ``x`` is ready;
    returns ``x``. Raises the first error among them."""
    leaves = optree.tree_leaves(x)
    events = []
    for leaf in leaves:
        if isinstance(leaf, Array):
            events.append(leaf._impl.ready_event())
        elif hasattr(leaf, "block_until_ready"):
            leaf.block_until_ready()
    if events:
        _colocated.Event.join(events).wait()
    return x


def _device_get_leaf(leaf):
    if isinstance(leaf, Array):
        return leaf._value()
    # As jax.device_get: what converts itself to numpy does, the rest passes.
    to_numpy = getattr(leaf, "__array__", None)
    return leaf if to_numpy is None else to_numpy()


def device_get(x):
    """The pytree ``x`` with every ``Array`` replaced by its value as a numpy
    array, as ``jax.device_get``: read-only, and zero-copy when one buffer of
    this process holds the whole array (else gathered, downloaded from
    workers). Other leaves with ``__array__`` are converted with it; the rest
    are returned as they are. Waits (releasing the GIL) for each array, and
    raises the error of a computation that failed to produce one, or
    ``FailedPreconditionError`` for a deleted array."""
    return optree.tree_map(_device_get_leaf, x)


def _settle(fut: asyncio.Future, err, result) -> None:
    if fut.cancelled():
        return
    if err is None:
        fut.set_result(result)
    else:
        fut.set_exception(err)


async def _await_event(event: _colocated.Event, result=None):
    if event.is_ready():
        err = event.error()
        if err is not None:
            raise err
        return result
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def done(err):
        try:
            loop.call_soon_threadsafe(_settle, fut, err, result)
        except RuntimeError:
            pass  # the loop is closed: nobody is awaiting any more

    event.on_ready(done)
    return await fut


async def wait(tree):
    """Awaits (in asyncio) until every Array in the pytree is ready; returns it."""
    events = _tree_events(tree)
    if events:
        await _await_event(_colocated.Event.join(events))
    return tree


def _event_future(event: _colocated.Event, result) -> concurrent.futures.Future:
    fut: concurrent.futures.Future = concurrent.futures.Future()
    fut.set_running_or_notify_cancel()

    def done(err):
        if err is None:
            fut.set_result(result)
        else:
            fut.set_exception(err)

    event.on_ready(done)
    return fut


def clear_caches() -> None:
    """Clears the SDK's caches: the core sharding built for each sharding and the
    per-(sharding, shape) shard index maps. Live arrays and shardings keep working
    (they rebuild what they need); safe to call at any time."""
    _clear_sharding_caches()


__all__ = [
    "Array",
    "Shard",
    "block_until_ready",
    "clear_caches",
    "device_get",
    "device_put",
    "make_array_from_callback",
    "make_array_from_single_device_arrays",
    "wait",
]
