"""One trace for the whole job: the cluster demo (a controller and two
``python -m colocated.worker`` processes) run with ``COLOCATED_TRACE`` exported,
so that the workers inherit it as from one shell, writes one valid trace: the
controller's, with one process per worker named by its address and holding
that worker's executions. The workers write nothing there. Real processes and
sockets on loopback; the trace's subscriber is per process, so the controller
runs in a process of its own."""

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

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
