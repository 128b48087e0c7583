"""The SLO histograms' counting (pure logic, no services): a batch counted by sorting (one topic, many
rows) lands in the same buckets as one counted row by row; bounds are ``<=`` (Prometheus' ``le``);
the exported cumulative counts, count and sum."""

from __future__ import annotations

import random

import pytest

from harvest_outbox.producer.observe._histograms import (
    DWELL_BUCKETS,
    TRANSACTION_ROWS_BUCKETS,
    DwellHistograms,
    cumulative,
    new_cells,
    observe,
)


def rows(topics: list[str], created: list[float]) -> list[tuple]:
    return [
        (i, t, b"k", b"v", None, None, None, None, None, None, c)
        for i, (t, c) in enumerate(zip(topics, created, strict=True))
    ]


@pytest.mark.parametrize("n, topics", [(1, 1), (31, 1), (32, 1), (5000, 1), (5000, 3), (40, 2)])
def test_a_batch_lands_where_its_rows_would_one_by_one(n: int, topics: int) -> None:
    rnd = random.Random(n * 10 + topics)
    now = 1000.0
    ages = [rnd.choice((0.0005, 0.003, 0.2, 1.0, 7.0, 400.0)) * rnd.uniform(0.5, 1.5) for _ in range(n)]
    batch = rows([f"t{i % topics}" for i in range(n)], [now - a for a in ages])
    together, one_by_one = DwellHistograms(), DwellHistograms()
    together.observe(batch, now)
    for row in batch:
        one_by_one.observe([row], now)
    assert together.by_topic.keys() == one_by_one.by_topic.keys()
    for topic, cells in together.by_topic.items():
        assert cells[:-1] == one_by_one.by_topic[topic][:-1], topic
        assert cells[-1] == pytest.approx(one_by_one.by_topic[topic][-1])
    assert sum(sum(c[:-1]) for c in together.by_topic.values()) == n
    assert sum(c[-1] for c in together.by_topic.values()) == pytest.approx(sum(ages))


@pytest.mark.parametrize(
    "dwell, bucket",
    [
        (0.0, 0),
        (0.001, 0),
        (0.0011, 1),
        (1.0, DWELL_BUCKETS.index(1.0)),
        (300.0, len(DWELL_BUCKETS) - 1),
        (300.5, len(DWELL_BUCKETS)),
        (-0.002, 0),  # -: a mark's send time read before the row's commit
    ],
)
def test_bounds_count_values_at_or_below_them(dwell: float, bucket: int) -> None:
    h = DwellHistograms()
    h.observe(rows(["t"], [50.0 - dwell]), 50.0)
    cells = h.by_topic["t"]
    assert cells[bucket] == 1 and sum(cells[:-1]) == 1


def test_cumulative_counts_sum_and_count() -> None:
    cells = new_cells(TRANSACTION_ROWS_BUCKETS)
    for n in (1, 1, 3, 5000, 20000):
        observe(cells, TRANSACTION_ROWS_BUCKETS, n)
    buckets, total, count = cumulative(cells, TRANSACTION_ROWS_BUCKETS)
    as_dict = dict(buckets)
    assert (as_dict[1.0], as_dict[2.0], as_dict[5.0], as_dict[5000.0], as_dict[10000.0], as_dict[float("inf")]) == (
        2,
        2,
        3,
        4,
        4,
        5,
    )
    assert [n for _le, n in buckets] == sorted(n for _le, n in buckets)
    assert (total, count) == (25005, 5)
