"""Shared fixtures. Environment defaults are set before Airflow or Spark import."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The tests run Airflow in a home of their own, never the user's .airflow (whose UI shows
# the user's runs): a fresh folder per test session, its database migrated on first use.
TEST_AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="rebalance-test-airflow-"))
os.environ["AIRFLOW_HOME"] = str(TEST_AIRFLOW_HOME)
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(REPO / "dags"))
os.environ.setdefault("AIRFLOW__CORE__PLUGINS_FOLDER", str(REPO / "plugins"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "False")
# py4j logs at interpreter exit, after pytest closed its capture streams.
logging.getLogger("py4j").setLevel(logging.WARNING)
# Test-sized Spark: no UI, 4 shuffle partitions, and Delta log checkpoints of 2 partitions
# instead of 50 (the service's own setting; every tenth commit writes one).
os.environ.setdefault("REBALANCE_SPARK_CONF", "spark.ui.enabled=false;spark.sql.shuffle.partitions=4;"
                      "spark.databricks.delta.snapshotPartitions=2")


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """One local Spark session (with Delta) for the whole test run."""
    from rebalance.spark.session import get_spark

    os.environ.setdefault("REBALANCE_DATA_DIR", str(tmp_path_factory.mktemp("data")))
    session = get_spark("rebalance-tests", master="local[2]")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def airflow_db():
    """The test session's Airflow home with a migrated SQLite database (about 5 s, once)."""
    marker = TEST_AIRFLOW_HOME / ".initialised"
    if not marker.exists():
        airflow = str(Path(sys.executable).with_name("airflow"))
        done = subprocess.run([airflow, "db", "migrate"], capture_output=True, text=True,
                              env=dict(os.environ))
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        marker.touch()
    return TEST_AIRFLOW_HOME


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    """One single-node Kafka broker (KRaft) on free ports of 127.0.0.1 for the whole test
    run (a JVM start each time otherwise); stopped at the end, both ports checked closed.
    Each test uses a topic of its own."""
    sys.path.insert(0, str(REPO / "tests" / "integration"))
    from service_helpers import running_broker

    with running_broker(tmp_path_factory.mktemp("kafka")) as broker:
        yield broker


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(TEST_AIRFLOW_HOME, ignore_errors=True)


# Seconds each slow module took in a serial fresh-clone run (docs/testing.md), rounded.
# Under pytest-xdist (`make test` runs two workers, whole modules each: --dist loadfile)
# modules are handed out in collection order, so the longest go first and the short ones
# and the unit tests fill the gaps at the end (longest processing time first). A module
# missing here counts as short; a wrong figure only costs balance, never a test.
MODULE_SECONDS = {
    "test_faults.py": 680, "test_restart.py": 570, "test_service.py": 540,
    "test_service_faults.py": 520, "test_cluster.py": 420, "test_streaming.py": 220,
    "test_kafka.py": 210, "test_kafka_restart.py": 170, "test_dedup_restart.py": 136,
    "test_dag.py": 120, "test_maintenance_spark.py": 110, "test_apply_cli.py": 87,
    "test_approval.py": 65, "test_dag_backtest.py": 50,
}


def pytest_collection_modifyitems(config, items):
    if not hasattr(config, "workerinput"):      # serial run: keep the files' order
        return
    rank = {}
    for i, item in enumerate(items):
        rank.setdefault(item.path, (-MODULE_SECONDS.get(item.path.name, 0), i))
    items.sort(key=lambda item: rank[item.path])  # stable: tests keep their order in a module
