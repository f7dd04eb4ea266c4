"""The class-data archive of the project's Spark JVMs: its name and the options that map it.

Java's application class-data sharing (AppCDS) keeps the classes a Spark JVM loads at
start, already parsed and verified, in an archive later JVMs map from the file: each starts
in about two thirds of the time. Every Spark JVM the project starts takes
:func:`java_options`; the archive's name carries a :func:`fingerprint` of the Java build and
the pyspark JARs it is valid for, and a JVM that cannot use it starts without it.
``REBALANCE_CDS=0`` turns it off. :mod:`rebalance.ops.class_data` builds it (``python -m
rebalance.cli.class_data``, run by ``make setup``). In full: ``docs/cluster.md``, "The JVMs'
class-data archive"; the figures: ``docs/benchmarks.md``, "JVM start".
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
