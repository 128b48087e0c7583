"""harvest_local.netfault: the fault proxy itself (pass, black-hole, reset, latency), on loopback."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from harvest_outbox.harvest_local.netfault import NetFault


@pytest.fixture
def echo() -> Iterator[int]:
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(65536):
                    conn.sendall(data)
            except OSError:  # the proxy reset the connection: expected
                pass

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield srv.getsockname()[1]
    stop.set()
    srv.close()


def _roundtrip(sock: socket.socket, payload: bytes) -> bytes:
    sock.sendall(payload)
    got = b""
    while len(got) < len(payload):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def test_pass_latency_blackhole_reset(echo: int) -> None:
    with NetFault(("127.0.0.1", echo)) as proxy:
        c = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        assert _roundtrip(c, b"hello" * 1000) == b"hello" * 1000
        proxy.latency(200)
        t = time.monotonic()
        assert _roundtrip(c, b"slow") == b"slow"
        assert time.monotonic() - t >= 0.4  # 200 ms each way
        proxy.blackhole()
        c.settimeout(1.0)
        c.sendall(b"held")
        with pytest.raises(socket.timeout):  # the connection stays open; nothing comes back
            c.recv(10)
        c2 = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)  # accepted, but silent
        c2.settimeout(0.5)
        c2.sendall(b"x")
        with pytest.raises(socket.timeout):
            c2.recv(10)
        proxy.heal()  # held bytes go through, the stream is intact
        c.settimeout(5)
        assert c.recv(10) == b"held"
        c2.settimeout(5)
        assert c2.recv(10) == b"x"
        assert _roundtrip(c, b"after") == b"after"
        proxy.reset()
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            for _ in range(50):
                if not c.recv(10):
                    raise AssertionError("a FIN, not a RST")
        with pytest.raises((ConnectionResetError, BrokenPipeError, ConnectionRefusedError)):
            c3 = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
            c3.settimeout(5)
            c3.sendall(b"x")
            if not c3.recv(10):
                raise ConnectionResetError("closed")
        proxy.heal()
        c4 = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        assert _roundtrip(c4, b"healed") == b"healed"
        for s in (c, c2, c4):
            s.close()


def test_stop_frees_the_port_at_once(echo: int) -> None:
    proxy = NetFault(("127.0.0.1", echo)).start()
    port = proxy.port
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    proxy.stop()
    NetFault(("127.0.0.1", echo), port=port).start().stop()  # the same port binds again


def test_stall_client_lets_a_prefix_through_then_holds_the_rest(echo: int) -> None:
    with NetFault(("127.0.0.1", echo)) as proxy:
        c = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        assert _roundtrip(c, b"before") == b"before"
        proxy.stall_client_after(4)
        c.sendall(b"abcdefgh")
        assert c.recv(10) == b"abcd"  # the prefix reached the server (echoed back: that way flows)
        c.settimeout(0.5)
        with pytest.raises(socket.timeout):
            c.recv(10)
        proxy.heal()  # the rest follows, in order
        c.settimeout(5)
        got = b""
        while len(got) < 4:
            got += c.recv(10)
        assert got == b"efgh"
        assert _roundtrip(c, b"after") == b"after"
        c.close()
