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


@pytest.mark.parametrize(
    "delivered, ok",
    [
        # a repeat (a batch sent again after a lost acknowledgement), first arrivals in order: what
        # at-least-once promises
        ([("a", 1), ("a", 2), ("a", 1), ("a", 2), ("a", 3), ("b", 1), ("b", 2), ("b", 2)], True),
        ([("a", 1), ("a", 3), ("b", 1), ("b", 2), ("a", 3)], False),  # a/2 lost, repeats do not make up for it
        ([("a", 2), ("a", 1), ("a", 3), ("b", 1), ("b", 2)], False),  # first arrivals out of order
        ([("a", 1), ("a", 2), ("a", 3), ("a", 4), ("b", 1), ("b", 2)], False),  # a rolled-back version
    ],
)
def test_an_at_least_once_verdict_allows_repeats_and_nothing_else(delivered, ok) -> None:
    v = verify("r", TRUTH, delivered, exactly_once=False)
    assert v.ok is ok
    assert v.violations == v.lost + v.order_violations + v.phantoms
    assert verify("r", TRUTH, delivered).ok is (ok and v.duplicates == 0)


def test_a_fault_plan_draws_elections_shards_modes_and_at_most_one_failover() -> None:
    from harvest_outbox.harvest_local.faults import FAILOVER_KIND, FaultPlan

    plans = [FaultPlan.random(seed, brokers=3, standby=True) for seed in range(200)]
    assert {p.election for p in plans} == {"neli", "postgres"}
    assert {p.shards for p in plans} == {1, 2, 3}
    assert {p.mode for p in plans} == {"sequenced", "at-least-once"}
    assert any(FAILOVER_KIND in p.faults for p in plans)
    assert all(p.faults.count(FAILOVER_KIND) <= 1 for p in plans)
    assert {"client_partition_drop", "client_partition_reject"} <= {f for p in plans for f in p.faults}
    assert not any(FAILOVER_KIND in FaultPlan.random(seed).faults for seed in range(200))  # no standby, no fail-over
    with pytest.raises(ValueError, match="at most one"):
        FaultPlan(seed=1, standby=True, faults=(FAILOVER_KIND, FAILOVER_KIND))
    with pytest.raises(ValueError, match="standby=True"):
        FaultPlan(seed=1, faults=(FAILOVER_KIND,))
    with pytest.raises(ValueError, match="election 'raft'"):
        FaultPlan(seed=1, election="raft")


def test_a_pipeline_plan_kills_its_driver_half_of_the_time_and_keeps_the_other_draws() -> None:
    """The pipeline's kill is drawn last, so a seed's other draws are those of the plan without it."""
    from dataclasses import replace

    from harvest_outbox.harvest_local.faults import PIPELINE_KILL, FaultPlan

    for seed in range(100):
        plain = FaultPlan.random(seed, brokers=3, standby=True)
        piped = FaultPlan.random(seed, brokers=3, standby=True, pipeline=True)
        assert piped.pipeline and not plain.pipeline
        assert replace(piped, pipeline=False, faults=tuple(f for f in piped.faults if f != PIPELINE_KILL)) == plain
        assert PIPELINE_KILL not in plain.faults
    kills = sum(PIPELINE_KILL in FaultPlan.random(seed, pipeline=True).faults for seed in range(200))
    assert 60 < kills < 140
    with pytest.raises(ValueError, match="pipeline=True"):
        FaultPlan(seed=1, faults=(PIPELINE_KILL,))
