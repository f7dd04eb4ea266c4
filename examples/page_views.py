"""Page views per user per 10-minute window: a processor whose hot users can be split.

Each window's count, first and last click are final when the watermark passes the
window's end. Several instances may therefore each count a part of one user's clicks:
the ``Merge`` below says how their rows combine (counts add up, the first click is the
earliest, the last the latest). With it, an assignment may split a hot user over
several instances; without it, ``rebalanced()`` refuses such assignments.

    spark-submit examples/page_views.py --clicks /data/clicks --output /data/views \
        --checkpoint /chk/views --instances 4 [--plain]
"""

from __future__ import annotations

import argparse

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor

from rebalance import Merge

WINDOW_MS = 10 * 60 * 1000
CLICKS_SCHEMA = "user_id STRING, page STRING, click_time TIMESTAMP"
VIEWS_SCHEMA = ("user_id STRING, window_start TIMESTAMP, clicks BIGINT, "
                "first_click TIMESTAMP, last_click TIMESTAMP")
#: How the rows of one (user, window) from several instances combine.
MERGE = Merge(on=["user_id", "window_start"], sum="clicks", min="first_click",
              max="last_click")


class PageViews(StatefulProcessor):
    """A MapState of the open windows per user; an event-time timer at each window's end."""

    def init(self, handle):
        self.handle = handle
        self.windows = handle.getMapState("windows", "start_ms BIGINT",
                                          "clicks BIGINT, first_ms BIGINT, last_ms BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        clicks = pd.concat(list(rows))
        ms = clicks["click_time"].to_numpy().astype("datetime64[ms]").astype("int64")
        for start, times in pd.Series(ms).groupby(ms - ms % WINDOW_MS):
            start = int(start)
            if self.windows.containsKey((start,)):
                count, first, last = self.windows.getValue((start,))
            else:
                count, first, last = 0, int(times.min()), int(times.max())
                self.handle.registerTimer(start + WINDOW_MS)
            self.windows.updateValue((start,), (int(count) + len(times),
                                                min(int(first), int(times.min())),
                                                max(int(last), int(times.max()))))
        yield from ()

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        start = expiredTimerInfo.getExpiryTimeInMs() - WINDOW_MS
        if self.windows.containsKey((start,)):
            count, first, last = self.windows.getValue((start,))
            self.windows.removeKey((start,))
            yield pd.DataFrame({"user_id": [key[0]],
                                "window_start": pd.to_datetime([start], unit="ms"),
                                "clicks": [int(count)],
                                "first_click": pd.to_datetime([int(first)], unit="ms"),
                                "last_click": pd.to_datetime([int(last)], unit="ms")})

    def close(self):
        pass


def main() -> None:
    p = argparse.ArgumentParser(description="page views per user per window, rebalanced")
    p.add_argument("--clicks", required=True, help="Delta table of clicks (CLICKS_SCHEMA)")
    p.add_argument("--output", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--instances", type=int, default=4)
    p.add_argument("--tables-root", help="the job's rebalance tables (histograms, assignments)")
    p.add_argument("--plain", action="store_true", help="plain Spark, for comparison")
    args = p.parse_args()

    from pyspark.sql import SparkSession

    from rebalance import rebalanced

    spark = SparkSession.builder.appName("page-views").getOrCreate()
    clicks = (spark.readStream.format("delta").load(args.clicks)
              .withWatermark("click_time", "10 minutes"))
    if args.plain:
        (clicks.groupBy("user_id")
         .transformWithStateInPandas(PageViews(), VIEWS_SCHEMA, "Append", "EventTime")
         .writeStream.format("delta").option("checkpointLocation", args.checkpoint)
         .start(args.output).awaitTermination())
        return
    job = rebalanced(clicks, key="user_id", processor=PageViews(), output_schema=VIEWS_SCHEMA,
                     time_mode="EventTime", event_time="click_time", job="page-views",
                     instances=args.instances, tables_root=args.tables_root, merge=MERGE)
    job.start(output=args.output, checkpoint=args.checkpoint).follow()


if __name__ == "__main__":
    main()
