"""ReadUncommittedIter: explicit assignment and start offsets, log order,
blocking poll without busy-waiting, close/context manager, lost offsets."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from cons_testlib import Rec, kafka_config, produce

from harvest_outbox.consumer import (
    ConsumerClosedError,
    KafkaReadError,
    OffsetLostError,
    ReadCommittedIter,
    ReadUncommittedIter,
)
from harvest_outbox.sequencer import encode_checkpoint

pytestmark = pytest.mark.integration


def test_explicit_partitions_start_offsets_and_order(kafka_bootstrap: str, topic_factory) -> None:
    topic = topic_factory(partitions=2)
    produce(kafka_bootstrap, topic, [Rec(i % 2, None, b"%d" % i) for i in range(20)])
    with ReadUncommittedIter(kafka_config(kafka_bootstrap), partitions=[(topic, 1)], offsets={f"{topic}/1": 4}) as it:
        assert it.assignment == [(topic, 1)]
        got = [env for env in iter(lambda: it.poll(1.0), None)]
    assert [e.begin for e in got] == list(range(4, 10))
    assert all(e.journal == f"{topic}/1" and e.end == e.begin + 1 and e.message.uuid is None for e in got)
    # "latest" starts at the end.
    with ReadUncommittedIter(kafka_config(kafka_bootstrap, **{"auto.offset.reset": "latest"}), topics=[topic]) as it:
        assert it.poll(1.0) is None


def test_poll_blocks_without_busy_loop_and_close(kafka_bootstrap: str, topic_factory) -> None:
    topic = topic_factory()
    it = ReadCommittedIter(kafka_config(kafka_bootstrap), topics=[topic], idle_timeout=0.5)
    t0, c0 = time.monotonic(), time.process_time()
    assert it.poll(1.5) is None
    wall, cpu = time.monotonic() - t0, time.process_time() - c0
    assert 1.4 <= wall < 3.0
    assert cpu < 0.5 * wall, f"poll used {cpu:.2f}s CPU in {wall:.2f}s: busy loop?"
    assert list(it) == []  # iteration ends after idle_timeout
    it.close()
    it.close()  # idempotent
    assert it.closed
    with pytest.raises(ConsumerClosedError):
        it.poll(0.1)
    with pytest.raises(ConsumerClosedError):
        it.checkpoint()
    with pytest.raises(KafkaReadError, match="cannot be read"):
        ReadCommittedIter(kafka_config(kafka_bootstrap), topics=[topic + "-missing"])


def test_checkpoint_offset_deleted_by_retention_raises(kafka_bootstrap: str, topic_factory) -> None:
    topic = topic_factory()
    produce(kafka_bootstrap, topic, [Rec(0, None, b"%d" % i) for i in range(10)])
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    futs = admin.delete_records([TopicPartition(topic, 0, 6)])
    for f in futs.values():
        f.result(30)
    cp = encode_checkpoint({f"{topic}/0": 2}, [])
    with ReadCommittedIter(kafka_config(kafka_bootstrap), topics=[topic], checkpoint=cp) as it:
        with pytest.raises(OffsetLostError, match="no longer in the log"):
            it.poll(10.0)
    # Without a checkpoint the configured reset position applies.
    with ReadCommittedIter(kafka_config(kafka_bootstrap), topics=[topic]) as it:
        assert [r.offset for r in iter(lambda: it.poll(1.0), None)] == [6, 7, 8, 9]


def test_failed_replay_closes_the_reader(kafka_bootstrap: str, topic_factory) -> None:
    from harvest_outbox.consumer import ReplayFailedError
    from harvest_outbox.sequencer import Flags, build_uuid, new_producer_id

    topic = topic_factory()
    a, b = new_producer_id(), new_producer_id()
    recs = [Rec(0, build_uuid(a, 160, Flags.CONTINUE_TXN), b"A1")]
    recs += [Rec(0, build_uuid(b, 160 * (i + 1), Flags.OUTSIDE_TXN), b"B%d" % i) for i in range(4)]
    recs.append(Rec(0, build_uuid(a, 320, Flags.ACK_TXN), b"A-ACK"))
    produce(kafka_bootstrap, topic, recs)
    it = ReadCommittedIter(kafka_config(kafka_bootstrap), topics=[topic], ring_size=2)

    class BrokenReplay:
        replays = replayed_records = 0

        def read(self, journal, begin, end):
            raise RuntimeError("broker went away")
            yield  # pragma: no cover

        def close(self) -> None:
            pass

    it._replayer.close()
    it._replayer = BrokenReplay()  # type: ignore[assignment]
    got = []
    with pytest.raises(ReplayFailedError, match="broker went away") as info:
        while True:
            r = it.poll(2.0)
            assert r is not None
            got.append(r.value)
    assert got == [b"B0", b"B1", b"B2", b"B3"]
    assert info.value.__cause__ is not None
    assert it.closed
