"""The relay's histograms (outbox SLOs): dwell per topic and rows per harvest transaction, counted in
plain lists on the relay thread and exported by the ``/metrics`` collector (:mod:`producer.observe.metrics`).

Dwell is the time from a row's commit to the acknowledgement that ends its trip: Kafka's delivery
report (at-least-once) or the delivery of its transaction's last ACK_TXN, when read-committed readers
can see it (``--uuid-sequencing``). The row's commit is its ``create_time`` (a Debezium table's
``harvest_created``): ``now()`` of the writing transaction, i.e. its start, so a dwell includes the
writer's own transaction and is an upper bound. The mark returns that time on this process's
``time.monotonic()`` clock (``producer.db``: the row's age at the mark, on the database's clock, taken
from the relay's clock reading just before the mark was sent), so the two hosts' wall clocks never
enter it; it reads at most the mark's send time (well under a millisecond on a LAN) too long.

Invariants:
- no lock and no prometheus_client call per record: a mode hands over a batch of delivered rows
  (a poll's delivery reports, a transaction's rows) and the batch is counted at once;
- a bucket counts values ``<= le`` (Prometheus' rule); the last cell of a histogram's list is the
  sum of its values, the one before it the count above the last bound (``+Inf``);
- one histogram per topic the relay has delivered to: topics that do not exist are dead-lettered
  or held, never delivered, so the label's values are bounded by the cluster's topics.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from operator import itemgetter

from harvest_outbox.producer.db import MarkedRow
from harvest_outbox.producer.relay.marked_row import ROW_CREATED, ROW_TOPIC

#: Dwell buckets (seconds): 1 ms (a trickled row's round trip) to 5 minutes (the backlog alert's age).
DWELL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
#: Rows per harvest transaction: 1 (a trickle) up to well past txnMaxRecords' default.
TRANSACTION_ROWS_BUCKETS = (1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0)

# From this many rows of one topic a batch is counted by sorting its create times and bisecting them
# once per bound (C loops), instead of one bisect per row in Python: ~80 against ~150 ns a row.
_SORT_FROM = 32
_TOPIC, _CREATED = itemgetter(ROW_TOPIC), itemgetter(ROW_CREATED)


def new_cells(bounds: Sequence[float]) -> list[float]:
    """A histogram's cells: one count per bound, the ``+Inf`` count, then the sum."""
    return [0] * (len(bounds) + 1) + [0.0]


def observe(cells: list[float], bounds: Sequence[float], value: float) -> None:
    cells[bisect_left(bounds, value)] += 1
    cells[-1] += value


def cumulative(cells: Sequence[float], bounds: Sequence[float]) -> tuple[list[tuple[float, float]], float, float]:
    """``([(le, count <= le), …, (inf, count)], sum, count)`` of a copy of ``cells`` (taken in one C call:
    consistent while the relay thread keeps counting)."""
    snap = list(cells)
    out, total = [], 0.0
    for le, n in zip((*bounds, float("inf")), snap[:-1], strict=True):
        total += n
        out.append((le, total))
    return out, snap[-1], total


class DwellHistograms:
    """Dwell per topic (see module doc). ``by_topic`` is read by the collector's thread."""

    def __init__(self, bounds: Sequence[float] = DWELL_BUCKETS) -> None:
        self.bounds = tuple(bounds)
        self.by_topic: dict[str, list[float]] = {}

    def observe(self, rows: Sequence[MarkedRow], now: float) -> None:
        """Count the dwell of ``rows``, acknowledged at ``now`` (``time.monotonic()``)."""
        if len(rows) >= _SORT_FROM:
            topics = set(map(_TOPIC, rows))
            if len(topics) == 1:
                created: list[float] = sorted(map(_CREATED, rows))
                self._observe_sorted(self._cells(topics.pop()), created, now)
                return
        by_topic, bounds = self.by_topic, self.bounds
        for row in rows:
            topic = row[ROW_TOPIC]
            if topic is None:
                continue  # (never: only a bad row has no topic, and a bad row is not delivered)
            cells = by_topic.get(topic)
            if cells is None:
                cells = self._cells(topic)
            dwell = now - row[ROW_CREATED]
            cells[bisect_left(bounds, dwell)] += 1
            cells[-1] += dwell

    def _cells(self, topic: str) -> list[float]:
        cells = self.by_topic.get(topic)
        if cells is None:
            cells = self.by_topic[topic] = new_cells(self.bounds)
        return cells

    def _observe_sorted(self, cells: list[float], created: list[float], now: float) -> None:
        # dwell <= le  <=>  created >= now - le: the rows at or after that point of the sorted times
        n, counted = len(created), 0
        for i, le in enumerate(self.bounds):
            within = n - bisect_left(created, now - le)
            if within > counted:
                cells[i] += within - counted
                counted = within
                if counted == n:
                    break
        cells[len(self.bounds)] += n - counted
        cells[-1] += n * now - sum(created)
