"""The launched demo answers over its own HTTP API, as gradio_client sees it."""
from gradio_client import Client, handle_file

from frontend.tabs import EXAMPLES


def test_the_demo_answers_through_gradio_client(demo_url):
    demo = Client(demo_url, verbose=False)
    seven = next(p for p in EXAMPLES if p.name.startswith("7_"))
    status, seen, reconstruction, lengths, digit, footer = demo.predict(  # the routing maps follow in their own step
        handle_file(str(seven)), api_name="/predict_upload"
    )
    assert status.startswith("## Prediction: **7**") and digit == 7
    assert all(path for path in (seen, reconstruction, lengths))
    assert "version" in footer
    assert "version" in demo.predict(api_name="/model")
