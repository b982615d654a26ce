"""uvicorn's HTTP protocol (httptools) with a read deadline and the server's settings for slow clients.

uvicorn waits for a request's head and body as long as the client takes: a client that sends the headers
of an upload and then stalls holds its connection, and the request's task, for ever. Here a request must
arrive whole, head and body, within `read_deadline_s` of its first byte (a new connection's first request:
of its opening). A client slower than that is answered 408 `{"detail": ...}` and its connection closed;
a request the app already holds sees the client as gone (`http.disconnect`, which app/middleware.py logs
in one line). A request's head (its request line and headers) is bounded too, at MAX_HEAD_BYTES: httptools
reads a header of any length, joining its pieces as they come, on the event loop (a header of tens of
megabytes holds it for seconds); a longer head is answered 431 and its connection closed, and a request
httptools cannot parse 400, in JSON as every error is. `uvicorn_options` gives both servers (one process, or
uvicorn's workers) this protocol and the bound on the connections a worker holds (`max_connections`,
uvicorn's `limit_concurrency`: beyond it uvicorn answers 503).
"""

import asyncio
import functools
import logging
import os
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.settings import Settings

log = logging.getLogger(__name__)

CUT_OFF = "read_deadline_passed"  # set in a request's scope state when the deadline cut it off
REQUEST_ID = "X-Request-ID"  # the header every answer carries (app/middleware.py's RequestIdMiddleware)
# The longest head a request may have: twice what nginx takes by default (4 buffers of 8 kB), far
# beyond any browser's or client's; a head is counted from the read after its first byte's, so a worker
# reads at most this and one read (uvloop reads 256,000 bytes at most) of it
MAX_HEAD_BYTES = 64 * 1024
INVALID_HTTP = "Invalid HTTP request received."  # uvicorn's WARNING for what httptools cannot parse


def new_request_id() -> str:
    """An id for a request whose client sent none: 128 random bits as 32 hex digits, as long as a uuid4's hex
    (without its version digits), in a fifth of its time (4 against 20 us with the caches cold)."""
    return os.urandom(16).hex()


class AnsweredParseErrors(logging.Filter):
    """Drops uvicorn's WARNING (`uvicorn.error`) for a request that httptools cannot parse: send_400_response
    writes that one at info level, with the id its answer carries, as a 408 or a 431 is written (a client's
    mistake). For `uvicorn.error`, in each process that serves (app/workers.py's configure_logging)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != INVALID_HTTP


def closing_response(status: str, detail: str, request_id: str) -> bytes:
    """An answer `{"detail": ...}` written by the protocol itself (the app never saw the request), closing the
    connection: status is its line's code and reason, e.g. "408 Request Timeout"."""
    body = orjson.dumps({"detail": detail})
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n{REQUEST_ID}: {request_id}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def timeout_response(read_deadline_s: float, request_id: str) -> bytes:
    """The 408 a client too slow to send its request gets, closing the connection."""
    detail = f"the request did not arrive whole within {read_deadline_s:g} s of its first byte"
    return closing_response("408 Request Timeout", detail, request_id)


class ReadDeadlineProtocol(HttpToolsProtocol):
    """HttpToolsProtocol whose requests must arrive whole within read_deadline_s of their first byte, their
    heads within MAX_HEAD_BYTES.

    Args:
        read_deadline_s: seconds from a request's first byte (a new connection's opening) to its last.
        *args, **kwargs: HttpToolsProtocol's (uvicorn passes config, server_state, app_state).
    """

    def __init__(self, *args: Any, read_deadline_s: float, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.read_deadline_s = read_deadline_s
        self._deadline: asyncio.TimerHandle | None = None
        self._before: object = None  # the connection's request cycle when the deadline was armed
        self._head: int | None = None  # bytes of the head being read (None: none is), from the read after its start
        self._heads = 0  # heads begun on the connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()  # a connection that never sends a byte is a slow client too

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():  # answered and closing (a 431, a 408): nothing more is read
            return
        if self._deadline is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()  # the first byte of the connection's next request
        heads = self._heads
        super().data_received(data)
        head = self._head
        if head is not None and self._heads == heads and not self.transport.is_closing():  # data: all of it head
            self._head = head + len(data)
            if self._head > MAX_HEAD_BYTES:
                self._head_too_long()

    def on_message_begin(self) -> None:
        self._head, self._heads = 0, self._heads + 1
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._head = None
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()  # the whole request is here
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._before = self.cycle
        self._deadline = self.loop.call_later(self.read_deadline_s, self._cut_off)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _cut_off(self) -> None:
        """The deadline passed before the request's last byte: 408 unless an answer has begun, then close."""
        self._deadline = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is None or cycle is self._before:  # its head is not whole: the app has not seen it
            request_id = new_request_id()
            log.info(
                "%s: no whole request within %g s; answered 408, request id %s",
                self._peer(),
                self.read_deadline_s,
                request_id,
            )
            self.transport.write(timeout_response(self.read_deadline_s, request_id))
        elif not cycle.response_started:  # the app waits for its body: it reads the client as gone (and logs it)
            state = cycle.scope["state"]
            state[CUT_OFF] = True
            cycle.disconnected = True
            cycle.message_event.set()
            self.transport.write(timeout_response(self.read_deadline_s, state.get("request_id", new_request_id())))
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """What httptools cannot parse (uvicorn's msg: "Invalid HTTP request received.") is answered as every
        error is, `{"detail": ...}` with a request id, not in uvicorn's plain text; the connection closed."""
        request_id = new_request_id()
        log.info("%s: a request that is not valid HTTP/1.1; answered 400, request id %s", self._peer(), request_id)
        detail = "the request is not valid HTTP/1.1: a malformed request line, header or length"
        self.transport.write(closing_response("400 Bad Request", detail, request_id))
        self.transport.close()

    def _head_too_long(self) -> None:
        """431 to a head over MAX_HEAD_BYTES, and the connection closed: the app never sees the request."""
        request_id = new_request_id()
        log.info(
            "%s: a request's head over %d bytes; answered 431, request id %s", self._peer(), MAX_HEAD_BYTES, request_id
        )
        detail = f"the request's line and headers are over {MAX_HEAD_BYTES:,} bytes; send them shorter"
        self.transport.write(closing_response("431 Request Header Fields Too Large", detail, request_id))
        self._disarm()
        self.transport.close()

    def _peer(self) -> str:
        return f"{self.client[0]}:{self.client[1]}" if self.client else "a client"


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """uvicorn.Config's options for slow clients, for the connections of one worker and for its log."""
    protocol = functools.partial(ReadDeadlineProtocol, read_deadline_s=settings.read_deadline_s)
    # access_log: the app writes its own line, after the answer (app/middleware.py's RequestIdMiddleware)
    return {"http": protocol, "limit_concurrency": settings.max_connections, "access_log": False}
