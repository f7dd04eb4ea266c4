"""Start-up hook of the streaming job's Python processes: keeps the job's console and log to
the project's own lines.

In PySpark's ``transformWithStateInPandas`` driver worker only, stdout (its start line and
UDF, printed at every query start out of log4j's reach) goes to
``$REBALANCE_PYTHON_WORKER_LOG`` (else nowhere); its stderr and failures are left alone,
and every other process runs unchanged. :func:`rebalance.ops.service.quiet_python_workers`
puts this folder first on ``PYTHONPATH``. Why: ``docs/streaming.md``, "The Python worker's
start-up lines".
"""

import os
import sys

_DRIVER_WORKER = "pyspark.sql.streaming.transform_with_state_driver_worker"


def _quiet_stdout() -> None:
    log = os.environ.get("REBALANCE_PYTHON_WORKER_LOG") or os.devnull
    try:
        if log != os.devnull:
            os.makedirs(os.path.dirname(log) or ".", exist_ok=True)
        sys.stdout = open(log, "a", buffering=1)
    except OSError:          # the log cannot be written: the lines go nowhere, the worker runs
        sys.stdout = open(os.devnull, "w")


if sys.orig_argv[-2:] == ["-m", _DRIVER_WORKER]:
    _quiet_stdout()
