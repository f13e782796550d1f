"""Waiting for arrays and reading them back: ``block_until_ready``,
``device_get``, asyncio waits (``wait``, ``Array.ready``) and
``concurrent.futures`` ones (``Array.as_future``); and ``clear_caches``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures

import optree

from . import _colocated
from ._array import Array
from ._sharding import _clear_sharding_caches


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
