"""The foundation really runs: Spark + Delta, Airflow DAG loading, the CLI entry point."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_delta_round_trip_with_commit_metadata(spark, tmp_path):
    from rebalance.control.healthcheck import delta_round_trip

    result = delta_round_trip(tmp_path / "table", spark=spark)
    assert result.rows == 20
    assert result.versions == [0, 1]
    assert result.user_metadata == [
        {"check": "delta_round_trip", "step": 0},
        {"check": "delta_round_trip", "step": 1},
    ]


@pytest.mark.slow
def test_session_factory_configuration(spark):
    conf = spark.sparkContext.getConf()
    assert spark.conf.get("spark.sql.extensions") == "io.delta.sql.DeltaSparkSessionExtension"
    assert spark.conf.get("spark.sql.streaming.stateStore.providerClass").endswith(
        "RocksDBStateStoreProvider")
    assert conf.get("spark.pyspark.python") == sys.executable
    assert any("delta-spark" in j for j in conf.get("spark.jars").split(","))
    # the JVM keeps 1000 generated classes, not Spark's 100 (a static conf: set at start)
    assert spark.conf.get("spark.sql.codegen.cache.maxEntries") == "1000"
    # the test session's driver heap (tests/conftest.py): 3 GiB, not Spark's default 1 GiB
    max_heap = spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory()
    assert max_heap > 2.5 * 2**30, max_heap


def test_session_conf_precedence(monkeypatch):
    from rebalance.spark.session import session_conf

    monkeypatch.setenv("REBALANCE_SPARK_CONF", "spark.sql.shuffle.partitions=7;spark.x=env")
    monkeypatch.setenv("REBALANCE_SPARK_MASTER", "local[3]")
    submitted = {"spark.master": "yarn", "spark.x": "submit", "spark.y": "submit"}
    conf = session_conf("t", conf={"spark.x": "arg"}, submitted=submitted)
    assert conf["spark.sql.shuffle.partitions"] == "7"
    assert conf["spark.x"] == "arg"
    assert conf["spark.y"] == "submit"
    assert conf["spark.master"] == "local[3]"
    assert session_conf("t", master="local[1]", submitted={})["spark.master"] == "local[1]"
    monkeypatch.delenv("REBALANCE_SPARK_MASTER")
    assert session_conf("t", submitted=submitted)["spark.master"] == "yarn"
    assert session_conf("t", submitted={})["spark.master"] == "local[*]"
    # the code-generation cache: ours unless spark-submit or the environment says otherwise
    assert session_conf("t", submitted={})["spark.sql.codegen.cache.maxEntries"] == "1000"
    mine = {"spark.sql.codegen.cache.maxEntries": "300"}
    assert session_conf("t", submitted=mine)["spark.sql.codegen.cache.maxEntries"] == "300"


def test_session_conf_errors(monkeypatch, tmp_path):
    from rebalance.spark.session import SparkSetupError, session_conf

    monkeypatch.setenv("REBALANCE_SPARK_CONF", "no-equals-sign")
    with pytest.raises(SparkSetupError, match="not of the form key=value"):
        session_conf("t", submitted={})
    monkeypatch.delenv("REBALANCE_SPARK_CONF")
    monkeypatch.setenv("REBALANCE_JARS_DIR", str(tmp_path / "empty"))
    with pytest.raises(SparkSetupError, match="make jars"):
        session_conf("t", submitted={})
    monkeypatch.setenv("REBALANCE_SPARK_PACKAGES", "1")
    conf = session_conf("t", submitted={})
    assert "io.delta:delta-spark_4.2_2.13" in conf["spark.jars.packages"]


@pytest.mark.slow
def test_airflow_loads_every_dag_without_import_errors():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    dag_files = {p.name for p in (REPO / "dags").glob("*.py")}
    assert {Path(d.fileloc).name for d in bag.dags.values()} == dag_files


def test_rebalance_help_runs_as_a_command():
    exe = Path(sys.executable).with_name("rebalance")
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60,
                         env={**os.environ})
    assert out.returncode == 0, out.stderr
    assert "plan" in out.stdout


@pytest.mark.slow
def test_the_session_jvm_maps_the_class_data_archive(spark):
    from class_data_checks import jvms, maps_archive

    pid = spark.sparkContext._gateway.proc.pid
    assert jvms([pid]) == {pid: "org.apache.spark.deploy.SparkSubmit"}
    assert maps_archive(pid)
