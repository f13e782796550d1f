"""XLA programs: StableHLO modules compiled by a PJRT plugin and run on its devices."""

from __future__ import annotations

from collections.abc import Sequence

from . import _colocated
from ._array import Array, _wrap, device_put
from ._client import client as _client_default
from ._client import devices as _devices
from ._errors import InvalidArgumentError
from ._jax import is_jax_array


class XlaExecutable:
    """A StableHLO module compiled for a PJRT plugin's devices.

    Calling it runs the program once with ``Array`` arguments whose shapes,
    dtypes and shardings are those of the module's ``@main``; it returns at
    once with the results as ``Array``s (one, or a tuple for several), which
    become ready when the program has run. Calls run in program order on the
    calling thread's stream, after the work that makes their inputs; an error
    in the program reaches its results (raised when they are read).
    """

    __slots__ = ("_impl",)

    def __init__(self, impl: _colocated.Executable) -> None:
        self._impl = impl

    @property
    def devices(self) -> list[_colocated.Device]:
        """The devices it runs on; partition ``p`` of an SPMD module on the ``p``-th."""
        return self._impl.devices()

    def serialize(self) -> bytes:
        """Versioned bytes for ``deserialize_and_load``: with the plugin's own
        compiled executable when it was compiled in this process (it then loads
        without compiling on the same plugin and version only), else the module."""
        return self._impl.serialize()

    def __call__(self, *args: Array) -> Array | tuple[Array, ...]:
        outputs = self._impl.call([a._impl if a.__class__ is Array else self._impl_of(a, args) for a in args])
        if len(outputs) == 1:
            return _wrap(outputs[0], None)
        return tuple([_wrap(o, None) for o in outputs])


    def _impl_of(self, a: object, args: tuple) -> _colocated.ArrayImpl:
        """The runtime array of argument ``a`` (of ``args``): an ``Array`` of a
        subclass, or a ``jax.Array`` put on the program's device (a program
        over several devices takes Arrays laid out as its module says)."""
        if isinstance(a, Array):
            return a._impl
        i = next(i for i, b in enumerate(args) if b is a)
        if is_jax_array(a):
            devices = self.devices
            if len(devices) != 1:
                raise InvalidArgumentError(
                    f"argument {i} is a jax.Array, and this program runs on {len(devices)} devices: "
                    "device_put it with the sharding the module gives it"
                )
            return device_put(a, devices[0])._impl
        raise InvalidArgumentError(
            f"argument {i} must be a colocated Array (colocated.device_put) or a jax.Array, got {type(a).__name__}"
        )


def deserialize_and_load(data: bytes, client: _colocated.Client | None = None) -> XlaExecutable:
    """Loads what ``XlaExecutable.serialize()`` gave on ``client`` (default: the
    default client), whose devices must include the program's.

    Raises ``InvalidArgumentError`` saying why for bytes that are truncated,
    corrupted or of another format version, or for an executable compiled by
    another plugin or plugin version.
    """
    if not isinstance(data, bytes | bytearray):
        raise InvalidArgumentError(f"data must be bytes, got {type(data).__name__}")
    return XlaExecutable(_colocated.Executable.deserialize_and_load(bytes(data), client or _client_default()))


def _module_text(module: object) -> bytes:
    """The MLIR text of ``module``: text as given; JAX's ``Lowered``
    (``jax.jit(f).lower(...)``) and ``jax.export.Exported`` as their text."""
    if isinstance(module, str):
        return module.encode()
    if isinstance(module, bytes | bytearray):
        return bytes(module)
    for method in ("as_text", "mlir_module"):  # Lowered, Exported
        text = getattr(module, method, None)
        if callable(text):
            text = text()
            if isinstance(text, str):
                return text.encode()
    raise InvalidArgumentError(
        "module must be MLIR text (str or bytes), a jax Lowered (jax.jit(f).lower(...)) "
        f"or a jax.export.Exported, got {type(module).__name__}"
    )


def compile_stablehlo(module: object, devices: Sequence[_colocated.Device] | None = None) -> XlaExecutable:
    """Compiles ``module``, a StableHLO module, for ``devices`` of a PJRT
    plugin (default: the first device of the default backend; an SPMD module
    with ``mhlo.num_partitions = n`` takes ``n`` devices). The module is MLIR
    text (``str`` or ``bytes``), or what JAX gives: a ``Lowered``
    (``jax.jit(f).lower(...)``, read with ``as_text()``) or a
    ``jax.export.Exported`` (read with ``mlir_module()``). The compiled
    program's arguments and results have the shapes, dtypes and shardings of
    the module's ``@main``.

    Raises ``InvalidArgumentError`` for a module the compiler refuses (with its
    message) or devices that do not fit it, and ``UnimplementedError`` for what
    is not supported (MLIR bytecode, replicas, dynamic shapes).
    """
    text = _module_text(module)
    if devices is None:
        devices = _devices()[:1]
    return XlaExecutable(_colocated.Executable.compile_stablehlo(text, list(devices)))
