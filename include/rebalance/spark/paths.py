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


def join(root: str | Path, name: str) -> str:
    """``root/name`` for a folder or a URI (``s3a://b/t`` + ``x``: ``s3a://b/t/x``; a
    ``Path`` would fold the URI's ``//``)."""
    if "://" in str(root):
        return f"{str(root).rstrip('/')}/{name}"
    return str(Path(root) / name)


def local_path(path: str | Path) -> Path | None:
    """The folder of a local path or ``file://`` URI; None for another URI (``s3a://`` ...)."""
    scheme, sep, rest = str(path).partition("://")
    return Path(rest if sep else path) if not sep or scheme == "file" else None
