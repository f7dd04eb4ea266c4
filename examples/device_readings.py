"""Per-device duplicate removal plus a rolling average of the last five readings.

A device may send a reading twice (a retry): the ids it sent in the last hour are kept
in a MapState with a one-hour TTL, and a repeated id is dropped (and counted, for the
rebalancer's histograms, by ``count_duplicates``). The same class runs
under ``readings.groupBy("device_id").transformWithStateInPandas(...)`` (``--plain``)
and under ``rebalanced(...)``.

    spark-submit examples/device_readings.py --readings /data/readings \
        --output /data/averages --checkpoint /chk/devices --instances 4 [--plain]
"""

from __future__ import annotations

import argparse

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor

from rebalance import count_duplicates

SEEN_TTL_MS = 60 * 60 * 1000
LAST = 5
READINGS_SCHEMA = "device_id STRING, reading_id STRING, value DOUBLE, reading_time TIMESTAMP"
AVERAGE_SCHEMA = "device_id STRING, reading_id STRING, value DOUBLE, rolling_avg DOUBLE"


class DedupAverage(StatefulProcessor):
    """Ids seen (MapState, TTL) and the last readings (ListState) per device."""

    def init(self, handle):
        self.seen = handle.getMapState("seen", "reading_id STRING", "at_ms BIGINT",
                                       ttlDurationMs=SEEN_TTL_MS)
        self.recent = handle.getListState("recent", "value DOUBLE")

    def handleInputRows(self, key, rows, timerValues):
        readings = pd.concat(list(rows), ignore_index=True).sort_values(["reading_time",
                                                                         "reading_id"])
        recent = [float(r[0]) for r in self.recent.get()]
        out = []
        now = timerValues.getCurrentProcessingTimeInMs()
        repeated = []
        for i, reading_id, value in zip(readings.index, readings["reading_id"],
                                        readings["value"]):
            if self.seen.containsKey((reading_id,)):
                repeated.append(i)
                continue
            self.seen.updateValue((reading_id,), (now,))
            recent = (recent + [float(value)])[-LAST:]
            out.append((key[0], reading_id, float(value), sum(recent) / len(recent)))
        self.recent.put([(v,) for v in recent])
        count_duplicates(readings.loc[repeated])   # rebalanced(): instance_histograms.duplicates
        if out:
            yield pd.DataFrame(out, columns=["device_id", "reading_id", "value", "rolling_avg"])

    def close(self):
        pass


def main() -> None:
    p = argparse.ArgumentParser(description="deduplicate device readings and average them")
    p.add_argument("--readings", required=True, help="Delta table of readings (READINGS_SCHEMA)")
    p.add_argument("--output", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--instances", type=int, default=4)
    p.add_argument("--tables-root", help="the job's rebalance tables (histograms, assignments)")
    p.add_argument("--plain", action="store_true", help="plain Spark, for comparison")
    args = p.parse_args()

    from pyspark.sql import SparkSession

    from rebalance import rebalanced

    spark = SparkSession.builder.appName("devices").getOrCreate()
    readings = spark.readStream.format("delta").load(args.readings)
    if args.plain:
        (readings.groupBy("device_id")
         .transformWithStateInPandas(DedupAverage(), AVERAGE_SCHEMA, "Append", "ProcessingTime")
         .writeStream.format("delta").option("checkpointLocation", args.checkpoint)
         .start(args.output).awaitTermination())
        return
    job = rebalanced(readings, key="device_id", processor=DedupAverage(),
                     output_schema=AVERAGE_SCHEMA, time_mode="ProcessingTime",
                     event_time="reading_time", job="devices", instances=args.instances,
                     tables_root=args.tables_root)
    job.start(output=args.output, checkpoint=args.checkpoint).follow()


if __name__ == "__main__":
    main()
