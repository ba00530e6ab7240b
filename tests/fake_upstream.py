"""A small fake OpenAI-compatible streaming upstream for the gateway tests and benchmark.

Records every connection, request (path, headers, parsed JSON body) and every client abort seen
mid-stream. Per-request behaviour comes from headers the test sets (the gateway passes them on):

  X-Fake-Chunks: N          chunks to stream (default 3)
  X-Fake-Interval-Ms: ms    pause between chunks (default 0)
  X-Fake-Ttfb-Ms: ms        pause before the response headers
  X-Fake-First-Chunk-Ms: ms pause after the headers, before the first chunk (vLLM sends its headers
                            at once and the first token after queueing and prefill)
  X-Fake-Gap-After: i       after chunk i, pause X-Fake-Gap-Ms instead of the interval
  X-Fake-Gap-Ms: ms
  X-Fake-Fail: close-before-response | close-after-first-chunk | reset-after-first-chunk
                            (a crash: FIN, or RST as a killed process with unread data sends)
  X-Fake-Hold: 1            stream one chunk then hold until released (see `release`)
  X-Fake-Body-Pieces: N     a non-streamed answer's body written in N pieces, X-Fake-Interval-Ms apart (an
                            upstream whose whole answer takes longer than its headers: the server timeout is idle time)

Threads, plain sockets, bounded waits: nothing here sleeps longer than the request asked.
"""

from __future__ import annotations

import json
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_HOLD_S = 30.0  # a held stream never outlives this, even if a test forgets to release it


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict | None
    received_at: float
    request_id: str | None  # the client's (X-Client-Request-Id from the gateway, else X-Request-Id)
    aborted_at: float | None = None
    engine_request_id: str | None = None  # X-Request-Id as received: the id vLLM knows the request by
    completed: bool = False


@dataclass
class UpstreamLog:
    name: str
    connections: int = 0
    requests: list[Recorded] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    running_ids: set[str] = field(default_factory=set)  # engine request ids in flight
    refused_ids: list[str] = field(default_factory=list)  # refused as already running

    def completions(self) -> list[Recorded]:
        with self.lock:
            return [r for r in self.requests if r.path != "/health"]

    def aborts(self) -> list[Recorded]:
        return [r for r in self.completions() if r.aborted_at is not None]


def _client_id(headers) -> str | None:
    return headers.get("X-Client-Request-Id") or headers.get("X-Request-Id")


def _chunk(payload: dict) -> bytes:
    data = f"data: {json.dumps(payload)}\n\n".encode()
    return b"%x\r\n%s\r\n" % (len(data), data)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "FakeUpstream._Server"

    def log_message(self, format, *args):  # keep test output quiet
        pass

    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        log = self.server.owner.log
        with log.lock:
            log.connections += 1

    def do_GET(self):
        if self.path == "/health":
            self._send_json(200, {"status": "ok"})
            return
        if self.path == "/v1/models":  # as vLLM's OpenAI server lists its served model
            owner = self.server.owner
            with owner.log.lock:
                owner.log.requests.append(Recorded(
                    path=self.path, headers={k.lower(): v for k, v in self.headers.items()}, body=None,
                    received_at=time.monotonic(), request_id=_client_id(self.headers),
                    engine_request_id=self.headers.get("X-Request-Id")))
            self._send_json(200, {"object": "list", "data": [{"id": "m", "object": "model"}]})
            return
        self._send_json(404, {"error": "not found"})

    def _read_chunked(self) -> bytes:
        """A chunked request body (RFC 9112 §7.1), as the engines' HTTP servers (uvicorn/h11) accept it."""
        out = b""
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return out
            out += self.rfile.read(size)
            self.rfile.readline()

    def do_POST(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            raw = self._read_chunked()  # HAProxy 3.0's Lua HTTP client (the shadow mirror) sends bodies chunked
        else:
            length = int(self.headers.get("Content-Length", "0"))
            raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = {"_unparsable": raw.decode(errors="replace")}
        rec = Recorded(
            path=self.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
            received_at=time.monotonic(),
            request_id=_client_id(self.headers),
            engine_request_id=self.headers.get("X-Request-Id"),
        )
        owner = self.server.owner
        rid = rec.engine_request_id
        with owner.log.lock:
            owner.log.requests.append(rec)
            # vLLM takes X-Request-Id as the request's id and refuses a second while the first runs (0.11.0
            # serving_engine._base_request_id, v1/engine/output_processor.py "already running"; a 400)
            duplicate = rid is not None and rid in owner.log.running_ids
            if duplicate:
                owner.log.refused_ids.append(rid)
            elif rid is not None:
                owner.log.running_ids.add(rid)
        if duplicate:
            self._send_json(400, {"object": "error", "message": f"Request id chatcmpl-{rid} already running.",
                                  "type": "BadRequestError", "code": 400})
            return
        try:
            self._answer(rec, body)
        finally:
            if rid is not None:
                with owner.log.lock:
                    owner.log.running_ids.discard(rid)

    def _answer(self, rec: Recorded, body) -> None:
        owner = self.server.owner
        h = self.headers
        fail = h.get("X-Fake-Fail", "")
        if fail == "close-before-response":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        time.sleep(int(h.get("X-Fake-Ttfb-Ms", "0")) / 1000)
        stream = isinstance(body, dict) and body.get("stream") is True
        if not stream:
            answer = {"object": "chat.completion", "upstream": owner.log.name,
                      "choices": [{"message": {"role": "assistant", "content": "ok"}}]}
            pieces = int(h.get("X-Fake-Body-Pieces", "1"))
            if pieces <= 1:
                self._send_json(200, answer)
            elif self._send_json_in_pieces(rec, answer, pieces, int(h.get("X-Fake-Interval-Ms", "0")) / 1000):
                return
            rec.completed = True
            return
        chunks = int(h.get("X-Fake-Chunks", "3"))
        interval_s = int(h.get("X-Fake-Interval-Ms", "0")) / 1000
        gap_after = int(h.get("X-Fake-Gap-After", "-1"))
        gap_s = int(h.get("X-Fake-Gap-Ms", "0")) / 1000
        hold = h.get("X-Fake-Hold") == "1"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        first_chunk_s = int(h.get("X-Fake-First-Chunk-Ms", "0")) / 1000
        if first_chunk_s and self._wait(rec, None, first_chunk_s):
            return
        try:
            for i in range(chunks):
                self.wfile.write(_chunk({"object": "chat.completion.chunk", "upstream": owner.log.name,
                                         "index": i, "sent_at": time.time(),
                                         "choices": [{"delta": {"content": f"tok{i} "}}]}))
                self.wfile.flush()
                if fail == "close-after-first-chunk":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if fail == "reset-after-first-chunk":
                    self.close_connection = True
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                    return
                if hold and i == 0:
                    self._wait(rec, owner.release_event, MAX_HOLD_S)
                    if rec.aborted_at is not None:
                        return
                pause = gap_s if i == gap_after else interval_s
                if pause and self._wait(rec, None, pause):
                    return
            self.wfile.write(b"%x\r\n%s\r\n" % (len(b"data: [DONE]\n\n"), b"data: [DONE]\n\n"))
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            rec.completed = True
        except (BrokenPipeError, ConnectionResetError):
            rec.aborted_at = rec.aborted_at or time.monotonic()
            self.close_connection = True

    def _wait(self, rec: Recorded, event: threading.Event | None, timeout_s: float) -> bool:
        """Wait up to timeout_s (or until event); True if the peer closed meanwhile (an abort)."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or (event is not None and event.is_set()):
                return False
            readable, _, _ = select.select([self.connection], [], [], min(left, 0.02))
            if readable:
                try:
                    peek = self.connection.recv(1, socket.MSG_PEEK)
                except OSError:
                    peek = b""
                if peek == b"":
                    rec.aborted_at = time.monotonic()
                    self.close_connection = True
                    return True
                return False  # a pipelined request: not an abort

    def _send_json_in_pieces(self, rec: Recorded, payload: dict, pieces: int, interval_s: float) -> bool:
        """The answer's headers at once, its body in `pieces` writes `interval_s` apart; True if the peer left."""
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.flush()
        step = -(-len(data) // pieces)
        try:
            for i in range(0, len(data), step):
                if i and self._wait(rec, None, interval_s):
                    return True
                self.wfile.write(data[i:i + step])
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            rec.aborted_at = rec.aborted_at or time.monotonic()
            self.close_connection = True
            return True
        return False

    def _send_json(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class FakeUpstream:
    """Start with `FakeUpstream(name).start()`, stop with `.stop()` (fixtures do both)."""

    class _Server(ThreadingHTTPServer):
        daemon_threads = True
        allow_reuse_address = True
        request_queue_size = 512
        owner: "FakeUpstream"

        def handle_error(self, request, client_address):
            # the gateway closing an idle keep-alive connection is normal, not worth a traceback
            import sys

            if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
                super().handle_error(request, client_address)

    def __init__(self, name: str, host: str = "127.0.0.1", port: int = 0, tls=None):
        """tls: an ssl.SSLContext (server side) to serve HTTPS, e.g. a stand-in for Modal's endpoint."""
        self.log = UpstreamLog(name)
        self.release_event = threading.Event()
        self._server = self._Server((host, port), _Handler)
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self._server.owner = self
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host}:{port}"

    def start(self) -> "FakeUpstream":
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def release(self) -> None:
        self.release_event.set()

    def stop(self) -> None:
        self.release_event.set()
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
