"""One trace for the whole job: the cluster demo (a controller and two
``python -m colocated.worker`` processes) run with ``COLOCATED_TRACE`` exported,
so that the workers inherit it as from one shell, writes one valid trace: the
controller's, with one process per worker named by its address and holding
that worker's executions. The workers write nothing there; a worker writes a
trace of its own only when told to (``--trace FILE``). Real processes and
sockets on loopback; the trace's subscriber is per process, so the traced
controller runs in a process of its own."""

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
from workers import Worker

import colocated
from colocated import _client

DEMO = Path(__file__).resolve().parents[2] / "examples" / "cluster_demo.py"


def test_a_traced_cluster_demo_writes_one_trace_with_every_hosts_executions(tmp_path):
    trace = tmp_path / "trace.json"
    env = {k: v for k, v in os.environ.items() if k not in ("COLOCATED_LOG", "COLOCATED_NUM_CPU_DEVICES")}
    env["COLOCATED_TRACE"] = str(trace)
    run = subprocess.run(
        [sys.executable, str(DEMO)], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 0, run.stdout + run.stderr
    addresses = re.findall(r"listening on (\S+)", run.stdout)
    assert len(addresses) == 2, run.stdout

    events = json.loads(trace.read_text())  # valid JSON, written by one process
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert not [n for n in names.values() if n.startswith("worker") or n == "host 0"], names
    executions = Counter(names.get(e["pid"]) for e in events if e["ph"] == "X" and e["name"] == "execute")
    for address in addresses:
        assert list(names.values()).count(address) == 1, names
        assert executions[address] > 0, executions


def test_a_worker_told_to_trace_writes_its_own_files_and_never_the_controllers(tmp_path, token_file, monkeypatch):
    own = tmp_path / "worker.json"
    controllers = tmp_path / "controller.json"
    monkeypatch.setenv("COLOCATED_TRACE", str(controllers))
    worker = Worker(token_file, devices=1, extra_args=("--trace", str(own)))
    monkeypatch.delenv("COLOCATED_TRACE")  # the worker's alone: this process does not trace
    previous = _client._current_default()
    try:
        client = colocated.connect([worker.address], token_file=token_file)
        x = colocated.device_put(np.arange(4, dtype=np.int32), client.devices()[0])
        np.testing.assert_array_equal(np.asarray(x), np.arange(4))
        client.close()
    finally:
        _client._set_default(previous)
        worker.stop()
    assert not controllers.exists()
    # The supervisor's file, and its session worker's beside it (NAME.PID.EXT).
    assert json.loads(own.read_text()) is not None
    (session,) = tmp_path.glob("worker.*.json")
    events = json.loads(session.read_text())
    names = [e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"]
    assert names == ["worker (this process)"], names
    assert any(e["ph"] == "X" for e in events), events
