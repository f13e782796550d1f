"""Helpers shared by the colocated Python tests: devices, inputs, and waits that
are always bounded (a test fails instead of hanging)."""

import gc
import threading
import time
import traceback

import numpy as np
import pytest

import colocated

WAIT = 10.0  # seconds: the bound of every wait in these tests
GATE_WAIT = 5.0  # seconds a host function waits for a gate the test opens


def cpu(n):
    """The first ``n`` colocated CPU devices (skips the test if there are fewer)."""
    devices = list(colocated.colocated_cpu_devices(colocated.devices()))
    if len(devices) < n:
        pytest.skip(f"needs {n} CPU devices, got {len(devices)}")
    return devices[:n]


def put(value, target=None, dtype=np.int32):
    """``value`` as an array of ``dtype`` on ``target`` (default: the first CPU device)."""
    return colocated.device_put(np.asarray(value, dtype=dtype), cpu(1)[0] if target is None else target)


def wait_bounded(tree, timeout=3 * WAIT):
    """``block_until_ready(tree)`` on a helper thread: fails instead of hanging."""
    box = {}

    def run():
        try:
            box["value"] = colocated.block_until_ready(tree)
        except BaseException as err:  # noqa: BLE001 - re-raised on the test thread
            box["error"] = err

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        pytest.fail(f"block_until_ready did not return within {timeout}s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def outcome(call):
    """Runs ``call()`` and waits for its outputs; returns the exception raised
    (by the call itself or by the wait), or None."""
    try:
        wait_bounded(call())
    except Exception as err:  # noqa: BLE001 - the tests inspect it
        return err
    return None


def error_text(err):
    """Everything an exception tells: message, remote traceback, local traceback chain."""
    parts = [str(err), getattr(err, "remote_traceback", "") or ""]
    parts.extend(traceback.format_exception(type(err), err, err.__traceback__))
    return "\n".join(parts)


def eventually(predicate, timeout=WAIT):
    """Polls ``predicate`` (collecting garbage in between) until it holds or ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
