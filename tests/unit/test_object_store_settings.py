"""The object store's settings for both engines (``rebalance.spark.object_store``), read
from a registry whose job keeps its tables on ``s3a://``: delta-rs' options, Arrow's file
system, Spark's settings and JARs, and what the service's Spark Connect server and a
session get. (The tables themselves on a real S3 server: ``test_object_store.py``.)"""

from __future__ import annotations

import pyarrow.fs as pafs
import pytest

from rebalance.core import registry
from rebalance.spark import object_store

S3_REGISTRY = """
[service.object_store]
endpoint = "http://127.0.0.1:9000"
region = "eu-west-1"

[jobs.keyed]
dag_id = "rebalance"
tables = "tables"

[jobs.clicks]
app = "sessions"
tables = "s3a://team-tables/jobs/clicks"
"""


@pytest.fixture()
def s3_registry(tmp_path, monkeypatch):
    path = tmp_path / "rebalance.toml"
    path.write_text(S3_REGISTRY)
    monkeypatch.setenv("REBALANCE_REGISTRY", str(path))
    jars = tmp_path / "jars"
    (jars / "s3a").mkdir(parents=True)
    for name in ("hadoop-aws-3.5.0.jar", "bundle-2.35.4.jar"):
        (jars / "s3a" / name).write_bytes(b"")
    monkeypatch.setenv("REBALANCE_JARS_DIR", str(jars))
    return registry.load(path), jars


def test_delta_rs_options_and_arrow_file_system_follow_the_registry(s3_registry):
    assert object_store.storage_options("/data/tables/plans") is None
    assert object_store.storage_options("s3a://team-tables/jobs/clicks/plans") == {
        "AWS_REGION": "eu-west-1", "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ALLOW_HTTP": "true"}
    fs, base = object_store.filesystem("s3a://team-tables/jobs/clicks/plans/")
    assert isinstance(fs, pafs.S3FileSystem) and base == "team-tables/jobs/clicks/plans"
    assert fs.region == "eu-west-1"
    fs, base = object_store.filesystem("file:///data/tables/plans")
    assert isinstance(fs, pafs.LocalFileSystem) and base == "/data/tables/plans"


def test_spark_gets_the_s3a_jars_and_settings_only_when_a_job_is_on_the_store(s3_registry,
                                                                             tmp_path):
    reg, jars = s3_registry
    settings = object_store.spark_settings()
    assert settings["spark.jars"] == ",".join(
        f"local:{jars / 's3a' / n}" for n in ("bundle-2.35.4.jar", "hadoop-aws-3.5.0.jar"))
    assert (settings["spark.hadoop.fs.s3a.endpoint"],
            settings["spark.hadoop.fs.s3a.endpoint.region"],
            settings["spark.hadoop.fs.s3a.path.style.access"],
            settings["spark.hadoop.fs.s3a.connection.ssl.enabled"]) == (
        "http://127.0.0.1:9000", "eu-west-1", "true", "false")
    local = registry.parse({"jobs": {"keyed": {}}}, tmp_path / "x.toml")
    assert object_store.spark_settings(local) == {} and not object_store.in_use(local)


def test_a_session_and_the_connect_server_take_them_behind_the_delta_jars(s3_registry,
                                                                          tmp_path):
    from rebalance.ops.service import Settings, _connect_server
    from rebalance.spark.session import session_conf

    reg, jars = s3_registry
    (jars / "delta-spark_4.2_2.13-4.4.0.jar").write_bytes(b"")
    conf = session_conf("t", master="local[1]", submitted={})
    assert conf["spark.jars"].split(",")[0] == str(jars / "delta-spark_4.2_2.13-4.4.0.jar")
    assert conf["spark.jars"].endswith("local:" + str(jars / "s3a" / "hadoop-aws-3.5.0.jar"))
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    s = Settings(data=tmp_path / "data", airflow_home=tmp_path / "airflow", registry=reg)
    argv = _connect_server(s, {}).argv
    assert argv[argv.index("--jars") + 1].split(",") == [
        str(jars / "delta-spark_4.2_2.13-4.4.0.jar"),
        *(f"local:{jars / 's3a' / n}" for n in ("bundle-2.35.4.jar", "hadoop-aws-3.5.0.jar"))]
    assert "spark.hadoop.fs.s3a.endpoint=http://127.0.0.1:9000" in argv
