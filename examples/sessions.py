"""Sessionization: clicks per user, a session ends after 30 minutes without a click.

The processor is plain PySpark: the same class runs under
``clicks.groupBy("user_id").transformWithStateInPandas(...)`` (``--plain``) and under
``rebalanced(...)``, which routes hot users to other instances and moves their sessions.

    spark-submit examples/sessions.py --clicks /data/clicks --output /data/sessions \
        --checkpoint /chk/sessions --instances 4 [--plain]
"""

from __future__ import annotations

import argparse

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor

GAP_MS = 30 * 60 * 1000
CLICKS_SCHEMA = "user_id STRING, page STRING, click_time TIMESTAMP"
SESSION_SCHEMA = "user_id STRING, session_start TIMESTAMP, session_end TIMESTAMP, clicks BIGINT"


class Sessionize(StatefulProcessor):
    """One open session per user in a ValueState; an event-time timer at last click + gap."""

    def init(self, handle):
        self.handle = handle
        self.session = handle.getValueState("session", "start_ms BIGINT, last_ms BIGINT, "
                                                       "clicks BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        clicks = pd.concat(list(rows))
        times = sorted(clicks["click_time"].to_numpy().astype("datetime64[ms]").astype("int64"))
        held = self.session.get()
        start, last, count = (int(held[0]), int(held[1]), int(held[2])) if held else (None, None, 0)
        done = []
        for t in times:
            if start is not None and t - last > GAP_MS:
                done.append((start, last, count))
                start = None
            start, last, count = (t, t, 1) if start is None else (start, max(last, t), count + 1)
        for timer in self.handle.listTimers():
            self.handle.deleteTimer(timer)
        self.session.update((start, last, count))
        self.handle.registerTimer(last + GAP_MS)
        if done:
            yield _sessions(key[0], done)

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        held = self.session.get()
        if held is not None:
            self.session.clear()
            yield _sessions(key[0], [(int(held[0]), int(held[1]), int(held[2]))])

    def close(self):
        pass


def _sessions(user, done):
    return pd.DataFrame({
        "user_id": [user] * len(done),
        "session_start": pd.to_datetime([s for s, _, _ in done], unit="ms"),
        "session_end": pd.to_datetime([e for _, e, _ in done], unit="ms"),
        "clicks": [c for _, _, c in done]})


def main() -> None:
    p = argparse.ArgumentParser(description="sessionize clicks, rebalanced")
    p.add_argument("--clicks", required=True, help="Delta table of clicks (CLICKS_SCHEMA)")
    p.add_argument("--output", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--instances", type=int, default=4)
    p.add_argument("--tables-root", help="the job's rebalance tables (histograms, assignments)")
    p.add_argument("--plain", action="store_true", help="plain Spark, for comparison")
    args = p.parse_args()

    from pyspark.sql import SparkSession

    from rebalance import rebalanced

    spark = SparkSession.builder.appName("sessions").getOrCreate()
    clicks = (spark.readStream.format("delta").load(args.clicks)
              .withWatermark("click_time", "10 minutes"))
    if args.plain:
        (clicks.groupBy("user_id")
         .transformWithStateInPandas(Sessionize(), SESSION_SCHEMA, "Append", "EventTime")
         .writeStream.format("delta").option("checkpointLocation", args.checkpoint)
         .start(args.output).awaitTermination())
        return
    job = rebalanced(clicks, key="user_id", processor=Sessionize(),
                     output_schema=SESSION_SCHEMA, time_mode="EventTime",
                     event_time="click_time", job="sessions", instances=args.instances,
                     tables_root=args.tables_root)
    job.start(output=args.output, checkpoint=args.checkpoint).follow()


if __name__ == "__main__":
    main()
