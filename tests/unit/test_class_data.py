"""The class-data archive's options and name (rebalance.spark.class_data), without a JVM.

That the JVMs really map the archive is checked where they run: the session's driver
(tests/integration/test_foundation.py), the service's Spark Connect server and job
(test_service.py), the cluster's master, workers and executors (test_cluster.py).
"""

from __future__ import annotations

import pytest

from rebalance.spark import class_data


@pytest.fixture()
def jars(monkeypatch, tmp_path):
    monkeypatch.setenv("REBALANCE_JARS_DIR", str(tmp_path))
    monkeypatch.delenv(class_data.DUMP_ENV, raising=False)
    monkeypatch.delenv(class_data.SWITCH_ENV, raising=False)
    monkeypatch.setattr(class_data, "fingerprint", lambda: "0123456789abcdef")
    return tmp_path


def test_no_archive_no_option_and_the_jvm_keeps_its_own_sharing(jars):
    # -XX:SharedArchiveFile naming a missing file would turn off the JDK's base archive too.
    assert class_data.archive_path() == jars / "cds" / "spark-0123456789abcdef.jsa"
    assert class_data.java_options() == ""


def test_an_archive_in_place_is_mapped_with_its_warning_silenced(jars, monkeypatch):
    path = class_data.archive_path()
    path.parent.mkdir()
    path.write_bytes(b"x")
    assert class_data.java_options() == f"-XX:SharedArchiveFile={path} {class_data.QUIET}"
    monkeypatch.setenv(class_data.SWITCH_ENV, "0")
    assert class_data.java_options() == ""


def test_the_run_that_writes_the_archive_gets_the_dump_option(jars, monkeypatch):
    monkeypatch.setenv(class_data.DUMP_ENV, "/tmp/x.jsa")
    assert class_data.java_options().startswith("-XX:ArchiveClassesAtExit=/tmp/x.jsa ")


def _homes(tmp_path):
    java, spark = tmp_path / "java", tmp_path / "spark"
    (java / "bin").mkdir(parents=True)
    (java / "bin" / "java").write_text("#!/bin/sh\n")
    (java / "release").write_text('JAVA_VERSION="17.0.15"\n')
    (spark / "jars").mkdir(parents=True)
    (spark / "jars" / "spark-core.jar").write_bytes(b"a" * 10)
    return java, spark


def test_the_name_changes_with_the_java_build_or_a_jar_of_the_wheel(tmp_path):
    java, spark = _homes(tmp_path)
    first = class_data.fingerprint(java, spark)
    assert first == class_data.fingerprint(java, spark) and len(first) == 16
    (spark / "jars" / "spark-core.jar").write_bytes(b"b" * 11)
    second = class_data.fingerprint(java, spark)
    assert second != first
    (java / "release").write_text('JAVA_VERSION="17.0.16"\n')
    assert class_data.fingerprint(java, spark) not in (first, second)


def test_the_session_conf_maps_the_archive_in_driver_and_executors(jars):
    from rebalance.spark.session import session_conf

    path = class_data.archive_path()
    path.parent.mkdir()
    path.write_bytes(b"x")
    (jars / "delta-spark_4.2_2.13-4.4.0.jar").write_bytes(b"")
    conf = session_conf("t", submitted={"spark.executor.extraJavaOptions": "-Dmine=1"})
    assert f"-XX:SharedArchiveFile={path}" in conf["spark.driver.extraJavaOptions"]
    assert conf["spark.executor.extraJavaOptions"] == f"{class_data.java_options()} -Dmine=1"
    path.unlink()
    conf = session_conf("t", submitted={"spark.executor.extraJavaOptions": "-Dmine=1"})
    assert "SharedArchiveFile" not in conf["spark.driver.extraJavaOptions"]
    assert conf["spark.executor.extraJavaOptions"] == "-Dmine=1"


def _fake_java(tmp_path, script: str):
    home = tmp_path / "venv" / "java"
    (home / "lib" / "server").mkdir(parents=True)
    (home / "lib" / "server" / "libjvm.so").write_bytes(b"")
    (home / "bin").mkdir()
    (home / "bin" / "java").write_text("#!/bin/sh\n" + script)
    (home / "bin" / "java").chmod(0o755)
    return home, home / "lib" / "server" / "classes.jsa"


def test_a_java_of_the_environment_without_the_jdks_archive_gets_one(tmp_path):
    from rebalance.ops.class_data import ensure_base_archive

    home, base = _fake_java(tmp_path, '[ "$1" = "-Xshare:dump" ] && '
                                      'echo base > "$(dirname "$0")/../lib/server/classes.jsa"\n')
    # the machine's Java (outside the environment) is never written to
    assert not ensure_base_archive(home, owned=tmp_path / "elsewhere", out=lambda _: None)
    assert not base.exists()
    said = []
    assert ensure_base_archive(home, owned=tmp_path / "venv", out=said.append)
    assert base.read_text() == "base\n" and said == [f"the JDK's class-data archive: {base}"]
    assert ensure_base_archive(home, owned=tmp_path / "elsewhere")  # in place: nothing to do
    assert not ensure_base_archive(None)


def test_a_java_that_cannot_write_the_jdks_archive_is_left_as_it_is(tmp_path):
    from rebalance.ops.class_data import ensure_base_archive

    home, base = _fake_java(tmp_path, "exit 1\n")
    assert not ensure_base_archive(home, owned=tmp_path / "venv", out=lambda _: None)
    (home / "bin" / "java").unlink()
    assert not ensure_base_archive(home, owned=tmp_path / "venv", out=lambda _: None)
    assert not base.exists()
