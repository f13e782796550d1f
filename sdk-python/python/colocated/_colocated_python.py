"""``colocated_python``: run a Python function on the hosts that own its inputs.

A drop-in for ``jax.experimental.colocated_python.colocated_python``. The wrapped
function is shipped (cloudpickle) to every host of its inputs' devices and runs
there once per host, with that host's arrays, in program order per calling
thread. Semantics that every SDK shares live in the runtime: the device rules of
a call, the ``in_specs`` check and the cache of compiled programs per input spec
(``_colocated.FunctionState``).

Without ``out_specs_fn`` the first call for an input spec runs synchronously to
discover the output specs (the outputs of that run are the call's result); later
calls with that spec, and every call with ``out_specs_fn``, are asynchronous.

On worker hosts (``colocated.connect``) the function runs with that host's part
of each array. Discovery there runs it once per host, each host parking its
outputs and reporting their specs to the controller (a host callback); a second
program pops the parked outputs as global arrays. A host's output that has the
sharding of one of its inputs becomes a global array with that input's global
sharding; any other output of a call on one host keeps its own sharding (over
that host's devices); other outputs of calls over several hosts need
``out_specs_fn``.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import os
import secrets
import threading
import weakref

import numpy as np
import optree

from . import _colocated
from ._array import Array, _wrap
from ._array import clear_caches as _array_clear_caches
from ._dtypes import core_name
from ._errors import ColocatedError, InvalidArgumentError
from ._host_callback import HostCallback, _dumps_with_callbacks
from ._sharding import AxisType, Mesh, NamedSharding, PartitionSpec, ShapeDtypeStruct, SingleDeviceSharding

CacheInfo = collections.namedtuple("CacheInfo", ["hits", "misses", "maxsize", "currsize"])

#: Results of discovery runs, parked by the host until the controller takes them:
#: per session (``_colocated.current_session()``: a worker serves several
#: controllers, and frees what a session parked when it ends), by a random key.
_RESULTS: dict[int, dict[int, tuple]] = {}
_RESULTS_LOCK = threading.Lock()
_NEXT_RESULT = itertools.count()

#: The session of the programs a process runs for its own client (the
#: controller's own host): it never ends.
LOCAL_SESSION = 0


def _park(key: int, parked: tuple) -> None:
    """Parks a discovery run's outputs under ``key``, in the running program's
    session."""
    session = _colocated.current_session()
    with _RESULTS_LOCK:
        _RESULTS.setdefault(session, {})[key] = parked


def _take(key: int, session: int | None = None):
    """The outputs parked under ``key`` in ``session`` (default: the running
    program's), no longer parked; None when there are none."""
    if session is None:
        session = _colocated.current_session()
    with _RESULTS_LOCK:
        results = _RESULTS.get(session)
        if results is None:
            return None
        parked = results.pop(key, None)
        if not results:
            del _RESULTS[session]
    return parked


def _drop_session_results(session: int) -> None:
    """Frees every result ``session`` parked (it ended)."""
    with _RESULTS_LOCK:
        dropped = _RESULTS.pop(session, None)
    # Freed here, outside the lock.
    del dropped


def _new_key() -> int:
    """A key no other controller of a shared worker picks."""
    return secrets.randbits(63)

#: Host callables handed to the local host by reference while it loads them (it
#: runs the very function object, as JAX does for local devices; remote hosts get
#: cloudpickle bytes).
_LOCAL_PROGRAMS: dict[int, object] = {}
_LOCAL_PREFIX = b"colocated-local:"

#: Every live function state, so that ``clear_caches`` reaches them.
_STATES: weakref.WeakSet = weakref.WeakSet()


#: The optree namespace where objects of colocated classes are registered (they
#: flatten to no leaves, their reference kept in the tree structure).
NAMESPACE = "colocated"


def _flatten(tree):
    return optree.tree_flatten(tree, none_is_leaf=False, namespace=NAMESPACE)


#: High bits of the tree key of a flat call: ``n`` positional arrays, no keywords
#: (``flat_key`` in the native module, whose fast path handles such calls).
_FLAT_KEY = 0xF1A7_0000_0000_0000

#: The tree structure of a flat call with ``n`` arrays, by ``n``.
_FLAT_TREEDEFS: dict[int, object] = {}


def _flat_arity(treedef) -> int | None:
    """``n`` when ``treedef`` is that of ``((a1, ..., an), {})``, else None."""
    n = treedef.num_leaves
    flat = _FLAT_TREEDEFS.get(n)
    if flat is None:
        flat = _FLAT_TREEDEFS.setdefault(n, _flatten((tuple(range(n)), {}))[1])
    return n if treedef == flat else None


def _tree_key(treedef) -> tuple[int, int | None]:
    """The runtime's unsigned 64-bit key of a call's tree structure, and its flat
    arity (see ``_flat_arity``). Flat calls share one key space with the native
    fast path; other structures use their hash."""
    n = _flat_arity(treedef)
    if n is not None:
        return _FLAT_KEY | n, n
    return hash(treedef) & 0xFFFF_FFFF_FFFF_FFFF, None


def _is_leaf(treedef) -> bool:
    """True when the tree is a single leaf (one array, no containers)."""
    return treedef.num_nodes == 1 and treedef.num_leaves == 1


def _spec_leaf(x) -> tuple:
    """(dtype name, shape, core sharding) of an Array or a ShapeDtypeStruct."""
    if isinstance(x, Array):
        return (x._impl.dtype, list(x.shape), x._impl.sharding)
    if isinstance(x, ShapeDtypeStruct):
        if x.sharding is None:
            raise InvalidArgumentError(f"{x!r} has no sharding; colocated specs need one")
        return (core_name(x.dtype), list(x.shape), x.sharding._core_sharding())
    raise InvalidArgumentError(
        f"expected colocated.ShapeDtypeStruct or colocated.Array, got {type(x).__name__}"
    )


def _spec_of(x: Array) -> ShapeDtypeStruct:
    return ShapeDtypeStruct(x.shape, x.dtype, x.sharding)


def _check_arrays(leaves: list, what: str) -> None:
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, Array):
            raise InvalidArgumentError(
                f"colocated Python {what} must be colocated Arrays; leaf {i} is a {type(leaf).__name__}"
            )


class _HostCall:
    """What runs on each host: unflattens the arguments, calls the function, and
    flattens the outputs (or, when discovering, parks them for the controller)."""

    def __init__(self, fn, in_treedef, in_shardings, out_treedef=None, result_key=None, report=None) -> None:
        self.fn = fn
        self.in_treedef = in_treedef
        self.flat = _flat_arity(in_treedef) is not None
        # The callers' sharding objects: the function sees its inputs as it was
        # given them (`x.sharding == y.sharding` holds across the call).
        self.in_shardings = in_shardings
        self.out_treedef = out_treedef
        self.out_leaf = out_treedef is not None and _is_leaf(out_treedef)
        self.result_key = result_key
        # Discovery on workers: tells the controller the specs of what was parked.
        self.report = report

    def __call__(self, impls: list) -> list:
        # (The native executor runs flat programs with one output itself: it calls
        # `fn` and takes `outputs` only for a result that is not one Array.)
        leaves = list(map(_wrap, impls, self.in_shardings))
        if self.flat:
            out = self.fn(*leaves)
        else:
            args, kwargs = optree.tree_unflatten(self.in_treedef, leaves)
            out = self.fn(*args, **kwargs)
        return self.outputs(out, leaves)

    def outputs(self, out, inputs=()) -> list:
        """The ``ArrayImpl``s of the function's result ``out``, checked against the
        output specs (or parked for the controller, when discovering; then
        ``inputs``, the function's input arrays, describe the outputs)."""
        if self.out_leaf and type(out) is Array:
            # One array out, as the specs say (the runtime checks its spec).
            return [out._impl]
        leaves, treedef = _flatten(out)
        _check_arrays(leaves, "function outputs")
        if self.result_key is not None:
            _park(self.result_key, (leaves, treedef))
            if self.report is not None:
                self.report(treedef, [_describe(leaf, inputs) for leaf in leaves])
            return []
        if treedef != self.out_treedef:
            raise InvalidArgumentError(
                f"the function returned {treedef} but its output specs say {self.out_treedef}"
            )
        return [leaf._impl for leaf in leaves]


def _describe(out: Array, inputs) -> tuple:
    """How a host's output relates to its inputs, for the controller to give it
    a global spec: ``(j, out shape, shape of input j, dtype)`` when it has the
    sharding of input ``j``, else ``(None, out shape, its layout, dtype)`` (see
    ``_layout``)."""
    for j, x in enumerate(inputs):
        if x.ndim == out.ndim and x.sharding == out.sharding:
            return (j, tuple(out.shape), tuple(x.shape), out.dtype)
    return (None, tuple(out.shape), _layout(out.sharding), out.dtype)


def _layout(sharding) -> tuple | None:
    """A host's sharding in terms every process reads alike: its devices as
    positions among the host's devices (a worker numbers its devices its own
    way), its mesh, spec and memory kind. None for a sharding over several
    hosts."""
    host = _colocated.host_devices(sharding._device_assignment[0])
    try:
        positions = [host.index(d) for d in sharding._device_assignment]
    except ValueError:
        return None
    if isinstance(sharding, NamedSharding):
        mesh = sharding.mesh
        types = tuple(t.name for t in mesh.axis_types)
        return ("named", positions, mesh.devices.shape, mesh.axis_names, types, tuple(sharding.spec),
                sharding.memory_kind)
    return ("single", positions, sharding.memory_kind)


def _from_layout(layout: tuple, device):
    """The sharding ``_layout`` described, over the devices of ``device``'s host."""
    host = _colocated.host_devices(device)
    devices = [host[p] for p in layout[1]]
    if layout[0] == "single":
        return SingleDeviceSharding(devices[0], memory_kind=layout[2])
    _, _, shape, names, types, spec, memory_kind = layout
    grid = np.empty(len(devices), dtype=object)
    grid[:] = devices
    mesh = Mesh(grid.reshape(shape), names, tuple(AxisType[t] for t in types))
    return NamedSharding(mesh, PartitionSpec(*spec), memory_kind=memory_kind)


class _PopResults:
    """A host's part of the second discovery program on workers: the outputs
    the first one parked under ``key``."""

    def __init__(self, key: int) -> None:
        self.key = key

    def __call__(self, _impls: list) -> list:
        parked = _take(self.key)
        if parked is None:
            raise InvalidArgumentError("no parked result on this host (the discovery run did not finish here)")
        return [leaf._impl for leaf in parked[0]]


class _DropResults:
    """A host's part of the program that forgets the outputs a failed
    discovery run parked under ``key`` (if it got that far there)."""

    def __init__(self, key: int) -> None:
        self.key = key

    def __call__(self, _impls: list) -> list:
        _take(self.key)
        return []


class _Reports:
    """What each host's discovery run reported: (tree structure, output
    descriptions) per host. Host callbacks run on several threads at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reports: list = []

    def add(self, treedef, descriptions) -> None:
        with self._lock:
            self.reports.append((treedef, descriptions))

    def global_specs(self, leaves: list, devices: list) -> tuple:
        """The output tree structure and global output specs of a call on
        ``devices`` (see the module docs), checked to agree across hosts."""
        num_hosts = len({d.host_index for d in devices})
        if len(self.reports) != num_hosts:
            raise InvalidArgumentError(
                f"{len(self.reports)} of {num_hosts} hosts reported their outputs during discovery"
            )
        treedef = self.reports[0][0]
        if any(t != treedef for t, _ in self.reports):
            raise InvalidArgumentError("the colocated function returned different structures on different hosts")
        specs = []
        for k, first in enumerate(self.reports[0][1]):
            if any(d[k] != first for _, d in self.reports):
                raise InvalidArgumentError(
                    f"output {k} differs in shape or dtype between hosts; give the function out_specs_fn"
                )
            j, out_shape, in_shape, dtype = first
            if j is None:
                layout = in_shape  # see `_describe`
                if num_hosts == 1 and layout is not None:
                    # One host: the output is global as it is.
                    specs.append(ShapeDtypeStruct(out_shape, dtype, _from_layout(layout, devices[0])))
                    continue
                raise InvalidArgumentError(
                    f"output {k} has the sharding of none of the inputs on its hosts, so its global spec "
                    "is unknown; give the function out_specs_fn"
                )
            x = leaves[j]
            shape = tuple(o * (g // n) if n else o for o, g, n in zip(out_shape, x.shape, in_shape))
            specs.append(ShapeDtypeStruct(shape, dtype, x.sharding))
        return treedef, specs


class _Entry:
    """A compiled program for one input spec."""

    __slots__ = ("devices", "executable", "in_treedef", "out_shardings", "out_treedef")

    def __init__(self, executable, in_treedef, out_treedef, out_shardings, devices) -> None:
        self.executable = executable
        self.in_treedef = in_treedef
        self.out_treedef = out_treedef
        self.out_shardings = out_shardings
        self.devices = devices


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
        self._devices = None if devices is None else list(devices)
        self._state = self._new_state()
        functools.update_wrapper(self, fn)

    def _new_state(self):
        in_spec_key = None
        if self._in_specs is not None:
            leaves, treedef = _flatten(self._in_specs)
            in_spec_key = (_tree_key(treedef)[0], [_spec_leaf(leaf) for leaf in leaves])
        state = _colocated.FunctionState(self._devices, in_spec_key)
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
        return ColocatedFunction(
            self._fn,
            in_specs=self._in_specs if in_specs is None else in_specs,
            out_specs_fn=self._out_specs_fn if out_specs_fn is None else out_specs_fn,
            devices=self._devices if devices is None else devices,
        )

    def cache_info(self) -> CacheInfo:
        """Hits, misses and size of the cache of compiled programs per input spec."""
        hits, misses, size = self._state.cache_info()
        return CacheInfo(hits, misses, None, size)

    def _call_general(self, args, kwargs):
        """A call the native fast path left over: first calls, pytrees, keyword
        arguments, non-Array arguments (an error), a forked child."""
        return self._call(args, kwargs or {})[0]

    def _call(self, args, kwargs):
        """The call's result, its status event (None when it already ran), and
        the devices it ran on."""
        if self._pid != os.getpid():
            # A forked child: the parent's compiled programs belong to the parent's
            # runtime (and its locks may be held): start over with the child's.
            self._state = self._new_state()
        leaves, treedef = _flatten((args, kwargs))
        _check_arrays(leaves, "function arguments")
        impls = [leaf._impl for leaf in leaves]
        tree, flat = _tree_key(treedef)
        entry = self._state.lookup(tree, impls)
        if entry is None or entry.in_treedef != treedef:
            if self._out_specs_fn is None:
                return self._discover(tree, flat, treedef, leaves, impls)
            entry = self._compile(tree, flat, treedef, leaves, impls)
        outputs, status = entry.executable.execute(impls)
        wrapped = [_wrap(o, s) for o, s in zip(outputs, entry.out_shardings)]
        return optree.tree_unflatten(entry.out_treedef, wrapped), status, entry.devices

    def _call_devices(self, impls: list) -> tuple[list, bool]:
        """The call's devices, and whether it spans worker hosts (then every
        host, this one included, runs the pickled function with its part of
        each array)."""
        devices = self._state.call_devices(impls)
        return devices, any(d.process_index != 0 for d in devices)

    def _host_call(self, treedef, leaves, remote: bool, **kwargs) -> _HostCall:
        # Across hosts the inputs are each host's part of each array, with its
        # own sharding (the callers' objects name devices of other hosts).
        in_shardings = [None] * len(leaves) if remote else [leaf.sharding for leaf in leaves]
        return _HostCall(self._fn, treedef, in_shardings, **kwargs)

    def _program(self, leaves, out_specs, host_call, devices, remote: bool):
        name = getattr(self._fn, "__qualname__", "colocated_python")
        in_specs = [_spec_leaf(leaf) for leaf in leaves]
        out_specs = [_spec_leaf(spec) for spec in out_specs]
        if remote:
            payload, callbacks = _dumps_with_callbacks(host_call)
            return _colocated.Executable.compile(name, payload, in_specs, out_specs, devices, callbacks)
        key = next(_NEXT_RESULT)
        _LOCAL_PROGRAMS[key] = host_call
        try:
            return _colocated.Executable.compile(
                name, _LOCAL_PREFIX + str(key).encode(), in_specs, out_specs, devices
            )
        finally:
            # Loading took its reference; the executable keeps the callable alive.
            _LOCAL_PROGRAMS.pop(key, None)

    def _compile(self, tree, flat, treedef, leaves, impls) -> _Entry:
        args, kwargs = optree.tree_unflatten(treedef, [_spec_of(leaf) for leaf in leaves])
        out_specs, out_treedef = _flatten(self._out_specs_fn(*args, **kwargs))
        for spec in out_specs:
            if not isinstance(spec, ShapeDtypeStruct):
                raise InvalidArgumentError(
                    f"out_specs_fn must return ShapeDtypeStructs, got {type(spec).__name__}"
                )
        devices, remote = self._call_devices(impls)
        host_call = self._host_call(treedef, leaves, remote, out_treedef=out_treedef)
        executable = self._program(leaves, out_specs, host_call, devices, remote)
        entry = _Entry(executable, treedef, out_treedef, [spec.sharding for spec in out_specs], devices)
        self._state.insert(tree, impls, entry, flat, _is_leaf(out_treedef))
        return entry

    def _discover(self, tree, flat, treedef, leaves, impls):
        """Runs the function once, synchronously, to learn its output specs; its
        outputs are this call's result (with its status, None, and devices), and
        the compiled program is cached."""
        devices, remote = self._call_devices(impls)
        if remote:
            return self._discover_remote(tree, flat, treedef, leaves, impls, devices)
        key = next(_NEXT_RESULT)
        probe = self._program(leaves, [], self._host_call(treedef, leaves, False, result_key=key), devices, False)
        try:
            _outputs, status = probe.execute(impls)
            status.wait()
        finally:
            # The local host ran it for this process's own client.
            parked = _take(key, LOCAL_SESSION)
        if parked is None:
            raise InvalidArgumentError("the colocated function produced no result")
        out_leaves, out_treedef = parked
        host_call = self._host_call(treedef, leaves, False, out_treedef=out_treedef)
        executable = self._program(leaves, [_spec_of(o) for o in out_leaves], host_call, devices, False)
        out_shardings = [o.sharding for o in out_leaves]
        entry = _Entry(executable, treedef, out_treedef, out_shardings, devices)
        self._state.insert(tree, impls, entry, flat, _is_leaf(out_treedef))
        return optree.tree_unflatten(out_treedef, out_leaves), None, devices

    def _discover_remote(self, tree, flat, treedef, leaves, impls, devices):
        """Discovery on worker hosts (see the module docs): a probe that runs the
        function and parks its outputs on each host, then a program that pops
        them as global arrays."""
        key = _new_key()
        reports = _Reports()
        report = HostCallback(reports.add)
        probe_call = self._host_call(treedef, leaves, True, result_key=key, report=report)
        probe = self._program(leaves, [], probe_call, devices, True)
        try:
            probe.execute(impls)[1].wait()
            out_treedef, out_specs = reports.global_specs(leaves, devices)
            pop = self._program(leaves, out_specs, _PopResults(key), devices, True)
            outputs, status = pop.execute(impls)
            status.wait()
        except BaseException:
            # Hosts where the probe ran keep its outputs until told otherwise.
            with contextlib.suppress(ColocatedError):
                self._program(leaves, [], _DropResults(key), devices, True).execute(impls)[1].wait()
            raise
        out_shardings = [spec.sharding for spec in out_specs]
        host_call = self._host_call(treedef, leaves, True, out_treedef=out_treedef)
        executable = self._program(leaves, out_specs, host_call, devices, True)
        entry = _Entry(executable, treedef, out_treedef, out_shardings, devices)
        self._state.insert(tree, impls, entry, flat, _is_leaf(out_treedef))
        wrapped = [_wrap(o, s) for o, s in zip(outputs, out_shardings)]
        return optree.tree_unflatten(out_treedef, wrapped), None, devices

    def __repr__(self) -> str:
        return f"colocated_python({getattr(self._fn, '__qualname__', self._fn)!r})"


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
