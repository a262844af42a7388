"""The server's page in a real browser: headless Chromium, driven by Selenium through chromedriver, types a
sentence, waits for its translation, and checks the text (against the library translating it alone), the
n best with their scores, and the attention heatmap (one row per target word, one column per source word),
then takes a screenshot and checks that the heatmap is drawn in it. A page on another origin calls the
server's API only where `--cors` lets it: the browser itself enforces the preflight's answer.

Skipped where Chromium or chromedriver is missing (Debian: apt-get install chromium chromium-driver).
"""

import io
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="not installed (pip install -e '.[serve]')")
webdriver = pytest.importorskip("selenium.webdriver", reason="not installed (pip install -e '.[test]')")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="no chromium and chromedriver here (Debian: apt-get install chromium chromium-driver)",
)

from PIL import Image  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402
from test_serve import (  # noqa: E402, F401 (the fixtures: every_error_has_one_shape checks each test's errors)
    KEY,
    alone,
    every_error_has_one_shape,
    in_process,
    model_dir_fixture,
    translator_fixture,
)

from hf_vanilla_transformer.serving import ApiKeys  # noqa: E402

WIDTH, HEIGHT = 1100, 900
TEXT = "w1 w2 w3 w4 w5"


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(argument)
    options.add_argument(f"--window-size={WIDTH},{HEIGHT}")
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER), options=options)
    # Selenium waits for chromedriver's answers without a limit by default: a browser that stops answering
    # fails the test instead of holding the run.
    driver.command_executor.client_config.timeout = 120
    yield driver
    driver.quit()


def shown_translation(driver, text: str) -> str:
    """Wait until the page shows the translation of `text`; the translation it shows."""
    WebDriverWait(driver, 60).until(
        lambda d: (
            d.execute_script("return document.body.dataset.state") in ("done", "error")
            and d.execute_script("return document.body.dataset.translated") == text
        )
    )
    assert driver.execute_script("return document.body.dataset.state") == "done", driver.find_element(
        By.ID, "status"
    ).text
    return driver.find_element(By.ID, "translation").text


def test_the_page_translates_as_you_type_and_draws_the_attention(browser, translator, tmp_path: Path) -> None:
    with in_process(translator) as server:
        browser.get(f"{server.url}/")
        WebDriverWait(browser, 30).until(lambda d: d.find_element(By.ID, "pair").text)
        assert browser.find_element(By.ID, "pair").text.startswith("en → de")
        source = browser.find_element(By.ID, "source")
        source.send_keys(TEXT)
        expected = alone(translator, TEXT, alignments=True)[0]
        assert shown_translation(browser, TEXT) == expected.text

        rows = browser.find_elements(By.CSS_SELECTOR, "#heatmap tbody tr")
        assert [row.find_element(By.TAG_NAME, "th").text for row in rows] == expected.text.split()
        assert all(len(row.find_elements(By.TAG_NAME, "td")) == len(TEXT.split()) for row in rows)
        columns = browser.find_elements(By.CSS_SELECTOR, "#heatmap thead th")
        assert [column.text for column in columns[1:]] == TEXT.split()

        screenshot = tmp_path / "serve_page.png"
        assert browser.save_screenshot(str(screenshot))
        image = Image.open(screenshot)
        ratio = browser.execute_script("return window.devicePixelRatio")
        viewport = browser.execute_script("return [window.innerWidth, window.innerHeight]")
        assert image.format == "PNG" and image.size == (
            round(viewport[0] * ratio),
            round(viewport[1] * ratio),
        )
        # The heatmap's cells are shades of blue on a white page: count the blue pixels in its area.
        heatmap = Image.open(io.BytesIO(browser.find_element(By.ID, "heatmap").screenshot_as_png)).convert(
            "RGB"
        )
        r, g, b = np.asarray(heatmap, dtype=int).transpose(2, 0, 1)
        assert ((b > r + 40) & (b > g + 20)).mean() > 0.1

        # Two alternatives: the n best listed with their scores, the first the translation shown.
        Select(browser.find_element(By.ID, "alternatives")).select_by_value("2")
        WebDriverWait(browser, 30).until(
            lambda d: len(d.find_elements(By.CSS_SELECTOR, "#hypotheses li")) == 3
        )
        items = browser.find_elements(By.CSS_SELECTOR, "#hypotheses li")
        hypotheses = alone(translator, TEXT, n_best=3)
        assert [item.text.split("score")[0].strip() for item in items] == [h.text for h in hypotheses]
        assert f"score {hypotheses[0].score:.3f}" in items[0].text


def test_the_page_shows_a_refusal_as_its_error(browser, translator) -> None:
    with in_process(translator) as server:
        browser.get(f"{server.url}/")
        WebDriverWait(browser, 30).until(lambda d: d.find_element(By.ID, "pair").text)
        browser.execute_script("document.getElementById('source').removeAttribute('maxlength')")
        text = "w1 " * 2000  # over the 5000 characters a request may hold
        browser.execute_script(
            "const s = document.getElementById('source'); s.value = arguments[0];"
            "s.dispatchEvent(new Event('input'));",
            text,
        )
        WebDriverWait(browser, 30).until(
            lambda d: d.execute_script("return document.body.dataset.state") == "error"
        )
        assert "5000" in browser.find_element(By.ID, "status").text


# A page that calls the API given after its # with JSON and an API key: a request a browser preflights.
CALLING_PAGE = b"""<!doctype html><title>caller</title><body><script>
fetch(location.hash.slice(1) + "/translate", {
  method: "POST",
  headers: {"Content-Type": "application/json", "X-API-Key": "%s"},
  body: JSON.stringify({q: "w1 w2 w3", source: "en", target: "de"}),
}).then((r) => r.json()).then((d) => { document.body.dataset.result = d.translatedText; })
  .catch((e) => { document.body.dataset.result = "blocked: " + e; });
</script></body>""" % KEY.encode()


@pytest.fixture(scope="module")
def other_origin() -> Iterator[str]:
    """A second server on 127.0.0.1, another origin than the translation server's, serving CALLING_PAGE."""

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(CALLING_PAGE)

        def log_message(self, *args) -> None:
            pass

    pages = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=pages.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{pages.server_address[1]}"
    pages.shutdown()


@pytest.mark.parametrize("allowed", [True, False])
def test_a_page_on_another_origin_calls_the_api_only_where_cors_lets_it(
    browser, translator, other_origin: str, allowed: bool
) -> None:
    cors = frozenset({other_origin}) if allowed else frozenset()
    with in_process(translator, cors=cors, api_keys=ApiKeys(frozenset({KEY}))) as server:
        browser.get("about:blank")  # a fresh page: the same URL again would only change its #
        browser.get(f"{other_origin}/#{server.url}")
        WebDriverWait(browser, 30).until(lambda d: d.execute_script("return document.body.dataset.result"))
        result = browser.execute_script("return document.body.dataset.result")
    if allowed:
        assert result == alone(translator, "w1 w2 w3")[0].text
    else:
        assert result.startswith("blocked: TypeError")
