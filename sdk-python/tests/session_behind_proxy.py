"""A session worker behind the test suite's fault proxy: what an isolating
supervisor of the per-session fault tests starts for each session (its command
is this script, see ``test_faults.py``). It starts the real session worker with
the arguments it got, puts a ``colocated-faultproxy`` in front of it, and says
the proxy's address as its own, so the controller's session link goes through
the proxy. The test drives the proxy through a file: it appends one proxy
command per line to the file named by ``COLOCATED_TEST_PROXY_COMMANDS``, and
this script applies each and writes how many it applied to that name plus
``.done``. It exits with the session worker (which ends with its session)."""

import os
import subprocess
import sys
import threading
import time

from faultproxy import FaultProxy


def _serve_commands(proxy: FaultProxy, path: str) -> None:
    applied = 0
    while True:
        try:
            with open(path) as f:
                lines = [line.strip() for line in f if line.strip()]
        except FileNotFoundError:
            lines = []
        for command in lines[applied:]:
            proxy._ask(command)
            applied += 1
            with open(path + ".done", "w") as f:
                f.write(str(applied))
        time.sleep(0.01)


def main() -> int:
    # Its stdin is the supervisor's pipe: a session worker stops when it closes.
    child = subprocess.Popen([sys.executable, "-m", "colocated.worker", *sys.argv[1:]], stdout=subprocess.PIPE, text=True)
    line = child.stdout.readline()
    if not line.startswith("listening on "):
        print(line, end="", flush=True)
        return 1
    with FaultProxy(line.split()[-1]) as proxy:
        print(f"listening on {proxy.address}", flush=True)
        commands = os.environ.get("COLOCATED_TEST_PROXY_COMMANDS")
        if commands:
            threading.Thread(target=_serve_commands, args=(proxy, commands), daemon=True).start()
        return child.wait()


if __name__ == "__main__":
    sys.exit(main())
