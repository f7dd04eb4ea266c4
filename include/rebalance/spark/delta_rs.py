"""Delta tables through delta-rs, in the calling process: no JVM, no Spark job.

The control plane's many small reads (a plan's record, the lease, the newest assignment, a
table's history, a few windows) take milliseconds here instead of a Spark job each. Writes
to tables without writer features (``events``, ``plans``, ``plan_assignments``,
``control``) can go through :func:`append` and :func:`update` with the commit metadata and
transaction id a Spark write carries; ``assignments`` and the streaming job stay on Spark.
A read sees one committed snapshot (the newest, or ``version``), with TIMESTAMP columns as
naive UTC datetimes like Spark's ``toPandas()``; tables are local folders, ``file://``
URIs or ``s3a://`` URIs of the object store (:mod:`rebalance.spark.object_store`). Why
and which engine does what: ``docs/streaming.md``, "Tables" (two engines).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from rebalance.spark import object_store
from rebalance.spark.paths import local_path


@dataclass(frozen=True)
class Commit:
    """One entry of a table's Delta history: ``metadata`` is its userMetadata (parsed),
    ``metrics`` its ``operationMetrics`` as logged (Spark writes the numbers as strings)."""

    version: int
    timestamp: datetime
    operation: str
    metadata: dict[str, Any]
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)


class DeltaRsError(RuntimeError):
    """A table delta-rs cannot read, or append to as asked (naming the path and the reason)."""


def local(path: str | Path) -> Path | None:
    """The folder of a local table path or ``file://`` URI, None for another URI."""
    return local_path(path)


def readable(path: str | Path) -> bool:
    """Whether delta-rs reads and writes a table here: a local folder, a ``file://`` URI
    or the object store's ``s3a://``."""
    return local(path) is not None or object_store.is_object_store(path)


def location(path: str | Path) -> str:
    """The table's location as delta-rs takes it (a folder, or the URI)."""
    if not readable(path):
        raise ValueError(f"not a table path delta-rs reads (a folder, file:// or s3a://): "
                         f"{path}")
    folder = local(path)
    return str(folder) if folder is not None else str(path).rstrip("/")


def _log(path: str | Path):
    """The ``_delta_log`` folder's entries (Arrow ``FileInfo``, in listing order); None when
    there is no such folder. One listing, local or on the object store."""
    import pyarrow.fs as pafs

    location(path)  # refuses a URI it cannot read
    fs, base = object_store.filesystem(path)
    log = f"{base}/_delta_log"
    if fs.get_file_info(log).type != pafs.FileType.Directory:
        return None
    return fs.get_file_info(pafs.FileSelector(log, allow_not_found=True))


def _read_log_file(path: str | Path, name: str) -> str:
    """The text of one file of the table's ``_delta_log`` (OSError when it is absent)."""
    location(path)  # refuses a URI it cannot read
    fs, base = object_store.filesystem(path)
    with fs.open_input_stream(f"{base}/_delta_log/{name}") as stream:
        return stream.read().decode("utf-8")


def _versions(entries) -> dict[int, Any]:
    """Commit version -> its ``NNNN.json`` entry."""
    out = {}
    for entry in entries or []:
        name = entry.base_name
        if len(name) == 25 and name.endswith(".json") and name[:20].isdigit():
            out[int(name[:20])] = entry
    return out


def exists(path: str | Path) -> bool:
    """Whether the location holds a Delta table (a commit in its ``_delta_log``): one
    listing."""
    return bool(_versions(_log(path)))


def has_log(path: str | Path) -> bool:
    """Whether the location has a ``_delta_log`` folder: a Delta table, or one whose first
    commit is still to come (:func:`exists` asks for a commit)."""
    return readable(path) and _log(path) is not None


def table(path: str | Path, version: int | None = None):
    """The ``deltalake.DeltaTable`` at ``version`` (default: newest), None when the table
    does not exist; :class:`DeltaRsError` when its log cannot be read."""
    from deltalake import DeltaTable

    if not exists(path):
        return None
    try:
        return DeltaTable(location(path), version=version,
                          storage_options=object_store.storage_options(path))
    except Exception as exc:  # noqa: BLE001 - delta-rs raises several kinds for a bad log
        raise DeltaRsError(f"{path}: {_first_line(exc)}") from None


def columns(path: str | Path) -> list[str]:
    """The table's column names (empty when it does not exist)."""
    t = table(path)
    return [] if t is None else _names(t)


def _names(t) -> list[str]:
    return list(pa.schema(t.schema().to_arrow()).names)


# ------------------------------------------------------------ has the table changed
def commit_versions(table_path: str | Path) -> list[int]:
    """The commit versions in a Delta table's log folder (``NNNN.json`` files), from file
    names alone (one listing, no Spark job); none for a location without a log."""
    return list(_versions(_log(table_path)))


def log_ident(table_path: str | Path) -> tuple[int, int] | None:
    """(newest commit version, its file's modification time in ns) of a Delta table:
    changes with every commit, and tells a table created again from the one it replaced.
    None for a location with no commit. One listing."""
    versions = _versions(_log(table_path))
    if not versions:
        return None
    newest = max(versions)
    return newest, versions[newest].mtime_ns or 0


def log_version(table_path: str | Path) -> int | None:
    """The newest commit version of a Delta table (:func:`commit_versions`: a poll that
    finds a table unchanged costs one listing); None for a location with no commit."""
    return max(commit_versions(table_path), default=None)


def last_checkpoint(path: str | Path) -> int | None:
    """The version of a table's newest checkpoint, from its ``_last_checkpoint`` marker
    (one small file read); None without one."""
    try:
        return int(json.loads(_read_log_file(path, "_last_checkpoint"))["version"])
    except (OSError, FileNotFoundError):
        return None


def added_files(path: str | Path, version: int) -> list[str]:
    """The data files commit ``version`` of a local table added (its ``add`` actions with
    ``dataChange``; paths as logged, relative to the table), in the order of its log file:
    the order Delta's streaming source numbers a version's files in (its offsets'
    ``index``). :class:`DeltaRsError` when the commit's file cannot be read (removed by
    the log's cleanup)."""
    try:
        lines = _read_log_file(path, f"{int(version):020d}.json").splitlines()
    except OSError as exc:
        raise DeltaRsError(f"{path}: commit {version}: {_first_line(exc)}") from None
    out = []
    for line in lines:
        if not line.strip():
            continue
        add = json.loads(line).get("add")
        if add and add.get("dataChange", True):
            out.append(add["path"])
    return out


def version(path: str | Path) -> int | None:
    """Newest committed version of the table (None when it does not exist)."""
    t = table(path)
    return None if t is None else int(t.version())


def read(path: str | Path, columns: list[str] | None = None, version: int | None = None,
         filters: list[tuple] | None = None) -> pd.DataFrame | None:
    """The table's rows as pandas (those matching ``filters``, DNF tuples such as
    ``[("plan_id", "=", "p1")]``), at ``version`` if given; None when it does not exist.
    TIMESTAMP columns come as naive UTC datetimes, as from Spark's ``toPandas()``."""
    t = table(path, version)
    if t is None:
        return None
    return to_pandas(read_arrow_of(t, columns, filters))


def max_value(path: str | Path, column: str):
    """The largest value of ``column`` in the newest snapshot (None when the table does not
    exist or holds no row), from the files' min/max statistics in the log: no data file is
    read, unless a file has none. TIMESTAMP values come as aware UTC datetimes."""
    import pyarrow.compute as pc

    t = table(path)
    if t is None:
        return None
    actions = pa.table(t.get_add_actions(flatten=True))
    name = f"max.{column}"
    if name in actions.column_names and not actions.column(name).null_count:
        return pc.max(actions.column(name)).as_py() if actions.num_rows else None
    return pc.max(read_arrow_of(t, [column]).column(column)).as_py()


def rows(path: str | Path, columns: list[str] | None = None, version: int | None = None,
         filters: list[tuple] | None = None) -> list[dict[str, Any]]:
    """The rows matching ``filters`` as dicts of Python values (TIMESTAMP values as aware
    UTC datetimes, NULL as None); empty when the table does not exist."""
    t = table(path, version)
    return [] if t is None else read_arrow_of(t, columns, filters).to_pylist()


def read_arrow_of(t, columns: list[str] | None = None,
                  filters: list[tuple] | None = None) -> pa.Table:
    """The rows of an open ``DeltaTable`` as an Arrow table (columns the table lacks are
    left out: a table written before a column was added)."""
    have = set(_names(t)) if columns is not None else None
    cols = None if columns is None else [c for c in columns if c in have]
    from pyarrow.parquet import filters_to_expression

    where = _utc_filters(filters)
    try:
        # In this thread (use_threads=False), so Arrow starts no pool of its own: a pool
        # thread still alive when the process exits can abort it ("terminate called without
        # an active exception", exit code 134), seen once under load. The tables read here
        # are small; a thread pool would not make them faster.
        return t.to_pyarrow_dataset().to_table(
            columns=cols, filter=filters_to_expression(where) if where else None,
            use_threads=False)
    except Exception as exc:  # noqa: BLE001 - a missing or unreadable data file
        raise DeltaRsError(f"{t.table_uri}: {_first_line(exc)}") from None


def _utc_filters(filters: list[tuple] | None) -> list[tuple] | None:
    """Filters with naive datetimes read as UTC (TIMESTAMP columns are UTC in Arrow, and
    Arrow does not compare a zoned timestamp with a naive one)."""
    def utc(value):
        if isinstance(value, (list, tuple, set)):
            return [utc(v) for v in value]
        if isinstance(value, pd.Timestamp):
            value = value.to_pydatetime()
        if isinstance(value, datetime) and value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value
    return None if filters is None else [(name, op, utc(v)) for name, op, v in filters]


def to_pandas(arrow: pa.Table) -> pd.DataFrame:
    """Arrow rows as pandas the way Spark's ``toPandas()`` gives them: timestamps naive
    in UTC (nanoseconds), strings as objects."""
    frame = arrow.to_pandas(use_threads=False)
    for name, field in zip(arrow.column_names, arrow.schema):
        if pa.types.is_timestamp(field.type):
            col = pd.to_datetime(frame[name], utc=True)
            frame[name] = col.dt.tz_convert("UTC").dt.tz_localize(None).astype("datetime64[ns]")
    return frame


def history(path: str | Path, limit: int | None = None) -> list[Commit]:
    """The table's newest commits, newest first (at most ``limit``), userMetadata parsed
    as JSON (``{}`` if none); empty when the table does not exist. Timestamps are naive
    UTC, as Spark's ``DESCRIBE HISTORY`` gives them. Always of the newest snapshot:
    delta-rs 1.6 numbers the history of a time-travelled table wrongly (the newest
    commits, labelled from the older version down), so :func:`commits` filters instead."""
    t = table(path)
    if t is None:
        return []
    try:
        entries = t.history(limit)
    except Exception as exc:  # noqa: BLE001 - an unreadable commit file
        raise DeltaRsError(f"{path}: {_first_line(exc)}") from None
    out = [Commit(int(e["version"]),
                  datetime.fromtimestamp((e.get("timestamp") or 0) / 1000,
                                         timezone.utc).replace(tzinfo=None),
                  str(e.get("operation") or ""), parse_metadata(e.get("userMetadata")),
                  dict(e.get("operationMetrics") or {}))
           for e in entries if int(e.get("version", -1)) >= 0]
    return sorted(out, key=lambda c: -c.version)


#: The first page of :func:`commits`; each next page is twice as large.
FIRST_PAGE = 16


def commits(path: str | Path, version: int | None = None):
    """The table's commits newest first (from ``version`` down when given), read in pages
    that double in size: a caller that stops at the commit it looks for reads about twice
    the commits newer than it, however long the log is (a read of the whole history
    costs more every day the table ages). A commit made while it pages is not yielded:
    versions only go down."""
    size, below = FIRST_PAGE, None
    while True:
        page = history(path, size)
        for commit in page:
            if version is not None and commit.version > version:
                continue
            if below is None or commit.version < below:
                below = commit.version
                yield commit
        if len(page) < size or (page and page[-1].version == 0):
            return
        size *= 2


def properties(path: str | Path) -> dict[str, str]:
    """The table's properties (``TBLPROPERTIES``); empty when it does not exist."""
    t = table(path)
    return {} if t is None else dict(t.metadata().configuration)


def arrow_schema(schema) -> pa.Schema:
    """A Spark ``StructType`` as a pyarrow schema (timestamps in UTC, as Delta stores them)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def create(path: str | Path, schema: pa.Schema) -> bool:
    """Create an empty table of ``schema`` at ``path`` (version 0, protocol 1/2
    and no table features: what Spark's ``CREATE TABLE`` of a table without properties
    writes) unless a table is there; True when this call created it. Another writer
    creating it at the same moment is not an error."""
    from deltalake import DeltaTable

    if exists(path):
        return False
    try:
        DeltaTable.create(location(path), schema=schema, mode="error",
                          storage_options=object_store.storage_options(path))
    except Exception:  # noqa: BLE001 - a concurrent creation wins the race: fine
        if exists(path):
            return False
        raise
    return True


def append(path: str | Path, data: pa.Table, metadata: dict[str, Any] | None = None,
           txn: tuple[str, int] | None = None) -> bool:
    """Append ``data`` (the table's columns, in any order; other columns are left out) as
    one commit, ``metadata`` as its userMetadata
    JSON; False when skipped. ``txn = (app_id, version)`` makes it idempotent as a Spark
    append's ``txnAppId``/``txnVersion``: skipped when the table recorded a version at or
    above it for the app id. Only for a table without writer features (protocol 2).
    Writes a checkpoint at every ``delta.checkpointInterval``-th version (default 10)."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    t = table(path)
    if t is None:
        raise DeltaRsError(f"{path}: no Delta table to append to")
    protocol = t.protocol()
    if protocol.min_writer_version > 2 or protocol.writer_features:
        raise DeltaRsError(f"{path}: writer protocol {protocol.min_writer_version} with "
                             f"features {protocol.writer_features}: append through Spark")
    if txn is not None and (t.transaction_version(txn[0]) or -1) >= int(txn[1]):
        return False
    props = CommitProperties(
        custom_metadata=({"userMetadata": json.dumps(metadata, sort_keys=True)}
                         if metadata else None),
        app_transactions=[Transaction(txn[0], int(txn[1]))] if txn is not None else None)
    schema = pa.schema(t.schema().to_arrow())
    missing = [n for n in schema.names if n not in data.column_names]
    if missing:
        raise DeltaRsError(f"{path}: the rows to append lack the table's columns {missing}")
    write_deltalake(t, data.select(schema.names).cast(schema), mode="append",
                    commit_properties=props)
    # a checkpoint every ``delta.checkpointInterval`` commits, as Spark writes them: the
    # next open of the table (by any engine) replays at most that many commits
    interval = int(t.metadata().configuration.get("delta.checkpointInterval", 10))
    if t.version() % interval == 0:
        t.create_checkpoint()
    return True


def parse_metadata(text: str | None) -> dict[str, Any]:
    """A commit's userMetadata as a dict: JSON objects as they are, other JSON under
    ``value``, other text under ``text``."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return {"text": text}
    return value if isinstance(value, dict) else {"value": value}


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


def writable(path: str | Path) -> bool:
    """Whether delta-rs writes this table (:func:`append`, :func:`update`): a Delta table
    without writer features (writer protocol <= 2), as Spark creates the control
    plane's tables."""
    t = table(path)
    if t is None:
        return False
    protocol = t.protocol()
    return protocol.min_writer_version <= 2 and not protocol.writer_features


#: How DataFusion (delta-rs' SQL) spells a Delta TIMESTAMP: microseconds, UTC.
_TIMESTAMP = 'Timestamp(Microsecond, Some("UTC"))'


def sql_literal(value: Any, sql_type: str) -> str:
    """``value`` as a literal of a column of ``sql_type`` (STRING, BIGINT, INT, DOUBLE,
    BOOLEAN, TIMESTAMP) in delta-rs' SQL (strings quote ``'`` by doubling it; a naive
    datetime is UTC)."""
    if value is None:
        return "NULL"
    kind = sql_type.upper()
    if kind == "TIMESTAMP":
        stamp = value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)
        iso = stamp.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return f"arrow_cast('{iso}', '{_TIMESTAMP}')"
    if kind == "BOOLEAN":
        return "TRUE" if value else "FALSE"
    if kind in ("BIGINT", "INT"):
        return str(int(value))
    if kind == "DOUBLE":
        number = float(value)
        return repr(number) if math.isfinite(number) else f"CAST('{number!r}' AS DOUBLE)"
    return "'" + str(value).replace("'", "''") + "'"


def update(path: str | Path, predicate: str, values: dict[str, Any], schema_ddl: str,
           metadata: str | None = None, txn: tuple[str, int] | None = None) -> int | None:
    """``UPDATE`` the rows matching ``predicate`` (delta-rs' SQL, literals from
    :func:`sql_literal`) with ``values`` (column -> Python value; types from the table's
    ``schema_ddl``, flat "name TYPE, ..."): one commit annotated with ``metadata`` (the
    userMetadata text), none when no row matches. The rows it updated; None when skipped:
    ``txn = (app_id, version)`` is idempotent as a Spark UPDATE's ``txnAppId`` /
    ``txnVersion``. A concurrent commit it conflicts with raises delta-rs'
    ``CommitFailedError`` (the caller re-reads and retries, as after Spark's)."""
    from deltalake import CommitProperties, Transaction

    t = table(path)
    if t is None or not writable(path):
        raise DeltaRsError(f"{path}: not a Delta table delta-rs writes: update through Spark")
    types = dict(item.split() for item in schema_ddl.split(", "))
    unknown = sorted(set(values) - set(types))
    if unknown:
        raise DeltaRsError(f"{path}: no column(s) {unknown}")
    if txn is not None and (t.transaction_version(txn[0]) or -1) >= int(txn[1]):
        return None
    props = CommitProperties(
        custom_metadata={"userMetadata": metadata} if metadata else None,
        app_transactions=[Transaction(txn[0], int(txn[1]))] if txn is not None else None)
    metrics = t.update(updates={c: sql_literal(v, types[c]) for c, v in values.items()},
                       predicate=predicate, commit_properties=props)
    interval = int(t.metadata().configuration.get("delta.checkpointInterval", 10))
    if int(metrics.get("num_updated_rows", 0)) and t.version() % interval == 0:
        t.create_checkpoint()
    return int(metrics.get("num_updated_rows", 0))
