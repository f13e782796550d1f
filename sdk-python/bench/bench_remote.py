"""Remote hosts: a controller and one ``python -m colocated.worker`` process on
loopback, beside the baselines they are judged against, in one run.

Measures (medians of repeated runs):
- round trip of a colocated Python call (``x + 1`` on a scalar) on the worker:
  call + ``block_until_ready`` (one network round trip), and call + read of the
  value (one too: a small result travels with the call's answer), and
  ``device_put`` of a scalar + call + read (one: a small upload travels on
  the call's stream), against a raw TCP ping-pong of one byte between two processes,
  and against a Ray actor call (``ray.get(actor.add_one.remote(x))``) when Ray
  is installed;
- pipelined asynchronous calls to one worker: 20k calls of a specialized
  function from one thread, then one block; and 20k calls each on the
  previous one's output (a chain the worker runs without the controller
  waiting between calls);
- ``device_put`` of 256 MiB to the worker (later ones, and the first of a
  session's process, which writes into memory the process never touched:
  beside raw TCP into warm memory and raw TCP into fresh memory),
  ``np.asarray`` of a 256 MiB array on the worker (a download), and a copy of it to a second worker (``device_put`` to its device: worker
  to worker), each run beside a run of raw TCP to another process (send
  everything, wait for its one-byte acknowledgement; the receiver reads into
  warm memory of the whole size), reported as the median of the runs' ratios;
- a call over an array sharded across 8 workers (one CPU device each) +
  ``block_until_ready``, against a raw TCP fan-out: one byte to 8 echo
  processes and back, the two taking turns, 20 calls at a time.

Targets (issues 4 and 16): round trip <= 3x TCP (with a read of the value
<= 4x); >= 5x faster than Ray; >= 20k
pipelined calls/s; 256 MiB put >= 70% of raw TCP, download >= 90%, first put
>= 70%, worker to worker >= 70%; fan-out <= 2x the TCP fan-out. Run by
``make bench``.
"""

from __future__ import annotations

import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import colocated

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_colocated import TcpEchoes, _median_us, _tcp_ping_pong_us

BULK_BYTES = 256 << 20


def _start_worker(token_file: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "colocated.worker", "--cpu-devices", "1", "--token-file", token_file],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        raise SystemExit(f"the worker did not start: {line!r}")
    return proc, line.split()[-1]


FAN_OUT = 8


def _paired(tcp_send, measure, runs: int = 5) -> tuple[float, float, float]:
    """Bytes/s of ``measure`` and of raw TCP (``tcp_send``), in turns, so that
    both see the machine in the same state: their medians and the median of
    the runs' ratios."""
    ours_, tcps, ratios = [], [], []
    for _ in range(runs):
        tcp = tcp_send()
        rate = measure()
        ours_.append(rate)
        tcps.append(tcp)
        ratios.append(rate / tcp)
    return statistics.median(ours_), statistics.median(tcps), statistics.median(ratios)


def ours(addresses: list[str], token_file: str, tcp_send) -> dict[str, float]:
    client = colocated.connect(addresses[:2], token_file=token_file)
    device, other = client.devices()[:2]
    x = colocated.device_put(np.int32(1), device)

    @colocated.colocated_python
    def add_one(x):
        return x + 1

    colocated.block_until_ready(add_one(x))
    figures = {
        "call_block_us": _median_us(lambda: colocated.block_until_ready(add_one(x)), n=1000),
        "call_read_us": _median_us(lambda: np.asarray(add_one(x)), n=1000),
        "put_call_read_us": _median_us(
            lambda: np.asarray(add_one(colocated.device_put(np.int32(1), device))), n=1000
        ),
    }

    pipelined = add_one.specialize(out_specs_fn=lambda x: x)
    colocated.block_until_ready(pipelined(x))

    def calls_per_s(call) -> float:
        """20k calls, each ``y = call(y)`` from ``x``, then one block."""
        n = 20_000
        start = time.perf_counter()
        y = x
        for _ in range(n):
            y = call(y)
        colocated.block_until_ready(y)
        return n / (time.perf_counter() - start)

    figures["pipelined_per_s"] = statistics.median(calls_per_s(lambda _: pipelined(x)) for _ in range(3))
    figures["chained_per_s"] = statistics.median(calls_per_s(pipelined) for _ in range(3))

    data = np.random.default_rng(0).integers(0, 255, BULK_BYTES, dtype=np.uint8)

    def put() -> float:
        start = time.perf_counter()
        colocated.block_until_ready(colocated.device_put(data, device))
        return BULK_BYTES / (time.perf_counter() - start)

    put()  # the first put of the session's process: measured by first_puts
    figures["put"] = _paired(tcp_send, put)

    on_worker = colocated.device_put(data, device)
    colocated.block_until_ready(on_worker)

    def read() -> float:
        start = time.perf_counter()
        back = np.asarray(on_worker)
        elapsed = time.perf_counter() - start
        assert back[-1] == data[-1]
        return BULK_BYTES / elapsed

    read()
    figures["read"] = _paired(tcp_send, read)

    def copy() -> float:
        start = time.perf_counter()
        colocated.block_until_ready(colocated.device_put(on_worker, other))
        return BULK_BYTES / (time.perf_counter() - start)

    copy()
    figures["copy"] = _paired(tcp_send, copy)
    client.close()
    return figures


def first_puts(address: str, token_file: str, tcp_warm, tcp_fresh, runs: int = 3) -> dict[str, tuple]:
    """``device_put`` of 256 MiB into a session that has never held that much:
    each run connects anew, and the worker runs each session in a process of
    its own, so the bytes land in memory the process touches for the first
    time. Paired with raw TCP into warm memory and raw TCP into fresh memory
    (the receiver maps new memory for each transfer): the kernel zeroes each
    page of fresh memory on first touch, the same work the worker must do."""
    data = np.random.default_rng(1).integers(0, 255, BULK_BYTES, dtype=np.uint8)
    rates, warm, fresh = [], [], []
    for _ in range(runs):
        client = colocated.connect([address], token_file=token_file)
        device = client.devices()[0]
        colocated.block_until_ready(colocated.device_put(np.int32(0), device))
        warm.append(tcp_warm())
        fresh.append(tcp_fresh())
        start = time.perf_counter()
        colocated.block_until_ready(colocated.device_put(data, device))
        rates.append(BULK_BYTES / (time.perf_counter() - start))
        client.close()
    rate = statistics.median(rates)
    return {
        "first_put": (rate, statistics.median(warm), statistics.median(r / t for r, t in zip(rates, warm))),
        "first_put_fresh": (rate, statistics.median(fresh), statistics.median(r / t for r, t in zip(rates, fresh))),
    }


def fan_out_us(addresses: list[str], token_file: str, rounds: int = 20, calls: int = 20) -> tuple[float, float]:
    """Median call + block of ``x + 1`` over an array sharded across every
    worker of ``addresses``, and the median raw TCP fan-out to as many echo
    processes, measured in turns (``calls`` of each per round) so that both
    see the same drift of the machine's load."""
    client = colocated.connect(addresses, token_file=token_file)
    devices = client.devices()
    mesh = colocated.Mesh(devices, ["x"])
    x = colocated.device_put(np.arange(len(devices), dtype=np.int32), colocated.NamedSharding(mesh, colocated.P("x")))

    @colocated.colocated_python
    def add_one(x):
        return x + 1

    colocated.block_until_ready(add_one(x))
    ours_, tcps = [], []
    with TcpEchoes(len(devices)) as echoes:
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(calls):
                colocated.block_until_ready(add_one(x))
            ours_.append((time.perf_counter() - start) / calls * 1e6)
            start = time.perf_counter()
            for _ in range(calls):
                echoes.ping()
            tcps.append((time.perf_counter() - start) / calls * 1e6)
    client.close()
    return statistics.median(ours_), statistics.median(tcps)


class TcpThroughput:
    """Raw TCP to another process: ``send()`` sends 256 MiB over loopback,
    which the receiver reads (in reads of 128 KiB: on loopback, faster than
    larger ones) and acknowledges with one byte; returns bytes/s. The receiver
    reads into warm memory of the whole size, or with ``fresh`` into memory it
    maps anew for each transfer (and unmaps after it)."""

    _SINK = (
        "import mmap,socket,sys\n"
        "fresh=sys.argv[1]=='fresh'\n"
        "s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(1)\n"
        "print(s.getsockname()[1], flush=True)\n"
        "c,_=s.accept()\n"
        f"n={BULK_BYTES}\n"
        "warm=memoryview(bytearray(n))\n"
        "while True:\n"
        "    m=mmap.mmap(-1,n) if fresh else None\n"
        "    buf=memoryview(m) if fresh else warm\n"
        "    got=0\n"
        "    while got<n:\n"
        "        k=c.recv_into(buf[got:min(n, got+(128<<10))])\n"
        "        if not k: sys.exit(0)\n"
        "        got+=k\n"
        "    c.sendall(b'k')\n"
        "    if fresh: buf.release(); m.close()\n"
    )

    def __init__(self, fresh: bool = False):
        self._fresh = fresh

    def __enter__(self):
        self._proc = subprocess.Popen(
            [sys.executable, "-c", self._SINK, "fresh" if self._fresh else "warm"], stdout=subprocess.PIPE, text=True
        )
        port = int(self._proc.stdout.readline())
        self._sock = socket.create_connection(("127.0.0.1", port))
        self._payload = memoryview(np.random.default_rng(0).integers(0, 255, BULK_BYTES, dtype=np.uint8))
        self.send()
        return self

    def send(self) -> float:
        start = time.perf_counter()
        self._sock.sendall(self._payload)
        self._sock.recv(1)
        return BULK_BYTES / (time.perf_counter() - start)

    def __exit__(self, *exc):
        self._sock.close()
        self._proc.kill()
        self._proc.wait()


def ray_actor_call_us() -> float | None:
    """Median ``ray.get(actor.add_one.remote(1))`` on a local Ray, or None
    without Ray."""
    # Loopback only, and no usage report: Ray otherwise binds this machine's
    # interface address (and turns 127.0.0.1 into it) and reports usage.
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    try:
        import ray
    except ImportError:
        return None
    ray.init(
        num_cpus=1,
        include_dashboard=False,
        logging_level="ERROR",
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
    )
    try:

        @ray.remote
        class Adder:
            def add_one(self, x):
                return x + 1

        actor = Adder.remote()
        ray.get(actor.add_one.remote(1))
        return _median_us(lambda: ray.get(actor.add_one.remote(1)), n=500, repeats=3)
    finally:
        ray.shutdown()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        token_file = os.path.join(tmp, "token")
        with open(token_file, "w") as f:
            f.write(secrets.token_hex(32))
        workers = [_start_worker(token_file) for _ in range(FAN_OUT)]
        addresses = [address for _, address in workers]
        try:
            with TcpThroughput() as tcp_bulk, TcpThroughput(fresh=True) as tcp_fresh:
                figures = ours(addresses, token_file, tcp_bulk.send)
                figures.update(first_puts(addresses[2], token_file, tcp_bulk.send, tcp_fresh.send))
            fan_out, tcp_fan = fan_out_us(addresses, token_file)
        finally:
            for proc, _ in workers:
                proc.terminate()
            for proc, _ in workers:
                proc.wait()
    tcp = _tcp_ping_pong_us()
    ray_us = ray_actor_call_us()

    print(f"== remote: Python worker processes on loopback (1 CPU device each; {FAN_OUT} for the fan-out) ==")
    print(f"{'measure':<40} {'figure':>14} {'baseline':>18} {'ratio':>8} {'target':>12}")
    for name, key, target in (
        ("call + block_until_ready, x + 1", "call_block_us", "<= 3.0x TCP"),
        ("call + read of the value", "call_read_us", "<= 4.0x TCP"),
        ("device_put + call + read", "put_call_read_us", "-"),
    ):
        us = figures[key]
        print(f"{name:<40} {us:>11.1f} µs {tcp:>11.1f} µs TCP {us / tcp:>7.2f}x {target:>12}")
        if key == "put_call_read_us":
            continue  # Ray's call is the baseline of a call alone
        if ray_us is None:
            print(f"{'':<40} {'':>14} {'(ray missing)':>18} {'-':>8} {'>= 5x Ray':>12}")
        else:
            print(f"{'':<40} {'':>14} {ray_us:>11.1f} µs Ray {ray_us / us:>6.1f}x {'>= 5x Ray':>12}")
    for name, key in (
        ("pipelined calls, 1 thread, 20k", "pipelined_per_s"),
        ("  each on the last one's output", "chained_per_s"),
    ):
        per_s = figures[key]
        print(f"{name:<40} {per_s / 1e3:>10.1f} k/s {'':>18} {'':>8} {'>= 20k/s':>12}")
    for name, key, target in (
        ("device_put 256 MiB to the worker", "put", ">= 70%"),
        ("  the first of a session's process", "first_put", ">= 70%"),
        ("    against TCP into fresh memory", "first_put_fresh", ">= 70%"),
        ("np.asarray of 256 MiB on the worker", "read", ">= 90%"),
        ("256 MiB from worker to worker", "copy", ">= 70%"),
    ):
        rate, tcp_rate, ratio = figures[key]
        print(f"{name:<40} {rate / 1e9:>9.2f} GB/s {tcp_rate / 1e9:>10.2f} GB/s TCP {ratio:>6.0%} {target:>12}")
    print(
        f"{f'call + block over {FAN_OUT} workers':<40} {fan_out:>11.1f} µs {tcp_fan:>7.1f} µs TCP fan {fan_out / tcp_fan:>5.2f}x "
        f"{'<= 2.0x':>12}"
    )


if __name__ == "__main__":
    main()
