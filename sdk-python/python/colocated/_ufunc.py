"""numpy ufuncs on ``Array``s (``Array.__array_ufunc__`` and ``astype``): the
cheap case of one buffer and scalar operands, shard by shard when the operands
line up with the arrays' layout, else on the gathered values.
"""

from __future__ import annotations

import numpy as np

from ._array import Array, _wrap
from ._device_put import _from_shard_values, _put, device_put
from ._dtypes import canonicalize
from ._errors import InvalidArgumentError
from ._sharding import _sharding_from_core


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
    place each result where the runtime places a fresh array made like the
    template (its sharding, or replicated over its mesh when the result's
    shape does not split that way)."""
    values = [x._value() if isinstance(x, Array) else x for x in inputs]
    kwargs = {k: v._value() if isinstance(v, Array) else v for k, v in kwargs.items()}
    result = ufunc(*values, **kwargs)
    sharding = template.sharding

    def place(r):
        fitted = sharding._core_sharding().fitted(list(np.shape(r)))
        return device_put(r, sharding if fitted is None else _sharding_from_core(fitted))

    if isinstance(result, tuple):
        return tuple(place(r) for r in result)
    return place(result)
