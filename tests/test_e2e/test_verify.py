"""The verifier itself: each kind of violation is counted, a clean run passes."""

from __future__ import annotations

import pytest

from harvest_outbox.harvest_local.verify import verify

TRUTH = {"a": 3, "b": 2}


@pytest.mark.parametrize(
    "delivered, lost, dups, order, phantoms",
    [
        ([("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3)], 0, 0, 0, 0),
        ([("a", 1), ("a", 3), ("b", 1), ("b", 2)], 1, 0, 0, 0),
        ([("a", 1), ("a", 2), ("a", 2), ("a", 3), ("b", 1), ("b", 2)], 0, 1, 0, 0),
        ([("a", 2), ("a", 1), ("a", 3), ("b", 1), ("b", 2)], 0, 0, 1, 0),
        ([("a", 1), ("a", 2), ("a", 3), ("a", 4), ("b", 1), ("b", 2)], 0, 0, 0, 1),
        ([("c", 1), ("a", 1), ("a", 2), ("a", 3), ("b", 1), ("b", 2)], 0, 0, 0, 1),
        ([], 5, 0, 0, 0),
    ],
)
def test_verify_counts_each_violation(delivered, lost, dups, order, phantoms) -> None:
    v = verify("r", TRUTH, delivered)
    assert (v.lost, v.duplicates, v.order_violations, v.phantoms) == (lost, dups, order, phantoms)
    assert v.ok is (lost == dups == order == phantoms == 0)
