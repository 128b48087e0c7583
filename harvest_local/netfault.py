"""A TCP proxy on loopback that tests put between a relay and Postgres or Kafka, and break on command.

    proxy = NetFault(("127.0.0.1", 5432)).start()      # listens on proxy.port
    proxy.blackhole()   # connections stay open, nothing gets through (held, as TCP retransmits would)
    proxy.reset()       # every connection is closed with a RST; new ones are reset as they arrive
    proxy.latency(200)  # +200 ms each way, order kept
    proxy.stall_client_after(1000)  # the client's next 1000 bytes get through, then its bytes wait
    proxy.heal()        # back to pass-through (held bytes go through, as after a healed partition)

Modes (one at a time, switched at any moment, affecting open and new connections):

- ``pass``: bytes are forwarded as they come;
- ``blackhole``: nothing is forwarded either way and new connections get no answer, but no
  connection is closed — what a silently dropping firewall or a partitioned link looks like to
  the client (its writes are accepted by the local TCP stack, its reads never return). Bytes sent
  meanwhile are held and delivered on :meth:`heal`, as TCP retransmission would once the path is
  back, so a connection that survives the outage is intact;
- ``reset``: every open connection is aborted with a TCP RST (``SO_LINGER`` 0) on both sides, and
  new connections are reset as soon as they are accepted, until the mode changes;
- ``latency``: each chunk is delivered ``ms`` milliseconds after it was read, in order;
- ``stall_client``: the server's bytes flow, but of the client's only the next ``n`` bytes (over
  all connections) reach the server; the rest wait for :meth:`heal`. This is what the server sees
  of a client frozen (SIGSTOP, a VM pause) half way through writing a request.

Invariants: bytes are never reordered, duplicated or altered; in ``pass`` mode the proxy adds no
delay beyond a thread hand-off. Each connection uses four daemon threads (a reader and a writer
per direction); the proxy is meant for tests with a handful of connections.
"""

from __future__ import annotations

import logging
import queue
import socket
import struct
import threading
import time

log = logging.getLogger(__name__)

MODES = ("pass", "blackhole", "reset", "latency", "stall_client")
_CHUNK = 65536


def _abort(sock: socket.socket) -> None:
    """Close with a RST rather than a FIN."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        # Wakes a thread blocked in recv() on it (closing the fd alone would not, and the socket
        # would live on until that recv returned); SHUT_RD sends nothing to the peer.
        sock.shutdown(socket.SHUT_RD)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class _Link:
    """One proxied connection: client <-> upstream, two directions."""

    def __init__(self, proxy: NetFault, client: socket.socket, upstream: socket.socket) -> None:
        self.proxy, self.client, self.upstream = proxy, client, upstream
        self.closed = threading.Event()
        for src, dst, name in ((client, upstream, "up"), (upstream, client, "down")):
            q: queue.Queue[tuple[float, bytes] | None] = queue.Queue()
            threading.Thread(target=self._read, args=(src, q), name=f"netfault-{name}-r", daemon=True).start()
            threading.Thread(
                target=self._write, args=(dst, q, name == "up"), name=f"netfault-{name}-w", daemon=True
            ).start()

    def _read(self, src: socket.socket, q: queue.Queue[tuple[float, bytes] | None]) -> None:
        try:
            while not self.closed.is_set():
                data = src.recv(_CHUNK)
                if not data:
                    break
                q.put((time.monotonic() + self.proxy.delay, data))
        except OSError:
            pass
        q.put(None)

    def _write(self, dst: socket.socket, q: queue.Queue[tuple[float, bytes] | None], from_client: bool) -> None:
        try:
            while True:
                item = q.get()
                if item is None:
                    break
                due, data = item
                # blackhole: hold the bytes (and everything after them) until healed
                self.proxy.flowing.wait()
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                self.proxy.flowing.wait()
                if from_client:
                    data = self.proxy.pass_client_bytes(data, dst)
                if self.closed.is_set():
                    return
                dst.sendall(data)
        except OSError:
            pass
        self.close()

    def close(self, rst: bool = False) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.upstream):
            if rst:
                _abort(sock)
            else:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                try:
                    sock.close()
                except OSError:
                    pass
        self.proxy._forget(self)


class NetFault:
    """A controllable TCP proxy to ``target`` (host, port), listening on 127.0.0.1:``port`` (0 = any)."""

    def __init__(self, target: tuple[str, int], port: int = 0, name: str = "netfault") -> None:
        self.target, self.name = target, name
        self._listen = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listen.bind(("127.0.0.1", port))
        self.port = self._listen.getsockname()[1]
        self.mode = "pass"
        self.delay = 0.0
        self._client_budget: int | None = None  # stall_client: client bytes still let through
        self._budget_cv = threading.Condition()
        self.flowing = threading.Event()
        self.flowing.set()
        self._links: set[_Link] = set()
        self._held: list[socket.socket] = []  # accepted during a blackhole, not yet connected upstream
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self.connections = 0  # accepted so far (for tests)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> NetFault:
        self._listen.listen(128)
        threading.Thread(target=self._accept, name=f"{self.name}-accept", daemon=True).start()
        return self

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listen.accept()
            except OSError:
                return
            self.connections += 1
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.mode == "reset":
                _abort(client)
                continue
            if self.mode == "blackhole":
                with self._lock:
                    self._held.append(client)
                continue
            self._connect(client)

    def _connect(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=5)
            upstream.settimeout(None)
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            log.debug("%s: upstream %s:%d refused: %s", self.name, *self.target, exc)
            _abort(client)
            return
        link = _Link(self, client, upstream)
        with self._lock:
            self._links.add(link)

    def _forget(self, link: _Link) -> None:
        with self._lock:
            self._links.discard(link)

    def pass_client_bytes(self, data: bytes, dst: socket.socket) -> bytes:
        """In ``stall_client`` mode: send what the budget allows of ``data`` to ``dst``, wait for the
        mode to end, and return the rest (to be sent then); otherwise ``data`` unchanged."""
        with self._budget_cv:
            if self._client_budget is None:
                return data
            now, data = data[: self._client_budget], data[self._client_budget :]
            self._client_budget -= len(now)
        if now:
            dst.sendall(now)
        with self._budget_cv:
            while data and self._client_budget is not None and not self._stopped.is_set():
                self._budget_cv.wait(0.1)
        return data

    # ---------------------------------------------------------------- control
    def _set(self, mode: str, delay: float = 0.0, budget: int | None = None) -> None:
        assert mode in MODES, mode
        log.info(
            "%s (%s -> %s:%d): %s%s",
            self.name,
            self.address,
            *self.target,
            mode,
            f" {delay * 1000:.0f}ms" if delay else "",
        )
        self.mode, self.delay = mode, delay
        with self._budget_cv:
            self._client_budget = budget
            self._budget_cv.notify_all()
        if mode == "blackhole":
            self.flowing.clear()
            return
        self.flowing.set()
        with self._lock:
            held, self._held = self._held, []
            links = list(self._links) if mode == "reset" else []
        for client in held:
            if mode == "reset":
                _abort(client)
            else:
                self._connect(client)
        for link in links:
            link.close(rst=True)

    def heal(self) -> None:
        self._set("pass")

    def blackhole(self) -> None:
        self._set("blackhole")

    def reset(self) -> None:
        self._set("reset")

    def latency(self, ms: float) -> None:
        self._set("latency", ms / 1000.0)

    def stall_client_after(self, nbytes: int) -> None:
        """Let the clients' next ``nbytes`` through, then hold their bytes until :meth:`heal`."""
        self._set("stall_client", budget=nbytes)

    def stop(self) -> None:
        self._stopped.set()
        self.flowing.set()
        try:  # wakes the accept() thread: closing alone would leave the port bound until it returned
            self._listen.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._listen.close()
        except OSError:
            pass
        with self._lock:
            links, held = list(self._links), list(self._held)
        for link in links:
            link.close()
        for client in held:
            _abort(client)

    def __enter__(self) -> NetFault:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
