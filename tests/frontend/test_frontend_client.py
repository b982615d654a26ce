"""The launched demo answers over its own HTTP API, as gradio_client sees it."""

import numpy as np
from gradio_client import Client, handle_file
from PIL import Image

from frontend.client import ApiClient
from frontend.tabs import EXAMPLES
from tests.frontend.conftest import start_demo
from tests.harness import TRANSPARENT_SEVEN


def grey(path: str) -> np.ndarray:
    return np.asarray(Image.open(path).convert("L"), dtype=np.float32) / 255


def test_the_demo_answers_through_gradio_client(demo_url, api_url):
    demo = Client(demo_url, verbose=False)
    seven = next(p for p in EXAMPLES if p.name.startswith("7_"))
    status, seen, reconstruction, lengths, digit, footer = demo.predict(  # the routing maps follow in their own step
        handle_file(str(seven)), api_name="/predict_upload"
    )
    assert status.startswith("## Prediction: **7**") and digit == 7
    # What the model saw (28x28, 8 times larger): a white digit on black, some of it ink but not most; and
    # its reconstruction from the 7-capsule alone draws the same shape.
    seen, reconstruction = grey(seen), grey(reconstruction)
    assert seen.shape == reconstruction.shape == (224, 224)
    assert 0.05 < (seen > 0.5).mean() < 0.5, (seen > 0.5).mean()
    assert np.corrcoef(seen.ravel(), reconstruction.ravel())[0, 1] > 0.7
    assert Image.open(lengths).width > 0
    served = {entry["name"]: entry for entry in ApiClient(api_url, timeout_s=30.0).models()["models"]}
    assert "**mnist**" in footer and f"`{served['mnist']['version']}`" in footer  # the graph that answered
    assert demo.predict(api_name="/model") == footer  # the page's footer on load: the first tab's model


def test_an_upload_reaches_the_api_as_it_was_sent(demo_url, tmp_path):
    """The upload's file goes to the API untouched: a transparent PNG whose ink is in its alpha reads as its
    digit (converted to RGB on the way it would be a black square: "no ink was found"), and a file that is
    not an image gets the API's sentence as the status, not an error from the page."""
    demo = Client(demo_url, verbose=False)
    assert Image.open(TRANSPARENT_SEVEN).convert("RGB").getextrema() == ((0, 0),) * 3  # its ink is in alpha only
    status, *_ = demo.predict(handle_file(str(TRANSPARENT_SEVEN)), api_name="/predict_upload")
    assert status.startswith("## Prediction: **7**"), status
    not_an_image = tmp_path / "notes.png"
    not_an_image.write_text("this is not a picture")
    status, seen, reconstruction, *_ = demo.predict(handle_file(str(not_an_image)), api_name="/predict_upload")
    assert status == "⚠️ the file is not a readable PNG, JPEG, BMP, GIF or WebP image", status
    assert seen is None and reconstruction is None


def test_the_demo_keeps_the_state_of_its_most_recent_sessions_alone(api_url):
    """Each browser session (here each gradio_client) that answers an example leaves its state in the demo;
    past CAPSNET_DEMO_SESSIONS the least recently used go, and a session asked again is answered anew."""
    demo, url = start_demo(api_url, sessions=2)
    try:
        seven = handle_file(str(next(p for p in EXAMPLES if p.name.startswith("7_"))))
        clients = [Client(url, verbose=False) for _ in range(4)]
        for client in clients:
            status, *_ = client.predict(seven, api_name="/predict_upload")
            assert status.startswith("## Prediction: **7**")
            assert len(demo.state_holder.session_data) <= 2
        assert list(demo.state_holder.session_data) == [client.session_hash for client in clients[-2:]]
        status, *_ = clients[0].predict(seven, api_name="/predict_upload")  # its state was dropped
        assert status.startswith("## Prediction: **7**")
    finally:
        demo.close()
