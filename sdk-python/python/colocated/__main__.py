"""``python -m colocated``: the ``colocated`` command (``worker``, ``status``)."""

import sys

from ._cli import main

sys.exit(main())
