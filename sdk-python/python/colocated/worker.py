"""``python -m colocated.worker``: serve this machine's devices to a controller.

The same flags as ``colocated worker`` (the Rust binary), and this worker also
runs colocated Python programs. It prints exactly one line, ``listening on
HOST:PORT``, once it accepts connections, logs warnings (refused requests, an
insecure or exposed worker) to stderr unless ``COLOCATED_LOG`` says otherwise,
and stops cleanly on SIGINT or SIGTERM, or with ``--exit-after-idle`` once it has
had no session for that long.

Security: a worker runs the code it is sent. It requires a token (``--token-file``
or ``COLOCATED_TOKEN``) unless ``--insecure`` is given, and it unpickles programs
only from requests of an authenticated session.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import threading

from . import _client, _colocated
from ._errors import ColocatedError


def _positive_seconds(text: str) -> float:
    """A flag's number of seconds: positive and finite, else a usage error
    (argparse exits with status 2 and says which flag)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m colocated.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:0", help="address to listen on; port 0 picks a free port")
    parser.add_argument("--cpu-devices", type=int, default=None, help="number of CPU devices to serve")
    parser.add_argument("--token-file", default=None, help="file holding the token every request must carry")
    parser.add_argument("--insecure", action="store_true", help="serve without a token (anyone may run code here)")
    parser.add_argument("--heartbeat-interval", type=float, default=1.0, help="seconds between heartbeats")
    parser.add_argument("--session-timeout", type=float, default=10.0, help="seconds of silence that close a session")
    parser.add_argument("--tls-cert", default=None, help="PEM certificate chain to serve TLS with")
    parser.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="LIB",
        help="a native-function plugin library to load at start (repeatable; see colocated.h)",
    )
    parser.add_argument(
        "--exit-after-idle",
        type=_positive_seconds,
        default=None,
        metavar="SECONDS",
        help="exit (status 0) once no session has been open for this many seconds",
    )
    return parser


def _check_token(args) -> None:
    """Refuses, with the flags to use, a worker that would serve without a
    token by accident (the token itself is read by the native module)."""
    if args.token_file is not None:
        if args.insecure:
            raise SystemExit("colocated: --token-file and --insecure exclude each other")
        return
    if args.insecure:
        return  # the worker logs a warning when it starts
    if _colocated.TOKEN_ENV not in os.environ:
        raise SystemExit(
            f"colocated: a worker requires a token: pass --token-file FILE or set {_colocated.TOKEN_ENV} "
            "(--insecure serves anyone, which lets them run code on this machine)"
        )


def main(argv: list[str] | None = None) -> int:
    """Runs a worker until SIGINT or SIGTERM; returns the exit status."""
    args = _parser().parse_args(argv)
    # Before anything makes a client (which would install the library's
    # silent default): an operator sees warnings and refusals.
    _colocated.init_worker_logging()
    if (args.tls_cert is None) != (args.tls_key is None):
        raise SystemExit("colocated: --tls-cert and --tls-key go together")
    _check_token(args)
    tls = {}
    if args.tls_cert is not None:
        with open(args.tls_cert, "rb") as cert, open(args.tls_key, "rb") as key:
            tls = {"tls_cert": cert.read(), "tls_key": key.read()}
    if args.cpu_devices is not None:
        _client.configure(num_cpu_devices=args.cpu_devices)
    for plugin in args.plugin:
        try:
            names = _colocated.load_plugin(_client.client(), plugin)
        except ColocatedError as e:
            raise SystemExit(f"colocated: --plugin {plugin}: {e}") from None
        print(f"colocated: plugin {plugin} registered {', '.join(names)}", file=sys.stderr)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        worker = _colocated.start_worker(
            _client.client(),
            args.listen,
            token_file=args.token_file,
            insecure=args.insecure,
            heartbeat_interval=args.heartbeat_interval,
            session_timeout=args.session_timeout,
            exit_after_idle=args.exit_after_idle,
            **tls,
        )
    except ColocatedError as e:  # bad flags, an unreadable or empty token, a taken port
        raise SystemExit(f"colocated: {e}") from None
    print(f"listening on {worker.address}", flush=True)
    while not stop.wait(0.1):
        if worker.idle_expired:
            print(f"colocated: no session for {args.exit_after_idle:g} s (--exit-after-idle): stopping",
                  file=sys.stderr, flush=True)
            break
    worker.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
