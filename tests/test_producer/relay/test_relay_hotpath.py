"""Pure-logic tests of the relay's throughput changes (issue 13), no DB, no Kafka:
- a full mark asks for the next ones (``MARKS_AHEAD``) before its rows are produced (mark and
  produce overlap, and the mark connection never waits for the relay thread); queued marks are
  taken in the order they were asked for;
- ``--uuid-sequencing``'s per-record UUID header (``continue_uuid``) is the reference encoding;
- pooled delivery callbacks (``Slot``) deliver each report to its record's transaction and clock,
  and return to the pool for reuse;
- the sequenced ``produce()`` passes its arguments by position (``PRODUCE_ARGS``): confluent-kafka
  takes them in that order, and the test doubles read them the same way;
- at-least-once ``_send`` sets up its retry only when librdkafka's queue is full: it waits that out
  in order, or gives up the view after ~10 s;
- a trickling at-least-once relay waits in short slices only while a ready row waits for a report;
- an idle relay that LISTENs backs its empty marks off to ``idlePollInterval`` (a NOTIFY starts over)."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from fake_producer import FakeProducer
from fake_relay import FakeMsg, leader_relay

from harvest_outbox.producer.kafka import ANY_PARTITION, PRODUCE_ARGS, produce_args
from harvest_outbox.producer.layouts.mark.marksize import MarkSize
from harvest_outbox.producer.relay.at_least_once.mode import AtLeastOnceMode
from harvest_outbox.producer.relay.core import MARKS_AHEAD, PendingMark
from harvest_outbox.producer.relay.sequenced._txn import Slot
from harvest_outbox.producer.relay.sequenced._view import continue_uuid, uuid_bytes
from harvest_outbox.sequencer import Flags, build_uuid, clock_of, flags_of, new_producer_id, parse_uuid, producer_of


def row(i: int, key: str) -> tuple:
    return (i, "t", key.encode(), f"v{i}".encode(), None, None, None, None, None, None, 0.0)


def _at_least_once_on(producer_of: Any, **limits: Any) -> tuple[AtLeastOnceMode, Any]:
    """The at-least-once mode of a leader relay (:func:`fake_relay.leader_relay`) and its producer."""
    relay, producer = leader_relay(producer_of, **limits)
    assert isinstance(relay.mode, AtLeastOnceMode)
    return relay.mode, producer


def _relay(**limits: Any) -> tuple[AtLeastOnceMode, FakeProducer, list[int]]:
    """A leader relay with a fake producer; returns it, the producer, and the number of records
    produced at each moment a mark was asked for."""
    mode, producer = _at_least_once_on(lambda cb: FakeProducer(cb), **limits)
    core = mode.core
    asked_at: list[int] = []

    def submit_mark() -> None:
        asked_at.append(len(producer.sent))
        core.marks.append(PendingMark(Future(), core.leader_id, core.mark_size.value))  # pending: not waited for

    core.submit_mark = submit_mark  # type: ignore[method-assign]
    return mode, producer, asked_at


def _mark_returns(h: AtLeastOnceMode, rows: list[tuple], asked: int) -> None:
    done: Future = Future()
    done.set_result((rows, {}))
    h.core.marks.append(PendingMark(done, h.core.leader_id, asked))  # type: ignore[arg-type]


def test_a_full_mark_asks_for_the_next_before_producing_its_rows() -> None:
    h, p, asked_at = _relay()
    h.core.mark_size.value = 4
    _mark_returns(h, [row(i, f"k{i}") for i in range(1, 5)], asked=4)
    h.tick()
    assert len(p.sent) == 4
    assert asked_at == [0] * MARKS_AHEAD, "the next marks must be asked for before the full mark's rows are produced"


def test_queued_marks_run_back_to_back_and_are_taken_in_order() -> None:
    """Scenario: the relay thread asks for a mark and, when it comes back full, queues two more on the
    mark connection's worker; they run one after the other (the second starts as the first ends, not
    when the relay thread next looks) and their rows are produced in the order they were marked."""
    h, p, _asked_at = _relay()
    core = h.core
    del core.submit_mark  # the real one, on a real single-thread worker
    gate = threading.Event()
    started: list[int] = []
    next_id = [1]

    class _MarkDb:
        def mark_with_attempts(self, leader: uuid.UUID, limit: int) -> tuple[list[tuple], dict]:
            started.append(len(started))
            if len(started) == 2:
                gate.wait(10)  # the second mark is slow: the third waits behind it, queued
            first, next_id[0] = next_id[0], next_id[0] + limit
            return [row(i, f"k{i}") for i in range(first, first + limit)], {}

    core.mark_db = _MarkDb()  # type: ignore[assignment]
    core.mark_exec = ThreadPoolExecutor(1)
    try:
        core.mark_size = MarkSize(4, 4)
        core.submit_mark()
        core.marks[0].future.result(10)
        h.tick()  # takes mark 1 (full): queues marks 2 and 3, produces mark 1's rows
        assert [m.asked for m in core.marks] == [4] * MARKS_AHEAD and len(p.sent) == 4
        deadline = time.monotonic() + 10
        while len(started) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.05)
        assert started == [0, 1]  # mark 2 runs; mark 3 waits behind it on the same worker
        gate.set()
        for m in list(core.marks):
            m.future.result(10)
        assert started == [0, 1, 2]
        for _ in range(10):
            h.tick()
        sent_ids = [int(value[1:]) for _topic, value, _key, _headers in p.sent]
        assert sent_ids[:12] == list(range(1, 13))
    finally:
        gate.set()
        core.mark_exec.shutdown(wait=True)


def test_a_short_mark_does_not_ask_again_at_once() -> None:
    h, p, asked_at = _relay()
    h.core.mark_size.value = 4
    _mark_returns(h, [row(1, "a"), row(2, "b")], asked=4)
    h.tick()
    assert len(p.sent) == 2
    assert asked_at == []  # the backlog is drained: the ordinary prefetch decides, on a later tick


class _Listener:
    def __init__(self) -> None:
        self.notified = False

    def pending(self) -> bool:
        got, self.notified = self.notified, False
        return got

    def fileno(self) -> None:
        return None

    def wait(self, timeout: float) -> bool:
        return self.pending()


def test_after_a_short_mark_the_next_waits_for_a_notify_or_the_backoff() -> None:
    """A trickle's mark comes back short: marking again at once would come back empty (two marks per
    row); the next mark follows the stasher's NOTIFY, or markBackoff when none comes (a minute here, so a
    loaded machine's slow ticks never see it pass: the test moves it)."""
    h, p, asked_at = _relay(mark_backoff=60.0)
    listener = _Listener()
    h.core.listener = listener  # type: ignore[assignment]
    h.core.mark_size.value = 4
    _mark_returns(h, [row(1, "a")], asked=4)
    for _ in range(3):
        h.tick()
    assert len(p.sent) == 1 and asked_at == []
    listener.notified = True
    h.tick()  # sees the NOTIFY
    h.tick()  # marks
    assert asked_at == [1]
    h.core.marks.clear()
    h.core.next_mark = 0.0  # markBackoff passed without a NOTIFY: the relay marks anyway
    h.tick()
    assert asked_at == [1, 1]


def test_an_idle_relay_with_a_listen_backs_its_empty_marks_off_to_the_idle_poll() -> None:
    """Every commit NOTIFYs a relay that LISTENs, so its empty marks only guard against a lost one: each
    waits twice as long as the last, from minPollInterval up to idlePollInterval; a NOTIFY or a mark
    with rows starts over. Without a LISTEN (``wakeup: poll``) every empty mark waits markBackoff, so the
    idle poll stays at the election's pulse."""
    h, _p, _asked = _relay()
    core, limits = h.core, h.core.limits
    core.listener = _Listener()  # type: ignore[assignment]
    waits = []
    for _ in range(8):
        core.took_mark(True, 100.0, empty=True)
        waits.append(round(core.next_mark - 100.0, 6))
    assert waits[:4] == [limits.min_poll_interval * 2**i for i in range(4)]
    assert waits[-1] == limits.idle_poll_interval and waits == sorted(waits)
    core.mark_now()  # a NOTIFY
    assert core.next_mark == 0.0
    core.took_mark(True, 100.0, empty=True)
    assert core.next_mark == 100.0 + limits.min_poll_interval
    core.took_mark(True, 100.0, empty=True)
    core.took_mark(True, 100.0)  # a short mark with rows: the trickle's markBackoff, and the backoff starts over
    assert core.next_mark == 100.0 + limits.mark_backoff
    core.took_mark(True, 100.0, empty=True)
    assert core.next_mark == 100.0 + limits.min_poll_interval
    core.listener = None
    core.took_mark(True, 100.0, empty=True)
    core.took_mark(True, 100.0, empty=True)
    assert core.next_mark == 100.0 + limits.mark_backoff


def test_continue_uuid_is_the_reference_encoding() -> None:
    clocks = [
        0,
        1,
        15,
        16,
        160,
        (1 << 36) - 1,
        1 << 36,
        (1 << 52) + 7,
        (1 << 60) - 1,
        0x1EE5A1C0FFEE123 * 16 + 9,
        (0xFFFFFFFF << 4) | 3,
    ]
    for _ in range(3):
        producer = new_producer_id()
        for clock in clocks:
            got = continue_uuid(producer, clock)
            assert got == uuid_bytes(int.from_bytes(producer, "big"), clock, int(Flags.CONTINUE_TXN))
            assert got == build_uuid(producer, clock, int(Flags.CONTINUE_TXN)).bytes
            u = parse_uuid(got)
            assert (producer_of(u), clock_of(u), flags_of(u)) == (producer, clock, int(Flags.CONTINUE_TXN))


def test_confluent_kafka_takes_produce_arguments_in_the_order_the_hot_path_passes_them() -> None:
    """A real confluent-kafka Producer (no broker: the record times out locally): given by position
    as the sequenced relay gives them, the record keeps its topic, key and value, the partitioner
    places it, and the per-record callback gets its report."""
    from confluent_kafka import KafkaError, Producer

    assert PRODUCE_ARGS[:3] == ("topic", "value", "key")
    reports: list[tuple[Any, Any]] = []
    producer = Producer(
        {"bootstrap.servers": "127.0.0.1:1", "message.timeout.ms": 200, "socket.timeout.ms": 100, "log_level": 0}
    )
    producer.produce(
        "t", b"v", b"k", ANY_PARTITION, lambda err, msg: reports.append((err, msg)), None, 0, [("uuid", b"\x01" * 16)]
    )
    deadline = time.monotonic() + 10
    while not reports and time.monotonic() < deadline:
        producer.poll(0.05)
    assert len(reports) == 1
    err, msg = reports[0]
    assert err.code() == KafkaError._MSG_TIMED_OUT and (msg.topic(), msg.key(), msg.value()) == ("t", b"k", b"v")
    assert produce_args((ANY_PARTITION, "cb", None, 0, ["h"]), {}) == {
        "partition": ANY_PARTITION,
        "callback": "cb",
        "on_delivery": None,
        "timestamp": 0,
        "headers": ["h"],
    }


class _Txn:
    def __init__(self) -> None:
        self.reports: list[tuple[int, Any, Any]] = []

    def on_delivery(self, clock: int, err: Any, msg: Any) -> None:
        self.reports.append((clock, err, msg))


def test_delivery_slots_report_their_clock_and_return_to_the_pool() -> None:
    pool: list[Slot] = []
    t1, t2 = _Txn(), _Txn()
    a, b = Slot(pool), Slot(pool)
    a.txn, a.clock = t1, 100  # type: ignore[assignment]
    b.txn, b.clock = t2, 200  # type: ignore[assignment]
    b(None, "m2")  # reports arrive in any order across partitions
    assert pool == [b] and t2.reports == [(200, None, "m2")] and b.txn is None
    a("err", "m1")
    assert pool == [b, a] and t1.reports == [(100, "err", "m1")]
    reused = pool.pop()
    assert reused is a
    reused.txn, reused.clock = t2, 300  # type: ignore[assignment]
    reused(None, "m3")
    assert t2.reports[-1] == (300, None, "m3") and t1.reports == [(100, "err", "m1")]


class _FullQueueProducer(FakeProducer):
    """Refuses ``full`` produce() calls with BufferError (librdkafka's local queue is full), counting
    the polls the relay makes meanwhile; ``full=None``: always full."""

    def __init__(self, on_delivery: Any, full: int | None) -> None:
        super().__init__(on_delivery)
        self.full, self.polls = full, 0

    def produce(self, *args: Any, **kw: Any) -> None:
        if self.full is None or self.full > 0:
            if self.full is not None:
                self.full -= 1
            raise BufferError("Local: Queue full")
        super().produce(*args, **kw)

    def poll(self, timeout: float = 0) -> int:
        self.polls += 1
        return 0


def test_at_least_once_waits_out_a_full_queue_then_sends_in_order() -> None:
    # Three refusals: the relay serves callbacks between tries and the record goes out once there is
    # room, still first; the key stays busy throughout, so its next record waits behind it.
    mode, producer = _at_least_once_on(lambda cb: _FullQueueProducer(cb, full=3))
    mode.core.ready.extend([row(1, "a"), row(2, "a"), row(3, "b")])
    mode._dispatch()
    assert [(s[1], s[2]) for s in producer.sent] == [(b"v1", b"a"), (b"v3", b"b")]
    assert producer.polls == 3 and not mode.core.remark
    assert sorted(mode.in_flight_keys()) == [b"a", b"b"] and mode.gauges() == (2, 1)


def test_at_least_once_gives_up_the_view_when_the_queue_stays_full() -> None:
    # ~10 s of a full queue (1,000 polls of 10 ms): the record is not in flight, and the relay
    # remarks (the row stays in the outbox, marked by a view about to be left).
    mode, producer = _at_least_once_on(lambda cb: _FullQueueProducer(cb, full=None))
    mode.core.ready.extend([row(1, "a"), row(2, "b")])
    mode._dispatch()
    assert producer.sent == [] and producer.polls == 1000
    assert mode.core.remark and mode.in_flight_keys() == []


def test_at_least_once_a_report_sends_the_keys_next_record_skipping_one_dead_lettered_on_the_spot() -> None:
    mode, producer = _at_least_once_on(lambda cb: FakeProducer(cb))
    bad = (2, "t", b"a", b"v2", None, None, "kafka_topic is NULL", None, None, None, 0.0)
    mode.core.ready.extend([row(1, "a"), bad, row(3, "a"), row(4, "a")])
    mode._dispatch()
    assert [s[1] for s in producer.sent] == [b"v1"] and mode.gauges() == (1, 3)
    mode._on_delivery(None, FakeMsg(b"a"))  # type: ignore[arg-type]
    # row 2 is dead-lettered without going out; row 3 is next in flight; row 4 still waits
    assert [s[1] for s in producer.sent] == [b"v1", b"v3"] and mode.gauges() == (1, 1)
    assert [d[0] for d in mode._dlq_buf] == [2] and mode._purge_buf == [1]
    mode._on_delivery(None, FakeMsg(b"a"))  # type: ignore[arg-type]
    mode._on_delivery(None, FakeMsg(b"a"))  # type: ignore[arg-type]
    assert [s[1] for s in producer.sent] == [b"v1", b"v3", b"v4"] and mode.gauges() == (0, 0)
    assert mode._purge_buf == [1, 3, 4] and mode.metrics.delivered == 3


def test_a_trickling_relay_waits_short_slices_only_while_a_ready_row_waits_for_a_report() -> None:
    """Records in librdkafka's hands, nothing else to do: the relay waits on its waker in 1 ms slices (a
    mark, a job or a NOTIFY still ends the wait at once); while a ready row waits for a report (its key's
    record in flight), in 0.2 ms slices, so the report is served and the row sent at once."""
    from harvest_outbox.producer.relay import core as core_module

    class Holding(FakeProducer):
        def __len__(self) -> int:
            return len(self.sent) - self.reported

        reported = 0

    class RecordingWaker:  # the Waker has __slots__: its wait cannot be patched on the instance
        def wait(self, timeout: float, *fds: int | None) -> bool:
            waits.append(timeout)
            return False

    mode, producer = _at_least_once_on(lambda cb: Holding(cb))
    waits: list[float] = []
    mode.core.waker = RecordingWaker()  # type: ignore[assignment]
    mode.core.next_mark = float("inf")  # no mark due: the tick only waits
    mode.core.ready.extend([row(1, "a")])
    mode.tick()  # sends row 1, then waits for its report with nothing else waiting
    assert len(producer.sent) == 1 and waits[-1] == core_module._QUIET_SLICE
    mode.core.ready.extend([row(2, "a")])  # the key's next row: it waits for row 1's report
    mode.tick()
    assert len(producer.sent) == 1 and waits[-1] == core_module._TRICKLE_SLICE
    producer.reported = 1
    mode._on_delivery(None, FakeMsg(b"a"))  # type: ignore[arg-type]
    assert len(producer.sent) == 2
    assert core_module._TRICKLE_SLICE < core_module._QUIET_SLICE <= 0.001  # never a busy loop, never long
