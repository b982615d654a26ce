"""A person in a browser: headless Chromium opens the demo, draws a stroke with the mouse, sees a
prediction and the image the model saw, moves a slider and sees the perturbed reconstruction change;
then picks a pair example in the Two digits tab, a garment in the Fashion tab and a digit in the affine
model's tab and sees them named; on a phone's touch screen, finds every model's tab and draws with a
finger. Screenshots are saved.

Uses Debian's chromium (/usr/bin/chromium) through Playwright, never Playwright's own browsers.
CAPSNET_SCREENSHOT=1 also writes the docs' screenshots: the Digit tab's to docs/demo.png (the README shows
it), the Transform panel's to docs/demo_transform.png, the routing column at its first and last iteration
to docs/demo_routing.png and the Two digits tab's to docs/demo_pairs.png.
"""

import io
import itertools
import os
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from frontend.tabs import EXAMPLES, FASHION_EXAMPLES, PAIR_EXAMPLES
from model.contract import AFFINE_SIZE, IMAGE_SIZE, MULTIMNIST_SIZE
from tests.harness import REAL_WORLD, REPO, TRANSPARENT_SEVEN

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
TIMEOUT_MS = 30_000
DOCS = REPO / "docs"

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: `apt-get install chromium` to run the browser test (CI does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS, timeout=TIMEOUT_MS)
        yield browser
        browser.close()


def new_page(browser):
    """A page of its own browser context, on a desktop screen."""
    page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
    page.set_default_timeout(TIMEOUT_MS)
    return page


@pytest.fixture
def page(browser):
    """A new page (a new browser context) for each test: one page driven through several tests got slower
    with each (a stroke's answer 194 -> 349 -> 406 ms over three tests, the same tests 217 ms in a new one)."""
    page = new_page(browser)
    yield page
    page.context.close()


def stroke(page, points: list[tuple[float, float]]) -> None:
    page.mouse.move(*points[0])
    page.mouse.down()
    for point in points[1:]:
        page.mouse.move(*point, steps=12)
    page.mouse.up()


def screenshot(page, path: Path, part=None) -> None:
    """The whole page (or the locator `part` of it) to `path`; with CAPSNET_SCREENSHOT=1 also to docs/ under
    the same name."""
    if part is None:
        page.screenshot(path=path, full_page=True)
    else:
        part.screenshot(path=path)
    keep(path)


def side_by_side(shots: list[bytes], path: Path, gap: int = 20) -> None:
    """PNG screenshots in a row on white, to `path` (and docs/, as screenshot())."""
    pictures = [Image.open(io.BytesIO(shot)).convert("RGB") for shot in shots]
    row = Image.new(
        "RGB", (sum(p.width for p in pictures) + gap * (len(pictures) - 1), max(p.height for p in pictures)), "white"
    )
    for k, picture in enumerate(pictures):
        row.paste(picture, (sum(p.width + gap for p in pictures[:k]), 0))
    row.save(path)
    keep(path)


def keep(path: Path) -> None:
    """A screenshot written to `path` is one (not a blank page), and with CAPSNET_SCREENSHOT=1 goes to docs/."""
    assert path.stat().st_size > 10_000
    if os.environ.get("CAPSNET_SCREENSHOT"):
        DOCS.mkdir(exist_ok=True)
        shutil.copyfile(path, DOCS / path.name)


def open_demo(page, url: str) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)  # its default is 5 s, short on a busy 2-core CI machine
    page.goto(url)
    expect(page.locator("#footer")).to_contain_text("version")


def clear_pad(page, prefix: str = "") -> None:
    """Click the drawing pad's Clear, as a person would if anything is drawn (it is disabled if not)."""
    button = page.locator(f"#{prefix}sketch button[aria-label='Clear canvas']")
    if button.is_enabled():
        button.click()


def pick_example(page, tab: str, prefix: str, path: Path) -> None:
    """Switch to the tab and click the example whose file is `path`."""
    page.get_by_role("tab", name=tab, exact=True).click()
    page.locator(f"#{prefix}examples img[src$='{path.name}']").click()


# The model input as the browser decoded it: its side in pixels and the share of it that is ink (the model
# sees a white object on black).
SEEN = """(img) => {
    const canvas = document.createElement('canvas');
    [canvas.width, canvas.height] = [img.naturalWidth, img.naturalHeight];
    const context = canvas.getContext('2d');
    context.drawImage(img, 0, 0);
    const pixels = context.getImageData(0, 0, canvas.width, canvas.height).data;
    let ink = 0;
    for (let i = 0; i < pixels.length; i += 4) ink += pixels[i] + pixels[i + 1] + pixels[i + 2] > 3 * 128;
    return [canvas.width, canvas.height, ink / (canvas.width * canvas.height)];
}"""


def shows_model_input(page, prefix: str, size: int) -> None:
    """The tab shows the image its model saw: at the model's input size (8 screen pixels each), loaded, not
    blank and not all ink."""
    from playwright.sync_api import expect

    seen = page.locator(f"#{prefix}seen img")
    expect(seen).to_be_visible()
    page.wait_for_function("(img) => img.complete && img.naturalWidth > 0", arg=seen.element_handle())
    width, height, ink = seen.evaluate(SEEN)
    assert (width, height) == (8 * size, 8 * size)
    assert 0.02 < ink < 0.6, f"the model input on screen is {ink:.1%} ink"


def fills_its_box(page, prefix: str) -> None:
    """The upload shows the picked example (a small image, black paper) scaled up to its box, not at its own
    few pixels in the middle of the page's light background."""
    shown = page.locator(f"#{prefix}upload img")
    page.wait_for_function("(img) => img.complete && img.naturalWidth > 0", arg=shown.element_handle())
    natural, box = shown.evaluate("(img) => [img.naturalWidth, Math.min(img.clientWidth, img.clientHeight)]")
    assert natural < box / 4  # small enough to show at its own size
    paper = np.asarray(Image.open(io.BytesIO(shown.screenshot())).convert("L")) < 64  # the example's black paper
    rows, columns = np.flatnonzero(paper.any(axis=1)), np.flatnonzero(paper.any(axis=0))
    side = min(rows[-1] - rows[0], columns[-1] - columns[0]) + 1
    assert side > 0.8 * box, f"the example shows {side} px a side in a box of {box}"


def buttons_clear_of_picture(page, elem_id: str) -> None:
    """The figure's buttons (fullscreen, download) sit above its picture, not over a corner of it (where Fig. 4
    has its +0.25 column and the dimension charts a label)."""
    figure = page.locator(f"#{elem_id}")
    figure.scroll_into_view_if_needed()
    picture, buttons = figure.locator("img").bounding_box(), figure.locator("button[aria-label]").all()
    assert buttons, f"{elem_id} has no buttons"
    for button in buttons:
        box, name = button.bounding_box(), button.get_attribute("aria-label")
        assert box["y"] + box["height"] <= picture["y"], f"{elem_id}: its {name} button is over it"


def labels_clear_of_pictures(page, prefix: str, names: tuple[str, ...]) -> None:
    """Each picture's label sits above it on one line, not over the picture's top (where a digit's top is)."""
    for name in names:
        block = page.locator(f"#{prefix}{name}")
        picture, label = block.locator("img").bounding_box(), block.locator("[data-testid='block-label']")
        box = label.bounding_box()
        assert box["y"] + box["height"] <= picture["y"] + 1, f"{prefix}{name}: its label is over its picture"
        assert box["height"] < 40, f"{prefix}{name}: its label takes more than a line"


def test_draw_predict_perturb_and_screenshot(page, made_demo_url, tmp_path):
    from playwright.sync_api import expect

    open_demo(page, made_demo_url)

    box = page.locator("#sketch canvas").first.bounding_box()  # the drawing area sits in its middle
    cx, cy, r = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2, min(box["width"], box["height"]) / 2
    stroke(page, [(cx - 0.45 * r, cy - 0.6 * r), (cx + 0.4 * r, cy - 0.6 * r), (cx - 0.1 * r, cy + 0.7 * r)])  # a 7
    expect(page.locator("#status")).to_contain_text(re.compile(r"Prediction: \*?\*?7"))
    shows_model_input(page, "", IMAGE_SIZE)

    perturbed = page.locator("#perturbed img")
    expect(perturbed).to_be_visible()
    before = perturbed.get_attribute("src")
    # each slider says what its dimension of the 7 capsule does (the card's words, GET /models)
    expect(page.locator("#dim-0")).to_contain_text(re.compile(r"dim 0: \w"))
    slider = page.locator("#dim-0 input[type=range]")
    slider.scroll_into_view_if_needed()
    track = slider.bounding_box()
    stroke(
        page,
        [
            (track["x"] + track["width"] / 2, track["y"] + track["height"] / 2),
            (track["x"] + track["width"] - 2, track["y"] + track["height"] / 2),
        ],
    )
    expect(page.locator("#dim-0 input[type=number]")).to_have_value("0.25")
    expect(perturbed).not_to_have_attribute("src", before)
    labels_clear_of_pictures(page, "", ("seen", "reconstruction", "perturbed"))
    page.locator("#dim-15").scroll_into_view_if_needed()  # a desktop's screen: nothing floats
    expect(page.locator("#perturbed")).not_to_have_class(re.compile(r"\bfloating\b"))
    # stepped with the keys, the perturbed capsule is redrawn too
    dragged = perturbed.get_attribute("src")
    page.locator("#dim-1 input[type=range]").focus()
    for _ in range(2):
        page.keyboard.press("ArrowRight")
    expect(page.locator("#dim-1 input[type=number]")).to_have_value("0.1")
    expect(perturbed).not_to_have_attribute("src", dragged)
    # a number typed beyond the range is read at its end, which the box shows, and drawn there: no error
    stepped = perturbed.get_attribute("src")
    typed = page.locator("#dim-2 input[type=number]")
    typed.fill("0.5")
    typed.press("Tab")
    expect(typed).to_have_value("0.25")
    expect(perturbed).not_to_have_attribute("src", stepped)
    expect(page.get_by_text("Error", exact=True)).to_have_count(0)
    expect(page.get_by_text("greater than maximum")).to_have_count(0)
    expect(page.locator("#grid img")).to_be_visible()
    for figure in ("routing", "grid"):
        buttons_clear_of_picture(page, figure)
    # another capsule picked: the sliders say what its dimensions do; the 7's again, their words again
    named = page.locator("#dim-0 [data-testid='block-info']")
    sevens = named.inner_text()
    page.locator("#capsule").get_by_label("3", exact=True).check()
    expect(named).not_to_have_text(sevens)
    expect(named).to_have_text(re.compile(r"dim 0: \w"))
    page.locator("#capsule").get_by_label("7", exact=True).check()
    expect(named).to_have_text(sevens)

    screenshot(page, tmp_path / "demo.png")


def test_transform_a_drawn_digit_and_watch_its_capsule(page, made_demo_url, tmp_path):
    """A person draws a 7 in two strokes, opens the Transform panel, sees the sweep read by mnist and
    affine, slides to 30 degrees (the turned input and the words follow), picks Scale, then draws a new
    digit with the panel open and sees it swept."""
    from playwright.sync_api import expect

    open_demo(page, made_demo_url)
    box = page.locator("#sketch canvas").first.bounding_box()
    cx, cy, r = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2, min(box["width"], box["height"]) / 2
    stroke(page, [(cx - 0.45 * r, cy - 0.6 * r), (cx + 0.4 * r, cy - 0.6 * r)])  # a 7: the bar, then the stem
    stroke(page, [(cx + 0.4 * r, cy - 0.6 * r), (cx - 0.1 * r, cy + 0.7 * r)])
    expect(page.locator("#status")).to_contain_text(re.compile(r"Prediction: \*?\*?7"))

    page.locator("#transform").get_by_text("Transform the input").click()
    status = page.locator("#transform-status")
    expect(status).to_contain_text("Rotate 0°, following the 7 capsule")
    expect(status).to_contain_text("mnist reads 7")
    expect(status).to_contain_text("affine reads")
    turned = page.locator("#transform-input img")
    before = turned.get_attribute("src")
    slider = page.locator("#transform-value input[type=range]")
    slider.focus()
    for _ in range(6):  # 5 degrees a step
        page.keyboard.press("ArrowRight")
    expect(status).to_contain_text("Rotate 30°")
    expect(turned).not_to_have_attribute("src", before)
    expect(page.locator("#transform-dimensions img")).to_be_visible()
    buttons_clear_of_picture(page, "transform-dimensions")
    screenshot(page, tmp_path / "demo_transform.png", page.locator("#transform"))

    page.locator("#transform-kind").get_by_text("Scale").click()
    expect(status).to_contain_text("Scale 1x")
    clear_pad(page)
    stroke(page, [(cx, cy - 0.7 * r), (cx, cy + 0.7 * r)])  # a 1, swept with the panel open
    expect(page.locator("#status")).to_contain_text(re.compile(r"Prediction: \*?\*?1"))
    expect(status).to_contain_text("following the 1 capsule")


def test_step_through_the_routing_iterations(page, made_demo_url, tmp_path):
    """A person picks an example and steps the routing back to its first iteration: the maps change and
    the words say each child splits its vote evenly; back at the last, they show agreement. The routing
    column at both is docs/demo_routing.png."""
    from playwright.sync_api import expect

    open_demo(page, made_demo_url)
    pick_example(page, "Digit", "", next(p for p in EXAMPLES if p.name.startswith("7_")))
    expect(page.locator("#status")).to_contain_text(re.compile(r"Prediction: \*?\*?7"))
    change = page.locator("#iteration-change")
    expect(change).to_contain_text("Iteration 3 of 3")
    maps = page.locator("#routing img")
    last = maps.get_attribute("src")
    slider = page.locator("#iteration input[type=range]")
    slider.focus()
    page.keyboard.press("Home")
    expect(change).to_contain_text("Iteration 1 of 3")
    expect(change).to_contain_text("1/10")
    expect(maps).not_to_have_attribute("src", last)
    page.wait_for_function("(img) => img.complete && img.naturalWidth > 0", arg=maps.element_handle())
    column = page.locator("#routing-column")
    first = column.screenshot()
    page.keyboard.press("End")
    expect(change).to_contain_text("Iteration 3 of 3")
    expect(maps).to_have_attribute("src", last)
    side_by_side([first, column.screenshot()], tmp_path / "demo_routing.png")


def test_two_digits_tab_names_both_digits_of_a_pair(page, made_demo_url, tmp_path):
    from playwright.sync_api import expect

    open_demo(page, made_demo_url)
    pair = next(p for p in PAIR_EXAMPLES if p.name.startswith("38_"))  # both capsules long (> 0.8): a clear pair
    pick_example(page, "Two digits", "pair-", pair)
    expect(page.locator("#pair-status")).to_contain_text(re.compile("Digits: (3 and 8|8 and 3)"))
    shows_model_input(page, "pair-", MULTIMNIST_SIZE)
    fills_its_box(page, "pair-")
    expect(page.locator("#pair-overlay img")).to_be_visible()
    expect(page.locator("#pair-grid img")).to_be_visible()  # the last of the prediction's events
    labels_clear_of_pictures(page, "pair-", ("seen", "overlay", "first", "second"))
    expect(page.locator("#pair-status")).to_contain_text("Digits")  # still: the example replaced the drawing
    expect(page.locator("#footer")).to_contain_text("multimnist")
    screenshot(page, tmp_path / "demo_pairs.png")


def test_fashion_tab_names_a_garment(page, made_demo_url, tmp_path):
    from playwright.sync_api import expect

    open_demo(page, made_demo_url)
    sneaker = next(p for p in FASHION_EXAMPLES if "sneaker" in p.name)
    pick_example(page, "Fashion", "fashion-", sneaker)
    expect(page.locator("#fashion-status")).to_contain_text("Prediction: Sneaker")
    shows_model_input(page, "fashion-", IMAGE_SIZE)
    expect(page.locator("#fashion-capsule")).to_contain_text("Ankle boot")  # the capsules named by class
    expect(page.locator("#fashion-grid img")).to_be_visible()
    page.screenshot(path=tmp_path / "demo_fashion.png", full_page=True)


# The drawing pad's ink as the page holds it (the canvas's own pixels): alpha over half, by rows.
CANVAS_INK = """() => {
    const canvas = document.querySelector('#sketch canvas');
    const alpha = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
    const rows = [];
    for (let y = 0; y < canvas.height; y++) {
        const row = [];
        for (let x = 0; x < canvas.width; x++) row.push(alpha[4 * (y * canvas.width + x) + 3] > 127);
        rows.push(row);
    }
    return rows;
}"""


def test_each_stroke_keeps_the_pen_it_was_drawn_with(page, made_demo_url):
    """A person picks the fine pen and draws a bar, then the broad pen and draws a stem: on the canvas the
    bar is as thick as the fine pen, the stem as the broad one; Undo takes the stem away and the bar keeps
    its thickness; the broad pen stays in hand after Clear, and the pad's buttons say which pen is."""
    from frontend.layout import CANVAS, PEN, PENS

    open_demo(page, made_demo_url)
    page.get_by_role("tab", name="Digit", exact=True).click()
    box = page.locator("#sketch canvas").bounding_box()

    def pressed() -> list[str | None]:
        return [button.get_attribute("aria-pressed") for button in page.locator("#sketch .pens button").all()]

    def at(x: float, y: float) -> tuple[float, float]:  # a point of the canvas (its own px), on screen
        return box["x"] + x * box["width"] / CANVAS, box["y"] + y * box["height"] / CANVAS

    assert pressed() == [str(name == PEN).lower() for name in PENS]
    page.get_by_role("button", name="fine pen").click()
    stroke(page, [at(60, 100), at(200, 100)])
    page.get_by_role("button", name="broad pen").click()
    stroke(page, [at(300, 80), at(300, 320)])
    assert pressed() == ["false", "false", "true"]

    def thickness() -> tuple[int, int]:  # the bar's rows at x = 120, the stem's columns at y = 200
        ink = np.array(page.evaluate(CANVAS_INK))
        return int(ink[:, 120].sum()), int(ink[200, 250:].sum())

    assert thickness() == pytest.approx((2 * PENS["fine"], 2 * PENS["broad"]), abs=2)
    page.locator("#sketch button[aria-label='Undo']").click()
    assert thickness() == pytest.approx((2 * PENS["fine"], 0), abs=2)
    clear_pad(page)
    stroke(page, [at(60, 100), at(200, 100)])
    assert thickness()[0] == pytest.approx(2 * PENS["broad"], abs=2)


def test_the_affine_model_has_a_digit_tab(page, made_demo_url):
    """The API serves the affine model (digit preprocessing, 40x40 input): its tab reads an example as
    the digit it is, shows the 40x40 image the model saw and names the model below."""
    from playwright.sync_api import expect

    open_demo(page, made_demo_url)
    seven = next(p for p in EXAMPLES if p.name.startswith("7_"))
    pick_example(page, "Digit (affine)", "affine-", seven)
    expect(page.locator("#affine-status")).to_contain_text(re.compile(r"Prediction: \*?\*?7"))
    shows_model_input(page, "affine-", AFFINE_SIZE)
    expect(page.locator("#footer")).to_contain_text("affine")


def finger(page, cdp, points: list[tuple[float, float]], steps: int = 12) -> None:
    """A finger's stroke through the points (page px), as a phone's touch screen sends it (Chromium's
    DevTools protocol: Playwright's touchscreen only taps): a move every 16 ms, and a rest before it lifts.
    Moves sent at once read as a flick, and Chromium drops a tap that follows a flick within a second."""
    path = [points[0]] + [
        (a[0] + (b[0] - a[0]) * k / steps, a[1] + (b[1] - a[1]) * k / steps)
        for a, b in itertools.pairwise(points)
        for k in range(1, steps + 1)
    ]
    cdp.send("Input.dispatchTouchEvent", {"type": "touchStart", "touchPoints": [{"x": path[0][0], "y": path[0][1]}]})
    for x, y in path[1:]:
        cdp.send("Input.dispatchTouchEvent", {"type": "touchMove", "touchPoints": [{"x": x, "y": y}]})
        page.wait_for_timeout(16)
    page.wait_for_timeout(100)
    cdp.send("Input.dispatchTouchEvent", {"type": "touchEnd", "touchPoints": []})


def test_a_phone_shows_every_model_and_draws_with_a_finger(browser, made_demo_url):
    """On a phone's screen (390 px wide, touch): every model's tab is in view (none behind a menu), a digit
    drawn with a finger is answered, drawing does not scroll the page, and the perturbed capsule stays in view
    beside the sliders far below its place, clear of the one in use."""
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    try:
        open_demo(page, made_demo_url)
        for name in ("Digit", "Fashion", "Two digits", "Digit (affine)"):
            expect(page.locator("#models").get_by_role("tab", name=name, exact=True)).to_be_visible()
        canvas = page.locator("#sketch canvas").first
        canvas.scroll_into_view_if_needed()
        box = canvas.bounding_box()
        cx, cy, r = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2, min(box["width"], box["height"]) / 2
        cdp = context.new_cdp_session(page)
        top = page.evaluate("() => window.scrollY")
        for points in ([(-0.45, -0.6), (0.4, -0.6)], [(0.4, -0.6), (-0.1, 0.7)]):  # a 7: the bar, then the stem
            finger(page, cdp, [(cx + x * r, cy + y * r) for x, y in points])
        expect(page.locator("#status")).to_contain_text(re.compile(r"Prediction: \*?\*?7"))
        assert page.evaluate("() => window.scrollY") == top, "drawing scrolled the page"
        # down at dim 12 the perturbed capsule, far above, floats in a corner; stepped, it is redrawn there
        perturbed = page.locator("#perturbed")
        expect(perturbed.locator("img")).to_be_visible()
        page.locator("#dim-12").scroll_into_view_if_needed()
        expect(perturbed).to_have_class(re.compile(r"\bfloating\b"))
        shown = perturbed.locator("img").bounding_box()
        assert shown["y"] >= 0 and shown["y"] + shown["height"] <= 844 and shown["width"] > 100, shown
        before = perturbed.locator("img").get_attribute("src")
        page.locator("#dim-12 input[type=range]").focus()
        page.keyboard.press("ArrowRight")
        expect(perturbed.locator("img")).not_to_have_attribute("src", before)
        # dim 15 at the bottom of the screen, touched: the picture floats in the top corner, clear of it
        last = page.locator("#dim-15")
        page.evaluate("(y) => window.scrollBy(0, y)", last.bounding_box()["y"] + last.bounding_box()["height"] - 834)
        last.locator("input[type=range]").focus()
        page.keyboard.press("ArrowRight")
        expect(perturbed).to_have_class(re.compile(r"\bhigh\b"))
        shown, slider = perturbed.locator("img").bounding_box(), last.bounding_box()
        assert shown["y"] + shown["height"] <= slider["y"] and slider["y"] + slider["height"] <= 844, (shown, slider)
        perturbed.scroll_into_view_if_needed()  # back in its place, it floats no more
        expect(perturbed).not_to_have_class(re.compile(r"\bfloating\b"))
        page.locator("#models").get_by_role("tab", name="Two digits", exact=True).tap()
        expect(page.locator("#pair-sketch canvas").first).to_be_visible()
    finally:
        context.close()


def test_the_footer_leads_to_the_api_docs(page, made_demo_url):
    """A person follows the footer's link to the API and finds POST /predict on its docs page (its scripts
    come from the API itself: tests/app/test_app_docs.py)."""
    from playwright.sync_api import expect

    open_demo(page, made_demo_url)
    with page.context.expect_page() as opened:
        page.locator("#footer a", has_text="http").click()
    docs = opened.value
    expect(docs.get_by_role("link", name="/predict", exact=True)).to_be_visible()
    assert docs.url.endswith("/docs")


def test_each_model_tab_has_one_header(page, made_demo_url):
    """Selecting each model's tab in turn leaves one header per tab, in the API's order, the default first
    (a gr.State among the tabs once gave a tab a second header the first time it was selected)."""
    open_demo(page, made_demo_url)
    headers = "() => [...document.querySelectorAll('button[role=tab]')].map(b => b.getAttribute('data-tab-id'))"
    models = [m for m in page.evaluate(headers) if m in ("mnist", "fashion-mnist", "multimnist", "affine")]
    assert models[0] == "mnist" and sorted(models) == ["affine", "fashion-mnist", "mnist", "multimnist"]
    for model in models[1:] + models[:1]:
        page.locator(f"button[role=tab][data-tab-id='{model}']").click()
        page.wait_for_timeout(500)
        seen = page.evaluate(headers)
        assert [seen.count(m) for m in models] == [1] * len(models), seen


def test_an_uploaded_scan_is_answered_and_clearing_it_asks_again(page, made_demo_url, mnist_fixture, tmp_path):
    """A person opens the Upload tab and picks a file (a test digit as a 280x280 scan, dark ink on white
    paper); its answer shows, and after a pause the routing maps and Fig. 4 follow; the Draw tab's empty pad
    asks for a digit and the Upload tab, clicked again, answers the scan again; the upload's clear
    button brings the prompt back, after a picked example too (whose clear event can still carry the
    example's file). Then a transparent PNG and a file that is no image, each answered in words."""
    from playwright.sync_api import expect

    images, labels = mnist_fixture
    k = int(np.flatnonzero(labels == 3)[1])  # a 3 that is not among the examples (they are each class's first)
    scan = tmp_path / "scan.png"
    Image.fromarray(255 - images[k]).resize((280, 280), Image.Resampling.BICUBIC).save(scan)
    open_demo(page, made_demo_url)
    page.get_by_role("tab", name="Digit", exact=True).click()
    page.locator("#inputs").get_by_role("tab", name="Upload").click()
    page.locator("#upload input[type=file]").set_input_files(scan)
    expect(page.locator("#status")).to_contain_text(re.compile(r"Prediction: \*?\*?3"))
    shows_model_input(page, "", IMAGE_SIZE)
    expect(page.locator("#routing img")).to_be_visible()  # a fresh page had none
    expect(page.locator("#grid img")).to_be_visible()
    page.locator("#inputs").get_by_role("tab", name="Draw").click()
    expect(page.locator("#status")).to_contain_text("Draw a digit")
    page.locator("#inputs").get_by_role("tab", name="Upload").click()
    expect(page.locator("#status")).to_contain_text(re.compile(r"Prediction: \*?\*?3"))
    page.locator("#upload").get_by_role("button", name="Remove Image").click()
    expect(page.locator("#status")).to_contain_text("Draw a digit")
    page.locator("#examples img").nth(3).click()  # an example, then its removal: the prompt again too
    expect(page.locator("#status")).to_contain_text(re.compile(r"Prediction: \*?\*?3"))
    page.locator("#upload").get_by_role("button", name="Remove Image").click()
    expect(page.locator("#status")).to_contain_text("Draw a digit")
    # A drawing app's export (black ink held in the alpha of a transparent PNG) reads as its digit, and a file
    # that is no image gets the API's sentence, with no "Error" from the page on any panel
    page.locator("#upload input[type=file]").set_input_files(TRANSPARENT_SEVEN)
    expect(page.locator("#status")).to_contain_text(re.compile(r"Prediction: \*?\*?7"))
    page.locator("#upload").get_by_role("button", name="Remove Image").click()
    not_an_image = tmp_path / "notes.png"
    not_an_image.write_text("this is not a picture")
    page.locator("#upload input[type=file]").set_input_files(not_an_image)
    expect(page.locator("#status")).to_contain_text("the file is not a readable PNG, JPEG, BMP, GIF or WebP image")
    expect(page.get_by_text("Error", exact=True)).to_have_count(0)


def camera_video(picture: Image.Image, path: Path, size: tuple[int, int] = (640, 480)) -> Path:
    """A few frames of `picture` at `size` as a Y4M video (YUV 4:2:0), the file Chromium's fake camera plays."""
    ycbcr = picture.convert("RGB").resize(size, Image.Resampling.BICUBIC).convert("YCbCr")
    half = (size[0] // 2, size[1] // 2)
    y, cb, cr = (band if k == 0 else band.resize(half, Image.Resampling.BOX) for k, band in enumerate(ycbcr.split()))
    frame = b"FRAME\n" + y.tobytes() + cb.tobytes() + cr.tobytes()
    path.write_bytes(f"YUV4MPEG2 W{size[0]} H{size[1]} F30:1 Ip A1:1 C420jpeg\n".encode() + frame * 3)
    return path


def ink_centre(picture: Image.Image) -> float:
    """Where the darkest ink of a photo lies across it: the mean column of its darkest 1% of pixels, as a
    fraction of its width."""
    grey = np.asarray(picture.convert("L"), np.float32)
    columns = np.nonzero(grey <= np.percentile(grey, 1))[1]
    return float(columns.mean() + 0.5) / grey.shape[1]


def test_a_digit_held_up_to_the_camera_is_read_as_the_camera_sees_it(browser, made_demo_url, tmp_path):
    """A person with a camera (Chromium's fake one, playing a photo of a 9 on paper, right of centre) opens the
    Upload tab, turns the camera on and takes a picture: the 9 is read, and the picture is as the camera saw
    it, not mirrored (Gradio mirrors a webcam by default: its ink would be left of centre)."""
    from playwright.sync_api import expect

    photo = REAL_WORLD / "photo" / "photo-07991-9.jpg"
    seen = ink_centre(Image.open(photo))
    assert seen > 0.6, f"the photo's ink is at {seen:.2f} of its width: too near the middle to show a mirror"
    video = camera_video(Image.open(photo), tmp_path / "camera.y4m")
    camera = [
        "--use-fake-device-for-media-stream",
        "--use-fake-ui-for-media-stream",  # the camera allowed without asking
        f"--use-file-for-fake-video-capture={video}",
    ]
    with_camera = browser.browser_type.launch(executable_path=str(CHROMIUM), args=FLAGS + camera, timeout=TIMEOUT_MS)
    try:
        page = new_page(with_camera)
        open_demo(page, made_demo_url)
        page.locator("#inputs").get_by_role("tab", name="Upload").click()
        upload = page.locator("#upload")
        upload.get_by_role("button", name="Capture from camera").click()
        upload.get_by_text("Click to Access Webcam").click()
        # its button shows before the video plays, and a click then takes nothing
        page.wait_for_function("video => video.videoWidth > 0", arg=upload.locator("video").element_handle())
        upload.get_by_role("button", name="capture photo").click()
        expect(page.locator("#status")).to_contain_text(re.compile(r"Prediction: \*?\*?9"))
        taken = page.request.get(upload.locator("img").first.get_attribute("src"))
        assert taken.ok, taken.status
        picture = Image.open(io.BytesIO(taken.body()))
        assert picture.size == (640, 480)
        taken_at = ink_centre(picture)
        assert abs(taken_at - seen) < 0.05, f"the ink at {taken_at:.2f} of the picture, the camera's at {seen:.2f}"
    finally:
        with_camera.close()


@pytest.mark.parametrize(
    "script, clipboard",
    [
        ("navigator.mediaDevices.enumerateDevices = async () => [];", True),
        ("Object.defineProperty(window, 'isSecureContext', {value: false});", False),
    ],
    ids=["no camera", "an insecure page"],
)
def test_the_upload_offers_the_camera_and_clipboard_only_where_they_work(page, made_demo_url, script, clipboard):
    """Without a camera, or on a page a browser does not trust with one (plain http from another machine: the
    test's page is on localhost and is told otherwise), the upload's camera button is hidden on every model's
    tab, and on such a page the clipboard's too: Gradio's do nothing, or show an untranslated key, there."""
    from playwright.sync_api import expect

    page.add_init_script(script)
    open_demo(page, made_demo_url)
    for tab, prefix in (("Digit", ""), ("Fashion", "fashion-"), ("Two digits", "pair-"), ("Digit (affine)", "affine-")):
        page.get_by_role("tab", name=tab, exact=True).click()
        if prefix != "fashion-":  # the tabs with a pad show the upload in their Upload tab
            page.locator(f"#{prefix}inputs").get_by_role("tab", name="Upload").click()
        upload = page.locator(f"#{prefix}upload")
        expect(upload.get_by_role("button", name="Upload file")).to_be_visible()
        for name, shown in (("Capture from camera", False), ("Paste from clipboard", clipboard)):
            button = upload.get_by_role("button", name=name, include_hidden=True)
            expect(button).to_have_count(1)  # there, and shown or hidden
            expect(button).to_be_visible() if shown else expect(button).to_be_hidden()


# --- drawing as people do: several strokes at a person's pace, Predict at once or after a pause ----------
# Strokes in units of the canvas's half side, from its centre (x right, y down). Each digit's first stroke
# alone reads as another digit or none (an L is a 2), so an answer to the unfinished drawing shows.
DIGIT_STROKES = {
    "4": [[(-0.35, -0.6), (-0.45, 0.1), (0.35, 0.1)], [(0.15, -0.6), (0.15, 0.7)]],
    "5": [
        [(-0.3, -0.6), (-0.35, -0.05), (0.1, -0.15), (0.35, 0.1), (0.3, 0.45), (-0.05, 0.65), (-0.35, 0.5)],
        [(-0.3, -0.6), (0.35, -0.6)],
    ],
    "7": [[(-0.4, -0.6), (0.4, -0.6), (-0.05, 0.7)], [(-0.2, 0.05), (0.3, 0.05)]],
    "1": [[(-0.2, -0.45), (0.0, -0.65), (0.0, 0.65)], [(-0.25, 0.65), (0.25, 0.65)]],
}
# Two digits side by side, overlapping a little: a 4 of two strokes and a 7 with a bar, then the same
# two digits the other way round. (Their first strokes read as other digits: an L is a 2.)
FOUR, SEVEN = DIGIT_STROKES["4"], DIGIT_STROKES["7"]
PAIR_STROKES = [
    [[(0.6 * x + dx, 0.8 * y) for x, y in stroke] for stroke, dx in pair]
    for pair in (
        [(s, -0.3) for s in FOUR] + [(s, 0.3) for s in SEVEN],
        [(s, -0.3) for s in SEVEN] + [(s, 0.3) for s in FOUR],
    )
]
PACE_S = 0.4  # between a person's strokes
PAUSE_S = 1.5  # a person looking at the drawing before clicking Predict
ANSWER_S = 8.0  # from the click to the answer for the whole drawing, on a busy 2-core CI machine
SETTLE_S = 3.0  # after it, time for any late answer to arrive
ROUNDS = 2  # each drawing twice, Predict at once and after a pause
JITTER_S = (1.0, 0.0, 0.0)  # the API's delay for the 1st, 2nd, 3rd... /predict, in turn: answers overtake
# each other as they do over a busy network or on a shared server, so a late answer to an unfinished
# drawing (a stroke's) can arrive after the whole drawing's (the click's)


@pytest.fixture(scope="module")
def jittery_demo_url(api_url):
    """The demo asking the API through a proxy that delays /predict by JITTER_S in turn."""
    import asyncio
    import itertools

    import httpx
    from fastapi import FastAPI, Request, Response

    from tests.conftest import serving
    from tests.frontend.conftest import start_demo

    proxy, delays = FastAPI(), itertools.cycle(JITTER_S)

    @proxy.api_route("/{path:path}", methods=["GET", "POST"])
    async def forward(path: str, request: Request) -> Response:
        if path == "predict":
            await asyncio.sleep(next(delays))
        async with httpx.AsyncClient(timeout=30) as client:
            answer = await client.request(
                request.method,
                f"{api_url}/{path}",
                params=request.query_params,
                content=await request.body(),
                headers={"content-type": request.headers.get("content-type", "")},
            )
        return Response(answer.content, answer.status_code, media_type=answer.headers.get("content-type"))

    with serving(proxy, "jittery-api") as proxy_url:
        demo, url = start_demo(proxy_url)
        yield url
        demo.close()


def draw(page, sketch: str, strokes: list[list[tuple[float, float]]]) -> None:
    """Draw the strokes on the drawing pad `sketch` (its elem_id) at a person's pace."""
    box = page.locator(f"#{sketch} canvas").first.bounding_box()
    cx, cy, r = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2, min(box["width"], box["height"]) / 2
    for k, points in enumerate(strokes):
        if k:
            page.wait_for_timeout(PACE_S * 1000)
        stroke(page, [(cx + x * r, cy + y * r) for x, y in points])


def api_reads(page, api_url: str, sketch: str, model: str) -> list[str]:
    """What the API answers for the whole drawing on screen (the canvas as the browser shows it, its
    ink in alpha as the pad sends it): the labels of its objects, sorted. The screenshot is not the pad's
    own image, and a pair's two capsules may be nearly as long, so which is named first is not compared."""
    import httpx
    from PIL import Image, ImageOps

    shot = Image.open(io.BytesIO(page.locator(f"#{sketch} canvas").first.screenshot())).convert("L")
    ink = Image.new("RGBA", shot.size, (0, 0, 0, 0))
    ink.putalpha(ImageOps.invert(shot))
    buffer = io.BytesIO()
    ink.save(buffer, "PNG")
    answer = httpx.post(
        f"{api_url}/predict",
        params={"model": model, "include": ""},
        files={"file": ("drawing.png", buffer.getvalue(), "image/png")},
        timeout=30,
    ).json()
    return sorted(o["label"] for o in answer["objects"]) if "objects" in answer else [answer["label"]]


ANSWERS = r"(?:Prediction|Digits): (\S+)(?: and (\S+))?"
RECORD_ANSWERS = """([status, pattern]) => {
    window.__answers = [];
    const element = document.querySelector('#' + status);
    const note = () => {
        const match = element.innerText.replaceAll('*', '').match(new RegExp(pattern));
        const labels = match ? [match[1], match[2]].filter(Boolean) : [];
        const last = window.__answers[window.__answers.length - 1];
        if (labels.length && (!last || last.join() !== labels.join())) window.__answers.push(labels);
    };
    if (window.__observer) window.__observer.disconnect();
    window.__observer = new MutationObserver(note);
    window.__observer.observe(element, {subtree: true, childList: true, characterData: true});
}"""


def answered(page, status: str) -> list[str]:
    """The labels the status names now, sorted (as api_reads): "Prediction: 4" or "Digits: 7 and 4"."""
    match = re.search(ANSWERS, page.locator(f"#{status}").inner_text().replace("*", ""))
    return sorted(label for label in match.groups() if label) if match else []


@pytest.mark.parametrize("tab, prefix, model", [("Digit", "", "mnist"), ("Two digits", "pair-", "multimnist")])
def test_the_answer_on_screen_is_for_the_whole_drawing(page, jittery_demo_url, api_url, tab, prefix, model):
    """Multi-stroke digits drawn at a person's pace, Predict clicked at once and after a pause, the API's
    answers overtaking each other: the answer for the whole drawing comes, and no late answer to its
    first strokes replaces it (the last answer shown is the whole drawing's). Failed on 65f6eb5: a
    stroke's late answer replaced the click's (answers shown in turn: 4, then 2 for the L)."""
    open_demo(page, jittery_demo_url)
    page.get_by_role("tab", name=tab, exact=True).click()
    drawings = DIGIT_STROKES.values() if model == "mnist" else PAIR_STROKES
    wrong = []
    for trial in range(ROUNDS):
        for strokes in drawings:
            clear_pad(page, prefix)
            page.wait_for_timeout(1500)  # the prompt shows again
            page.evaluate(RECORD_ANSWERS, [f"{prefix}status", ANSWERS])  # every new answer from here on, in turn
            draw(page, f"{prefix}sketch", strokes)
            if trial % 2:
                page.wait_for_timeout(PAUSE_S * 1000)
            page.locator("button:visible", has_text="Predict").click()
            expected = api_reads(page, api_url, f"{prefix}sketch", model)
            deadline = time.monotonic() + ANSWER_S
            while answered(page, f"{prefix}status") != expected and time.monotonic() < deadline:
                page.wait_for_timeout(50)
            on_time = answered(page, f"{prefix}status")
            page.wait_for_timeout(SETTLE_S * 1000)
            seen = page.evaluate("() => window.__answers")
            if not (on_time == expected and seen and sorted(seen[-1]) == expected):
                wrong.append((trial, expected, seen))
    assert not wrong, f"(round, the API's answer for the whole drawing, every answer shown in turn): {wrong}"


# --- the answer as the pen lifts: time from a click or a stroke's end to its answer on screen ------------
# The prediction, lengths and model input on screen after a click on an example or the end of a stroke
# (routing and Fig. 4 follow). What made an answer slow was work for the page: a click took 1,666 ms
# while the sketchpads re-uploaded their background, 425 ms while an answer took six events of Gradio's
# page and 476 ms while an example that brought the Upload tab into view took three (each Tab's select
# and its follow-up came with it; 268 ms without them, in the same run); a stroke took 1,460 ms while
# Gradio's Sketchpad read its WebGL canvas back twice per stroke. Each answer is held to two events (the
# answer and its follow-up) without a clock, below; the clock's bound is for what a count cannot see.
# Medians in this suite on this project's idle 2-core machine: 184-241 ms, and up to 2x that in a slow
# hour, which the bound leaves room for while a return of the 1.5 s answers fails it.
ANSWER_MS = 600
EVENTS_PER_ANSWER = 2  # the answer and its follow-up
# Arms a timer in the page: window.__answer_ms resolves to the milliseconds from window.__start() to the
# answer `digit` on screen with a new model input, loaded (the text and src change as DOM mutations; the
# image's load is an event of its own), and fails after 15 s (a wrong answer must not hang the suite).
ANSWER_TIMER = """(digit) => { window.__answer_ms = new Promise((resolve, reject) => {
    setTimeout(() => reject(new Error('no "Prediction: ' + digit + '" with a new model input in 15 s')), 15000);
    const seen = () => document.querySelector('#seen img');
    const before = seen() ? seen().getAttribute('src') : null;
    let t0 = null;
    window.__start = () => { t0 = performance.now(); };
    const check = () => {
        const text = document.querySelector('#status').textContent.replace(/\\*/g, '');
        const image = seen();
        if (t0 !== null && text.includes('Prediction: ' + digit) && image && image.getAttribute('src') !== before
                && image.complete) {
            observer.disconnect();
            document.removeEventListener('load', check, true);
            resolve(performance.now() - t0);
        }
    };
    const observer = new MutationObserver(check);
    observer.observe(document.body, {subtree: true, childList: true, characterData: true, attributes: true});
    document.addEventListener('load', check, true);
}); }"""
CLICK_EXAMPLE = "(k) => { window.__start(); document.querySelectorAll('#examples img')[k].click(); }"
ON_THE_PENS_LIFT = """() => document.querySelector('#sketch canvas')
    .addEventListener('pointerup', () => window.__start(), {once: true, capture: true})"""


def timed(times: list[float]) -> None:
    median = sorted(times)[len(times) // 2]
    print(f"median {median:.0f} ms, max {max(times):.0f} ms over {len(times)}")
    assert median <= ANSWER_MS, f"median {median:.0f} ms (target {ANSWER_MS}); each: {[round(t) for t in times]}"


def event_log(page) -> list[str]:
    """The events the page sends to the demo's server from now on (Gradio's queue joins), as they go."""
    sent: list[str] = []

    def log(request) -> None:
        if "/queue/join" in request.url:
            sent.append((request.post_data or "")[:120])  # its start: a drawing's data URL or the fn_index

    page.on("request", log)
    return sent


def events_sent(page, sent: list[str], expected: int = EVENTS_PER_ANSWER) -> list[str]:
    """The events in `sent` once there are `expected` (the answer's follow-up among them; 10 s at most) and
    no more came for half a second; `sent` is emptied for the next action."""
    for _ in range(200):
        if len(sent) >= expected:
            break
        page.wait_for_timeout(50)
    count = -1
    while count != len(sent):
        count = len(sent)
        page.wait_for_timeout(500)
    events, sent[:] = list(sent), []
    return events


def test_an_example_is_answered_at_once(page, made_demo_url):
    """From the click on an example to its prediction and model input on screen, in the browser's own
    clock: the median of two rounds over the ten examples, every other click with the Draw tab in view
    (the click then also brings the Upload tab into view). Each click, and each click on the Draw tab,
    sends the page's server two events: the answer and its follow-up."""
    from playwright.sync_api import expect

    open_demo(page, made_demo_url)
    sent, times, events = event_log(page), [], {}
    for i, k in enumerate([3, 7, 1, 8, 0, 5, 2, 9, 4, 6] * 2):
        if i % 2:
            page.locator("#inputs").get_by_role("tab", name="Draw").click()
            events[f"Draw tab before example {k}"] = events_sent(page, sent)  # the drawing's answer (the prompt)
        digit = page.locator("#examples img").nth(k).get_attribute("src").split("/")[-1][0]
        page.evaluate(ANSWER_TIMER, digit)
        page.evaluate(CLICK_EXAMPLE, k)
        times.append(page.evaluate("() => window.__answer_ms"))
        expect(page.locator("#upload img")).to_be_visible()  # the example, in view
        events[f"example {k}" + (" from the Draw tab" if i % 2 else "")] = events_sent(page, sent)
    more = {action: got for action, got in events.items() if len(got) != EVENTS_PER_ANSWER}
    assert not more, f"events other than the answer and its follow-up: {more}"
    timed(times)


def test_a_stroke_is_answered_at_once(page, made_demo_url):
    """From the pen's lift to the drawing's prediction and model input on screen, in the browser's own
    clock: the median of ten 7s, each drawn in one stroke on a cleared pad. Each stroke sends the page's
    server two events: the answer and its follow-up."""
    open_demo(page, made_demo_url)
    page.get_by_role("tab", name="Digit", exact=True).click()
    page.locator("#inputs").get_by_role("tab", name="Draw").click()
    sent, times, events = event_log(page), [], []
    for k in range(10):
        if k:
            clear_pad(page)
        events_sent(page, sent, EVENTS_PER_ANSWER if k else 0)  # the prompt, and its follow-up
        page.evaluate(ANSWER_TIMER, "7")
        page.evaluate(ON_THE_PENS_LIFT)
        draw(page, "sketch", [DIGIT_STROKES["7"][0]])
        times.append(page.evaluate("() => window.__answer_ms"))
        events.append(events_sent(page, sent))
    more = [got for got in events if len(got) != EVENTS_PER_ANSWER]
    assert not more, f"events other than the answer and its follow-up: {more}"
    timed(times)
