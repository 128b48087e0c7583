"""One Kafka admin client per cluster for a process's relays (a fleet's outboxes), not one per relay.

A relay's preflight (:class:`~producer.ops.preflight.TopicGuard`) asks the broker about the topics its rows
name through an admin client. One per relay cost a fleet a librdkafka instance per led outbox: its threads
(a main thread and one per broker), its broker connections and its idle wake-ups. The outboxes of a fleet
that reach Kafka with the same settings share one (librdkafka's handles are thread-safe, and the admin
calls each relay makes are independent requests with their own futures).

Invariants (tests/test_producer/kafka/test_shared_admin.py):
- :meth:`SharedAdmins.get` returns the same client for equal settings (whatever their order) and a client
  of its own for any other settings (another cluster, another principal);
- clients are made lazily, once each, even when relays ask at the same moment from several threads;
- a fleet's clients are dropped by :meth:`SharedAdmins.close` (each hands over its queued log lines first).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from harvest_outbox.producer.kafka._logs import logged_admin, serve_logs


class SharedAdmins:
    """A process's admin clients by their settings (see module doc)."""

    def __init__(self, make: Callable[[dict[str, Any]], Any] = logged_admin) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._clients: dict[tuple[tuple[str, str], ...], Any] = {}

    def get(self, config: dict[str, Any]) -> Any:
        """The admin client for ``config`` (a relay's TopicGuard ``admin_factory``)."""
        key = tuple(sorted((str(k), repr(v)) for k, v in config.items()))
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                client = self._clients[key] = self._make(dict(config))
            return client

    def __len__(self) -> int:
        with self._lock:
            return len(self._clients)

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            serve_logs(client)
