"""Slow and vanishing clients against a real uvicorn with the service's protocol (app/http_protocol.py): a
request that does not arrive whole within the read deadline is answered 408 and its connection closed,
whether it stalls in its head or its body; a client that goes away is one line in the log, no traceback;
stalled connections leave /predict answering, and a worker holds at most max_connections."""

import contextlib
import json
import logging
import socket
import time

import httpx
import pytest

from app.http_protocol import MAX_HEAD_BYTES, uvicorn_options
from app.main import create_app
from app.settings import Settings
from app.workers import configure_logging
from tests.conftest import serving
from tests.harness import BOUNDARY, digit_png, multipart

DEADLINE_S = 1.0
MAX_CONNECTIONS = 48
UPLOAD = 100_000  # bytes the stalled uploads announce


@pytest.fixture(scope="module")
def slow_api():
    """mnist alone, a 1 s read deadline and a bound of MAX_CONNECTIONS, served as `python -m app` serves."""
    settings = Settings(
        models=["mnist"],
        providers=["CPUExecutionProvider"],
        intra_op_threads=1,
        max_batch=4,
        read_deadline_s=DEADLINE_S,
        max_connections=MAX_CONNECTIONS,
    )
    with serving(create_app(settings), **uvicorn_options(settings)) as url:
        yield url


MULTIPART_UPLOAD = ("/predict?include=", f"multipart/form-data; boundary={BOUNDARY}")
JSON_UPLOAD = ("/reconstruct", "application/json")  # a body the route reads as JSON


def stalled_upload(url: str, body: bytes = b"", to: tuple[str, str] = MULTIPART_UPLOAD) -> socket.socket:
    """A connection that sent the head of a 100 kB upload (to: its target and Content-Type; a multipart one to
    /predict by default) and `body`, then stalls."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    target, content_type = to
    head = f"POST {target} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {UPLOAD}\r\nContent-Type: {content_type}\r\n\r\n"
    sock.sendall(head.encode() + body)
    return sock


def answer_then_close(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    sock.close()
    return b"".join(chunks)


def predict(url: str) -> httpx.Response:
    return httpx.post(f"{url}/predict?include=", files={"file": ("d.png", digit_png(), "image/png")}, timeout=30)


def request_id(reply: bytes) -> str:
    """The X-Request-ID of a raw answer."""
    (line,) = [line for line in reply.split(b"\r\n\r\n")[0].split(b"\r\n") if line.lower().startswith(b"x-request-id:")]
    return line.split(b":", 1)[1].strip().decode()


def test_a_stalled_upload_is_answered_408_and_closed_after_the_deadline(slow_api, caplog):
    """The 408 carries the request id that the app's line about the client cut off names."""
    caplog.set_level(logging.INFO)
    start = time.monotonic()
    sock = stalled_upload(slow_api, multipart(digit_png())[:100])
    reply = answer_then_close(sock)
    waited = time.monotonic() - start
    assert reply.startswith(b"HTTP/1.1 408 ") and b"connection: close" in reply.lower(), reply
    assert b'"detail":"the request did not arrive whole within 1 s of its first byte"' in reply
    assert DEADLINE_S <= waited < DEADLINE_S + 5
    (cut,) = wait_for_records(caplog, lambda r: "cut off by the read deadline" in r.getMessage())
    assert f"request id {request_id(reply)}" in cut.getMessage()


def test_a_head_that_never_ends_and_a_silent_connection_are_cut_too(slow_api):
    host, port = slow_api.removeprefix("http://").split(":")
    partial, silent = (
        socket.create_connection((host, int(port)), timeout=10),
        socket.create_connection((host, int(port)), timeout=10),
    )
    partial.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-")
    replies = [answer_then_close(sock) for sock in (partial, silent)]
    assert all(reply.startswith(b"HTTP/1.1 408 ") for reply in replies)
    assert len({request_id(reply) for reply in replies}) == 2  # one id each


def test_a_head_over_its_bound_is_answered_431_and_closed(slow_api, caplog):
    """A header of a quarter megabyte, sent in pieces as a client streams it: 431 with a sentence and the id of
    the app's one line (info, no traceback), the connection closed; a head of half the bound is answered as
    usual, and so is the next request."""
    caplog.set_level(logging.INFO)
    host, port = slow_api.removeprefix("http://").split(":")

    def health_with_header(size: int) -> bytes:
        sock = socket.create_connection((host, int(port)), timeout=10)
        head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * size + b"\r\n\r\n"
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):  # closed while more was sent
            for start in range(0, len(head), 16384):
                sock.sendall(head[start : start + 16384])
        chunks = []
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                chunks.append(chunk)
                if b"".join(chunks).startswith(b"HTTP/1.1 200 ") and b"}" in chunk:
                    break
        sock.close()
        return b"".join(chunks)

    reply = health_with_header(4 * MAX_HEAD_BYTES)
    assert reply.startswith(b"HTTP/1.1 431 ") and b"connection: close" in reply.lower(), reply[:200]
    assert f"over {MAX_HEAD_BYTES:,} bytes".encode() in reply
    (line,) = wait_for_records(caplog, lambda r: "answered 431" in r.getMessage())
    assert line.levelno == logging.INFO and request_id(reply) in line.getMessage()
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING]
    assert health_with_header(MAX_HEAD_BYTES // 2).startswith(b"HTTP/1.1 200 ")
    assert predict(slow_api).status_code == 200


def test_a_request_that_is_not_http_is_answered_in_json_and_closed(slow_api, caplog):
    """Two Content-Lengths (a request smuggler's trick) cannot be parsed: 400 with a sentence in JSON, as every
    error is, with a request id, and the connection closed; the log has one info line naming that id, not
    uvicorn's WARNING without it."""
    configure_logging(Settings())  # as each serving process does
    caplog.set_level(logging.INFO)
    host, port = slow_api.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab")
    reply = answer_then_close(sock)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ") and b"content-type: application/json" in head.lower(), reply
    assert json.loads(body)["detail"].startswith("the request is not valid HTTP/1.1") and request_id(reply)
    (line,) = wait_for_records(caplog, lambda r: "answered 400" in r.getMessage())
    assert line.levelno == logging.INFO and request_id(reply) in line.getMessage()
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING]


def read_response(sock: socket.socket) -> bytes:
    """One whole response (head and Content-Length body) from a kept-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head


def test_a_kept_alive_connection_gets_a_new_deadline_per_request(slow_api):
    """On one connection: a request answered 200, an idle wait longer than the deadline (the deadline runs
    from a request's first byte, so the idle connection is not cut), then a second request that stalls
    in its head: it is answered 408 within the deadline of its own first byte."""
    host, port = slow_api.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    body = multipart(digit_png())
    head = (
        f"POST /predict?include= HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n"
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    assert read_response(sock).startswith(b"HTTP/1.1 200 ")
    time.sleep(DEADLINE_S * 1.5)
    start = time.monotonic()
    sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-")
    reply = answer_then_close(sock)
    assert reply.startswith(b"HTTP/1.1 408 "), reply
    assert DEADLINE_S * 0.9 <= time.monotonic() - start < DEADLINE_S + 5


def wait_for_records(caplog, wanted, count: int = 1, timeout: float = 10.0) -> list[logging.LogRecord]:
    """The log records `wanted` picks, once there are `count` of them (or timeout seconds have passed)."""
    deadline = time.monotonic() + timeout
    while len([r for r in caplog.records if wanted(r)]) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # and any more there would be
    return [r for r in caplog.records if wanted(r)]


def test_uvicorn_writes_no_access_line_and_the_app_one(slow_api, caplog):
    caplog.set_level(logging.INFO)
    assert not logging.getLogger("uvicorn.access").hasHandlers()  # uvicorn's protocol then writes no line of its own
    assert predict(slow_api).status_code == 200
    lines = wait_for_records(caplog, lambda r: r.name == "app.access")
    assert len(lines) == 1 and '"POST /predict?include= HTTP/1.1" 200' in lines[0].getMessage()


@pytest.mark.parametrize(
    "to,body", [(MULTIPART_UPLOAD, multipart(digit_png())[:100]), (JSON_UPLOAD, b'{"digit": 3, "capsule": [0.1, ')]
)
def test_a_client_that_disconnects_is_one_line_without_traceback(slow_api, caplog, to, body):
    """Whichever way the route reads its body: no answer is logged (a 400 would say the client erred)."""
    caplog.set_level(logging.INFO)
    sock = stalled_upload(slow_api, body, to)
    time.sleep(0.2)  # the app holds the request and waits for its body
    sock.close()
    gone = wait_for_records(caplog, lambda r: "went away" in r.getMessage())
    assert len(gone) == 1 and gone[0].levelno == logging.INFO, [r.getMessage() for r in caplog.records]
    assert to[0].split("?")[0] in gone[0].getMessage()
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING or r.name == "app.access"]


def test_stalled_connections_leave_predict_answering_and_are_bounded(slow_api, caplog):
    """Fewer stalled connections than the bound: /predict answers 200 while they stall, then each is cut (one
    info line each, no traceback). With the bound reached, a new request is answered 503 until they are cut."""
    caplog.set_level(logging.INFO)
    flood = [stalled_upload(slow_api) for _ in range(MAX_CONNECTIONS // 2)]
    time.sleep(0.2)
    assert predict(slow_api).status_code == 200
    assert all(answer_then_close(sock).startswith(b"HTTP/1.1 408 ") for sock in flood)
    cut = wait_for_records(caplog, lambda r: "cut off by the read deadline" in r.getMessage(), len(flood))
    assert len(cut) == len(flood) and not [r for r in caplog.records if r.exc_info]
    full = [stalled_upload(slow_api) for _ in range(MAX_CONNECTIONS - 1)]  # the next one is the bound's
    time.sleep(0.2)
    assert predict(slow_api).status_code == 503
    assert all(answer_then_close(sock).startswith(b"HTTP/1.1 408 ") for sock in full)
    assert predict(slow_api).status_code == 200
