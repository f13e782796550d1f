"""``python -m colocated.worker``: a real worker process on 127.0.0.1, driven through
the low-level session (``colocated._colocated.RemoteSession``) that
``colocated.connect`` will build on."""

import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import cloudpickle
import numpy as np
import pytest

import colocated
from colocated import _colocated
from colocated._colocated_python import _flatten, _HostCall, _spec_leaf

# Functions of this module travel by value: the worker cannot import it.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

START_TIMEOUT = 60.0


class WorkerProcess:
    def __init__(self, tmp_path, *flags, token=None):
        env = {k: v for k, v in os.environ.items() if k != "COLOCATED_TOKEN"}
        args = [sys.executable, "-m", "colocated.worker", "--cpu-devices", "8", "--shared-interpreter", *flags]
        if token is not None:
            token_file = tmp_path / "token"
            token_file.write_text(token + "\n")
            args += ["--token-file", str(token_file)]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            self.proc.kill()
            raise AssertionError(f"worker did not start: {line!r} {self.proc.stderr.read()}")
        self.address = line.split()[-1]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=START_TIMEOUT)
        self.proc.stdout.close()
        self.proc.stderr.close()


@pytest.fixture
def worker(tmp_path):
    token = secrets.token_hex(32)
    w = WorkerProcess(tmp_path, token=token)
    w.token = token
    yield w
    w.stop()


def remote_program(fn, x):
    """The serialized program running ``fn`` on an array shaped like ``x`` (for
    the worker's devices, which have the ids of ours)."""
    sharding = x.sharding
    _, in_treedef = _flatten(((x,), {}))
    _, out_treedef = _flatten(x)
    host_call = _HostCall(fn, in_treedef, [sharding], out_treedef)
    device = next(iter(sharding.device_set))
    exe = _colocated.Executable.compile(
        fn.__name__, cloudpickle.dumps(host_call), [_spec_leaf(x)], [_spec_leaf(x)], [device]
    )
    return exe.serialize()


def add_pid(x):
    return x + os.getpid()


def explode(x):
    raise ZeroDivisionError("boom on the worker")


def run_remote(worker, fn, value=5):
    device = colocated.devices()[1]
    x = colocated.device_put(np.int32(value), colocated.SingleDeviceSharding(device))
    session = _colocated.RemoteSession(worker.address, token=worker.token)
    exe = session.new_handle()
    assert session.load_executable(exe, remote_program(fn, x)) == (1, 1)
    inp, out = session.new_handle(), session.new_handle()
    session.put_buffer(inp, device.id, "int32", [], np.int32(value).tobytes())
    session.execute(exe, [inp], [out], 1)
    return session, out


def test_a_python_worker_runs_colocated_python_programs_in_its_own_process(worker):
    session, out = run_remote(worker, add_pid)
    assert "python" in session.languages() and "native" in session.languages()
    assert len(session.devices()) == 8
    y = int(np.frombuffer(session.get_buffer(out), np.int32)[0])
    assert y == 5 + worker.proc.pid, "the function ran in the worker process"
    assert y != 5 + os.getpid()
    session.close()


def test_user_errors_on_the_worker_come_back_with_their_message(worker):
    session, out = run_remote(worker, explode)
    with pytest.raises(colocated.ColocatedError, match="boom on the worker"):
        session.get_buffer(out)
    # The worker keeps serving.
    session2, out2 = run_remote(worker, add_pid, value=1)
    assert int(np.frombuffer(session2.get_buffer(out2), np.int32)[0]) == 1 + worker.proc.pid


def test_a_wrong_token_is_refused_before_anything_is_unpickled(worker):
    with pytest.raises(colocated.UnauthenticatedError, match="token is wrong"):
        _colocated.RemoteSession(worker.address, token=worker.token + "x")
    with pytest.raises(colocated.UnauthenticatedError, match="requires a token"):
        _colocated.RemoteSession(worker.address)


def test_a_worker_needs_a_token_and_stops_cleanly_on_sigterm(worker):
    env = {k: v for k, v in os.environ.items() if k != "COLOCATED_TOKEN"}
    refused = subprocess.run(
        [sys.executable, "-m", "colocated.worker"],
        capture_output=True,
        text=True,
        env=env,
        timeout=START_TIMEOUT,
        check=False,
    )
    assert refused.returncode != 0
    assert "requires a token" in refused.stderr
    assert refused.stdout == ""
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(timeout=START_TIMEOUT) == 0
    assert worker.proc.stdout.read() == "", "one line on stdout, then nothing"


def _build_plugin(tmp_path) -> str:
    """The C plugin of the repository's tests, built as a shared library."""
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "libadd_one_plugin.so"
    subprocess.run(
        [os.environ.get("CC", "cc"), "-shared", "-fPIC", "-I", str(root / "include"),
         str(root / "tests" / "plugin" / "add_one_plugin.c"), "-o", str(out)],
        check=True,
        timeout=START_TIMEOUT,
    )
    return str(out)


def test_a_python_worker_loads_native_function_plugins_at_start(tmp_path):
    plugin = _build_plugin(tmp_path)
    token = secrets.token_hex(32)
    w = WorkerProcess(tmp_path, "--plugin", plugin, token=token)
    try:
        # It serves (a session opens), and said what the plugin registered.
        _colocated.RemoteSession(w.address, token=token).close()
        w.proc.terminate()
        w.proc.wait(timeout=START_TIMEOUT)
        assert "plugin_add_one_i32" in w.proc.stderr.read()
    finally:
        w.stop()


def test_a_bad_plugin_stops_the_worker_before_it_listens(tmp_path):
    env = dict(os.environ, COLOCATED_TOKEN="t" * 32)
    for path, message in ((str(tmp_path / "missing.so"), "missing.so"), (__file__, "--plugin")):
        refused = subprocess.run(
            [sys.executable, "-m", "colocated.worker", "--plugin", path],
            capture_output=True,
            text=True,
            env=env,
            timeout=START_TIMEOUT,
            check=False,
        )
        assert refused.returncode != 0
        assert message in refused.stderr
        assert refused.stdout == ""


def test_the_python_worker_takes_the_runtimes_table_of_flags():
    # `colocated worker` is built from the same table (a Rust test checks it).
    from colocated.worker import _parser

    longs = {o for a in _parser()._actions for o in a.option_strings if o.startswith("--")}
    # The isolation switches, their aliases and the hidden --single-session included.
    table = {f"--{n}" for name, *_, aliases, _ in _colocated.worker_flags() for n in (name, *aliases)}
    assert {"--isolate-sessions", "--shared-sessions", "--shared-interpreter", "--single-session"} <= table
    assert longs - {"--help"} == table
    args = _parser().parse_args(["--plugin", "a.so", "--plugin", "b.so", "--session-timeout", "3"])
    assert (args.listen, args.heartbeat_interval, args.session_timeout) == ("127.0.0.1:0", 1.0, 3.0)
    assert args.plugin == ["a.so", "b.so"]
