"""Consumer group: two members share a topic; on rebalance the revoked
partitions' state is saved by the application's on_revoke (before it is
dropped) and the new owner starts from it via on_assign, so every committed
record is delivered exactly once across members, open spans included."""

from __future__ import annotations

import time

import pytest
from cons_testlib import Gen, kafka_config, key, per_partition, produce, reference

from harvest_outbox.consumer import ReadCommittedIter
from harvest_outbox.sequencer import decode_checkpoint, encode_checkpoint

pytestmark = pytest.mark.integration


class DictStore:
    """Per-journal checkpoint rows, like PostgresCheckpointStore, in memory."""

    def __init__(self) -> None:
        self.rows: dict[str, bytes] = {}

    def save(self, cp: bytes) -> None:
        offsets, states = decode_checkpoint(cp)
        for j in set(offsets) | {s.journal for s in states}:
            self.rows[j] = encode_checkpoint(
                {j: offsets[j]} if j in offsets else {}, [s for s in states if s.journal == j]
            )

    def load(self, journals: list[str]) -> bytes | None:
        offsets, states = {}, []
        for j in journals:
            if j in self.rows:
                o, s = decode_checkpoint(self.rows[j])
                offsets.update(o)
                states.extend(s)
        return encode_checkpoint(offsets, states) if offsets or states else None


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_two_members_share_partitions_exactly_once(kafka_bootstrap: str, topic_factory, unique_name, strategy) -> None:
    topic = topic_factory(partitions=4)
    gen = Gen(31, partitions=4)
    first = gen.records(400)
    store = DictStore()
    events: dict[str, list] = {"m1": [], "m2": []}
    delivered: dict[str, list] = {"m1": [], "m2": []}
    cfg = kafka_config(
        kafka_bootstrap,
        **{
            "group.id": unique_name("g"),
            "partition.assignment.strategy": strategy,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        },
    )

    def member(name: str) -> ReadCommittedIter:
        holder: list[ReadCommittedIter] = []

        def on_revoke(tps):
            events[name].append(("revoke", sorted(tps)))
            store.save(holder[0].checkpoint())  # state of the revoked partitions is still there

        def on_assign(tps):
            events[name].append(("assign", sorted(tps)))
            return store.load([f"{t}/{p}" for t, p in tps])

        it = ReadCommittedIter(cfg, topics=[topic], ring_size=8, on_assign=on_assign, on_revoke=on_revoke)
        holder.append(it)
        return it

    def pump(members: dict[str, ReadCommittedIter], until, limit: float = 30.0) -> None:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline and not until():
            for name, it in members.items():
                rec = it.poll(0.1)
                if rec is not None:
                    delivered[name].append(key(rec))
                    store.save(it.checkpoint())

    offsets = produce(kafka_bootstrap, topic, first)
    m1 = member("m1")
    try:
        want_first = [t for t in reference(topic, first, offsets, 8) if not t[2].startswith((b"ack", b"rb"))]
        pump({"m1": m1}, lambda: len(delivered["m1"]) >= len(want_first))
        assert len(m1.assignment) == 4 and sorted(delivered["m1"]) == sorted(want_first)
        m2 = member("m2")
        try:
            pump({"m1": m1, "m2": m2}, lambda: len(m1.assignment) == 2 and len(m2.assignment) == 2)
            assert set(m1.assignment).isdisjoint(m2.assignment)
            second = gen.records(400)
            more = produce(kafka_bootstrap, topic, second)
            for p, offs in more.items():
                offsets.setdefault(p, []).extend(offs)
            want = reference(topic, first + second, offsets, 8)
            want = [t for t in want if not t[2].startswith((b"ack", b"rb"))]
            pump({"m1": m1, "m2": m2}, lambda: len(delivered["m1"]) + len(delivered["m2"]) >= len(want))
            pump({"m1": m1, "m2": m2}, lambda: False, limit=1.0)  # nothing more may come
        finally:
            m2.close()
    finally:
        m1.close()
    assert any(e[0] == "revoke" for e in events["m1"]), events
    assert any(e[0] == "assign" and e[1] for e in events["m2"]), events
    everything = delivered["m1"] + delivered["m2"]
    assert len(everything) == len(set(everything)), "delivered twice across members"
    assert sorted(everything) == sorted(want)
    # Per partition, each member's deliveries are in the reference order.
    ref = per_partition(want)
    for name in ("m1", "m2"):
        for p, got in per_partition(delivered[name]).items():
            idx = [ref[p].index(t) for t in got]
            assert idx == sorted(idx)
