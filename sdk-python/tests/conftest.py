"""Shared fixtures. The default client gets 8 CPU devices (set before first use)."""

import os

os.environ.setdefault("COLOCATED_NUM_CPU_DEVICES", "8")

import gc
import itertools
import sys
import types

import numpy as np
import pytest
from workers import Worker, write_token

import colocated
from colocated import _client


@pytest.fixture
def mesh():
    """A 2x2 mesh over devices 0-3 with axes ('x', 'y')."""
    return colocated.Mesh(np.array(colocated.devices()[:4]).reshape(2, 2), ("x", "y"))


@pytest.fixture
def mesh4():
    """A 1-D mesh over devices 0-3 with axis 'x'."""
    return colocated.Mesh(colocated.devices()[:4], ("x",))


_state_ids = itertools.count()


@pytest.fixture
def state():
    """A fresh module for state shared by a test and its host code (cloudpickle
    sends a module by name, so host code sees this very object on the local host)."""
    name = f"_colocated_test_state_{next(_state_ids)}"
    module = types.ModuleType(name)
    sys.modules[name] = module
    # Left registered on purpose: a call or destruction still queued may look it up.
    return module


@pytest.fixture
def token_file(tmp_path):
    """A file with a fresh token for workers and controllers."""
    path = tmp_path / "token"
    write_token(path)
    return path


@pytest.fixture
def cluster(token_file):
    """``cluster(n, devices=2)`` starts ``n`` workers (``workers.Worker``) and
    connects a default client to them; the previous default client is restored
    and the workers stopped afterwards."""
    started = []
    previous = _client._current_default()

    def start(n, devices=2):
        workers = []
        for _ in range(n):
            workers.append(Worker(token_file, devices))
            started.append(workers[-1])
        client = colocated.connect([w.address for w in workers], token_file=token_file)
        return client, workers

    yield start
    _client._set_default(previous)
    gc.collect()
    for w in started:
        w.stop()
