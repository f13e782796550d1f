"""``colocated_python_class``: objects that live on the hosts of their calls.

A drop-in for ``jax.experimental.colocated_python.colocated_python_class``. The
wrapper captures the constructor arguments; the real object is built on a host
when a method first runs there, and every method call is a colocated call. When
the wrapper is garbage-collected, the real objects are destroyed (asynchronously,
after the calls already made on them). Beyond JAX: methods can be specialized
(``obj.method.specialize(...)``), methods without array arguments run once
``devices`` are given, and an object can be an argument of another colocated
call on the same host (it arrives there as the real object).

A constructor that raised is remembered: every later call re-raises its error.

A host keeps its objects per session (``_colocated.current_session()``): on a
worker, each controller's session has its own store, which the programs of other
sessions never see, and every object in it is destroyed when the session ends
(closed, timed out because its controller died, or the worker stopping); the
controller's own host has one implicit session. Within a store, objects are
keyed by random ids. A collected wrapper destroys its objects on workers with
one more colocated call, compiled when the object first ran on that host. When
the calls made on the object are done, the thread that drops the wrapper makes
that call, in its program order (its later calls there see the object gone, as
on the local host); else a background thread makes it once they are.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
import queue
import secrets
import threading
import weakref

import optree

from . import _colocated
from ._colocated_python import (
    LOCAL_SESSION,
    NAMESPACE,
    ColocatedFunction,
    _drop_session_results,
    _flatten,
    _tree_key,
)
from ._errors import ColocatedError

#: The host's object stores, one per session: session -> object id -> the real
#: object, or the constructor's error.
_OBJECTS: dict[int, dict[int, object]] = {}
#: The locks that build each object once: session -> object id -> lock.
_LOCKS: dict[int, dict[int, threading.Lock]] = {}
_STORE_LOCK = threading.Lock()
_LOG = logging.getLogger("colocated")


class _Failed:
    """A constructor's error, re-raised to every call on that object."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _ObjectRef:
    """Identifies one object of a colocated class: the class, an id, and the
    captured constructor arguments (everything a host needs to build it)."""

    __slots__ = ("cls", "init_args", "obj_id")

    def __init__(self, cls, obj_id: int, init_args: tuple) -> None:
        self.cls = cls
        self.obj_id = obj_id
        self.init_args = init_args

    def __eq__(self, other) -> bool:
        return isinstance(other, _ObjectRef) and other.obj_id == self.obj_id

    def __hash__(self) -> int:
        return hash(self.obj_id)

    def __repr__(self) -> str:
        return f"<{self.cls.__name__} object {self.obj_id}>"


def _host_object(ref: _ObjectRef):
    """The real object on this host, in the running program's session: built
    on first use (once, even with calls from several streams), or the
    constructor's error raised again."""
    session = _colocated.current_session()
    objects = _OBJECTS.get(session)
    obj = None if objects is None else objects.get(ref.obj_id)
    if obj is None:
        with _STORE_LOCK:
            lock = _LOCKS.setdefault(session, {}).setdefault(ref.obj_id, threading.Lock())
        with lock:
            objects = _OBJECTS.get(session)
            obj = None if objects is None else objects.get(ref.obj_id)
            if obj is None:
                args, kwargs = ref.init_args
                try:
                    obj = ref.cls(*args, **kwargs)
                except Exception as error:  # noqa: BLE001 - kept for every later call
                    obj = _Failed(error)
                with _STORE_LOCK:
                    _OBJECTS.setdefault(session, {})[ref.obj_id] = obj
    if isinstance(obj, _Failed):
        raise obj.error
    return obj


def _forget(obj_id: int, session: int | None = None) -> None:
    """Drops the host's object of ``session`` (default: the running program's;
    its ``__del__`` runs now, on this thread)."""
    if session is None:
        session = _colocated.current_session()
    with _STORE_LOCK:
        locks = _LOCKS.get(session)
        if locks is not None:
            locks.pop(obj_id, None)
            if not locks:
                del _LOCKS[session]
        objects = _OBJECTS.get(session)
        obj = None if objects is None else objects.pop(obj_id, None)
        if objects is not None and not objects:
            del _OBJECTS[session]
    del obj


def _end_session(session: int) -> None:
    """Frees everything ``session`` left on this host, because it ended: its
    objects (their ``__del__`` runs now, on this thread) and the discovery
    results it parked. The Python language executor calls it once every
    program of the session finished."""
    with _STORE_LOCK:
        objects = _OBJECTS.pop(session, None)
        _LOCKS.pop(session, None)
    _drop_session_results(session)
    if objects:
        _LOG.debug("session %s ended: destroying its %d objects", session, len(objects))
        objects.clear()
    # What they held in reference cycles goes now too, not at some later
    # collection (the executor then gives the memory back to the system).
    gc.collect()


def _forget_program(obj_id: int, device):
    """The compiled argument-less program that forgets object ``obj_id`` on
    ``device``'s host (None when that host is lost: it freed everything)."""
    forget = ColocatedFunction(functools.partial(_forget, obj_id)).specialize(
        devices=[device], out_specs_fn=lambda: None
    )
    leaves, treedef = _flatten(((), {}))
    tree, flat = _tree_key(treedef)
    try:
        return forget._compile(tree, flat, treedef, leaves, []).executable
    except ColocatedError:
        _LOG.debug("could not prepare the destruction of object %s on a worker", obj_id, exc_info=True)
        return None


def _run_forgets(obj_id: int, programs) -> None:
    """Submits each ``_forget_program`` (on the calling thread's stream)."""
    for program in programs:
        try:
            program.execute([])
        except ColocatedError:
            # A lost worker has freed everything already.
            _LOG.debug("could not destroy object %s on a worker", obj_id, exc_info=True)


def _destroy(obj_id: int, pending: list, remote_forgets: dict) -> None:
    """Runs when a wrapper is collected: forgets the object once the calls made
    on it are done, here and on the worker hosts it ran on."""
    if remote_forgets:
        programs = [p for p in remote_forgets.values() if p is not None]
        if any(not e.is_ready() for e in pending):
            _remote_destroyer().put((obj_id, list(pending), programs))
        else:
            # Submitting waits for nothing: in this thread's program order.
            _run_forgets(obj_id, programs)
    # The local host built it for this process's own client.
    events = [e for e in pending if not e.is_ready()]
    if not events:
        _forget(obj_id, LOCAL_SESSION)
        return
    _colocated.Event.join(events).on_ready(lambda _error=None: _forget(obj_id, LOCAL_SESSION))


_DESTROY_QUEUE: queue.SimpleQueue | None = None
_DESTROY_LOCK = threading.Lock()


def _remote_destroyer() -> queue.SimpleQueue:
    """The queue of the thread that destroys objects on workers (started on
    first use): compiling and calling there may wait for the network, which a
    finalizer or a runtime callback must not."""
    global _DESTROY_QUEUE
    with _DESTROY_LOCK:
        if _DESTROY_QUEUE is None:
            _DESTROY_QUEUE = queue.SimpleQueue()
            threading.Thread(
                target=_destroy_remote_objects, args=(_DESTROY_QUEUE,), name="colocated-destroy", daemon=True
            ).start()
        return _DESTROY_QUEUE


def _destroy_remote_objects(jobs: queue.SimpleQueue) -> None:
    while True:
        obj_id, pending, programs = jobs.get()
        for event in pending:
            # A failed call may still have built the object: destroy it anyway.
            with contextlib.suppress(Exception):
                event.wait()
        _run_forgets(obj_id, programs)


def _after_fork_in_child() -> None:
    global _DESTROY_QUEUE, _DESTROY_LOCK
    _DESTROY_QUEUE = None
    _DESTROY_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _invoke(ref: _ObjectRef, name: str, *args, **kwargs):
    return getattr(_host_object(ref), name)(*args, **kwargs)


class _Method:
    """A bound method of a colocated object: a colocated function over it."""

    def __init__(self, owner, name: str, function: ColocatedFunction) -> None:
        self._owner = weakref.ref(owner)
        self._name = name
        self._function = function
        self._pending = owner._pending
        self._obj_id = owner._ref.obj_id
        self._remote_forgets = owner._remote_forgets
        # The devices of the last call (a compiled entry's list, the same
        # object call after call), already looked through.
        self._seen_devices = None

    def __call__(self, *args, **kwargs):
        result, status, devices = self._function._call(args, kwargs)
        if status is not None:
            self._pending[:] = [e for e in self._pending if not e.is_ready()]
            self._pending.append(status)
        if devices is not self._seen_devices:
            self._seen_devices = devices
            for device in devices:
                if device.process_index != 0 and device.host_index not in self._remote_forgets:
                    # Compiled here, so that the wrapper's finalizer only submits it.
                    self._remote_forgets[device.host_index] = _forget_program(self._obj_id, device)
        return result

    def specialize(self, in_specs=None, out_specs_fn=None, devices=None) -> _Method:
        """This method specialized as :meth:`ColocatedFunction.specialize` (beyond
        JAX, whose methods cannot be specialized)."""
        owner = self._owner()
        if owner is None:
            raise ReferenceError("the colocated object is gone")
        specialized = self._function.specialize(in_specs=in_specs, out_specs_fn=out_specs_fn, devices=devices)
        return _Method(owner, self._name, specialized)

    def cache_info(self):
        """The method's cache counts (see :meth:`ColocatedFunction.cache_info`)."""
        return self._function.cache_info()

    def __repr__(self) -> str:
        return f"<colocated method {self._name} of {self._owner()!r}>"


def colocated_python_class(cls):
    """Wraps class ``cls`` so that its objects live on the hosts of their method
    calls' devices (as ``jax.experimental.colocated_python.colocated_python_class``)."""

    class Wrapper:
        __slots__ = ("__weakref__", "_methods", "_pending", "_ref", "_remote_forgets")

        def __init__(self, *args, **kwargs) -> None:
            self._ref = _ObjectRef(cls, secrets.randbits(63), (args, kwargs))
            self._methods = {}
            self._pending = []
            self._remote_forgets = {}
            weakref.finalize(self, _destroy, self._ref.obj_id, self._pending, self._remote_forgets)

        def __getattr__(self, name: str):
            if name.startswith("__"):
                raise AttributeError(name)
            methods = object.__getattribute__(self, "_methods")
            method = methods.get(name)
            if method is None:
                if not callable(getattr(cls, name, None)):
                    raise AttributeError(f"{cls.__name__} has no method {name!r}")
                fn = functools.partial(_invoke, self._ref, name)
                functools.update_wrapper(fn, getattr(cls, name))
                method = _Method(self, name, ColocatedFunction(fn))
                methods[name] = method
            return method

        def __setattr__(self, name: str, value) -> None:
            if name in Wrapper.__slots__:
                object.__setattr__(self, name, value)
            elif isinstance(value, _Method):
                # `obj.method = obj.method.specialize(...)`, as JAX's tests do.
                self._methods[name] = value
            else:
                raise AttributeError(f"colocated objects take only specialized methods, not {name!r}")

        def __repr__(self) -> str:
            return f"colocated_python_class({cls.__qualname__}) object {self._ref.obj_id}"

    Wrapper.__name__ = cls.__name__
    Wrapper.__qualname__ = cls.__qualname__
    Wrapper.__doc__ = cls.__doc__
    Wrapper.__module__ = cls.__module__
    # An object passed to another colocated call travels as its reference and
    # arrives on the host as the real object.
    optree.register_pytree_node(
        Wrapper,
        lambda w: ((), w._ref),
        lambda ref, _children: _host_object(ref),
        namespace=NAMESPACE,
    )
    return Wrapper
