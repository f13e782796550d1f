"""``colocated_python``: run a Python function on the hosts that own its inputs.

A drop-in for ``jax.experimental.colocated_python.colocated_python``. The wrapped
function is shipped (cloudpickle) to every host of its inputs' devices and runs
there once per host, with that host's arrays, in program order per calling
thread.

The protocol is the runtime's (core's colocated functions, shared by every
SDK): the device rules of a call, the ``in_specs`` check, the cache of compiled
programs per input spec, and discovery. Without ``out_specs_fn`` the first call
for an input spec runs synchronously to discover the output specs: every host
runs the function once and keeps its outputs, the controller derives the
global specs from what the hosts report, and a second program hands the kept
outputs over as the call's result. Later calls with that spec, and every call
with ``out_specs_fn``, are asynchronous. A host's output with the sharding of
one of its inputs becomes an array with that input's global sharding; any
other output is, on one host, that host's array, and on several hosts (each
having made a block with the same layout over all of its devices of the call)
the hosts' blocks stacked along the first mesh axis, as
``jax.make_array_from_process_local_data`` assembles them. Anything else needs
``out_specs_fn``.

A call with ``jax.Array`` arguments is JAX in, JAX out, as with JAX's own
colocated Python: its programs (apart from those of calls with Arrays) hand
the function the call's arrays as ``jax.Array``s, and the caller gets the
results of this process as ``jax.Array``s, once they are ready (a
``jax.Array`` cannot be pending on another runtime), so such a call returns
when its results are. PRNG keys travel as their key data (``PrngKeys``).

This module supplies what is Python's: the pickled host callable
(``_HostCall``), tree structures (optree) and sharding objects (``_Site``).
"""

from __future__ import annotations

import collections
import functools
import os
import weakref

import cloudpickle
import optree

from . import _colocated
from ._array import Array, _wrap
from ._array import clear_caches as _array_clear_caches
from ._dtypes import core_name
from ._errors import InvalidArgumentError
from ._host_callback import _dumps_with_callbacks
from ._jax import (
    PrngKeys,
    device_of,
    from_jax,
    is_jax_array,
    is_jax_devices,
    is_jax_spec,
    is_prng_key,
    spec_of_jax,
    to_jax,
)
from ._sharding import ShapeDtypeStruct, _sharding_from_core

CacheInfo = collections.namedtuple("CacheInfo", ["hits", "misses", "maxsize", "currsize"])

#: Every live function state, so that ``clear_caches`` reaches them.
_STATES: weakref.WeakSet = weakref.WeakSet()

#: Every live cache of programs made here (``colocated.jit``'s), likewise.
_PROGRAM_CACHES: weakref.WeakSet = weakref.WeakSet()


#: The optree namespace where objects of colocated classes are registered (they
#: flatten to no leaves, their reference kept in the tree structure).
NAMESPACE = "colocated"


def _flatten(tree):
    return optree.tree_flatten(tree, none_is_leaf=False, namespace=NAMESPACE)


optree.register_pytree_node(PrngKeys, PrngKeys.flatten, PrngKeys.unflatten, namespace=NAMESPACE)


def _flatten_keys(tree, leaves: list, treedef) -> tuple[list, object]:
    """``tree``'s leaves and structure (``_flatten``'s ``leaves`` and
    ``treedef``), with each array of JAX PRNG keys a ``PrngKeys`` node whose
    leaf is its key data."""
    if not any(map(is_prng_key, leaves)):
        return leaves, treedef
    return _flatten(optree.tree_map(lambda x: PrngKeys.of(x) if is_prng_key(x) else x, tree, none_is_leaf=False, namespace=NAMESPACE))


#: The tree structure of a flat call with ``n`` arrays, by ``n``.
_FLAT_TREEDEFS: dict[int, object] = {}


def _flat_arity(treedef) -> int | None:
    """``n`` when ``treedef`` is that of ``((a1, ..., an), {})``, else None."""
    n = treedef.num_leaves
    flat = _FLAT_TREEDEFS.get(n)
    if flat is None:
        flat = _FLAT_TREEDEFS.setdefault(n, _flatten((tuple(range(n)), {}))[1])
    return n if treedef == flat else None


#: Core's tree key of each distinct call structure that is not flat, by treedef
#: (equal treedefs, one key: optree sorts a dict's keys, core's rule).
_TREE_KEYS: dict = {}


def _tree_key(treedef) -> tuple[int, int | None]:
    """Core's key of a call's tree structure, and its flat arity (see
    ``_flat_arity``): a flat call's is core's flat key (as the native fast
    path's), every other structure's a key core's interner hands out for it
    (never a hash, which two structures can share)."""
    n = _flat_arity(treedef)
    if n is not None:
        return _colocated.flat_tree_key(n), n
    key = _TREE_KEYS.get(treedef)
    if key is None:
        key = _TREE_KEYS.setdefault(treedef, _colocated.new_tree_key())
    return key, None


def _is_leaf(treedef) -> bool:
    """True when the tree is a single leaf (one array, no containers)."""
    return treedef.num_nodes == 1 and treedef.num_leaves == 1


def _spec_leaf(x) -> tuple:
    """(dtype name, shape, core sharding) of an Array or a ShapeDtypeStruct."""
    if isinstance(x, Array):
        return (x._impl.dtype, list(x.shape), x._impl.sharding)
    if is_jax_spec(x):
        x = spec_of_jax(x)
    if isinstance(x, ShapeDtypeStruct):
        if x.sharding is None:
            raise InvalidArgumentError(f"{x!r} has no sharding; colocated specs need one")
        return (core_name(x.dtype), list(x.shape), x.sharding._core_sharding())
    raise InvalidArgumentError(
        f"expected a ShapeDtypeStruct (colocated's or JAX's) or a colocated.Array, got {type(x).__name__}"
    )


def _spec_of(x) -> ShapeDtypeStruct:
    if isinstance(x, ShapeDtypeStruct):
        return x
    return ShapeDtypeStruct(x.shape, x.dtype, x.sharding)


def _check_arrays(leaves: list, what: str) -> list:
    """``leaves``, each an ``Array``: a ``jax.Array`` of this process becomes
    one (on the corresponding devices); anything else is refused."""
    for i, leaf in enumerate(leaves):
        if type(leaf) is Array or isinstance(leaf, Array):
            continue
        if is_jax_array(leaf):
            leaves[i] = from_jax(leaf)
            continue
        raise InvalidArgumentError(
            f"colocated Python {what} must be colocated Arrays or jax.Arrays; leaf {i} is a {type(leaf).__name__}"
        )
    return leaves


class _HostCall:
    """What runs on each host: unflattens the arguments, calls the function, and
    flattens the outputs (or, when discovering, parks them for the controller)."""

    def __init__(self, fn, in_treedef, in_shardings, out_treedef=None, local=False, jax_in=False) -> None:
        self.fn = fn
        # A call with jax.Arrays: the function gets its arrays as jax.Arrays.
        self.jax_in = jax_in
        # Handed to the local host by reference: a discovery run keeps its
        # result here for the controller (the same process) instead of pickling.
        self.local = local
        self.discovered = None
        self.in_treedef = in_treedef
        # (The native executor's fast path, which hands the function
        # colocated Arrays, takes flat calls without jax.Arrays.)
        self.flat = _flat_arity(in_treedef) is not None and not jax_in
        # The callers' sharding objects: the function sees its inputs as it was
        # given them (`x.sharding == y.sharding` holds across the call).
        self.in_shardings = in_shardings
        # None: a discovery run, which returns the outputs with their structure.
        self.out_treedef = None
        self.out_leaf = False
        if out_treedef is not None:
            self.expect(out_treedef)

    def expect(self, out_treedef) -> None:
        """Takes the output tree every later run must return: the declared
        one, or the one discovery found (the payload that ran discovery runs
        the compiled program too)."""
        self.out_treedef = out_treedef
        self.out_leaf = _is_leaf(out_treedef)

    def __call__(self, impls: list) -> list:
        # (The native executor runs flat programs with one output itself: it calls
        # `fn` and takes `outputs` only for a result that is not one Array.)
        leaves = list(map(_wrap, impls, self.in_shardings))
        if self.jax_in:
            leaves = [to_jax(leaf) for leaf in leaves]
        if self.flat:
            out = self.fn(*leaves)
        else:
            args, kwargs = optree.tree_unflatten(self.in_treedef, leaves)
            out = self.fn(*args, **kwargs)
        return self.outputs(out)

    def outputs(self, out):
        """The ``ArrayImpl``s of the function's result ``out``, checked against the
        output tree (the runtime checks their specs); in a discovery run, the
        ``ArrayImpl``s and the pickled tree structure."""
        if self.out_leaf and type(out) is Array:
            # One array out, as the specs say (the runtime checks its spec).
            return [out._impl]
        leaves, treedef = _flatten(out)
        leaves, treedef = _flatten_keys(out, leaves, treedef)
        leaves = _check_arrays(leaves, "function outputs")
        if self.out_treedef is None:
            if self.local:
                # The compiled program runs this very object, with no
                # structure from core (the controller kept it unpickled).
                self.discovered = (leaves, treedef)
                self.expect(treedef)
                return [leaf._impl for leaf in leaves], b""
            return [leaf._impl for leaf in leaves], _dump_structure(treedef)
        if treedef != self.out_treedef:
            # Core's rule and words (`set_host_outputs`), checked here on
            # trees, without pickling the result's.
            raise InvalidArgumentError(
                "the function returned a result of another structure than its program's (its first "
                f"call's result, or its declared output specs): {treedef} but {self.out_treedef} was expected"
            )
        return [leaf._impl for leaf in leaves]


def _load_program(host_call, structure: bytes | None) -> tuple | None:
    """A host callable being loaded (a hook of the native module): it takes the
    output structure core carries with the program (``structure``, pickled;
    None: none), and its fast path is returned: the function and the callers'
    input shardings of a ``_HostCall`` that takes positional arrays and
    returns one array, else None."""
    if not isinstance(host_call, _HostCall):
        return None
    if structure is not None and host_call.out_treedef is None:
        host_call.expect(cloudpickle.loads(structure))
    if host_call.flat and host_call.out_leaf:
        return host_call.fn, host_call.in_shardings
    return None


def _dump_structure(treedef) -> bytes:
    """A worker's discovered output structure, for the controller (the
    runtime carries each output's sharding and memory kind)."""
    return cloudpickle.dumps(treedef)


class _Site:
    """What the runtime asks of the SDK for a call that has no compiled program
    yet (core's call site): the payload of the program for its input spec, the
    output specs ``out_specs_fn`` declares, and the Python forms of the
    outputs (tree structure, sharding objects)."""

    __slots__ = (
        "_declared_shardings",
        "declared_treedef",
        "function",
        "jax_in",
        "leaves",
        "local_programs",
        "portable",
        "probe",
        "treedef",
    )

    def __init__(
        self, function: ColocatedFunction, treedef, leaves: list, portable: bool = False, jax_in: bool = False
    ) -> None:
        self.function = function
        # A call with jax.Arrays (see `_HostCall`).
        self.jax_in = jax_in
        # A program compiled ahead to be serialized: its payload travels by
        # value even for the controller's own host.
        self.portable = portable
        self.treedef = treedef
        self.leaves = leaves
        self.declared_treedef = None
        self._declared_shardings = None
        # Callables handed to the local host by reference: it runs the very
        # function object, as JAX does for local devices (remote hosts get
        # cloudpickle bytes). Each stays in core's registry while this call
        # or a program loaded from it holds it.
        self.local_programs = []
        # The local host's discovery run, when the call is on it alone.
        self.probe = None

    def declared(self):
        """The spec leaves ``out_specs_fn`` gives for this call, or None."""
        out_specs_fn = self.function._out_specs_fn
        if out_specs_fn is None:
            return None
        args, kwargs = optree.tree_unflatten(self.treedef, [_spec_of(leaf) for leaf in self.leaves])
        specs, self.declared_treedef = _flatten(out_specs_fn(*args, **kwargs))
        specs = [spec_of_jax(spec) if is_jax_spec(spec) else spec for spec in specs]
        for spec in specs:
            if not isinstance(spec, ShapeDtypeStruct):
                raise InvalidArgumentError(
                    f"out_specs_fn must return ShapeDtypeStructs (colocated's or JAX's), got {type(spec).__name__}"
                )
        self._declared_shardings = [spec.sharding for spec in specs]
        return [_spec_leaf(spec) for spec in specs]

    def _discovered(self, structure: bytes) -> tuple:
        """The output tree of a discovery run and, from the local host, each
        leaf's sharding object (None from workers)."""
        if self.probe is not None and self.probe.discovered is not None:
            leaves, treedef = self.probe.discovered
            # The compiled program runs the probe: it keeps no result.
            self.probe.discovered = None
            return treedef, [leaf.sharding for leaf in leaves]
        return cloudpickle.loads(structure), None

    def _out_sharding(self, j, own, core):
        """An output's sharding object, where the runtime placed it: the
        caller's object of input ``j`` (the runtime found the output to have
        that input's sharding in every respect, memory kind included); else
        the object the function made, when it ran on the local host
        (``own``); else one over the runtime's sharding ``core``."""
        if j is not None:
            return self.leaves[j].sharding
        return own if own is not None else _sharding_from_core(core)

    def same_structure(self, a: bytes, b: bytes) -> bool:
        """Whether two workers' discovered structures are the same (as trees,
        whatever their pickled bytes)."""
        return cloudpickle.loads(a) == cloudpickle.loads(b)

    def payload(self, remote: bool) -> tuple[bytes, list]:
        """The program's payload and host callbacks: the host callable, which
        runs the discovery run (when the outputs are not declared) and the
        compiled program alike (core carries the output structure apart).
        Across hosts the inputs are each host's part of each array, with its
        own sharding (the callers' objects name devices of other hosts)."""
        fn = self.function._fn
        remote = remote or self.portable
        in_shardings = [None] * len(self.leaves) if remote else [leaf.sharding for leaf in self.leaves]
        host_call = _HostCall(
            fn, self.treedef, in_shardings, self.declared_treedef, local=not remote, jax_in=self.jax_in
        )
        if remote:
            return _dumps_with_callbacks(host_call)
        if self.declared_treedef is None:
            self.probe = host_call
        local = _colocated.LocalProgram(host_call)
        # Loading keeps it (with the executable); the call lets go of it.
        self.local_programs.append(local)
        return local.reference, []

    def entry(self, structure: bytes, origins: list, cores: list) -> tuple:
        """What the native fast path keeps with the compiled program: the
        output tree, the output sharding objects (see ``_out_sharding``; the
        runtime's ``cores`` say each output's global sharding and memory
        kind), the flat arity and whether the output is one array."""
        if self.declared_treedef is not None:
            out_treedef, shardings = self.declared_treedef, self._declared_shardings
        else:
            out_treedef, owns = self._discovered(structure)
            owns = owns or [None] * len(cores)
            shardings = [self._out_sharding(j, own, core) for j, own, core in zip(origins, owns, cores)]
        return out_treedef, shardings, _flat_arity(self.treedef), _is_leaf(out_treedef)


class ColocatedFunction(_colocated.FunctionBase):
    """A function wrapped by :func:`colocated_python`. Call it like the function;
    :meth:`specialize` gives a copy with more information about its calls.

    Calling it runs natively (the base class's ``__call__``) when the arguments
    are positional Arrays and a program is compiled for their spec; every other
    call takes :meth:`_call_general`."""

    def __init__(self, fn, *, in_specs=None, out_specs_fn=None, devices=None) -> None:
        self._fn = fn
        self._in_specs = in_specs
        self._out_specs_fn = out_specs_fn
        # Specialized with JAX's devices: the results are jax.Arrays (see
        # `_JaxDevicesFunction`). The devices as given, for later specializations.
        self._given_devices = devices
        self._jax_devices = devices is not None and is_jax_devices(list(devices))
        if self._jax_devices:
            devices = [device_of(d) for d in devices]
        self._devices = None if devices is None else list(devices)
        self._state = self._new_state()
        # Calls with jax.Arrays have programs of their own: theirs hand the
        # function jax.Arrays.
        self._jax_state = self._new_state()
        functools.update_wrapper(self, fn)

    def _new_state(self):
        in_spec_key = None
        if self._in_specs is not None:
            leaves, treedef = _flatten(self._in_specs)
            in_spec_key = (_tree_key(treedef)[0], [_spec_leaf(leaf) for leaf in leaves])
        name = getattr(self._fn, "__qualname__", "colocated_python")
        state = _colocated.FunctionState(name, self._devices, in_spec_key)
        _STATES.add(state)
        self._pid = os.getpid()
        return state

    def specialize(self, in_specs=None, out_specs_fn=None, devices=None) -> ColocatedFunction:
        """A copy specialized with ``in_specs`` (a ``(args, kwargs)`` pytree of
        ``ShapeDtypeStruct``), ``out_specs_fn`` (input specs -> output specs; makes
        every call asynchronous) and/or ``devices`` (lets argument-less calls run;
        devices of any client). Specializing a field twice raises
        ``InvalidArgumentError`` (JAX's "... already specified")."""
        for name, value, current in (
            ("in_specs", in_specs, self._in_specs),
            ("out_specs_fn", out_specs_fn, self._out_specs_fn),
            ("devices", devices, self._devices),
        ):
            if value is not None and current is not None:
                raise InvalidArgumentError(f"{name} already specified")
        devices = self._given_devices if devices is None else devices
        jax_devices = devices is not None and is_jax_devices(list(devices))
        return (_JaxDevicesFunction if jax_devices else ColocatedFunction)(
            self._fn,
            in_specs=self._in_specs if in_specs is None else in_specs,
            out_specs_fn=self._out_specs_fn if out_specs_fn is None else out_specs_fn,
            devices=devices,
        )

    def cache_info(self) -> CacheInfo:
        """Hits, misses and size of the cache of compiled programs per input spec."""
        hits, misses, size = self._state.cache_info()
        more = self._jax_state.cache_info()
        hits, misses, size = hits + more[0], misses + more[1], size + more[2]
        return CacheInfo(hits, misses, None, size)

    def _call_general(self, args, kwargs):
        """A call the native fast path left over: first calls, pytrees, keyword
        arguments, non-Array arguments (an error), a forked child."""
        return self._call(args, kwargs or {})[0]

    def _call(self, args, kwargs, obj=None):
        """The call's result and its status event (None when it already ran);
        ``obj``: the ``_colocated.ColocatedObject`` the call is a method of."""
        if self._pid != os.getpid():
            # A forked child: the parent's compiled programs belong to the parent's
            # runtime (and its locks may be held): start over with the child's.
            self._state = self._new_state()
            self._jax_state = self._new_state()
        leaves, treedef = _flatten((args, kwargs))
        jax_in = any(map(is_jax_array, leaves))
        state = self._state
        if jax_in:
            # jax.Arrays in: the function gets the call's arrays as
            # jax.Arrays, and the caller gets jax.Arrays back.
            leaves, treedef = _flatten_keys((args, kwargs), leaves, treedef)
            state = self._jax_state
        leaves = _check_arrays(leaves, "function arguments")
        impls = [leaf._impl for leaf in leaves]
        tree, _flat = _tree_key(treedef)
        site = _Site(self, treedef, leaves, jax_in=jax_in)
        # The objects the call uses: it is a method of `obj`, and objects among
        # its arguments are built (or used) on its hosts too.
        objects = [] if obj is None else [obj]
        if _OBJECT_HANDLES:
            objects += _argument_objects(args, kwargs)
        try:
            result, event = state.call_general(tree, impls, site, objects)
        finally:
            site.local_programs.clear()
        if jax_in or self._jax_devices:
            result = _to_jax_outputs(result)
        return result, event

    def compile(self, *args, **kwargs):
        """Compiles the program for arguments of these specs (``ShapeDtypeStruct``
        leaves with shardings, or Arrays) ahead of a call, with the outputs
        ``out_specs_fn`` declares, and returns the ``Executable``: its
        ``serialize()`` bytes load on any client of the same hosts (Node's
        ``deserializeAndLoad`` among them), where the program runs on Python
        hosts. Later calls of that spec take it. Raises ``InvalidArgumentError``
        without ``out_specs_fn`` (discovering the outputs runs the function)."""
        leaves, treedef = _flatten((args, kwargs))
        leaves = [spec_of_jax(leaf) if is_jax_spec(leaf) else leaf for leaf in leaves]
        for i, leaf in enumerate(leaves):
            if not isinstance(leaf, (Array, ShapeDtypeStruct)):
                raise InvalidArgumentError(
                    f"compile takes ShapeDtypeStructs or Arrays; leaf {i} is a {type(leaf).__name__}"
                )
        tree, _flat = _tree_key(treedef)
        site = _Site(self, treedef, leaves, portable=True)
        try:
            return self._state.compile_ahead(tree, [_spec_leaf(leaf) for leaf in leaves], site)
        finally:
            site.local_programs.clear()

    def __repr__(self) -> str:
        return f"colocated_python({getattr(self._fn, '__qualname__', self._fn)!r})"


class _JaxDevicesFunction(ColocatedFunction):
    """A colocated function specialized with JAX's devices: every call gives
    ``jax.Array``s, so none takes the native path (which gives Arrays)."""

    def __call__(self, *args, **kwargs):
        return self._call(args, kwargs)[0]


def _to_jax_outputs(result):
    """A call's result with each Array of this process as a ``jax.Array``
    (``to_jax``, which waits for it); an Array of a worker stays as it is."""

    def convert(leaf):
        if isinstance(leaf, Array) and all(d.process_index == 0 for d in leaf.sharding.device_set):
            return to_jax(leaf)
        return leaf

    return optree.tree_map(convert, result, none_is_leaf=False, namespace=NAMESPACE)


#: How to find the handle of a colocated object among a call's arguments, by
#: wrapper class (``_colocated_class`` registers each); empty until one exists.
_OBJECT_HANDLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _argument_objects(args, kwargs) -> list:
    """The usable handles of the colocated objects among ``args`` and ``kwargs``
    (outside the colocated namespace their wrappers are leaves)."""
    handles = []
    for leaf in optree.tree_leaves((args, kwargs), none_is_leaf=False):
        live = _OBJECT_HANDLES.get(type(leaf))
        if live is not None:
            handle = live(leaf)
            if handle.usable:
                handles.append(handle)
    return handles


def colocated_python(fn) -> ColocatedFunction:
    """Wraps ``fn`` to run on the hosts that own its input arrays' devices (as
    ``jax.experimental.colocated_python.colocated_python``)."""
    return ColocatedFunction(fn)


def clear_caches() -> None:
    """Clears every cache of the SDK: the compiled programs of every colocated
    function (their ``cache_info`` restarts at zero) and the sharding caches. Works
    every time; live arrays, functions and objects keep working (they recompile or
    rebuild what they need)."""
    _array_clear_caches()
    for state in list(_STATES):
        state.clear()
    for owner in list(_PROGRAM_CACHES):
        owner.clear_cache()
