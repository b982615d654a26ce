"""Hostile inputs: every one is a 4xx with a sentence in {"detail": ...}, and the server lives on."""

import base64
import gzip
import json
import struct
import zlib

import httpx
import numpy as np
import pytest
from PIL import Image

from app.imaging.decode import PNG_SIGNATURE
from app.imaging.render import IEND, png_chunk
from model import contract
from tests.harness import BOUNDARY, MULTIPART, encode, multipart

MB = 1024 * 1024
DIGIT = (np.indices((28, 28)).sum(0) % 7 == 0).astype(np.uint8) * 255  # some ink
PNG = encode(DIGIT)
B64 = base64.b64encode(PNG).decode()
CAPSULE = [0.1] * 16
NOISE = encode(np.random.default_rng(0).integers(0, 256, (170, 127), dtype=np.uint8))  # no object, no ink
SPECKS = encode((np.random.default_rng(0).random((300, 300)) < 0.1).astype(np.uint8) * 255)  # a tenth of it white
ONE_PIXEL = encode(np.pad(np.full((1, 1), 255, np.uint8), 500))  # a white pixel amid 1001x1001 black


def png_bomb(width: int, height: int) -> bytes:
    """A valid 1-bit black PNG of width x height: megapixels of zeros compress to a small file."""

    row = b"\x00" * (1 + (width + 7) // 8)  # filter byte + packed bits
    packer = zlib.compressobj(9)
    idat = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)  # 1-bit greyscale
    return PNG_SIGNATURE + png_chunk(b"IHDR", header) + png_chunk(b"IDAT", idat) + IEND


def upload(data: bytes, name: str = "digit.png", mime: str = "image/png") -> dict:
    return {"files": {"file": (name, data, mime)}}


def json_body(text: str) -> dict:
    return {"content": text.encode(), "headers": {"content-type": "application/json"}}


class Chunked:
    """A body without Content-Length (sent chunked), iterable again for every request."""

    def __init__(self, data: bytes, size: int = 64 * 1024):
        self.data, self.size = data, size

    def __iter__(self):
        for i in range(0, len(self.data), self.size):
            yield self.data[i : i + self.size]


def tiff() -> bytes:
    return encode(DIGIT, "TIFF")


def bigger(shape=(280, 280), value=255) -> bytes:
    return encode(np.full(shape, value, np.uint8))


# (name, method, path, request kwargs, query params)
CASES = [
    ("no body", "POST", "/predict", {}, {}),
    ("no file field", "POST", "/predict", {"files": {"image": ("d.png", PNG, "image/png")}}, {}),
    ("file as a text field", "POST", "/predict", {"data": {"file": "hello"}, "files": {"other": ("x", b"x")}}, {}),
    ("two files", "POST", "/predict", {"files": [("file", ("a.png", PNG)), ("file", ("b.png", PNG))]}, {}),
    ("a file beside `file`", "POST", "/predict", {"files": [("other", ("a.png", PNG)), ("file", ("b.png", PNG))]}, {}),
    ("17 fields beside `file`", "POST", "/predict", {"data": {f"f{i}": "x" for i in range(17)}, **upload(PNG)}, {}),
    (
        "multipart cut short",
        "POST",
        "/predict",
        {"content": multipart(PNG)[:-20], "headers": {"content-type": MULTIPART}},
        {},
    ),
    (
        "boundary of 71 characters",
        "POST",
        "/predict",
        {
            "content": b"--" + b"b" * 71 + b"--\r\n",
            "headers": {"content-type": "multipart/form-data; boundary=" + "b" * 71},
        },
        {},
    ),
    ("a 5 kB file name", "POST", "/predict", upload(PNG, "d" * 5000 + ".png"), {}),
    (
        "a file name not in UTF-8",
        "POST",
        "/predict",
        {"content": multipart(PNG).replace(b"digit.png", b"\xff.png"), "headers": {"content-type": MULTIPART}},
        {},
    ),
    (
        "multipart of garbage",
        "POST",
        "/predict",
        {"content": b"\x00" * 100, "headers": {"content-type": MULTIPART}},
        {},
    ),
    (
        "multipart without boundary",
        "POST",
        "/predict",
        {"content": b"--x\r\n", "headers": {"content-type": "multipart/form-data"}},
        {},
    ),
    ("text file", "POST", "/predict", upload(b"hello, I am not an image", "a.txt", "text/plain"), {}),
    ("empty file", "POST", "/predict", upload(b""), {}),
    ("truncated PNG", "POST", "/predict", upload(PNG[: len(PNG) // 2]), {}),
    ("PNG header only", "POST", "/predict", upload(PNG[:33]), {}),
    ("truncated JPEG", "POST", "/predict", upload(encode(DIGIT, "JPEG")[:200], "d.jpg", "image/jpeg"), {}),
    ("corrupt PNG CRC", "POST", "/predict", upload(PNG[:29] + b"\x00\x00\x00\x00" + PNG[33:]), {}),
    ("TIFF (not supported)", "POST", "/predict", upload(tiff(), "d.tiff", "image/tiff"), {}),
    ("SVG", "POST", "/predict", upload(b"<svg xmlns='http://www.w3.org/2000/svg'/>", "d.svg", "image/svg+xml"), {}),
    ("decompression bomb over our limit", "POST", "/predict", upload(png_bomb(7000, 7000)), {}),
    ("decompression bomb over Pillow's limit", "POST", "/predict", upload(png_bomb(15000, 15000)), {}),
    ("36 megapixels of nothing", "POST", "/predict", upload(png_bomb(6000, 6000)), {}),
    ("20 MB body", "POST", "/predict", upload(b"\x00" * (20 * MB)), {}),
    (
        "20 MB chunked body",
        "POST",
        "/predict",
        {"content": Chunked(b"\x00" * (20 * MB)), "headers": {"content-type": "application/json"}},
        {},
    ),
    ("blank white canvas", "POST", "/predict", upload(bigger()), {}),
    ("uniform noise as a digit", "POST", "/predict", upload(NOISE), {}),
    ("uniform noise as a garment", "POST", "/predict", upload(NOISE), {"model": "fashion-mnist"}),
    ("scattered specks as a garment", "POST", "/predict", upload(SPECKS), {"model": "fashion-mnist"}),
    ("one pixel of a large picture as a garment", "POST", "/predict", upload(ONE_PIXEL), {"model": "fashion-mnist"}),
    ("blank transparent canvas", "POST", "/predict", upload(encode(Image.new("RGBA", (280, 280)))), {}),
    ("preprocess=none on 280x280", "POST", "/predict", upload(bigger(value=0)), {"preprocess": "none"}),
    ("unknown preprocess", "POST", "/predict", upload(PNG), {"preprocess": "fancy"}),
    ("unknown include", "POST", "/predict", upload(PNG), {"include": "capsules,everything"}),
    ("text/plain body", "POST", "/predict", {"content": PNG, "headers": {"content-type": "text/plain"}}, {}),
    ("raw image/png body", "POST", "/predict", {"content": PNG, "headers": {"content-type": "image/png"}}, {}),
    ("XML body", "POST", "/predict", {"content": b"<a/>", "headers": {"content-type": "application/xml"}}, {}),
    (
        "gzip body",
        "POST",
        "/predict",
        {
            "content": gzip.compress(b'{"image": "' + B64.encode() + b'"}'),
            "headers": {"content-type": "application/json", "content-encoding": "gzip"},
        },
        {},
    ),
    ("invalid JSON", "POST", "/predict", json_body('{"image": '), {}),
    ("JSON without image", "POST", "/predict", {"json": {"picture": B64}}, {}),
    ("JSON extra field", "POST", "/predict", {"json": {"image": B64, "extra": 1}}, {}),
    ("JSON image not a string", "POST", "/predict", {"json": {"image": 123}}, {}),
    ("JSON image empty", "POST", "/predict", {"json": {"image": ""}}, {}),
    ("JSON list", "POST", "/predict", {"json": [B64]}, {}),
    ("bad base64", "POST", "/predict", {"json": {"image": "!!!not base64!!!"}}, {}),
    ("non-ASCII base64", "POST", "/predict", {"json": {"image": "Zm9v\u00e9"}}, {}),
    ("data URL without base64", "POST", "/predict", {"json": {"image": "data:image/png," + B64}}, {}),
    ("base64 of text", "POST", "/predict", {"json": {"image": base64.b64encode(b"plain text").decode()}}, {}),
    ("GET /predict", "GET", "/predict", {}, {}),
    ("capsule of 15", "POST", "/reconstruct", {"json": {"digit": 1, "capsule": CAPSULE[:15]}}, {}),
    ("capsule of 17", "POST", "/reconstruct", {"json": {"digit": 1, "capsule": [*CAPSULE, 0.0]}}, {}),
    ("NaN in capsule", "POST", "/reconstruct", json_body('{"digit": 1, "capsule": [NaN' + ", 0.1" * 15 + "]}"), {}),
    (
        "Infinity in capsule",
        "POST",
        "/reconstruct",
        json_body('{"digit": 1, "capsule": [Infinity' + ", 0.1" * 15 + "]}"),
        {},
    ),
    ("huge value in capsule", "POST", "/reconstruct", {"json": {"digit": 1, "capsule": [1e300, *CAPSULE[1:]]}}, {}),
    ("string in capsule", "POST", "/reconstruct", {"json": {"digit": 1, "capsule": ["a", *CAPSULE[1:]]}}, {}),
    ("digit 10", "POST", "/reconstruct", {"json": {"digit": 10, "capsule": CAPSULE}}, {}),
    ("reconstruct nothing", "POST", "/reconstruct", {"json": {"digit": 1, "capsule": CAPSULE}}, {"include": ""}),
    ("digit -1", "POST", "/reconstruct", {"json": {"digit": -1, "capsule": CAPSULE}}, {}),
    ("digit 2.5", "POST", "/reconstruct", {"json": {"digit": 2.5, "capsule": CAPSULE}}, {}),
    ("no capsule", "POST", "/reconstruct", {"json": {"digit": 3}}, {}),
    (
        "both forms",
        "POST",
        "/reconstruct",
        {"json": {"digit": 3, "capsule": CAPSULE, "items": [{"digit": 3, "capsule": CAPSULE}]}},
        {},
    ),
    ("empty items", "POST", "/reconstruct", {"json": {"items": []}}, {}),
    ("batch of 257", "POST", "/reconstruct", {"json": {"items": [{"digit": 1, "capsule": CAPSULE}] * 257}}, {}),
    ("reconstruct multipart", "POST", "/reconstruct", upload(PNG), {}),
    ("reconstruct invalid JSON", "POST", "/reconstruct", json_body("{digit: 1}"), {}),
    # the Open Inference Protocol: {"error": ...} as the protocol says (the path's own {name} is no model)
    ("v2 metadata of no model", "GET", "/v2/models/{name}", {}, {}),
    ("v2 metadata of a version not served", "GET", "/v2/models/{name}/versions/{version}", {}, {}),
    ("v2 readiness of no model", "GET", "/v2/models/{name}/ready", {}, {}),
    ("v2 readiness of a version not served", "GET", "/v2/models/{name}/versions/{version}/ready", {}, {}),
    ("v2 infer on no model", "POST", "/v2/models/{name}/infer", {"json": {"inputs": []}}, {}),
    ("v2 infer on a version not served", "POST", "/v2/models/{name}/versions/{version}/infer", {"json": {}}, {}),
    ("v2 infer not JSON", "POST", "/v2/models/mnist/infer", {"content": b"\x89PNG"}, {}),
    (
        "v2 infer NaN",
        "POST",
        "/v2/models/mnist/infer",
        json_body(
            '{"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": ['
            + ", ".join(["NaN"] * 784)
            + "]}]}"
        ),
        {},
    ),
    (
        "v2 infer wrong rank",
        "POST",
        "/v2/models/mnist/infer",
        {"json": {"inputs": [{"name": "image", "datatype": "FP32", "shape": [784], "data": [0] * 784}]}},
        {},
    ),
    (
        "v2 infer 28x28 into the 36x36 model",
        "POST",
        "/v2/models/multimnist/infer",
        {"json": {"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": [0] * 784}]}},
        {},
    ),
    # ?model=: several models in one process
    ("predict on no model", "POST", "/predict", upload(PNG), {"model": "imagenet"}),
    ("predict on a path as model", "POST", "/predict", upload(PNG), {"model": "../model"}),
    ("predict on a huge model name", "POST", "/predict", upload(PNG), {"model": "m" * 10_000}),
    (
        "a 28x28 digit taken as is by the 36x36 model",
        "POST",
        "/predict",
        upload(PNG),
        {"model": "multimnist", "preprocess": "none"},
    ),
    ("a blank canvas to the two-digit model", "POST", "/predict", upload(bigger()), {"model": "multimnist"}),
    ("a blank canvas to the garment model", "POST", "/predict", upload(bigger()), {"model": "fashion-mnist"}),
    ("reconstruct on no model", "POST", "/reconstruct", {"json": {"digit": 1, "capsule": CAPSULE}}, {"model": "x"}),
    ("model card of no model", "GET", "/model", {}, {"model": "nope"}),
    # /explain: a sweep over the prepared input
    ("explain thousands of steps", "POST", "/explain", upload(PNG), {"steps": 5000}),
    ("explain one step", "POST", "/explain", upload(PNG), {"steps": 1}),
    ("explain a NaN start", "POST", "/explain", upload(PNG), {"start": "NaN"}),
    ("explain an infinite stop", "POST", "/explain", upload(PNG), {"stop": "-inf"}),
    ("explain a huge rotation", "POST", "/explain", upload(PNG), {"start": 1e308}),
    ("explain a zero scale", "POST", "/explain", upload(PNG), {"transform": "scale", "start": 0}),
    ("explain a negative scale", "POST", "/explain", upload(PNG), {"transform": "scale", "stop": -2}),
    ("explain a 50 px thickening", "POST", "/explain", upload(PNG), {"transform": "thickness", "stop": 50}),
    ("explain an unknown transform", "POST", "/explain", upload(PNG), {"transform": "__class__"}),
    ("explain an unknown include", "POST", "/explain", upload(PNG), {"include": "weights"}),
    ("explain a class out of range", "POST", "/explain", upload(PNG), {"follow": -1}),
    ("explain no body", "POST", "/explain", {}, {}),
    ("explain not an image", "POST", "/explain", upload(b"GIF89a garbage"), {}),
    ("explain on no model", "POST", "/explain", upload(PNG), {"model": "imagenet"}),
] + [  # every graph's infer is its own operation in the OpenAPI document (the app serves every shipped model)
    (f"v2 infer {graph} without a body", "POST", f"/v2/models/{graph}/infer", {}, {})
    for name in contract.SHIPPED
    for graph in (name, f"{name}_decoder")
]


def test_every_route_that_takes_input_is_attacked(app, client):
    """A route added later that reads a body or a query parameter must bring its hostile cases (`client`: the
    models are loaded, so the document has its infer operations)."""
    attacked = {(method.lower(), path) for _, method, path, _, _ in CASES}
    schema = app.openapi()["paths"]
    takes_input = {
        (method, path)
        for path, ops in schema.items()
        for method, op in ops.items()
        if "requestBody" in op or op.get("parameters")
    }
    assert takes_input and takes_input <= attacked, f"no hostile case for {sorted(takes_input - attacked)}"


@pytest.mark.parametrize("name,method,path,kwargs,params", CASES, ids=[case[0] for case in CASES])
def test_hostile_input_is_a_4xx_with_a_sentence(client, name, method, path, kwargs, params):
    r = client.request(method, path, params=params, **kwargs)
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    detail = r.json()["error" if path.startswith("/v2/") else "detail"]
    assert isinstance(detail, str) and len(detail) > 8, detail
    assert "Traceback" not in r.text and 'File "' not in r.text


def test_statuses_say_what_kind_of_mistake(client):
    def status(case_name):
        _, method, path, kwargs, params = next(case for case in CASES if case[0] == case_name)
        return client.request(method, path, params=params, **kwargs).status_code

    assert status("20 MB body") == status("20 MB chunked body") == 413
    assert status("decompression bomb over our limit") == status("decompression bomb over Pillow's limit") == 413
    assert status("text/plain body") == status("reconstruct multipart") == status("gzip body") == 415
    r = client.get("/no/such/route")  # the router's own answers say what was asked and what to do
    assert (
        r.status_code == 404 and r.json()["detail"] == "this server has no route /no/such/route (GET /docs lists them)"
    )
    r = client.get("/predict")
    assert (
        r.status_code == 405 and r.json()["detail"] == "/predict takes POST, not GET" and r.headers["allow"] == "POST"
    )
    malformed = (
        "multipart without boundary",
        "multipart cut short",
        "multipart of garbage",
        "17 fields beside `file`",
        "two files",
        "boundary of 71 characters",
    )
    assert {status(name) for name in (*malformed, "a file beside `file`")} == {400}
    _, method, path, kwargs, params = next(case for case in CASES if case[0] == "a file name not in UTF-8")
    r = client.request(method, path, params=params, **kwargs)  # the parser's words, not its exception's repr
    assert r.status_code == 400 and "Error(" not in r.json()["detail"], r.json()
    _, method, path, kwargs, params = next(case for case in CASES if case[0] == "a 5 kB file name")
    r = client.request(method, path, params=params, **kwargs)
    assert r.status_code == 400 and "too long or too many headers" in r.json()["detail"]
    assert status("no file field") == status("file as a text field") == 422
    assert status("text file") == status("blank white canvas") == status("NaN in capsule") == 422
    r = client.post("/predict", files={"file": ("d.png", bigger(), "image/png")})
    assert "no ink" in r.json()["detail"]


def test_a_multipart_boundary_is_one_of_rfc_2046s(client):
    """A boundary of characters RFC 2046 does not allow (non-ASCII, a last space) is a 400 saying which it allows,
    not that its length is wrong; every character it allows, an inner space among them, reads the upload."""

    def sent_with(boundary: str, quoted: bool = True) -> httpx.Response:
        body = multipart(PNG).replace(BOUNDARY.encode(), boundary.encode())
        header = f'"{boundary}"' if quoted else boundary
        headers = {"content-type": f"multipart/form-data; boundary={header}".encode()}
        return client.post("/predict", params={"include": ""}, content=body, headers=headers)

    for boundary, quoted in (("é", False), ("é", True), ("ab ", True), ("a\tb", True)):
        r = sent_with(boundary, quoted)
        assert r.status_code == 400 and "ASCII letters, digits or '()+_,-./:=?" in r.json()["detail"], (
            boundary,
            r.text,
        )
    assert sent_with("0aZ'()+_,-./:=? b").status_code == 200
    assert sent_with("b" * 70, quoted=False).status_code == 200


def test_the_server_answers_as_before_after_the_corpus(client):
    """The whole corpus in a row: every request refused, and then the server answers a good digit exactly
    as it did before (nothing a hostile request did stayed behind in the engine or its batcher)."""

    def good() -> dict:
        return client.post(
            "/predict", params={"include": "capsules"}, files={"file": ("d.png", PNG, "image/png")}
        ).json()

    before = good()
    refused = [
        client.request(method, path, params=params, **kwargs).status_code for _, method, path, kwargs, params in CASES
    ]
    assert all(400 <= status < 500 for status in refused), dict(zip((case[0] for case in CASES), refused, strict=True))
    assert client.get("/health").status_code == 200
    after = good()
    assert after["prediction"] == before["prediction"]
    np.testing.assert_allclose(after["capsules"], before["capsules"], atol=1e-6)


def test_unexpected_errors_are_500_with_a_request_id(app, client, caplog, monkeypatch):
    async def broken(*args, **kwargs):
        raise RuntimeError("secret internals")

    monkeypatch.setattr(app.state.engines["mnist"], "predict", broken)
    r = client.post("/predict", files={"file": ("d.png", PNG, "image/png")}, headers={"X-Request-ID": "req-42"})
    assert r.status_code == 500
    assert r.json() == {"detail": "internal error, request id req-42"}
    assert "secret" not in r.text and r.headers["x-request-id"] == "req-42"
    assert any("req-42" in record.getMessage() for record in caplog.records)


def test_validation_detail_is_a_sentence(client):
    r = client.post("/reconstruct", json={"digit": 12, "capsule": CAPSULE})
    assert r.status_code == 422
    assert r.json()["detail"] == "invalid request: body.digit: Input should be less than or equal to 9"
    r = client.post("/predict", params={"include": "nope"}, files={"file": ("d.png", PNG, "image/png")})
    assert "nope" in r.json()["detail"] and "capsules" in r.json()["detail"]
    assert json.loads(client.post("/predict", json={}).text)["detail"].startswith("invalid request: body.image")
    # /predict reads its query itself (app/deps.py's read_query): its sentences are FastAPI's, every mistake named
    r = client.post("/predict", params={"preprocess": "fancy", "model": "m" * 65}, files={"file": ("d.png", PNG)})
    assert r.status_code == 422
    assert r.json()["detail"] == (
        "invalid request: query.preprocess: Input should be 'auto', 'mnist' or 'none'; "
        "query.model: String should have at most 64 characters"
    )


TWICE = [  # a route whose query FastAPI reads (or /predict's read_query), and a name given twice
    ("POST", "/predict", upload(PNG), [("include", "capsules"), ("include", "routing")]),
    ("POST", "/predict", upload(PNG), [("model", "mnist"), ("model", "mnist")]),
    ("POST", "/explain", upload(PNG), [("steps", "3"), ("steps", "5")]),
    ("POST", "/reconstruct", {"json": {"digit": 3, "capsule": CAPSULE}}, [("include", "png"), ("include", "image")]),
    ("GET", "/model", {}, [("model", "mnist"), ("model", "fashion-mnist")]),
]


@pytest.mark.parametrize("method,path,kwargs,params", TWICE, ids=[f"{case[1]} {case[3][0][0]}" for case in TWICE])
def test_a_parameter_given_twice_is_refused_in_words(client, method, path, kwargs, params):
    """FastAPI keeps a repeated parameter's last value: the first would be dropped without a word."""
    r = client.request(method, path, params=params, **kwargs)
    name, first = params[0]
    detail = r.json()["detail"]
    assert r.status_code == 422 and detail.startswith(f"the query gives '{name}' 2 times ('{first}', "), detail
    assert "give each parameter once" in detail
    assert client.request(method, path, params=params[:1], **kwargs).status_code == 200  # once, it is answered


def test_a_repeated_include_is_shown_as_its_comma_list(client):
    params = [("include", "capsules"), ("include", " routing,"), ("include", "reconstruction")]
    r = client.post("/predict", params=params, files={"file": ("d.png", PNG)})
    assert r.json()["detail"] == (
        "the query gives 'include' 3 times ('capsules', ' routing,', 'reconstruction'); give each parameter once: "
        "include takes a comma list (include=capsules,routing,reconstruction)"
    )
    r = client.post("/predict", params=[("x\n" * 40, "y" * 1000)] * 5, files={"file": ("d.png", PNG)})
    detail = r.json()["detail"]  # a client's text, quoted, escaped and cut short: the sentence stays readable
    assert r.status_code == 422 and "\n" not in detail and "and 2 more" in detail and len(detail) < 240, detail


def test_every_route_with_a_query_refuses_a_parameter_given_twice(app, client):
    """A route added later with query parameters must refuse one given twice (`dependencies=[GivenOnce]`, or
    read_query), before it reads a body. The Open Inference Protocol's routes (/v2) are its, version and all."""
    schema = app.openapi()["paths"]
    queried = [
        (method, path, next(p["name"] for p in op["parameters"] if p["in"] == "query"))
        for path, ops in schema.items()
        for method, op in ops.items()
        if any(p["in"] == "query" for p in op.get("parameters", ())) and not path.startswith("/v2/")
    ]
    assert {path for _, path, _ in queried} >= {"/predict", "/explain", "/reconstruct", "/model"}
    for method, path, name in queried:
        r = client.request(method, path, params=[(name, "a"), (name, "b")])
        assert r.status_code == 422 and "give each parameter once" in r.json()["detail"], (method, path, r.text)
