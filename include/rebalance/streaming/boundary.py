"""The gate that stops a query between two micro-batches, shared by the sinks of the
restartable job and of ``rebalanced()``.

A sink holds :attr:`BoundaryGate.lock` through each batch's call, refuses the batch when
the gate is closed (before it touches Spark), and records the batch it wrote. Closing
waits for the batch being written; the caller then waits for that batch's commit and stops
the query. A stop must not interrupt a batch inside ``foreachBatch``: its Java call fails,
and Spark's check of whether that failure means "stopped" (a regex over the message)
overflows the stream thread's stack (docs/streaming.md).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path


class BoundaryGate:
    """Lets the sink finish the batch it is writing and refuses the next one."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.closed = False
        self.closed_at: float | None = None
        self.last_written: int | None = None

    def close(self) -> int | None:
        """Close (waits for a batch being written); return the last batch fully written."""
        with self.lock:
            self.shut()
            return self.last_written

    def shut(self) -> None:
        """Refuse every later batch (the caller holds the lock)."""
        if not self.closed:
            self.closed, self.closed_at = True, time.time()


def wait_committed(query, checkpoint: str, batch: int | None, deadline: float) -> bool:
    """Wait until ``checkpoint`` committed ``batch`` (nothing to wait for when None, or once
    the query ended); False when ``deadline`` (``time.monotonic()``) passed first."""
    commit = Path(checkpoint, "commits", str(batch))
    while batch is not None and query.isActive and not commit.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
