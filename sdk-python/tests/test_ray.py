"""``colocated.ray.start_workers`` on a real local Ray cluster of three nodes
(``ray.cluster_utils.Cluster``, every node on 127.0.0.1): one worker per node
through a STRICT_SPREAD placement group, a connected client, and workers that
die with their actors."""

import os
import time

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
# Every node on loopback: Ray otherwise turns 127.0.0.1 into this machine's
# interface address when the driver connects.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import numpy as np
import pytest
import ray
from ray.cluster_utils import Cluster

import colocated
import colocated.ray


@pytest.fixture(scope="module")
def three_nodes():
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False},
    )
    for _ in range(2):
        cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    port = cluster.address.rsplit(":", 1)[1]
    ray.init(address=f"127.0.0.1:{port}", _node_ip_address="127.0.0.1", log_to_driver=False)
    cluster.wait_for_nodes()
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) is not alive either.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def eventually(what, predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.1)


def test_one_worker_per_node_and_a_client_of_them(three_nodes):
    client = colocated.ray.start_workers(3, cpu_devices=2, default=False, timeout=120)
    try:
        actors = colocated.ray.workers_of(client)
        assert len(actors) == 3
        nodes = ray.get([a.node_id.remote() for a in actors])
        assert len(set(nodes)) == 3, nodes  # STRICT_SPREAD: a node each
        assert [h.is_remote for h in client.hosts()] == [True] * 3
        assert len(client.devices()) == 6
        mesh = colocated.Mesh(client.devices(), ("x",))
        x = colocated.device_put(np.arange(12, dtype=np.int32), colocated.NamedSharding(mesh, colocated.P("x")))

        @colocated.colocated_python
        def pid_of(x):
            import os

            import numpy as np

            return colocated.device_put(np.full(np.shape(x), os.getpid(), dtype=np.int32), x.sharding)

        # Each host runs the function in its own worker process (one per
        # session, under the actor's worker).
        pids = np.asarray(pid_of(x))
        assert len(set(pids[::4].tolist())) == 3, pids
        np.testing.assert_array_equal(np.asarray(x), np.arange(12))
    finally:
        worker_pids = ray.get([a.pid.remote() for a in colocated.ray.workers_of(client)])
        colocated.ray.stop_workers(client)
    eventually("the workers exit with their actors", lambda: not any(alive(p) for p in worker_pids))
    assert colocated.ray.workers_of(client) == []


def test_a_killed_actor_takes_its_worker_with_it(three_nodes):
    client = colocated.ray.start_workers(1, cpu_devices=1, default=False, timeout=120)
    (actor,) = colocated.ray.workers_of(client)
    pid = ray.get(actor.pid.remote())
    assert alive(pid)
    ray.kill(actor)
    eventually("the worker exits with its actor", lambda: not alive(pid))
    colocated.ray.stop_workers(client)


def test_more_workers_than_nodes_is_refused_in_time(three_nodes):
    with pytest.raises(colocated.UnavailableError, match="STRICT_SPREAD"):
        colocated.ray.start_workers(4, default=False, timeout=3)
    with pytest.raises(colocated.InvalidArgumentError):
        colocated.ray.start_workers(0)
    # The refused group was released: three workers still fit.
    client = colocated.ray.start_workers(3, cpu_devices=1, default=False, timeout=120)
    assert len(client.devices()) == 3
    colocated.ray.stop_workers(client)
