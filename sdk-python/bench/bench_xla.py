"""XLA programs through colocated beside ``jax.jit`` of the same function, in one run.

JAX lowers each function (``jax.jit(f).lower(...).as_text()``); colocated
compiles that module on XLA's CPU plugin (``lammps-jax-pjrt-cpu``) and runs it
on an Array of the plugin's device. Measures the median of
``block_until_ready(f(x))`` for ``x + 1`` on f32[8] and a 1024x1024 f32
matmul, both ways, taking turns.

The same functions through ``colocated.jit`` beside ``jax.jit`` (goal
<= 1.1x, issue 35). Also a 256 MiB ``jax.Array`` into colocated and back out (``from_jax``,
``to_jax``) beside a ``memcpy`` of the same bytes (``np.copyto``): the goal
is no copy, microseconds.

Also the small step through ``colocated.jit`` on a worker with the plugin,
beside a TCP ping-pong (goal: at most 3x it on top of the step's time).

Goal (issue 34): the small program below ``jax.jit``'s time. Run by
``make bench`` (which installs jax[cpu] and the CPU plugin into the benchmark
venv).

``COLOCATED_BENCH_PJRT_PLUGIN`` (a plugin's path) and
``COLOCATED_BENCH_PJRT_OPTIONS`` (``name=value,...``) run the same rows on
another plugin, JAX on its own client of that platform (``tests/gpu/run.sh``
does so on a GPU); the 256 MiB row stays on the CPU.
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np

import colocated


def _in_turns(fns, n: int, rounds: int = 7) -> list[tuple[float, float, float]]:
    """Per function: the median, lowest and highest of ``rounds`` mean times
    (µs) of ``n`` calls, the functions taking turns round by round so that a
    noisy machine's drift weighs on each alike."""
    runs = [[] for _ in fns]
    for _ in range(rounds):
        for fn, times in zip(fns, runs, strict=True):
            start = time.perf_counter()
            for _ in range(n):
                fn()
            times.append((time.perf_counter() - start) / n * 1e6)
    return [(statistics.median(t), min(t), max(t)) for t in runs]


def main() -> None:
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        print("bench_xla skipped: jax is not installed")
        return
    plugin, options = _plugin()
    colocated.configure(num_cpu_devices=1, pjrt_plugin=plugin, pjrt_options=options)
    device = colocated.devices()[0]
    cases = [
        ("x + 1, f32[8]", lambda x: x + 1, [np.arange(8, dtype=np.float32)], 5000),
        (
            "matmul 1024x1024 f32",
            lambda a, b: a @ b,
            [np.ones((1024, 1024), np.float32), np.ones((1024, 1024), np.float32)],
            20,
        ),
    ]
    jax_device = jax.devices(device.platform)[0]
    print(f"jax {jax.__version__} on {jax_device.platform}; colocated on {device.platform} ({device.backend})")
    for name, fn, args, n in cases:
        jitted = jax.jit(fn)
        jax_args = [jax.device_put(jnp.asarray(a), jax_device) for a in args]
        jitted(*jax_args).block_until_ready()
        module = jitted.lower(*jax_args).as_text()
        exe = colocated.compile_stablehlo(module, [device])
        ours_args = [colocated.device_put(a, device) for a in args]
        colocated.block_until_ready(exe(*ours_args))
        jitted_call = lambda jitted=jitted, a=jax_args: jitted(*a).block_until_ready()
        _compare(name, lambda exe=exe, a=ours_args: exe(*a).block_until_ready(), "jax.jit", jitted_call, n)
        # The same function through colocated.jit (tracing and the cache
        # lookup per call included).
        ours_jit = colocated.jit(fn)
        colocated.block_until_ready(ours_jit(*ours_args))
        _compare(
            "colocated.jit " + name, lambda f=ours_jit, a=ours_args: f(*a).block_until_ready(), "jax.jit", jitted_call, n
        )
    _jax_round_trip(jax, jax.devices("cpu")[0])
    if device.platform != "cpu":
        _jax_round_trip(jax, jax_device)
    _worker_step(cases[0][1], cases[0][2], local_us=_last_jit_us)


def _plugin() -> tuple[str, dict]:
    """The plugin under test and its create options: XLA's CPU plugin with one
    device, or the ones the environment names."""
    path = os.environ.get("COLOCATED_BENCH_PJRT_PLUGIN")
    if not path:
        return "cpu", {"cpu_device_count": 1}
    options = {}
    for item in filter(None, os.environ.get("COLOCATED_BENCH_PJRT_OPTIONS", "").split(",")):
        name, _, value = item.partition("=")
        options[name] = {"true": True, "false": False}.get(value, int(value) if value.isdigit() else value)
    return path, options


#: The median of the first ``colocated.jit`` row (the small step run here),
#: which the worker's row subtracts.
_last_jit_us: list[float] = []


def _compare(name: str, ours_fn, baseline: str, theirs_fn, n: int, digits: int = 2) -> tuple:
    """Times ``ours_fn`` and ``theirs_fn`` in turns and prints them side by side."""
    ours, theirs = _in_turns([ours_fn, theirs_fn], n)
    if name.startswith("colocated.jit") and not _last_jit_us:
        _last_jit_us.append(ours[0])
    print(
        f"{name:<24} colocated {ours[0]:>9.1f} us [{ours[1]:.1f}-{ours[2]:.1f}]"
        f"   {baseline} {theirs[0]:>9.1f} us [{theirs[1]:.1f}-{theirs[2]:.1f}]"
        f"   ratio {ours[0] / theirs[0]:.{digits}f}x"
    )
    return ours, theirs


def _worker_step(fn, args, local_us: list[float]) -> None:
    """The small step through ``colocated.jit`` on a worker's plugin device
    (a ``colocated.worker`` on loopback with XLA's CPU plugin), beside a
    1-byte TCP ping-pong between two processes, in turns: the goal is at
    most 3x the ping-pong on top of the step's time here."""
    import os
    import secrets
    import subprocess
    import sys
    import tempfile

    from bench_colocated import TcpEchoes

    with tempfile.TemporaryDirectory() as tmp:
        token_file = os.path.join(tmp, "token")
        with open(token_file, "w") as f:
            f.write(secrets.token_hex(32))
        plugin, options = _plugin()
        args_ = ["--cpu-devices", "1", "--pjrt-plugin", plugin]
        for name, value in options.items():
            args_ += ["--pjrt-option", f"{name}={str(value).lower() if isinstance(value, bool) else value}"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "colocated.worker", *args_, "--token-file", token_file],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            line = proc.stdout.readline()
            if not line.startswith("listening on "):
                raise SystemExit(f"the worker did not start: {line!r}")
            client = colocated.connect([line.split()[-1]], token_file=token_file, default=False)
            device = client.devices()[0]
            step = colocated.jit(fn)
            on_worker = [colocated.device_put(a, device) for a in args]
            colocated.block_until_ready(step(*on_worker))
            with TcpEchoes(1) as echoes:
                ours, tcp = _compare(
                    "colocated.jit step on a worker",
                    lambda: step(*on_worker).block_until_ready(),
                    "TCP ping-pong",
                    echoes.ping,
                    500,
                )
            if local_us:
                extra = (ours[0] - local_us[0]) / tcp[0]
                print(f"{'':<24} on top of the step's {local_us[0]:.1f} us here: {extra:.2f}x the ping-pong (goal <= 3x)")
            client.close()
        finally:
            proc.terminate()
            proc.wait()


def _jax_round_trip(jax, jax_device) -> None:
    """A 256 MiB ``jax.Array`` of ``jax_device`` (JAX's CPU device, or a GPU
    that the runtime's plugin also drives) through ``from_jax`` and
    ``to_jax``, beside a copy of the same bytes on that device
    (``np.copyto`` into warm memory; on a GPU, ``jnp.copy``)."""
    value = np.arange(64 << 20, dtype=np.float32)
    x = jax.device_put(value, jax_device)
    x.block_until_ready()
    target = np.empty_like(value)
    if jax_device.platform != "cpu":

        def copy() -> None:
            jax.numpy.copy(x).block_until_ready()

    else:

        def copy() -> None:
            np.copyto(target, value)

    def round_trip() -> None:
        back = colocated.to_jax(colocated.from_jax(x))
        if back.unsafe_buffer_pointer() != x.unsafe_buffer_pointer():
            raise AssertionError("the round trip copied the data")

    on_cpu = jax_device.platform == "cpu"
    name = "256 MiB jax -> colocated -> jax" + ("" if on_cpu else f" ({jax_device.platform})")
    _compare(name, round_trip, "memcpy" if on_cpu else "jnp.copy", copy, 3, digits=4)


if __name__ == "__main__":
    main()
