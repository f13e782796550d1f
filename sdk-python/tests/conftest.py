"""Shared fixtures. The default client gets 8 CPU devices (set before first use)."""

import os

os.environ.setdefault("COLOCATED_NUM_CPU_DEVICES", "8")

import itertools
import sys
import types

import numpy as np
import pytest

import colocated


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
