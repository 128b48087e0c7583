"""ReadCommittedIter on real topics (on the native fast paths and on the pure-Python ones)
gives exactly the pure-Python reference Sequencer's output
(Gazette's reader scenario; random relay-like traffic with duplicates, partial
ACKs, rollbacks, OUTSIDE and unsequenced records; tiny rings forcing replays)."""

from __future__ import annotations

import pytest
from cons_testlib import Gen, Rec, drain, kafka_config, key, per_partition, produce, reference
from native_impl import native_module
from sequenced_log import drain_to_end, topic_ends

from harvest_outbox import sequencer
from harvest_outbox.consumer import ConfigError, ReadCommittedIter, ReadUncommittedIter
from harvest_outbox.sequencer import Flags, build_uuid, new_producer_id

pytestmark = pytest.mark.integration


def test_gazette_reader_scenario(kafka_bootstrap: str, topic_factory) -> None:
    # Journal: A1 B1 A2 B2 B-ACK -> committed B1, B2 (A never acknowledged).
    topic = topic_factory()
    a, b = new_producer_id(), new_producer_id()
    recs = [
        Rec(0, build_uuid(a, 160, Flags.CONTINUE_TXN), b"A1"),
        Rec(0, build_uuid(b, 160, Flags.CONTINUE_TXN), b"B1"),
        Rec(0, build_uuid(a, 320, Flags.CONTINUE_TXN), b"A2"),
        Rec(0, build_uuid(b, 320, Flags.CONTINUE_TXN), b"B2"),
        Rec(0, build_uuid(b, 480, Flags.ACK_TXN), b"B-ACK"),
    ]
    produce(kafka_bootstrap, topic, recs)
    with ReadCommittedIter(kafka_config(kafka_bootstrap), topics=[topic]) as it:
        got = drain(it, expect=2, idle=1.0)
        assert [r.value for r in got] == [b"B1", b"B2"]
        assert [r.offset for r in got] == [1, 3]
        assert all(r.producer == b and r.topic == topic and r.partition == 0 for r in got)
        assert [r.clock for r in got] == [160, 320]
        assert it.has_pending()  # A's span is still open
    with ReadCommittedIter(kafka_config(kafka_bootstrap), topics=[topic], include_acks=True) as it:
        got = drain(it, expect=3, idle=1.0)
        assert [r.value for r in got] == [b"B1", b"B2", b"B-ACK"]
        assert got[-1].is_ack and got[-1].flags == Flags.ACK_TXN
    # The raw reader sees everything, in log order.
    with ReadUncommittedIter(kafka_config(kafka_bootstrap), topics=[topic]) as raw:
        envs = [raw.poll(5.0) for _ in range(5)]
        assert [e.message.value for e in envs] == [r.value for r in recs]
        assert [(e.journal, e.begin, e.end) for e in envs] == [(f"{topic}/0", i, i + 1) for i in range(5)]
        assert [e.uuid for e in envs] == [r.header for r in recs]


@pytest.fixture(params=["native", "python"])
def reader_impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the reader on the compiled fast paths, or on the pure-Python ones (converter + Sequencer)."""
    from harvest_outbox import consumer

    if request.param == "native":
        native_module("harvest_outbox.sequencer._native"), native_module("harvest_outbox.consumer._native")
        assert consumer.uncommitted._native_convert is not None and sequencer.IMPLEMENTATION == "native"
    else:
        monkeypatch.setattr(consumer.uncommitted, "_native_convert", None)
        monkeypatch.setattr(consumer.committed, "Sequencer", sequencer.PySequencer)
    return request.param


@pytest.mark.parametrize(
    ("seed", "partitions", "ring_size", "count"),
    [(1, 1, 8192, 400), (2, 1, 3, 400), (3, 3, 2, 600), (4, 2, 16, 600)],
)
def test_same_output_as_pure_sequencer(
    kafka_bootstrap: str, topic_factory, reader_impl, seed, partitions, ring_size, count
) -> None:
    topic = topic_factory(partitions=partitions)
    gen = Gen(seed, partitions=partitions)
    recs = gen.records(count)
    offsets = produce(kafka_bootstrap, topic, recs)
    want_all = reference(topic, recs, offsets, ring_size)
    # Read until the reference's count, then on while records keep coming (a surplus still shows), not
    # a whole idle second per read.
    with ReadCommittedIter(kafka_config(kafka_bootstrap), topics=[topic], ring_size=ring_size, include_acks=True) as it:
        got = [key(r) for r in drain(it, expect=len(want_all), idle=1.0)]
        stats = it.stats
    if partitions == 1:
        # One partition: the read order is the write order, so the whole sequence matches.
        assert got == want_all
    else:
        # Across partitions the interleaving differs; each partition's sequence must match.
        assert per_partition(got) == per_partition(want_all)
    assert len(set(got)) == len(got), "a record was delivered twice"
    if ring_size <= 3:
        assert stats["replays"] > 0, "the tiny ring should have forced replays"
    # Without include_acks, the same minus the ACK records.
    acks = {
        (r.partition, r.header.bytes)
        for r in recs
        if r.header is not None and not isinstance(r.header, bytes) and (r.header.int >> 48) & 0x3FF == Flags.ACK_TXN
    }
    assert acks
    want2 = [t for t in want_all if not t[2].startswith((b"ack", b"rb"))]
    with ReadCommittedIter(kafka_config(kafka_bootstrap), topics=[topic], ring_size=ring_size) as it:
        got2 = drain(it, expect=len(want2), idle=1.0)
    assert not any(r.is_ack for r in got2)
    assert per_partition(key(r) for r in got2) == per_partition(want2)


@pytest.mark.parametrize("ring_size", [8192, 2])
def test_matches_shared_reference_reader(kafka_bootstrap: str, topic_factory, ring_size: int) -> None:
    # The log and reference every reader of the project (Spark included) is held to.
    from sequenced_log import read_raw, reference_read, write_log

    topic = topic_factory(partitions=2)
    write_log(kafka_bootstrap, topic, 2, seed=8, steps=60)
    want = per_partition((p, o, b"") for p, o, _ in reference_read(read_raw(kafka_bootstrap, topic, 2), topic))
    with ReadCommittedIter(kafka_config(kafka_bootstrap), topics=[topic], ring_size=ring_size) as it:
        got = per_partition(
            (r.partition, r.offset, b"") for r in drain(it, expect=sum(map(len, want.values())), idle=1.0)
        )
    assert got == want and sum(map(len, want.values())) > 10


@pytest.mark.parametrize(("seed", "partitions", "ring_size"), [(5, 1, 3), (6, 3, 2), (7, 2, 8192)])
def test_poll_batch_equals_poll(kafka_bootstrap: str, topic_factory, seed, partitions, ring_size) -> None:
    # poll_batch (Sequencer.step_many inside) delivers exactly what poll() does,
    # in the same order, with and without ACKs, tiny rings (replays) included.
    import random

    topic = topic_factory(partitions=partitions)
    recs = Gen(seed, partitions=partitions).records(500)
    produce(kafka_bootstrap, topic, recs)
    rnd = random.Random(seed)
    ends = topic_ends(kafka_bootstrap, [topic])  # each read goes to these ends, no idle timeout waited out
    for include_acks in (True, False):
        with ReadCommittedIter(
            kafka_config(kafka_bootstrap), topics=[topic], ring_size=ring_size, include_acks=include_acks
        ) as it:
            want = [key(r) for r in drain_to_end(it, ends)]
            want_replays = it.stats["replays"]
        with ReadCommittedIter(
            kafka_config(kafka_bootstrap), topics=[topic], ring_size=ring_size, include_acks=include_acks
        ) as it:
            got = [
                key(r) for r in drain_to_end(it, ends, lambda: it.poll_batch(rnd.choice([1, 2, 3, 7, 50, 2000]), 0.2))
            ]
            assert it.stats["delivered"] == len(got)
        if partitions == 1:
            assert got == want
        else:
            assert per_partition(got) == per_partition(want)
        if ring_size <= 3:
            assert want_replays > 0
    with ReadCommittedIter(kafka_config(kafka_bootstrap), topics=[topic]) as it:
        with pytest.raises(ConfigError):
            it.poll_batch(0)
