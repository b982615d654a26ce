"""The page: an introduction, a tab per served model and the footer, built by small functions that
return their components, and the page's CSS and script. No events here: frontend/events.py wires them
all in one place."""

from typing import NamedTuple

import gradio as gr

from frontend.pad import drawing_pad
from frontend.screen import DRAWING, UPLOAD, Screen
from frontend.sweeps import DEFAULT, SWEEPS
from frontend.tabs import Tab
from frontend.views import PICTURES, PairView
from model.contract import CAPSULE_DIM, NUM_CLASSES, PERTURB_LIMIT, PERTURB_STEP, primary_grid

CANVAS = 400  # px, square
# The drawing pad's pens (frontend.pad), radii in px of the canvas. The medium one, in hand at first, draws
# 28 px strokes: MNIST's median (contract.STROKE_MEDIAN) for a digit whose ink is 224 px tall, and within
# MNIST's range of widths (contract.STROKE_RANGE: 1/14 to 1/4 of a digit's longer side) for digits 112 to
# 392 px, so the API need not reshape them. The fine pen's 12 px strokes are within it for digits 48 to 169 px
# and the broad pen's 56 px for digits from 224 px; outside it the API brings the strokes to MNIST's median
# (a large digit's fine strokes dilated, a small digit's broad ones eroded), and a digit whose ink is under
# 100 px drawn with the broad pen is a blob, left as it is and warned about (draw it larger or with a finer
# pen). The canvas is white paper with a black pen whatever the theme, and the API reads the ink from alpha.
PENS = {"fine": 6, "medium": 14, "broad": 28}
PEN = "medium"
CSS = """
.status { min-height: 4.5em; }
.pixels img { image-rendering: pixelated; }
.pixels .image-container { padding-top: 38px; }  /* its label above it, not over the picture's top */
.upload .image-frame img { object-fit: contain; }
.figure .image-container { padding-top: 32px; }  /* its buttons (fullscreen, download) above it, not over it */
.floating .image-container {  /* the perturbed capsule kept in view beside its sliders on a narrow screen */
    position: fixed; right: 12px; bottom: 12px; width: 132px; height: 132px; padding-top: 0; z-index: 50;
    border-radius: 8px; box-shadow: 0 2px 12px rgba(0, 0, 0, 0.45); background: black;
}
.floating .image-container img { width: 100%; height: 100%; object-fit: contain; }
.floating.high .image-container { top: 12px; bottom: auto; }
.no-camera .upload button[aria-label="Capture from camera"] { display: none; }
.no-clipboard .upload button[aria-label="Paste from clipboard"] { display: none; }
"""
# The uploads' camera and clipboard work only on a secure page (localhost or https), the camera only where
# there is one; where they cannot, Gradio's buttons for them fail without a word (an untranslated key, or
# nothing), so the page hides them (CSS above), and looks again when a camera is plugged in or out.
# On a narrow screen the perturbation panel's 16 sliders stack below its picture, which the sliders further down
# scroll out of view: while any of them is in view and the picture is not, the picture floats in a corner, the
# bottom one unless the slider a person last touched is in the lower half of the screen (then the top one), so
# that it never covers the slider in use.
# A number typed into a slider's box beyond its range is set to the nearest end as it is typed, before the
# slider reads it: Gradio's server refuses such a value with an error, and the picture keeps the one before.
JS = """() => {
    document.addEventListener('input', event => {
        const box = event.target;
        if (box.type !== 'number' || box.min === '' || box.max === '') return;
        const value = Number(box.value), low = Number(box.min), high = Number(box.max);
        if (box.value !== '' && Number.isFinite(value) && (value < low || value > high)) {
            box.value = String(Math.min(Math.max(value, low), high));
        }
    }, true);
    const narrow = window.matchMedia('(max-width: 720px)');
    const inView = new Map();
    let used = null;  // the slider a person last touched
    const float = () => document.querySelectorAll('[id$="perturbed"]').forEach(picture => {
        const sliders = document.querySelectorAll(`[id^="${picture.id.slice(0, -'perturbed'.length)}dim-"]`);
        const floating = narrow.matches && !inView.get(picture) && [...sliders].some(s => inView.get(s));
        picture.classList.toggle('floating', floating);
        const box = floating && used?.isConnected ? used.getBoundingClientRect() : null;
        picture.classList.toggle('high', !!box && box.top + box.height / 2 > window.innerHeight / 2);
    });
    const touched = event => {
        const slider = event.target.closest?.('[id*="dim-"]');
        if (slider) { used = slider; float(); }
    };
    document.addEventListener('focusin', touched);
    document.addEventListener('pointerdown', touched);
    window.addEventListener('scroll', () => { if (narrow.matches) requestAnimationFrame(float); }, {passive: true});
    const watcher = new IntersectionObserver(entries => {
        entries.forEach(entry => inView.set(entry.target, entry.isIntersecting));
        float();
    });
    const watch = () => document.querySelectorAll('[id$="perturbed"], [id*="dim-"]').forEach(e => watcher.observe(e));
    watch();
    new MutationObserver(watch).observe(document.body, {childList: true, subtree: true});  // tabs drawn later
    narrow.addEventListener('change', float);
    const media = navigator.mediaDevices;
    const secure = window.isSecureContext;
    const look = async () => {
        const devices = secure && media ? await media.enumerateDevices().catch(() => null) : [];
        if (devices === null) return;  // no answer about the devices: the buttons stay
        document.body.classList.toggle('no-camera', !devices.some(d => d.kind === 'videoinput'));
        document.body.classList.toggle('no-clipboard', !(secure && navigator.clipboard?.read));
    };
    look();
    media?.addEventListener('devicechange', look);
}"""


def intro(tabs: list[Tab]) -> str:
    """The page's introduction: the capsules, then each tab's model and what it reads."""
    models = " ".join(f"**{tab.title}** (`{tab.model}`): {tab.task}{tab.look.about}." for tab in tabs)
    return f"""# CapsNet: draw or upload, watch the capsules
Each of the {NUM_CLASSES} class capsules is a {CAPSULE_DIM}-D vector; its **length** says whether that
class is present and its **direction** says how it is drawn. The decoder redraws the input from the
winning capsule alone. Move the sliders to change one dimension at a time, as in section 5.1 of
[Dynamic Routing Between Capsules](https://arxiv.org/abs/1710.09829).

{models}
"""


def picture(label: str, elem_id: str) -> gr.Image:
    """A model-sized image (input, reconstruction), shown crisp."""
    return gr.Image(label=label, format="png", height=200, buttons=[], elem_id=elem_id, elem_classes="pixels")


TAB_LABELS = {DRAWING: "Draw", UPLOAD: "Upload"}  # the input tabs, as the Tabs' select names them


def upload_tab_id(tab: Tab) -> str:
    return f"{tab.prefix}upload-tab"


class Inputs(NamedTuple):
    """A tab's inputs: the drawing pad and its Predict button in a Draw tab, beside an Upload tab (tabs with
    a pad), the upload, and the examples below."""

    pad: gr.HTML | None
    button: gr.Button | None
    tabs: gr.Tabs | None  # Draw and Upload
    upload: gr.Image
    examples: gr.Dataset


def inputs(tab: Tab) -> Inputs:
    look, p = tab.look, tab.prefix
    upload = gr.Image(
        type="filepath",  # what its API page says the value is; its events take it unopened (handlers.answer_upload)
        sources=["upload", "webcam", "clipboard"],
        # a camera facing the person shows their paper as it is: mirrored (Gradio's default for a selfie) a digit
        # would be read backwards; on a phone, the camera on its back, which faces the paper. No size is asked
        # for: the browser's default (640x480 in Chromium) is plenty for a digit, and its PNG far below the
        # API's body limit, which a noisy full-HD frame could pass
        webcam_options=gr.WebcamOptions(mirror=False, constraints={"video": {"facingMode": {"ideal": "environment"}}}),
        label=f"An image of {look.subject}",
        height=360,
        elem_id=f"{p}upload",
        elem_classes="upload",  # an image smaller than the box is scaled up to fill it (CSS)
        render=False,
    )
    pad = button = tabs = None
    if look.canvas:
        with gr.Tabs(elem_id=f"{p}inputs") as tabs:
            with gr.Tab(TAB_LABELS[DRAWING], id=f"{p}draw"):
                pad = drawing_pad(f"Draw {look.subject}", f"{p}sketch", CANVAS, PENS, PEN)
                button = gr.Button("Predict", variant="primary")
            with gr.Tab(TAB_LABELS[UPLOAD], id=upload_tab_id(tab)):
                upload.render()
    else:
        upload.render()
    # A dataset rather than gr.Examples: a click is one event that shows the example and answers it
    # (gr.Examples loads the example in one event and the upload's change answers in a second).
    examples = gr.Dataset(
        components=[upload],
        samples=[[str(path)] for path in look.examples],
        type="index",
        label=look.examples_label,
        elem_id=f"{p}examples",
    )
    return Inputs(pad, button, tabs, upload, examples)


def answer_column(tab: Tab) -> tuple[gr.Markdown, dict[str, gr.Image], gr.Image]:
    """The status, the view's pictures two to a row (by the view's field), and the capsule lengths."""
    status = gr.Markdown(tab.look.prompt, elem_id=f"{tab.prefix}status", elem_classes="status")
    pictures: dict[str, gr.Image] = {}
    shown = PICTURES[tab.view]
    for row in range(0, len(shown), 2):
        with gr.Row():
            pictures |= {field: picture(label, f"{tab.prefix}{name}") for field, label, name in shown[row : row + 2]}
    lengths = gr.Image(  # its title is drawn above the bars, where Gradio's label would cover the longest one
        label="Capsule lengths", format="png", show_label=False, buttons=[], elem_id=f"{tab.prefix}lengths"
    )
    return status, pictures, lengths


class RoutingColumn(NamedTuple):
    """The routing maps of the answer and the routing iteration they show (Procedure 1)."""

    maps: gr.Image
    iteration: gr.Slider  # r = 1 .. R; R, the final coupling, by default
    change: gr.Markdown  # how much iteration r changed the logits and the couplings (Fig. A.1)


def routing_column(tab: Tab) -> RoutingColumn:
    grid, noun = primary_grid(tab.size), tab.look.noun
    first = "The predicted digits come first." if tab.view is PairView else f"The predicted {noun} comes first."
    gr.Markdown(
        f"### Routing\nWhere the votes went: for each {noun}, the {grid}x{grid} PrimaryCaps grid weighted by the "
        "coupling c<sub>ij</sub> and the vote length ‖û<sub>j|i</sub>‖, on one square-root scale for every "
        "class and iteration. " + first + " Step through the routing iterations: at r = 1 every child sends 1/10 "
        "of its vote to each class; agreement then moves the couplings to the classes whose output the vote "
        "agrees with (Procedure 1), most of all those of a few children."
    )
    maps = gr.Image(
        label="Routing maps",
        format="png",
        show_label=False,
        buttons=["fullscreen"],
        elem_id=f"{tab.prefix}routing",
        elem_classes="figure",
    )
    iteration = gr.Slider(
        1, 3, value=3, step=1, label="Routing iteration r", visible=False, elem_id=f"{tab.prefix}iteration"
    )
    change = gr.Markdown(elem_id=f"{tab.prefix}iteration-change")
    return RoutingColumn(maps, iteration, change)


class Panel(NamedTuple):
    """The perturbation panel: the capsule to perturb, a delta per dimension, and what they redraw."""

    digit: gr.Radio  # the capsule to perturb, named by the model's classes
    reset: gr.Button
    sliders: list[gr.Slider]  # one delta per dimension
    perturbed: gr.Image
    grid: gr.Image  # Fig. 4


def perturbation_panel(tab: Tab) -> Panel:
    """The chosen capsule, its 16 sliders, a reset, the perturbed drawing and the Fig. 4 grid."""
    p, noun = tab.prefix, tab.look.noun
    with gr.Row(equal_height=False):
        with gr.Column(scale=5, min_width=360):
            gr.Markdown(
                f"### Perturb the capsule\nEach slider adds a delta to one of the {CAPSULE_DIM} dimensions of the "
                f"chosen {noun} capsule; the decoder redraws it as you move it."
            )
            with gr.Row():
                with gr.Column(min_width=200):
                    digit = gr.Radio(
                        choices=[(name, j) for j, name in enumerate(tab.classes)],
                        label=f"Decode the capsule of {noun}",
                        info=tab.look.pick_info,
                        elem_id=f"{p}capsule",
                    )
                    reset = gr.Button("Reset sliders")
                perturbed = picture("Perturbed", f"{p}perturbed")
            sliders = []
            with gr.Row():
                for column in range(2):
                    with gr.Column(min_width=200):
                        for k in range(column * CAPSULE_DIM // 2, (column + 1) * CAPSULE_DIM // 2):
                            sliders.append(
                                gr.Slider(
                                    -PERTURB_LIMIT,
                                    PERTURB_LIMIT,
                                    value=0.0,
                                    step=PERTURB_STEP,
                                    label=f"dim {k}",
                                    elem_id=f"{p}dim-{k}",
                                )
                            )
        with gr.Column(scale=4, min_width=360):
            gr.Markdown(
                "### Fig. 4: every dimension at once\nRow d adds −0.25 … +0.25 (steps of 0.05) to dimension d "
                "of the chosen capsule, as in the paper's Fig. 4."
            )
            grid = gr.Image(
                label="Dimension perturbations",
                format="png",
                show_label=False,
                buttons=["fullscreen", "download"],
                elem_id=f"{p}grid",
                elem_classes="figure",
            )
    return Panel(digit, reset, sliders, perturbed, grid)


class TransformPanel(NamedTuple):
    """Transform the answer's input along a sweep and watch its capsule (POST /explain), beside the partner's."""

    accordion: gr.Accordion
    transform: gr.Radio
    value: gr.Slider
    status: gr.Markdown
    pictures: dict[str, gr.Image]  # input, drawn (and partner_input, partner_drawn)
    lengths: gr.Image
    dimensions: gr.Image
    sweep: gr.State  # the Sweep on screen (frontend.sweeps), None before one
    open: gr.State  # whether the accordion is open: only then does a new answer get swept

    @property
    def outputs(self) -> dict[str, gr.components.Component]:
        """The component of each field of sweeps.shown."""
        return {"status": self.status, **self.pictures, "lengths": self.lengths, "dimensions": self.dimensions}


def slider_of(transform: str, label: str = "") -> gr.Slider:
    spec = SWEEPS[transform]
    return gr.Slider(
        spec.start, spec.stop, value=spec.identity, step=spec.step, label=label or f"{spec.label} ({spec.unit.strip()})"
    )


def transform_panel(tab: Tab) -> TransformPanel:
    """A transform to pick, a slider along its sweep, the transformed input and its capsule's drawing (the
    partner's beside), the class lengths and the 16 dimensions along the sweep."""
    p, noun = tab.prefix, tab.look.noun
    beside = f" and `{tab.partner.model}` beside it" if tab.partner else ""
    with gr.Accordion("Transform the input: equivariance", open=False, elem_id=f"{p}transform") as accordion:
        gr.Markdown(
            f"Turn, scale, slant, move or thicken the input the model saw and watch the {noun} capsule: its "
            "**length** should hold (the answer stays), while some of its **16 dimensions** follow the change "
            f"smoothly (section 5.1: the direction says how it is drawn). Every step is read by `{tab.model}`"
            f"{beside} in one batch; the slider moves along the sweep."
        )
        with gr.Row():
            transform = gr.Radio(
                [(spec.label, name) for name, spec in SWEEPS.items()],
                value=DEFAULT,
                label="Transform",
                elem_id=f"{p}transform-kind",
            )
            value = slider_of(DEFAULT)
            value.elem_id = f"{p}transform-value"
        status = gr.Markdown(elem_id=f"{p}transform-status")
        pictures: dict[str, gr.Image] = {}
        with gr.Row(equal_height=False):
            shown = [("input", f"{tab.model}: input"), ("drawn", f"{tab.model}: from the capsule")]
            if tab.partner:
                shown += [
                    ("partner_input", f"{tab.partner.model}: input"),
                    ("partner_drawn", f"{tab.partner.model}: from the capsule"),
                ]
            for field, label in shown:
                pictures[field] = gr.Image(
                    label=label,
                    format="png",
                    height=150,
                    buttons=[],
                    elem_id=f"{p}transform-{field}",
                    elem_classes="pixels",
                )
        with gr.Row(equal_height=False):
            with gr.Column():
                gr.Markdown("**Capsule lengths along the sweep**: the followed class in colour, the others grey")
                lengths = gr.Image(
                    label="Capsule lengths along the sweep",
                    show_label=False,
                    format="png",
                    buttons=[],
                    elem_id=f"{p}transform-lengths",
                )
            with gr.Column():
                gr.Markdown(f"**The {noun} capsule's 16 dimensions along the sweep**: the 4 that move most in colour")
                dimensions = gr.Image(
                    label="The capsule's 16 dimensions along the sweep",
                    show_label=False,
                    format="png",
                    buttons=["fullscreen"],
                    elem_id=f"{p}transform-dimensions",
                    elem_classes="figure",
                )
    return TransformPanel(
        accordion, transform, value, status, pictures, lengths, dimensions, gr.State(None), gr.State(False)
    )


class TabUI(NamedTuple):
    """One model's tab on the page: its Tab, its components and its per-session state."""

    tab: Tab
    page: gr.Tab
    inputs: Inputs
    status: gr.Markdown
    pictures: dict[str, gr.Image]  # by the view's field: input, reconstruction (or overlay, first, second)
    lengths: gr.Image
    routing: RoutingColumn
    panel: Panel
    transform: TransformPanel
    footer: gr.Markdown  # the page's, below every tab: the model of the tab in view
    capsules: gr.State  # of the answer on screen, for the perturbation panel
    screen: gr.State  # Screen: which input is on screen and which prediction started last

    @property
    def outputs(self) -> dict[str, gr.components.Component]:
        """The component of each field of the tab's view (views.updates)."""
        return {
            "status": self.status,
            **self.pictures,
            "lengths": self.lengths,
            "capsules": self.capsules,
            "digit": self.panel.digit,
            "footer": self.footer,
        }


def model_tab(tab: Tab, footer: gr.Markdown) -> TabUI:
    """One model's tab: inputs, the answer, the routing and the perturbation panel."""
    with gr.Tab(tab.title, id=tab.model) as page:
        with gr.Row(equal_height=False):
            with gr.Column(scale=4, min_width=360):
                shown_inputs = inputs(tab)
            with gr.Column(scale=5, min_width=360):
                status, pictures, lengths = answer_column(tab)
            with gr.Column(scale=4, min_width=360, elem_id=f"{tab.prefix}routing-column"):
                routing = routing_column(tab)
        panel = perturbation_panel(tab)
        transform = transform_panel(tab)
        # Inside the tab: a child of gr.Tabs that is not a gr.Tab (a State too) made the page add a second
        # header for a tab when it was first selected, or show one tab's header twice and another's not at all.
        states = gr.State(None), gr.State(Screen(DRAWING if tab.look.canvas else UPLOAD))
    return TabUI(tab, page, shown_inputs, status, pictures, lengths, routing, panel, transform, footer, *states)


class Page(NamedTuple):
    tabs: list[TabUI]
    footer: gr.Markdown


def page(tabs: list[Tab]) -> Page:
    """The introduction, a tab per model, and the footer below them (inside a gr.Blocks)."""
    gr.Markdown(intro(tabs))
    footer = gr.Markdown(elem_id="footer", render=False)  # the model of the tab in view, below every tab
    with gr.Tabs(overflow_behavior="wrap", elem_id="models"):  # every model's tab in view, a phone's too
        uis = [model_tab(tab, footer) for tab in tabs]
    footer.render()
    return Page(uis, footer)
