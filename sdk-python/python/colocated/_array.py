"""``Array``: a handle to a core array (one buffer per device of its sharding)
plus its Python sharding, its shards, and the fast path of its operators.

Converting to numpy is zero-copy when one buffer holds the whole array (single
device or fully replicated): the numpy array aliases the buffer's memory,
pinned for as long as the numpy array lives.

The data plane built on it lives beside it and is re-exported here:
``device_put`` and ``make_array_from_*`` in ``_device_put``, numpy ufuncs in
``_ufunc``, and ``device_get``, ``block_until_ready`` and the asyncio and
``concurrent.futures`` waits in ``_waiting``.
"""

from __future__ import annotations

import concurrent.futures
import math
import operator as _operator

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from . import _colocated
from ._dtypes import STRING, canonicalize
from ._sharding import Sharding, SingleDeviceSharding, _sharding_from_core

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
            s = _sharding_from_core(self._impl.sharding)
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


# -- operators -------------------------------------------------------------------------


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


# The data plane is built on ``Array``, so it is imported after it (and
# re-exported: the package's modules import these names from here).
from ._device_put import (
    device_put,
    make_array_from_callback,
    make_array_from_single_device_arrays,
)
from ._ufunc import _apply_ufunc, _map_shards, _single_buffer_ufunc
from ._waiting import (
    _await_event,
    _event_future,
    block_until_ready,
    clear_caches,
    device_get,
    wait,
)

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
