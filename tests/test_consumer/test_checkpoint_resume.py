"""Checkpoints: a reader restored from ``checkpoint()`` delivers every committed
record after it exactly once, never one from before, including checkpoints
taken mid-sequence and while spans are open (resume re-reads from the
read-through offset and replays open spans)."""

from __future__ import annotations

import logging
import random

import pytest
from cons_testlib import Gen, Rec, drain, kafka_config, key, per_partition, produce, reference

from harvest_outbox.consumer import CheckpointMismatchError, ConfigError, ReadCommittedIter
from harvest_outbox.sequencer import Flags, build_uuid, decode_checkpoint, encode_checkpoint, new_producer_id

pytestmark = pytest.mark.integration


def test_open_span_survives_checkpoint(kafka_bootstrap: str, topic_factory) -> None:
    topic = topic_factory()
    cfg = kafka_config(kafka_bootstrap)
    a, b = new_producer_id(), new_producer_id()
    produce(
        kafka_bootstrap,
        topic,
        [
            Rec(0, build_uuid(a, 160, Flags.CONTINUE_TXN), b"A1"),
            Rec(0, build_uuid(b, 160, Flags.CONTINUE_TXN), b"B1"),
            Rec(0, build_uuid(a, 320, Flags.CONTINUE_TXN), b"A2"),
            Rec(0, build_uuid(b, 320, Flags.OUTSIDE_TXN), b"B-outside"),  # clobbers B's open span
        ],
    )
    with ReadCommittedIter(cfg, topics=[topic]) as it:
        assert [r.value for r in drain(it, expect=1, idle=1.0)] == [b"B-outside"]
        assert it.has_pending()
        cp = it.checkpoint()
    offsets, states = decode_checkpoint(cp)
    assert offsets == {f"{topic}/0": 4}
    assert {(s.producer, s.last_ack, s.begin) for s in states} == {(a, 159, 0), (b, 320, -1)}

    produce(
        kafka_bootstrap,
        topic,
        [
            Rec(0, build_uuid(a, 480, Flags.CONTINUE_TXN), b"A3"),
            Rec(0, build_uuid(b, 160, Flags.ACK_TXN), b"B-stale-ack"),
            Rec(0, build_uuid(a, 640, Flags.ACK_TXN), b"A-ACK"),
        ],
    )
    with ReadCommittedIter(cfg, topics=[topic], checkpoint=cp, ring_size=8192) as it:
        got = drain(it, expect=3, idle=1.0)
        assert [r.value for r in got] == [b"A1", b"A2", b"A3"]
        assert it.stats["replays"] == 1  # A1, A2 were read before the checkpoint
        cp2 = it.checkpoint()
    with ReadCommittedIter(cfg, topics=[topic], checkpoint=cp2) as it:
        assert drain(it, idle=1.0) == []


def test_checkpoint_mid_sequence(kafka_bootstrap: str, topic_factory) -> None:
    topic = topic_factory()
    cfg = kafka_config(kafka_bootstrap)
    a = new_producer_id()
    recs = [Rec(0, build_uuid(a, 160 * (i + 1), Flags.CONTINUE_TXN), b"m%d" % i) for i in range(10)]
    recs.append(Rec(0, build_uuid(a, 160 * 11, Flags.ACK_TXN), b"ack"))
    produce(kafka_bootstrap, topic, recs)
    seen: list[bytes] = []
    cp = None
    for take in (1, 3, 2, 100):
        with ReadCommittedIter(cfg, topics=[topic], checkpoint=cp, ring_size=8192) as it:
            for _ in range(take):
                r = it.poll(5.0 if take < 100 else 1.0)
                if r is None:
                    break
                seen.append(r.value)
            cp = it.checkpoint()
    assert seen == [b"m%d" % i for i in range(10)]


@pytest.mark.parametrize(("seed", "partitions", "ring_size"), [(11, 1, 4), (12, 2, 8192)])
def test_random_restarts_deliver_each_record_once(
    kafka_bootstrap: str, topic_factory, seed, partitions, ring_size
) -> None:
    topic = topic_factory(partitions=partitions)
    cfg = kafka_config(kafka_bootstrap)
    recs = Gen(seed, partitions=partitions).records(500)
    offsets = produce(kafka_bootstrap, topic, recs)
    want = reference(topic, recs, offsets, ring_size)
    rnd = random.Random(seed)
    delivered: list[tuple[int, int, bytes]] = []
    cp = None
    restarts = 0
    while True:
        restarts += 1
        assert restarts < 60
        with ReadCommittedIter(cfg, topics=[topic], checkpoint=cp, ring_size=ring_size, include_acks=True) as it:
            n = rnd.randint(1, 60)
            batch = []
            for _ in range(n):
                # A generous timeout while records are due: a new consumer may need seconds to fetch a
                # partition that starts from auto.offset.reset on a loaded machine (a 1 s timeout here
                # once ended the run before partition 0 was read). Once all are in, a short one.
                r = it.poll(10.0 if len(delivered) + len(batch) < len(want) else 1.0)
                if r is None:
                    break
                batch.append(key(r))
            delivered.extend(batch)
            cp = it.checkpoint()
        if not batch:
            break
    assert restarts > 5
    assert len(set(delivered)) == len(delivered), "a record was delivered twice across restarts"
    assert per_partition(delivered) == per_partition(want)


def test_invalid_checkpoint_is_a_clear_error(kafka_bootstrap: str, topic_factory) -> None:
    topic = topic_factory()
    with pytest.raises(ConfigError, match="not a valid checkpoint"):
        ReadCommittedIter(kafka_config(kafka_bootstrap), topics=[topic], checkpoint=b"\x00garbage")


@pytest.mark.parametrize(("seed", "partitions", "ring_size"), [(13, 1, 4), (14, 2, 8192)])
def test_random_restarts_with_poll_batch(kafka_bootstrap: str, topic_factory, seed, partitions, ring_size) -> None:
    # Every record poll_batch() returned is covered by the next checkpoint(),
    # whatever the batch size: batches end mid-sequence, at commits and in replays.
    topic = topic_factory(partitions=partitions)
    cfg = kafka_config(kafka_bootstrap)
    recs = Gen(seed, partitions=partitions).records(500)
    offsets = produce(kafka_bootstrap, topic, recs)
    want = reference(topic, recs, offsets, ring_size)
    rnd = random.Random(seed)
    delivered: list[tuple[int, int, bytes]] = []
    cp = None
    restarts = 0
    while True:
        restarts += 1
        assert restarts < 400
        with ReadCommittedIter(cfg, topics=[topic], checkpoint=cp, ring_size=ring_size, include_acks=True) as it:
            got = []
            # At most 2 x 12 records per life, so the ~300 committed records take many restarts.
            for _ in range(rnd.randint(1, 2)):
                # A generous timeout while records are due (a new consumer may need seconds to join); once
                # all are in, a short one: an empty batch means the end, and a surplus would still show.
                batch = it.poll_batch(rnd.randint(1, 12), 10.0 if len(delivered) + len(got) < len(want) else 1.0)
                got.extend(key(r) for r in batch)
                if not batch:
                    break
            delivered.extend(got)
            cp = it.checkpoint()
        if not got:
            break
    assert restarts > 5
    assert len(set(delivered)) == len(delivered), "a record was delivered twice across restarts"
    assert per_partition(delivered) == per_partition(want)


def _checkpoint_of(kafka_bootstrap: str, topic: str, partitions: int) -> bytes:
    """A real checkpoint of a reader of partitions 0..partitions-1 of ``topic``, each with one
    committed record read."""
    a = new_producer_id()
    produce(
        kafka_bootstrap,
        topic,
        [Rec(p, build_uuid(a, 160 * (p + 1), Flags.OUTSIDE_TXN), b"x%d" % p) for p in range(partitions)],
    )
    with ReadCommittedIter(kafka_config(kafka_bootstrap), partitions=[(topic, p) for p in range(partitions)]) as it:
        assert len(drain(it, expect=partitions, idle=5.0)) == partitions
        cp = it.checkpoint()
    assert set(decode_checkpoint(cp)[0]) == {f"{topic}/{p}" for p in range(partitions)}
    return cp


@pytest.mark.parametrize(
    ("reader", "needle"),
    [
        # another topic entirely: every partition would silently start from auto.offset.reset
        ({"topics": ["<other>"]}, "none of which this reader reads (it reads topic '<other>' partition(s) 0, 1, 2)"),
        ({"partitions": [("<other>", 0)]}, "none of which this reader reads (it reads topic '<other>' partition(s) 0)"),
        ({"topics": ["<other>"], "group": True}, "none of which this reader reads (it reads topic '<other>')"),
        # the same topic, a partition the checkpoint does not cover
        ({"partitions": [("<topic>", 2)]}, "none of which this reader reads (it reads topic '<topic>' partition(s) 2)"),
    ],
)
def test_checkpoint_of_another_reader_is_refused(
    kafka_bootstrap: str, topic_factory, unique_name, reader: dict, needle: str
) -> None:
    topic, other = topic_factory(partitions=3), topic_factory(partitions=3)
    cp = _checkpoint_of(kafka_bootstrap, topic, 2)  # covers topic/0 and topic/1
    names = {"<topic>": topic, "<other>": other}
    extra = {"group.id": unique_name("g")} if reader.get("group") else {}
    kwargs = {
        k: ([names[t] for t in v] if k == "topics" else [(names[t], p) for t, p in v])
        for k, v in reader.items()
        if k != "group"
    }
    with pytest.raises(CheckpointMismatchError) as info:
        ReadCommittedIter(kafka_config(kafka_bootstrap, **extra), checkpoint=cp, **kwargs)
    message = str(info.value)
    for placeholder, name in names.items():
        needle = needle.replace(placeholder, name)
    assert needle in message and f"covers {topic}/0, {topic}/1" in message
    assert isinstance(info.value, ConfigError)


def test_checkpoint_naming_partitions_the_topic_lacks_is_refused(kafka_bootstrap: str, topic_factory) -> None:
    big, small = topic_factory(partitions=3), topic_factory(partitions=2)
    offsets, _states = decode_checkpoint(_checkpoint_of(kafka_bootstrap, big, 3))
    # The same name, fewer partitions (a re-created topic): rename the journals onto `small`.
    moved = {j.replace(big, small): o for j, o in offsets.items()}
    with pytest.raises(CheckpointMismatchError, match=f"covers {small}/2, which this reader's topic does not have"):
        ReadCommittedIter(kafka_config(kafka_bootstrap), topics=[small], checkpoint=encode_checkpoint(moved, []))


def test_checkpoint_entries_not_read_are_named_when_ignored(kafka_bootstrap: str, topic_factory, caplog) -> None:
    topic = topic_factory(partitions=2)
    cp = _checkpoint_of(kafka_bootstrap, topic, 2)
    produce(kafka_bootstrap, topic, [Rec(0, build_uuid(new_producer_id(), 160, Flags.OUTSIDE_TXN), b"after")])
    caplog.set_level(logging.WARNING, logger="harvest_outbox.consumer")
    with ReadCommittedIter(kafka_config(kafka_bootstrap), partitions=[(topic, 0)], checkpoint=cp) as it:
        assert [r.value for r in drain(it, expect=1, idle=5.0)] == [b"after"]  # resumed from the checkpoint
        assert set(decode_checkpoint(it.checkpoint())[0]) == {f"{topic}/0"}
    ignored = [r.getMessage() for r in caplog.records if "ignoring its entries" in r.getMessage()]
    assert len(ignored) == 1 and f"{topic}/1" in ignored[0] and f"{topic}/0" not in ignored[0].split("(")[0]


def test_partitions_a_checkpoint_does_not_cover_are_named(kafka_bootstrap: str, topic_factory, caplog) -> None:
    topic = topic_factory(partitions=2)
    offsets, _states = decode_checkpoint(_checkpoint_of(kafka_bootstrap, topic, 2))
    cp = encode_checkpoint({f"{topic}/0": offsets[f"{topic}/0"]}, [])
    caplog.set_level(logging.WARNING, logger="harvest_outbox.consumer")
    with ReadCommittedIter(kafka_config(kafka_bootstrap), topics=[topic], checkpoint=cp) as it:
        assert [r.value for r in drain(it, expect=1, idle=5.0)] == [b"x1"]  # topic/1 from earliest
    assert any(
        f"covers no offset for {topic}/1: they start from auto.offset.reset" in r.getMessage() for r in caplog.records
    )
