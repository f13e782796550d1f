"""JAX on a cluster from one controller: an MLP trained on two worker hosts.

Two `python -m colocated.worker` processes serve XLA's CPU PJRT plugin (the
PyPI package ``lammps-jax-pjrt-cpu``; ``--pjrt-plugin cuda`` on GPU hosts runs
the same code). A colocated Python data loader makes each host's half of
every batch on that host. ``colocated.jit(..., per_host=True)`` runs the
gradient step on each host's plugin device, and the update averages the hosts'
gradients there. The controller only sends programs and reads the loss.
The loss is checked against plain ``jax.jit`` in this process on the same
full batches. Run by ``make demo``.
"""

import os
import secrets
import signal
import subprocess
import sys
import tempfile

import colocated
import jax
import jax.numpy as jnp
import numpy as np

BATCH, FEATURES, HIDDEN, STEPS, LR = 64, 8, 16, 5, 0.1


def start_worker(token_file: str) -> subprocess.Popen:
    args = ["--cpu-devices", "1", "--pjrt-plugin", "cpu", "--pjrt-option", "cpu_device_count=1"]
    worker = subprocess.Popen(
        [sys.executable, "-m", "colocated.worker", *args, "--token-file", token_file], stdout=subprocess.PIPE, text=True
    )
    line = worker.stdout.readline().strip()
    if not line.startswith("listening on "):
        worker.kill()
        raise SystemExit(f"a worker did not start: {line!r}")
    worker.address = line.removeprefix("listening on ")
    return worker


def make_batch(step: int, host: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """One host's part of batch ``step``: a noisy nonlinear regression."""
    rng = np.random.default_rng([step, host])
    x = rng.normal(size=(rows, FEATURES)).astype(np.float32)
    y = np.sin(x.sum(axis=1, keepdims=True)).astype(np.float32)
    return x, y


def loss_fn(params, x, y):
    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((hidden @ params["w2"] + params["b2"] - y) ** 2)


def init_params() -> dict:
    rng = np.random.default_rng(0)
    return {
        "w1": (rng.normal(size=(FEATURES, HIDDEN)) / np.sqrt(FEATURES)).astype(np.float32),
        "b1": np.zeros(HIDDEN, np.float32),
        "w2": (rng.normal(size=(HIDDEN, 1)) / np.sqrt(HIDDEN)).astype(np.float32),
        "b2": np.zeros(1, np.float32),
    }


def train_on_cluster(client) -> list[float]:
    devices = client.devices()  # the plugin's devices, one per worker host
    mesh = colocated.Mesh(devices, ("hosts",))
    split = colocated.NamedSharding(mesh, colocated.P("hosts"))
    replicated = colocated.NamedSharding(mesh, colocated.P())
    print(f"  mesh {dict(mesh.shape)} over {[f'{d.backend}:{d.id} on host {d.process_index}' for d in devices]}")

    # The data loader runs on each host's CPU device, beside its plugin device.
    cpus = colocated.Mesh(client.colocated_cpu_devices(devices), ("hosts",))
    rows = BATCH // len(devices)

    @colocated.colocated_python
    def load(which):
        (step, host), = np.asarray(which)
        x, y = make_batch(int(step), int(host), rows)
        return colocated.device_put(x, which.sharding), colocated.device_put(y, which.sharding)

    load = load.specialize(
        out_specs_fn=lambda which: (
            colocated.ShapeDtypeStruct((BATCH, FEATURES), np.float32, sharding=colocated.NamedSharding(cpus, colocated.P("hosts"))),
            colocated.ShapeDtypeStruct((BATCH, 1), np.float32, sharding=colocated.NamedSharding(cpus, colocated.P("hosts"))),
        )
    )

    def host_grads(params, x, y):
        # Each host's loss and gradients on its half of the batch, with a
        # leading axis: the hosts' parts side by side.
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return loss[None], jax.tree.map(lambda g: g[None], grads)

    def apply(params, grads):
        # Every host averages all hosts' gradients: the same update everywhere.
        return jax.tree.map(lambda p, g: p - LR * g.mean(axis=0), params, grads)

    grads_step = colocated.jit(host_grads, per_host=True)
    update = colocated.jit(apply, per_host=True, out_shardings=replicated)

    params = {k: colocated.device_put(v, replicated) for k, v in init_params().items()}
    losses = []
    for step in range(STEPS):
        which = np.array([[step, h] for h in range(len(devices))], dtype=np.int32)
        x, y = load(colocated.device_put(which, colocated.NamedSharding(cpus, colocated.P("hosts"))))
        # Each host's batch moves from its CPU device to its plugin device there.
        x, y = colocated.device_put(x, split), colocated.device_put(y, split)
        loss, grads = grads_step(params, x, y)
        # All hosts' gradients on every host (the runtime's transfers), then
        # the update on each.
        params = update(params, {k: colocated.device_put(g, replicated) for k, g in grads.items()})
        losses.append(float(np.mean(np.asarray(loss))))
        print(f"  step {step}: loss {losses[-1]:.6f} (per host {np.asarray(loss)})")
    return losses


def train_with_jax_jit(hosts: int) -> list[float]:
    @jax.jit
    def step(params, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return loss, jax.tree.map(lambda p, g: p - LR * g, params, grads)

    params = {k: jnp.asarray(v) for k, v in init_params().items()}
    losses = []
    for i in range(STEPS):
        parts = [make_batch(i, h, BATCH // hosts) for h in range(hosts)]
        x = np.concatenate([p[0] for p in parts])
        y = np.concatenate([p[1] for p in parts])
        loss, params = step(params, x, y)
        losses.append(float(loss))
    return losses


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        token_file = os.path.join(tmp, "token")
        with open(token_file, "w") as f:
            f.write(secrets.token_hex(32))
        os.chmod(token_file, 0o600)
        workers = [start_worker(token_file) for _ in range(2)]
        try:
            client = colocated.connect([w.address for w in workers], token_file=token_file)
            print("== an MLP trained with colocated.jit on two worker hosts")
            ours = train_on_cluster(client)
            client.close()
        finally:
            for w in workers:
                w.send_signal(signal.SIGTERM)
            for w in workers:
                w.wait(timeout=30)
    print("== the same steps with jax.jit in this process")
    theirs = train_with_jax_jit(len(workers))
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        print(f"  step {i}: loss {b:.6f} (colocated {a:.6f})")
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    assert ours[-1] < ours[0], "the loss did not go down"
    print("== the losses agree to float tolerance, and go down")


if __name__ == "__main__":
    main()
