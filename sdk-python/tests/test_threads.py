"""Concurrency across threads (SPEC §4): calls from different threads, and from
different work items of a thread pool, run concurrently, as many at once as
block; calls of one thread (or one work item) keep program order. Locally and
on a real worker process."""

import concurrent.futures
import os
import sys
import threading
import time
import uuid

import cloudpickle
import numpy as np
import pytest

import colocated

cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROUNDS = 5
BARRIER_TIMEOUT = 20.0


def _barrier(name: str, parties: int) -> threading.Barrier:
    """A barrier of the process the function runs in, by name (shipped
    functions cannot carry one)."""
    return threading.__dict__.setdefault(f"_colocated_test_barrier_{name}", threading.Barrier(parties))


def _waits_at(parties: int, name: str):
    """A specialized colocated function whose calls all wait at one barrier of
    ``parties``: they finish only if that many run at once."""

    def meet(x):
        _barrier(name, parties).wait(timeout=BARRIER_TIMEOUT)
        return x

    return colocated.colocated_python(meet).specialize(out_specs_fn=lambda x: x)


def _submit_from_pool(f, x, parties: int) -> None:
    """Calls ``f(x)`` from ``parties`` work items of a thread pool of one
    thread (as a pool reuses a thread whose work item returned: the calls are
    asynchronous), so the calls meet only if work items are independent
    streams; waits for every output."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        outs = [fu.result() for fu in [pool.submit(f, x) for _ in range(parties)]]
    colocated.block_until_ready(outs)


def _one_device_array(devices):
    return colocated.device_put(np.asarray(1, np.int32), colocated.colocated_cpu_devices(devices)[0])


@pytest.mark.parametrize("parties", [3, 2 * (os.cpu_count() or 1) + 2])
def test_calls_from_thread_pool_work_items_run_concurrently(parties):
    x = _one_device_array(colocated.devices())
    for _ in range(ROUNDS):
        f = _waits_at(parties, uuid.uuid4().hex)
        _submit_from_pool(f, x, parties)


@pytest.mark.parametrize("parties", [3, 2 * (os.cpu_count() or 1) + 2])
def test_calls_from_thread_pool_work_items_run_concurrently_on_a_worker(cluster, parties):
    client, _ = cluster(1, devices=1)
    x = _one_device_array(client.devices())
    for _ in range(ROUNDS):
        f = _waits_at(parties, uuid.uuid4().hex)
        _submit_from_pool(f, x, parties)


def test_blocking_calls_from_plain_threads_run_concurrently_beyond_any_fixed_pool():
    # More than the cores, and more than the 32 threads the SDK used to start.
    parties = max(40, 2 * (os.cpu_count() or 1) + 2)
    x = _one_device_array(colocated.devices())
    f = _waits_at(parties, uuid.uuid4().hex)
    outs, errors = [], []

    def call():
        try:
            outs.append(colocated.block_until_ready(f(x)))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(parties)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BARRIER_TIMEOUT + 10)
    assert errors == []
    assert len(outs) == parties


def _logging(log: list):
    def step(x, label, delay):
        time.sleep(delay)
        log.append(label)
        return x

    def make(label, delay):
        return colocated.colocated_python(lambda x: step(x, label, delay)).specialize(out_specs_fn=lambda x: x)

    return make


def test_calls_of_one_work_item_keep_program_order():
    x = _one_device_array(colocated.devices())
    log = []
    make = _logging(log)
    slow, fast = make("slow", 0.2), make("fast", 0.0)

    def work_item():
        return [slow(x), fast(x)]

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        outs = pool.submit(work_item).result()
    colocated.block_until_ready(outs)
    assert log == ["slow", "fast"]


def test_calls_of_one_thread_keep_program_order():
    x = _one_device_array(colocated.devices())
    log = []
    make = _logging(log)
    slow, fast = make("slow", 0.2), make("fast", 0.0)
    colocated.block_until_ready([slow(x), fast(x)])
    assert log == ["slow", "fast"]


def test_a_program_still_running_at_exit_does_not_crash_the_interpreter():
    # Asynchronous calls (out_specs_fn) may still run Python on the runtime's
    # threads when the interpreter exits: exit waits for them, and the
    # runtime starts no more. Before, about a third of such exits aborted
    # ("PyGILState_Release: thread state ... must be current").
    pytest.importorskip("jax")
    from test_devices import run_python

    code = """
        import jax, jax.numpy as jnp
        import colocated
        cpu = jax.devices("cpu")
        spec = jax.ShapeDtypeStruct((2,), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(cpu[0]))

        @colocated.colocated_python
        def make():
            return jnp.zeros(2)

        device = colocated.devices()[0]
        a = make.specialize(devices=[device]).specialize(out_specs_fn=lambda: spec)
        b = make.specialize(out_specs_fn=lambda: spec).specialize(devices=[device])
        a(), a(), b(), b()
        print("exiting")
    """
    for _ in range(8):
        done = run_python(code)
        assert done.returncode == 0 and done.stdout == "exiting\n", done.stderr[-2000:]
