"""The CapsNet demo: a tab per served model; draw or upload, see the capsules and the routing, perturb the
16 dimensions.

A Gradio app that asks the API over HTTP (it imports neither app/ nor torch) and lets a person
explore the models the way sections 5.1 and 6 and Figs. 4 and 5 of the paper (Sabour, Frosst & Hinton
2017, "Dynamic Routing Between Capsules", https://arxiv.org/abs/1710.09829) do. At start it asks the API
which models it serves (GET /models) and builds a tab for each, shaped by what the model reads:

- a digit (mnist, affine): draw, upload or pick an MNIST digit; its capsule lengths, reconstruction and
  routing maps.
- two digits (multimnist): draw two overlapping digits or pick a generated MultiMNIST pair; both
  digits named, each redrawn from its own capsule, in red and green over the input (Fig. 5).
- a garment (fashion-mnist): upload or pick a garment; its class, capsules and reconstruction.

Every tab perturbs any capsule's 16 dimensions with sliders and draws the paper's Fig. 4 grid.

$ python -m app                 # the API, http://localhost:8000
$ python -m frontend            # the demo, http://127.0.0.1:7860
$ CAPSNET_DEMO_API_URL=http://api:8000 CAPSNET_DEMO_HOST=0.0.0.0 python -m frontend

The rooms: settings.py (CAPSNET_DEMO_*), client.py (the API over HTTP), tabs.py (a tab per served model),
views.py (what an answer shows), screen.py (which answer may show), layout.py (the components),
handlers.py (what an event does), events.py (which event does it), plots.py and pad.py.
"""

import gc
import logging

import gradio as gr

from frontend import events, layout
from frontend.client import ApiClient, ApiError, served_models
from frontend.settings import DemoSettings, get_settings
from frontend.tabs import Tab, tabs_from


def build_demo(client: ApiClient, tabs: list[Tab]) -> gr.Blocks:
    """The page for `tabs` (tabs_from(GET /models)), every event wired to `client`."""
    with gr.Blocks(title="CapsNet demo", analytics_enabled=False) as demo:
        page = layout.page(tabs)
        events.wire(demo, client, page)
    return demo


def launch(settings: DemoSettings, block: bool = True, **kwargs) -> gr.Blocks:
    """Ask the API for its models, build their tabs and serve the demo on settings.host:settings.port, then
    serve until stopped (`block`) or return at once (kwargs go to Blocks.launch)."""
    client = ApiClient(settings.api_url, settings.timeout_s, public_url=settings.public_api_url)
    tabs = tabs_from(served_models(client, settings.wait_s))
    demo = build_demo(client, tabs).queue(default_concurrency_limit=8)  # handlers wait on HTTP, not the CPU
    demo.launch(
        server_name=settings.host,
        server_port=settings.port,
        theme=gr.themes.Soft(primary_hue="orange"),
        css=layout.CSS,
        js=layout.JS,
        footer_links=["api"],
        state_session_capacity=settings.sessions,
        prevent_thread_lock=True,
        **kwargs,
    )
    # What the demo holds once serving (Gradio, its server, its components, the libraries: some 200,000
    # objects) leaves the garbage collector's generations: a full collection walks only what the events made
    # since, not all of them (100-175 ms in which the demo would answer no one)
    gc.collect()
    gc.freeze()
    if block:
        demo.block_thread()
    return demo


def main() -> None:
    logging.basicConfig(format="%(name)s: %(message)s")
    logging.getLogger("frontend").setLevel(logging.INFO)
    try:
        launch(get_settings())
    except ApiError as error:  # no API to build the tabs from: say so in one line
        raise SystemExit(f"frontend: {error}") from None
