"""Real ``python -m colocated.worker`` processes that a stranger, a huge user error
or an orphaning launcher cannot take down: errors that cross the wire are cut to
a bound, warnings and refusals reach the operator's stderr by default
(rate-limited), and ``--exit-after-idle`` ends a worker nobody uses."""

import os
import re
import secrets
import subprocess
import sys
import threading
import time

import cloudpickle
import numpy as np
import pytest
from workers import Worker

import colocated
from colocated import _colocated
from colocated._colocated_python import _flatten, _HostCall, _spec_leaf

# Functions of this module travel by value: the workers cannot import it.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

START_TIMEOUT = 60.0
HUGE = 4 << 20
#: The bounds of core (``transport::MAX_ERROR_MESSAGE_BYTES`` and
#: ``MAX_REMOTE_TRACEBACK_BYTES``), plus room for context the controller adds.
MESSAGE_BOUND = (64 << 10) + 1024
CUT = re.compile(r" … \[([\d,]+) bytes cut\] … ")


def sharded_arange(n, devices):
    mesh = colocated.Mesh(devices, ("x",))
    return colocated.device_put(np.arange(n, dtype=np.int32), colocated.NamedSharding(mesh, colocated.P("x")))


def assert_cut(text, bound, head="HEAD", tail="TAIL"):
    """``text`` holds the head and tail of a huge text and says what was cut."""
    assert len(text.encode()) <= bound, len(text.encode())
    assert head in text and tail in text
    cut = CUT.search(text)
    assert cut is not None, text[:300]
    assert int(cut.group(1).replace(",", "")) > HUGE - bound


def test_a_huge_user_error_comes_back_cut_and_the_worker_serves_on(cluster):
    client, _ = cluster(2)
    x = sharded_arange(4, client.devices())

    @colocated.colocated_python
    def explode(x):
        raise ValueError("HEAD" + "é" * (HUGE // 2) + "TAIL")

    @colocated.colocated_python
    def add_one(x):
        return x + 1

    # Synchronous (discovery) and asynchronous (out_specs_fn) calls: both
    # errors cross the control stream.
    for fn in (explode, explode.specialize(out_specs_fn=lambda x: x)):
        with pytest.raises(colocated.RemoteError) as info:
            np.asarray(fn(x))
        assert_cut(info.value.args[0], MESSAGE_BOUND, head="ValueError: HEADé", tail="éTAIL")
        assert_cut(info.value.remote_traceback, MESSAGE_BOUND, head="explode", tail="éTAIL")
        # The link survived: the same client, the same workers, their arrays.
        np.testing.assert_array_equal(np.asarray(x), np.arange(4))
        np.testing.assert_array_equal(np.asarray(add_one(x)), np.arange(4) + 1)


def _explode_hugely(x):
    raise ValueError("HEAD" + "x" * HUGE + "TAIL")


def _remote_program(fn, x):
    """The serialized program running ``fn`` on an array shaped like ``x``."""
    _, in_treedef = _flatten(((x,), {}))
    _, out_treedef = _flatten(x)
    host_call = _HostCall(fn, in_treedef, [x.sharding], out_treedef)
    device = next(iter(x.sharding.device_set))
    exe = _colocated.Executable.compile(
        fn.__name__, cloudpickle.dumps(host_call), [_spec_leaf(x)], [_spec_leaf(x)], [device]
    )
    return exe.serialize()


def test_a_huge_error_read_through_a_bulk_stream_is_cut_too(token_file):
    """A failed output read with ``GetBuffer`` carries its error as a gRPC status
    (an HTTP/2 trailer, where 4 MiB would break the connection)."""
    worker = Worker(token_file)
    try:
        token = token_file.read_text().strip()
        device = colocated.devices()[1]
        x = colocated.device_put(np.int32(5), colocated.SingleDeviceSharding(device))
        session = _colocated.RemoteSession(worker.address, token=token)
        exe = session.new_handle()
        session.load_executable(exe, _remote_program(_explode_hugely, x))
        inp, out = session.new_handle(), session.new_handle()
        session.put_buffer(inp, device.id, "int32", [], np.int32(5).tobytes())
        session.execute(exe, [inp], [out], 1)
        with pytest.raises(colocated.ColocatedError) as info:
            session.get_buffer(out)
        assert_cut(str(info.value), (4 << 10) + 256)
        # The session goes on.
        assert np.frombuffer(session.get_buffer(inp), np.int32)[0] == 5
        session.close()
    finally:
        worker.stop()


class LoggedWorker:
    """``python -m colocated.worker`` with ``flags``, ``COLOCATED_LOG`` unset, its
    stderr collected line by line."""

    def __init__(self, *flags, token=None, tmp_path=None, wait_listening=True):
        env = {k: v for k, v in os.environ.items() if k not in ("COLOCATED_TOKEN", "COLOCATED_LOG")}
        args = [sys.executable, "-m", "colocated.worker", "--cpu-devices", "2", "--shared-interpreter", *flags]
        self.token = token
        if token is not None:
            path = tmp_path / f"token-{secrets.token_hex(4)}"
            path.write_text(token + "\n")
            args += ["--token-file", str(path)]
        self.started = time.monotonic()
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.lines = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            self.stop()
            raise AssertionError(f"worker did not start: {line!r} {self.lines}")
        self.address = line.split()[-1]

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def matching(self, text):
        return [line for line in self.lines if text in line]

    def wait_for(self, text, count=1, timeout=10.0):
        deadline = time.monotonic() + timeout
        while len(self.matching(text)) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.matching(text)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=START_TIMEOUT)
        self._reader.join(timeout=10)
        self.proc.stdout.close()


@pytest.fixture
def logged(tmp_path):
    started = []

    def start(*flags, token=None):
        w = LoggedWorker(*flags, token=token, tmp_path=tmp_path)
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()


def test_an_insecure_worker_warns_on_stderr_by_default(logged):
    w = logged("--insecure")
    warned = w.wait_for("without a token")
    assert len(warned) == 1 and "WARN" in warned[0], w.lines
    _colocated.RemoteSession(w.address).close()


def _suppressed(line):
    found = re.search(r"suppressed=(\d+)", line)
    return int(found.group(1)) if found else 0


def test_refusals_are_logged_with_their_peer_and_rate_limited(logged):
    token = secrets.token_hex(32)
    w = logged(token=token)
    refused = "refused a request"
    with pytest.raises(colocated.UnauthenticatedError):
        _colocated.RemoteSession(w.address, token="wrong")
    lines = w.wait_for(refused)
    assert len(lines) == 1, w.lines
    assert "wrong token" in lines[0] and "peer=127.0.0.1:" in lines[0], lines
    for _ in range(200):
        with pytest.raises(colocated.UnauthenticatedError):
            _colocated.RemoteSession(w.address, token="wrong", timeout=5.0)
    time.sleep(1.1)
    before = len(w.matching(refused))
    with pytest.raises(colocated.UnauthenticatedError):
        _colocated.RemoteSession(w.address)
    lines = w.wait_for(refused, before + 1)
    assert len(lines) <= 10, lines
    assert "no token" in lines[-1] and "not shown" in lines[-1], lines[-1]
    assert all("peer=127.0.0.1:" in line for line in lines), lines
    # Each refusal was logged or counted in a later line.
    assert len(lines) + sum(_suppressed(line) for line in lines) == 202, lines
    _colocated.RemoteSession(w.address, token=token).close()


def _exits(w, timeout=15.0):
    """Waits for the worker to exit by itself; its status and when."""
    status = w.proc.wait(timeout=timeout)
    return status, time.monotonic()


def test_exit_after_idle_ends_a_worker_without_a_controller(logged):
    w = logged("--exit-after-idle", "1", "--insecure")
    status, ended = _exits(w)
    assert status == 0, w.lines
    assert ended - w.started >= 0.9
    assert len(w.wait_for("--exit-after-idle")) == 1, w.lines


def test_exit_after_idle_waits_while_a_session_lives(logged):
    token = secrets.token_hex(32)
    w = logged("--exit-after-idle", "1", "--heartbeat-interval", "0.2", token=token)
    session = _colocated.RemoteSession(w.address, token=token)
    time.sleep(2.5)
    assert w.proc.poll() is None, w.lines
    closed = time.monotonic()
    session.close()
    status, ended = _exits(w)
    assert status == 0, w.lines
    assert ended - closed >= 0.85
    assert "no session for 1 s" in w.wait_for("--exit-after-idle")[0], w.lines


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_a_bad_exit_after_idle_is_a_usage_error(value):
    refused = subprocess.run(
        [sys.executable, "-m", "colocated.worker", "--insecure", f"--exit-after-idle={value}"],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
        check=False,
    )
    assert refused.returncode == 2, refused
    assert "--exit-after-idle" in refused.stderr
    assert refused.stdout == ""
