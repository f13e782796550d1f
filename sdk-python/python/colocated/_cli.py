"""``colocated``: the package's command line, on every node that has the
package installed.

- ``colocated worker [flags]``: serve this machine's devices to controllers
  (``python -m colocated.worker``: the flags of every worker, and it runs
  colocated Python programs too).
- ``colocated status [HOST:PORT ...] [flags]``: one line per worker (version,
  devices, sessions, uptime); without addresses, the workers are found as a
  controller finds them (``COLOCATED_WORKERS``, the Slurm job, Kubernetes).
  Exits 1 if one does not answer.
"""

from __future__ import annotations

import argparse
import sys

from . import _colocated, worker
from ._errors import ColocatedError

_USAGE = "usage: colocated {worker,status} [flags] (colocated COMMAND --help)"


def _status(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="colocated status",
        description="One line per worker: version, devices, sessions, uptime. Exits 1 if one does not answer.",
    )
    parser.add_argument(
        "addresses", nargs="*", metavar="HOST:PORT", help="the workers (default: found as --cluster says)"
    )
    worker.add_flags(parser, _colocated.status_flags())
    args = parser.parse_args(argv)
    try:
        report, everyone = _colocated.status(
            args.addresses,
            token_file=args.token_file,
            tls_ca=args.tls_ca,
            tls_domain=args.tls_domain,
            timeout=args.timeout,
            cluster=args.cluster,
            port=args.port,
        )
    except ColocatedError as e:
        print(f"colocated: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(report)
    sys.stdout.flush()
    return 0 if everyone else 1


def main(argv: list[str] | None = None) -> int:
    """Runs ``colocated COMMAND ...``; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command, rest = (argv[0], argv[1:]) if argv else (None, [])
    if command == "worker":
        return worker.main(rest, prog="colocated worker")
    if command == "status":
        return _status(rest)
    if command in ("-h", "--help"):
        print(__doc__)
        return 0
    if command == "--version":
        from importlib.metadata import version

        print(f"colocated {version('colocated')}")
        return 0
    print(f"colocated: unknown command {command!r}\n{_USAGE}" if command else _USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
