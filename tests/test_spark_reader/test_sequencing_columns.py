"""The column-wise (numpy) parts of ``spark_reader.sequencing`` against per-record Python rules.

No services: Arrow tables are built in memory. ``sequence_partition`` is compared with
``_reference_sequence_partition``, the per-record implementation it replaced (uuid header -> 128-bit
int per row, row selection and clocks in Python), on random logs with everything a reader must
handle: interleaved producers, duplicates, partial ACKs, rollbacks, stalled spans, OUTSIDE
messages, unusable headers of every kind, replays (small rings), reads starting from a checkpoint,
input not in offset order, chunked columns.
"""

from __future__ import annotations

import bisect
import random
import uuid as uuid_mod

import numpy as np
import pyarrow as pa
import pytest

from harvest_outbox import sequencer
from harvest_outbox.consumer.uuid_header import parse_header_value
from harvest_outbox.sequencer import Envelope, Flags, Publisher, QueueOutcome, build_uuid, clock_of
from harvest_outbox.spark_reader import sequencing
from harvest_outbox.spark_reader.errors import MissingUUIDError
from harvest_outbox.spark_reader.sequencing import (
    GroupPlan,
    clocks,
    header_values,
    sequence_partition,
    take_rows,
    uuid_ints,
    uuid_words,
)

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
# A version-1 RFC 4122 UUID a relay can write: multicast node (0x01...), flags 1 (CONTINUE_TXN).
V1 = uuid_mod.UUID("a0b1c2d3-e4f5-11ee-8001-0123456789ab")
# uuid.uuid1() as an application makes it: the host's MAC as node (multicast bit clear), flags 1.
MAC_UUID1 = uuid_mod.uuid1(node=0x0242AC110002, clock_seq=1)


# -- per-record rules (what the module computed row by row before) --------------------------


def _uuid_int(raw: bytes | None) -> int:
    """The per-record rule the readers apply (consumer.uuid_header): the int, 0 when unusable."""
    u = parse_header_value(raw)
    return 0 if u is None else u.int


def _clock(x: int) -> int:
    return 0 if x == 0 else (x >> 96) << 4 | ((x >> 80) & 0xFFFF) << 36 | ((x >> 64) & 0x0FFF) << 52 | (x >> 58) & 0xF


def _reference_sequence_partition(table: pa.Table, plan: GroupPlan, prune_horizon_ns: int):  # type: ignore[no-untyped-def]
    table = table.sort_by("offset")
    offsets = table.column("offset").to_pylist()
    xs = [_uuid_int(raw) for raw in table.column("uuid").to_pylist()]
    partition = int(table.column("partition")[0].as_py())
    journal = f"{plan.topic}/{partition}"
    start = plan.start.get(partition, 0)
    first = bisect.bisect_left(offsets, start)
    states = [st for (p, _), st in plan.states.items() if p == partition]
    seq = sequencing.Sequencer({journal: start}, states, plan.ring_size)
    rows, acks, entries = [], [], []
    for i in range(first, len(offsets)):
        off = offsets[i]
        if xs[i] == 0:
            if plan.uuid_policy == "raise":
                raise MissingUUIDError(f"record {journal}@{off} has no valid 'uuid' header")
            if plan.uuid_policy == "deliver":
                rows.append(i), acks.append(off)
            continue
        entries.append((journal, off, off + 1, xs[i], i))

    def replay(begin: int, end: int):  # type: ignore[no-untyped-def]
        for i in range(bisect.bisect_left(offsets, begin), bisect.bisect_left(offsets, end)):
            if xs[i]:
                yield Envelope(journal, offsets[i], offsets[i] + 1, uuid_mod.UUID(int=xs[i]), i)

    pos = 0
    while pos < len(entries):
        pos, outcome = seq.queue_batch(entries, pos)
        if outcome is None:
            break
        if outcome == QueueOutcome.ACK_COMMIT_REPLAY:
            _, begin, end = seq.replay_range()
            seq.start_replay(replay(begin, end))
        sequence = [item.message if type(item) is Envelope else item for item in seq.step_many(1 << 62)]
        for idx in sequence:
            if plan.include_acks or (xs[idx] >> 48) & 0x3FF != int(Flags.ACK_TXN):
                rows.append(idx), acks.append(offsets[sequence[-1]])
    _, end_states = seq.checkpoint(prune_horizon_ns)
    out = table.take(pa.array(rows, pa.int64()))
    out = out.append_column("ack_offset", pa.array(acks, pa.int64()))
    out = out.append_column("clock", pa.array([_clock(xs[i]) for i in rows], pa.int64()))
    return out, end_states


# -- header edge cases -------------------------------------------------------------------------


def _with_version(u: uuid_mod.UUID, version: int) -> bytes:
    return ((u.int & ~(0xF << 76)) | version << 76).to_bytes(16, "big")


def _with_variant(u: uuid_mod.UUID, variant: int) -> bytes:
    return ((u.int & ~(0x3 << 62)) | variant << 62).to_bytes(16, "big")


EDGE_VALUES: list[bytes | None] = [
    None,
    b"",
    V1.bytes[:15],
    V1.bytes + b"\x00",
    V1.bytes * 2,
    b"\x00" * 16,  # the nil UUID
    b"\xff" * 16,
    V1.bytes,
    uuid_mod.uuid1().bytes,
    uuid_mod.uuid4().bytes,  # version 4
    _with_version(V1, 0),
    _with_version(V1, 2),
    _with_version(V1, 15),
    _with_variant(V1, 0),
    _with_variant(V1, 1),
    _with_variant(V1, 3),
    _with_variant(uuid_mod.UUID(int=V1.int | (0xFFF << 64)), 2),  # the largest time_hi
    build_uuid(bytes([1, 2, 3, 4, 5, 7]), 12345, Flags.ACK_TXN).bytes,
    build_uuid(bytes([1, 2, 3, 4, 5, 7]), 1, Flags.OUTSIDE_TXN).bytes,
    MAC_UUID1.bytes,  # not a relay's: the node is a MAC address
    build_uuid(bytes([0, 2, 3, 4, 5, 7]), 12345, Flags.ACK_TXN).bytes,  # ProducerID without the multicast bit
    build_uuid(bytes([1, 2, 3, 4, 5, 7]), 12345, 3).bytes,  # reserved flags
    build_uuid(bytes([1, 2, 3, 4, 5, 7]), 12345, 0x3FF).bytes,
    b"uuid-as-text",
]


def _check_words(values: list[bytes | None], arr: pa.Array | pa.ChunkedArray) -> None:
    valid, hi, lo = uuid_words(arr)
    xs = [_uuid_int(v) for v in values]
    assert valid.dtype == np.bool_ and hi.dtype == np.uint64 and lo.dtype == np.uint64
    assert valid.tolist() == [x != 0 for x in xs]
    assert uuid_ints(hi, lo) == xs
    expected = [_clock(x) for x in xs]
    if max(expected, default=0) < 1 << 63:
        assert clocks(hi, lo).tolist() == expected
    else:  # as building the column from these ints would
        with pytest.raises(OverflowError):
            clocks(hi, lo)
        keep = np.array([c < 1 << 63 for c in expected], np.bool_)
        assert clocks(hi[keep], lo[keep]).tolist() == [c for c in expected if c < 1 << 63]


@pytest.mark.parametrize("binary_type", [pa.binary(), pa.large_binary()])
def test_uuid_words_equal_the_per_record_rule_on_edge_cases(binary_type) -> None:
    values = EDGE_VALUES * 3
    arr = pa.array(values, binary_type)
    _check_words(values, arr)
    _check_words(values[5:31], arr.slice(5, 26))  # an offset into the buffers
    _check_words(values, pa.chunked_array([arr.slice(0, 7), arr.slice(7, 0), arr.slice(7)]))
    for v in EDGE_VALUES:  # one value alone, and all rows alike (the contiguous fast path)
        _check_words([v], pa.array([v], binary_type))
        _check_words([v] * 5, pa.array([v] * 5, binary_type))
    _check_words([], pa.array([], binary_type))
    _check_words([], pa.chunked_array([], binary_type))


def test_uuid_words_fast_path_on_valid_uuids_at_an_offset() -> None:
    values = [build_uuid(sequencer.new_producer_id(), 16 * (i + 1), Flags.CONTINUE_TXN).bytes for i in range(100)]
    arr = pa.array([b"x" * 3, *values], pa.binary()).slice(1)  # data starts at byte 3: unaligned words
    _check_words(values, arr)


def test_uuid_words_refuse_non_binary() -> None:
    with pytest.raises(TypeError, match="binary"):
        uuid_words(pa.array(["a"]))


def test_clocks_match_clock_of_and_refuse_what_int64_cannot_hold() -> None:
    pid = bytes([9, 8, 7, 6, 5, 5])
    us = [build_uuid(pid, c, f) for c in (1, 2**20 + 3, 2**62 - 1) for f in (Flags.CONTINUE_TXN, Flags.ACK_TXN)]
    valid, hi, lo = uuid_words(pa.array([u.bytes for u in us], pa.binary()))
    assert valid.all()
    assert clocks(hi, lo).tolist() == [clock_of(u) for u in us]
    big = build_uuid(pid, 2**63 + 16, Flags.CONTINUE_TXN)
    _, hi, lo = uuid_words(pa.array([big.bytes], pa.binary()))
    with pytest.raises(OverflowError):
        clocks(hi, lo)
    with pytest.raises(OverflowError):  # what building the column row by row did
        pa.array([_clock(big.int)], pa.int64())


# -- the uuid header out of Spark's headers column ---------------------------------------------------


def _first_header(headers: list | None, key: str) -> bytes | None:
    """Spark's element_at(filter(headers, h -> h.key = key), 1).value, row by row."""
    for h in headers or ():
        if h is not None and h["key"] == key:
            return h["value"]
    return None


def _random_headers(rng: random.Random, n: int) -> list:
    def header():  # type: ignore[no-untyped-def]
        if rng.random() < 0.05:
            return None
        key = rng.choice(["uuid", "uuid", "source", "UUID", "uuid ", "", None])
        value = rng.choice([None, b"", V1.bytes, uuid_mod.uuid1().bytes, b"x" * rng.randrange(40)])
        return {"key": key, "value": value}

    return [
        None if rng.random() < 0.1 else [header() for _ in range(rng.choice([0, 1, 1, 1, 2, 3, 5]))] for _ in range(n)
    ]


@pytest.mark.parametrize("seed", range(6))
def test_header_values_equal_the_first_matching_header(seed) -> None:
    rng = random.Random(seed)
    values = _random_headers(rng, 300)
    arr = pa.array(values, HEADERS)
    expected = [_first_header(h, "uuid") for h in values]
    got = header_values(arr, "uuid")
    assert got.type == pa.binary()
    assert got.to_pylist() == expected
    assert header_values(arr.slice(17, 100), "uuid").to_pylist() == expected[17:117]
    chunked = pa.chunked_array([arr.slice(0, 50), arr.slice(50, 0), arr.slice(50, 200), arr.slice(250)])
    got = header_values(chunked, "uuid")
    assert got.to_pylist() == expected
    assert [len(c) for c in got.chunks] == [len(c) for c in chunked.chunks]
    assert header_values(arr, "source").to_pylist() == [_first_header(h, "source") for h in values]


def test_header_values_skip_the_range_of_a_null_list() -> None:
    # Arrow lets a null list's offsets span child values; they are not the record's headers.
    child = pa.array([{"key": "uuid", "value": v} for v in (b"p", b"q", b"r", b"s")], HEADERS.value_type)
    arr = pa.ListArray.from_arrays(
        pa.array([0, 1, 2, 2, 4], pa.int32()), child, mask=pa.array([False, True, False, False])
    )
    assert arr.to_pylist()[1] is None
    assert header_values(arr, "uuid").to_pylist() == [b"p", None, None, b"r"]
    assert header_values(arr.slice(1), "uuid").to_pylist() == [None, None, b"r"]
    assert header_values(pa.chunked_array([], HEADERS), "uuid").to_pylist() == []


# -- selecting the output rows ----------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_take_rows_equals_take(seed) -> None:
    rng = random.Random(seed)
    table = _table(_random_log(rng, "t", 0, steps=60, producers=3), 0, 5, rng, chunk=rng.choice([7, 64, 100_000]))
    n = table.num_rows
    increasing = sorted(rng.sample(range(n), n // 2))
    shuffled = rng.sample(range(n), n // 2)
    local = list(range(n))
    for i in range(0, n, 10):  # interleaved transactions: mostly in order
        local[i : i + 10] = rng.sample(local[i : i + 10], len(local[i : i + 10]))
    for rows in ([], [3], [4, 2], increasing, shuffled, local, list(range(n))):
        idx = np.array(rows, np.int64)
        expected = table.take(pa.array(idx, pa.int64()))
        for window in (1, 3, 65536):
            monkeypatch = pytest.MonkeyPatch()
            monkeypatch.setattr(sequencing, "_TAKE_WINDOW", window)
            try:
                assert take_rows(table, idx).equals(expected)
            finally:
                monkeypatch.undo()


# -- sequence_partition against the per-record implementation ------------------------------------


def _random_log(rng: random.Random, topic: str, partition: int, steps: int, producers: int) -> list[bytes | None]:
    """uuid header values of one partition's records, in log order (as tests/sequenced_log.py writes them)."""
    pubs = [Publisher() for _ in range(producers)]
    last_ack: dict[int, int] = {}
    log: list[bytes | None] = []
    journal = f"{topic}/{partition}"
    for _ in range(steps):
        action = rng.random()
        i = rng.randrange(producers)
        pub = pubs[i]
        if action < 0.1:
            log.append(pub.publish_committed().bytes)
        elif action < 0.16:
            log.append(rng.choice(EDGE_VALUES[:7] + EDGE_VALUES[9:16] + EDGE_VALUES[19:]))
        else:
            sent = []
            for _ in range(rng.randint(1, 12)):
                u = pub.publish_uncommitted(journal)
                sent.append(u)
                log.append(u.bytes)
                if rng.random() < 0.15:
                    log.append(u.bytes)  # a duplicate
            kind = rng.random()
            for intent in pub.build_ack_intents():
                ack = intent.uuid
                if kind < 0.1:
                    continue  # never acknowledged
                if kind < 0.2:  # rollback: the ACK re-sent at the last ACK's clock
                    first = min(clock_of(u) for u in sent)
                    ack = build_uuid(pub.producer_id, last_ack.get(i, first - 1), Flags.ACK_TXN)
                elif kind < 0.3:  # partial: commits the span's first half
                    ack = build_uuid(pub.producer_id, clock_of(sent[len(sent) // 2]), Flags.ACK_TXN)
                last_ack[i] = max(last_ack.get(i, 0), clock_of(ack))
                log.append(ack.bytes)
                if rng.random() < 0.1:
                    log.append(ack.bytes)  # a re-sent ACK
    return log


def _table(uuids: list[bytes | None], partition: int, base: int, rng: random.Random, chunk: int) -> pa.Table:
    n = len(uuids)
    tbl = pa.table(
        {
            "key": pa.array([f"k{rng.randrange(5)}".encode() for _ in range(n)], pa.binary()),
            "value": pa.array([f"v{base + i}".encode() if rng.random() < 0.9 else None for i in range(n)], pa.binary()),
            "headers": pa.array([[] if u is None else [{"key": "uuid", "value": u}] for u in uuids], HEADERS),
            "partition": pa.array([partition] * n, pa.int32()),
            "offset": pa.array(range(base, base + n), pa.int64()),
            "timestamp": pa.array([1_700_000_000_000_000 + i for i in range(n)], pa.timestamp("us", tz="UTC")),
            "uuid": pa.array(uuids, pa.binary()),
        }
    )
    return pa.Table.from_batches(tbl.to_batches(max_chunksize=chunk))


def _implementations() -> list[str]:
    return ["default", "python"] if hasattr(sequencer, "PySequencer") else ["default"]


@pytest.fixture(params=_implementations())
def sequencer_class(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> type:
    if request.param == "python":  # the pure-Python Sequencer takes entries as tuples
        monkeypatch.setattr(sequencing, "Sequencer", sequencer.PySequencer)
        monkeypatch.setattr(sequencing, "EntryBatch", None)
    return sequencing.Sequencer


@pytest.mark.parametrize("seed", range(12))
def test_sequence_partition_equals_the_per_record_implementation(seed, sequencer_class) -> None:
    rng = random.Random(seed)
    topic, partition = "t", rng.randrange(4)
    uuids = _random_log(rng, topic, partition, steps=rng.randint(20, 120), producers=rng.randint(1, 4))
    base = rng.choice([0, 7, 1000])
    table = _table(uuids, partition, base, rng, chunk=rng.choice([3, 50, 100_000]))
    if seed % 3 == 1:  # not in offset order: both sort
        table = table.take(pa.array(rng.sample(range(table.num_rows), table.num_rows)))
    horizon = rng.choice([0, 1, 10**18])
    for ring in (4, 8192):  # 4: most commits replay
        for include_acks in (False, True):
            for policy in ("deliver", "drop"):
                plan = GroupPlan(
                    topic=topic,
                    start={partition: base},
                    states={},
                    uuid_policy=policy,
                    include_acks=include_acks,
                    ring_size=ring,
                )
                # A read that starts from a checkpoint in the middle: spans open there replay
                # records below the read-through offset, which are never emitted themselves.
                cut = rng.randrange(table.num_rows)
                head = table.sort_by("offset").slice(0, cut)
                states: dict = {}
                if cut:
                    _, head_states = _reference_sequence_partition(head, plan, 0)
                    states = {(partition, st.producer): st for st in head_states}
                resumed = GroupPlan(
                    topic=topic,
                    start={partition: base + cut},
                    states=states,
                    uuid_policy=policy,
                    include_acks=include_acks,
                    ring_size=ring,
                )
                for p in (plan, resumed):
                    expected, expected_states = _reference_sequence_partition(table, p, horizon)
                    got, result = sequence_partition(table, p, horizon)
                    assert got.schema == expected.schema
                    # Rows leave in log order; the reference emitted them in delivery order.
                    assert got.equals(expected.sort_by("offset")), (seed, ring, include_acks, policy, p.start)
                    assert got.column("offset").to_pylist() == sorted(got.column("offset").to_pylist())
                    assert result.states == expected_states


def test_sequence_partition_raise_names_the_first_unusable_record() -> None:
    rng = random.Random(5)
    pub = Publisher()
    uuids = [pub.publish_committed().bytes, None, b"\x00" * 16, pub.publish_committed().bytes, b"short"]
    table = _table(uuids, 2, 40, rng, chunk=2)
    plan = GroupPlan(topic="t", start={2: 40}, states={}, uuid_policy="raise")
    with pytest.raises(MissingUUIDError, match="t/2@41"):
        sequence_partition(table, plan, 0)
    # Records below the read-through offset are not checked: they are never emitted.
    plan = GroupPlan(topic="t", start={2: 43}, states={}, uuid_policy="raise")
    with pytest.raises(MissingUUIDError, match="t/2@44"):
        sequence_partition(table, plan, 0)
    plan = GroupPlan(topic="t", start={2: 43}, states={}, uuid_policy="raise")
    got, _ = sequence_partition(table.slice(0, 4), plan, 0)
    assert got.column("offset").to_pylist() == [43]


def test_sequence_partition_restores_the_collector() -> None:
    import gc

    rng = random.Random(1)
    table = _table([Publisher().publish_committed().bytes], 0, 0, rng, chunk=10)
    plan = GroupPlan(topic="t", start={}, states={})
    assert gc.isenabled()
    sequence_partition(table, plan, 0)
    assert gc.isenabled()
    gc.disable()
    try:
        sequence_partition(table, plan, 0)
        assert not gc.isenabled()
    finally:
        gc.enable()
