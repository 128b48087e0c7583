"""A narrow seam around confluent-kafka's Producer, plus a fault injector for tests.

The relay only needs ``produce``, ``poll``, ``flush``, ``purge`` and ``len``; it receives
delivery reports through one callback given at construction (a global ``on_delivery``, so no
closure is allocated per message). :class:`FaultInjectingProducer` wraps a *real* producer and
makes ``produce()`` raise, or turns successful delivery reports into failures, at given rates —
the real broker still receives (some of) those records, which is exactly the duplicate-producing
situation at-least-once delivery must survive.

Error classification (:func:`is_permanent`): errors that retrying can never fix (record too large,
invalid topic, authorisation) send the record to the dead-letter table at once; everything else
counts as a failed attempt. An unknown topic is not permanent here: :mod:`producer.preflight` has
already refused rows of topics the broker says do not exist, so librdkafka's "unknown topic" for a
row that got past it is stale metadata of a topic just created (it counts as an attempt).
"""

from __future__ import annotations

import functools
import logging
import os
import random
import re
import signal
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Message, Producer

DeliveryCallback = Callable[["KafkaError | None", Message], None]

#: librdkafka's own log lines of harvest's clients (broker connections lost, config warnings) go
#: through :mod:`logging` instead of raw lines on stderr, so the CLI's format, level and handlers
#: apply. confluent-kafka serves them inside ``poll()``/``flush()``, which every such client calls
#: (admin clients included: :func:`serve_logs`). Repeated failures are logged once per window.
LIBRDKAFKA_LOG = logging.getLogger("harvest_outbox.librdkafka")


class _ChosenSettingWarnings(logging.Filter):
    """librdkafka warns on every producer that ``enable.gapless.guarantee`` is experimental. With
    ``--uuid-sequencing`` harvest sets it on purpose (a gap must fail the producer, not the order:
    docs/design.md §5), so at each relay start and producer replacement the warning told users nothing
    they could act on. It is kept, at DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if (
            record.levelno >= logging.WARNING
            and isinstance(args, tuple)
            and len(args) == 3
            and args[0] == "CONFWARN"
            and "enable.gapless.guarantee is experimental" in str(args[2])
        ):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return LIBRDKAFKA_LOG.isEnabledFor(logging.DEBUG)
        return True


# What differs between two reports of one failure: librdkafka's own "(after 0ms in state CONNECT, 3
# identical error(s) suppressed)" tail.
_REPORT_TAIL = re.compile(r"\s*\(after \d+ms in state [^)]*\)")


class _RepeatedLines(logging.Filter):
    """A broker that is down makes every client report each reconnection (~20 ``FAIL`` lines a second
    at start-up, one per client). A warning or error is logged once per :attr:`WINDOW` whatever client
    repeats it; the next one after the window says how many were left out. Thread-safe: clients are
    polled on the relay's and the elections' threads."""

    WINDOW = 30.0
    _MAX_KINDS = 1000  # distinct lines remembered; forgetting them only lets a repeat through early

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, str], list[float]] = {}  # kind -> [first logged at, left out since]

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if record.levelno < logging.WARNING or not (isinstance(args, tuple) and len(args) == 3):
            return True
        kind = (str(args[0]), _REPORT_TAIL.sub("", str(args[2])))
        now = time.monotonic()
        with self._lock:
            seen = self._seen.get(kind)
            if seen is not None and now - seen[0] < self.WINDOW:
                seen[1] += 1
                return False
            if len(self._seen) >= self._MAX_KINDS:
                self._seen.clear()
            self._seen[kind] = [now, 0]
        if seen is not None and seen[1]:
            record.args = (
                args[0],
                args[1],
                f"{args[2]} ({int(seen[1])} more like it in the last {now - seen[0]:.0f} s not logged)",
            )
        return True


LIBRDKAFKA_LOG.addFilter(_ChosenSettingWarnings())
LIBRDKAFKA_LOG.addFilter(_RepeatedLines())


def logged(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with harvest's librdkafka logger, for a producer or consumer the relay polls anyway
    (an admin client is made by :func:`logged_admin`)."""
    return {"logger": LIBRDKAFKA_LOG, **config}


class _AdminLogPump:
    """confluent-kafka hands a client's log lines over only inside ``poll()``, which nothing calls on an
    admin client: its lines would pile up in memory (about one a second while a broker is down). One
    daemon thread polls every live admin client of the relay; it ends when none is left."""

    INTERVAL = 0.5

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: weakref.WeakSet[Any] = weakref.WeakSet()
        self._thread: threading.Thread | None = None

    def add(self, client: Any) -> None:
        with self._lock:
            self._clients.add(client)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="harvest-librdkafka-log", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(self.INTERVAL)
            with self._lock:
                clients = list(self._clients)
                if not clients:
                    self._thread = None
                    return
            for client in clients:
                serve_logs(client)
            del clients  # no strong reference between two rounds: a dropped client goes at once


_ADMIN_LOG_PUMP = _AdminLogPump()


def logged_admin(config: dict[str, Any]) -> Any:
    """An admin client whose librdkafka lines go to :data:`LIBRDKAFKA_LOG` (not raw to stderr)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(logged(config))
    _ADMIN_LOG_PUMP.add(admin)
    return admin


def serve_logs(client: Any) -> None:
    """Hand over the log lines ``client`` queued now (before dropping an admin client, say)."""
    try:
        client.poll(0)
    except Exception as exc:  # a log pump must not fail its caller
        LIBRDKAFKA_LOG.debug("polling a Kafka client for its log lines: %s", exc)


PERMANENT_CODES = frozenset(
    code
    for code in (
        getattr(KafkaError, "MSG_SIZE_TOO_LARGE", None),
        getattr(KafkaError, "_MSG_SIZE_TOO_LARGE", None),
        getattr(KafkaError, "TOPIC_EXCEPTION", None),
        getattr(KafkaError, "TOPIC_AUTHORIZATION_FAILED", None),
        getattr(KafkaError, "INVALID_RECORD", None),
        getattr(KafkaError, "RECORD_LIST_TOO_LARGE", None),
        getattr(KafkaError, "_INVALID_ARG", None),
        getattr(KafkaError, "INVALID_TOPIC_EXCEPTION", None),
    )
    if code is not None
)


# Broker-side errors that reject a whole produce batch: an innocent record batched with an oversized
# one sees the same error. Reported asynchronously they count as an ordinary failed attempt (the
# culprit still reaches the dead letters after maxDeliveryAttempts; the innocents get through on a
# retry, batched differently). Raised synchronously by produce() they concern that record alone.
BATCH_SCOPED_CODES = frozenset(
    code
    for code in (
        getattr(KafkaError, "MSG_SIZE_TOO_LARGE", None),
        getattr(KafkaError, "RECORD_LIST_TOO_LARGE", None),
        getattr(KafkaError, "INVALID_RECORD", None),
    )
    if code is not None
)


def is_size_refusal(err: KafkaError) -> bool:
    """The broker refused a record batch as too large (which record is to blame is not said)."""
    return err.code() in BATCH_SCOPED_CODES or "Message size too large" in err.str()


def is_permanent(err: KafkaError, synchronous: bool = True) -> bool:
    """True if retrying this record can never succeed."""
    code = err.code()
    return code in PERMANENT_CODES and (synchronous or code not in BATCH_SCOPED_CODES)


#: confluent-kafka's ``produce()`` parameters in order. The sequenced hot path passes them by position:
#: keyword arguments are matched by name on every call, ~0.25 µs of a record's ~0.8 µs ``produce()``.
PRODUCE_ARGS = ("topic", "value", "key", "partition", "callback", "on_delivery", "timestamp", "headers")
#: ``partition`` for "the partitioner decides" (librdkafka's RD_KAFKA_PARTITION_UA, the default).
ANY_PARTITION = -1


def produce_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments after ``topic, value, key`` of a ``produce()`` call, by name, however given."""
    # Not strict: a call gives any prefix of the positional arguments.
    return {**dict(zip(PRODUCE_ARGS[3:], args, strict=False)), **kwargs}


class KafkaProducer(Protocol):
    def produce(
        self, topic: str, value: bytes | None = None, key: bytes | None = None, *args: Any, **kwargs: Any
    ) -> None: ...

    def poll(self, timeout: float = ...) -> int: ...

    def flush(self, timeout: float = ...) -> int: ...

    def purge(self, in_queue: bool = ..., in_flight: bool = ..., blocking: bool = ...) -> None: ...

    def __len__(self) -> int: ...


ProducerFactory = Callable[[dict[str, Any], DeliveryCallback], KafkaProducer]


def confluent_producer(config: dict[str, Any], on_delivery: DeliveryCallback) -> KafkaProducer:
    """The real thing: confluent-kafka's Producer with a global delivery callback."""
    return Producer({**config, "on_delivery": on_delivery})


class FatalErrorGuard:
    """Delegates to a producer; a *fatal* error that ``poll()`` or ``flush()`` raises is handed to
    ``on_fatal`` instead (the relay then replaces the producer). confluent-kafka raises fatal errors
    from ``poll()`` — with ``enable.gapless.guarantee``, a batch the broker refused is one — and an
    exception out of the relay thread would stop the relay. ``produce`` is the wrapped producer's
    own bound method: the per-record path pays nothing."""

    def __init__(self, producer: KafkaProducer, on_fatal: Callable[[KafkaError], None]) -> None:
        self._real = producer
        self._on_fatal = on_fatal
        self.produce = producer.produce
        self.purge = producer.purge

    def _fatal(self, exc: KafkaException) -> None:
        err = exc.args[0] if exc.args else None
        if not isinstance(err, KafkaError) or not err.fatal():
            raise exc
        self._on_fatal(err)

    def poll(self, timeout: float = 0) -> int:
        try:
            return self._real.poll(timeout)
        except KafkaException as exc:
            self._fatal(exc)
            return 0

    def flush(self, timeout: float = -1) -> int:
        try:
            return self._real.flush(timeout)
        except KafkaException as exc:
            self._fatal(exc)
            return len(self._real)

    def __len__(self) -> int:
        return len(self._real)


class FaultInjectingProducer:
    """Delegates to a real Producer, failing ``produce()`` / delivery reports at the given rates, and
    every delivery report of records whose key is in ``fail_keys`` (a row that can never be delivered)."""

    def __init__(
        self,
        real_factory: ProducerFactory,
        config: dict[str, Any],
        on_delivery: DeliveryCallback,
        produce_failure_rate: float,
        delivery_failure_rate: float,
        rng: random.Random,
        lock: threading.Lock,
        counters: dict[str, int],
        fail_keys: frozenset[bytes] = frozenset(),
        kill_at_produce: int = 0,
        stall_keys: frozenset[bytes] = frozenset(),
    ) -> None:
        self._rng, self._lock, self.counters = rng, lock, counters
        self._produce_rate, self._delivery_rate = produce_failure_rate, delivery_failure_rate
        self._fail_keys, self._kill_at = fail_keys, kill_at_produce
        self._stall_keys = stall_keys
        # librdkafka's delivery timeout: a stalled record is reported as timed out after it
        self._timeout = int(config.get("message.timeout.ms", config.get("delivery.timeout.ms", 300000))) / 1000
        self._stalled: list[tuple[float, _StalledMsg, DeliveryCallback]] = []
        self._on_delivery = on_delivery
        self._real = real_factory(config, self._deliver)

    def _roll(self, rate: float) -> bool:
        with self._lock:
            return self._rng.random() < rate

    def _inject(self, err: KafkaError | None, msg: Message) -> KafkaError | None:
        if err is None and (self._roll(self._delivery_rate) or (self._fail_keys and msg.key() in self._fail_keys)):
            self.counters["delivery"] += 1
            err = KafkaError(KafkaError._MSG_TIMED_OUT, "injected delivery failure", retriable=True)
        return err

    def _deliver(self, err: KafkaError | None, msg: Message) -> None:
        self._on_delivery(self._inject(err, msg), msg)

    def _deliver_to(self, callback: DeliveryCallback, err: KafkaError | None, msg: Message) -> None:
        callback(self._inject(err, msg), msg)

    def produce(
        self, topic: str, value: bytes | None = None, key: bytes | None = None, *args: Any, **kwargs: Any
    ) -> None:
        kwargs = produce_args(args, kwargs)  # by name from here on
        cb = kwargs.pop("callback", None) or kwargs.get("on_delivery")
        if cb is not None:  # a per-message callback (--uuid-sequencing) gets the same injected failures
            kwargs["on_delivery"] = functools.partial(self._deliver_to, cb)
        if self._kill_at and key in self._fail_keys:
            with self._lock:
                self.counters["fail_key_produces"] = self.counters.get("fail_key_produces", 0) + 1
                if self.counters["fail_key_produces"] >= self._kill_at:  # a crash loop on this row
                    os.kill(os.getpid(), signal.SIGKILL)
        if self._roll(self._produce_rate):
            from confluent_kafka import KafkaException

            self.counters["produce"] += 1
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "injected produce failure", retriable=True))
        if self._stall_keys and key in self._stall_keys:
            # A partition that never acknowledges this record: librdkafka would retry it until
            # its delivery timeout, then report it timed out. Nothing reaches the broker.
            self.counters["stalled"] = self.counters.get("stalled", 0) + 1
            self._stalled.append(
                (time.monotonic(), _StalledMsg(topic, key, value), kwargs.get("on_delivery") or self._deliver)
            )
            return
        self._real.produce(topic, value, key, **kwargs)

    def _expire_stalled(self) -> int:
        now = time.monotonic()
        due = [s for s in self._stalled if now - s[0] >= self._timeout]
        if due:
            self._stalled = [s for s in self._stalled if now - s[0] < self._timeout]
            for since, msg, callback in due:
                msg.waited = now - since
                callback(
                    KafkaError(KafkaError._MSG_TIMED_OUT, "Local: Message timed out (injected stall)", retriable=True),
                    msg,  # type: ignore[arg-type]  # the stalled record's stand-in: what a callback reads of a Message
                )
        return len(due)

    def poll(self, timeout: float = 0) -> int:
        if not self._stalled:
            return self._real.poll(timeout)
        return self._real.poll(min(timeout, 0.01) if timeout >= 0 else 0.01) + self._expire_stalled()

    def flush(self, timeout: float = -1) -> int:
        left = self._real.flush(timeout)
        end = time.monotonic() + (timeout if timeout >= 0 else self._timeout)
        while self._stalled and time.monotonic() < end:
            time.sleep(0.01)
            self._expire_stalled()
        return left + len(self._stalled)

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        if in_queue:
            self._stalled = []
        self._real.purge(in_queue, in_flight, blocking)

    def __len__(self) -> int:
        return len(self._real) + len(self._stalled)


class _StalledMsg:
    """The delivery report's message of a stalled record (as confluent-kafka's Message)."""

    def __init__(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        self._topic, self._key, self._value = topic, key, value
        self.waited: float | None = None

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return -1

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def latency(self) -> float | None:
        return self.waited


class FaultInjector:
    """A :data:`ProducerFactory` for tests: ``Harvest(cfg, producer_factory=FaultInjector(0.05, 0.05))``."""

    def __init__(
        self,
        produce_failure_rate: float = 0.0,
        delivery_failure_rate: float = 0.0,
        seed: int = 0,
        real_factory: ProducerFactory = confluent_producer,
        fail_keys: frozenset[bytes] = frozenset(),
        kill_at_produce: int = 0,
        stall_keys: frozenset[bytes] = frozenset(),
    ) -> None:
        """``fail_keys``: every delivery of a record with one of these keys fails. ``kill_at_produce``:
        SIGKILL this process when it produces a ``fail_keys`` record for the n-th time (a row that
        crashes the relay: tests of the persisted attempt counts). ``stall_keys``: records with these
        keys are never acknowledged: they are reported timed out after the producer's
        ``message.timeout.ms`` (a partition that keeps refusing them, e.g. NOT_ENOUGH_REPLICAS)."""
        self.produce_failure_rate = produce_failure_rate
        self.delivery_failure_rate = delivery_failure_rate
        self.fail_keys, self.kill_at_produce, self.stall_keys = fail_keys, kill_at_produce, stall_keys
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._real_factory = real_factory
        self.counters = {"produce": 0, "delivery": 0}

    def __call__(self, config: dict[str, Any], on_delivery: DeliveryCallback) -> KafkaProducer:
        return FaultInjectingProducer(
            self._real_factory,
            config,
            on_delivery,
            self.produce_failure_rate,
            self.delivery_failure_rate,
            self._rng,
            self._lock,
            self.counters,
            self.fail_keys,
            self.kill_at_produce,
            self.stall_keys,
        )
