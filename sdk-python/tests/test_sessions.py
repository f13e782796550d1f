"""What a controller's session leaves on a real ``python -m colocated.worker``
process — objects of colocated classes, parked discovery results — belongs to
that session: other sessions never see it, and it is freed when the session
ends, whether the controller closed it or died (then after ``--session-timeout``),
with the worker's memory back near where it was."""

import gc
import os
import secrets
import select
import signal
import subprocess
import sys
import textwrap
import time

import cloudpickle
import numpy as np
import pytest
from workers import Worker
from workers import rss_bytes as rss

import colocated
from colocated import _colocated
from colocated._colocated_class import _ObjectRef
from colocated._colocated_python import _flatten, _HostCall, _spec_leaf

# Functions and classes of this module travel by value: workers cannot import it.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MIB = 1 << 20
#: Seconds of silence after which the workers of these tests close a session.
SESSION_TIMEOUT = 1.0
#: How long after a session timed out its objects must be gone.
FREED_WITHIN = 2.0


def until(what, predicate, timeout):
    """Polls ``predicate`` until it holds; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.1f} s: {what}")
        time.sleep(0.02)


class Controller:
    """A controller process running ``script`` (Python source, given the
    worker's address, the token file and a folder for markers as ``ADDRESS``,
    ``TOKEN_FILE`` and ``MARKS``); the test reads the lines it prints."""

    def __init__(self, script, worker, token_file, marks):
        prelude = f"ADDRESS, TOKEN_FILE, MARKS = {worker.address!r}, {str(token_file)!r}, {str(marks)!r}\n"
        env = {k: v for k, v in os.environ.items() if k != "COLOCATED_TOKEN"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", prelude + textwrap.dedent(script)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    def expect(self, line, timeout=60.0):
        """Waits until the controller prints ``line``."""
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        got = self.proc.stdout.readline() if ready else ""
        if got.strip() != line:
            self.proc.kill()
            _, err = self.proc.communicate(timeout=60)
            raise AssertionError(f"the controller printed {got!r}, not {line!r}:\n{err}")

    def kill(self):
        """``kill -9``: the controller never closes its session."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=60)
        self.proc.stdout.close()
        self.proc.stderr.close()


@pytest.fixture
def worker(token_file):
    """A worker with one device that closes sessions after 1 s of silence."""
    w = Worker(token_file, devices=1, session_timeout=SESSION_TIMEOUT)
    yield w
    w.stop()


@pytest.fixture
def marks(tmp_path):
    path = tmp_path / "marks"
    path.mkdir()
    return path


BIG_OBJECT_CONTROLLER = """
    import os
    import time

    import numpy as np

    import colocated

    client = colocated.connect([ADDRESS], token_file=TOKEN_FILE)

    @colocated.colocated_python_class
    class Big:
        def __init__(self, nbytes):
            self.data = np.ones(nbytes // 8)  # written: resident on the worker
            open(os.path.join(MARKS, "built"), "w").close()

        def __del__(self):
            open(os.path.join(MARKS, "destroyed"), "w").close()

        def size(self, x):
            return x * 0 + self.data.nbytes // (1 << 20)

    x = colocated.device_put(np.int32(0), colocated.SingleDeviceSharding(client.devices()[0]))
    big = Big(200 << 20)
    assert int(big.size(x)) == 200
    print("ready", flush=True)
    time.sleep(3600)
"""


def test_a_killed_controllers_objects_are_destroyed_and_their_memory_freed(worker, token_file, marks):
    before = rss(worker.pid)
    controller = Controller(BIG_OBJECT_CONTROLLER, worker, token_file, marks)
    try:
        controller.expect("ready")
    finally:
        peak = rss(worker.pid)
        controller.kill()
    killed = time.monotonic()
    assert peak - before >= 190 * MIB, (before, peak)
    assert os.listdir(marks) == ["built"]
    # Nobody will collect the wrapper or close the session: the worker closes
    # it once it is silent, and destroys its object.
    deadline = SESSION_TIMEOUT + FREED_WITHIN
    until("the object is destroyed", lambda: (marks / "destroyed").exists(), deadline)
    until(
        "the worker's memory falls back",
        lambda: rss(worker.pid) <= peak - 150 * MIB,
        max(0.0, killed + deadline - time.monotonic()),
    )
    assert rss(worker.pid) <= before + 40 * MIB, (before, peak, rss(worker.pid))


class Marked:
    """Marks its construction and destruction as files named ``built-<tag>``
    and ``destroyed-<tag>`` in ``marks``; counts its calls."""

    def __init__(self, marks, tag):
        self.marks, self.tag, self.count = marks, tag, 0
        open(os.path.join(marks, f"built-{tag}"), "w").close()

    def __del__(self):
        open(os.path.join(self.marks, f"destroyed-{self.tag}"), "w").close()

    def incr(self, x):
        self.count += 1
        return x * 0 + self.count


def touch_object(ref):
    """A host function that builds (or finds) the object of ``ref`` in the
    session it runs for, as a method call of a colocated class does."""

    def touch(x):
        from colocated._colocated_class import _host_object

        _host_object(ref)
        return x

    return touch


def remote_program(fn, x):
    """The serialized program running ``fn`` on an array shaped like ``x``, for
    a worker whose devices have the ids of ours."""
    _, in_treedef = _flatten(((x,), {}))
    _, out_treedef = _flatten(x)
    host_call = _HostCall(fn, in_treedef, [x.sharding], out_treedef)
    device = next(iter(x.sharding.device_set))
    exe = _colocated.Executable.compile(
        "touch", cloudpickle.dumps(host_call), [_spec_leaf(x)], [_spec_leaf(x)], [device]
    )
    return exe.serialize()


def object_in_a_session(worker, token_file, marks, tag):
    """A low-level session on ``worker`` (``RemoteSession``) in which a program
    built a ``Marked`` object tagged ``tag``, as a method call would have, but
    with no wrapper that will ever destroy it."""
    token = token_file.read_text().strip()
    device = colocated.devices()[0]
    x = colocated.device_put(np.int32(7), colocated.SingleDeviceSharding(device))
    ref = _ObjectRef(Marked, secrets.randbits(63), ((str(marks), tag), {}))
    session = _colocated.RemoteSession(worker.address, token=token)
    exe, inp, out = session.new_handle(), session.new_handle(), session.new_handle()
    session.load_executable(exe, remote_program(touch_object(ref), x))
    session.put_buffer(inp, device.id, "int32", [], np.int32(7).tobytes())
    session.execute(exe, [inp], [out], 1)
    assert int(np.frombuffer(session.get_buffer(out), np.int32)[0]) == 7
    assert (marks / f"built-{tag}").exists()
    return session


def test_a_closed_session_destroys_its_objects_at_once(token_file, marks):
    # Sessions time out only after a minute here: only closing frees them.
    worker = Worker(token_file, devices=1, session_timeout=60)
    try:
        session = object_in_a_session(worker, token_file, marks, "closed")
        assert sorted(os.listdir(marks)) == ["built-closed"]
        session.close()
        until("closing destroys the object", lambda: (marks / "destroyed-closed").exists(), 10.0)
    finally:
        worker.stop()


def test_a_stopping_worker_destroys_the_objects_of_every_session(token_file, marks):
    worker = Worker(token_file, devices=1, session_timeout=60)
    try:
        sessions = [object_in_a_session(worker, token_file, marks, tag) for tag in ("one", "two")]
    finally:
        worker.stop()  # SIGTERM: a clean stop
    assert worker.proc.returncode == 0
    assert sorted(os.listdir(marks)) == ["built-one", "built-two", "destroyed-one", "destroyed-two"]
    del sessions


def test_dropping_a_client_destroys_its_sessions_objects(token_file, marks):
    worker = Worker(token_file, devices=1, session_timeout=60)
    try:
        client = colocated.connect([worker.address], token_file=token_file, default=False)
        x = colocated.device_put(np.int32(1), colocated.SingleDeviceSharding(client.devices()[0]))
        ref = _ObjectRef(Marked, secrets.randbits(63), ((str(marks), "dropped"), {}))
        touch = colocated.colocated_python(touch_object(ref))
        assert int(touch(x)) == 1
        assert sorted(os.listdir(marks)) == ["built-dropped"]
        # A plain function built it: no wrapper destroys it; the client's end
        # does (the SDK's caches hold its devices, and with them the client,
        # until they are cleared).
        del client, x, touch
        colocated.clear_caches()
        gc.collect()
        until("dropping the client destroys the object", lambda: (marks / "destroyed-dropped").exists(), 2.0)
    finally:
        worker.stop()


def test_a_session_never_reaches_the_objects_of_another(worker, token_file, marks):
    clients = [colocated.connect([worker.address], token_file=token_file, default=False) for _ in range(2)]
    a_x, b_x = (colocated.device_put(np.int32(0), colocated.SingleDeviceSharding(c.devices()[0])) for c in clients)
    Counter = colocated.colocated_python_class(Marked)
    a = Counter(str(marks), "a")
    assert [int(a.incr(a_x)) for _ in range(2)] == [1, 2]
    # Client b names a's object (its id, through the private reference)...
    b = Counter(str(marks), "b")
    b._ref.obj_id = a._ref.obj_id
    # ...and gets an object of its own session, built from its own arguments.
    assert int(b.incr(b_x)) == 1
    assert int(a.incr(a_x)) == 3, "a's object is untouched"
    assert sorted(os.listdir(marks)) == ["built-a", "built-b"]
    # Ending b's session destroys b's object (which its wrapper, knowing it by
    # its own id, cannot) and leaves a's.
    del b, b_x
    clients.pop()
    colocated.clear_caches()
    gc.collect()
    until("b's object is destroyed", lambda: (marks / "destroyed-b").exists(), 5.0)
    assert not (marks / "destroyed-a").exists()
    assert int(a.incr(a_x)) == 4
    del a
    gc.collect()
    until("a's object is destroyed", lambda: (marks / "destroyed-a").exists(), 5.0)


PARKING_CONTROLLER = """
    import os
    import time

    import numpy as np

    import colocated

    client = colocated.connect([ADDRESS, BLOCKER_ADDRESS], token_file=TOKEN_FILE)

    @colocated.colocated_python
    def big(x):
        # Discovery runs it on both workers: the first parks its output, the
        # second never finishes, so nobody takes it.
        if os.getpid() == BLOCKER_PID:
            time.sleep(3600)
        return colocated.device_put(np.ones(100 << 18, np.float32), x.sharding)  # 100 MiB

    mesh = colocated.Mesh(client.devices(), ("x",))
    x = colocated.device_put(np.zeros(2, np.float32), colocated.NamedSharding(mesh, colocated.P("x")))
    print("discovering", flush=True)
    big(x)
"""


def parked_everywhere(x):
    """A host function: how many discovery results are parked on its host,
    in every session."""
    from colocated import _colocated

    return x * 0 + _colocated.parked_results(every_session=True)


def test_a_killed_controllers_parked_discovery_results_are_freed(worker, token_file, marks):
    client = colocated.connect([worker.address], token_file=token_file, default=False)
    x = colocated.device_put(np.int32(0), colocated.SingleDeviceSharding(client.devices()[0]))
    count = colocated.colocated_python(parked_everywhere)
    assert int(count(x)) == 0
    before = rss(worker.pid)
    blocker = Worker(token_file, devices=1, session_timeout=SESSION_TIMEOUT)
    script = PARKING_CONTROLLER.replace("BLOCKER_ADDRESS", repr(blocker.address))
    controller = Controller(script.replace("BLOCKER_PID", str(blocker.pid)), worker, token_file, marks)
    try:
        try:
            controller.expect("discovering")
            until("the worker parked the dead controller's result", lambda: int(count(x)) == 1, 30.0)
        finally:
            peak = rss(worker.pid)
            controller.kill()
    finally:
        blocker.stop()
    killed = time.monotonic()
    assert peak - before >= 90 * MIB, (before, peak)
    deadline = SESSION_TIMEOUT + FREED_WITHIN
    until("the parked result is freed", lambda: int(count(x)) == 0, deadline)
    until(
        "the worker's memory falls back",
        lambda: rss(worker.pid) <= peak - 75 * MIB,
        max(0.0, killed + deadline - time.monotonic()),
    )
