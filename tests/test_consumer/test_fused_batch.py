"""poll_batch's fused native batch path is the step-by-step paths, observably (no services needed).

``consumer/_native.pyx``'s ``sequence_raw`` converts, queues and dequeues a whole ``consume()``
batch in one compiled pass. Three readers run the same script of calls over the same consumed
batches and must agree after every call:

* ``fused``: the default with the native extensions (and ``fused-any-topic``: the same, reading
  each message's topic as for a reader of several topics);
* ``native-steps``: the compiled converter, ``Sequencer.queue_batch`` and ``step_many`` one step
  at a time (``committed._sequence_raw = None``), what poll_batch did before the fused path;
* ``python``: the pure-Python converter and Sequencer (the reference implementation).

Compared after each call: the records returned (position, value, UUID), the error raised if any
(``uuid_policy='raise'``, a Kafka error that raises), the decoded ``checkpoint()``, ``has_pending()``
and the replay count. The calls are a seeded mix of ``poll_batch(n)`` of many sizes, ``poll()``
(which takes over a batch the fused path left half-sequenced) and restarts from a checkpoint.

The streams are generated relay traffic (``cons_testlib.Gen``: CONTINUE spans, full and partial
ACKs, rollbacks, duplicates, OUTSIDE and unsequenced records) plus producer restarts (a producer
re-sending an earlier stretch of its records and an ACK below its last one), ``uuid`` headers that
are malformed or foreign (wrong length, nil, an application's ``uuid1()``, reserved flags, no
value), other headers before ``uuid``, offset gaps, and Kafka error events (one logged, one that
raises). The batches come from a scripted consumer so that all three readers see the same
``consume()`` batches (a real broker's batching depends on timing): the consumer and the replay
consumer, and nothing else, are scripted. Tiny rings force replays, which the scripted replay
consumer serves from the same log. The last test writes the same kind of traffic to a real topic and
compares the fused path with the pure-Python reader per partition, restart and replays included.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, Message, TopicPartition
from cons_testlib import Gen, Rec
from sequenced_log import read_through, topic_ends

from harvest_outbox import sequencer
from harvest_outbox.consumer import committed, replay, uncommitted
from harvest_outbox.consumer.committed import ReadCommittedIter
from harvest_outbox.consumer.errors import MissingUUIDError, OffsetLostError
from harvest_outbox.sequencer import Flags, build_uuid, decode_checkpoint
from harvest_outbox.sequencer.native import pure_python_forced
from harvest_outbox.sequencer.uuid_layout import clock_of_int

pytestmark = pytest.mark.skipif(pure_python_forced(), reason="HARVEST_PURE_PYTHON=1: no fused path under test")

TOPIC = "fused"
PID = bytes([0x01, 2, 3, 4, 5, 6])
MALFORMED = [
    b"short",
    bytes(16),  # nil
    uuid.uuid1(node=0x0242AC110002, clock_seq=2).bytes,  # an application's uuid1(): MAC node
    build_uuid(PID, 16 * 7001, 3).bytes,  # reserved flags
    build_uuid(PID, 16 * 7002, Flags.CONTINUE_TXN).bytes + b"\x00",  # 17 bytes
    None,  # a uuid header without a value
]


def generate(seed: int, partitions: int, count: int) -> list[tuple[int, list[tuple[str, Any]] | None, bytes]]:
    """(partition, headers, value) in write order: Gen's traffic, producer restarts, bad headers."""
    rnd = random.Random(seed * 7919)
    recs: list[Rec] = Gen(seed, partitions=partitions).records(count)
    out: list[tuple[int, list[tuple[str, Any]] | None, bytes]] = []
    n = 0
    for i, r in enumerate(recs):
        if r.header is None:
            headers = None
        elif isinstance(r.header, bytes):
            headers = [("uuid", r.header)]
        else:
            headers = [("uuid", r.header.bytes)]
        if headers is not None and rnd.random() < 0.1:
            headers.insert(0, ("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"))
        out.append((r.partition, headers, r.value))
        roll = rnd.random()
        if roll < 0.03:
            n += 1
            out.append((rnd.randrange(partitions), [("uuid", rnd.choice(MALFORMED))], b"bad-%d" % n))
        elif roll < 0.04:
            n += 1
            # No header named exactly "uuid" (names compared in place by the compiled code).
            name = rnd.choice(["other", "UUID", "uuid\x00", "\u00fcuid", "uuidx", "uui"])
            out.append((rnd.randrange(partitions), [(name, build_uuid(PID, 16 * 7003, 1).bytes)], b"noheader-%d" % n))
        elif roll < 0.05 and i > 20:
            # A producer restarted from an older checkpoint: an earlier stretch of its records again
            # (duplicates, CONTINUEs at or below its ACKs) and an ACK below its last one.
            mine = [x for x in recs[max(0, i - 60) : i] if isinstance(x.header, uuid.UUID)]
            if mine:
                pid = mine[-1].header.bytes[10:]
                stretch = [x for x in mine if x.header.bytes[10:] == pid][-rnd.randint(1, 8) :]
                for x in stretch:
                    out.append((x.partition, [("uuid", x.header.bytes)], x.value + b"-again"))
                ack = build_uuid(pid, max(clock_of_int(stretch[0].header.int) - 1, 1), Flags.ACK_TXN)
                out.append((stretch[0].partition, [("uuid", ack.bytes)], b"old-ack"))
    return out


class Log:
    """The partitions' records as confluent ``Message`` objects, at offsets with gaps (as transaction
    markers leave), and the seeded order in which a consumer assigned to them delivers them."""

    def __init__(self, seed: int, partitions: int, count: int) -> None:
        self.rnd_seed = seed
        self.parts: dict[int, list[Message]] = {p: [] for p in range(partitions)}
        rnd = random.Random(seed)
        next_offset = dict.fromkeys(range(partitions), 0)
        for p, headers, value in generate(seed, partitions, count):
            off = next_offset[p]
            next_offset[p] = off + (2 if rnd.random() < 0.05 else 1)
            self.parts[p].append(
                Message(topic=TOPIC, partition=p, offset=off, key=b"k" + value, value=value, headers=headers)
            )
        self.assignments = 0
        self.main: ScriptedConsumer | None = None  # the reader's consumer (the latest one)

    def from_offset(self, p: int, offset: int) -> list[Message]:
        return [m for m in self.parts[p] if offset < 0 or m.offset() >= offset]

    def schedule(self, starts: dict[int, int]) -> list[list[Message]]:
        """Consumed batches for a consumer assigned at ``starts``: runs of one partition at a time,
        cut into batches of random sizes, with two Kafka error events somewhere."""
        self.assignments += 1
        rnd = random.Random(self.rnd_seed * 1000 + self.assignments)
        left = {p: self.from_offset(p, off) for p, off in starts.items()}
        flat: list[Message] = []
        while any(left.values()):
            p = rnd.choice([q for q, ms in left.items() if ms])
            run = rnd.randint(1, 300)
            flat += left[p][:run]
            left[p] = left[p][run:]
        for code in (KafkaError._TRANSPORT, KafkaError.OFFSET_OUT_OF_RANGE):
            flat.insert(rnd.randrange(len(flat) + 1), Message(topic=TOPIC, partition=0, error=KafkaError(code)))
        batches = []
        while flat:
            size = rnd.choice([1, 3, 17, 100, 256, 1000])
            batches.append(flat[:size])
            flat = flat[size:]
        return batches


class ScriptedConsumer:
    """Stands in for confluent's Consumer: serves the log's batches for what it is assigned."""

    def __init__(self, log: Log, replay_consumer: bool) -> None:
        self._log = log
        self._replay = replay_consumer
        self._batches: list[list[Message]] = []
        if not replay_consumer:
            log.main = self

    @property
    def drained(self) -> bool:
        return not self._batches

    def assign(self, parts: list[TopicPartition]) -> None:
        starts = {tp.partition: (-1 if tp.offset == OFFSET_BEGINNING else tp.offset) for tp in parts}
        if self._replay:  # the replay consumer: one partition from one offset, in one order
            ((p, off),) = starts.items()
            self._batches = [self._log.from_offset(p, off)]
        else:
            self._batches = self._log.schedule(starts)

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        if not self._batches:
            return []
        batch = self._batches[0]
        got, rest = batch[:num_messages], batch[num_messages:]
        if rest:
            self._batches[0] = rest
        else:
            self._batches.pop(0)
        return got

    def poll(self, timeout: float = -1) -> Message | None:
        got = self.consume(1)
        return got[0] if got else None

    def unassign(self) -> None:
        self._batches = []

    def close(self) -> None:
        self._batches = []


VARIANTS = ("fused", "fused-any-topic", "native-steps", "python")


def use_variant(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if variant == "fused-any-topic":  # the pass as for a reader of several topics: every topic compared
        monkeypatch.setattr(committed, "_reads_one_topic", lambda topics, partitions: False)
    elif variant == "native-steps":
        monkeypatch.setattr(committed, "_sequence_raw", None)
    elif variant == "python":
        monkeypatch.setattr(uncommitted, "_native_convert", None)
        monkeypatch.setattr(committed, "Sequencer", sequencer.PySequencer)


def rec_key(r: Any) -> tuple[Any, ...]:
    return (r.partition, r.offset, r.value, r.key, r.headers, r.uuid, r.is_ack)


def state(it: ReadCommittedIter) -> tuple[Any, ...]:
    offsets, states = decode_checkpoint(it.checkpoint())
    return (
        sorted(offsets.items()),
        sorted((s.journal, s.producer, s.last_ack, s.begin) for s in states),
        it.has_pending(),
        it.stats["replays"],
        it.stats["delivered"],
    )


def run_script(
    variant: str, log: Log, seed: int, ring_size: int, policy: str, batch_size: int, include_acks: bool
) -> tuple[list[tuple[Any, ...]], int]:
    """The trace of one reader over the script: (call, result, state) per call; and the records read."""
    rnd = random.Random(seed)
    partitions = [(TOPIC, p) for p in log.parts]

    def reader(checkpoint: bytes | None) -> ReadCommittedIter:
        return ReadCommittedIter(
            {"bootstrap.servers": "scripted:9092"},
            partitions=partitions,
            checkpoint=checkpoint,
            ring_size=ring_size,
            uuid_policy=policy,
            batch_size=batch_size,
            include_acks=include_acks,
        )

    it = reader(None)
    trace: list[tuple[Any, ...]] = []
    idle = 0
    delivered = 0
    while idle < 3 or not (log.main is not None and log.main.drained):
        roll = rnd.random()
        call: tuple[Any, ...]
        result: Any
        try:
            if roll < 0.75:
                n = rnd.choice([1, 2, 3, 7, 50, 256, 2000])
                call = ("poll_batch", n)
                got = it.poll_batch(n, 0.0)
                result = [rec_key(r) for r in got]
                delivered += len(got)
                idle = 0 if got else idle + 1
            elif roll < 0.95:
                call = ("poll",)
                rec = it.poll(0.0)
                result = None if rec is None else rec_key(rec)
                delivered += rec is not None
                idle = 0 if rec is not None else idle + 1
            else:
                call = ("restart",)
                cp = it.checkpoint()
                it.close()
                it = reader(cp)
                result = None
        except (MissingUUIDError, OffsetLostError) as exc:
            result = (type(exc).__name__, str(exc))
            idle = 0
        trace.append((call, result, state(it)))
    it.close()
    return trace, delivered


@pytest.mark.parametrize(
    ("seed", "partitions", "ring_size", "policy", "batch_size", "include_acks"),
    [
        (1, 1, 8192, "deliver", 256, False),
        (2, 3, 4, "deliver", 16, True),
        (3, 2, 16, "drop", 64, False),
        (4, 3, 8192, "raise", 256, False),
        (5, 1, 3, "raise", 7, True),
        (6, 4, 64, "deliver", 1, False),
        (7, 2, 8192, "drop", 1000, True),
    ],
    ids=[
        "1p-deliver",
        "3p-ring4-acks",
        "2p-ring16-drop",
        "3p-raise",
        "1p-ring3-raise-acks",
        "4p-batch1",
        "2p-drop-acks",
    ],
)
def test_fused_path_equals_step_by_step_and_pure_python(
    monkeypatch: pytest.MonkeyPatch,
    seed: int,
    partitions: int,
    ring_size: int,
    policy: str,
    batch_size: int,
    include_acks: bool,
) -> None:
    assert committed._sequence_raw is not None, "consumer._native is not built: run ./dev setup"
    traces = {}
    stops: dict[int, int] = {}
    log = Log(seed, partitions, 900)  # one log: Gen draws random producer ids
    for variant in VARIANTS:
        log.assignments = 0  # the same consumed batches for each reader
        with monkeypatch.context() as m:
            m.setattr(uncommitted, "Consumer", lambda config, log=log: ScriptedConsumer(log, replay_consumer=False))
            m.setattr(replay, "Consumer", lambda config, log=log: ScriptedConsumer(log, replay_consumer=True))
            use_variant(variant, m)
            if variant == "fused":
                m.setattr(committed, "_sequence_raw", counting(committed._sequence_raw, stops))
            traces[variant] = run_script(variant, log, seed, ring_size, policy, batch_size, include_acks)
    fused, delivered = traces["fused"]
    for other in ("fused-any-topic", "native-steps", "python"):
        trace = traces[other][0]
        for i, (a, b) in enumerate(zip(fused, trace, strict=False)):
            assert a == b, f"call {i} differs between fused and {other}: {a[0]}"
        assert len(fused) == len(trace)
    # The script exercised what it is meant to: records delivered, and every way the fused path
    # stops (a batch sequenced, a message for the Python code, a replay where the ring is tiny).
    assert delivered > 300
    assert stops.get(committed._native_records.SEQUENCED, 0) > 0
    assert stops.get(committed._native_records.NEEDS_PYTHON, 0) > 0
    if ring_size <= 16:
        assert stops.get(committed._native_records.REPLAY, 0) > 0 and any(state[3] > 0 for _, _, state in fused)
    raised = {
        r[0]
        for _, r, _ in fused
        if isinstance(r, tuple) and len(r) == 2 and r[0] in ("MissingUUIDError", "OffsetLostError")
    }
    assert "OffsetLostError" in raised
    assert ("MissingUUIDError" in raised) == (policy == "raise")


def counting(fn: Callable[..., tuple[int, Any, int]], stops: dict[int, int]) -> Callable[..., tuple[int, Any, int]]:
    def wrapped(*args: Any) -> tuple[int, Any, int]:
        got = fn(*args)
        stops[got[2]] = stops.get(got[2], 0) + 1
        return got

    return wrapped


def test_sequence_raw_checks_its_arguments() -> None:
    native = committed._native_records
    assert native is not None
    seq = sequencer.Sequencer()
    with pytest.raises(ValueError, match="max_records must be >= 1"):
        native.sequence_raw(seq, [], 0, {}, [], 0, False, None)
    with pytest.raises(TypeError):
        native.sequence_raw(sequencer.PySequencer(), [], 0, {}, [], 10, False, None)
    # Nothing to take: it stops at once, sequenced, with nothing delivered.
    out: list[Any] = []
    assert native.sequence_raw(seq, [], 0, {}, out, 10, False, None) == (0, None, native.SEQUENCED)
    assert out == []


def test_native_record_reads_kafka_fields_once_as_slots() -> None:
    # The compiled Record takes key, value, headers and offset from the message when it is made
    # (the objects confluent-kafka's accessors return, not copies) and exposes them as read-only
    # member descriptors, the kind CPython specialises into a slot load (consumer/_native.pyx).
    import types

    native = committed._native_records
    assert native is not None
    headers = [("uuid", build_uuid(PID, 16 * 9000, Flags.CONTINUE_TXN).bytes), ("trace", b"t")]
    msg = Message(topic=TOPIC, partition=2, offset=41, key=b"k", value=b"v" * 10, headers=headers)
    x = build_uuid(PID, 16 * 9000, Flags.CONTINUE_TXN).int
    for rec in (native.make_record(msg, x), native.Record(msg, uuid.UUID(int=x))):
        assert (rec.key, rec.value, rec.headers, rec.offset) == (b"k", b"v" * 10, headers, 41)
        assert rec.key is msg.key() and rec.value is msg.value() and rec.headers is msg.headers()
        assert (rec.topic, rec.partition, rec.journal, rec.clock) == (TOPIC, 2, f"{TOPIC}/2", 16 * 9000)
        for name in ("key", "value", "headers", "offset"):
            assert type(native.Record.__dict__[name]) is types.MemberDescriptorType
            with pytest.raises(AttributeError):
                setattr(rec, name, None)
    # A message of another type (a test's, or none at all) gives what it has.
    bare = native.make_record(None, 0)
    assert (bare.key, bare.value, bare.headers, bare.offset, bare.uuid) == (None, None, None, None, None)


def write(bootstrap: str, topic: str, rows: list[tuple[int, list[tuple[str, Any]] | None, bytes]]) -> None:
    from confluent_kafka import Producer

    prod = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5})
    for p, headers, value in rows:
        prod.produce(topic, value=value, key=b"k" + value, partition=p, headers=headers)
        prod.poll(0)
    assert prod.flush(60) == 0


def read_all(bootstrap: str, topic: str, ring_size: int, policy: str, seed: int, total: int) -> dict[str, Any]:
    """Everything a reader delivers, per partition, reading with poll_batch of seeded sizes and
    restarting once from its checkpoint part-way, up to the topic's end (no idle timeout waited out:
    tests/sequenced_log.py); the errors it raised; its last checkpoint."""
    ends = topic_ends(bootstrap, [topic])
    deadline = time.monotonic() + 120
    rnd = random.Random(seed)

    def reader(checkpoint: bytes | None) -> ReadCommittedIter:
        return ReadCommittedIter(
            {"bootstrap.servers": bootstrap},
            topics=[topic],
            checkpoint=checkpoint,
            ring_size=ring_size,
            uuid_policy=policy,
            batch_size=rnd.choice([16, 256]),
        )

    got: dict[int, list[tuple[Any, ...]]] = {}
    errors: set[str] = set()
    it = reader(None)
    delivered = replays = 0
    restarted = False
    while True:
        try:
            batch = it.poll_batch(rnd.choice([1, 7, 50, 2000]), 0.2)
        except MissingUUIDError as exc:
            errors.add(str(exc))
            continue
        if not batch and read_through(it, ends):
            break
        assert time.monotonic() < deadline, f"{delivered} records read in 120 s, not through {ends}"
        for r in batch:
            got.setdefault(r.partition, []).append(rec_key(r))
        delivered += len(batch)
        if not restarted and delivered > total // 3:
            restarted = True
            cp = it.checkpoint()
            replays += it.stats["replays"]
            it.close()
            it = reader(cp)
    offsets, states = decode_checkpoint(it.checkpoint())
    replays += it.stats["replays"]
    it.close()
    return {
        "records": got,
        "errors": errors,
        "offsets": offsets,
        "states": sorted((s.journal, s.producer, s.last_ack, s.begin) for s in states),
        "replays": replays,
    }


@pytest.mark.integration
@pytest.mark.parametrize(
    ("seed", "partitions", "ring_size", "policy"),
    [(11, 3, 4, "deliver"), (12, 2, 8192, "drop"), (13, 2, 16, "raise")],
    ids=["3p-ring4-deliver", "2p-drop", "2p-ring16-raise"],
)
def test_fused_path_equals_pure_python_on_a_real_broker(
    kafka_bootstrap: str,
    topic_factory: Any,
    monkeypatch: pytest.MonkeyPatch,
    seed: int,
    partitions: int,
    ring_size: int,
    policy: str,
) -> None:
    # The same generated traffic written to a real topic and read by the fused path and the
    # pure-Python reader: per partition the same records, the same uuid_policy errors, the same
    # final checkpoint (a real broker's batches differ between the two reads, and across
    # partitions so does the interleaving; within a partition nothing may).
    topic = topic_factory(partitions=partitions)
    rows = generate(seed, partitions, 700)
    write(kafka_bootstrap, topic, rows)
    results = {}
    for variant in ("fused", "python"):
        with monkeypatch.context() as m:
            use_variant(variant, m)
            results[variant] = read_all(kafka_bootstrap, topic, ring_size, policy, seed, len(rows))
    fused, pure = results["fused"], results["python"]
    assert fused["records"] == pure["records"]
    assert fused["errors"] == pure["errors"] and bool(fused["errors"]) == (policy == "raise")
    assert (fused["offsets"], fused["states"]) == (pure["offsets"], pure["states"])
    assert sum(map(len, fused["records"].values())) > 200
    if ring_size <= 16:
        assert fused["replays"] > 0 and pure["replays"] > 0


def test_reads_one_topic_only_for_one_topic_name() -> None:
    one = committed._reads_one_topic
    assert one(["t"], None) and one([], [("t", 0), ("t", 3)])
    assert not one(["t", "u"], None) and not one([], [("t", 0), ("u", 0)])
    assert not one(["^t.*"], None)  # a pattern may match several topics
