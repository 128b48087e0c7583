"""Probe (not a test, not in ``./dev bench``): how fast ``readCommittedStream(state_location=...)``'s
data source streams without its sequencing: each Kafka partition read with confluent-kafka
inside the executor (``kafka_arrow.iter_range``, the reader's own code) and handed to Spark as
Arrow, against Spark's own Kafka stream, same sink (``foreachBatch`` count), ``availableNow``,
about ten micro-batches, on bench_spark's topic: the ceiling of that design (docs/benchmarks.md).

    .venv/bin/python -m bench.probe_spark_source [--records 1000000] [--repeat 3]

Prints one JSON line per repeat (both rates and their ratio); the first repeat includes the JVM's
warm-up.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from bench.bench_spark import PARTITIONS, write
from bench.bench_spark_stream import TOPIC, run_query
from harvest_outbox.harvest_local import LocalServices
from harvest_outbox.harvest_local.kafka import create_topic
from harvest_outbox.harvest_local.spark import local_spark_session

SCHEMA = (
    "key binary, value binary, headers array<struct<key:string,value:binary>>, partition int, "
    "offset long, timestamp timestamp"
)
_GROUP = "harvest-probe"  # never joined: partitions are assigned, offsets never committed


class KafkaRange(InputPartition):
    def __init__(self, topic: str, bootstrap: str, partition: int, start: int, end: int) -> None:
        self.topic, self.bootstrap, self.partition, self.start, self.end = topic, bootstrap, partition, start, end


class ProbeReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        self.topic, self.bootstrap = options["topic"], options["bootstrap"]
        self.max_rows = int(options.get("maxOffsetsPerTrigger", 0))
        self.target: dict[str, int] | None = None

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {p: h for p, (_, h) in self._watermarks().items()}

    def _watermarks(self) -> dict[str, tuple[int, int]]:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": _GROUP, "enable.auto.commit": False})
        try:
            parts = consumer.list_topics(self.topic, timeout=10).topics[self.topic].partitions
            return {str(p): consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10) for p in parts}
        finally:
            consumer.close()

    def initialOffset(self) -> dict[str, int]:
        return {p: low for p, (low, _) in self._watermarks().items()}

    def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
        from pyspark.sql.streaming.datasource import ReadMaxRows

        high = self.target or {p: h for p, (_, h) in self._watermarks().items()}
        if isinstance(limit, ReadMaxRows):
            per_partition = max(1, limit.max_rows // len(high))
            return {p: min(h, start.get(p, 0) + per_partition) for p, h in high.items()}
        return high

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[KafkaRange]:
        return [
            KafkaRange(self.topic, self.bootstrap, int(p), start.get(p, 0), e)
            for p, e in end.items()
            if e > start.get(p, 0)
        ]

    def read(self, part: KafkaRange) -> Iterator[Any]:
        # readCommittedStream(state_location=...)'s own Kafka read, without the sequencing
        from harvest_outbox.spark_reader.kafka_arrow import iter_range

        yield from iter_range(
            part.topic, {"kafka.bootstrap.servers": part.bootstrap}, part.partition, part.start, part.end
        )


class ProbeSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "harvest_probe"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> ProbeReader:
        return ProbeReader(self.options)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with LocalServices() as services:
        bootstrap = services.endpoints.kafka_bootstrap
        create_topic(bootstrap, TOPIC, PARTITIONS)
        write(bootstrap, args.records)
        spark = local_spark_session("probe-spark-source", cores=2)
        spark.dataSource.register(ProbeSource)
        scratch = Path(tempfile.mkdtemp(prefix="probe-spark-source-"))
        per_trigger = args.records // 10 + 500
        for i in range(args.repeat):
            raw = (
                spark.readStream.format("kafka")
                .option("kafka.bootstrap.servers", bootstrap)
                .option("subscribe", TOPIC)
                .option("startingOffsets", "earliest")
                .option("includeHeaders", "true")
                .option("maxOffsetsPerTrigger", str(per_trigger))
                .load()
            )
            raw_n, raw_s, _ = run_query(spark, raw, str(scratch / f"raw-{i}"), per_trigger)
            source = (
                spark.readStream.format("harvest_probe")
                .option("topic", TOPIC)
                .option("bootstrap", bootstrap)
                .option("maxOffsetsPerTrigger", str(per_trigger))
                .load()
            )
            src_n, src_s, src_progress = run_query(spark, source, str(scratch / f"source-{i}"), per_trigger)
            assert raw_n == src_n, (raw_n, src_n)
            print(
                json.dumps(
                    {
                        "records": raw_n,
                        "micro_batches": sum(1 for p in src_progress if p["numInputRows"]),
                        "raw_stream_rows_per_s": round(raw_n / raw_s),
                        "python_source_rows_per_s": round(src_n / src_s),
                        "ratio": round(raw_s / src_s, 2),
                    }
                ),
                flush=True,
            )
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
