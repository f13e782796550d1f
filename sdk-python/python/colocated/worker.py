"""``python -m colocated.worker``: serve this machine's devices to a controller.

The same flags as ``colocated worker`` (the Rust binary), and this worker also
runs colocated Python programs. It prints exactly one line, ``listening on
HOST:PORT``, once it accepts connections, logs warnings (refused requests, an
insecure or exposed worker) to stderr unless ``COLOCATED_LOG`` says otherwise,
and stops cleanly on SIGINT or SIGTERM, or with ``--exit-after-idle`` once it has
had no session for that long.

Security: a worker runs the code it is sent. It requires a token (``--token-file``
or ``COLOCATED_TOKEN``) unless ``--insecure`` is given, and it unpickles programs
only from requests of an authenticated session. By default
(``--isolate-sessions``) every session runs in a worker process of its own,
started for it (about 0.2 s) with the same flags and a one-time token, so one
controller's Python code cannot reach another's objects; ``--shared-sessions``
(or its older name ``--shared-interpreter``) serves every session in this
process instead. The runtime applies these rules, for every kind of worker.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from . import _client, _colocated
from ._errors import ColocatedError

#: How argparse reads each kind of value of the runtime's table of flags.
_TYPES = {"address": str, "count": int, "seconds": float, "path": str, "port": str, "name": str}
_METAVARS = {"address": "HOST:PORT", "count": "N", "seconds": "SECONDS", "path": "FILE", "port": "PORT|auto", "name": "NAME"}


def add_flags(parser: argparse.ArgumentParser, table) -> None:
    """Adds the flags of one of the runtime's tables (``worker_flags()``,
    ``status_flags()``) to ``parser``; the runtime checks their values."""
    for name, kind, default, repeatable, help_text, aliases, hidden in table:
        flags = [f"--{name}", *(f"--{alias}" for alias in aliases)]
        help_text = argparse.SUPPRESS if hidden else help_text.replace("%", "%%")  # argparse formats help
        if kind == "switch":
            parser.add_argument(*flags, action="store_true", help=help_text)
        elif repeatable:
            parser.add_argument(
                *flags, action="append", default=[], type=_TYPES[kind], metavar=_METAVARS[kind], help=help_text
            )
        else:
            value = None if default is None else _TYPES[kind](default)
            parser.add_argument(*flags, type=_TYPES[kind], default=value, metavar=_METAVARS[kind], help=help_text)


def _parser(prog: str = "python -m colocated.worker") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    # The flags every worker takes: the runtime's table, which `colocated
    # worker` is built from too (--isolate-sessions, --shared-sessions, alias
    # --shared-interpreter, and the hidden --single-session among them).
    add_flags(parser, _colocated.worker_flags())
    return parser


#: How the runtime starts another Python worker (a supervisor's session worker).
_COMMAND = [sys.executable, "-m", "colocated.worker"]


def main(argv: list[str] | None = None, prog: str = "python -m colocated.worker") -> int:
    """Runs a worker until SIGINT or SIGTERM; returns the exit status."""
    parser = _parser(prog)
    args = parser.parse_args(argv)
    # Every flag is checked before anything starts: a bad one is a usage
    # error (status 2), as with `colocated worker`.
    try:
        # The plugin's name ("cpu", "cuda": an installed package) or path;
        # the rest (options, COLOCATED_PJRT_PLUGIN) by the runtime's rule.
        plugin = None if args.pjrt_plugin is None else _client.find_pjrt_plugin(args.pjrt_plugin)
        config = _colocated.WorkerConfig(
            command=_COMMAND,
            listen=args.listen,
            port=args.port,
            token_file=args.token_file,
            insecure=args.insecure,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            heartbeat_interval=args.heartbeat_interval,
            session_timeout=args.session_timeout,
            exit_after_idle=args.exit_after_idle,
            cpu_devices=args.cpu_devices,
            pjrt_plugin=plugin,
            pjrt_options=args.pjrt_option,
            plugins=args.plugin,
            trace=args.trace,
            isolate_sessions=args.isolate_sessions,
            shared_sessions=args.shared_sessions,
            single_session=args.single_session,
        )
    except ColocatedError as e:
        parser.error(str(e))
    # Before anything makes a client (which would install the library's
    # silent default): an operator sees warnings and refusals, and the
    # controller's COLOCATED_TRACE is left to the controller.
    _colocated.init_worker_logging(config.trace_file)
    try:
        _colocated.configure_worker_client(args.cpu_devices, plugin, args.pjrt_option)
    except ColocatedError as e:
        parser.error(str(e))
    for path in args.plugin:
        try:
            names = _colocated.load_plugin(_client.client(), path)
        except ColocatedError as e:
            raise SystemExit(f"colocated: --plugin {path}: {e}") from None
        print(f"colocated: plugin {path} registered {', '.join(names)}", file=sys.stderr)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        worker = _colocated.start_worker(_client.client(), config)
    except ColocatedError as e:  # a taken port, an unusable certificate
        raise SystemExit(f"colocated: {e}") from None
    print(f"listening on {worker.address}", flush=True)
    while not stop.wait(0.1):
        if worker.idle_expired:
            if config.single_session:
                break  # its one session ended, none opened in time, or its supervisor went
            print(f"colocated: no session for {args.exit_after_idle:g} s (--exit-after-idle): stopping",
                  file=sys.stderr, flush=True)
            break
    worker.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
