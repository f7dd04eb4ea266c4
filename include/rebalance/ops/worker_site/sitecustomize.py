"""Start-up hook of the streaming job's Python processes: keeps the job's console and log to
the project's own lines.

At every query start Spark runs PySpark's ``transformWithStateInPandas`` driver worker
(``python -m pyspark.sql.streaming.transform_with_state_driver_worker``): it talks to the
JVM over a socket and ``print``\\ s to stdout, at each start, "Starting Streaming
TransformWithStateInPandas Python worker" and the UDF with its whole return type. Neither
log4j nor Python's ``logging`` sees those lines (the JVM copies the worker's stdout and
stderr to its own stderr as they are), so they are caught here, in that one process:
its stdout goes to ``$REBALANCE_PYTHON_WORKER_LOG`` (else nowhere). Its stderr is left
alone, and a failure (an exception in the processor's ``init``, say) still reaches the JVM
through the socket and fails the query with the Python traceback.

Every other process (the job itself, Spark's executor workers) runs unchanged. The folder
is put first on ``PYTHONPATH`` by :func:`rebalance.ops.service.quiet_python_workers`;
Python imports ``sitecustomize`` from it at start-up.
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
