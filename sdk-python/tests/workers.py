"""Real ``python -m colocated.worker`` processes on 127.0.0.1 for the tests:
started with a token file, stopped (or killed) with a bounded wait."""

import os
import secrets
import select
import signal
import subprocess
import sys

#: Seconds a worker has to start, and to stop once told.
START_TIMEOUT = 60.0

_HERE = os.path.dirname(os.path.abspath(__file__))


def write_token(path) -> None:
    """Writes a fresh random token to ``path``."""
    with open(path, "w") as f:
        f.write(secrets.token_hex(32) + "\n")


class Worker:
    """One worker process with ``devices`` CPU devices (and at most
    ``max_files`` open descriptors, when given), which closes a session after
    ``session_timeout`` seconds without a heartbeat. The tests' folder is on its
    ``PYTHONPATH``, so modules of it (such as ``jax_shim``) import there.
    ``extra_args`` go on its command line: by default ``--shared-interpreter``
    (every session in the one process, as most tests expect); ``()`` keeps the
    worker's own default, a process per session."""

    def __init__(
        self,
        token_file,
        devices=2,
        listen="127.0.0.1:0",
        max_files=None,
        session_timeout=2.0,
        extra_args=("--shared-interpreter",),
    ):
        env = {k: v for k, v in os.environ.items() if k != "COLOCATED_TOKEN"}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_HERE, env.get("PYTHONPATH")) if p)
        args = [sys.executable, "-m", "colocated.worker", "--cpu-devices", str(devices), "--listen", listen]
        args += ["--token-file", str(token_file), "--heartbeat-interval", "0.25"]
        args += ["--session-timeout", str(session_timeout), *extra_args]
        if max_files is not None:
            # The shell's own limit, inherited by the worker it becomes.
            args = ["sh", "-c", f'ulimit -n {int(max_files)} && exec "$0" "$@"', *args]
        # stdin is a pipe held open until the worker stops: a --single-session
        # worker stops when its stdin closes.
        self.proc = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
        )
        # Bounded: a worker that hangs before its line fails the test instead.
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT)
        line = self.proc.stdout.readline() if ready else "<nothing within the start timeout>"
        if not line.startswith("listening on "):
            self.proc.kill()
            self.proc.wait(timeout=START_TIMEOUT)
            raise AssertionError(f"worker did not start: {line!r}")
        self.address = line.split()[-1]
        self.pid = self.proc.pid

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=START_TIMEOUT)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.kill()
        self.proc.stdin.close()
        self.proc.stdout.close()


def rss_bytes(pid: int) -> int:
    """The resident memory of process ``pid`` in bytes (Linux ``VmRSS``)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")
