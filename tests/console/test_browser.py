"""The console in a real browser (Debian's Chromium, driven by selenium), served by the
``bolide console`` command: each page renders what it must (the lag chart drawn by uPlot), an
escaped ``<script>`` payload never runs, a dead letter is replayed through the page's form and
refused by a read-only console, the token's login, and a page of another site that can
neither post to the console nor frame it. Screenshots go to the
test's folder, or to ``$BOLIDE_CONSOLE_SCREENSHOTS`` (docs/images when the docs are made)."""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bolide.console.api import READ_ONLY
from bolide.console.settings import TOKEN_ENV
from bolide.facade import Publisher, PublisherConfig, Record, StreamConfig
from tests.conftest import eventually, http_served
from tests.console.conftest import TOKEN, Estate

pytestmark = [pytest.mark.kafka]


@pytest.fixture
def serve(estate: Estate, tmp_path: Path) -> Iterator[Callable[..., str]]:
    """``serve(*options, token=None)``: ``bolide console --port 0 --sample-interval 0.5``
    over the estate, with ``options`` and ``$BOLIDE_CONSOLE_TOKEN`` set to ``token``; its
    URL. Each is stopped with Ctrl-C at teardown and must exit 0."""
    started: list[tuple[subprocess.Popen[str], Path]] = []

    def start(*options: str, token: str | None = None) -> str:
        command = [
            sys.executable, "-m", "bolide.cli", "console",
            "-b", estate.cluster.bootstrap_servers, "--db", estate.db, "--port", "0",
            "--sample-interval", "0.5", *options,
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
        if token is not None:
            env[TOKEN_ENV] = token
        log = tmp_path / f"console-{len(started)}.log"
        with log.open("w") as errors:
            proc = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=errors, text=True, env=env
            )
        started.append((proc, log))
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("console on http://127.0.0.1:"), (line, log.read_text())
        return line.split(" on ", 1)[1].strip().rstrip("/")

    yield start
    for proc, log in started:
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


def shown_in(driver: object, tag: str, text: str) -> bool:
    """Whether the page's first ``tag`` element shows ``text`` (a page still loading:
    False)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        return text in driver.find_element("tag name", tag).text  # type: ignore[attr-defined]
    except (NoSuchElementException, StaleElementReferenceException):
        return False


def shot(driver: object, tmp_path: Path, name: str) -> None:
    folder = Path(os.environ.get("BOLIDE_CONSOLE_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(folder / f"console-{name}.png"))  # type: ignore[attr-defined]


@pytest.mark.parametrize("estate", ["sqlite"], indirect=True)
def test_every_page_renders_in_a_browser(estate, serve, browser, tmp_path):
    from selenium.webdriver.common.by import By

    served = serve("--allow-writes")

    def text_of(path: str) -> str:
        browser.get(served + path)
        return browser.find_element(By.TAG_NAME, "main").text

    overview = text_of("/")
    assert estate.stream in overview and estate.group in overview
    # The vendored htmx and the stylesheet are served from the package (no CDN).
    assert browser.execute_script("return typeof htmx") == "object"
    nav = browser.find_element(By.TAG_NAME, "nav")
    assert nav.value_of_css_property("background-color") == "rgba(29, 36, 48, 1)"
    shot(browser, tmp_path, "overview")
    # The overview refreshes itself (htmx, every 5 s): a record published now shows up in
    # its stream's end offset without a reload.
    with Publisher(estate.cluster, PublisherConfig(stream=StreamConfig(name=estate.stream))) as pub:
        pub.publish(Record(b"one more", key=b"k0"), 60)
    eventually(lambda: _row_of(browser, estate.stream).split()[3:4] == ["36"], 60)
    page = text_of(f"/streams/{estate.stream}?key=k7")
    assert "<script>window.__pwned = 1</script>" in page  # shown as text
    assert browser.execute_script("return window.__pwned === undefined")  # never ran
    shot(browser, tmp_path, "stream")
    # The lag chart is drawn by the vendored uPlot once the console has two samples.
    eventually(lambda: _chart_drawn(browser, f"{served}/groups/{estate.group}"), 60)
    assert shown(browser, "lag", "26")  # 10 committed, 36 with the record published above
    shot(browser, tmp_path, "group")
    text_of("/sql")
    browser.find_element(By.NAME, "query").send_keys(
        "SELECT stream, count(*) AS n FROM bolide_records GROUP BY stream"
    )
    browser.find_element(By.ID, "run").click()
    eventually(lambda: shown(browser, "result", "30"), 30)
    shot(browser, tmp_path, "sql")
    assert "No durable clients." in text_of("/durable")
    shot(browser, tmp_path, "durable")
    letters = text_of(f"/dlq?stream={estate.dlq}")
    assert "boom" in letters
    browser.find_elements(By.NAME, "id")[0].click()
    browser.find_element(By.ID, "replay").click()
    eventually(lambda: shown(browser, "note", "replay: 1 dead letter"), 60)
    shot(browser, tmp_path, "dlq")


def _row_of(browser: object, stream: str) -> str:
    """The overview's row of ``stream`` as shown now (``""`` while the table is swapped)."""
    from selenium.common.exceptions import StaleElementReferenceException

    try:
        rows = browser.find_elements("css selector", "#streams tbody tr")  # type: ignore[attr-defined]
        return next((r.text for r in rows if r.text.split()[:1] == [stream]), "")
    except StaleElementReferenceException:
        return ""


def _chart_drawn(browser: object, url: str) -> bool:
    """Load ``url``; whether its lag chart is a uPlot canvas."""
    browser.get(url)  # type: ignore[attr-defined]
    return bool(
        browser.execute_script(  # type: ignore[attr-defined]
            "return document.querySelector('#lag-chart .uplot canvas') !== null"
        )
    )


@pytest.mark.parametrize("estate", ["sqlite"], indirect=True)
def test_a_read_only_console_offers_no_writes_and_refuses_a_forced_one(estate, serve, browser):
    from selenium.webdriver.common.by import By

    served = serve()
    browser.get(f"{served}/dlq?stream={estate.dlq}")
    assert "read-only" in browser.find_element(By.TAG_NAME, "nav").text
    assert browser.find_elements(By.ID, "replay") == []  # no button to press
    browser.find_elements(By.NAME, "id")[0].click()
    browser.execute_script(  # the form sent anyway, as a crafted page would
        "const f = document.getElementById('letters-form');f.action = '/dlq/replay'; f.submit();"
    )
    eventually(lambda: browser.current_url.endswith("/dlq/replay"), 30)  # the answer shown
    eventually(lambda: shown_in(browser, "body", READ_ONLY), 30)
    assert _replayed(served, estate.dlq) == [[], []]  # nothing replayed


@pytest.mark.parametrize("estate", ["sqlite"], indirect=True)
def test_with_a_token_the_browser_signs_in_first(estate, serve, browser, tmp_path):
    from selenium.webdriver.common.by import By

    served = serve(token=TOKEN)
    browser.get(f"{served}/")
    eventually(lambda: browser.current_url.endswith("/login"), 30)
    shot(browser, tmp_path, "login")
    browser.find_element(By.NAME, "token").send_keys("not-the-token-at-all")
    browser.find_element(By.ID, "sign-in").click()
    eventually(lambda: shown(browser, "error", "not this console's"), 30)
    assert estate.stream not in browser.find_element(By.TAG_NAME, "body").text
    browser.find_element(By.NAME, "token").send_keys(TOKEN)
    browser.find_element(By.ID, "sign-in").click()
    eventually(lambda: shown_in(browser, "main", estate.stream), 30)
    browser.get(f"{served}/api/streams")  # the cookie serves the API too
    assert estate.stream in browser.find_element(By.TAG_NAME, "body").text


@pytest.mark.parametrize("estate", ["sqlite"], indirect=True)
def test_a_page_of_another_site_can_neither_post_to_the_console_nor_frame_it(
    estate, serve, browser, tmp_path
):
    """A page on another origin (another port) that posts a replay form to the console,
    writes allowed, and frames the console: the post is refused and nothing replayed, and
    the frame stays empty."""
    from selenium.webdriver.common.by import By

    served = serve("--allow-writes")
    letter_id = f"{estate.dlq}/0/0"
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "post.html").write_text(
        f'<form id="f" method="post" action="{served}/dlq/replay">'
        f'<input name="stream" value="{estate.dlq}"><input name="id" value="{letter_id}">'
        '</form><script>document.getElementById("f").submit()</script>'
    )
    (evil / "frame.html").write_text(f'<iframe id="console" src="{served}/"></iframe>')
    with _site(evil) as site:
        browser.get(f"{site}/post.html")
        eventually(lambda: shown_in(browser, "body", "cross-site request refused"), 30)
        browser.get(f"{site}/frame.html")
        frame = browser.find_element(By.ID, "console")
        browser.switch_to.frame(frame)
        framed = browser.find_element(By.TAG_NAME, "body").text
        browser.switch_to.default_content()
        assert estate.stream not in framed  # the browser refused to show it in a frame
    assert _replayed(served, estate.dlq) == [[], []]  # nothing replayed


def _replayed(served: str, dlq: str) -> list[list[str]]:
    """Where each dead letter of ``dlq`` was replayed to, asked of the console's API."""
    with urllib.request.urlopen(f"{served}/api/dlq/{dlq}", timeout=60) as answer:
        return [d["replayed_to"] for d in json.load(answer)["letters"]]


@contextlib.contextmanager
def _site(folder: Path) -> Iterator[str]:
    """Serve ``folder`` over HTTP on another port of 127.0.0.1 (another origin); its URL."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    with http_served(handler) as port:
        yield f"http://127.0.0.1:{port}"
