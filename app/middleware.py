"""Pure ASGI middleware: request ids with a last-resort 500 (a client gone is one line) and the access log,
a streaming body-size limit, the HTTP metrics, and the count of a worker's requests on the workers' board."""

import logging
import re
import time

from fastapi import HTTPException
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.cores import Board, Home
from app.http_protocol import CUT_OFF, REQUEST_ID, new_request_id
from app.metrics import EngineMetrics, HttpMetrics

log = logging.getLogger(__name__)
access = logging.getLogger("app.access")  # a line per answered request (uvicorn's own access log is off)

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
CLIENT_GONE = 499  # nginx's status for a client that closed its connection before the answer
_CLIENT_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


class RequestIdMiddleware:
    """Tags every response with X-Request-ID (the client's, if sane, else a new one), and logs each answered
    request in one line at info level (`app.access`): client, request line, status, milliseconds and id.

    The line is written once the answer's last byte has gone to the client, who never waits for it (uvicorn's
    access log, which the servers turn off, writes its line before the answer's head). An exception nobody
    handled is logged with the id and answered 500 {"detail": "internal error, request id ..."}: the client
    gets the id to quote, never a stack trace. A client that went away before its request was read (or was
    cut off by the read deadline, app/http_protocol.py) is one line at info level: nobody is left to answer.
    """

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        begun = time.perf_counter()
        given = Headers(scope=scope).get(REQUEST_ID, "")
        request_id = given if _CLIENT_ID.fullmatch(given) else new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id
        status = 0  # none sent yet

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message).append(REQUEST_ID, request_id)
            await send(message)
            last = message["type"] == "http.response.body" and not message.get("more_body")
            if last and access.isEnabledFor(logging.INFO):
                access.info(
                    '%s - "%s %s HTTP/%s" %d, %.1f ms, request id %s',
                    client_of(scope),
                    scope["method"],
                    request_line(scope),
                    scope["http_version"],
                    status,
                    1000 * (time.perf_counter() - begun),
                    request_id,
                )

        try:
            await self.app(scope, receive, send_with_id)
        except ClientDisconnect:
            why = "was cut off by the read deadline" if scope["state"].get(CUT_OFF) else "went away"
            path, method = scope["path"], scope["method"]
            log.info("%s %s, request id %s: the client %s before its request was read", method, path, request_id, why)
        except Exception:
            log.exception("unhandled error in %s %s, request id %s", scope["method"], scope["path"], request_id)
            if not status:
                response = JSONResponse({"detail": f"internal error, request id {request_id}"}, 500)
                await response(scope, receive, send_with_id)


def client_of(scope: Scope) -> str:
    """host:port of the request's client, as the server saw it; "-" when unknown."""
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "-"


def request_line(scope: Scope) -> str:
    """The path and query the client asked for, as sent (percent-encoded), control characters escaped so that
    a request cannot write a line of its own into the log."""
    query = scope.get("query_string", b"")
    target = scope.get("raw_path") or scope["path"].encode()
    line = (target + b"?" + query if query else target).decode("latin-1")
    return line if line.isprintable() else line.encode("unicode_escape").decode("ascii")


class BodyLimitMiddleware:
    """Answers 413 to bodies over max_bytes: at once from Content-Length, else while they stream in; and 415 to
    a body in a content coding (Content-Encoding: gzip, ...), which no route decodes (RFC 9110, section 8.4.1).

    Nothing larger than the limit is ever held in memory.
    """

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    def _too_large(self, size: int | None = None) -> str:
        return (
            f"the request body is {size:,} bytes" if size else "the request body is too large"
        ) + f"; the limit is {self.max_bytes:,} bytes"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        coding = headers.get("content-encoding", "").strip().lower() or "identity"
        if coding != "identity":
            detail = f"the body is sent with Content-Encoding {coding[:64]!r}; send it uncompressed"
            return await JSONResponse({"detail": detail}, 415)(scope, receive, send)
        declared = headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            detail = (
                self._too_large(int(declared))
                if declared.isdigit()
                else f"Content-Length {declared!r} is not a number of bytes"
            )
            return await JSONResponse({"detail": detail}, 413 if declared.isdigit() else 400)(scope, receive, send)
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise HTTPException(413, self._too_large())
            return message

        await self.app(scope, limited_receive, send)


class BoardMiddleware:
    """Counts this worker's HTTP requests in flight on the workers' board (app/cores.py), from the moment
    uvicorn hands one over (its head read) until its answer is sent, and as each begins keeps the worker's
    serving threads on its home core while it is alone on the server (Home), on every core otherwise."""

    def __init__(self, app: ASGIApp, board: Board, home: Home):
        self.app, self.board, self.home = app, board, home

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        with self.board.request():
            self.home.settle(self.board.alone())
            await self.app(scope, receive, send)


class HttpMetricsMiddleware:
    """Records each HTTP request that reaches it (all but CORS preflights) in HttpMetrics: the route Starlette
    matched (`scope["route"]`, set as the request is routed; none, as for a 413 on Content-Length: `none`),
    the status of the answer (499 for a client that went away, 500 when an error left none), and the time
    until the app returned. GET /metrics itself is left out. Then, the answer gone, the engines' recordings
    queued meanwhile (EngineMetrics.flush)."""

    def __init__(self, app: ASGIApp, metrics: HttpMetrics, engine_metrics: EngineMetrics):
        self.app, self.metrics, self.engine_metrics = app, metrics, engine_metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        except ClientDisconnect:
            status = CLIENT_GONE
            raise
        finally:
            handler = getattr(scope.get("route"), "path", "none")
            if handler != "/metrics":
                method = scope["method"] if scope["method"] in METHODS else "other"  # a label's values stay few
                self.metrics.requests.labels(method, f"{status // 100}xx", handler).inc()
                self.metrics.duration.labels(method, handler).observe(time.perf_counter() - start)
            self.engine_metrics.flush()
