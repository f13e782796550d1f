"""``python -m colocated.worker`` isolates sessions by default: each session
runs in a worker process of its own (a child of the worker, which redirects
the controller there), so one controller's Python code never shares an
interpreter with another's. Real processes throughout."""

import os
import sys
import time

import cloudpickle
import numpy as np
import pytest
from test_sessions import Controller, until
from workers import Worker

import colocated
from colocated import _colocated

# Functions of this module travel by value: workers cannot import it.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: Seconds of silence after which the workers of these tests close a session.
SESSION_TIMEOUT = 1.0


@colocated.colocated_python
def worker_pid(x):
    return x * 0 + os.getpid()


@colocated.colocated_python
def set_secret(x):
    sys._colocated_test_secret = "A's"  # module-level state of the worker's interpreter
    return x


@colocated.colocated_python
def has_secret(x):
    return x * 0 + int(hasattr(sys, "_colocated_test_secret"))


def gone(pid: int) -> bool:
    """True once process ``pid`` has exited (it may linger as a zombie until
    its parent reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def children_of(pid: int) -> list[int]:
    """The live child processes of process ``pid``."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(c) for c in f.read().split()]
    return [c for c in found if not gone(c)]


def on(client):
    return colocated.device_put(np.int64(0), colocated.SingleDeviceSharding(client.devices()[0]))


@pytest.fixture
def isolated(token_file):
    """A worker on its default: a process per session."""
    w = Worker(token_file, devices=1, session_timeout=SESSION_TIMEOUT, extra_args=())
    yield w
    w.stop()


def test_two_controllers_get_their_own_processes_and_state(isolated, token_file):
    a = colocated.connect([isolated.address], token_file=token_file, default=False)
    b = colocated.connect([isolated.address], token_file=token_file, default=False)
    xa, xb = on(a), on(b)
    pid_a, pid_b = int(worker_pid(xa)), int(worker_pid(xb))
    assert len({pid_a, pid_b, isolated.pid, os.getpid()}) == 4
    set_secret(xa)
    assert int(has_secret(xa)) == 1
    assert int(has_secret(xb)) == 0


def test_arrays_copy_between_isolated_session_workers(isolated, token_file):
    """A copy between two supervisors' workers goes from session worker to
    session worker: the reader is sent to the process that holds the data,
    not to the supervisor (which refused the read's grant)."""
    other = Worker(token_file, devices=1, session_timeout=SESSION_TIMEOUT, extra_args=())
    try:
        client = colocated.connect([isolated.address, other.address], token_file=token_file, default=False)
        on_a, on_b = client.devices()
        x = colocated.device_put(np.arange(1 << 20, dtype=np.int32), on_a)
        y = colocated.device_put(x, on_b)
        assert y.sharding == colocated.SingleDeviceSharding(on_b)
        np.testing.assert_array_equal(np.asarray(y), np.arange(1 << 20))
        reports = []
        z = colocated.device_put(y, on_a, progress=lambda done, total: reports.append((done, total)))
        np.testing.assert_array_equal(np.asarray(z), np.arange(1 << 20))
        assert reports[-1] == (x.nbytes, x.nbytes)
        client.close()
    finally:
        other.stop()


def test_a_shared_interpreter_worker_shares_state(token_file):
    """The control: without isolation, B sees what A's code left."""
    shared = Worker(token_file, devices=1, session_timeout=SESSION_TIMEOUT)
    try:
        a = colocated.connect([shared.address], token_file=token_file, default=False)
        b = colocated.connect([shared.address], token_file=token_file, default=False)
        xa, xb = on(a), on(b)
        assert int(worker_pid(xa)) == int(worker_pid(xb)) == shared.pid
        set_secret(xa)
        assert int(has_secret(xb)) == 1
    finally:
        shared.stop()


PID_CONTROLLER = """
    import os
    import time

    import numpy as np

    import colocated

    client = colocated.connect([ADDRESS], token_file=TOKEN_FILE)

    @colocated.colocated_python
    def pid(x):
        return x * 0 + os.getpid()

    x = colocated.device_put(np.int64(0), colocated.SingleDeviceSharding(client.devices()[0]))
    print(int(pid(x)), flush=True)
    time.sleep(3600)
"""


def test_a_killed_controllers_session_worker_exits(isolated, token_file, tmp_path):
    controller = Controller(PID_CONTROLLER, isolated, token_file, tmp_path)
    try:
        child = int(controller.proc.stdout.readline())
    finally:
        controller.kill()
    assert child != isolated.pid and not gone(child)
    until("the session worker exits", lambda: gone(child), SESSION_TIMEOUT + 2.0)
    # The supervisor serves the next controller as before.
    c = colocated.connect([isolated.address], token_file=token_file, default=False)
    assert int(worker_pid(on(c))) not in (child, isolated.pid)


def test_a_closed_session_ends_its_worker_and_stopping_the_supervisor_ends_all(isolated, token_file):
    session = _colocated.RemoteSession(isolated.address, token=token_file.read_text().strip())
    (first,) = children_of(isolated.pid)
    session.close()
    until("a closed session's worker exits", lambda: gone(first), 2.0)
    clients = [colocated.connect([isolated.address], token_file=token_file, default=False) for _ in range(2)]
    children = [int(worker_pid(on(c))) for c in clients]
    assert not any(gone(pid) for pid in children)
    isolated.stop()  # SIGTERM
    assert isolated.proc.returncode == 0
    until("every session worker exits", lambda: all(gone(pid) for pid in children), 5.0)


def test_a_killed_supervisors_session_workers_exit(isolated, token_file):
    client = colocated.connect([isolated.address], token_file=token_file, default=False)
    child = int(worker_pid(on(client)))
    isolated.kill()  # kill -9: only the closed stdin pipe tells the child
    until("the session worker exits", lambda: gone(child), 5.0)


def test_nobody_connecting_ends_a_session_worker(token_file, tmp_path):
    """A single-session worker whose controller never comes exits 0 after the
    handshake deadline (10 s); here, its token file is gone at once."""
    path = tmp_path / "one-time"
    path.write_text(token_file.read_text())
    started = time.monotonic()
    w = Worker(path, devices=1, extra_args=("--single-session",))
    assert not path.exists()  # read and deleted
    assert w.proc.wait(timeout=30) == 0
    # Not before its handshake deadline (10 s) has passed.
    assert time.monotonic() - started >= 9.0
    w.stop()
