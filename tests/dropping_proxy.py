"""A TCP proxy in front of an HTTP/1.1 server that can lose an answer on the way back.

Each client connection gets one to the server; requests are relayed whole, one at a time,
and so are the answers, except the first answer to a request ``drop_once`` names: the proxy
reads it whole from the server (so the server finished the request: a commit is applied)
and then closes the client's connection without sending a byte of it. The client sees what
a pooled connection closed under it shows: no answer at all (Apache HttpClient's
``NoHttpResponseException``, urllib3's ``RemoteDisconnected``). Every request and answer is
recorded for the test to look at.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from support.ports import free_port


@dataclass(frozen=True)
class Exchange:
    """One request relayed, and the server's answer (``dropped``: never relayed)."""

    method: str
    path: str
    headers: dict[str, str]  # lower-case names (a name sent twice: the last)
    raw: bytes  # the request as sent, head and body
    status: int
    answer_headers: dict[str, str]
    answer_body: bytes
    dropped: bool

    @property
    def body(self) -> bytes:
        return self.raw.split(b"\r\n\r\n", 1)[1]


Rule = Callable[[str, str], bool]  # (method, path) -> drop this answer?


class DroppingProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.exchanges: list[Exchange] = []
        self._rules: list[Rule] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._closed = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def drop_once(self, rule: Rule) -> None:
        """Lose the answer to the next request ``rule`` picks (once)."""
        with self._lock:
            self._rules.append(rule)

    def seen(self, method: str, path: str) -> list[Exchange]:
        with self._lock:
            return [e for e in self.exchanges if e.method == method and e.path == path]

    def serve(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def _take_rule(self, method: str, path: str) -> bool:
        with self._lock:
            for rule in self._rules:
                if rule(method, path):
                    self._rules.remove(rule)
                    return True
        return False

    def _relay(self, client: socket.socket) -> None:
        server = socket.create_connection(("127.0.0.1", self.target_port))
        inbound, outbound = _Reader(client), _Reader(server)
        try:
            while True:
                head = inbound.head()
                if head is None:
                    return
                request_line, headers = _parse_head(head)
                method, path = request_line.split(" ")[:2]
                raw = head + inbound.body(headers)
                server.sendall(raw)
                answer_head = outbound.head()
                if answer_head is None:
                    return
                status_line, answer_headers = _parse_head(answer_head)
                status = int(status_line.split(" ")[1])
                no_body = method == "HEAD" or status in (204, 304) or status < 200
                answer_body = b"" if no_body else outbound.body(answer_headers)
                drop = self._take_rule(method, path)
                exchange = Exchange(
                    method, path, headers, raw, status, answer_headers, answer_body, drop
                )
                with self._lock:
                    self.exchanges.append(exchange)
                if drop:
                    return  # closed below: the client gets no byte of the answer
                client.sendall(answer_head + answer_body)
                if answer_headers.get("connection", "").lower() == "close":
                    return
        except OSError:
            return
        finally:
            server.close()
            client.close()


class _Reader:
    """Reads whole HTTP messages off a socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def _more(self) -> bool:
        chunk = self.sock.recv(65536)
        self.buffer += chunk
        return bool(chunk)

    def head(self) -> bytes | None:
        while b"\r\n\r\n" not in self.buffer:
            if not self._more():
                return None
        end = self.buffer.index(b"\r\n\r\n") + 4
        head, self.buffer = self.buffer[:end], self.buffer[end:]
        return head

    def exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            if not self._more():
                raise ConnectionError("the peer closed mid-message")
        taken, self.buffer = self.buffer[:size], self.buffer[size:]
        return taken

    def line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            if not self._more():
                raise ConnectionError("the peer closed mid-message")
        end = self.buffer.index(b"\r\n") + 2
        taken, self.buffer = self.buffer[:end], self.buffer[end:]
        return taken

    def body(self, headers: dict[str, str]) -> bytes:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            raw = b""
            while True:
                size_line = self.line()
                raw += size_line
                size = int(size_line.split(b";")[0], 16)
                raw += self.exactly(size + 2)
                if size == 0:
                    return raw
        return self.exactly(int(headers.get("content-length", "0")))


def _parse_head(head: bytes) -> tuple[str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return lines[0], headers


@contextmanager
def dropping_proxy(target_url: str) -> Iterator[DroppingProxy]:
    """A proxy to the server at ``target_url`` (``http://127.0.0.1:PORT``), in a thread."""
    proxy = DroppingProxy(int(target_url.rsplit(":", 1)[1].split("/")[0]))
    thread = threading.Thread(target=proxy.serve, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.close()
        thread.join(5)
