"""Controlled restart of the keyed job: moves the moved keys' state to a new generation.

A live switch moves a key's events but not its state; a controlled restart moves the
state too, exactly once (docs/restart.md: the steps, the ``restarts`` rows, recovery and
limits). Modules:

* :mod:`.job`: :class:`RestartableJob`, the driver that runs generations and executes restarts
* :mod:`.control`: the ``restarts`` control table, :class:`Generation`, :func:`request_restart`
* :mod:`.checkpoint`: reading a stopped generation's checkpoint (position, next source)
* :mod:`.state`: re-keying a generation's state, and the handoff table of a same-N restart
* :mod:`.sink`: the sink's boundary gate and the guard of the versions followed live
* :mod:`.query`: one generation's streaming query
"""

from rebalance.streaming.restart.checkpoint import checkpoint_position
from rebalance.streaming.restart.control import (
    Generation,
    RestartControl,
    RestartError,
    request_restart,
)
from rebalance.streaming.restart.job import RestartableJob

__all__ = [
    "Generation", "RestartControl", "RestartError", "RestartableJob", "checkpoint_position",
    "request_restart",
]
