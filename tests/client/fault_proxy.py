"""A small HTTP/1.1-aware TCP proxy that cuts connections and kills the
kiosk process at chosen points of a request's life.

It forwards each request of a client connection to the service over a
connection of its own, and asks ``decide(request)`` what to do with it:

- ``pass``: forward the request and the answer;
- ``cut_request``: forward the head and part of the body, then close both
  sides (the service never sees a whole request);
- ``cut_response``: forward the request, then part of the answer, then
  close both sides (the service has done the work; the client lost it);
- ``kill_before_send``: kill the kiosk before the request is forwarded;
- ``kill_after_send``: forward the request, then kill the kiosk before any
  answer comes back (``wait_answer``: only once the service has answered,
  otherwise at once);
- ``kill_during_wait``: forward a long poll, and kill the kiosk if no
  answer came within ``after_ms`` (otherwise the answer is forwarded and
  the action did not fire);
- ``kill_after_answer``: read the whole answer from the service and kill
  the kiosk instead of forwarding it, if ``answer_matches`` holds for it;
- ``answer``: answer ``status`` with a problem body of ``code`` itself
  (or ``problem``, as given, when set; and ``Retry-After: retry_after`` when
  set), forwarding nothing.

``down`` (an attribute, false at first) is the venue's network gone: while
it is true every new connection is closed at once, before a byte is read.

``fired`` lists the actions that happened: ``(request number, method,
path, action kind)``.
"""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple


@dataclass
class Request:
    number: int
    method: str
    path: str
    head: bytes
    body: bytes


@dataclass
class Action:
    kind: str = "pass"
    cut_at: float = 0.5  # the share of the bytes forwarded before a cut
    after_ms: int = 0
    wait_answer: bool = False
    answer_matches: Callable[[bytes], bool] = field(default=lambda _answer: True)
    status: int = 503
    code: str = "unavailable"
    retry_after: Optional[int] = None
    problem: Optional[Dict[str, Any]] = None


PASS = Action()


class FaultProxy:
    def __init__(
        self,
        upstream: Tuple[str, int],
        decide: Callable[[Request], Action],
        kill: Optional[Callable[[], None]] = None,
    ) -> None:
        self.upstream = upstream
        self.decide = decide
        self.kill = kill
        self.fired: List[Tuple[int, str, str, str]] = []
        self.requests = 0
        self.down = False
        self.refused = 0  # connections closed while down
        self._lock = threading.Lock()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._closed = False
        self._connections: List[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closed = True
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            _close(connection)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.down:
                with self._lock:
                    self.refused += 1
                _close(client)
                continue
            with self._lock:
                self._connections.append(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _fire(self, request: Request, kind: str) -> None:
        with self._lock:
            self.fired.append((request.number, request.method, request.path, kind))
        if kind.startswith("kill") and self.kill is not None:
            self.kill()

    def _serve(self, client: socket.socket) -> None:
        upstream: Optional[socket.socket] = None
        reader = _Reader(client)
        try:
            while True:
                parsed = _read_message(reader, is_request=True)
                if parsed is None:
                    return
                head, body = parsed
                method, path = head.split(b" ", 2)[:2]
                with self._lock:
                    number = self.requests
                    self.requests += 1
                request = Request(number, method.decode(), path.decode(), head, body)
                action = self.decide(request)
                whole = head + body
                if action.kind == "kill_before_send":
                    self._fire(request, action.kind)
                    return
                if action.kind == "answer":
                    # Recorded before it is sent: the client may act on the
                    # answer (and a test read `fired`) before this thread
                    # runs again.
                    self._fire(request, f"answer {action.status}")
                    client.sendall(_problem(action))
                    continue
                if upstream is None:
                    upstream = socket.create_connection(self.upstream)
                    with self._lock:
                        self._connections.append(upstream)
                    upstream_reader = _Reader(upstream)
                if action.kind == "cut_request":
                    upstream.sendall(whole[: max(1, int(len(whole) * action.cut_at))])
                    self._fire(request, action.kind)
                    return
                upstream.sendall(whole)
                if action.kind == "kill_after_send":
                    if action.wait_answer:
                        _read_message(upstream_reader, is_request=False)
                    self._fire(request, action.kind)
                    return
                if action.kind == "kill_during_wait":
                    upstream.settimeout(action.after_ms / 1000.0)
                    try:
                        upstream_reader.peek()
                    except socket.timeout:
                        self._fire(request, action.kind)
                        return
                    upstream.settimeout(None)
                answer = _read_message(upstream_reader, is_request=False)
                if answer is None:
                    return
                answer_bytes = answer[0] + answer[1]
                if action.kind == "kill_after_answer" and action.answer_matches(answer_bytes):
                    self._fire(request, action.kind)
                    return
                if action.kind == "cut_response":
                    client.sendall(answer_bytes[: max(1, int(len(answer_bytes) * action.cut_at))])
                    self._fire(request, action.kind)
                    return
                client.sendall(answer_bytes)
        except OSError:
            return
        finally:
            _close(client)
            if upstream is not None:
                _close(upstream)


class _Reader:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def peek(self) -> None:
        """Blocks until at least one byte is buffered (or the peer closed)."""
        if not self.buffer:
            self.buffer += self.sock.recv(65536)

    def fill(self) -> bool:
        chunk = self.sock.recv(65536)
        if not chunk:
            return False
        self.buffer += chunk
        return True

    def take(self, count: int) -> bytes:
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data


def _read_message(reader: _Reader, *, is_request: bool) -> Optional[Tuple[bytes, bytes]]:
    """One HTTP/1.1 message: (head with its blank line, body)."""
    while b"\r\n\r\n" not in reader.buffer:
        if not reader.fill():
            return None
    head = reader.take(reader.buffer.index(b"\r\n\r\n") + 4)
    headers = {}
    for line in head.split(b"\r\n")[1:]:
        if b":" in line:
            name, value = line.split(b":", 1)
            headers[name.strip().lower()] = value.strip()
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        body = b""
        while True:
            while b"\r\n" not in reader.buffer:
                if not reader.fill():
                    return None
            size_line = reader.take(reader.buffer.index(b"\r\n") + 2)
            size = int(size_line.split(b";")[0].strip(), 16)
            while len(reader.buffer) < size + 2:
                if not reader.fill():
                    return None
            body += size_line + reader.take(size + 2)
            if size == 0:
                return head, body
    length = int(headers.get(b"content-length", b"0"))
    if not is_request and head.split(b" ", 2)[1] in (b"204", b"304"):
        length = 0
    while len(reader.buffer) < length:
        if not reader.fill():
            return None
    return head, reader.take(length)


def _problem(action: Action) -> bytes:
    problem = action.problem
    if problem is None:
        problem = {"type": f"urn:token-billing:problem:{action.code}", "title": action.code,
                   "status": action.status, "detail": "injected by the test's proxy",
                   "code": action.code}
    body = json.dumps(problem).encode()
    head = f"HTTP/1.1 {action.status} Injected\r\nContent-Type: application/problem+json\r\n"
    if action.retry_after is not None:
        head += f"Retry-After: {action.retry_after}\r\n"
    head += f"Content-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
