"""uvicorn's HTTP protocol (httptools) with a read deadline and the server's settings for slow clients.

uvicorn waits for a request's head and body as long as the client takes: a client that sends the headers
of an upload and then stalls holds its connection, and the request's task, for ever. Here a request must
arrive whole, head and body, within `read_deadline_s` of its first byte (a new connection's first request:
of its opening). A client slower than that is answered 408 `{"detail": ...}` and its connection closed;
a request the app already holds sees the client as gone (`http.disconnect`, which app/middleware.py logs
in one line). `uvicorn_options` gives both servers (one process, or uvicorn's workers) this protocol and
the bound on the connections a worker holds (`max_connections`, uvicorn's `limit_concurrency`: beyond it
uvicorn answers 503).
"""

import asyncio
import functools
import logging
import uuid
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.settings import Settings

log = logging.getLogger(__name__)

CUT_OFF = "read_deadline_passed"  # set in a request's scope state when the deadline cut it off
REQUEST_ID = "X-Request-ID"  # the header every answer carries (app/middleware.py's RequestIdMiddleware)


def timeout_response(read_deadline_s: float, request_id: str) -> bytes:
    """The 408 a client too slow to send its request gets, closing the connection."""
    body = orjson.dumps({"detail": f"the request did not arrive whole within {read_deadline_s:g} s of its first byte"})
    head = (
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n{REQUEST_ID}: {request_id}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class ReadDeadlineProtocol(HttpToolsProtocol):
    """HttpToolsProtocol whose requests must arrive whole within read_deadline_s of their first byte.

    Args:
        read_deadline_s: seconds from a request's first byte (a new connection's opening) to its last.
        *args, **kwargs: HttpToolsProtocol's (uvicorn passes config, server_state, app_state).
    """

    def __init__(self, *args: Any, read_deadline_s: float, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.read_deadline_s = read_deadline_s
        self._deadline: asyncio.TimerHandle | None = None
        self._before: object = None  # the connection's request cycle when the deadline was armed

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()  # a connection that never sends a byte is a slow client too

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()  # the first byte of the connection's next request
        super().data_received(data)

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
            request_id = uuid.uuid4().hex
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
            self.transport.write(timeout_response(self.read_deadline_s, state.get("request_id", uuid.uuid4().hex)))
        self.transport.close()

    def _peer(self) -> str:
        return f"{self.client[0]}:{self.client[1]}" if self.client else "a client"


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """uvicorn.Config's options for slow clients, for the connections of one worker and for its log."""
    protocol = functools.partial(ReadDeadlineProtocol, read_deadline_s=settings.read_deadline_s)
    # access_log: the app writes its own line, after the answer (app/middleware.py's RequestIdMiddleware)
    return {"http": protocol, "limit_concurrency": settings.max_connections, "access_log": False}
