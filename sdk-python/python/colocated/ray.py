"""Workers on a Ray cluster, for users who already run one.

``start_workers(n)`` reserves ``n`` nodes with a ``STRICT_SPREAD`` placement
group (one bundle per node), starts one actor in each bundle, and each actor
starts a worker process (``python -m colocated.worker``) on its node and reports
its address; the function returns a client connected to them. The workers die
with their actors: ``stop_workers(client)``, ``ray.kill`` of an actor, the end of
the Ray job, or the death of an actor's process (Ray stops the processes an
actor started; a worker orphaned anyway exits once it has had no session for
ten minutes).

Needs ``ray`` (the ``colocated[ray]`` extra). The token is made here, travels to
the actors through Ray, and is written on each node to a file only its user can
read.
"""

from __future__ import annotations

import secrets
import threading

from . import _client
from ._errors import InvalidArgumentError, UnavailableError

# Placement groups and actors behind each client made here, by client id.
_STARTED: dict[int, tuple[object, list]] = {}
_LOCK = threading.Lock()


def _worker_actor_class(ray):
    """The actor that owns one worker process on its node (defined lazily:
    ``ray`` is imported only when used)."""

    @ray.remote
    class ColocatedWorker:
        """Starts ``python -m colocated.worker`` on this node and keeps it
        until the actor goes."""

        def __init__(self, token: str, args: list[str], listen_host: str | None):
            import os
            import select
            import subprocess
            import sys
            import tempfile

            self._dir = tempfile.mkdtemp(prefix="colocated-ray-")
            token_file = os.path.join(self._dir, "token")
            fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(token)
            host = listen_host or ray.util.get_node_ip_address()
            command = [sys.executable, "-m", "colocated.worker", "--listen", f"{host}:0"]
            command += ["--token-file", token_file, *args]

            self._proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                text=True,
            )
            ready, _, _ = select.select([self._proc.stdout], [], [], 120)
            line = self._proc.stdout.readline() if ready else ""
            if not line.startswith("listening on "):
                self._proc.kill()
                raise RuntimeError(f"the colocated worker on {host} did not start: {line!r}")
            self._address = line.split()[-1]

        def address(self) -> str:
            return self._address

        def pid(self) -> int:
            return self._proc.pid

        def node_id(self) -> str:
            return ray.get_runtime_context().get_node_id()

        def stop(self) -> None:
            import shutil

            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=10)
                except Exception:  # noqa: BLE001 - it is killed below either way
                    self._proc.kill()
            shutil.rmtree(self._dir, ignore_errors=True)

    return ColocatedWorker


def start_workers(
    n: int,
    *,
    cpu_devices: int | None = None,
    resources: dict[str, float] | None = None,
    num_cpus: float = 1,
    token: str | None = None,
    timeout: float = 120.0,
    listen_host: str | None = None,
    worker_args: tuple[str, ...] = (),
    include_local: bool = False,
    default: bool = True,
):
    """Starts ``n`` colocated workers on ``n`` distinct nodes of the Ray cluster
    this process is connected to (``ray.init`` first) and returns a client of
    them (the default client unless ``default=False``).

    ``cpu_devices``: CPU devices of each worker (default: its node's cores).
    ``resources`` and ``num_cpus``: what each worker's bundle reserves on its node
    (``{"GPU": 1}``, a custom resource). ``token``: the workers' token (default: a
    fresh random one). ``timeout``: seconds to wait for the nodes, the workers
    and the connection. ``listen_host``: the address workers listen on (default:
    their node's IP address as Ray knows it). ``worker_args``: more flags for
    ``python -m colocated.worker``.

    Raises ``UnavailableError`` when the cluster cannot give ``n`` distinct nodes
    with those resources within ``timeout``, or a worker does not start.
    """
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidArgumentError(f"n must be a positive number of workers, got {n!r}")
    if not ray.is_initialized():
        raise InvalidArgumentError("start_workers needs a Ray cluster: call ray.init() first")
    bundle = {"CPU": float(num_cpus), **{k: float(v) for k, v in (resources or {}).items()}}
    group = placement_group([dict(bundle) for _ in range(n)], strategy="STRICT_SPREAD")
    try:
        ray.get(group.ready(), timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        raise UnavailableError(
            f"the Ray cluster has no {n} distinct nodes with {bundle} free within {timeout} s (STRICT_SPREAD)"
        ) from None
    token = token or secrets.token_hex(32)
    args = list(worker_args)
    if cpu_devices is not None:
        args += ["--cpu-devices", str(int(cpu_devices))]
    # A worker orphaned despite everything goes away by itself.
    if "--exit-after-idle" not in args:
        args += ["--exit-after-idle", "600"]
    actor = _worker_actor_class(ray)
    actors = [
        actor.options(
            num_cpus=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=i),
        ).remote(token, args, listen_host)
        for i in range(n)
    ]
    try:
        addresses = ray.get([a.address.remote() for a in actors], timeout=timeout)
        client = _client.connect(addresses, token=token, include_local=include_local, default=default, timeout=timeout)
    except Exception as e:
        for a in actors:
            ray.kill(a)
        remove_placement_group(group)
        if isinstance(e, ray.exceptions.RayError):
            raise UnavailableError(f"colocated workers did not start on Ray: {e}") from e
        raise
    with _LOCK:
        _STARTED[client.id] = (group, actors)
    return client


def workers_of(client) -> list:
    """The Ray actors that own ``client``'s workers (in host order), if
    ``start_workers`` made it; ``[]`` otherwise."""
    with _LOCK:
        return list(_STARTED.get(client.id, (None, []))[1])


def stop_workers(client) -> None:
    """Closes ``client`` and stops the workers ``start_workers`` started for it:
    their actors and placement group go (nothing happens for another client)."""
    import ray
    from ray.util.placement_group import remove_placement_group

    with _LOCK:
        started = _STARTED.pop(client.id, None)
    client.close()
    if started is None:
        return
    group, actors = started
    for a in actors:
        try:
            ray.get(a.stop.remote(), timeout=60)
        except ray.exceptions.RayActorError:
            pass  # gone already, and its worker with it
        ray.kill(a)
    remove_placement_group(group)
