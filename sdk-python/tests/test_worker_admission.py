"""``python -m colocated.worker`` against strangers on 127.0.0.1: silent
sockets beyond its descriptor limit do not lock a controller out, and what a
stranger sends before authenticating holds no memory."""

import resource
import socket
import struct
import sys
import threading
import time

import cloudpickle
import numpy as np
from workers import Worker, rss_bytes

import colocated

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _allow_open_files(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(n, hard), hard))


def _controller_works(client, round_):
    x = colocated.device_put(np.arange(8, dtype=np.int32) + round_, client.devices()[0])
    add_one = colocated.colocated_python(lambda x: x + 1)
    np.testing.assert_array_equal(np.asarray(add_one(x)), np.arange(8) + round_ + 1)


def test_silent_sockets_beyond_the_descriptor_limit_do_not_lock_a_controller_out(token_file):
    _allow_open_files(4096)
    worker = Worker(token_file, devices=1, max_files=1024)
    silent = []
    try:
        for _ in range(1100):
            silent.append(socket.create_connection(tuple(worker.address.rsplit(":", 1))))
        client = colocated.connect([worker.address], token_file=token_file, default=False)
        for round_ in range(5):
            _controller_works(client, round_)
    finally:
        for s in silent:
            s.close()
        worker.stop()


# A minimal HTTP/2 client: what a stranger sends needs no library.
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def _frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _literal(name, value):
    """An HPACK literal header field without indexing, new name (RFC 7541 §6.2.2)."""
    out = bytearray([0x00])
    for text in (name, value):
        data = text.encode()
        assert len(data) < 127
        out.append(len(data))
        out += data
    return bytes(out)


class _Stranger:
    """One HTTP/2 connection that follows the protocol (settings and pings
    acknowledged, flow-control windows respected) but carries no token."""

    def __init__(self, address):
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)))
        self.sock.settimeout(0.05)
        self.inbox = b""
        self.connection_window = 65535
        self.initial_stream_window = 65535
        self.stream_windows = {}
        self.ended = set()
        self.sock.sendall(_PREFACE + _frame(0x4, 0, 0))

    def pump(self):
        """Reads what the worker sent and answers what needs an answer."""
        try:
            data = self.sock.recv(1 << 20)
        except (BlockingIOError, TimeoutError):
            return
        if not data:
            raise ConnectionError("the worker closed the connection")
        self.inbox += data
        while len(self.inbox) >= 9:
            n = int.from_bytes(self.inbox[:3], "big")
            if len(self.inbox) < 9 + n:
                break
            kind, flags = self.inbox[3], self.inbox[4]
            stream = int.from_bytes(self.inbox[5:9], "big") & 0x7FFFFFFF
            payload, self.inbox = self.inbox[9 : 9 + n], self.inbox[9 + n :]
            if kind == 0x4 and not flags & 0x1:  # SETTINGS
                for i in range(0, len(payload), 6):
                    key, value = struct.unpack(">HI", payload[i : i + 6])
                    if key == 0x4:
                        self.initial_stream_window = value
                self.sock.sendall(_frame(0x4, 0x1, 0))
            elif kind == 0x6 and not flags & 0x1:  # PING
                self.sock.sendall(_frame(0x6, 0x1, 0, payload))
            elif kind == 0x8:  # WINDOW_UPDATE
                increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
                if stream == 0:
                    self.connection_window += increment
                elif stream in self.stream_windows:
                    self.stream_windows[stream] += increment
            elif kind in (0x1, 0x3) and stream:  # an answer, or a reset: the stream is over
                self.ended.add(stream)

    def request(self, stream, body_bytes, stop):
        """A LoadExecutable request announcing a 4 MiB message, then up to
        ``body_bytes`` of it while the windows allow and the stream is open."""
        self.stream_windows[stream] = self.initial_stream_window
        self.sock.sendall(_frame(0x1, 0x4, stream, _HEADERS))  # HEADERS, END_HEADERS
        self.sock.sendall(_frame(0x0, 0, stream, b"\x00" + struct.pack(">I", 4 << 20)))
        sent, stalled = 0, 0
        while sent < body_bytes and stream not in self.ended and not stop.is_set() and stalled < 20:
            self.pump()
            n = min(16384, body_bytes - sent, self.connection_window, self.stream_windows[stream])
            if n <= 0:
                stalled += 1
                continue
            self.sock.sendall(_frame(0x0, 0, stream, b"\x07" * n))
            self.connection_window -= n
            self.stream_windows[stream] -= n
            sent += n

    def close(self):
        self.sock.close()


_HEADERS = b"".join(
    _literal(n, v)
    for n, v in (
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/colocated.remote.v1.Worker/LoadExecutable"),
        (":authority", "worker"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    )
)


def _unauthenticated_unary_requests(address, streams, body_bytes, stop, answered):
    """One connection: ``streams`` requests without a token, each announcing a
    4 MiB message and sending ``body_bytes`` of it, never finishing; counts in
    ``answered`` the streams the worker answered."""
    stranger = _Stranger(address)
    try:
        for i in range(streams):
            stranger.request(2 * i + 1, body_bytes, stop)
        while not stop.is_set():
            stranger.pump()
        answered.append(len(stranger.ended))
    finally:
        stranger.close()


def test_unauthenticated_requests_hold_no_memory_while_a_controller_works(token_file):
    worker = Worker(token_file, devices=1)
    try:
        client = colocated.connect([worker.address], token_file=token_file, default=False)
        _controller_works(client, 0)
        before = rss_bytes(worker.pid)
        stop = threading.Event()
        answered = []
        strangers = [
            threading.Thread(
                target=_unauthenticated_unary_requests,
                args=(worker.address, 32, (4 << 20) - (256 << 10), stop, answered),
            )
            for _ in range(8)
        ]
        for t in strangers:
            t.start()
        peak = before
        deadline = time.monotonic() + 4
        round_ = 1
        while time.monotonic() < deadline:
            _controller_works(client, round_)
            round_ += 1
            peak = max(peak, rss_bytes(worker.pid))
            time.sleep(0.05)
        stop.set()
        for t in strangers:
            t.join(10)
        growth = peak - before
        assert growth < 64 << 20, f"the worker grew by {growth >> 20} MiB for strangers' requests"
        assert answered == [32] * 8, "every stranger's stream was refused at its headers"
        _controller_works(client, 100)
    finally:
        worker.stop()
