"""The one thing a processor may tell the rebalancer beyond Spark's contract: which of a
call's input rows it dropped as duplicates.

A processor that removes repeated events (a producer's retries) calls
:func:`count_duplicates` with the rows it dropped. Under
:func:`~rebalance.streaming.rebalanced.rebalanced` those rows count in
``instance_histograms.duplicates`` of their windows and not in the key's events, cost or
load (the planner balances the work that was kept). Under plain Spark the call does
nothing, so the same class runs unchanged under both::

    from rebalance.streaming.duplicates import count_duplicates

    def handleInputRows(self, key, rows, timerValues):
        frame = pd.concat(list(rows), ignore_index=True)
        repeated = frame["event_id"].isin(self.seen_ids())
        count_duplicates(frame[repeated])
        ...
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pandas as pd

_call = threading.local()


class DuplicatesError(ValueError):
    """:func:`count_duplicates` was given rows that are not rows of the call's input."""


def count_duplicates(rows: pd.DataFrame) -> None:
    """Count ``rows`` as input rows this call of ``handleInputRows`` dropped as duplicates.

    ``rows`` are rows of the call's input frame with the index they came with (the
    frame's own, from 0; or of ``pd.concat(list(rows), ignore_index=True)``), e.g.
    ``frame[mask]``. A row counted twice counts once. Outside ``rebalanced()``: nothing."""
    positions = getattr(_call, "positions", None)
    if positions is not None and len(rows):
        positions.append(np.asarray(rows.index))


@contextmanager
def collecting(n_rows: int) -> Iterator[list[np.ndarray]]:
    """Collect what :func:`count_duplicates` is given during one call over ``n_rows``
    input rows; the list holds the rows' positions (checked: integers in ``0..n_rows-1``)
    once the block ends."""
    found: list[np.ndarray] = []
    previous, _call.positions = getattr(_call, "positions", None), found
    try:
        yield found
    finally:
        _call.positions = previous
    if found:
        positions = np.unique(np.concatenate(found))
        if (positions.dtype.kind not in "iu"
                or (len(positions) and (positions[0] < 0 or positions[-1] >= n_rows))):
            raise DuplicatesError(
                f"count_duplicates takes rows of the frame handleInputRows received, with "
                f"their index (0..{n_rows - 1}); got index values {positions[:5].tolist()}")
        found[:] = [positions.astype(np.int64)]
