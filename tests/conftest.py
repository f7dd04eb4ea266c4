"""Shared fixtures. Environment defaults are set before Airflow or Spark import."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
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
# Every process the tests start inherits this id (tests/reaper.py stops what carries it
# once the test session is gone); xdist's workers inherit the controller's.
os.environ.setdefault("REBALANCE_TEST_SESSION", uuid.uuid4().hex)
# py4j logs at interpreter exit, after pytest closed its capture streams.
logging.getLogger("py4j").setLevel(logging.WARNING)
# Test-sized Spark: no UI, 4 shuffle partitions, and Delta's table state rebuilt in one
# partition instead of 50 (the service sets 2). Every idempotent append rebuilds it
# (include/benchmarks/delta_append_benchmark.py: 0.44 s per small append with 1, 0.52 s
# with 2, 0.16 s without the transaction id).
os.environ.setdefault("REBALANCE_SPARK_CONF", "spark.ui.enabled=false;spark.sql.shuffle.partitions=4;"
                      "spark.databricks.delta.snapshotPartitions=1")


#: Heap of the test session's driver (see :func:`spark`).
TEST_SESSION_HEAP = "3g"


def pytest_configure(config):
    """One reaper per test session (in the controller under xdist): when this process is
    gone, whatever the tests started and no teardown stopped is killed (tests/reaper.py)."""
    if hasattr(config, "workerinput"):
        return
    env = {k: v for k, v in os.environ.items() if k != "REBALANCE_TEST_SESSION"}
    subprocess.Popen([sys.executable, str(REPO / "tests" / "reaper.py"), str(os.getpid()),
                      os.environ["REBALANCE_TEST_SESSION"]], env=env, stdin=subprocess.DEVNULL,
                     start_new_session=True)


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """One local Spark session (with Delta) for the whole test run.

    Its driver gets 3 GiB of heap instead of Spark's default 1 GiB: the session serves
    every in-process integration test, and what Spark and Delta keep of the hundreds of
    tables and queries of a whole run (query plans, table snapshots) filled 1 GiB. A
    fresh-clone run measured the old generation 99 % full and 168 s of full GCs by the
    restart scenario, with the GC threads taking more CPU than the work."""
    from rebalance.spark.session import get_spark

    os.environ.setdefault("REBALANCE_DATA_DIR", str(tmp_path_factory.mktemp("data")))
    session = get_spark("rebalance-tests", master="local[2]",
                        conf={"spark.driver.memory": TEST_SESSION_HEAP})
    yield session
    session.stop()
    _stop_gateway_jvm()


def _stop_gateway_jvm(timeout: float = 60.0) -> None:
    """The in-process session's JVM exits when its stdin closes (pyspark's gateway: it
    dies with its Python process). Closed and waited for here, so the JVM does not outlive
    the test session (the reaper found it still shutting down after every run before)."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    gateway.shutdown()
    SparkContext._gateway = SparkContext._jvm = None
    if proc is not None:
        proc.stdin.close()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            logging.getLogger(__name__).warning("the session's JVM did not exit within %.0f s "
                                                "of its gateway closing: killed", timeout)


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


@pytest.fixture(autouse=True, scope="module")
def _no_query_left_running():
    """After each module: no streaming query of the in-process Spark session may still
    run (one left would take CPU from every module after it). Stopped, then reported."""
    yield
    if "pyspark" not in sys.modules:
        return
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    left = [] if session is None else session.streams.active
    for query in left:
        query.stop()
    assert not left, f"streaming queries left running: {[q.name or q.id for q in left]}"


def _uses_service(item) -> bool:
    """Does any test of ``item``'s module use the shared service stack?"""
    return any("service" in other.fixturenames
               for other in item.session.items if other.path == item.path)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After the last test of a run of modules that use the shared service stack (and
    their module fixtures' teardown), stop it: its session-scoped fixture would otherwise
    keep it, and its streaming job, running through every module after them."""
    result = yield
    helpers = sys.modules.get("service_helpers")
    if (helpers is not None and "service" in item.fixturenames
            and (nextitem is None or not _uses_service(nextitem))):
        helpers.release_shared_stack()
    return result


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(TEST_AIRFLOW_HOME, ignore_errors=True)


# Seconds each slow module took in a serial fresh-clone run (docs/testing.md), rounded.
# Under pytest-xdist (`make test` runs two workers, --dist loadfile) a module runs whole in
# one worker, so its scenario (a module-scoped fixture) is set up once; modules are handed
# out in collection order, so the longest go first and the short ones and the unit tests
# fill the gaps at the end (longest processing time first). A module missing here counts
# as short; a wrong figure only costs balance, never a test.
MODULE_SECONDS = {
    "test_faults.py": 680, "test_restart.py": 570, "test_service.py": 540,
    "test_service_faults.py": 520, "test_cluster.py": 420, "test_streaming.py": 220,
    "test_kafka.py": 210, "test_kafka_restart.py": 170, "test_dedup_restart.py": 136,
    "test_dag.py": 120, "test_maintenance_spark.py": 110, "test_apply_cli.py": 87,
    "test_approval.py": 65, "test_dag_backtest.py": 50, "test_job_capability.py": 75,
    "test_rebalanced_api.py": 360, "test_object_store.py": 80,
}
#: Modules that share a session-scoped resource run in one worker, one after the other:
#: the service stack (about 90 s to start; two at once would share two cores) and the
#: Kafka broker.
SHARED_GROUPS = {
    "test_service.py": "service-stack", "test_service_faults.py": "service-stack",
    "test_kafka.py": "kafka-broker", "test_kafka_restart.py": "kafka-broker",
}


def _group(nodeid: str) -> str:
    """The unit of work of a test under xdist: its module, or its modules' shared group."""
    path = nodeid.split("::", 1)[0]
    return SHARED_GROUPS.get(Path(path).name, path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile, with :data:`SHARED_GROUPS` as one unit each. (xdist's own loadgroup
    marks do not work on pytest 9.2: xdist renames ``item._nodeid``, which pytest 9.2 no
    longer reads.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return ModuleGroups(config, log)


def pytest_collection_modifyitems(config, items):
    if not hasattr(config, "workerinput"):      # serial run: keep the files' order
        return
    first: dict[str, int] = {}
    modules: dict[str, set] = {}
    for i, item in enumerate(items):
        group = _group(item.nodeid)
        first.setdefault(group, i)
        modules.setdefault(group, set()).add(item.path.name)
    cost = {g: sum(MODULE_SECONDS.get(m, 0) for m in names) for g, names in modules.items()}
    # stable: the tests of a group keep their order; the longest groups first
    items.sort(key=lambda item: (-cost[_group(item.nodeid)], first[_group(item.nodeid)]))
