"""Reading a stopped generation's checkpoint: where it ends, where the next source starts,
and which assignment version its committed batches were routed by."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from rebalance.spark import delta_rs
from rebalance.streaming.restart.control import Generation, RestartError


@dataclass(frozen=True)
class Position:
    """Where a stopped generation's checkpoint ends."""

    last_batch: int | None          # last committed batch (None: nothing committed)
    offset: dict[str, Any] | None   # its events source offset (Delta table or Kafka topic)
    next_watermark_ms: int | None   # watermark the next batch would have used
    uncommitted: bool               # a planned batch was never committed


def log_ids(folder: Path) -> list[int]:
    return sorted(int(p.name) for p in folder.glob("[0-9]*") if p.name.isdigit())


def checkpoint_position(checkpoint: str) -> Position:
    """Last committed batch of a (stopped) checkpoint, its source offset and next watermark."""
    root = Path(checkpoint)
    commits, offsets = log_ids(root / "commits"), log_ids(root / "offsets")
    uncommitted = bool(offsets) and (not commits or offsets[-1] > commits[-1])
    if not commits:
        return Position(None, None, None, uncommitted)
    last = commits[-1]
    lines = (root / "offsets" / str(last)).read_text().strip().splitlines()
    commit = json.loads((root / "commits" / str(last)).read_text().strip().splitlines()[-1])
    # Line 1 is the batch metadata; then one offset per source, the events source first
    # (the handoff source, when the query has one, follows it).
    return Position(last, json.loads(lines[2]), int(commit.get("nextBatchWatermarkMs", 0)),
                    uncommitted)


def covering_batch(checkpoint: str, version: int, source: int = 1) -> int | None:
    """The first committed batch whose offset of Delta source ``source`` (1: the handoff
    table) is at or past the (one-file) table version ``version``; None if none is."""
    root = Path(checkpoint)

    def covers(batch: int) -> bool:
        lines = (root / "offsets" / str(batch)).read_text().strip().splitlines()
        text = lines[2 + source] if len(lines) > 2 + source else "-"
        if text.strip() in ("", "-", "null"):
            return False
        offset = json.loads(text)
        at = int(offset["reservoirVersion"])
        return at > version or (at == version and int(offset["index"]) >= 0)

    commits = log_ids(root / "commits")
    low, high = 0, len(commits)          # offsets only move forward: the first that covers
    while low < high:
        mid = (low + high) // 2
        if covers(commits[mid]):
            high = mid
        else:
            low = mid + 1
    return commits[low] if low < len(commits) else None


def drop_uncommitted(checkpoint: str, written: set[int]) -> list[int]:
    """Forget the planned but uncommitted batches of a stopped query (their offsets), so
    that its next run plans that batch afresh (with input that arrived since, e.g.
    handoff rows). Only for batches that wrote nothing (not in ``written``): the sink
    refused them, or the stop came first. Returns the batch ids dropped."""
    root = Path(checkpoint)
    commits = log_ids(root / "commits")
    last = commits[-1] if commits else -1
    planned = [b for b in log_ids(root / "offsets") if b > last]
    if any(b in written for b in planned):
        raise RestartError(f"uncommitted batch(es) {sorted(set(planned) & written)} of "
                           f"{checkpoint} may have written output: replay them first")
    for b in sorted(planned, reverse=True):
        for name in (str(b), f".{b}.crc"):
            (root / "offsets" / name).unlink(missing_ok=True)
    return planned


def checkpoint_partitions(checkpoint: str) -> int | None:
    """The shuffle partitions (stateful operators' state partitions) a checkpoint's newest
    committed batch recorded in its offset log; None before its first commit. A newer,
    uncommitted batch does not count: it is replanned, or, if it is a state repartition
    that did not finish (its driver died), repartitioned again."""
    commits = log_ids(Path(checkpoint) / "commits")
    if not commits:
        return None
    lines = (Path(checkpoint) / "offsets" / str(commits[-1])).read_text().splitlines()
    value = json.loads(lines[1]).get("conf", {}).get("spark.sql.shuffle.partitions")
    return int(value) if value is not None else None


def state_variables(checkpoint: str) -> set[str]:
    """The state variables of the checkpoint's transformWithState operators, as Spark's
    newest operator metadata (``state/<op>/_metadata/v2/<batch>``) records them; empty
    before the first batch."""
    names: set[str] = set()
    for folder in (Path(checkpoint) / "state").glob("*/_metadata/v2"):
        ids = log_ids(folder)
        if not ids:
            continue
        lines = (folder / str(ids[-1])).read_text().splitlines()
        metadata = json.loads(lines[1]) if len(lines) > 1 else {}
        properties = json.loads(metadata.get("operatorPropertiesJson") or "{}")
        names.update(v["stateName"] for v in properties.get("stateVariables", []))
    return names


def version_files(spark: SparkSession, table_path: str, version: int) -> list[str]:
    """File names of the data files a Delta commit added, in the order of its log
    (:func:`rebalance.spark.delta_rs.added_files`; ``spark`` is not used)."""
    return [p.rsplit("/", 1)[-1] for p in delta_rs.added_files(table_path, version)]


def source_after(spark: SparkSession, table_path: str, offset: dict[str, Any]) -> dict[str, Any]:
    """Source options that start exactly after a Delta source offset.

    An offset ``(V, i)`` means every version before V and the files ``0..i`` of
    version V were processed (``i = -1``: none of V). The new source starts at
    the version holding the last processed file (so that it exists, and its batch
    0 has input and runs at once) and skips the files of it already processed.
    """
    if offset.get("isStartingVersion"):
        raise RestartError(
            f"the old generation stopped inside its initial snapshot (offset {offset}); "
            "generations read with startingVersion, let it finish the snapshot first")
    version, index = int(offset["reservoirVersion"]), int(offset["index"])
    if index < 0:
        version, index = version - 1, None
    if version < 0:
        return {"starting_version": 0, "exclude_files": []}
    files = version_files(spark, table_path, version)
    done = files if index is None else files[:index + 1]
    return {"starting_version": version, "exclude_files": done}


def kafka_source_after(offset: dict[str, Any], topic: str) -> dict[str, Any]:
    """Source options that start exactly after a Kafka source offset of the old checkpoint.

    The offset logged for a batch is, per partition, the offset after its last message
    (``{topic: {partition: next offset}}``), which is what ``startingOffsets`` takes as
    the first offset to read: the new checkpoint's source starts there.
    """
    parts = offset.get(topic) if isinstance(offset, dict) else None
    if not isinstance(parts, dict) or not parts or set(offset) != {topic} or not all(
            str(p).isdigit() and isinstance(o, int) and o >= 0 for p, o in parts.items()):
        raise RestartError(f"the old checkpoint's source offset {offset} is not one of "
                           f"Kafka topic {topic!r} ({{partition: offset}}); was it run on "
                           "another source or topic?")
    return {"kafka_offsets": {topic: {str(p): int(o) for p, o in parts.items()}}}


def with_new_partitions(offsets: dict[str, Any], topic: str,
                        partitions: list[int]) -> dict[str, dict[str, int]]:
    """``startingOffsets`` for every partition ``topic`` has now (``partitions``).

    Spark's Kafka source refuses specific starting offsets that do not name every partition
    of a subscribed topic (``KAFKA_START_OFFSET_DOES_NOT_MATCH_ASSIGNED``). A partition
    added to the topic after the old checkpoint's last commit is not in its offsets, and
    none of its messages was read: it starts at its earliest offset (``-2``). A partition
    the old checkpoint read that the topic no longer has means the topic was deleted and
    created again: refused, since its offsets would point into other messages.
    """
    given = {str(p): int(o) for p, o in offsets.get(topic, {}).items()}
    now = {str(int(p)) for p in partitions}
    gone = sorted(set(given) - now, key=int)
    if gone:
        raise RestartError(
            f"Kafka topic {topic!r} has no partition {', '.join(gone)} any more (it has "
            f"{', '.join(sorted(now, key=int)) or 'none'}), which the old checkpoint read: "
            "was the topic deleted and created again? Its offsets cannot be continued; start "
            "the job on a new checkpoint (and name) to read the topic from its start")
    merged = {**{p: -2 for p in now - set(given)}, **given}
    return {topic: {p: merged[p] for p in sorted(merged, key=int)}}


def next_source(spark: SparkSession, config: Any, offset: dict[str, Any]) -> dict[str, Any]:
    """Where a new checkpoint's events source starts, exactly after the old checkpoint's
    last committed source ``offset`` (of the events source of ``config.source``)."""
    if config.source == "kafka":
        return kafka_source_after(offset, config.topic)
    from rebalance.spark import tables

    return source_after(spark, tables.EVENTS.path(config.tables_root), offset)


def routing_log(checkpoint: str) -> Path:
    """Folder of a generation's routing log, next to its checkpoint: a file ``<batch>``
    (JSON ``{"assignment_version": v}``) for each batch whose routing differs from the
    batch before (before the first entry: the generation's own version)."""
    return Path(checkpoint).with_name(Path(checkpoint).name + "-routing")


def in_force_version(gen: Generation, last_batch: int | None) -> int:
    """The assignment version in force after ``last_batch`` of ``gen``: the version its
    output rows of the last logged batch up to ``last_batch`` record (its own version when
    it committed none, or never switched)."""
    folder = routing_log(gen.checkpoint)
    if last_batch is None or not folder.is_dir():
        return gen.assignment_version
    logged = [b for b in log_ids(folder) if gen.start_batch <= b <= last_batch]
    if not logged:
        return gen.assignment_version
    return int(json.loads((folder / str(logged[-1])).read_text())["assignment_version"])
