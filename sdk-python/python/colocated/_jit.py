"""``colocated.jit``: a JAX function traced and lowered with JAX here, compiled
and run by the PJRT plugin of the host that owns its inputs (this process's,
or a worker's).

JAX on this process is enough to lower (``jax.export`` for the inputs'
platform, with abstract meshes of the inputs' shape): the program is
compiled where it runs, as ``compile_stablehlo`` does.

Over a mesh of several hosts (``per_host=True``), the function runs once per
host on that host's part of each argument, as ``jax.shard_map`` over the
mesh's host axes would run it: one lowering for the per-host shapes, one
program compiled on each host, and the hosts' outputs assembled into Arrays
over the whole mesh.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
from collections.abc import Sequence

import numpy as np

from . import _colocated
from ._array import Array, _wrap, device_put, make_array_from_single_device_arrays
from ._client import client as _client_default
from ._colocated_python import _PROGRAM_CACHES
from ._errors import FailedPreconditionError, InvalidArgumentError, UnimplementedError
from ._jax import is_jax_placement, placement_of
from ._sharding import Mesh, NamedSharding, PartitionSpec, Sharding, SingleDeviceSharding
from ._xla import XlaExecutable


def _import_jax():
    try:
        import jax
    except ImportError as e:
        raise FailedPreconditionError("colocated.jit needs JAX to trace and lower: pip install jax") from e
    return jax


def _argnums(value, what: str) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    if isinstance(value, Sequence) and all(isinstance(v, int) for v in value):
        return tuple(value)
    raise InvalidArgumentError(f"{what} must be an int or a sequence of ints, got {value!r}")


def _sharding(value, what: str):
    """A ``colocated`` sharding (or None) from ours or JAX's."""
    if value is None or isinstance(value, Sharding):
        return value
    if is_jax_placement(value):
        return placement_of(value)
    raise InvalidArgumentError(f"{what} must be a Sharding (colocated's or JAX's), got {type(value).__name__}")


class JittedFunction:
    """What ``colocated.jit`` returns: calling it runs the function's program
    on the devices of its arguments' host (see ``jit``)."""

    def __init__(self, fun, static_argnums, donate_argnums, in_shardings, out_shardings, per_host=False) -> None:
        if not callable(fun):
            raise InvalidArgumentError(f"jit takes a callable, got {type(fun).__name__}")
        self._fun = fun
        self._static = _argnums(static_argnums, "static_argnums")
        # The runtime never hands a caller's buffer to a program: donation is
        # accepted and does nothing (an input stays readable).
        self._donate = _argnums(donate_argnums, "donate_argnums")
        self._in_shardings = in_shardings
        self._out_sharding = _sharding(out_shardings, "out_shardings")
        self._per_host = bool(per_host)
        # Core's cache: one program per tree key (the argument tree, the
        # static values and which leaves are weakly typed) and input specs.
        self._cache = _colocated.ProgramCache()
        #: Core's tree key of each form ``(treedef, static, weak)`` this
        #: function was called with (see ``_new_tree_key``).
        self._tree_keys: dict = {}
        self._last = None
        self._fast_hits = 0
        functools.update_wrapper(self, fun)
        _PROGRAM_CACHES.add(self)

    def __call__(self, *args, **kwargs):
        last = self._last
        if last is not None and not kwargs and len(args) == last[2]:
            # Positional Arrays, as in the last call: its program checks their
            # specs as it takes them (before it runs), and another spec goes
            # the long way.
            try:
                impls = [a._impl for a in args if type(a) is Array]
                if len(impls) != len(args):
                    return self._call(args, kwargs)
                outputs = last[0]._impl.call(impls)
            except InvalidArgumentError:
                return self._call(args, kwargs)
            self._fast_hits += 1
            out_tree = last[1]
            if out_tree is None:
                return _wrap(outputs[0], None)
            return out_tree.unflatten([_wrap(o, None) for o in outputs])
        return self._call(args, kwargs)

    def _call(self, args: tuple, kwargs: dict):
        jax = _import_jax()
        positions = {i % len(args) for i in self._static if -len(args) <= i < len(args)}
        static = tuple((i, args[i]) for i in sorted(positions))
        dynamic = tuple(a for i, a in enumerate(args) if i not in positions)
        leaves, treedef = jax.tree_util.tree_flatten((dynamic, kwargs))
        arrays, weak = self._place(jax, leaves)
        form = (treedef, static, weak)
        try:
            tree = self._tree_keys.get(form)
        except TypeError as e:  # an unhashable static argument
            raise InvalidArgumentError(f"static arguments must be hashable: {e}") from e
        if tree is None:
            tree = self._tree_keys.setdefault(form, self._new_tree_key(jax, treedef, static, weak))
        impls = [a._impl for a in arrays]
        entry = self._cache.get(tree, impls)
        if entry is None:
            exe, out_tree = self._compile(jax, treedef, static, len(args), arrays, weak)
            # One Array out: returned as it is.
            leaf = jax.tree_util.tree_structure(0)
            entry = (exe, None if out_tree == leaf else out_tree)
            self._cache.insert(tree, impls, entry)
        exe, out_tree = entry
        outputs = exe(*arrays)
        # Positional Arrays as they are: the next such call tries this
        # program first.
        flat = not kwargs and not static and self._in_shardings is None and isinstance(exe, XlaExecutable)
        self._last = (exe, out_tree, len(args)) if flat and all(type(a) is Array for a in args) else None
        if out_tree is None:
            return outputs
        if not isinstance(outputs, tuple):
            outputs = (outputs,)
        return out_tree.unflatten(outputs)

    @staticmethod
    def _new_tree_key(jax, treedef, static: tuple, weak: tuple[bool, ...]) -> int:
        """Core's key for a form seen for the first time, as colocated
        functions key theirs: a call of positional arrays alone (no static or
        weakly typed argument) takes core's flat key, every other form a key
        core hands out for it (unique in the process, so never another
        function's or another form's)."""
        if not static and not any(weak):
            n = treedef.num_leaves
            if treedef == jax.tree_util.tree_structure((tuple(range(n)), {})):
                return _colocated.flat_tree_key(n)
        return _colocated.new_tree_key()

    def cache_info(self) -> tuple[int, int, int]:
        """``(hits, misses, size)`` of the cache of compiled programs per input spec."""
        hits, misses, size = self._cache.info()
        return (hits + self._fast_hits, misses, size)

    def clear_cache(self) -> None:
        """Drops the compiled programs (``colocated.clear_caches()`` does so
        for every jitted function); the next call compiles again."""
        self._cache.clear()
        self._last = None
        self._fast_hits = 0

    def _place(self, jax, leaves: list) -> tuple[list[Array], tuple[bool, ...]]:
        """Each leaf as an ``Array``, and which are Python scalars (weakly
        typed, as JAX traces them): Arrays as they are (or moved to
        ``in_shardings``); anything else, in the dtype JAX gives it, where
        the Array arguments are (replicated over their mesh), or on the
        default backend's first device without any (or on ``in_shardings``)."""
        weak = tuple(type(leaf) in (bool, int, float, complex) for leaf in leaves)
        leaves = [leaf if isinstance(leaf, Array) else _canonical(jax, leaf) for leaf in leaves]
        targets = self._in_shardings
        if targets is not None and not isinstance(targets, list | tuple):
            targets = [targets] * len(leaves)
        if targets is not None and len(targets) != len(leaves):
            raise InvalidArgumentError(
                f"in_shardings has {len(targets)} entries but the call has {len(leaves)} array arguments"
            )
        out = []
        loose = None
        for i, leaf in enumerate(leaves):
            target = None if targets is None else _sharding(targets[i], f"in_shardings[{i}]")
            if isinstance(leaf, Array) and (target is None or leaf.sharding == target):
                out.append(leaf)
            elif target is not None:
                out.append(device_put(leaf, target))
            else:
                if loose is None:
                    loose = _loose_placement([a for a in leaves if isinstance(a, Array)])
                out.append(device_put(leaf, loose))
        return out, weak

    def _compile(
        self, jax, treedef, static, num_args: int, arrays: list[Array], weak: tuple[bool, ...]
    ) -> tuple[XlaExecutable, object]:
        devices, mesh = _program_devices(arrays)
        if len({d.process_index for d in devices}) > 1:
            if not self._per_host:
                raise UnimplementedError(
                    "the arguments are on several hosts, and an XLA program runs on one host's devices: "
                    "pass per_host=True to run the function on each host's part of them (as jax.shard_map "
                    "over the hosts), or put them on one host's devices"
                )
            return self._compile_per_host(jax, treedef, static, num_args, arrays, weak, _Hosts(mesh))
        platform = devices[0].platform
        specs = [_abstract_spec(jax, a, len(devices), w) for a, w in zip(arrays, weak, strict=True)]
        out_sharding = None
        if self._out_sharding is not None:
            out_sharding = _abstract_sharding(jax, self._out_sharding, len(devices))
        elif mesh is not None:
            # Without the compiler's choice at hand, results are replicated
            # over the arguments' mesh.
            out_sharding = jax.sharding.NamedSharding(_abstract_mesh(jax, mesh), jax.sharding.PartitionSpec())
        exported = self._export(jax, treedef, static, num_args, arrays, specs, out_sharding, platform)
        exe = XlaExecutable(_colocated.Executable.compile_stablehlo(exported.mlir_module().encode(), devices))
        return exe, exported.out_tree

    def _export(self, jax, treedef, static, num_args, arrays, specs, out_sharding, platform, hosts=None):
        """``fun`` traced and lowered by JAX for ``specs`` on ``platform``."""
        fun, statics = self._fun, dict(static)

        def flat(*leaves):
            dynamic, kwargs = jax.tree_util.tree_unflatten(treedef, leaves)
            if not statics:
                return fun(*dynamic, **kwargs)
            it = iter(dynamic)
            full = [statics[i] if i in statics else next(it) for i in range(num_args)]
            return fun(*full, **kwargs)

        jitted = jax.jit(flat, out_shardings=out_sharding) if out_sharding is not None else jax.jit(flat)
        # Arrays of 64-bit types (which JAX makes only with x64 on) are traced
        # as they are, with x64 on for that trace.
        wide = any(np.dtype(a.dtype).itemsize == 8 and np.dtype(a.dtype).kind in "iuf" for a in arrays)
        with jax.enable_x64(True) if wide and not jax.config.jax_enable_x64 else contextlib.nullcontext():
            try:
                return jax.export.export(jitted, platforms=[platform])(*specs)
            except NameError as e:
                # A collective over a host axis: that axis is not bound in
                # a host's own program (JAX: "unbound axis name: <name>").
                unbound = re.search(r"unbound axis name: (\S+?)[.,;]?(?:\s|$)", str(e))
                if hosts is not None and unbound is not None and unbound.group(1) in hosts.axes:
                    raise UnimplementedError(
                        f"the function uses mesh axis {unbound.group(1)!r} across hosts (a collective such as "
                        "psum over it): a per-host program cannot communicate between hosts; reduce the "
                        "hosts' outputs after the call instead"
                    ) from e
                raise

    def _compile_per_host(self, jax, treedef, static, num_args, arrays, weak, hosts: _Hosts):
        """One lowering for a host's part of the arguments, compiled on each
        host; the program that runs them all (see ``_PerHost``)."""
        for i, a in enumerate(arrays):
            if not isinstance(a.sharding, NamedSharding) or a.sharding.mesh != hosts.mesh:
                raise InvalidArgumentError(
                    f"over several hosts every argument is laid out over the arguments' mesh; array argument {i} "
                    f"is on {a.sharding} (device_put it on a NamedSharding of that mesh)"
                )
        platform = next(iter(arrays[0].sharding.device_set)).platform
        specs = [hosts.local_struct(jax, a, w) for a, w in zip(arrays, weak, strict=True)]
        global_out = self._out_sharding
        if global_out is not None:
            if not isinstance(global_out, NamedSharding) or global_out.mesh != hosts.mesh:
                raise InvalidArgumentError("over several hosts, out_shardings must be a NamedSharding of the arguments' mesh")
            out_sharding = hosts.local_abstract_sharding(jax, global_out.spec)
        else:
            out_sharding = hosts.local_abstract_sharding(jax, PartitionSpec())
        exported = self._export(jax, treedef, static, num_args, arrays, specs, out_sharding, platform, hosts)
        module = exported.mlir_module().encode()
        exes = [
            XlaExecutable(_colocated.Executable.compile_stablehlo(module, list(block.flat)))
            for block in hosts.blocks
        ]
        out_specs = []
        for i, aval in enumerate(exported.out_avals):
            if global_out is not None:
                out_specs.append(global_out.spec)
            elif not aval.shape:
                raise InvalidArgumentError(
                    f"output {i} is a scalar: over several hosts each host's output is its part along "
                    "the first axis; return it with a leading axis (x[None]) or give out_shardings"
                )
            else:
                out_specs.append(PartitionSpec(hosts.axes[0] if len(hosts.axes) == 1 else hosts.axes))
        out_shapes = [tuple(a.shape) for a in exported.out_avals]
        return _PerHost(hosts, exes, arrays, out_specs, out_shapes), exported.out_tree


class _Hosts:
    """How a mesh over several hosts splits into one block per host: the
    axes along which the host changes (``axes``, major first in each
    dimension that names them), and each host's devices (``blocks``, over
    the other axes, ``local_names``)."""

    def __init__(self, mesh) -> None:
        self.mesh = mesh
        names = tuple(mesh.axis_names)
        grid = np.vectorize(lambda d: d.process_index, otypes=[np.int64])(mesh.devices)
        self.axes = tuple(n for i, n in enumerate(names) if not np.all(grid == np.take(grid, [0], axis=i)))
        self.local_names = tuple(n for n in names if n not in self.axes)
        host_dims = [names.index(a) for a in self.axes]
        self.blocks = []
        for coords in np.ndindex(*(grid.shape[i] for i in host_dims)):
            index = [slice(None)] * len(names)
            for dim, c in zip(host_dims, coords, strict=True):
                index[dim] = c
            block = mesh.devices[tuple(index)]
            self.blocks.append(block if isinstance(block, np.ndarray) else np.array(block, dtype=object))
        seen = [{d.process_index for d in block.flat} for block in self.blocks]
        if any(len(s) != 1 for s in seen) or len({next(iter(s)) for s in seen}) != len(seen):
            raise InvalidArgumentError(
                f"the mesh {dict(mesh.shape)} does not split into one block of devices per host along its axes"
            )

    def _local_entry(self, entry, what: str):
        names = (entry,) if isinstance(entry, str) else tuple(entry or ())
        crossing = [n for n in names if n in self.axes]
        if names[: len(crossing)] != tuple(crossing):
            raise InvalidArgumentError(f"{what}: the host axes {self.axes} must come first in a dimension's axes")
        local = tuple(n for n in names if n not in self.axes)
        factor = math.prod(self.mesh.shape[n] for n in crossing)
        return (None if not local else local[0] if len(local) == 1 else local), factor

    def local_spec(self, spec, what: str = "a sharding") -> tuple[PartitionSpec, list[int]]:
        """A host's part of ``spec``, and each dimension's number of host parts."""
        entries = [self._local_entry(e, what) for e in spec]
        return PartitionSpec(*(e for e, _ in entries)), [f for _, f in entries]

    def local_abstract_sharding(self, jax, spec):
        if not self.local_names:
            return None
        local, _ = self.local_spec(spec)
        shape = tuple(self.mesh.shape[n] for n in self.local_names)
        mesh = jax.sharding.AbstractMesh(shape, self.local_names)
        return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*local))

    def local_shape(self, shape, factors: list[int], what: str) -> tuple[int, ...]:
        out = list(shape)
        for dim, f in enumerate(factors):
            if out[dim] % f:
                raise InvalidArgumentError(f"{what}: dimension {dim} ({out[dim]}) does not split into {f} host parts")
            out[dim] //= f
        return tuple(out)

    def local_sharding(self, block, spec, memory_kind):
        """A host's sharding of its part: over its block, or its one device."""
        if not self.local_names:
            return SingleDeviceSharding(block.item(), memory_kind=memory_kind)
        local, _ = self.local_spec(spec)
        return NamedSharding(Mesh(block, self.local_names), local, memory_kind=memory_kind)

    def local_struct(self, jax, array: Array, weak: bool):
        spec = array.sharding.spec
        _, factors = self.local_spec(spec, "an argument")
        shape = self.local_shape(array.shape, factors, f"an argument of shape {array.shape}")
        return jax.ShapeDtypeStruct(shape, array.dtype, sharding=self.local_abstract_sharding(jax, spec), weak_type=weak)


class _PerHost:
    """A per-host program over several hosts: each host's part of every
    argument (its shards, shared), its program run there, and the hosts'
    outputs assembled over the whole mesh (shards shared, no copy)."""

    def __init__(
        self, hosts: _Hosts, exes: list[XlaExecutable], arrays: list[Array], out_specs: list, out_shapes: list
    ) -> None:
        self._hosts, self._exes = hosts, exes
        # Each argument's part on each host: its shape, and its sharding per
        # block (the program's input spec fixes both).
        self._in = []
        for a in arrays:
            _, factors = hosts.local_spec(a.sharding.spec)
            shape = hosts.local_shape(a.shape, factors, "an argument")
            shardings = [hosts.local_sharding(b, a.sharding.spec, a.sharding.memory_kind) for b in hosts.blocks]
            self._in.append((shape, shardings))
        self._out = []
        for i, (spec, shape) in enumerate(zip(out_specs, out_shapes, strict=True)):
            padded = PartitionSpec(*spec, *([None] * (len(shape) - len(spec))))
            _, factors = hosts.local_spec(padded, f"output {i}")
            self._out.append((spec, tuple(d * f for d, f in zip(shape, factors, strict=True))))

    def __call__(self, *arrays: Array):
        hosts = self._hosts
        results = []
        shards = [{s.device: s for s in a.addressable_shards} for a in arrays]
        for h, (block, exe) in enumerate(zip(hosts.blocks, self._exes, strict=True)):
            parts = [
                make_array_from_single_device_arrays(shape, shardings[h], [by_device[d].data for d in block.flat])
                for (shape, shardings), by_device in zip(self._in, shards, strict=True)
            ]
            out = exe(*parts)
            results.append(out if isinstance(out, tuple) else (out,))
        outputs = []
        for k, (spec, shape) in enumerate(self._out):
            sharding = NamedSharding(hosts.mesh, spec)
            shards = [s.data for r in results for s in r[k].addressable_shards]
            outputs.append(make_array_from_single_device_arrays(shape, sharding, shards))
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


def _program_devices(arrays: list[Array]) -> tuple[list[_colocated.Device], object]:
    """The devices the program runs on, and their mesh: the one device of
    single-device inputs (no mesh), or the mesh of the inputs'
    ``NamedSharding``s (one mesh for all)."""
    if not arrays:
        raise InvalidArgumentError("colocated.jit needs at least one array argument to know where to run")
    meshes = [
        a.sharding.mesh for a in arrays if isinstance(a.sharding, NamedSharding) and a.sharding.mesh.devices.size > 1
    ]
    if meshes:
        mesh = meshes[0]
        if any(m != mesh for m in meshes):
            raise InvalidArgumentError("colocated.jit takes arguments over one mesh; they are on several")
        devices = list(mesh.devices.flat)
        for a in arrays:
            if not a.sharding.device_set <= set(devices):
                raise InvalidArgumentError(f"an argument on {a.sharding} is not on the arguments' mesh")
        return devices, mesh
    device_sets = {frozenset(a.sharding.device_set) for a in arrays}
    if len(device_sets) > 1:
        raise InvalidArgumentError("colocated.jit's single-device arguments must all be on one device")
    return list(next(iter(device_sets))), None


def _abstract_mesh(jax, mesh):
    return jax.sharding.AbstractMesh(tuple(mesh.shape.values()), tuple(mesh.axis_names))


def _abstract_sharding(jax, sharding: Sharding, num_devices: int):
    if isinstance(sharding, SingleDeviceSharding) or num_devices == 1:
        return None
    if not isinstance(sharding, NamedSharding):
        raise UnimplementedError(f"colocated.jit lays arrays out by NamedSharding, not {type(sharding).__name__}")
    return jax.sharding.NamedSharding(_abstract_mesh(jax, sharding.mesh), jax.sharding.PartitionSpec(*sharding.spec))


def _abstract_spec(jax, array: Array, num_devices: int, weak: bool):
    sharding = _abstract_sharding(jax, array.sharding, num_devices)
    return jax.ShapeDtypeStruct(array.shape, array.dtype, sharding=sharding, weak_type=weak)


def _canonical(jax, leaf) -> np.ndarray:
    """``leaf`` as numpy, in the dtype JAX gives it (64-bit types narrowed
    unless x64 is on, as ``jax.jit`` takes numpy arguments)."""
    value = np.asarray(leaf)
    return value.astype(jax.dtypes.canonicalize_dtype(value.dtype), copy=False)


def _loose_placement(arrays: list[Array]):
    """Where a call's values that are not Arrays go: the Array arguments'
    device, replicated over their mesh, or the default backend's first
    device without any."""
    if not arrays:
        return _client_default().devices()[0]
    devices, mesh = _program_devices(arrays)
    if mesh is None:
        return devices[0]
    return NamedSharding(mesh, PartitionSpec())


def jit(fun=None, *, static_argnums=None, donate_argnums=None, in_shardings=None, out_shardings=None, per_host=False):
    """Compiles ``fun``, a function of JAX arrays, for its arguments' devices
    and runs it there: JAX traces and lowers it here (for the arguments'
    shapes, dtypes, shardings and platform), and the PJRT plugin of the host
    that owns the arguments (this process's or a worker's) compiles and runs
    it. Returns Arrays, in ``fun``'s output tree, laid out by
    ``out_shardings`` (default: one device's arrays on it; over several
    devices, replicated).

    Arguments: ``Array``s on one host's plugin devices (one device, or one
    mesh of ``NamedSharding``s); anything else is typed as ``jax.jit`` types
    it and put where they are (replicated over their mesh), on the default
    backend's first device without any, or on ``in_shardings`` (one
    sharding, or one per array argument). ``static_argnums``: positional arguments that are Python
    values baked into the program (hashable). ``donate_argnums`` is accepted
    and does nothing: an argument stays readable. A program is compiled once
    per input spec (tree, static values, shapes, dtypes, shardings);
    ``cache_info()`` counts.

    Arguments over a mesh of several hosts need ``per_host=True``: ``fun``
    then runs on each host's part of every argument, as ``jax.shard_map``
    over the mesh's host axes runs it (the axes along which the host
    changes; they come first in a dimension's axes). Each output is the
    hosts' parts along its first axis (``P(host_axes)``), or laid out by
    ``out_shardings`` (a ``NamedSharding`` of the mesh: its host axes say
    where each host's part goes; an output that names none is each host's
    replica, which ``fun`` must compute alike). A collective over a host axis
    raises ``UnimplementedError``: a per-host program cannot communicate
    between hosts. Without ``per_host``, arguments on several hosts raise
    ``UnimplementedError``.

    Usable as ``@colocated.jit`` and ``@colocated.jit(static_argnums=...)``.
    """
    if fun is None:
        return functools.partial(
            jit,
            static_argnums=static_argnums,
            donate_argnums=donate_argnums,
            in_shardings=in_shardings,
            out_shardings=out_shardings,
            per_host=per_host,
        )
    return JittedFunction(fun, static_argnums, donate_argnums, in_shardings, out_shardings, per_host)

