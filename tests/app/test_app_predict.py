"""POST /predict: real MNIST digits, the response's invariants, include, JSON vs multipart."""

import base64
import hashlib
import io
import json
import logging
import re
import time

import numpy as np
import pytest
from PIL import Image
from PIL.PngImagePlugin import PngInfo

from app import answer
from app.answer import doubts
from app.couplings import routing_maps
from app.imaging import from_base64
from app.middleware import request_line
from model import contract
from tests.harness import MULTIPART, encode, multipart

FULL = {
    "prediction",
    "label",
    "probabilities",
    "runner_up",
    "warnings",
    "capsules",
    "reconstruction",
    "routing",
    "input",
    "model",
}


def post_png(client, image: np.ndarray, **params):
    return client.post("/predict", params=params, files={"file": ("digit.png", encode(image), "image/png")})


def decoded_png(url: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(from_base64(url))), np.float32) / 255


def test_mnist_digits_get_their_labels(client, mnist_fixture, model_card):
    if model_card["test_accuracy"] is None:
        pytest.skip("models/mnist/capsnet.json says the shipped model is untrained (test_accuracy is null)")
    images, labels = mnist_fixture[0][:100], mnist_fixture[1][:100]
    for preprocess, needed in (("none", 0.98), ("mnist", 0.97)):
        got = [post_png(client, x, include="", preprocess=preprocess).json()["prediction"] for x in images]
        assert np.mean(np.array(got) == labels) >= needed, preprocess


def test_mnist_is_a_documented_alias_of_auto(client, digits):
    """?preprocess=mnist, an alias of auto, answers as auto does, and /predict and /explain say so."""
    image = np.asarray(Image.fromarray(digits[0][0]).resize((84, 84)))  # not the model's size: preprocessed
    auto, alias = (post_png(client, image, preprocess=p).json() for p in ("auto", "mnist"))
    assert auto == alias
    paths = client.get("/openapi.json").json()["paths"]
    for route in ("/predict", "/explain"):
        (parameter,) = [q for q in paths[route]["post"]["parameters"] if q["name"] == "preprocess"]
        assert "mnist: an alias of auto" in parameter["description"], route


def test_outputs_keep_their_invariants(client, digits):
    r = post_png(client, digits[0][0])
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == FULL
    probabilities = np.array(body["probabilities"])
    assert probabilities.shape == (10,) and ((probabilities >= 0) & (probabilities <= 1)).all()
    assert body["prediction"] == int(probabilities.argmax())
    second = int(np.argsort(-probabilities)[1])
    assert body["runner_up"]["digit"] == second != body["prediction"]
    assert body["runner_up"]["length"] == pytest.approx(probabilities[second], abs=1e-6)
    assert body["warnings"] == []  # a clean MNIST digit, read with confidence
    assert np.array(body["capsules"]).shape == (10, 16)
    lengths = np.sqrt((np.array(body["capsules"]) ** 2).sum(axis=1) + 1e-8)  # eps inside the root (routing.py)
    np.testing.assert_allclose(lengths, probabilities, rtol=1e-4, atol=1e-6)
    image = np.array(body["reconstruction"]["image"])
    assert image.shape == (28, 28) and image.min() >= 0 and image.max() <= 1
    np.testing.assert_allclose(decoded_png(body["reconstruction"]["png"]), image, atol=0.5 / 255 + 1e-6)
    assert set(body["routing"]) == {"maps"} and np.array(body["routing"]["maps"]).shape == (10, 6, 6)
    assert decoded_png(body["input"]).shape == (28, 28)
    assert body["model"]["provider"] == "CPUExecutionProvider" and len(body["model"]["version"]) == 12


def test_the_coefficients_come_when_named(client, engine, digits):
    """include=coefficients: routing.coefficients, the graph's own final c_ij of Procedure 1 (each row sums to 1),
    beside the maps when routing is named too; the default answer leaves them out."""
    x = digits[0][0][None, None].astype(np.float32) / 255
    (want,) = engine.capsnet.run([contract.ROUTING], {contract.IMAGE: x})
    body = post_png(client, digits[0][0], preprocess="none", include="routing,coefficients").json()
    coefficients = np.array(body["routing"]["coefficients"])
    assert set(body["routing"]) == {"coefficients", "maps"} and coefficients.shape == (1152, 10)
    np.testing.assert_allclose(coefficients, want[0], atol=1e-5)
    np.testing.assert_allclose(coefficients.sum(axis=1), 1.0, atol=1e-5)
    alone = post_png(client, digits[0][0], preprocess="none", include="coefficients").json()
    assert set(alone["routing"]) == {"coefficients"}
    assert "coefficients" not in post_png(client, digits[0][0], preprocess="none").json()["routing"]


def test_routing_maps_sum_coupling_times_vote_length():
    rng = np.random.default_rng(0)
    c, u = rng.random((1152, 10)), rng.random((1152, 10))
    maps = routing_maps(c, u, types=32, grid=6)
    # capsule i = type*36 + row*6 + col (contract): map_j(row, col) = Σ_type c·|u_hat|
    row, col, j = 2, 4, 7
    expected = sum(c[t * 36 + row * 6 + col, j] * u[t * 36 + row * 6 + col, j] for t in range(32))
    assert maps.shape == (10, 6, 6) and maps[j, row, col] == pytest.approx(expected, rel=1e-5)
    assert routing_maps(rng.random((3200, 10)), rng.random((3200, 10)), 32, 10).shape == (10, 10, 10)  # MultiMNIST's


def test_preprocess_none_equals_the_bare_session(client, engine, digits):
    x = digits[0][:3].astype(np.float32) / 255
    lengths, capsules = engine.capsnet.run([contract.LENGTHS, contract.CAPSULES], {contract.IMAGE: x[:, None]})
    for i in range(3):
        body = post_png(client, digits[0][i], preprocess="none", include="capsules,input").json()
        np.testing.assert_allclose(body["probabilities"], lengths[i], atol=1e-5)
        np.testing.assert_allclose(body["capsules"], capsules[i], atol=1e-5)
        np.testing.assert_allclose(decoded_png(body["input"]), x[i], atol=0.5 / 255 + 1e-6)


@pytest.mark.parametrize(
    "include,expected",
    [
        ("", set()),
        ("capsules", {"capsules"}),
        ("input", {"input"}),
        ("routing,reconstruction", {"routing", "reconstruction"}),
        (" capsules , routing ", {"capsules", "routing"}),
    ],
)
def test_include_trims_the_response(client, digits, include, expected):
    body = post_png(client, digits[0][1], include=include).json()
    assert set(body) == {"prediction", "label", "probabilities", "runner_up", "warnings", "model"} | expected


def test_json_and_multipart_agree(client, digits):
    data = encode(digits[0][2])
    multipart = client.post("/predict", files={"file": ("d.png", data, "image/png")}).json()
    plain = client.post("/predict", json={"image": base64.b64encode(data).decode()}).json()
    url = client.post("/predict", json={"image": "data:image/png;base64," + base64.b64encode(data).decode()}).json()
    for other in (plain, url):
        assert other["prediction"] == multipart["prediction"] and other["input"] == multipart["input"]
        np.testing.assert_allclose(other["probabilities"], multipart["probabilities"], atol=1e-5)
        np.testing.assert_allclose(other["routing"]["maps"], multipart["routing"]["maps"], atol=1e-5)


def test_the_file_is_read_however_the_body_arrives(client, digits):
    """The `file` beside other fields, before and after it, and a body streamed in pieces that split its
    boundaries: the same image as a plain upload."""
    data = encode(digits[0][2])
    plain = client.post("/predict?include=input", files={"file": ("d.png", data, "image/png")}).json()
    fields = {f"f{i}": "x" * i for i in range(16)}
    beside = client.post("/predict?include=input", data=fields, files={"file": ("d.png", data, "image/png")}).json()
    body = multipart(data)
    pieces = (body[i : i + 7] for i in range(0, len(body), 7))  # an iterator: sent chunked, 7 bytes a chunk
    streamed = client.post("/predict?include=input", content=pieces, headers={"content-type": MULTIPART}).json()
    assert plain["input"] == beside["input"] == streamed["input"]
    assert plain["prediction"] == beside["prediction"] == streamed["prediction"]


def test_reconstruct_matches_the_predicted_reconstruction(client, digits):
    body = post_png(client, digits[0][3]).json()
    digit = body["prediction"]
    r = client.post("/reconstruct", json={"digit": digit, "capsule": body["capsules"][digit]})
    assert r.status_code == 200
    (item,) = r.json()["items"]
    np.testing.assert_allclose(item["image"], body["reconstruction"]["image"], atol=1e-5)


def test_reconstruct_batch_of_the_fig4_grid(client):
    """The demo's Fig. 4 request: 16 dimensions x 11 perturbations in [-0.25, 0.25], one call."""
    steps = np.linspace(-contract.PERTURB_LIMIT, contract.PERTURB_LIMIT, 11)
    items = []
    for dim in range(16):
        for step in steps:
            capsule = np.full(16, 0.1)
            capsule[dim] += step
            items.append({"digit": 4, "capsule": capsule.tolist()})
    r = client.post("/reconstruct", json={"items": items})
    assert r.status_code == 200
    images = np.array([item["image"] for item in r.json()["items"]])
    assert images.shape == (176, 28, 28) and images.min() >= 0 and images.max() <= 1
    assert all(item["png"].startswith("data:image/png;base64,") for item in r.json()["items"])


def test_reconstruct_returns_what_include_asks_for(client):
    """?include=image: the pixels alone (the demo's Fig. 4, no PNG encoding); png: the PNGs alone, the same
    drawings at 8 bits; anything else: 422 naming the choices."""
    body = {"items": [{"digit": 4, "capsule": [0.1] * 16}, {"digit": 4, "capsule": [0.2] + [0.1] * 15}]}
    both = client.post("/reconstruct", json=body).json()["items"]
    pixels = client.post("/reconstruct", params={"include": "image"}, json=body).json()["items"]
    pngs = client.post("/reconstruct", params={"include": "png"}, json=body).json()["items"]
    assert [set(item) for item in pixels] == [{"image"}] * 2 and [set(item) for item in pngs] == [{"png"}] * 2
    for b, x, p in zip(both, pixels, pngs, strict=True):
        assert x["image"] == b["image"] and p["png"] == b["png"]
        decoded = np.asarray(Image.open(io.BytesIO(base64.b64decode(p["png"].split(",", 1)[1]))), np.float32) / 255
        np.testing.assert_allclose(decoded, x["image"], atol=0.5 / 255 + 1e-6)
    r = client.post("/reconstruct", params={"include": "image,svg"}, json=body)
    assert r.status_code == 422 and "svg" in r.json()["detail"] and "image, png" in r.json()["detail"]


def test_health_ready_model(client):
    """On the CPU the shipped MNIST model is served as its int8 graph (its card ships it: tests/model),
    and /model names that file by its hash and states the shipped card's accuracy."""
    shipped = json.loads((contract.SHIPPED["mnist"] / contract.MODEL_CARD).read_text())
    assert shipped["int8"]["shipped"]
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").json() == {
        "status": "ready",
        "providers": ["CPUExecutionProvider"],
        "precision": "int8",
        "models": ["mnist", "fashion-mnist", "multimnist", "affine"],
    }
    card = client.get("/model").json()
    int8 = hashlib.sha256((contract.SHIPPED["mnist"] / contract.CAPSNET_INT8_ONNX).read_bytes()).hexdigest()[:12]
    assert card["providers"] == ["CPUExecutionProvider"] and card["precision"] == "int8"
    assert card["version"] == int8 and card["batching"]["max_batch"] == 64
    assert card["test_accuracy"] == shipped["test_accuracy"]


def test_request_id_header(client):
    made = {client.get("/health").headers["x-request-id"] for _ in range(50)}  # 128 random bits each
    assert len(made) == 50 and all(re.fullmatch("[0-9a-f]{32}", request_id) for request_id in made)
    assert client.get("/health", headers={"X-Request-ID": "abc-123"}).headers["x-request-id"] == "abc-123"


def test_each_answer_is_one_access_line_after_it(client, caplog):
    caplog.set_level(logging.INFO, "app.access")
    r = post_png(client, np.zeros((28, 28), np.uint8), include="")  # blank: a 422 is answered and logged too
    client.get("/health?x=%0Aforged", headers={"X-Request-ID": "abc-123"})
    lines = [record.getMessage() for record in caplog.records if record.name == "app.access"]
    assert len(lines) == 2, lines
    post = r'testclient:\d+ - "POST /predict\?include= HTTP/1.1" 422, ([\d.]+) ms, request id (\w+)'
    posted = re.fullmatch(post, lines[0])
    assert posted and posted[2] == r.headers["x-request-id"] and float(posted[1]) > 0, lines[0]
    # as sent (percent-encoded): a query cannot start a line of its own
    health = r'testclient:\d+ - "GET /health\?x=%0Aforged HTTP/1.1" 200, [\d.]+ ms, request id abc-123'
    assert re.fullmatch(health, lines[1]), lines[1]
    assert request_line({"path": "/a\nb", "raw_path": b"/a\nb", "query_string": b""}) == "/a\\nb"


def test_predict_says_how_long_each_stage_took(client, digits):
    begun = time.perf_counter()
    r = post_png(client, digits[0][0], include="")
    elapsed_ms = 1000 * (time.perf_counter() - begun)
    parts = [re.fullmatch(r"(\w+);dur=(\d+\.\d{3})", part) for part in r.headers["server-timing"].split(", ")]
    assert all(parts), r.headers["server-timing"]
    stages = {part[1]: float(part[2]) for part in parts if part}
    assert list(stages) == ["prepare", "model", "render"]
    assert all(ms > 0 for ms in stages.values()) and sum(stages.values()) < elapsed_ms, (stages, elapsed_ms)


def test_doubts_are_read_from_the_lengths():
    def doubts_of(lengths: list[float], objects: int = 1) -> list[str]:
        return doubts(np.array(lengths), np.argsort(lengths)[::-1], [str(d) for d in range(10)], objects)

    assert doubts_of([0.02] * 9 + [0.95]) == []
    short = doubts_of([0.05] * 9 + [0.08])
    assert len(short) == 1 and "below m- = 0.1" in short[0]
    close = doubts_of([0.01] * 8 + [0.6, 0.7])
    assert len(close) == 1 and "runner-up 8" in close[0]
    assert doubts_of([0.01] * 8 + [0.6, 0.7], objects=2) == []  # two digits: both are named, no doubt
    one = doubts_of([0.01] * 8 + [0.05, 0.9], objects=2)
    assert len(one) == 1 and "capsule 2 of 2" in one[0] and "2 objects" in one[0]
    faint = doubts_of([0.01] * 8 + [0.22, 0.9], objects=2)  # a single 1 read as a pair: a faint second capsule
    assert len(faint) == 1 and "(8) is short, 0.22" in faint[0] and "fewer than 2 objects" in faint[0]
    assert doubts_of([0.01] * 8 + [0.22, 0.9]) == []  # one object: a short runner-up is no doubt


def test_unusual_input_comes_with_warnings(client, digits):
    """Two digits far apart on one canvas: one is read, the other is named in a warning."""
    canvas = np.zeros((120, 400), np.uint8)
    big = np.asarray(Image.fromarray(digits[0][0]).resize((112, 112)))
    canvas[4:116, 0:112], canvas[4:116, 288:400] = big, big
    body = post_png(client, canvas, include="").json()
    assert any("other shape" in w for w in body["warnings"]), body["warnings"]


def test_an_input_taken_as_it_is_is_warned_of_when_unlike_the_models_images(client, digits):
    """preprocess=none reads a blank picture, or dark ink on white, as it is: answered, with a warning, where
    preprocess=auto finds no ink in the blank one."""
    blank = np.zeros((28, 28), np.uint8)
    body = post_png(client, blank, include="", preprocess="none").json()
    assert any(w.startswith("the image is blank") for w in body["warnings"]), body["warnings"]
    assert post_png(client, blank, include="").status_code == 422
    body = post_png(client, 255 - digits[0][0], include="", preprocess="none").json()
    assert any("edges are light" in w for w in body["warnings"]), body["warnings"]
    assert post_png(client, digits[0][0], include="", preprocess="none").json()["warnings"] == []


def test_predict_has_no_parameters_for_fastapi_to_solve(app):
    """/predict reads its query in one validation (app/deps.py's read_query): FastAPI solves a route's
    declared parameters and dependencies anew for every request, inspecting each one's annotation; the
    OpenAPI document still lists the query's parameters."""
    from app.routes.predict import router

    (route,) = router.routes
    dependant = route.dependant  # type: ignore[attr-defined]  # an APIRoute's
    assert not (dependant.query_params or dependant.dependencies or dependant.body_params)
    (operation,) = app.openapi()["paths"]["/predict"].values()
    assert [p["name"] for p in operation["parameters"]] == ["include", "preprocess", "model"]


def test_a_small_picture_is_prepared_on_the_event_loop_and_a_large_one_in_the_thread_pool(client, digits, monkeypatch):
    """A 28x28 PNG, taken as it is or prepared (a lone dot too: its preparation is bounded), and a 64x64 one,
    are prepared without a thread hop; a 65x64 picture, a 16x256 one (as few pixels as 64x64) and a 28x28
    one of more than 16 KiB (a long text chunk) each hop to the thread pool."""
    hops = []
    original = answer.run_in_threadpool

    async def counted(fn, *args, **kwargs):
        hops.append(fn)
        return await original(fn, *args, **kwargs)

    monkeypatch.setattr(answer, "run_in_threadpool", counted)
    dot = np.zeros((28, 28), np.uint8)
    dot[14, 14] = 255
    inline = ((digits[0][0], "none"), (digits[0][0], "auto"), (dot, "auto"), (np.pad(digits[0][0], 18), "auto"))
    for image, preprocess in inline:
        r = post_png(client, image, include="", preprocess=preprocess)
        assert r.status_code == 200 and hops == []
    r = post_png(client, np.pad(digits[0][0], ((18, 18), (18, 19))), include="")
    assert r.status_code == 200 and len(hops) == 1
    r = post_png(client, np.pad(digits[0][0], ((0, 0), (114, 114)))[6:22], include="")
    assert r.status_code == 200 and len(hops) == 2
    info = PngInfo()
    info.add_text("Comment", "x" * 20_000)
    buffer = io.BytesIO()
    Image.fromarray(digits[0][0]).save(buffer, "PNG", pnginfo=info)
    assert buffer.tell() > answer.INLINE_BYTES
    r = client.post("/predict", params={"include": ""}, files={"file": ("digit.png", buffer.getvalue(), "image/png")})
    assert r.status_code == 200 and r.json()["prediction"] == digits[1][0] and len(hops) == 3
