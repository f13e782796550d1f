"""Colocated Python against JAX's colocated Python, side by side, in one run.

Measures (median of repeated runs):
- sync round trip: a call of ``x + 1`` on a scalar plus ``block_until_ready``,
  for ``colocated.colocated_python`` and ``jax.experimental.colocated_python``
  (JAX's CPU backend runs the function inline);
- pipeline: 20k calls of a specialized (asynchronous) function from one thread,
  then one block.

Targets (issue 3): sync round trip <= 1.0x JAX's; pipeline >= 100k calls/s.
Run by ``make bench`` (which installs jax[cpu] into the benchmark venv).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

import colocated


def _median_us(fn, n: int = 2000, repeats: int = 5) -> float:
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(runs)


def ours() -> tuple[float, float]:
    device = colocated.colocated_cpu_devices(colocated.devices())[0]
    sharding = colocated.NamedSharding(colocated.Mesh([device], ["x"]), colocated.P())
    x = colocated.device_put(np.int32(1), sharding)

    @colocated.colocated_python
    def add_one(x):
        return x + 1

    colocated.block_until_ready(add_one(x))
    sync = _median_us(lambda: colocated.block_until_ready(add_one(x)))

    pipelined = add_one.specialize(out_specs_fn=lambda x: x)
    colocated.block_until_ready(pipelined(x))

    def pipeline() -> float:
        start = time.perf_counter()
        y = None
        for _ in range(20_000):
            y = pipelined(x)
        colocated.block_until_ready(y)
        return 20_000 / (time.perf_counter() - start)

    return sync, statistics.median(pipeline() for _ in range(3))


def jax_baseline() -> float | None:
    try:
        import jax
        from jax.experimental import colocated_python as jcp
    except ImportError:
        return None
    device = jcp.colocated_cpu_devices(jax.devices())[0]
    sharding = jax.sharding.NamedSharding(jax.sharding.Mesh([device], ["x"]), jax.sharding.PartitionSpec())
    x = jax.device_put(np.int32(1), sharding)

    @jcp.colocated_python
    def add_one(x):
        return x + 1

    jax.block_until_ready(add_one(x))
    return _median_us(lambda: jax.block_until_ready(add_one(x)))


class TcpEchoes:
    """``peers`` echo processes on loopback TCP: ``ping()`` sends one byte to
    each, then reads every byte back."""

    _ECHO = (
        "import socket,sys\n"
        "s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(1)\n"
        "print(s.getsockname()[1], flush=True)\n"
        "c,_=s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\n"
        "while True:\n"
        "    b=c.recv(1)\n"
        "    if not b: break\n"
        "    c.sendall(b)\n"
    )

    def __init__(self, peers: int = 1):
        self._peers = peers

    def __enter__(self):
        import socket
        import subprocess
        import sys

        self._procs = [
            subprocess.Popen([sys.executable, "-c", self._ECHO], stdout=subprocess.PIPE, text=True)
            for _ in range(self._peers)
        ]
        try:
            self._socks = []
            for proc in self._procs:
                sock = socket.create_connection(("127.0.0.1", int(proc.stdout.readline())))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._socks.append(sock)
            self.ping()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def ping(self) -> None:
        for sock in self._socks:
            sock.sendall(b"x")
        for sock in self._socks:
            sock.recv(1)

    def __exit__(self, *exc):
        for sock in getattr(self, "_socks", []):
            sock.close()
        for proc in self._procs:
            proc.kill()
            proc.wait()


def _tcp_ping_pong_us(n: int = 2000, peers: int = 1) -> float:
    """Median round trip of one byte over loopback TCP to ``peers`` other
    processes at once (one byte to each, then every byte back)."""
    with TcpEchoes(peers) as echoes:
        return _median_us(echoes.ping, n=n)


def main() -> None:
    sync, calls_per_s = ours()
    jax_sync = jax_baseline()
    print("== colocated Python (local host) ==")
    print(f"{'measure':<44} {'figure':>14} {'baseline':>16} {'ratio':>8} {'target':>10}")
    if jax_sync is None:
        print(f"{'sync round trip (x + 1, scalar)':<44} {sync:>11.1f} µs {'(jax missing)':>16} {'-':>8} {'<= 1.0x':>10}")
    else:
        print(
            f"{'sync round trip (x + 1, scalar)':<44} {sync:>11.1f} µs {jax_sync:>13.1f} µs "
            f"{sync / jax_sync:>7.2f}x {'<= 1.0x':>10}"
        )
    print(f"{'pipeline, 20k specialized calls, 1 thread':<44} {calls_per_s / 1e3:>10.1f} k/s {'':>16} {'':>8} {'>= 100k/s':>10}")


if __name__ == "__main__":
    main()
