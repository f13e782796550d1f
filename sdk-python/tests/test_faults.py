"""A controller and a real ``python -m colocated.worker`` process talking through
the test suite's fault-injecting proxy (``faultproxy.FaultProxy``): what a slow
link, a reset, a partition and a restarted worker do to calls and transfers,
also with a session in a worker process of its own (``session_behind_proxy.py``).
Timings are asserted only as the bounds docs/failures.md states."""

import os
import pathlib
import subprocess
import sys
import threading
import time

import cloudpickle
import numpy as np
import pytest
from faultproxy import FaultProxy, crash_and_restart
from workers import Worker

import colocated
from colocated import _client

# Functions of this module travel by value: the worker cannot import it.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

@pytest.fixture
def linked(token_file):
    """A worker process, a fault proxy in front of it, and a default client
    connected through the proxy: ``(client, proxy, worker)``. The previous
    default client is restored, and the proxy and the worker stopped, after."""
    previous = _client._current_default()
    worker = Worker(token_file)
    try:
        with FaultProxy(worker.address) as proxy:
            client = colocated.connect([proxy.address], token_file=token_file)
            try:
                yield client, proxy, worker
            finally:
                _client._set_default(previous)
    finally:
        worker.stop()


def _call_and_catch(fn, *args):
    try:
        return fn(*args)
    except Exception as error:  # noqa: BLE001 - the test inspects it
        return error


def test_calls_through_a_link_with_20_ms_each_way_complete_with_right_results(linked):
    client, proxy, _ = linked
    proxy.latency(20)
    x = colocated.device_put(np.arange(4, dtype=np.int32), client.devices()[0])

    @colocated.colocated_python
    def add_one(x):
        return x + 1

    began = time.monotonic()
    for _ in range(5):
        x = add_one(x)
    np.testing.assert_array_equal(np.asarray(x), [5, 6, 7, 8])
    assert time.monotonic() - began >= 0.04  # at least one round trip through the delay
    big = np.arange(3 << 20, dtype=np.int32)  # several transfer chunks
    np.testing.assert_array_equal(np.asarray(colocated.device_put(big, client.devices()[1])), big)
    stats = proxy.stats()
    assert stats["bytes_up"] > big.nbytes and stats["bytes_down"] > big.nbytes, stats


def test_a_reset_mid_call_resumes_the_session_and_the_call_completes_once(linked, tmp_path):
    client, proxy, _ = linked
    started, release = str(tmp_path / "started"), str(tmp_path / "release")
    runs = tmp_path / "runs"
    x = colocated.device_put(np.arange(2, dtype=np.int32), client.devices()[0])

    @colocated.colocated_python
    def held(x):
        with open(runs, "a") as f:
            f.write("run\n")
        open(started, "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.01)
        return x + 1

    result = []
    caller = threading.Thread(target=lambda: result.append(_call_and_catch(lambda v: np.asarray(held(v)), x)))
    caller.start()
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(started):
            assert time.monotonic() < deadline, "the held call never ran"
            time.sleep(0.01)
        proxy.reset()
        time.sleep(0.3)
        assert caller.is_alive(), f"the call ended with its connection: {result}"
    finally:
        open(release, "w").close()
        caller.join(timeout=30)
    np.testing.assert_array_equal(result[0], [1, 2])
    assert runs.read_text().count("run") == 1, "the function ran more than once"
    # The session goes on: what it held, and new calls.
    np.testing.assert_array_equal(np.asarray(x), [0, 1])
    np.testing.assert_array_equal(np.asarray(held(x)), [1, 2])


def _when_sent(proxy, direction, nbytes, then):
    """Runs ``then()`` on a thread once ``nbytes`` more have gone ``direction``
    ("up" or "down") through ``proxy``: a fault that lands while a transfer is
    in flight. Returns the thread."""
    key = f"bytes_{direction}"
    start = proxy.stats()[key]

    def run():
        deadline = time.monotonic() + 60
        while proxy.stats()[key] < start + nbytes and time.monotonic() < deadline:
            time.sleep(0.002)
        then()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_reset_mid_upload_and_mid_download_starts_them_again(linked):
    client, proxy, _ = linked
    big = np.arange(8 << 20, dtype=np.int32)  # 32 MiB
    proxy.bandwidth(32 << 20)  # about a second each way: the reset lands mid-transfer
    resetter = _when_sent(proxy, "up", 8 << 20, proxy.reset)
    x = colocated.device_put(big, client.devices()[0])
    x.block_until_ready()
    resetter.join(timeout=60)
    assert proxy.stats()["bytes_up"] > big.nbytes + (1 << 20), "the upload did not start again"
    resetter = _when_sent(proxy, "down", 8 << 20, proxy.reset)
    back = np.asarray(x)
    resetter.join(timeout=60)
    np.testing.assert_array_equal(back, big)


def test_a_partition_shorter_than_the_session_timeout_loses_no_call_or_256_mib_upload(token_file, tmp_path):
    previous = _client._current_default()
    worker = Worker(token_file, session_timeout=5.0)
    runs = tmp_path / "runs"
    try:
        with FaultProxy(worker.address) as proxy:
            client = colocated.connect([proxy.address], token_file=token_file)
            try:

                @colocated.colocated_python
                def counted(x):
                    with open(runs, "a") as f:
                        f.write("run\n")
                    return x + 1

                x = colocated.device_put(np.zeros(4, dtype=np.int32), client.devices()[0])
                x = counted(x)  # compiled before the partition
                big = np.arange(64 << 20, dtype=np.int32)  # 256 MiB

                def partition():
                    proxy.partition(True)
                    time.sleep(1.5)  # past the heartbeat bound, short of the 5 s session timeout
                    proxy.partition(False)

                partitioner = _when_sent(proxy, "up", 32 << 20, partition)
                y = colocated.device_put(big, client.devices()[1])
                for _ in range(9):
                    x = counted(x)
                y.block_until_ready()
                partitioner.join(timeout=60)
                np.testing.assert_array_equal(np.asarray(x), [10] * 4)
                np.testing.assert_array_equal(np.asarray(y), big)
                assert runs.read_text().count("run") == 10, "a call was lost or ran twice"
            finally:
                _client._set_default(previous)
    finally:
        worker.stop()


def test_a_worker_restarted_on_the_same_address_serves_the_same_client_again(token_file, tmp_path):
    previous = _client._current_default()
    first = Worker(token_file)
    address = first.address
    second = None
    try:
        with FaultProxy(address) as proxy:
            client = colocated.connect([proxy.address], token_file=token_file)
            try:

                @colocated.colocated_python
                def add_one(x):
                    return x + 1

                # Large enough to be read from the worker, not from the call's answer.
                kept = add_one(colocated.device_put(np.arange(1 << 20, dtype=np.int32), client.devices()[0]))
                kept.block_until_ready()
                # The worker crashes, and a new one starts on its address.
                second = crash_and_restart(proxy, first, lambda: Worker(token_file, listen=address))
                # What the lost session held says so, typed.
                with pytest.raises(colocated.UnavailableError, match="no longer has this session"):
                    np.asarray(kept)
                # New work, and the function compiled before, run on the new worker.
                x = colocated.device_put(np.arange(4, dtype=np.int32), client.devices()[0])
                np.testing.assert_array_equal(np.asarray(add_one(add_one(x))), [2, 3, 4, 5])
            finally:
                _client._set_default(previous)
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_a_per_session_worker_resumes_its_session_after_a_reset(token_file, tmp_path):
    """An isolating supervisor runs the session in a worker process of its own,
    which the controller reaches directly: a reset of that link resumes the
    session there (the controller connects again to the session's worker, with
    its token), the call in flight completing once."""
    commands = tmp_path / "commands"
    here = os.path.dirname(os.path.abspath(__file__))
    launcher = (
        "import sys, colocated.worker as w; "
        f"w._COMMAND = [sys.executable, {os.path.join(here, 'session_behind_proxy.py')!r}]; "
        "sys.exit(w.main())"
    )
    env = {k: v for k, v in os.environ.items() if k != "COLOCATED_TOKEN"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    env["COLOCATED_TEST_PROXY_COMMANDS"] = str(commands)
    args = [sys.executable, "-c", launcher, "--cpu-devices", "1", "--listen", "127.0.0.1:0"]
    args += ["--token-file", str(token_file), "--heartbeat-interval", "0.25", "--session-timeout", "5"]
    args += ["--isolate-sessions"]
    supervisor = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    previous = _client._current_default()
    try:
        line = supervisor.stdout.readline()
        assert line.startswith("listening on "), line
        client = colocated.connect([line.split()[-1]], token_file=token_file)
        try:
            started, release, runs = tmp_path / "started", tmp_path / "release", tmp_path / "runs"

            @colocated.colocated_python
            def held(x):
                with open(runs, "a") as f:
                    f.write(f"{os.getpid()}\n")
                open(started, "w").close()
                deadline = time.monotonic() + 60
                while not os.path.exists(release) and time.monotonic() < deadline:
                    time.sleep(0.01)
                return x + 1

            x = colocated.device_put(np.arange(2, dtype=np.int32), client.devices()[0])
            result = []
            caller = threading.Thread(target=lambda: result.append(_call_and_catch(lambda v: np.asarray(held(v)), x)))
            caller.start()
            try:
                deadline = time.monotonic() + 30
                while not started.exists():
                    assert time.monotonic() < deadline, "the held call never ran"
                    time.sleep(0.01)
                commands.write_text("reset\n")
                done = pathlib.Path(str(commands) + ".done")
                while not (done.exists() and done.read_text() == "1"):
                    assert time.monotonic() < deadline, "the session's proxy never reset"
                    time.sleep(0.01)
                time.sleep(0.3)
                assert caller.is_alive(), f"the call ended with its connection: {result}"
            finally:
                release.touch()
                caller.join(timeout=30)
            np.testing.assert_array_equal(result[0], [1, 2])
            pids = runs.read_text().split()
            assert len(pids) == 1, "the function ran more than once"
            assert int(pids[0]) != supervisor.pid, "the session ran in the supervisor"
            np.testing.assert_array_equal(np.asarray(held(x)), [1, 2])
            assert len(set(runs.read_text().split())) == 1, "the session moved to another process"
        finally:
            _client._set_default(previous)
    finally:
        supervisor.terminate()
        supervisor.wait(timeout=30)


def test_a_partition_longer_than_the_session_timeout_fails_typed_and_the_client_works_again(token_file):
    previous = _client._current_default()
    worker = Worker(token_file, session_timeout=1.0)
    try:
        with FaultProxy(worker.address) as proxy:
            client = colocated.connect([proxy.address], token_file=token_file)
            try:

                @colocated.colocated_python
                def slow_add_one(x):
                    time.sleep(3)
                    return x + 1

                x = colocated.device_put(np.arange(1 << 20, dtype=np.int32), client.devices()[0])
                x.block_until_ready()
                y = slow_add_one(x)
                proxy.partition(True)
                began = time.monotonic()
                with pytest.raises(colocated.UnavailableError):
                    np.asarray(y)
                # Within the session timeout since the worker was last heard,
                # plus the heartbeat bound and a margin for a loaded machine.
                assert time.monotonic() - began < 4.0
                time.sleep(1.0)  # the worker has ended the session
                proxy.partition(False)
                with pytest.raises(colocated.UnavailableError):
                    np.asarray(x)
                # New work on the same client, and the function defined before, run.
                z = colocated.device_put(np.arange(4, dtype=np.int32), client.devices()[0])
                np.testing.assert_array_equal(np.asarray(slow_add_one(z)), [1, 2, 3, 4])
            finally:
                _client._set_default(previous)
    finally:
        worker.stop()
