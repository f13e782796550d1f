import asyncio
import concurrent.futures
import threading
import time

import numpy as np
import pytest

import colocated
from colocated import NamedSharding, P, _colocated
from colocated._array import _await_event, _event_future


def set_later(event, delay=0.05, code=None, message=""):
    t = threading.Thread(target=lambda: (time.sleep(delay), event.set(code, message)))
    t.start()
    return t


def test_arrays_from_host_data_are_ready(mesh):
    x = colocated.device_put(np.arange(8), NamedSharding(mesh, P("x")))
    assert x.is_ready()
    assert x.block_until_ready() is x


def test_block_until_ready_on_pytrees(mesh):
    tree = colocated.device_put({"a": np.arange(4), "b": (np.ones(2), 3)}, NamedSharding(mesh, P()))
    assert colocated.block_until_ready(tree) is tree
    assert colocated.block_until_ready([]) == []
    assert colocated.block_until_ready({"n": 1}) == {"n": 1}


def test_asyncio_ready_and_wait(mesh):
    x = colocated.device_put(np.arange(4), NamedSharding(mesh, P("x")))
    tree = {"x": x, "y": [colocated.device_put(1.0)]}

    async def main():
        assert await x.ready() is x
        assert await colocated.wait(tree) is tree

    asyncio.run(main())


def test_as_future_resolves_to_the_array():
    x = colocated.device_put(np.arange(3))
    fut = x.as_future()
    assert isinstance(fut, concurrent.futures.Future)
    assert fut.result(timeout=5) is x


def test_wait_releases_the_gil_while_another_thread_sets_the_event():
    event = _colocated.Event()
    assert not event.is_ready()
    t = set_later(event)  # needs the GIL to run
    event.wait()
    t.join()
    assert event.is_ready() and event.error() is None


def test_wait_raises_the_events_error_with_its_class():
    event = _colocated.Event()
    set_later(event, code="unavailable", message="host lost").join()
    with pytest.raises(colocated.UnavailableError, match="host lost") as info:
        event.wait()
    assert isinstance(info.value, ConnectionError)
    assert type(event.error()) is colocated.UnavailableError


def test_wait_timeout_is_a_deadline_exceeded():
    event = _colocated.Event()
    with pytest.raises(colocated.DeadlineExceededError, match="not ready before the deadline") as info:
        event.wait_timeout(0.01)
    assert isinstance(info.value, TimeoutError)
    event.set()


def test_setting_twice_is_a_failed_precondition():
    event = _colocated.Event()
    event.set()
    with pytest.raises(colocated.FailedPreconditionError, match="already set"):
        event.set()
    with pytest.raises(colocated.InvalidArgumentError, match="unknown error code 'bogus'"):
        _colocated.Event().set("bogus")


def test_on_ready_runs_once_on_the_setting_thread():
    event = _colocated.Event()
    seen = []
    event.on_ready(lambda err: seen.append((err, threading.current_thread().name)))
    set_later(event).join()
    assert len(seen) == 1 and seen[0][0] is None and seen[0][1] != threading.current_thread().name
    event.on_ready(lambda err: seen.append(("late", err)))
    assert seen[1] == ("late", None)


def test_asyncio_await_of_a_pending_event_does_not_block_the_loop():
    async def main():
        event = _colocated.Event()
        ticks = 0

        async def ticker():
            nonlocal ticks
            while not event.is_ready():
                ticks += 1
                await asyncio.sleep(0.001)

        task = asyncio.create_task(ticker())
        set_later(event, 0.05)
        assert await _await_event(event, "done") == "done"
        await task
        return ticks

    assert asyncio.run(main()) > 5


def test_asyncio_await_raises_the_error():
    async def main():
        event = _colocated.Event()
        set_later(event, 0.01, "cancelled", "stopped")
        await _await_event(event)

    with pytest.raises(colocated.CancelledError, match="stopped"):
        asyncio.run(main())


def test_concurrent_future_of_a_pending_event():
    event = _colocated.Event()
    fut = _event_future(event, "value")
    assert not fut.done()
    set_later(event)
    assert fut.result(timeout=5) == "value"
    failing = _colocated.Event()
    fut = _event_future(failing, None)
    set_later(failing, code="internal", message="broke")
    with pytest.raises(colocated.InternalError, match="broke"):
        fut.result(timeout=5)


def test_joined_events_fail_with_the_first_error():
    a, b = _colocated.Event(), _colocated.Event()
    joined = _colocated.Event.join([a, b])
    b.set("not_found", "second")
    a.set("resource_exhausted", "first")
    with pytest.raises(colocated.ResourceExhaustedError, match="first"):
        joined.wait()
