"""A class-data archive for the project's Spark JVMs: each starts in about 2/3 of the time.

A Spark JVM spends most of its start loading, parsing and verifying thousands of classes
of the pyspark wheel's JARs, and its first Delta write loads thousands more. Java's
application class-data sharing (AppCDS, JDK 13+) keeps those classes, already parsed and
verified, in an archive that every later JVM maps from the file. ``make setup`` builds the
archive once (:func:`rebalance.ops.cds.build`): a short run of the keyed job on Delta
(events appended, the job's micro-batches with their RocksDB state, histograms written,
tables read back) with ``-XX:ArchiveClassesAtExit``; at its exit the JVM writes every
class it loaded from the JDK and the wheel's JARs.

Every Spark JVM the project starts then maps it (:func:`java_options`): the drivers of
:func:`rebalance.spark.session.get_spark` (jobs, CLI commands, tests), the Spark Connect
server of ``make up``, and the standalone cluster's master, workers and executors.
Measured on this 2-core machine (docs/benchmarks.md): a fresh process's session and first
Delta write take 7.7 s instead of 11.8 s (medians).

The archive is only valid for the Java build and the wheel's JARs it was made with. Its
file name carries a fingerprint of both (:func:`fingerprint`), so a changed Java or
pyspark finds no archive (and ``make setup`` builds a new one) instead of one the JVM
would refuse. A JVM refuses an archive it cannot use anyway and starts without it (its
warning is silenced): the archive only ever changes how fast a JVM starts, never what it
does. ``REBALANCE_CDS=0`` turns it off.

:mod:`rebalance.ops.cds` builds it (``python -m rebalance.cli.cds``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from rebalance.spark.java import ensure_java_home
from rebalance.spark.paths import jars_dir

#: Set in the environment of the run that writes the archive: the file to write.
DUMP_ENV = "REBALANCE_CDS_DUMP"
#: ``0`` / ``false`` / ``no``: start every JVM without the archive.
SWITCH_ENV = "REBALANCE_CDS"
#: The JVM options that silence the warning of an archive it refuses (it then runs without).
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def spark_home() -> Path:
    """The pyspark wheel's folder (its ``jars``): ``$SPARK_HOME`` under ``spark-submit``,
    whose Python imports pyspark from a zip inside it."""
    home = os.environ.get("SPARK_HOME")
    if home and (Path(home) / "jars").is_dir():
        return Path(home)
    import pyspark

    return Path(pyspark.__file__).parent


def fingerprint(java: Path | None = None, spark: Path | None = None) -> str:
    """16 hex digits naming the Java build and the wheel's JARs an archive is valid for."""
    java = java or ensure_java_home() or Path(os.environ.get("JAVA_HOME", "/nonexistent"))
    spark = spark or spark_home()
    h = hashlib.sha256()
    h.update(str(Path(java).resolve()).encode())
    for name in ("release", "lib/server/libjvm.so", "bin/java"):
        try:
            st = (Path(java) / name).resolve().stat()
            h.update(f"{name}:{st.st_size}:{st.st_mtime_ns}".encode())
        except OSError:
            h.update(f"{name}:-".encode())
    jars = spark / "jars"
    for jar in sorted(jars.glob("*.jar")) if jars.is_dir() else []:
        st = jar.stat()
        h.update(f"{jar.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def archive_path() -> Path:
    """Where the archive for this Java and pyspark lives (it may not exist yet)."""
    return jars_dir() / "cds" / f"spark-{fingerprint()}.jsa"


def enabled() -> bool:
    return os.environ.get(SWITCH_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def java_options() -> str:
    """The options that make a Spark JVM map the archive ("" when there is none, or while
    the archive itself is being written: that JVM gets ``-XX:ArchiveClassesAtExit``)."""
    dump = os.environ.get(DUMP_ENV)
    if dump:
        return f"-XX:ArchiveClassesAtExit={dump} {QUIET}"
    if not enabled():
        return ""
    path = archive_path()
    return f"-XX:SharedArchiveFile={path} {QUIET}" if path.is_file() else ""
