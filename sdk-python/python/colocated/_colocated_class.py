"""``colocated_python_class``: objects that live on the hosts of their calls.

A drop-in for ``jax.experimental.colocated_python.colocated_python_class``. The
wrapper captures the constructor arguments; the real object is built on a host
when a method first runs there, and every method call is a colocated call. When
the wrapper and the methods taken from it are garbage-collected, the real
objects are destroyed (asynchronously, after the calls already made on them). Beyond JAX: methods can be specialized
(``obj.method.specialize(...)``), methods without array arguments run once
``devices`` are given, and an object can be an argument of another colocated
call on the same host (it arrives there as the real object).

The lifecycle is the runtime's (core's colocated objects, shared by every
SDK): a host keeps its objects per session, built once each (a constructor
that raised raises its error again on every later call); on a worker, every
object of a session is destroyed when the session ends (closed, timed out
because its controller died, or the worker stopping); the controller's own
host has one implicit session. A collected object is destroyed on every host
it ran on once the calls made on it are done: in the program order of the
thread that drops it when they already are, else in the background.
"""

from __future__ import annotations

import functools
import weakref

import optree

from . import _colocated
from ._colocated_python import _OBJECT_HANDLES, NAMESPACE, ColocatedFunction


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

    def build(self):
        args, kwargs = self.init_args
        return self.cls(*args, **kwargs)


def _host_object(ref: _ObjectRef):
    """The real object on this host, in the running program's session (see
    ``_colocated.host_object``)."""
    return _colocated.host_object(ref.obj_id, ref.build)


def _invoke(ref: _ObjectRef, name: str, *args, **kwargs):
    return getattr(_host_object(ref), name)(*args, **kwargs)


class _Method:
    """A bound method of a colocated object: a colocated function over it."""

    def __init__(self, owner, name: str, function: ColocatedFunction) -> None:
        self._owner = weakref.ref(owner)
        # A method keeps the object (`Object().method()` works): it is
        # destroyed once neither the wrapper nor a method of it is left.
        self._handle = owner._handle
        self._name = name
        self._function = function

    def __call__(self, *args, **kwargs):
        owner = self._owner()
        handle = owner._live_handle() if owner is not None else self._handle
        if not handle.usable:
            handle = None  # a forked child's call on an object it cannot destroy
        return self._function._call(args, kwargs, handle)[0]

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
        __slots__ = ("__weakref__", "_handle", "_methods", "_ref")

        def __init__(self, *args, **kwargs) -> None:
            # Dropping the handle (with the wrapper) destroys the object.
            self._handle = _colocated.ColocatedObject()
            self._ref = _ObjectRef(cls, self._handle.id, (args, kwargs))
            self._methods = {}

        def _live_handle(self):
            """The object's handle, made anew in a forked child (the parent's
            cannot be used there)."""
            if not self._handle.usable:
                self._handle = _colocated.ColocatedObject(self._ref.obj_id)
            return self._handle

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
    # A call with the object among its arguments uses it too (its destruction
    # waits for that call, on every host the call ran on).
    _OBJECT_HANDLES[Wrapper] = Wrapper._live_handle
    optree.register_pytree_node(
        Wrapper,
        lambda w: ((), w._ref),
        lambda ref, _children: _host_object(ref),
        namespace=NAMESPACE,
    )
    return Wrapper
