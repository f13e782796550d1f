"""Work items of thread pools as stream scopes (see ``src/streams.rs``).

Colocated calls keep program order per calling thread, as in JAX. The worker
threads of a ``concurrent.futures.ThreadPoolExecutor`` (and so of asyncio's
``to_thread`` and ``run_in_executor``) run independent work items one after
another: each work item is a scope of its own, so that calls submitted by
different work items run concurrently even when the pool runs them on one
thread, while the calls of one work item keep their order.
"""

from __future__ import annotations

import itertools
import sys
import threading
from concurrent.futures import thread as _pool

_RUN_CODE = _pool._WorkItem.run.__code__
_NEXT_SCOPE = itertools.count(1)
#: How far up the stack a work item's frame is looked for.
_MAX_DEPTH = 256


def is_pool_thread() -> bool:
    """True on a worker thread of a ``ThreadPoolExecutor``."""
    return getattr(threading.current_thread(), "_target", None) is _pool._worker


def work_item_scope() -> int:
    """The scope of the work item the calling pool thread runs (0 outside one)."""
    frame = sys._getframe(1)
    for _ in range(_MAX_DEPTH):
        if frame is None:
            break
        if frame.f_code is _RUN_CODE:
            item = frame.f_locals.get("self")
            if item is None:
                break
            scope = getattr(item, "_colocated_scope", None)
            if scope is None:
                scope = next(_NEXT_SCOPE)
                item._colocated_scope = scope
            return scope
        frame = frame.f_back
    return 0
