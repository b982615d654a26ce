"""A person in a browser: headless Chromium opens the demo, draws a stroke with the mouse, sees a
prediction, moves a slider and sees the perturbed reconstruction change; then picks a pair example in
the Two digits tab and a garment in the Fashion tab and sees them named. Screenshots are saved.

Uses Debian's chromium (/usr/bin/chromium) through Playwright, never Playwright's own browsers.
CAPSNET_SCREENSHOT=1 also writes the Digit tab's screenshot to docs/demo.png (the README shows it) and
the Two digits tab's to docs/demo_pairs.png.
"""
import os
import re
import shutil
from pathlib import Path

import pytest

from frontend.app import FASHION_EXAMPLES, PAIR_EXAMPLES

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run"]
TIMEOUT_MS = 30_000
DOCS = Path(__file__).resolve().parents[2] / "docs"

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def page():
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: `apt-get install chromium` to run the browser test (CI does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS, timeout=TIMEOUT_MS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(TIMEOUT_MS)
        yield page
        browser.close()


def stroke(page, points: list[tuple[float, float]]) -> None:
    page.mouse.move(*points[0])
    page.mouse.down()
    for point in points[1:]:
        page.mouse.move(*point, steps=12)
    page.mouse.up()


def screenshot(page, path: Path) -> None:
    """The whole page to `path`; with CAPSNET_SCREENSHOT=1 also to docs/ under the same name."""
    page.screenshot(path=path, full_page=True)
    assert path.stat().st_size > 10_000
    if os.environ.get("CAPSNET_SCREENSHOT"):
        DOCS.mkdir(exist_ok=True)
        shutil.copyfile(path, DOCS / path.name)


def open_demo(page, demo_url: str) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)  # its default is 5 s, short on a busy 2-core CI machine
    page.goto(demo_url)
    expect(page.locator("#footer")).to_contain_text("version")


def pick_example(page, tab: str, prefix: str, path: Path) -> None:
    """Switch to the tab and click the example whose file is `path`."""
    page.get_by_role("tab", name=tab, exact=True).click()
    page.locator(f"#{prefix}examples img[src$='{path.name}']").click()


def test_draw_predict_perturb_and_screenshot(page, demo_url, tmp_path):
    from playwright.sync_api import expect

    open_demo(page, demo_url)

    box = page.locator("#sketch canvas").first.bounding_box()  # the drawing area sits in its middle
    cx, cy, r = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2, min(box["width"], box["height"]) / 2
    stroke(page, [(cx - 0.45 * r, cy - 0.6 * r), (cx + 0.4 * r, cy - 0.6 * r), (cx - 0.1 * r, cy + 0.7 * r)])  # a 7
    expect(page.locator("#status")).to_contain_text("Prediction")

    perturbed = page.locator("#perturbed img")
    expect(perturbed).to_be_visible()
    before = perturbed.get_attribute("src")
    slider = page.locator("#dim-1 input[type=range]")
    slider.scroll_into_view_if_needed()
    track = slider.bounding_box()
    stroke(page, [(track["x"] + track["width"] / 2, track["y"] + track["height"] / 2),
                  (track["x"] + track["width"] - 2, track["y"] + track["height"] / 2)])
    expect(page.locator("#dim-1 input[type=number]")).to_have_value("0.25")
    expect(perturbed).not_to_have_attribute("src", before)

    screenshot(page, tmp_path / "demo.png")


def test_two_digits_tab_names_both_digits_of_a_pair(page, demo_url, tmp_path):
    from playwright.sync_api import expect

    open_demo(page, demo_url)
    pair = next(p for p in PAIR_EXAMPLES if p.name.startswith("38_"))  # both capsules long (> 0.8): a clear pair
    pick_example(page, "Two digits", "pair-", pair)
    expect(page.locator("#pair-status")).to_contain_text(re.compile("Digits: (3 and 8|8 and 3)"))
    expect(page.locator("#pair-overlay img")).to_be_visible()
    expect(page.locator("#pair-grid img")).to_be_visible()  # the last of the prediction's events
    expect(page.locator("#pair-status")).to_contain_text("Digits")  # still: the example replaced the drawing
    expect(page.locator("#footer")).to_contain_text("multimnist")
    screenshot(page, tmp_path / "demo_pairs.png")


def test_fashion_tab_names_a_garment(page, demo_url, tmp_path):
    from playwright.sync_api import expect

    open_demo(page, demo_url)
    sneaker = next(p for p in FASHION_EXAMPLES if "sneaker" in p.name)
    pick_example(page, "Fashion", "fashion-", sneaker)
    expect(page.locator("#fashion-status")).to_contain_text("Prediction: Sneaker")
    expect(page.locator("#fashion-capsule")).to_contain_text("Ankle boot")  # the capsules named by class
    expect(page.locator("#fashion-grid img")).to_be_visible()
    page.screenshot(path=tmp_path / "demo_fashion.png", full_page=True)
