"""The rebalanced query's sink stops between batches: closing it waits for the batch being
written and refuses every later one before it touches Spark (a stop that interrupted a
batch inside the sink made Spark's own stop check overflow the stream thread's stack)."""

from __future__ import annotations

import threading

import pytest

from rebalance.streaming.rebalanced import RebalancedSink, SwitchBoundary


class _Sink(RebalancedSink):
    """A sink whose batch writes block until released, recording what they wrote."""

    def __init__(self) -> None:
        super().__init__(spark=None, stream=None, output="unused", checkpoint="unused",
                         version=0)
        self.writing, self.release = threading.Event(), threading.Event()
        self.written: list[int] = []

    def _write(self, batch, batch_id: int) -> None:
        self.writing.set()
        assert self.release.wait(10)
        self.written.append(batch_id)


def test_close_waits_for_the_batch_being_written_and_returns_it():
    sink = _Sink()
    writer = threading.Thread(target=sink, args=(None, 7))
    writer.start()
    assert sink.writing.wait(10)
    closed: list[int | None] = []
    closer = threading.Thread(target=lambda: closed.append(sink.gate.close()))
    closer.start()
    closer.join(0.3)
    assert closer.is_alive() and not sink.gate.closed      # still writing batch 7
    sink.release.set()
    writer.join(10)
    closer.join(10)
    assert closed == [7] and sink.written == [7] and sink.gate.last_written == 7


def test_a_batch_after_close_is_refused_before_it_writes():
    sink = _Sink()
    sink.release.set()
    sink(None, 3)
    assert sink.gate.close() == 3
    with pytest.raises(SwitchBoundary, match="batch 4 refused: the query is stopping"):
        sink(None, 4)
    assert sink.written == [3]


def test_close_before_any_batch_returns_none():
    assert _Sink().gate.close() is None
