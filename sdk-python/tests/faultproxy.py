"""The test suite's fault-injecting TCP proxy as a process: ``colocated-faultproxy``
(the Rust crate ``tests/faultproxy``), built by ``cargo build -p colocated-faultproxy``
into the workspace's target folder (``make test`` builds it).

``FaultProxy(upstream)`` listens on a free port of 127.0.0.1 (``address``) and
forwards every connection to ``upstream``; its methods set faults for the
connections open and to come. A test that needs it is skipped, saying how to
build it, when the binary is missing (and fails instead in CI, where ``CI`` is
set)."""

import json
import os
import select
import subprocess
import time

import pytest

#: Seconds the proxy has to start, answer a command, or exit once told.
TIMEOUT = 30.0

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def binary_path() -> str:
    """Where the binary is: ``debug/colocated-faultproxy`` in ``CARGO_TARGET_DIR``
    (relative to the workspace root when relative), else in ``target/``."""
    target = os.environ.get("CARGO_TARGET_DIR") or "target"
    return os.path.join(_ROOT, target, "debug", "colocated-faultproxy")


class FaultProxy:
    """One ``colocated-faultproxy`` process forwarding ``127.0.0.1:PORT``
    (``address``) to ``upstream`` (``HOST:PORT``). Each method sends one command
    and returns once the proxy has applied it; a command the proxy refuses
    raises ``ValueError`` with its answer. Directions are ``"up"`` (client to
    upstream), ``"down"`` or ``"both"``. Use it as a context manager, or call
    ``close()``."""

    def __init__(self, upstream: str):
        path = binary_path()
        if not os.access(path, os.X_OK):
            reason = f"the fault proxy is not built ({path}): run `cargo build -p colocated-faultproxy`"
            if os.environ.get("CI"):
                raise AssertionError(reason)
            pytest.skip(reason)
        self.proc = subprocess.Popen(
            [path, "--upstream", upstream], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        line = self._read_line()
        if not line.startswith("listening "):
            self.close()
            raise AssertionError(f"the fault proxy did not start: {line!r}")
        self.address = line.split()[-1]

    def _read_line(self) -> str:
        # Bounded: a proxy that stops answering fails the test instead of hanging it.
        ready, _, _ = select.select([self.proc.stdout], [], [], TIMEOUT)
        if not ready:
            raise AssertionError(f"the fault proxy did not answer within {TIMEOUT} s")
        return self.proc.stdout.readline().rstrip("\n")

    def _ask(self, command: str) -> str:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        answer = self._read_line()
        if answer.startswith("error: "):
            raise ValueError(f"{command!r}: {answer}")
        return answer

    def latency(self, ms: int, direction: str = "both") -> None:
        """Delivers each chunk ``ms`` milliseconds after it was read (0: no delay)."""
        self._ask(f"latency {direction} {int(ms)}")

    def partition(self, on: bool = True) -> None:
        """Stops forwarding in both directions, every socket kept open, and
        holds the data (``on``); delivers it all after the heal (``False``)."""
        self._ask(f"partition {'on' if on else 'off'}")

    def reset(self) -> None:
        """Resets every open connection on both sides (``ECONNRESET``); new
        connections work."""
        self._ask("reset")

    def bandwidth(self, bytes_per_second, direction: str = "both") -> None:
        """Limits each connection to ``bytes_per_second`` (``None``: unlimited)."""
        self._ask(f"bandwidth {direction} {'off' if bytes_per_second is None else int(bytes_per_second)}")

    def refuse(self, on: bool = True) -> None:
        """Resets new connections at once (``on``), as a port whose worker is
        down; forwards them again with ``False``."""
        self._ask(f"refuse {'on' if on else 'off'}")

    def stats(self) -> dict:
        """The counters: ``accepted``, ``refused``, ``open``, ``bytes_up`` and
        ``bytes_down``."""
        return json.loads(self._ask("stats"))

    def close(self) -> None:
        """Stops the proxy (closing its connections) and waits for it."""
        try:
            self.proc.stdin.close()  # the proxy exits when its stdin closes
        except OSError:
            pass
        try:
            self.proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=TIMEOUT)
        self.proc.stdout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def crash_and_restart(proxy: FaultProxy, worker, start, timeout: float = 30.0):
    """A worker behind ``proxy`` crashes and a new one starts on its address:
    the proxy refuses and resets every connection, ``worker`` is killed, and
    ``start()`` is called until the port is free again (a new worker, which it
    returns); then the proxy forwards again. A start that fails raises
    ``AssertionError`` (as ``workers.Worker`` does) and is tried again, for
    ``timeout`` seconds at most."""
    proxy.refuse(True)
    proxy.reset()
    worker.kill()
    deadline = time.monotonic() + timeout
    while True:
        try:
            restarted = start()
            break
        except AssertionError:
            assert time.monotonic() < deadline, "the port stayed taken"
            time.sleep(0.05)
    proxy.refuse(False)
    return restarted
