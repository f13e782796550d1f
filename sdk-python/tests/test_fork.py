import os
import time
import warnings

import numpy as np

import colocated


def wait_child(pid: int, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError("the forked child hung")


def fork_and_run(body) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        code = 99
        try:
            code = body()
        finally:
            os._exit(code)
    return wait_child(pid)


def test_forked_child_gets_a_fresh_runtime():
    parent_devices = colocated.devices()
    colocated.device_put(np.arange(4)).block_until_ready()

    def child():
        devices = colocated.devices()
        if [d.id for d in devices] != [d.id for d in parent_devices]:
            return 2
        y = colocated.device_put(np.arange(3) * 2, devices[1])
        return 0 if (np.asarray(y + 1) == [1, 3, 5]).all() else 3

    assert fork_and_run(child) == 0
    # The parent's runtime is untouched.
    assert np.asarray(colocated.device_put(np.arange(2)) + 1).tolist() == [1, 2]


def test_parent_objects_fail_clearly_in_the_child():
    x = colocated.device_put(np.arange(4.0))

    def child():
        try:
            np.asarray(x)
        except colocated.FailedPreconditionError as e:
            if "created before os.fork()" not in str(e):
                return 4
        else:
            return 5
        try:
            x.block_until_ready()
        except colocated.FailedPreconditionError:
            return 0
        return 6

    assert fork_and_run(child) == 0
    assert np.asarray(x).tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_colocated_function_keeps_working_in_a_forked_child():
    @colocated.colocated_python
    def add_one(x):
        return x + 1

    assert int(add_one(colocated.device_put(np.int32(1)))) == 2

    def child():
        y = add_one(colocated.device_put(np.int32(41)))
        return 0 if int(y) == 42 else 7

    assert fork_and_run(child) == 0
    assert int(add_one(colocated.device_put(np.int32(2)))) == 3


def test_an_object_made_before_a_fork_keeps_working_in_the_child():
    @colocated.colocated_python_class
    class Counter:
        def __init__(self):
            self.n = 0

        def incr(self, x):
            self.n += 1
            return x + self.n

    counter = Counter()
    x = colocated.device_put(np.int32(0))
    assert int(counter.incr(x)) == 1

    def child():
        # The child's copy of the object goes on from the parent's state.
        y = counter.incr(colocated.device_put(np.int32(0)))
        z = counter.incr(colocated.device_put(np.int32(0)))
        return 0 if (int(y), int(z)) == (2, 3) else 8

    assert fork_and_run(child) == 0
    assert int(counter.incr(x)) == 2, "the parent's object is its own"


def test_a_forked_child_connects_to_workers_and_calls_them(cluster, token_file):
    # The parent's network runtime, lane reader, alarms and session timers
    # are threads the child lacks: the child makes its own on first use
    # (it used to wait forever for the parent's).
    client, (worker,) = cluster(1, devices=1)

    @colocated.colocated_python
    def add_one(x):
        return x + 1

    x = colocated.device_put(np.int32(1), client.devices()[0])
    assert int(add_one(x)) == 2

    def child():
        mine = colocated.connect([worker.address], token_file=token_file)
        try:
            y = add_one(colocated.device_put(np.int32(41), mine.devices()[0]))
            z = add_one(y)
            return 0 if (int(y), int(z)) == (42, 43) else 9
        finally:
            mine.close()

    assert fork_and_run(child) == 0
    assert int(add_one(x)) == 2, "the parent's session works on"
