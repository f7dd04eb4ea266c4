"""Project-local locations, each overridable by an environment variable.

Defaults keep everything under the repository (git-ignored) so a clone runs
with no configuration; a deployment points the variables elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Root of the repository when the package runs from a checkout (editable install).
REPO_ROOT = Path(__file__).resolve().parents[3]


def _env_path(name: str, default: Path) -> Path:
    value = os.environ.get(name)
    return Path(value).expanduser().resolve() if value else default


def data_dir() -> Path:
    """Root of the Delta tables and checkpoints (``REBALANCE_DATA_DIR``, default ``.data``)."""
    return _env_path("REBALANCE_DATA_DIR", REPO_ROOT / ".data")


def jars_dir() -> Path:
    """Folder with the Delta Lake JARs (``REBALANCE_JARS_DIR``, default ``.jars``)."""
    return _env_path("REBALANCE_JARS_DIR", REPO_ROOT / ".jars")


def local_path(path: str | Path) -> Path | None:
    """The folder of a local path or ``file://`` URI; None for another URI (``s3a://`` ...)."""
    scheme, sep, rest = str(path).partition("://")
    return Path(rest if sep else path) if not sep or scheme == "file" else None


def commit_versions(table_path: str | Path) -> list[int] | None:
    """The commit versions in a local Delta table's log folder (``NNNN.json`` files, in
    listing order), from file names alone (no Spark job); none for a folder without a log.
    None for a URI."""
    folder = local_path(table_path)
    if folder is None:
        return None
    try:
        names = os.listdir(folder / "_delta_log")
    except OSError:
        return []
    return [int(n[:20]) for n in names if len(n) == 25 and n.endswith(".json") and n[:20].isdigit()]


def log_ident(table_path: str | Path) -> tuple[int, int] | None:
    """(newest commit version, its file's modification time in ns) of a local Delta table:
    changes with every commit, and tells a table created again from the one it replaced.
    None for a URI or a folder with no commit."""
    version = log_version(table_path)
    if version is None:
        return None
    try:
        stat = (local_path(table_path) / "_delta_log" / f"{version:020d}.json").stat()
    except OSError:
        return None
    return version, stat.st_mtime_ns


def log_version(table_path: str | Path) -> int | None:
    """The newest commit version of a local Delta table (:func:`commit_versions`: a poll
    that finds a table unchanged costs one directory listing). None for a URI or a folder
    with no commit: the caller then reads the table itself."""
    return max(commit_versions(table_path) or [], default=None)
