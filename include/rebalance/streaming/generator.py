"""A deterministic, skewed, fluctuating keyed event stream (Fang et al.'s synthetic workload).

Keys ``k0 .. k{K-1}`` get Zipf(z) frequencies through a seeded rank order; every
``interval_batches`` batches the fluctuation model swaps the frequencies of key pairs on
different instances until some instance's expected load changed by ``f`` mean loads. Batch
``b`` covers event times ``[start + b * batch_seconds, start + (b + 1) * batch_seconds)``,
a fraction of events can be malformed (:data:`MALFORMED_KINDS`), and batch ``b`` is a pure
function of the configuration. Events go raw to the Delta table ``events`` or to a Kafka
topic (:func:`produce_batches`). The model, values, costs and options:
``docs/streaming.md``, "What the apps do".
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rebalance.core.placement import default_instances
from rebalance.core.synthetic import fluctuate, zipf_weights  # noqa: F401 - re-exported (Fang et al.'s model)

#: Malformed event kinds, named after the reason the job quarantines them with.
MALFORMED_KINDS = ("missing_key", "negative_value", "non_numeric_value", "unparseable_event_time")
#: Commit metadata ``kind`` of the generator's appends.
COMMIT_KIND = "generator"


class GeneratorError(ValueError):
    """Bad generator configuration, or a table generated with another configuration."""


@dataclass(frozen=True)
class GeneratorConfig:
    """Parameters of the event stream (all plain values, validated here)."""

    n_keys: int = 1000
    zipf: float = 1.0
    events_per_batch: int = 10_000
    batch_seconds: float = 10.0
    fluctuation: float = 0.0
    interval_batches: int = 1
    n_instances: int = 4
    cost_sigma: float = 0.0
    malformed_fraction: float = 0.0
    seed: int = 0
    start: str = "2024-01-01T00:00:00Z"

    def __post_init__(self) -> None:
        checks = [
            (self.n_keys >= 1, "n_keys must be >= 1"),
            (self.zipf >= 0, "zipf exponent must be >= 0"),
            (self.events_per_batch >= 1, "events_per_batch must be >= 1"),
            (self.batch_seconds > 0, "batch_seconds must be > 0"),
            (self.fluctuation >= 0, "fluctuation f must be >= 0"),
            (self.interval_batches >= 1, "interval_batches must be >= 1"),
            (self.n_instances >= 1, "n_instances must be >= 1"),
            (self.cost_sigma >= 0, "cost_sigma must be >= 0"),
            (0 <= self.malformed_fraction <= 1, "malformed_fraction must be in [0, 1]"),
            (self.seed >= 0, "seed must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise GeneratorError(f"{message}, got {self}")
        try:
            pd.Timestamp(self.start)
        except ValueError:
            raise GeneratorError(f"start must be an ISO-8601 time, got {self.start!r}") from None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def fingerprint(self) -> str:
        """Short stable hash of the configuration (names the generator's Delta transactions)."""
        text = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class EventBatch:
    """One generated batch: raw events (the ``events`` table's columns) and, aligned with
    them, the malformed kind of each event (None for a well-formed one)."""

    batch: int
    events: pd.DataFrame
    malformed: pd.Series


def event_time_text(times: pd.DatetimeIndex) -> pd.Index:
    """Event times as the raw events carry them: ISO-8601, milliseconds, UTC ("...Z")."""
    return times.strftime("%Y-%m-%dT%H:%M:%S.%f").str[:-3] + "Z"


class EventGenerator:
    """Batches of the stream described by a :class:`GeneratorConfig`."""

    def __init__(self, config: GeneratorConfig) -> None:
        self.config = config
        self._frequencies: list[np.ndarray] = []
        self._changes: list[float] = []

    @cached_property
    def keys(self) -> np.ndarray:
        """Key names, ``k0 .. k{K-1}``."""
        return np.array([f"k{i}" for i in range(self.config.n_keys)], dtype=object)

    @cached_property
    def _instances(self) -> np.ndarray:
        return default_instances(self.keys, self.config.n_instances)

    def frequencies(self, interval: int) -> np.ndarray:
        """Probability of each key in fluctuation interval ``interval``."""
        c = self.config
        if interval < 0:
            raise GeneratorError(f"interval must be >= 0, got {interval}")
        if not self._frequencies:
            order = np.random.default_rng([c.seed, 0]).permutation(c.n_keys)
            freq = np.empty(c.n_keys)
            freq[order] = zipf_weights(c.n_keys, c.zipf)
            self._frequencies.append(freq)
            self._changes.append(0.0)
        while len(self._frequencies) <= interval:
            i = len(self._frequencies)
            freq, change = fluctuate(self._frequencies[-1], self._instances, c.n_instances,
                                     c.fluctuation, np.random.default_rng([c.seed, 1, i]),
                                     max_swaps=10 * c.n_keys)
            self._frequencies.append(freq)
            self._changes.append(change)
        return self._frequencies[interval]

    def fluctuation_change(self, interval: int) -> float:
        """The load change (in mean loads) the fluctuation reached at ``interval``."""
        self.frequencies(interval)
        return self._changes[interval]

    def batch(self, batch: int) -> EventBatch:
        """The events of batch ``batch`` (a pure function of the configuration)."""
        c = self.config
        if batch < 0:
            raise GeneratorError(f"batch must be >= 0, got {batch}")
        rng = np.random.default_rng([c.seed, 2, batch])
        n = c.events_per_batch
        key_index = rng.choice(c.n_keys, size=n, p=self.frequencies(batch // c.interval_batches))
        offset_ms = np.floor((batch + rng.random(n)) * c.batch_seconds * 1000).astype(np.int64)
        values = rng.uniform(0.0, 100.0, n)
        costs = (rng.lognormal(-c.cost_sigma ** 2 / 2, c.cost_sigma, n) if c.cost_sigma
                 else np.ones(n))
        times = pd.Timestamp(c.start) + pd.to_timedelta(offset_ms, unit="ms")
        events = pd.DataFrame({
            "event_id": [f"s{c.seed}-b{batch}-e{i}" for i in range(n)],
            "key": self.keys[key_index],
            "value": [f"{v:.3f}" for v in values],
            "cost": [f"{v:.4f}" for v in costs],
            "event_time": event_time_text(times),
        })
        malformed = self._malform(events, rng)
        return EventBatch(batch, events, malformed)

    def _malform(self, events: pd.DataFrame, rng: np.random.Generator) -> pd.Series:
        """Turn a fraction of the events into malformed ones, in place; return the kinds."""
        n = len(events)
        hit = rng.random(n) < self.config.malformed_fraction
        kinds = np.array(MALFORMED_KINDS, dtype=object)[rng.integers(len(MALFORMED_KINDS), size=n)]
        malformed = pd.Series(np.where(hit, kinds, None), index=events.index, dtype=object)
        for kind, (column, spoil) in _SPOILERS.items():
            rows = malformed == kind
            events.loc[rows, column] = events.loc[rows, column].map(spoil)
        return malformed


def _negative(value: str) -> str:
    return "-" + value if float(value) > 0 else "-1.000"


#: How each malformed kind spoils a well-formed event: (column, new value from old value).
_SPOILERS = {
    "missing_key": ("key", lambda _: None),
    "negative_value": ("value", _negative),
    "non_numeric_value": ("value", lambda _: "n/a"),
    "unparseable_event_time": ("event_time", lambda _: "yesterday noon"),
}


# --------------------------------------------------------------------------- Delta

def next_batch(spark, config: GeneratorConfig, root: str | Path | None = None,
               strict: bool = True) -> int:
    """The batch after the last one generated into ``events`` (0 for a new table).

    Raises when the table was generated with another configuration: batches
    would no longer be a pure function of one configuration. With ``strict=False``
    (the live generator after its options changed) the other stream's batches are
    passed over: the new one is its own stream (its own transaction id).
    """
    from rebalance.spark import tables

    if not tables.exists(spark, tables.EVENTS, root):
        return 0
    for commit in tables.commits(spark, tables.EVENTS, root):   # newest first, paged
        if commit.metadata.get("kind") != COMMIT_KIND:
            continue
        recorded = commit.metadata.get("config") or {}
        changed = {k: (recorded.get(k), v) for k, v in config.to_dict().items()
                   if recorded.get(k) != v}
        if changed and not strict:
            continue
        if changed:
            diff = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changed.items())
            raise GeneratorError(
                f"events at {tables.EVENTS.path(root)} were generated with other options "
                f"({diff}); use the same options or another tables root")
        return int(commit.metadata["batch"]) + 1
    return 0


def last_appended_batch(spark, config: GeneratorConfig,
                        root: str | Path | None = None) -> int | None:
    """The newest batch of this configuration's stream in ``events`` (None: none). Its
    transaction makes Delta skip every batch up to it, so nothing older is looked for:
    the newest commits are read, not the whole history (the live generator asks before
    each append, for months)."""
    from rebalance.spark import tables

    if not tables.exists(spark, tables.EVENTS, root):
        return None
    mine = config.to_dict()
    return next((int(c.metadata["batch"]) for c in tables.commits(spark, tables.EVENTS, root)
                 if c.metadata.get("kind") == COMMIT_KIND and c.metadata.get("config") == mine),
                None)


def append_batches(spark, generator: EventGenerator, batches: Iterable[int],
                   root: str | Path | None = None) -> list[int]:
    """Append each batch as one commit (one file) to ``events``; return the batches written
    (a batch at or below the newest of this stream in the table is skipped and not
    returned: its transaction id is not above the one recorded).

    Idempotent: each append records the Delta transaction ``(generator-<fingerprint>,
    batch)``, and a batch whose transaction the table already recorded is skipped. Written
    through delta-rs (:func:`rebalance.spark.delta_rs.append`), no Spark job.
    """
    import pyarrow as pa

    from rebalance.spark import delta_rs, tables

    tables.ensure_table(spark, tables.EVENTS, root)
    config = generator.config
    batches = list(batches)
    last = last_appended_batch(spark, config, root) if batches else None
    written = []
    for b in batches:
        if last is not None and b <= last:   # Delta's transaction would skip it
            continue
        generated = generator.batch(b)
        interval = b // config.interval_batches
        meta = {"kind": COMMIT_KIND, "batch": b, "config": config.to_dict(),
                "interval": interval,
                "fluctuation_change": round(generator.fluctuation_change(interval), 6),
                "malformed": int(generated.malformed.notna().sum())}
        # through delta-rs in this process: no Spark job per batch (events has no writer
        # features); the same metadata and transaction id as a Spark append
        events = pa.Table.from_pandas(generated.events.loc[:, tables.EVENTS.columns],
                                      preserve_index=False, nthreads=1)
        delta_rs.append(tables.EVENTS.path(root), events, metadata=meta,
                        txn=(f"generator-{config.fingerprint()}", b))
        written.append(b)
    return written


def produce_batches(spark, generator: EventGenerator, batches: Iterable[int],
                    bootstrap_servers: str, topic: str,
                    duplicate_fraction: float = 0.0) -> list[int]:
    """Produce each batch's events to the Kafka topic (Spark's Kafka sink); return the
    batches produced. Message key = event key, value = the event as JSON (the ``events``
    fields as strings; a NULL field is left out). ``duplicate_fraction`` of each batch's
    events are sent a second time, as a producer's retry would (same ``event_id``).

    At least once: producing a batch again sends its events again (a job run with
    ``dedup`` drops them within the watermark).
    """
    from pyspark.sql import functions as F

    from rebalance.spark import tables

    if not 0 <= duplicate_fraction <= 1:
        raise GeneratorError(f"duplicate_fraction must be in [0, 1], got {duplicate_fraction}")
    produced = []
    for b in batches:
        events = generator.batch(b).events
        if duplicate_fraction:
            rng = np.random.default_rng([generator.config.seed, 3, b])
            again = events[rng.random(len(events)) < duplicate_fraction]
            events = pd.concat([events, again], ignore_index=True)
        df = spark.createDataFrame(events, schema=tables.EVENTS.schema)
        (df.select(F.col("key"), F.to_json(F.struct(*df.columns)).alias("value"))
           .write.format("kafka").option("kafka.bootstrap.servers", bootstrap_servers)
           .option("topic", topic).save())
        produced.append(b)
    return produced


def follow(spark, config: GeneratorConfig, root: str | Path | None = None,
           stop=None, clock=time.time, on_batch=None, write=None, first: int = 0) -> None:
    """Append batches in real time, forever (until ``stop`` is set): batch ``b`` is appended
    once the wall clock passed its last event time, ``start + (b + 1) * batch_seconds``.

    ``config.start`` is the event time of batch 0 (the service keeps it across restarts,
    so the stream stays one pure function of the options). After a pause (the service was
    down) it resumes at the batch of the current time: the stream has a gap, as a real
    source would, rather than a burst of old events.

    ``write(generator, batch)`` writes one batch elsewhere (e.g. to Kafka, with
    :func:`kafka_follower`); it resumes after batch ``first - 1`` instead of the table's.
    """
    import threading

    stop = stop or threading.Event()
    generator = EventGenerator(config)
    start = _parse_start(config.start)
    step = config.batch_seconds
    done = first if write is not None else next_batch(spark, config, root, strict=False)
    batch = max(done, int((clock() - start) // step))
    while not stop.is_set():
        due = start + (batch + 1) * step
        if clock() < due:
            stop.wait(min(due - clock(), step))
            continue
        if write is None:
            append_batches(spark, generator, [batch], root)
        else:
            write(generator, batch)
        if on_batch is not None:
            on_batch(batch)
        batch = max(batch + 1, int((clock() - start) // step) - 1)


def _parse_start(text: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def follow_start(spark, config: GeneratorConfig, root: str | Path | None = None,
                 now: float | None = None) -> str:
    """The event time of batch 0 for :func:`follow`: the one recorded in ``events`` by an
    earlier run with the same other options (so a restarted service continues the same
    stream), else the current time rounded down to a batch."""
    import datetime as dt

    from rebalance.spark import tables

    if tables.exists(spark, tables.EVENTS, root):
        mine = {k: v for k, v in config.to_dict().items() if k != "start"}
        for commit in tables.history(spark, tables.EVENTS, root, limit=20):
            recorded = dict(commit.metadata.get("config") or {})
            if commit.metadata.get("kind") == COMMIT_KIND and recorded.get("start"):
                if {k: v for k, v in recorded.items() if k != "start"} == mine:
                    return str(recorded["start"])
                break
    now = time.time() if now is None else now
    start = now - now % config.batch_seconds
    return dt.datetime.fromtimestamp(start, dt.timezone.utc).isoformat().replace("+00:00", "Z")


# --------------------------------------------------------------------------- Kafka follow

def kafka_follow_record(root: str | Path | None, topic: str) -> Path:
    """Where the live generator producing to ``topic`` records its stream (``start``, the
    options, the last batch produced): ``<tables root>/_kafka_follow/<topic>.json``."""
    from rebalance.spark import tables

    return Path(tables.EVENTS.path(root)).parent / "_kafka_follow" / f"{topic}.json"


def kafka_follow_start(config: GeneratorConfig, record: Path,
                       now: float | None = None) -> tuple[str, int]:
    """The event time of batch 0 and the first batch to produce for a live generator to
    Kafka: the recorded stream's (same other options) after its last batch, else a new
    stream from the current time rounded down to a batch (as :func:`follow_start`)."""
    import datetime as dt
    import json

    mine = {k: v for k, v in config.to_dict().items() if k != "start"}
    try:
        recorded = json.loads(record.read_text())
    except (OSError, ValueError):
        recorded = {}
    if recorded.get("options") == mine and recorded.get("start"):
        return str(recorded["start"]), int(recorded.get("last_batch", -1)) + 1
    now = time.time() if now is None else now
    start = now - now % config.batch_seconds
    return dt.datetime.fromtimestamp(start, dt.timezone.utc).isoformat().replace(
        "+00:00", "Z"), 0


def kafka_follower(spark, bootstrap_servers: str, topic: str, record: Path):
    """A ``write`` for :func:`follow`: produce the batch to Kafka, then record it as the
    last batch produced (a restarted generator goes on after it: at least once, a batch
    is produced again only if the process died between the two)."""
    import json

    def write(generator: EventGenerator, batch: int) -> None:
        produce_batches(spark, generator, [batch], bootstrap_servers, topic)
        options = {k: v for k, v in generator.config.to_dict().items() if k != "start"}
        record.parent.mkdir(parents=True, exist_ok=True)
        tmp = record.with_suffix(".tmp")
        tmp.write_text(json.dumps({"start": generator.config.start, "options": options,
                                   "last_batch": batch}))
        tmp.replace(record)

    return write
