"""One real run of the rebalance DAG whose Spark session runs on a standalone cluster.

    REBALANCE_SPARK_MASTER=spark://127.0.0.1:<port> REBALANCE_DATA_DIR=<dir> \\
        python tests/integration/cluster_dag_run.py <result.json>

Started by ``test_cluster.py`` in a process of its own (the test process already holds a
``local[2]`` SparkContext; one JVM has one). The DAG's session
(:func:`rebalance.control.inputs.spark_session`, app ``rebalance-dag``) is created from
the environment, so its master is the cluster: the histogram windows are seeded, and the
DAG's ``windows`` / ``plan`` / ``publish`` / ``verify`` tasks read and write the Delta
tables, through that session (``dag.test``, in-process, as ``test_dag.py`` runs it; a
stand-in for the streaming job writes the next window when a version is published).
Writes what happened to ``<result.json>``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pendulum

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: Not the logical date of test_dag.py's runs (the tests share one Airflow database).
LOGICAL_DATE = pendulum.datetime(2026, 3, 9, 12, 0, tz="UTC")


def main(out: Path) -> int:
    from dag_helpers import JobStandIn, N, live_assignment, load_dag, run_dag, seed_interval, traffic

    from rebalance.control.inputs import spark_session
    from rebalance.spark import tables
    from rebalance.spark.plan_store import PlanStore

    spark = spark_session()
    sc = spark.sparkContext
    try:
        tables.create_assignments(spark, N)
        di = seed_interval(spark, load_dag(), LOGICAL_DATE, traffic(skewed=True))
        with JobStandIn(spark, di.end, traffic(skewed=True)):
            dr, states = run_dag(load_dag(), LOGICAL_DATE, {"method": "milp"})
        plans = PlanStore(spark).plans()
        live = live_assignment(spark)
        report = {
            "master": sc.master, "app_id": sc.applicationId, "app_name": sc.appName,
            "run_state": str(getattr(dr.state, "value", dr.state)), "states": states,
            "plans": [{"status": p.status, "version": p.assignment_version} for p in plans],
            "live_version": live.version, "live_routing_size": len(live.routing),
            "executors": sorted(f"{e.host()}:{e.port()}"  # the driver's entry included
                                for e in sc._jsc.sc().statusTracker().getExecutorInfos()),
        }
    finally:
        spark.stop()
    out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
