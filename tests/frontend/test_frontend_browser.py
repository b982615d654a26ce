"""A person in a browser: headless Chromium opens the demo, draws a stroke with the mouse, sees a
prediction, moves a slider and sees the perturbed reconstruction change; a screenshot is saved.

Uses Debian's chromium (/usr/bin/chromium) through Playwright, never Playwright's own browsers.
CAPSNET_SCREENSHOT=1 also writes the screenshot to docs/demo.png (the README shows it).
"""
import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run"]
TIMEOUT_MS = 30_000
DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "demo.png"

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


def test_draw_predict_perturb_and_screenshot(page, demo_url, tmp_path):
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)  # its default is 5 s, short on a busy 2-core CI machine
    page.goto(demo_url)
    expect(page.locator("#footer")).to_contain_text("version")

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

    screenshot = tmp_path / "demo.png"
    page.screenshot(path=screenshot, full_page=True)
    assert screenshot.stat().st_size > 10_000
    if os.environ.get("CAPSNET_SCREENSHOT"):
        DOCS_SCREENSHOT.parent.mkdir(exist_ok=True)
        shutil.copyfile(screenshot, DOCS_SCREENSHOT)
