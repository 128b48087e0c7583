"""The registered ratio targets, one per published figure that has one: ``"<benchmark>.<figure>"`` -> Target.

A benchmark's Recorder takes its own entries (``for_bench()``); the table generator (bench/__main__.py)
prints a figure's target and verdict from its results, so a target lives here and nowhere else. A figure
not listed has no target ("no target"), never a silent "met". Every entry parses and names a registered
benchmark (tests/test_bench/test_spread.py).
"""

from __future__ import annotations

from bench.spread import Target

__all__ = ["TARGETS", "for_bench"]

TARGETS: dict[str, Target] = {
    name: Target.parse(text)
    for name, text in {
        # issue #35: the reader costs at most 5% of a plain consumer's rate
        "consumer.poll_batch": "≥ 0.95",
        "spark.readCommitted": "≥ 0.9",
        "spark.readCommitted_noop": "≥ 1",
        "spark_stream.state_location": "≥ 0.9",
        "relay.at_least_once_to_db_limit": "≥ 0.75",
        "relay.sequenced_to_db_limit": "≥ 0.75",
        "relay.sequenced_to_at_least_once": "≥ 0.9",
        "registry.at_least_once/avro": "≥ 0.7",
        "registry.sequenced/avro": "≥ 0.7",
        "cursor_relay.at_least_once/relay_wal_per_row": "≤ 0.5",
        "cursor_relay.sequenced/relay_wal_per_row": "≤ 0.5",
        "cursor_relay.at_least_once/rows_per_s": "≥ 1",
        "cursor_relay.sequenced/rows_per_s": "≥ 1",
        # issue #50: the Delta pipeline end to end at >= 0.8 of the Parquet one
        "pipeline.delta_vs_parquet": "≥ 0.8",
        # issue #47: the relay against a raw read + produce loop, cursor layout
        "relay_limit.sequenced/defaults": "≥ 0.7",
        "relay_limit.sequenced/tuned": "≥ 0.7",
        "relay_limit.at_least_once/defaults": "≥ 0.5",
        "relay_limit.at_least_once/tuned": "≥ 0.5",
        # issue #48: a fleet relays a row at <= 1.2x a one-outbox relay's CPU, and one outbox's burst at
        # most doubles another's p99 latency
        "outboxes.cpu_per_row": "≤ 1.2",
        "outboxes.trickle_p99_burst": "≤ 2",
        # issue #51: as users run it, at 500 rows/s: p99 <= 2x Kafka alone's + 5 ms (at-least-once) / + 10 ms
        # (sequenced); every percentile below Debezium's with poll.interval.ms 10
        "latency.500/p99_to_bound": "≤ 1",
        "latency.500/to_debezium": "≤ 1",
    }.items()
}


def for_bench(bench: str) -> dict[str, Target]:
    """``bench``'s targets, keyed by figure name (without the ``<benchmark>.`` prefix)."""
    prefix = f"{bench}."
    return {k[len(prefix) :]: t for k, t in TARGETS.items() if k.startswith(prefix)}
