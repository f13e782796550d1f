"""A controller driving two worker processes on loopback. Run by `make demo`.

It generates a token, starts two `python -m colocated.worker` processes that
require it, connects to both, runs a colocated function on an array sharded over
both hosts and a colocated class, prints where each piece ran, and shuts the
workers down cleanly (SIGTERM, exit status 0).
"""

import gc
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time

import colocated
import numpy as np


def start_worker(token_file: str) -> subprocess.Popen:
    worker = subprocess.Popen(
        [sys.executable, "-m", "colocated.worker", "--cpu-devices", "2", "--token-file", token_file],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = worker.stdout.readline().strip()
    if not line.startswith("listening on "):
        worker.kill()
        raise SystemExit(f"a worker did not start: {line!r}")
    worker.address = line.removeprefix("listening on ")
    worker.destroyed = threading.Event()
    print(f"worker pid {worker.pid}: {line} (each session runs in a child process of its own)")
    threading.Thread(target=forward, args=(worker,), daemon=True).start()
    return worker


def forward(worker: subprocess.Popen) -> None:
    """Shows what the worker prints (its colocated functions' output)."""
    for line in worker.stdout:
        print(line, end="", flush=True)
        if "destroyed" in line:
            worker.destroyed.set()


def main() -> None:
    print(f"controller pid {os.getpid()}")
    with tempfile.TemporaryDirectory() as tmp:
        token_file = os.path.join(tmp, "token")
        with open(token_file, "w") as f:
            f.write(secrets.token_hex(32))
        os.chmod(token_file, 0o600)
        workers = [start_worker(token_file) for _ in range(2)]
        try:
            run(workers, token_file)
        finally:
            for w in workers:
                w.send_signal(signal.SIGTERM)
            for w in workers:
                status = w.wait(timeout=30)
                print(f"worker pid {w.pid} stopped with status {status}")


def run(workers: list, token_file: str) -> None:
    client = colocated.connect([w.address for w in workers], token_file=token_file)
    print("== hosts")
    for host in client.hosts():
        print(f"  {host}")
    print("== devices")
    for d in client.devices():
        print(f"  {d.debug_string()}")

    mesh = colocated.Mesh(client.devices(), ("x",))
    sharding = colocated.NamedSharding(mesh, colocated.P("x"))
    x = colocated.device_put(np.arange(8, dtype=np.int32), sharding)

    @colocated.colocated_python
    def add_one(x):
        # Runs once per host, with that host's part of the array.
        print(f"  [session process {os.getpid()}] add_one got {np.asarray(x)}", flush=True)
        return x + 1

    print("== a colocated function on an array sharded over both hosts")
    y = add_one(x)
    print(f"  result {np.asarray(y)}")

    @colocated.colocated_python
    def where(x):
        return x * 0 + os.getpid()

    pids = np.asarray(where(x))
    for i in range(len(pids)):
        print(f"  element {i} was computed by pid {pids[i]}")

    @colocated.colocated_python_class
    class Accumulator:
        def __init__(self):
            self.total = 0
            print(f"  [session process {os.getpid()}] Accumulator built", flush=True)

        def add(self, x):
            self.total += int(np.asarray(x).sum())
            return x * 0 + self.total

        def __del__(self):
            print(f"  [session process {os.getpid()}] Accumulator destroyed", flush=True)

    print("== a colocated class: one object per host, built on first use")
    acc = Accumulator()
    acc.add(x)
    totals = np.asarray(acc.add(y))
    print(f"  per-host running totals {totals}")
    print("== dropping the object destroys it on both hosts")
    del acc
    gc.collect()
    deadline = time.monotonic() + 10
    for w in workers:
        w.destroyed.wait(max(0.0, deadline - time.monotonic()))


if __name__ == "__main__":
    main()
