"""MarkSize: the adaptive mark size (producer/marksize.py invariants)."""

from __future__ import annotations

import math

import pytest

from harvest_outbox.producer.marksize import MarkSize


def test_full_marks_double_up_to_the_ceiling_in_log2_steps() -> None:
    size = MarkSize(100, 5000)
    steps = 0
    while size.value < size.ceiling:
        size.observe(size.value, size.value)
        steps += 1
    assert size.value == 5000 and steps == math.ceil(math.log2(5000 / 100))
    size.observe(5000, 5000)
    assert size.value == 5000  # never beyond the ceiling (the user's markQueryRecords)


def test_empty_marks_halve_back_to_the_floor() -> None:
    size = MarkSize(100, 6400)
    size.value = 6400
    seen = []
    while size.value > size.floor:
        seen.append(size.observe(size.value, 0))
    assert seen == [3200, 1600, 800, 400, 200, 100]
    assert size.observe(100, 0) == 100


@pytest.mark.parametrize(("got", "expected"), [(1000, 2000), (999, 1000), (250, 1000), (249, 500), (0, 500)])
def test_partly_full_marks(got: int, expected: int) -> None:
    size = MarkSize(100, 5000)
    size.value = 1000
    assert size.observe(1000, got) == expected


def test_a_stale_ask_grows_from_the_larger_of_ask_and_value() -> None:
    # A mark asked for 200 while the size has meanwhile grown to 800 (a prefetch): full -> 1600.
    size = MarkSize(100, 5000)
    size.value = 800
    assert size.observe(200, 200) == 1600


@pytest.mark.parametrize(("floor", "ceiling"), [(0, 10), (10, 5), (-1, 1)])
def test_bad_bounds_are_refused(floor: int, ceiling: int) -> None:
    with pytest.raises(ValueError, match="floor <= ceiling"):
        MarkSize(floor, ceiling)


def test_a_configured_ceiling_below_the_floor_is_the_size() -> None:
    from harvest_outbox.producer.config import MARK_FLOOR, Limits

    lim = Limits(mark_query_records=10)
    size = MarkSize(min(MARK_FLOOR, lim.mark_ceiling), lim.mark_ceiling)
    assert size.value == 10 and size.observe(10, 10) == 10
