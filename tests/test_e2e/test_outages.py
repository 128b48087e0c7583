"""The outage matrix, compact version (CI): each fault kind once, at a short duration, against a
2-relay group while writers commit (with rollbacks), verified end to end (harvest_local/outages.py).

Modes alternate across the fault kinds so both are covered in CI; ``HARVEST_OUTAGES_FULL=1`` runs
every fault in both modes, and ``scripts/outages.py`` runs the README's table (60 s faults).
A fault's run must end with both relays running, the backlog the fault built up delivered
(recovery time printed), and the topic verified: exactly once in ``--uuid-sequencing`` mode; every
committed version, first arrivals in per-key order, in at-least-once mode.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harvest_outbox.harvest_local.outages import FAULTS, Outage, run_outage, table

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DURATION = float(os.environ.get("HARVEST_OUTAGE_SECONDS", "8"))
if os.environ.get("HARVEST_OUTAGES_FULL"):
    CASES = [(f, s) for f in FAULTS for s in (True, False)]
else:
    CASES = [(f, i % 2 == 0) for i, f in enumerate(FAULTS)]


@pytest.mark.parametrize(("fault", "sequenced"), CASES, ids=[f"{f}-{'seq' if s else 'alo'}" for f, s in CASES])
def test_outage_heals_by_itself(fault: str, sequenced: bool, services, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    if services.kafka is None or services.postgres is None:
        pytest.skip("outage tests need the locally launched Postgres and Kafka (not HARVEST_*_DSN/BOOTSTRAP)")
    # Faults that stall Kafka run with rowTimeout 3s (< the fault): records time out during the
    # outage and must be re-sent, not dead-lettered.
    row_timeout = "3s" if fault in ("broker_pause", "kafka_blackhole") else None
    result = run_outage(services, Outage(fault, sequenced, duration=DURATION, row_timeout=row_timeout), tmp_path)
    print("\n" + table([result]) + (f"\nnotes: {result.notes}" if result.notes else ""))
    assert result.relays_alive, f"{result.notes} (logs in {tmp_path})"
    assert result.dead_letters == 0, f"an outage dead-lettered rows: {result.notes} (logs in {tmp_path})"
    assert result.recovery is not None, f"the backlog built up during {fault} was not delivered (logs in {tmp_path})"
    v = result.verdict
    assert v is not None and result.committed > 0
    assert v.lost == 0 and v.order_violations == 0 and v.phantoms == 0, f"{v} (logs in {tmp_path})"
    if sequenced:
        assert v.duplicates == 0, f"{v} (logs in {tmp_path})"
