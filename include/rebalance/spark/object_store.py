"""Tables on an S3-compatible object store (``s3a://bucket/folder``), for both engines.

The store is the registry's ``[service.object_store]`` (endpoint, region, path-style
addressing); credentials come from the environment (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``), which Spark's S3A connector, delta-rs
and Arrow all read. From it: delta-rs' ``storage_options``, an Arrow file system for the
log listings of :mod:`rebalance.spark.delta_rs`, and Spark's ``fs.s3a.*`` settings plus
the S3A JARs (``.jars/s3a``, fetched by ``make setup``) as ``local:`` entries of
``spark.jars`` (not copied into every application's folder: the AWS SDK is 700 MB; and
behind Spark's own JARs, whose SLF4J the SDK's would hide on the class path), only when
a job of the registry keeps its tables there. Fields: ``docs/registry.md``.
"""

from __future__ import annotations

from pathlib import Path

from rebalance.core import registry
from rebalance.spark.paths import jars_dir, local_path

#: URI schemes of the object store (Spark writes ``s3a``; delta-rs reads both).
SCHEMES = ("s3a", "s3")


def is_object_store(path: str | Path) -> bool:
    return str(path).partition("://")[0] in SCHEMES and "://" in str(path)


def _store(reg: registry.Registry | None = None) -> registry.ObjectStore:
    return (reg or registry.load()).service.object_store


def storage_options(path: str | Path) -> dict[str, str] | None:
    """delta-rs' options for a table at ``path``: None for a local one."""
    if not is_object_store(path):
        return None
    store = _store()
    options = {"AWS_REGION": store.region,
               "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false" if store.path_style else "true"}
    if store.endpoint:
        options["AWS_ENDPOINT_URL"] = store.endpoint
    if store.allow_http:
        options["AWS_ALLOW_HTTP"] = "true"
    return options


def filesystem(path: str | Path):
    """(Arrow file system, the path in it) of a local folder or an object-store URI."""
    import pyarrow.fs as pafs

    folder = local_path(path)
    if folder is not None:
        return pafs.LocalFileSystem(), str(folder)
    store = _store()
    kwargs = {"region": store.region, "force_virtual_addressing": not store.path_style}
    if store.endpoint:
        scheme, _, host = store.endpoint.partition("://")
        kwargs.update(endpoint_override=host, scheme=scheme)
    return pafs.S3FileSystem(**kwargs), str(path).partition("://")[2].rstrip("/")


def in_use(reg: registry.Registry | None = None) -> bool:
    """Whether a job of the registry (default: :func:`registry.load`) keeps its tables on
    the object store."""
    return any(is_object_store(job.tables) for job in (reg or registry.load()).jobs)


def spark_settings(reg: registry.Registry | None = None) -> dict[str, str]:
    """Spark settings for the object store: the S3A JARs (``spark.jars``, to be joined to
    the session's others) and ``spark.hadoop.fs.s3a.*``; empty when no job uses it."""
    if not in_use(reg):
        return {}
    jars = sorted((jars_dir() / "s3a").glob("*.jar"))
    if not jars:
        raise FileNotFoundError(f"tables on the object store need the S3A JARs, and "
                                f"{jars_dir() / 's3a'} has none: run `make setup`")
    store = _store(reg)
    settings = {"spark.jars": ",".join(f"local:{j}" for j in jars),
                "spark.hadoop.fs.s3a.endpoint.region": store.region,
                "spark.hadoop.fs.s3a.path.style.access": str(store.path_style).lower()}
    if store.endpoint:
        settings["spark.hadoop.fs.s3a.endpoint"] = store.endpoint
        settings["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(
            not store.allow_http).lower()
    return settings
