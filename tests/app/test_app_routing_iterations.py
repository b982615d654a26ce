"""/predict?include=iterations: dynamic routing iteration by iteration, from the graph's own iteration outputs;
asked for by name only, fetched only then, and a 422 with a sentence for a model whose graph has none."""

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.couplings import coupling_changes, routing_maps
from app.engine import Engines
from app.main import create_app
from model import contract
from tests.conftest import without_iteration_outputs
from tests.harness import encode

ROUTING_FIELDS = {"maps"}


def post_png(client, image: np.ndarray, **params):
    return client.post("/predict", params=params, files={"file": ("digit.png", encode(image), "image/png")})


@pytest.mark.parametrize(
    "include, routing",
    [
        (None, ROUTING_FIELDS),
        ("routing", ROUTING_FIELDS),
        ("routing,iterations", {*ROUTING_FIELDS, "iterations"}),
        ("iterations", {"iterations"}),
        ("routing,coefficients,iterations", {"coefficients", "maps", "iterations"}),
        ("capsules", None),
    ],
)
def test_iterations_come_only_when_named(client, digits, include, routing):
    """The default is capsules, reconstruction and routing, not every option: coefficients and iterations are
    named or absent."""
    params = {} if include is None else {"include": include}
    body = post_png(client, digits[0][0], **params).json()
    assert (set(body["routing"]) if "routing" in body else None) == routing


def test_each_iteration_is_the_graphs_own(client, engine, digits):
    """Iteration r's maps are routing_maps of the graph's routing_iterations[r] (r = 1: uniform couplings;
    r = R: routing.maps), its logit change the graph's logit_changes[r] and its coupling change the mean
    |c^r - c^(r-1)| of those couplings, on the very input the answer shows (preprocess=none)."""
    x = digits[0][4]
    body = post_png(client, x, include="routing,iterations", preprocess="none").json()
    couplings, changes, votes = engine.capsnet.run(
        [contract.ROUTING_ITERATIONS, contract.LOGIT_CHANGES, contract.VOTE_LENGTHS],
        {contract.IMAGE: x[None, None].astype(np.float32) / 255},
    )
    iterations = body["routing"]["iterations"]
    primary = engine.spec.primary_capsules
    assert [it["iteration"] for it in iterations] == list(range(1, engine.spec.routing.iterations + 1))
    for it, c, change, step in zip(iterations, couplings[0], changes[0], coupling_changes(couplings[0]), strict=True):
        np.testing.assert_allclose(it["maps"], routing_maps(c, votes[0], primary.types, primary.grid), atol=1e-6)
        assert it["logit_change"] == pytest.approx(change, rel=1e-6) and it["coupling_change"] == pytest.approx(step)
    uniform = routing_maps(np.full_like(votes[0], 1 / len(engine.spec.classes)), votes[0], primary.types, primary.grid)
    np.testing.assert_allclose(iterations[0]["maps"], uniform, rtol=1e-5)
    np.testing.assert_allclose(iterations[-1]["maps"], body["routing"]["maps"], rtol=0, atol=0)
    assert iterations[0]["coupling_change"] == 0 and all(it["coupling_change"] > 0 for it in iterations[1:])


def test_coupling_changes_are_mean_steps():
    c = np.stack([np.full((4, 2), 0.5), [[0.9, 0.1]] * 4, [[1.0, 0.0]] * 4]).astype(np.float32)
    np.testing.assert_allclose(coupling_changes(c), [0.0, 0.4, 0.1], atol=1e-6)


def test_only_requests_for_the_iterations_fetch_them(client, engine, digits, monkeypatch):
    """A plain /predict or /v2 infer fetches the contract's outputs alone from ONNX Runtime; the
    (N, R, primary, classes) iterations are fetched for the requests that name them."""
    fetched: list[list[str]] = []
    run = engine.capsnet.run
    monkeypatch.setattr(engine.capsnet, "run", lambda names, feed: fetched.append(list(names)) or run(names, feed))
    plain, every = list(contract.CAPSNET_OUTPUTS), [*contract.CAPSNET_OUTPUTS, *contract.CAPSNET_ITERATION_OUTPUTS]
    x = digits[0][5]
    image = {"name": contract.IMAGE, "datatype": "FP32", "shape": [1, 1, 28, 28], "data": (x / 255).ravel().tolist()}
    requests = [
        (lambda: post_png(client, x), plain),
        (lambda: post_png(client, x, include="iterations"), every),
        (lambda: client.post("/v2/models/mnist/infer", json={"inputs": [image]}), every),
        (
            lambda: client.post("/v2/models/mnist/infer", json={"inputs": [image], "outputs": [{"name": "lengths"}]}),
            plain,
        ),
        (
            lambda: client.post(
                "/v2/models/mnist/infer", json={"inputs": [image], "outputs": [{"name": contract.LOGIT_CHANGES}]}
            ),
            every,
        ),
    ]
    for request, names in requests:
        fetched.clear()
        assert request().status_code == 200
        assert fetched == [names]


def test_a_model_whose_graph_has_no_iterations_says_so(settings, digits, tmp_path):
    """A folder exported before the iteration outputs (or of a routing without iterations) is served as
    before; include=iterations is a 422 that says why, and /v2 neither lists nor returns them."""
    folder = without_iteration_outputs(contract.SHIPPED["mnist"], tmp_path)
    engines = Engines(settings.model_copy(update={"models": [f"older={folder}"]}))
    try:
        engines.warm_up()
        engines.start()
        app = create_app(settings)
        app.state.engines = engines
        client = TestClient(app)  # no lifespan: these engines are the app's
        assert set(post_png(client, digits[0][0], model="older").json()["routing"]) == ROUTING_FIELDS
        r = post_png(client, digits[0][0], model="older", include="routing,iterations")
        assert r.status_code == 422
        assert "model older cannot show its routing iteration by iteration" in r.json()["detail"]
        assert contract.ROUTING_ITERATIONS in r.json()["detail"]
        outputs = [o["name"] for o in client.get("/v2/models/older").json()["outputs"]]
        assert outputs == list(contract.CAPSNET_OUTPUTS)
        image = {"name": contract.IMAGE, "datatype": "FP32", "shape": [1, 1, 28, 28], "data": [0.0] * 784}
        r = client.post(
            "/v2/models/older/infer", json={"inputs": [image], "outputs": [{"name": contract.LOGIT_CHANGES}]}
        )
        assert r.status_code == 400 and "unknown output" in r.json()["error"]
    finally:
        engines.close()
