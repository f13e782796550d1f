"""``host_callback``: functions of the controller that colocated functions call.

A colocated function running on any host may call a ``HostCallback``: on the
controller's own host it is a plain call; on a worker the arguments travel to the
controller (cloudpickle), the function runs there, and its result (or its
exception) travels back. The callbacks a function uses are found when it is
pickled for the workers, and compiled into its program, which keeps them alive.

Trust: the controller unpickles the arguments its workers send, as the workers
unpickle the programs the controller sends; connect only to workers you trust.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools

import cloudpickle

from . import _colocated

#: While a program is pickled for workers: the callbacks it uses, by index.
_COLLECTING: contextvars.ContextVar[list | None] = contextvars.ContextVar("colocated_host_callbacks", default=None)


class HostCallback:
    """A function of this (controller) process that colocated functions call on
    any host. Call it like the function."""

    def __init__(self, fn) -> None:
        if not callable(fn):
            raise TypeError(f"host_callback expects a callable, got {type(fn).__name__}")
        self._fn = fn
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        return self._fn(*args, **kwargs)

    def _serve(self, request: bytes) -> bytes:
        """Runs one call that came from a worker: pickled ``(args, kwargs)`` in,
        pickled ``(ok, result or exception)`` out."""
        args, kwargs = cloudpickle.loads(request)
        try:
            return cloudpickle.dumps((True, self._fn(*args, **kwargs)))
        except Exception as error:  # noqa: BLE001 - re-raised on the worker
            return cloudpickle.dumps((False, error))

    def __reduce__(self):
        collected = _COLLECTING.get()
        if collected is None:
            # Pickled outside a program (by the user): the function travels by
            # value and runs where it is unpickled.
            return (HostCallback, (self._fn,))
        for index, known in enumerate(collected):
            if known is self:
                break
        else:
            index = len(collected)
            collected.append(self)
        return (_RemoteHostCallback, (index, getattr(self._fn, "__qualname__", "host_callback")))

    def __repr__(self) -> str:
        return f"host_callback({getattr(self._fn, '__qualname__', self._fn)!r})"


class _RemoteHostCallback:
    """A ``HostCallback`` as a program on a worker sees it: host callback
    ``index`` of the running program."""

    def __init__(self, index: int, name: str) -> None:
        self._index = index
        self.__qualname__ = name

    def __call__(self, *args, **kwargs):
        answer = _colocated.call_host_callback(self._index, cloudpickle.dumps((args, kwargs)))
        ok, value = cloudpickle.loads(answer)
        if ok:
            return value
        raise value

    def __repr__(self) -> str:
        return f"<host callback {self.__qualname__!r} of the controller>"


def host_callback(fn) -> HostCallback:
    """Wraps ``fn`` so that colocated functions running on any host can call it:
    it runs in this (controller) process and its result travels back. Arguments
    and results are pickled with cloudpickle; an exception it raises is raised
    on the calling host."""
    return HostCallback(fn)


@contextlib.contextmanager
def _collecting():
    """Collects the host callbacks pickled inside the block (yields the list)."""
    collected: list[HostCallback] = []
    token = _COLLECTING.set(collected)
    try:
        yield collected
    finally:
        _COLLECTING.reset(token)


def _dumps_with_callbacks(obj) -> tuple[bytes, list]:
    """``obj`` pickled for workers, and the ``_serve`` functions of the host
    callbacks it uses, by index."""
    with _collecting() as collected:
        payload = cloudpickle.dumps(obj)
    return payload, [cb._serve for cb in collected]
