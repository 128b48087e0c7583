"""The relay's HTTP endpoint (``/metrics``, ``/healthz``, ``/readyz``) against clients that misbehave:
idle and half-sent connections cost no thread and cannot starve a scrape, an HTTP/0.9 request (whose
headers never end) times out and is closed, bursts of concurrent scrapes are all answered, and
methods other than GET and HEAD get 405. Real sockets on a real server of a (not started) relay."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from relaylib import relay_config

from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.observe.metrics import start_prometheus

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def port(pg_dsn: str, kafka_bootstrap: str) -> Iterator[int]:
    relay = Harvest(relay_config(pg_dsn, kafka_bootstrap, "public.outbox", "g-http"))
    server, thread = start_prometheus(relay.metrics, "http-test", 0, "127.0.0.1", relay=relay)
    try:
        yield int(server.server_port)
    finally:
        server.shutdown()
        thread.join(10)
        assert not thread.is_alive()


def request(port: int, method: str, path: str, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", method=method, data=b"x=1" if method in ("POST", "PUT") else None
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def _harvest_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("harvest-http") or "process_request" in t.name)


def test_idle_and_half_sent_connections_hold_no_thread_and_do_not_delay_a_scrape(port: int) -> None:
    before = _harvest_threads()
    socks: list[socket.socket] = []
    try:
        for i in range(220):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            if i % 11 == 0:  # half-sent: a request line and a header, never the blank line
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        time.sleep(1.0)
        grown = _harvest_threads() - before
        assert grown <= 4, f"{grown} more endpoint threads with 220 idle connections"
        started = time.monotonic()
        status, _headers, body = request(port, "GET", "/metrics", timeout=5)
        took = time.monotonic() - started
        assert status == 200 and b"harvest_is_leader" in body
        assert took < 2.0, f"a scrape next to 220 idle connections took {took:.2f}s"
    finally:
        for s in socks:
            s.close()


def test_a_burst_of_concurrent_scrapes_is_answered(port: int) -> None:
    with ThreadPoolExecutor(200) as pool:
        results = list(pool.map(lambda _: request(port, "GET", "/metrics", timeout=10)[0], range(200)))
    assert results.count(200) == 200, results


def test_an_http09_request_times_out_and_is_closed(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
        s.sendall(b"GET /metrics\r\n")  # HTTP/0.9 has no headers: a reader waiting for the blank line hangs
        started = time.monotonic()
        got = b""
        while chunk := s.recv(4096):  # until the server closes the connection (socket.timeout fails the test)
            got += chunk
        took = time.monotonic() - started
    assert got.startswith(b"HTTP/1.0 408 "), got
    assert took < 10, f"closed after {took:.1f}s"


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "TRACE", "OPTIONS", "PATCH"])
@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
def test_methods_other_than_get_and_head_are_405(port: int, method: str, path: str) -> None:
    status, headers, body = request(port, method, path)
    assert status == 405, (status, body)
    assert headers.get("Allow") == "GET, HEAD"
    assert method.encode() in body and b"GET or HEAD" in body


@pytest.mark.parametrize(
    "method, path, want",
    [
        ("GET", "/healthz", 503),
        ("HEAD", "/healthz", 503),
        ("GET", "/metrics", 200),
        ("HEAD", "/metrics", 200),
        ("GET", "/nope", 404),
    ],
)
def test_get_and_head_still_answer(port: int, method: str, path: str, want: Any) -> None:
    status, _headers, body = request(port, method, path)
    assert status == want  # 503 on /healthz: this relay was never started
    if method == "HEAD":
        assert body == b""
