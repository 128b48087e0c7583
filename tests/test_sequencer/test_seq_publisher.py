"""Publisher: ports of Gazette's publisher_test.go UUID expectations, with an
in-memory journal standing in for the broker."""

from __future__ import annotations

import time

from harvest_outbox.sequencer import (
    AckIntent,
    Clock,
    Envelope,
    Flags,
    Publisher,
    QueueOutcome,
    Sequencer,
    build_uuid,
    clock_of,
    flags_of,
    producer_of,
)


def test_publish_committed() -> None:
    clock = Clock()
    pub = Publisher(clock)
    uuids = [pub.publish_committed("a/journal") for _ in range(3)]
    p = pub.producer_id
    assert uuids == [build_uuid(p, c, Flags.OUTSIDE_TXN) for c in (160, 320, 480)]
    assert pub.build_ack_intents() == []  # committed publishes need no ACK


def test_publish_uncommitted() -> None:
    clock = Clock()
    pub = Publisher(clock)
    p = pub.producer_id
    got: dict[str, list] = {"journal/one": [], "journal/two": [], "journal/three": []}

    def write(intents: list[AckIntent]) -> None:
        for journal, u in intents:
            got[journal].append(u)

    got["journal/one"].append(pub.publish_uncommitted("journal/one"))
    got["journal/two"].append(pub.publish_uncommitted("journal/two"))
    assert pub.pending_journals() == ("journal/one", "journal/two")
    intents = pub.build_ack_intents()
    assert [i.journal for i in intents] == ["journal/one", "journal/two"]
    write(intents)
    assert pub.pending_journals() == ()

    got["journal/three"].append(pub.publish_uncommitted("journal/three"))
    got["journal/one"].append(pub.publish_uncommitted("journal/one"))
    intents = pub.build_ack_intents()
    assert len(intents) == 2
    write(intents)

    assert got == {
        "journal/one": [
            build_uuid(p, 160, Flags.CONTINUE_TXN),
            build_uuid(p, 480, Flags.ACK_TXN),
            build_uuid(p, 960, Flags.CONTINUE_TXN),
            build_uuid(p, 1280, Flags.ACK_TXN),
        ],
        "journal/two": [build_uuid(p, 320, Flags.CONTINUE_TXN), build_uuid(p, 640, Flags.ACK_TXN)],
        "journal/three": [build_uuid(p, 800, Flags.CONTINUE_TXN), build_uuid(p, 1120, Flags.ACK_TXN)],
    }
    assert pub.build_ack_intents() == []


def test_each_journal_acked_once_after_its_messages() -> None:
    pub = Publisher(Clock())
    last: dict[str, int] = {}
    for j in ["t/0", "t/1", "t/0", "t/2", "t/1", "t/0"]:
        last[j] = clock_of(pub.publish_uncommitted(j))
    intents = pub.build_ack_intents()
    assert [i.journal for i in intents] == ["t/0", "t/1", "t/2"]
    for _journal, u in intents:
        assert flags_of(u) == Flags.ACK_TXN
        assert producer_of(u) == pub.producer_id
        assert clock_of(u) > max(last.values())


def test_auto_updating_clock_follows_wall_time() -> None:
    before = Clock.from_unix_ns(time.time_ns()).value
    pub = Publisher()
    c1 = clock_of(pub.publish_committed())
    c2 = clock_of(pub.publish_uncommitted("t/0"))
    assert before < c1 < c2
    (intent,) = pub.build_ack_intents()
    assert clock_of(intent.uuid) > c2


def test_fixed_producer_id() -> None:
    pub = Publisher(producer_id=bytes([1, 2, 3, 4, 5, 6]))
    assert producer_of(pub.publish_committed()) == bytes([1, 2, 3, 4, 5, 6])


def test_integration_with_sequencer() -> None:
    # Port of TestIntegrationOfPublisherWithSequencerAndReader: two publishers
    # sharing a clock write one journal; a Sequencer with a ring of 3 reads it.
    journal = "a/journal"
    log: list[Envelope] = []

    def append(u, msg=None) -> None:  # type: ignore[no-untyped-def]
        begin = log[-1].end if log else 0
        log.append(Envelope(journal, begin, begin + 10, u, msg))

    read_pos = 0
    seq = Sequencer(ring_size=3)

    def pump() -> list[tuple]:
        nonlocal read_pos
        env = log[read_pos]
        read_pos += 1
        if seq.queue_uncommitted(env) == QueueOutcome.ACK_COMMIT_REPLAY:
            j, begin, end = seq.replay_range()
            seq.start_replay(e for e in log if e.journal == j and begin <= e.begin and e.end <= end)
        out = []
        while (e := seq.step()) is not None:
            out.append((e.uuid, e.message))
        return out

    clock = Clock()
    pub, txn_pub = Publisher(clock), Publisher(clock)
    P, T = pub.producer_id, txn_pub.producer_id

    # txn_pub writes first, then pub, then txn_pub's intents. All served from the ring.
    append(txn_pub.publish_uncommitted(journal), "one")
    append(pub.publish_committed(journal), "two")
    for _, u in txn_pub.build_ack_intents():
        append(u)
    assert pump() == []
    assert pump() == [(build_uuid(P, 320, Flags.OUTSIDE_TXN), "two")]
    assert pump() == [(build_uuid(T, 160, Flags.CONTINUE_TXN), "one"), (build_uuid(T, 480, Flags.ACK_TXN), None)]

    # More interleaved messages, enough to overflow the ring.
    append(txn_pub.publish_uncommitted(journal), "three")
    append(pub.publish_committed(journal), "four")
    append(txn_pub.publish_uncommitted(journal), "five")
    append(pub.publish_committed(journal), "six")
    append(txn_pub.publish_uncommitted(journal), "seven")
    for _, u in txn_pub.build_ack_intents():
        append(u)

    assert pump() == []
    assert pump() == [(build_uuid(P, 800, Flags.OUTSIDE_TXN), "four")]
    assert pump() == []
    assert pump() == [(build_uuid(P, 1120, Flags.OUTSIDE_TXN), "six")]
    assert pump() == []
    assert pump() == [
        (build_uuid(T, 640, Flags.CONTINUE_TXN), "three"),
        (build_uuid(T, 960, Flags.CONTINUE_TXN), "five"),
        (build_uuid(T, 1280, Flags.CONTINUE_TXN), "seven"),
        (build_uuid(T, 1440, Flags.ACK_TXN), None),
    ]
