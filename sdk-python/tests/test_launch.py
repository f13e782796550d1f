"""``colocated.connect()`` without addresses: the workers a cluster manager
started, found where it says (``COLOCATED_WORKERS``, a Slurm job), waited for
while they start, and named when they do not answer. Real worker processes on
loopback addresses: a faked Slurm job whose nodes are 127.0.0.1-3, one worker
bound on each at the job's port (``--port auto``)."""

import socket
import threading

import numpy as np
import pytest
from workers import Worker, write_token

import colocated

NODES = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
CLUSTER_ENV = (
    "COLOCATED_WORKERS",
    "SLURM_JOB_ID",
    "SLURM_JOBID",
    "SLURM_JOB_NODELIST",
    "SLURM_NODELIST",
    "COLOCATED_KUBERNETES_SERVICE",
    "COLOCATED_KUBERNETES_REPLICAS",
)


@pytest.fixture
def no_cluster(monkeypatch):
    """An environment with no cluster of its own."""
    for name in CLUSTER_ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    write_token(path)
    return path


def free(host, port):
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sharded_roundtrip(client):
    devices = client.devices()
    mesh = colocated.Mesh(devices, ("x",))
    x = colocated.device_put(
        np.arange(2 * len(devices), dtype=np.int32), colocated.NamedSharding(mesh, colocated.P("x"))
    )
    return np.asarray(x)


def test_connect_finds_the_workers_of_a_slurm_job_at_the_jobs_port(no_cluster, token_file):
    job = next(j for j in range(4096) if all(free(node, 61440 + j) for node in NODES)) + 4096
    no_cluster.setenv("SLURM_JOB_ID", str(job))
    no_cluster.setenv("SLURM_JOB_NODELIST", "127.0.0.[1-3]")
    port = 61440 + job % 4096
    workers = [
        Worker(token_file, devices=2, listen=f"{node}:0", extra_args=("--shared-interpreter", "--port", "auto"))
        for node in NODES
    ]
    try:
        assert [w.address for w in workers] == [f"{node}:{port}" for node in NODES]
        client = colocated.connect(token_file=token_file, default=False, timeout=20)
        assert len(client.devices()) == 6
        assert [d.process_index for d in client.devices()] == [1, 1, 2, 2, 3, 3]
        np.testing.assert_array_equal(sharded_roundtrip(client), np.arange(12))
        client.close()
        # cluster="slurm" looks there only; another port can be given.
        with pytest.raises(colocated.UnavailableError, match=f"127.0.0.1:{port + 1 if port < 65535 else 1}"):
            colocated.connect(
                cluster="slurm", port=port + 1 if port < 65535 else 1, token_file=token_file, default=False, timeout=0.5
            )
    finally:
        for w in workers:
            w.stop()


def test_connect_waits_for_workers_that_are_still_starting(no_cluster, token_file):
    ports = [free_port(), free_port()]
    no_cluster.setenv("COLOCATED_WORKERS", ",".join(f"127.0.0.1:{p}" for p in ports))
    connected = {}

    def controller():
        try:
            connected["client"] = colocated.connect(token_file=token_file, default=False, timeout=60)
        except colocated.ColocatedError as e:  # reported by the assertion below
            connected["error"] = e

    thread = threading.Thread(target=controller)
    thread.start()
    # The controller is already waiting when the workers come up.
    workers = [Worker(token_file, devices=1, listen=f"127.0.0.1:{p}") for p in ports]
    try:
        thread.join(timeout=60)
        assert "error" not in connected, connected.get("error")
        client = connected["client"]
        assert len(client.devices()) == 2
        np.testing.assert_array_equal(sharded_roundtrip(client), np.arange(4))
        client.close()
    finally:
        for w in workers:
            w.stop()


def test_connect_names_every_worker_that_did_not_answer(no_cluster, token_file):
    worker = Worker(token_file, devices=1)
    missing = [f"127.0.0.1:{free_port()}", f"127.0.0.2:{free_port()}"]
    try:
        with pytest.raises(colocated.UnavailableError) as raised:
            colocated.connect([worker.address, *missing], token_file=token_file, default=False, timeout=0.5)
        message = str(raised.value)
        assert "2 of 3 workers" in message, message
        assert all(address in message for address in missing), message
        assert worker.address not in message, message
    finally:
        worker.stop()


def test_connect_without_workers_says_where_it_looked(no_cluster):
    with pytest.raises(colocated.NotFoundError) as raised:
        colocated.connect(default=False)
    message = str(raised.value)
    for place in ("COLOCATED_WORKERS", "SLURM_JOB_NODELIST", "COLOCATED_KUBERNETES_SERVICE"):
        assert place in message, message
    with pytest.raises(colocated.InvalidArgumentError, match="unknown cluster"):
        colocated.connect(cluster="mesos", default=False)
    no_cluster.setenv("COLOCATED_WORKERS", "127.0.0.1")
    with pytest.raises(colocated.InvalidArgumentError, match="not HOST:PORT"):
        colocated.connect(default=False)


def test_the_colocated_command_serves_and_reports(no_cluster, token_file):
    import os
    import subprocess
    import sys

    # The console command the package installs, beside this interpreter.
    command = os.path.join(os.path.dirname(sys.executable), "colocated")
    assert os.access(command, os.X_OK), command
    worker = Worker(token_file, devices=3)
    try:
        run = subprocess.run(
            [command, "status", worker.address, "--token-file", str(token_file)],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 0, run.stderr
        (line,) = run.stdout.splitlines()
        assert line.startswith(worker.address), line
        assert f"colocated {colocated.__version__}" in line and "3 cpu devices" in line, line
        assert "python" in line, line
        # A worker that does not answer: status 1, and its line says why.
        gone = f"127.0.0.1:{free_port()}"
        run = subprocess.run(
            check=False,
            args=[
                sys.executable,
                "-m",
                "colocated",
                "status",
                worker.address,
                gone,
                "--timeout",
                "0.5",
                "--token-file",
                str(token_file),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 1, run.stderr
        assert run.stdout.splitlines()[1].startswith(f"{gone}  unavailable"), run.stdout
        run = subprocess.run(check=False, args=[command, "status"], capture_output=True, text=True, timeout=60)
        assert run.returncode == 2 and "COLOCATED_WORKERS" in run.stderr, run.stderr
        run = subprocess.run(check=False, args=[command, "serve"], capture_output=True, text=True, timeout=60)
        assert run.returncode == 2 and "unknown command" in run.stderr, run.stderr
    finally:
        worker.stop()


def slurm_here():
    """Why a real Slurm job cannot run here (None when it can)."""
    import shutil
    import subprocess

    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return "Slurm is not installed (tests/slurm/setup.sh installs a single-node cluster)"
    states = subprocess.run(["sinfo", "-h", "-o", "%t %n"], capture_output=True, text=True, check=False)
    idle = [line.split()[1] for line in states.stdout.splitlines() if line.split()[0] == "idle"]
    if not idle:
        return f"no idle Slurm node: {states.stdout.strip() or states.stderr.strip()}"
    address = socket.gethostbyname(idle[0])
    if not address.startswith("127."):
        return f"the Slurm node {idle[0]} is {address}, not a loopback address"
    return None


def test_a_real_slurm_job_serves_one_worker_per_node_and_its_controller_finds_them(tmp_path, token_file):
    import subprocess
    import sys

    why = slurm_here()
    if why is not None:
        pytest.skip(why)
    out = tmp_path / "job.out"
    controller = tmp_path / "controller.py"
    controller.write_text(
        "import numpy as np, os, colocated\n"
        f"client = colocated.connect(token_file={str(token_file)!r}, timeout=60)\n"
        "(host,) = client.hosts()\n"
        "x = colocated.device_put(np.arange(4), client.devices()[0])\n"
        "print('job', os.environ['SLURM_JOB_ID'], 'host', host.name, 'sum', int(np.asarray(x).sum()), flush=True)\n"
        "client.close()\n"
    )
    # The README's recipe: a worker per node with `srun ... --port auto`, the
    # controller in the batch script. (Loopback only: --listen 127.0.0.1.)
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH --nodes=1 --ntasks-per-node=1 --output={out}\n"
        "set -eu\n"
        f"srun --overlap --ntasks-per-node=1 {sys.executable} -m colocated.worker --listen 127.0.0.1:0 "
        f"--port auto --cpu-devices 2 --token-file {token_file} --exit-after-idle 60 --shared-interpreter &\n"
        f"{sys.executable} {controller}\n"
        "kill %1\n"
    )
    run = subprocess.run(["sbatch", "--wait", str(script)], capture_output=True, text=True, timeout=180, check=False)
    log = out.read_text() if out.exists() else ""
    assert run.returncode == 0, f"{run.stdout}{run.stderr}{log}"
    (line,) = [line for line in log.splitlines() if line.startswith("job ")]
    _, job, _, host, _, total = line.split()
    assert host.endswith(f":{61440 + int(job) % 4096}"), line
    assert total == "6", line
