"""The relay's HTTP server (``/metrics``, ``/healthz``, ``/readyz``): bounded whatever its clients do.

Why not the stdlib's threading WSGI server: it starts a thread per connection and reads requests
without a timeout, so every idle or half-sent connection (or an HTTP/0.9 request, whose headers
never end) holds a thread forever, and its listen backlog of 5 drops bursts of concurrent scrapes.

Here one thread owns a selector: it accepts connections (listen backlog :data:`BACKLOG`) and reads
each request head without blocking. A head not complete within :data:`HEAD_TIMEOUT` gets ``408``
and its connection is closed; beyond :data:`MAX_WAITING` connections waiting for their head the
oldest is dropped, so idle connections cannot starve a scrape. Only a complete head goes to one
of :data:`WORKERS` handler threads, which run the WSGI app through wsgiref's request handler,
answer HTTP/1.0 and close the connection.

Invariants: 1 + :data:`WORKERS` threads however many clients connect, all daemons (a slow client
never delays the process's exit); :meth:`BoundedWSGIServer.shutdown` returns once the selector
thread has ended, with every socket closed.
"""

from __future__ import annotations

import io
import logging
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler

log = logging.getLogger(__name__)

#: Pending connections the kernel queues before the selector thread accepts them.
BACKLOG = 128
#: Threads that run requests (the selector thread is one more).
WORKERS = 4
#: Seconds a client has to send its request line and headers.
HEAD_TIMEOUT = 5.0
#: Seconds a send to a client may block (a client that stops reading its response).
SEND_TIMEOUT = 10.0
#: Bytes of request line and headers accepted (``431`` beyond).
MAX_HEAD = 16 * 1024
#: Connections waiting for their request head, or for a worker, at most.
MAX_WAITING = 256

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class _Conn:
    __slots__ = ("addr", "deadline", "head", "sock")

    def __init__(self, sock: socket.socket, addr: Any, deadline: float) -> None:
        self.sock, self.addr, self.deadline, self.head = sock, addr, deadline, b""


class _Handler(WSGIRequestHandler):
    """wsgiref's request handler on a head the selector already read (no request body is used)."""

    def __init__(self, conn: _Conn, server: BoundedWSGIServer) -> None:
        self._head = conn.head
        # wsgiref's handler types its server as a socketserver.BaseServer; ours selects its own sockets
        # and has what the handler reads of one (base_environ, get_app: see BoundedWSGIServer).
        super().__init__(conn.sock, conn.addr, server)  # type: ignore[arg-type]

    def setup(self) -> None:
        self.connection = self.request
        self.rfile = io.BytesIO(self._head)
        self.wfile = self.connection.makefile("wb")

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http: " + format, *args)


class BoundedWSGIServer:
    """Serves ``app`` on ``addr:port`` (port 0: any free one) once :meth:`serve_forever` runs."""

    def __init__(self, addr: str, port: int, app: WsgiApp, name: str, head_timeout: float = HEAD_TIMEOUT) -> None:
        family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        self._listener = socket.create_server((addr, port), family=family, backlog=BACKLOG)
        self._listener.setblocking(False)
        self.server_address = self._listener.getsockname()
        self.server_port: int = self.server_address[1]
        self.base_environ = {
            "SERVER_NAME": addr,
            "GATEWAY_INTERFACE": "CGI/1.1",
            "SERVER_PORT": str(self.server_port),
            "REMOTE_HOST": "",
            "CONTENT_LENGTH": "",
            "SCRIPT_NAME": "",
        }
        self._app, self._head_timeout = app, head_timeout
        self._waiting: dict[socket.socket, _Conn] = {}  # insertion order = deadline order
        self._ready: queue.Queue[_Conn | None] = queue.Queue(MAX_WAITING)
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._closing = threading.Event()
        self._ended = threading.Event()
        self.on_close: list[Callable[[], None]] = []
        self._workers = [
            threading.Thread(target=self._work, name=f"harvest-http-{name}-{i}", daemon=True) for i in range(WORKERS)
        ]
        for worker in self._workers:
            worker.start()

    def get_app(self) -> WsgiApp:
        return self._app

    # ------------------------------------------------------------------ selector thread
    def serve_forever(self) -> None:
        sel = self._selector
        sel.register(self._listener, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self._closing.is_set():
                for key, _events in sel.select(self._head_timeout / 4):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is not self._wake_r:
                        self._read(key.data)
                self._expire(time.monotonic())
        finally:
            for conn in list(self._waiting.values()):
                self._drop(conn)
            sel.close()
            self._listener.close()
            self._ended.set()

    def _accept(self) -> None:
        while True:
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of file descriptors: keep serving the others
                log.warning("http: accept failed: %s", exc)
                return
            sock.setblocking(False)
            if len(self._waiting) >= MAX_WAITING:
                self._drop(next(iter(self._waiting.values())))  # the longest idle one
            conn = self._waiting[sock] = _Conn(sock, addr, time.monotonic() + self._head_timeout)
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client went away
            self._drop(conn)
            return
        conn.head += data
        if b"\r\n\r\n" in conn.head or b"\n\n" in conn.head:
            self._unwatch(conn)
            try:
                self._ready.put_nowait(conn)
            except queue.Full:
                self._reply_and_drop(conn, "503 Service Unavailable", "too many requests at once; retry")
        elif len(conn.head) > MAX_HEAD:
            self._unwatch(conn)
            self._reply_and_drop(
                conn, "431 Request Header Fields Too Large", f"request line and headers exceed {MAX_HEAD} bytes"
            )

    def _expire(self, now: float) -> None:
        while self._waiting:
            conn = next(iter(self._waiting.values()))
            if conn.deadline > now:
                return
            self._unwatch(conn)
            self._reply_and_drop(
                conn, "408 Request Timeout", f"no complete request line and headers within {self._head_timeout:g}s"
            )

    def _unwatch(self, conn: _Conn) -> None:
        del self._waiting[conn.sock]
        self._selector.unregister(conn.sock)

    def _drop(self, conn: _Conn) -> None:
        if self._waiting.get(conn.sock) is conn:
            self._unwatch(conn)
        conn.sock.close()

    @staticmethod
    def _reply_and_drop(conn: _Conn, status: str, why: str) -> None:
        body = (why + "\n").encode()
        try:  # best effort on a non-blocking socket: a client that does not read gets nothing
            conn.sock.send(
                f"HTTP/1.0 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
                f"Connection: close\r\n\r\n".encode()
                + body
            )
        except OSError:
            pass
        conn.sock.close()

    # ------------------------------------------------------------------ workers
    def _work(self) -> None:
        while (conn := self._ready.get()) is not None:
            sock = conn.sock
            try:
                sock.setblocking(True)
                sock.settimeout(SEND_TIMEOUT)
                _Handler(conn, self)
                sock.shutdown(socket.SHUT_WR)
                _drain(sock)
            except OSError as exc:  # the client went away or stopped reading
                log.debug("http: %s: %s", conn.addr, exc)
            except Exception:  # a bug in a handler must not cost the endpoint a worker
                log.exception("http: request from %s failed", conn.addr)
            finally:
                sock.close()

    # ------------------------------------------------------------------ lifecycle
    def shutdown(self) -> None:
        """Stop serving: closes the listening socket and every connection, then runs ``on_close``."""
        self._closing.set()
        self._wake_w.send(b"x")
        self._ended.wait(10)
        for _ in self._workers:
            try:
                self._ready.put_nowait(None)
            except queue.Full:  # the workers are daemons: they end with the process
                break
        self._wake_r.close()
        self._wake_w.close()
        for hook in self.on_close:
            hook()


def _drain(sock: socket.socket) -> None:
    """Read what the client already sent past its head (a body nobody wanted) without waiting: closing
    a socket with unread input resets the connection, and the client could lose the response."""
    sock.setblocking(False)
    try:
        for _ in range(16):
            if not sock.recv(4096):
                return
    except OSError:
        pass
