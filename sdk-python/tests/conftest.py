"""Shared fixtures. The default client gets 8 CPU devices (set before first use)."""

import os

os.environ.setdefault("COLOCATED_NUM_CPU_DEVICES", "8")

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
