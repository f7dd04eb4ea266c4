"""Connection settings of Airflow's metadata database on the service's SQLite home.

Airflow imports these by name (``[database] sql_alchemy_connect_args`` and
``sql_alchemy_connect_args_async``, set by :func:`rebalance.ops.service.airflow_env`) in
each of its processes. SQLite lets one connection write at a time; Python's default is to
wait 5 s for that lock and then fail with "database is locked", which the api-server
answers with HTTP 500. Under the service's load (the scheduler, the DAG processor, task
runners and the api-server all write) one writer can hold the lock longer than that, so
the service waits longer.
"""

from __future__ import annotations

#: Seconds a connection waits for SQLite's write lock before it gives up.
BUSY_TIMEOUT_SECONDS = 30.0

#: ``sqlite3.connect`` arguments (the scheduler, the DAG processor, task runners).
CONNECT_ARGS = {"timeout": BUSY_TIMEOUT_SECONDS}

#: ``aiosqlite.connect`` arguments (the api-server's async sessions).
CONNECT_ARGS_ASYNC = {"timeout": BUSY_TIMEOUT_SECONDS}

#: Airflow's settings that point at the two above.
SETTINGS = {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS": f"{__name__}.CONNECT_ARGS",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC": f"{__name__}.CONNECT_ARGS_ASYNC"}
