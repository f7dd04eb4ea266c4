"""Reading histogram and assignment files: a Delta table directory, Parquet or CSV.

Only the columns used are read (:data:`REQUIRED`, :data:`OPTIONAL`; ``key`` and
``instance`` for an assignment), as a pyarrow table: Parquet and CSV with pyarrow, a Delta
directory with delta-rs (its newest snapshot; no JVM). Checking and aggregating the rows
is :mod:`rebalance.core.histograms`.
"""

from __future__ import annotations

from pathlib import Path

from rebalance.core.model import PlanningError

REQUIRED = ("window_start", "key", "count")
OPTIONAL = ("cost", "state_bytes")


class InputError(PlanningError):
    """Unreadable or invalid histogram/assignment input (one line, exit code 2 in the CLI)."""


def is_delta(path: Path) -> bool:
    return path.is_dir() and (path / "_delta_log").is_dir()


def check_input_path(path: Path, what: str) -> None:
    """Refuse, in one accurate line, a path that is missing, unreadable (a symlink loop,
    no permission) or neither a regular file nor a folder (a FIFO would block the read
    for ever, a device never ends)."""
    import errno
    import os
    import stat

    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.islink(path):
            raise InputError(f"{what} path {path} is a symbolic link to "
                             f"{os.readlink(path)!r}, which does not exist") from None
        raise InputError(f"{what} path not found: {path}") from None
    except OSError as exc:
        reason = ("a symbolic link loop" if exc.errno == errno.ELOOP
                  else exc.strerror or str(exc))
        raise InputError(f"{what} path {path} cannot be read: {reason}") from None
    if stat.S_ISDIR(mode) or stat.S_ISREG(mode):
        return
    kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a file")
    raise InputError(f"{what} path {path} is {kind}, not a regular file or folder")


def read_histogram_table(path: str | Path):
    """Rows of a Delta table directory, a Parquet file/directory or a CSV file (a pyarrow
    table of the columns used)."""
    path = Path(path)
    check_input_path(path, "histograms")
    if is_delta(path):
        return _read_delta(path)
    if path.is_file() and path.suffix.lower() == ".csv":
        return _read_csv(path, "histograms", (*REQUIRED, *OPTIONAL), key_column="key")
    return _utf8_keys(_read_parquet(path, "histograms", (*REQUIRED, *OPTIONAL)), path,
                      "histograms")


def read_histograms(path: str | Path):
    """Rows of a Delta table directory, a Parquet file/directory or a CSV file (pandas)."""
    return to_pandas(read_histogram_table(path))


def _read_delta(path: Path):
    """The columns used of a Delta table directory's newest snapshot (a pyarrow table),
    through delta-rs: no JVM starts for ``rebalance plan --histograms <table>``."""
    import pyarrow as pa
    from deltalake import DeltaTable

    try:
        table = DeltaTable(str(path.resolve()))
        names = pa.schema(table.schema().to_arrow()).names
        missing = [c for c in REQUIRED if c not in names]
        if missing:
            raise InputError(missing_message("histograms", missing, names))
        # one thread, as rebalance.spark.delta_rs reads: no Arrow pool left at exit
        rows = table.to_pyarrow_dataset().to_table(
            columns=[c for c in (*REQUIRED, *OPTIONAL) if c in names], use_threads=False)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - any delta-rs failure is a bad input here
        raise InputError(f"cannot read Delta table {path}: {first_line(exc)}") from None
    return _utf8_keys(rows, path, "histograms")


def _read_parquet(path: Path, what: str, columns):
    """The ``columns`` present in a Parquet file or a flat directory of Parquet files
    (others are not read; files named ``.*`` or ``_*`` are skipped, as Spark writes them).

    ``pyarrow.parquet.ParquetFile`` reads them: importing ``pyarrow.dataset`` alone costs a
    large share of the time budget of a plan at 10^6 keys (``docs/planning.md``, "Scale").
    A directory with subdirectories (partitions) goes through ``pyarrow.dataset``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if path.is_dir():
            entries = sorted(p for p in path.iterdir() if not p.name.startswith((".", "_")))
            if any(p.is_dir() for p in entries):
                import pyarrow.dataset as ds

                dataset = ds.dataset(str(path), format="parquet")
                present = [c for c in columns if c in dataset.schema.names]
                return dataset.to_table(columns=present or None)
            files = entries
        else:
            files = [path]
        tables = []
        for f in files:
            if not f.is_file():  # a FIFO would block, a device never ends
                raise ValueError(f"{f.name} is not a regular file")
            pf = pq.ParquetFile(f)
            present = [c for c in columns if c in pf.schema_arrow.names]
            tables.append(pf.read(columns=present or None))
        if not tables:
            raise ValueError("no Parquet files in the directory")
        if len(tables) == 1:
            return tables[0]
        return pa.concat_tables(tables, promote_options="permissive")
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for a bad file
        raise InputError(f"cannot read {what} {path} as Parquet: {first_line(exc)}") from None


def _read_csv(path: Path, what: str, columns, key_column: str):
    """A CSV file with pyarrow (keys always strings); only ``columns`` are converted."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    names: list[str] = []
    try:
        with open(path, "rb") as fh:
            header = fh.readline()
        try:  # utf-8-sig: a byte order mark (spreadsheets write one) is not in a name
            text = header.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise InputError(f"cannot read {what} {path} as CSV: its header (line 1) is not "
                             f"UTF-8 text (byte {header[exc.start]:#04x} at offset "
                             f"{exc.start})") from None
        names = [c.strip().strip('"') for c in text.rstrip("\r\n").split(",")]
        include = [c for c in columns if c in names]
        options = pcsv.ConvertOptions(column_types={key_column: pa.string()},
                                      include_columns=include or None)
        return pcsv.read_csv(path, convert_options=options)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001
        message = first_line(exc)
        if "invalid UTF8" in message:
            raise InputError(_utf8_message(path, what, message, names)) from None
        raise InputError(f"cannot read {what} {path} as CSV: {message}") from None


def _utf8_message(path: Path, what: str, message: str, names: list[str]) -> str:
    """pyarrow's "In CSV column #1: ... invalid UTF8 data", with the column's name and
    the first line that is not UTF-8."""
    import re

    match = re.search(r"column #(\d+)", message)
    column = ""
    if match and int(match.group(1)) < len(names):
        column = f" column {names[int(match.group(1))]!r}"
    line_no = None
    with open(path, "rb") as fh:
        for n, line in enumerate(fh, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                line_no = n
                break
    where = f" (line {line_no})" if line_no else ""
    return f"cannot read {what} {path} as CSV:{column} holds text that is not UTF-8{where}"


def _utf8_keys(table, path: Path, what: str):
    """A Parquet ``key`` column of bytes (binary) must be UTF-8 text: refused naming the
    file, the column and the first row that is not (not a bare codec error later)."""
    import pyarrow as pa

    if not hasattr(table, "column_names") or "key" not in table.column_names:
        return table
    column = table.column("key")
    kind = column.type
    if not (pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
            or pa.types.is_fixed_size_binary(kind)
            or getattr(pa.types, "is_binary_view", lambda _: False)(kind)):
        return table
    try:
        column.cast(pa.large_string())
    except pa.ArrowInvalid:
        for row, value in enumerate(column.to_pylist()):
            try:
                if value is not None:
                    value.decode("utf-8")
            except UnicodeDecodeError:
                raise InputError(f"cannot read {what} {path} as Parquet: column 'key' holds "
                                 f"bytes that are not UTF-8 text (row index {row}: "
                                 f"{value[:40]!r})") from None
        raise
    return table


def read_assignment_table(path: str | Path):
    """A current assignment file (Parquet or CSV, columns ``key`` and ``instance``)."""
    path = Path(path)
    check_input_path(path, "assignment")
    if path.is_file() and path.suffix.lower() == ".csv":
        return _read_csv(path, "assignment", ("key", "instance"), key_column="key")
    return _utf8_keys(_read_parquet(path, "assignment", ("key", "instance")), path, "assignment")


def read_assignment(path: str | Path):
    """A current assignment file (Parquet or CSV, columns ``key`` and ``instance``), pandas."""
    return to_pandas(read_assignment_table(path))


def to_pandas(frame):
    import pandas as pd

    return frame if isinstance(frame, pd.DataFrame) else frame.to_pandas()


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def missing_message(what: str, missing, have) -> str:
    return (f"{what} lack required column(s) {', '.join(repr(m) for m in missing)} "
            f"(have: {', '.join(map(str, have)) or 'none'})")
