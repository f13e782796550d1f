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
controller's Python code cannot reach another's objects; ``--shared-interpreter``
serves every session in this process instead.
"""

from __future__ import annotations

import argparse
import os
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
    for name, kind, default, repeatable, help_text in table:
        flag = f"--{name}"
        help_text = help_text.replace("%", "%%")  # argparse formats help
        if kind == "switch":
            parser.add_argument(flag, action="store_true", help=help_text)
        elif repeatable:
            parser.add_argument(
                flag, action="append", default=[], type=_TYPES[kind], metavar=_METAVARS[kind], help=help_text
            )
        else:
            value = None if default is None else _TYPES[kind](default)
            parser.add_argument(flag, type=_TYPES[kind], default=value, metavar=_METAVARS[kind], help=help_text)


def _parser(prog: str = "python -m colocated.worker") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    # The flags every worker takes: the runtime's table, which `colocated
    # worker` is built from too.
    add_flags(parser, _colocated.worker_flags())
    isolation = parser.add_mutually_exclusive_group()
    isolation.add_argument(
        "--isolate-sessions",
        dest="isolate",
        action="store_true",
        default=True,
        help="run each session in a worker process of its own (the default)",
    )
    isolation.add_argument(
        "--shared-interpreter",
        dest="isolate",
        action="store_false",
        help="serve every session in this process: their Python code shares one interpreter",
    )
    # Internal: a supervisor's child serves one session, then exits 0; it
    # also exits when its stdin (held by the supervisor) closes.
    parser.add_argument("--single-session", action="store_true", help=argparse.SUPPRESS)
    return parser


def _child_command(args) -> list[str]:
    """The command line of a supervisor's session worker: this module with the
    same devices, plugins, liveness, TLS and trace flags, serving in-process (the
    supervisor adds ``--listen``, ``--token-file`` and ``--single-session``)."""
    command = [sys.executable, "-m", "colocated.worker", "--shared-interpreter"]
    command += ["--heartbeat-interval", repr(args.heartbeat_interval)]
    command += ["--session-timeout", repr(args.session_timeout)]
    if args.cpu_devices is not None:
        command += ["--cpu-devices", str(args.cpu_devices)]
    if args.pjrt_plugin is not None:
        command += ["--pjrt-plugin", _client.find_pjrt_plugin(args.pjrt_plugin)]
    for option in args.pjrt_option:
        command += ["--pjrt-option", option]
    for plugin in args.plugin:
        command += ["--plugin", os.path.abspath(plugin)]
    if args.tls_cert is not None:
        command += ["--tls-cert", os.path.abspath(args.tls_cert), "--tls-key", os.path.abspath(args.tls_key)]
    if args.trace is not None:
        command += ["--trace", os.path.abspath(args.trace)]
    return command


def _trace_file(args) -> str | None:
    """This process's own trace file (``--trace``): a supervisor's session
    worker writes ``NAME.PID.EXT`` beside its supervisor's ``NAME.EXT``, as two
    processes cannot share one file."""
    if args.trace is None or not args.single_session:
        return args.trace
    root, ext = os.path.splitext(args.trace)
    return f"{root}.{os.getpid()}{ext}"


def _single_session_token(args) -> str:
    """A session worker's one-time token: read from its file, which is then
    deleted (nobody else needs it)."""
    if args.token_file is None or args.insecure:
        raise SystemExit("colocated: --single-session needs --token-file")
    try:
        with open(args.token_file) as f:
            token = f.read().strip()
    finally:
        try:
            os.remove(args.token_file)
        except OSError:
            pass
    return token


def _stop_when_stdin_closes(stop: threading.Event) -> None:
    """Sets ``stop`` once stdin reaches its end: a session worker's supervisor
    holds the other end, so the child never outlives it (even a ``kill -9``)."""

    def watch() -> None:
        # os.read, not sys.stdin: a daemon thread blocked in a buffered
        # reader's lock aborts the interpreter's exit.
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        stop.set()

    threading.Thread(target=watch, name="colocated-supervisor-watch", daemon=True).start()


def main(argv: list[str] | None = None, prog: str = "python -m colocated.worker") -> int:
    """Runs a worker until SIGINT or SIGTERM; returns the exit status."""
    parser = _parser(prog)
    args = parser.parse_args(argv)
    # Before anything makes a client (which would install the library's
    # silent default): an operator sees warnings and refusals, and the
    # controller's COLOCATED_TRACE is left to the controller.
    _colocated.init_worker_logging(_trace_file(args))
    token = _single_session_token(args) if args.single_session else None
    flags = {
        "listen": args.listen,
        "port": args.port,
        "token_file": None if args.single_session else args.token_file,
        "insecure": args.insecure and not args.single_session,
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
        "heartbeat_interval": args.heartbeat_interval,
        "session_timeout": args.session_timeout,
        "exit_after_idle": args.exit_after_idle,
    }
    # Every flag is checked before anything starts: a bad one is a usage
    # error (status 2), as with `colocated worker`.
    try:
        config = _colocated.WorkerConfig(**flags, token=token)
    except ColocatedError as e:
        parser.error(str(e))
    try:
        # The plugin's name ("cpu", "cuda": an installed package) or path;
        # the rest (options, COLOCATED_PJRT_PLUGIN) by core's rule.
        plugin = None if args.pjrt_plugin is None else _client.find_pjrt_plugin(args.pjrt_plugin)
        _colocated.configure_worker_client(args.cpu_devices, plugin, args.pjrt_option)
    except ColocatedError as e:
        parser.error(str(e))
    for plugin in args.plugin:
        try:
            names = _colocated.load_plugin(_client.client(), plugin)
        except ColocatedError as e:
            raise SystemExit(f"colocated: --plugin {plugin}: {e}") from None
        print(f"colocated: plugin {plugin} registered {', '.join(names)}", file=sys.stderr)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    if args.single_session:
        _stop_when_stdin_closes(stop)
    isolate = _child_command(args) if args.isolate and not args.single_session else None
    try:
        worker = _colocated.start_worker(_client.client(), config, isolate=isolate, single_session=args.single_session)
    except ColocatedError as e:  # a taken port, an unusable certificate
        raise SystemExit(f"colocated: {e}") from None
    print(f"listening on {worker.address}", flush=True)
    while not stop.wait(0.1):
        if worker.idle_expired:
            if args.single_session:
                break  # its one session ended, or none opened in time
            print(f"colocated: no session for {args.exit_after_idle:g} s (--exit-after-idle): stopping",
                  file=sys.stderr, flush=True)
            break
    worker.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
