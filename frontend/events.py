"""Every event of the page, wired in one place: what starts a prediction, what follows an answer, what
the perturbation panel redraws. Read `wire` top to bottom; the handlers are in frontend/handlers.py.

Every answer is one event, and its follow-up (routing maps, perturbed capsule, Fig. 4, the sliders' names)
a second that waits until the browser has drawn the answer: Gradio's page does work for every event, with or
without a progress status, and each one more while it draws an answer delays it (an example's click: 268 ms
with none, 476 with two more, in one run on a 2-core machine). tests/frontend/test_frontend_browser.py
counts them.
"""

from functools import partial
from typing import Any

import gradio as gr

from frontend import handlers
from frontend.client import ApiClient
from frontend.layout import Page, TabUI
from frontend.screen import DRAWING, UPLOAD, gated

LIVE: dict[str, Any] = dict(
    trigger_mode="always_last", show_progress="minimal"
)  # while one call runs, only the last new one waits
PRIVATE: dict[str, Any] = dict(api_visibility="private")
RAW: dict[str, Any] = dict(preprocess=False)  # an upload's file reaches its handler unopened (handlers.answer_upload)
# What follows an answer (its routing maps, the perturbed capsule and Fig. 4) waits until the browser has
# drawn the answer, so that neither its work on the server nor the page's own for a new event takes the
# CPU the browser needs to show it. The wait is in the browser, before the event is sent: a frame for the
# new outputs, their images loaded, another frame (at most a second).
AFTER_PAINT = """(...inputs) => new Promise(resolve => requestAnimationFrame(() => {
    const go = () => resolve(inputs);
    const loading = [...document.images].filter(image => !image.complete).map(image => new Promise(loaded => {
        image.addEventListener('load', loaded, {once: true});
        image.addEventListener('error', loaded, {once: true});
    }));
    Promise.all(loading).then(() => requestAnimationFrame(() => setTimeout(go)));
    setTimeout(go, 1000);
}))"""


def wire(demo: gr.Blocks, client: ApiClient, page: Page) -> None:
    """Connect every component's events: the page's load (the footer names the first tab's model), then
    each tab's."""
    demo.load(partial(handlers.show_footer, client, page.tabs[0]), None, page.footer, api_name="model")
    for ui in page.tabs:
        wire_tab(client, ui)


def wire_tab(client: ApiClient, ui: TabUI) -> None:
    """One model's tab: its answers, their follow-up, the perturbation panel and the footer."""
    inputs, panel, transform, api = ui.inputs, ui.panel, ui.transform, ui.tab.prefix.replace("-", "_")
    answers = list(ui.outputs.values())
    swept = [transform.sweep, transform.value, *transform.outputs.values()]
    follow: dict[str, Any] = dict(
        fn=partial(handlers.follow_up, client, ui),
        inputs=[ui.screen, transform.open, transform.transform, *panel.sliders],
        outputs=[*ui.routing, panel.perturbed, panel.grid, *panel.sliders, *swept],
        show_progress="hidden",
        js=AFTER_PAINT,
    )
    drawn, uploaded = partial(handlers.answer_drawing, client, ui), partial(handlers.answer_upload, client, ui)
    ask = partial(handlers.ask, ui)
    pad, button, tabs = inputs.pad, inputs.button, inputs.tabs
    if pad is not None and button is not None and tabs is not None:  # a Draw tab
        # A stroke's end (the pad's .input) and the Predict click are one event, so the browser runs them in
        # turn: a click during a stroke's prediction waits and then reads the canvas as it is by then.
        gr.on(
            [pad.input, button.click],
            gated(drawn, DRAWING),
            [ui.screen, pad],
            answers,
            **LIVE,
            api_name=f"{api}predict_drawing",
        ).then(**follow)
        pad.clear(gated(ask, DRAWING, switch=True), [ui.screen], answers, **PRIVATE).then(**follow)
        # The tab a person clicks answers: Draw reads the drawing (or asks for one), Upload the image. The Tabs'
        # select, which only a click sends: each Tab's own comes also when an answer (an example's) brings the
        # Upload tab into view, two more events for the page to work through while it draws that answer.
        tabs.select(
            handlers.answer_tab(client, ui), [ui.screen, pad, inputs.upload], answers, **LIVE, **RAW, **PRIVATE
        ).then(**follow)
    # An upload (a file or the clipboard), a cleared upload and an example: each is one event that answers.
    inputs.upload.upload(
        gated(uploaded, UPLOAD, switch=True),
        [ui.screen, inputs.upload],
        answers,
        **LIVE,
        **RAW,
        api_name=f"{api}predict_upload",
    ).then(**follow)
    # A cleared upload asks again without reading the upload: after an example, its clear event can still
    # carry the example's file.
    inputs.upload.clear(gated(ask, UPLOAD, switch=True), [ui.screen], answers, **LIVE, **PRIVATE).then(**follow)
    shows_example = [inputs.tabs, inputs.upload] if inputs.tabs is not None else [inputs.upload]
    inputs.examples.click(
        gated(partial(handlers.answer_example, client, ui), UPLOAD, switch=True),
        [ui.screen, inputs.examples],
        [*shows_example, *answers],
        **LIVE,
        **PRIVATE,
    ).then(**follow)

    # The perturbation panel: a capsule picked or a slider moved (dragged, stepped with the keys, typed) redraws;
    # a new answer's follow-up does too.
    redraw: dict[str, Any] = dict(
        fn=partial(handlers.redraw, client, ui),
        inputs=[ui.capsules, panel.digit, *panel.sliders],
        outputs=panel.perturbed,
    )
    regrid: dict[str, Any] = dict(
        fn=partial(handlers.regrid, client, ui),
        inputs=[ui.capsules, panel.digit],
        outputs=[panel.grid, *panel.sliders],
        show_progress_on=panel.grid,  # the sliders only take new names
    )
    panel.digit.input(**redraw, **LIVE).then(**regrid)
    gr.on([slider.input for slider in panel.sliders], **redraw, **LIVE, api_name=f"{api}perturb")
    panel.reset.click(partial(handlers.reset_sliders, ui), None, panel.sliders, **PRIVATE).then(**redraw)

    # Routing, iteration by iteration: the answer on screen has every iteration's maps.
    routing = ui.routing
    routing.iteration.input(
        partial(handlers.show_iteration, ui),
        [ui.screen, routing.iteration],
        [routing.maps, routing.change],
        **LIVE,
        **PRIVATE,
    )

    # The Transform panel: opened, it sweeps the answer on screen (and each new one, in the follow-up); a
    # transform or a capsule picked sweeps again; the slider only redraws from the sweep it has.
    transform.accordion.expand(
        partial(handlers.open_transform, client, ui),
        [ui.screen, transform.transform, panel.digit],
        [transform.open, *swept],
        **LIVE,
        **PRIVATE,
    )
    transform.accordion.collapse(partial(handlers.close_transform, ui), None, transform.open, **PRIVATE)
    gr.on(
        [transform.transform.input, panel.digit.input],
        partial(handlers.choose_sweep, client, ui),
        [ui.screen, transform.open, transform.transform, panel.digit],
        swept,
        **LIVE,
        api_name=f"{api}sweep",
    )
    transform.value.input(
        partial(handlers.slide, ui),
        [transform.sweep, transform.value],
        list(transform.outputs.values()),
        **LIVE,
        **PRIVATE,
    )

    ui.page.select(partial(handlers.show_footer, client, ui), None, ui.footer, show_progress="hidden", **PRIVATE)
