"""Shared fixtures. Environment defaults are set before Airflow or Spark import."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("AIRFLOW_HOME", str(REPO / ".airflow"))
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(REPO / "dags"))
os.environ.setdefault("AIRFLOW__CORE__PLUGINS_FOLDER", str(REPO / "plugins"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "False")
# py4j logs at interpreter exit, after pytest closed its capture streams.
logging.getLogger("py4j").setLevel(logging.WARNING)
os.environ.setdefault("REBALANCE_SPARK_CONF", "spark.ui.enabled=false;spark.sql.shuffle.partitions=4")


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """One local Spark session (with Delta) for the whole test run."""
    from rebalance.spark.session import get_spark

    os.environ.setdefault("REBALANCE_DATA_DIR", str(tmp_path_factory.mktemp("data")))
    session = get_spark("rebalance-tests", master="local[2]")
    yield session
    session.stop()
