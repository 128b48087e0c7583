"""producer/kafka/probe.py without a broker: a closed port or a server that never answers is no error
(the relay starts and waits for Kafka, as before), and a stop request ends the wait. The security
failures, on the real SASL_SSL listener: tests/test_security/test_relay_sasl.py."""

from __future__ import annotations

import socket
import threading
import time

from harvest_outbox.producer.kafka.probe import check_connection


def test_a_closed_port_is_not_an_error_and_is_left_at_once() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends
    began = time.monotonic()
    check_connection({"bootstrap.servers": f"127.0.0.1:{port}"}, timeout=10.0)
    assert time.monotonic() - began < 3.0


def test_a_silent_server_is_waited_for_until_the_timeout_or_a_stop() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:  # accepts (the kernel's backlog), never answers
        at = f"127.0.0.1:{server.getsockname()[1]}"
        began = time.monotonic()
        check_connection({"bootstrap.servers": at}, timeout=1.0)
        assert 0.9 <= time.monotonic() - began < 4.0
        stop = threading.Event()
        threading.Timer(0.3, stop.set).start()
        began = time.monotonic()
        check_connection({"bootstrap.servers": at}, timeout=30.0, stop=stop)
        assert time.monotonic() - began < 3.0


def test_no_bootstrap_servers_asks_nothing() -> None:
    began = time.monotonic()
    check_connection({}, timeout=30.0)
    assert time.monotonic() - began < 0.5
