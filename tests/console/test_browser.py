"""The console in a real browser (Debian's Chromium, driven by selenium), served by the
``bolide console`` command: each page renders what it must, an escaped ``<script>`` payload
never runs, and a dead letter is replayed through the page's form. Screenshots go to the
test's folder, or to ``$BOLIDE_CONSOLE_SCREENSHOTS`` (docs/images when the docs are made)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import eventually
from tests.console.conftest import Estate

pytestmark = [pytest.mark.kafka]


@pytest.fixture
def served(estate: Estate, tmp_path: Path) -> Iterator[str]:
    """``bolide console --port 0 --allow-writes`` over the estate; its URL."""
    command = [
        sys.executable, "-m", "bolide.cli", "console",
        "-b", estate.cluster.bootstrap_servers, "--db", estate.db, "--port", "0",
        "--allow-writes",
    ]  # fmt: skip
    log = tmp_path / "console.log"
    with log.open("w") as errors:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("console on http://127.0.0.1:"), (line, log.read_text())
        yield line.split(" on ", 1)[1].strip()
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: a clean stop
        code = proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()
        assert code == 0, log.read_text()


@pytest.fixture
def browser() -> Iterator[object]:
    driver_path = shutil.which("chromedriver")
    chromium = shutil.which("chromium")
    if driver_path is None or chromium is None:
        pytest.skip("Debian's chromium and chromium-driver are not installed (./dev installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def shown(driver: object, element_id: str, text: str) -> bool:
    """Whether the element ``element_id`` is there and shows ``text`` (not yet: False)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        return text in driver.find_element("id", element_id).text  # type: ignore[attr-defined]
    except (NoSuchElementException, StaleElementReferenceException):
        return False


def shot(driver: object, tmp_path: Path, name: str) -> None:
    folder = Path(os.environ.get("BOLIDE_CONSOLE_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(folder / f"console-{name}.png"))  # type: ignore[attr-defined]


@pytest.mark.parametrize("estate", ["sqlite"], indirect=True)
def test_every_page_renders_in_a_browser(estate, served, browser, tmp_path):
    from selenium.webdriver.common.by import By

    def text_of(path: str) -> str:
        browser.get(served.rstrip("/") + path)
        return browser.find_element(By.TAG_NAME, "main").text

    overview = text_of("/")
    assert estate.stream in overview and estate.group in overview
    # The vendored htmx and the stylesheet are served from the package (no CDN).
    assert browser.execute_script("return typeof htmx") == "object"
    nav = browser.find_element(By.TAG_NAME, "nav")
    assert nav.value_of_css_property("background-color") == "rgba(29, 36, 48, 1)"
    shot(browser, tmp_path, "overview")
    page = text_of(f"/streams/{estate.stream}?key=k7")
    assert "<script>window.__pwned = 1</script>" in page  # shown as text
    assert browser.execute_script("return window.__pwned === undefined")  # never ran
    shot(browser, tmp_path, "stream")
    assert "Lag over time" in text_of(f"/groups/{estate.group}")
    shot(browser, tmp_path, "group")
    text_of("/sql")
    browser.find_element(By.NAME, "query").send_keys(
        "SELECT stream, count(*) AS n FROM bolide_records GROUP BY stream"
    )
    browser.find_element(By.ID, "run").click()
    eventually(lambda: shown(browser, "result", "30"), 30)
    shot(browser, tmp_path, "sql")
    assert "No durable clients." in text_of("/durable")
    letters = text_of(f"/dlq?stream={estate.dlq}")
    assert "boom" in letters
    browser.find_elements(By.NAME, "id")[0].click()
    browser.find_element(By.ID, "replay").click()
    eventually(lambda: shown(browser, "note", "replay: 1 dead letter"), 60)
    shot(browser, tmp_path, "dlq")
