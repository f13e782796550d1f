"""Host events in Python: ``Client.on_host_event`` hands a callback what happens
to the client's worker hosts (a link that broke and came back, a session lost
for good, a new session that replaced it), ``Client.host_stats`` counts it.
A controller and a real ``python -m colocated.worker`` process talk through the
test suite's fault-injecting proxy (``faultproxy.FaultProxy``)."""

import sys
import threading
import time

import numpy as np
import pytest
from faultproxy import FaultProxy, crash_and_restart
from workers import Worker

import colocated

#: Seconds to wait for an event that must come.
PATIENCE = 30.0


class Heard:
    """A listener that keeps the events it hears, and waits (boundedly) for them."""

    def __init__(self):
        self.events = []
        self._changed = threading.Condition()

    def __call__(self, event):
        with self._changed:
            self.events.append(event)
            self._changed.notify_all()

    def kinds(self):
        with self._changed:
            return [e.kind for e in self.events]

    def expect(self, *kinds):
        """Waits until as many events as ``kinds`` came, and checks they are those."""
        with self._changed:
            self._changed.wait_for(lambda: len(self.events) >= len(kinds), PATIENCE)
        assert self.kinds() == list(kinds)
        return self.events


@pytest.fixture
def linked(token_file):
    """A worker process, a fault proxy in front of it, and a client (not the
    default one) connected through the proxy: ``(client, proxy, worker)``."""
    worker = Worker(token_file)
    try:
        with FaultProxy(worker.address) as proxy:
            yield colocated.connect([proxy.address], token_file=token_file, default=False), proxy, worker
    finally:
        worker.stop()


def _counts(stats):
    return (stats.disconnects, stats.reconnects, stats.sessions_lost, stats.sessions_reopened)


def test_a_reset_tells_disconnected_then_reconnected_and_counts_them(linked):
    client, proxy, _ = linked
    heard = Heard()
    assert isinstance(client.on_host_event(heard), int)
    kept = colocated.device_put(np.arange(4, dtype=np.int32), client.devices()[0])
    kept.block_until_ready()
    proxy.reset()
    disconnected, reconnected = heard.expect("disconnected", "reconnected")
    assert isinstance(disconnected, colocated.HostEvent)
    assert disconnected.host == 0 and reconnected.host == 0
    assert isinstance(disconnected.error, colocated.ColocatedError), disconnected
    assert reconnected.error is None
    # The session resumed: what it held is still there.
    np.testing.assert_array_equal(np.asarray(kept), [0, 1, 2, 3])
    stats = client.host_stats(0)
    assert isinstance(stats, colocated.HostStats)
    assert _counts(stats) == (1, 1, 0, 0), stats


def test_a_worker_restarted_on_the_same_address_tells_lost_then_reopened_after_new_work(token_file):
    first = Worker(token_file)
    address = first.address
    second = None
    try:
        with FaultProxy(address) as proxy:
            client = colocated.connect([proxy.address], token_file=token_file, default=False)
            heard = Heard()
            client.on_host_event(heard)
            kept = colocated.device_put(np.arange(4, dtype=np.int32), client.devices()[0])
            kept.block_until_ready()
            # The worker crashes, and a new one starts on its address.
            second = crash_and_restart(proxy, first, lambda: Worker(token_file, listen=address), PATIENCE)
            # The next attempt to resume reaches the new worker, which does not
            # know the session.
            _, lost = heard.expect("disconnected", "lost")
            assert isinstance(lost.error, colocated.UnavailableError), lost
            assert "no longer has this session" in str(lost.error)
            # New work opens a new session.
            x = colocated.device_put(np.arange(4, dtype=np.int32), client.devices()[0])
            np.testing.assert_array_equal(np.asarray(x), [0, 1, 2, 3])
            reopened = heard.expect("disconnected", "lost", "reopened")[2]
            assert reopened.host == 0 and reopened.error is None
            assert _counts(client.host_stats(0)) == (1, 0, 1, 1)
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_close_tells_lost_with_a_cancelled_error(linked):
    client, _, _ = linked
    heard = Heard()
    client.on_host_event(heard)
    client.close()
    (lost,) = heard.expect("lost")
    assert lost.host == 0
    assert isinstance(lost.error, colocated.CancelledError), lost
    assert "closed" in str(lost.error)
    assert _counts(client.host_stats(0)) == (0, 0, 1, 0)


def test_a_callback_that_raises_goes_to_the_unraisable_hook_and_keeps_listening(linked, monkeypatch):
    client, proxy, _ = linked
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    raising = Heard()

    def raise_after_hearing(event):
        raising(event)
        raise RuntimeError(f"listener failed on {event.kind}")

    raising_id = client.on_host_event(raise_after_hearing)
    after = Heard()
    client.on_host_event(after)
    proxy.reset()
    # Both events reach both listeners, the second after the first raised.
    after.expect("disconnected", "reconnected")
    raising.expect("disconnected", "reconnected")
    deadline = time.monotonic() + PATIENCE
    while len(unraisable) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [str(u.exc_value) for u in unraisable] == [
        "listener failed on disconnected",
        "listener failed on reconnected",
    ]
    assert all(u.object is raise_after_hearing for u in unraisable)
    # Nothing more for the hook once the test has given it back.
    assert client.remove_host_listener(raising_id)


def test_a_listener_that_comes_after_a_loss_hears_it_first(linked):
    client, _, _ = linked
    first = Heard()
    client.on_host_event(first)
    client.close()
    first.expect("lost")
    late = Heard()
    client.on_host_event(late)
    (lost,) = late.expect("lost")
    assert lost.host == 0
    assert isinstance(lost.error, colocated.CancelledError), lost
    # Told once: the first listener hears nothing more of it.
    time.sleep(0.2)
    assert first.kinds() == ["lost"]
    assert late.kinds() == ["lost"]


def test_a_removed_listener_hears_nothing_more(linked):
    client, _, _ = linked
    removed, kept = Heard(), Heard()
    listener_id = client.on_host_event(removed)
    client.on_host_event(kept)
    assert client.remove_host_listener(listener_id) is True
    assert client.remove_host_listener(listener_id) is False
    client.close()
    kept.expect("lost")
    assert removed.kinds() == []


def test_bad_arguments_raise_invalid_argument():
    client = colocated.Client(num_cpu_devices=1)
    with pytest.raises(colocated.InvalidArgumentError, match="on_host_event takes a callable, got int"):
        client.on_host_event(42)
    assert _counts(client.host_stats(0)) == (0, 0, 0, 0)  # the in-process host
    for host in (1, -1):
        with pytest.raises(colocated.InvalidArgumentError, match=f"host {host} is out of range \\(1 hosts\\)"):
            client.host_stats(host)
    assert client.remove_host_listener(12345) is False
