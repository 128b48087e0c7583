"""A relay process for the protocol's model test (test_protocol_model.py): the real
:class:`~producer.relay.core.RelayCore` and :class:`~producer.relay.sequenced.mode.SequencedMode`, with the
database (model_db.py), the Kafka producer (model_kafka.py), the DB worker threads, the waker, the
LISTEN connection and time replaced by what the test's scheduler (``world``) drives.

``world`` provides: ``clock`` (:class:`Clock`), ``rng``, ``limits``, ``db``, ``topic``, ``stats``,
``calm_ops``, ``db_fate(relay, op)``, ``on_producer_call(relay, producer, what)`` and
``maybe_crash(relay, p)``.
"""

from __future__ import annotations

import copy
import functools
import uuid
from collections import deque
from concurrent.futures import Future
from typing import Any

from fake_admin import FakeAdmin
from model_db import Crash, ModelStore
from model_kafka import ModelProducer

from harvest_outbox.producer.config import HarvestConfig, Limits
from harvest_outbox.producer.errors import DatabaseError
from harvest_outbox.producer.ops.preflight import TopicGuard
from harvest_outbox.producer.relay.core import RelayCore
from harvest_outbox.producer.relay.sequenced._store import SequencedStore
from harvest_outbox.producer.relay.sequenced.mode import SequencedMode


class Clock:
    """Virtual time; every wait of the relay advances it instead of sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def advance(self, seconds: float) -> None:
        self.now += max(seconds, 0.0)

    def monotonic(self) -> float:
        return self.now


class ModelFuture:
    """A DB job on the write connection: runs when the scheduler runs it, or when the relay waits for
    it (then every job queued before it runs first: one connection, statements in order)."""

    def __init__(self, worker: ModelWorker, fn: Any, args: tuple[Any, ...]) -> None:
        self.worker, self.fn, self.args = worker, fn, args
        self._done = False
        self._exc: BaseException | None = None
        self._result: Any = None

    def run(self) -> None:
        try:
            self._result = self.fn(*self.args)
        except Crash:
            raise
        except BaseException as exc:  # what a real Future keeps for result()/exception()
            self._exc = exc
        self._done = True

    def done(self) -> bool:
        return self._done

    def _wait(self) -> None:
        while not self._done:
            self.worker.run_next()

    def result(self, timeout: float | None = None) -> Any:
        self._wait()
        if self._exc is not None:
            raise self._exc
        return self._result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait()
        return self._exc


class ModelWorker:
    """The write connection's single worker thread, as a queue the scheduler drains."""

    def __init__(self) -> None:
        self.queue: deque[ModelFuture] = deque()

    def submit(self, fn: Any, *args: Any) -> ModelFuture:
        f = ModelFuture(self, fn, args)
        self.queue.append(f)
        return f

    def run_next(self) -> None:
        self.queue.popleft().run()

    def shutdown(self, wait: bool = True) -> None:
        pass


class MarkWorker:
    """The mark connection's worker: a mark runs when asked for (its rows are a snapshot then)."""

    def submit(self, fn: Any, *args: Any) -> Future[Any]:
        f: Future[Any] = Future()
        try:
            f.set_result(fn(*args))
        except Crash:
            raise
        except Exception as exc:
            f.set_exception(exc)
        return f

    def shutdown(self, wait: bool = True) -> None:
        pass


class Idle:
    """The waker, the LISTEN connection and the stop event: waiting on them only lets time pass."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def watch(self, future: Any) -> Any:
        return future

    def wait(self, timeout: float, *fds: Any) -> bool:
        self.clock.advance(timeout)
        return False

    def fileno(self) -> None:
        return None

    def pending(self) -> bool:
        return False

    def is_set(self) -> bool:
        return False

    def close(self) -> None:
        pass


@functools.lru_cache(maxsize=512)
def _validated_config(limits: Limits, dead_letter_policy: str) -> HarvestConfig:
    return HarvestConfig(
        limits=limits,
        uuid_sequencing=True,
        name="r0",
        leader_election="postgres",
        dead_letter_policy=dead_letter_policy,
    )


def _config(limits: Limits, dead_letter_policy: str, name: str) -> HarvestConfig:
    """The relay's config: validated once per limits and policy, then renamed per relay. Validating it
    (DSN parsing and all) for each of the model tests' tens of thousands of relays took a fifth of their
    time; only the name differs between them, and ``r<n>`` needs no validation."""
    cfg = copy.copy(_validated_config(limits, dead_letter_policy))
    object.__setattr__(cfg, "name", name)  # frozen: as HarvestConfig.__post_init__ itself sets it
    return cfg


class Hook:
    """The mode's crash points: the scheduler may crash the relay at any of them."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay

    def __bool__(self) -> bool:
        return True

    def hit(self, point: str, settle: float = 0.0) -> None:
        self.relay.world.maybe_crash(self.relay, 0.08)


class Relay:
    """One relay process: a RelayCore and a SequencedMode wired to the model's database and topic."""

    def __init__(self, world: Any, n: int) -> None:
        self.world, self.n = world, n
        self.alive = True
        self.producers: list[ModelProducer] = []
        cfg = _config(world.limits, "haltKey" if world.db.halt_keys else "skip", f"r{n}")
        guard = TopicGuard(
            {}, cfg.producer_config(), admin_factory=lambda conf: FakeAdmin({world.topic.name: 1_048_588})
        )
        idle = Idle(world.clock)
        core = self.core = RelayCore(
            cfg, lambda event: None, producer_factory=self._producer, guard=guard, shards=None, stop_requested=idle
        )  # type: ignore[arg-type]
        # The model's database is typed against what the sequenced mode asks of a layout's relay database
        # (SequencedStore, the sequenced part of producer.layouts.layout.RelayDatabase), which it fakes in full;
        # the rest of RelayDatabase (the at-least-once mode's purges, the meter's stats) the model never runs.
        write: SequencedStore = ModelStore(world.db, self._chaos)
        read: SequencedStore = ModelStore(world.db, self._chaos)
        core.db, core.mark_db = write, read  # type: ignore[assignment]
        core.exec = self.worker = ModelWorker()  # type: ignore[assignment]
        core.mark_exec = MarkWorker()  # type: ignore[assignment]
        core.listener = core.waker = idle  # type: ignore[assignment]
        mode = self.mode = SequencedMode(core)
        mode.monotonic = world.clock.monotonic
        skew = world.rng.choice([0, 0, -3_000_000_000, 2_000_000_000])  # wall clocks disagree
        mode.wall_clock_ns = lambda: int(world.clock.now * 1e9) + skew + 1_700_000_000_000_000_000
        mode._hook = Hook(self)  # type: ignore[assignment]
        # Harvest.on_acquired
        core.leader_id = uuid.uuid4()
        core.remark = False
        mode.on_acquired()

    def _producer(self, conf: dict[str, Any], on_delivery: Any) -> ModelProducer:
        p = ModelProducer(
            self.world.topic, self._on_producer_call, self.world.clock.advance, lambda n: self.world.rng.randint(0, n)
        )
        self.producers.append(p)
        return p

    def _chaos(self, op: str) -> str:
        return self.world.db_fate(self, op)

    def _on_producer_call(self, producer: ModelProducer, what: str) -> BaseException | None:
        return self.world.on_producer_call(self, producer, what)

    @property
    def leading(self) -> bool:
        return self.alive and self.core.leader_id is not None

    def tick(self) -> None:
        """One pass of Harvest._run's loop while leading."""
        try:
            self.mode.tick()
        except DatabaseError:
            self.core.remark = True
            self.world.clock.advance(self.world.limits.io_error_backoff)

    def revoke(self) -> None:
        """Harvest._relinquish: the election took leadership away."""
        self.mode.relinquish("revoked")
        self.core.attempts.clear()
        self.core.leader_id = None
        self.core.remark = False

    def crash(self) -> None:
        """The process dies: a DB job being sent may still commit; records in flight may be written."""
        self.alive = False
        self.world.stats["crashes"] += 1
        rng = self.world.rng
        if self.worker.queue and rng.random() < 0.5:
            job = self.worker.queue.popleft()
            self.world.calm_ops += 1
            try:
                job.run()
            finally:
                self.world.calm_ops -= 1
        self.worker.queue.clear()
        for p in self.producers:
            p.lose()
