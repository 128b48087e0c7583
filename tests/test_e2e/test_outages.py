"""The outage matrix, compact version (CI): each fault kind once, at a short duration, against a
2-relay group while writers commit (with rollbacks), verified end to end (harvest_local/outages.py).

Modes alternate across the fault kinds so both are covered in CI; ``HARVEST_OUTAGES_FULL=1`` runs
every fault in both modes, and ``scripts/outages.py`` runs docs/reliability.md's table (60 s faults, one run
each). A run must end with both relays running, the backlog each fault built up delivered (recovery
time printed per fault), and the topic verified: exactly once in ``--uuid-sequencing`` mode; every
committed version, first arrivals in per-key order, in at-least-once mode.

The faults of one mode and one ``rowTimeout`` share a run (``Outage.then``): one relay group, one
topic, one verification, each fault applied once the one before has healed, its backlog is gone
and rows have flowed normally again — so each still hits caught-up relays under load, as in a run
of its own, and a fault that leaves a relay stuck, loses, duplicates or reorders a row still fails
its run (the recovery list names the fault). What a run of its own added was the set-up (relay
start, election, warm-up) and the verification read, ~25 s a fault: 10 runs of ~35-43 s became 4.
Faults that stall Kafka (broker_pause, kafka_blackhole) keep their run with rowTimeout 3 s, the
others the default, as before: a shorter rowTimeout may rightly park a row on a partial outage
(docs/reliability.md), so it is not imposed on faults that never ran with it.

``outboxLayout: cursor`` (issue #37): two of the four runs are on the cursor layout, each with a Postgres
fault the cursor store must survive in the mode the mark layout does not run it in: the ``--uuid-sequencing``
run of Postgres faults (restart, blackhole, latency, then a Kafka reset) ends with a connection reset
mid-flight (a fenced cursor commit whose reply may be lost), and the at-least-once Kafka blackhole run ends
with a server restart (the relays resume from the committed cursor). They were runs of their own (~13 s
each, mostly set-up and verification); folded in, the mark layout's ``--uuid-sequencing`` mode meets
Postgres faults in test_faults.py (a restart) and in the sequenced mode's own tests (a commit whose reply
is lost, a relay frozen mid-commit), not here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harvest_outbox.harvest_local.outages import FAULTS, Outage, run_outage, table

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DURATION = float(os.environ.get("HARVEST_OUTAGE_SECONDS", "8"))
FULL = bool(os.environ.get("HARVEST_OUTAGES_FULL"))
if FULL:
    CASES = [(f, s) for f in FAULTS for s in (True, False)]
else:
    CASES = [(f, i % 2 == 0) for i, f in enumerate(FAULTS)]
# Faults that stall Kafka run with rowTimeout 3s (< the fault): records time out during the outage
# and must be re-sent, not dead-lettered.
STALLS_KAFKA = ("broker_pause", "kafka_blackhole")


def _runs(cases: list[tuple[str, bool]]) -> list[tuple[tuple[str, ...], bool]]:
    """The cases grouped by (mode, rowTimeout), fault order kept: one run per group."""
    groups: dict[tuple[bool, bool], list[str]] = {}
    for fault, sequenced in cases:
        groups.setdefault((sequenced, fault in STALLS_KAFKA), []).append(fault)
    return [(tuple(faults), sequenced) for (sequenced, _), faults in groups.items()]


RUNS = _runs(CASES)
# (first fault of a run, mode) -> the cursor layout, and the fault appended to that run
CURSOR_FOLDS = {("pg_restart", True): "pg_reset", ("kafka_blackhole", False): "pg_restart"}
LAYOUT_RUNS = [
    ((*f, CURSOR_FOLDS[f[0], s]), s, "cursor") if (f[0], s) in CURSOR_FOLDS and not FULL else (f, s, "mark")
    for f, s in RUNS
]
if FULL:  # every fault in both modes on the mark layout, and the cursor's two
    LAYOUT_RUNS += [(("pg_reset",), True, "cursor"), (("pg_restart",), False, "cursor")]


@pytest.mark.parametrize(
    ("faults", "sequenced", "layout"),
    LAYOUT_RUNS,
    ids=[f"{'seq' if s else 'alo'}-{'+'.join(f)}{'' if lay == 'mark' else '-' + lay}" for f, s, lay in LAYOUT_RUNS],
)
def test_outages_heal_by_themselves(  # type: ignore[no-untyped-def]
    faults: tuple[str, ...], sequenced: bool, layout: str, services, tmp_path: Path
) -> None:
    if services.kafka is None or services.postgres is None:
        pytest.skip("outage tests need the locally launched Postgres and Kafka (not HARVEST_*_DSN/BOOTSTRAP)")
    row_timeout = "3s" if faults[0] in STALLS_KAFKA else None
    # The Kafka stalls outlast rowTimeout and the relays' 6 s session; the other faults need no such length.
    duration = DURATION if faults[0] in STALLS_KAFKA else min(DURATION, 5.0)
    outage = Outage(faults[0], sequenced, duration=duration, row_timeout=row_timeout, then=faults[1:], layout=layout)
    result = run_outage(services, outage, tmp_path)
    print("\n" + table([result]) + (f"\nnotes: {result.notes}" if result.notes else ""))
    assert result.relays_alive, f"{result.notes} (logs in {tmp_path})"
    assert result.dead_letters == 0, f"an outage dead-lettered rows: {result.notes} (logs in {tmp_path})"
    assert [f for f, _ in result.recoveries] == list(faults), f"{result.recoveries} (logs in {tmp_path})"
    assert result.recovery is not None, (
        f"the backlog built up during a fault was not delivered: {result.recoveries} (logs in {tmp_path})"
    )
    v = result.verdict
    assert v is not None and result.committed > 0
    assert v.lost == 0 and v.order_violations == 0 and v.phantoms == 0, f"{v} (logs in {tmp_path})"
    if sequenced:
        assert v.duplicates == 0, f"{v} (logs in {tmp_path})"


def test_the_runs_cover_every_case_once() -> None:
    """Grouping loses no (fault, mode) case and keeps each fault's rowTimeout."""
    covered = sorted((f, s) for faults, s in RUNS for f in faults)
    assert covered == sorted(CASES)
    for faults, _ in RUNS:
        assert len({f in STALLS_KAFKA for f in faults}) == 1, faults


def test_the_cursor_runs_cover_both_modes_with_a_postgres_fault() -> None:
    """The cursor layout's runs: each mode once, each ending with a Postgres fault (its store is what changed),
    each a run of the grouping with that fault added; every other run on the mark layout."""
    cursor = [(faults, s) for faults, s, layout in LAYOUT_RUNS if layout == "cursor"]
    assert sorted(s for _, s in cursor) == [False, True]
    for faults, s in cursor:
        assert faults[-1] in FAULTS and faults[-1].startswith("pg_"), faults
        if not FULL:  # (HARVEST_OUTAGES_FULL: the cursor's faults in runs of their own, after every mark run)
            assert (faults[:-1], s) in RUNS and CURSOR_FOLDS[faults[0], s] == faults[-1]
    assert len(LAYOUT_RUNS) == len(RUNS) + (2 if FULL else 0)
