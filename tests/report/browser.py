"""A page loaded in a real headless browser: Debian's chromium driven by Playwright.

The browser is the system's ``chromium`` (installed by ``make browser``, a step of ``make test``:
``apt-get install chromium``); Playwright only drives it (``executable_path``), it never downloads a
browser of its own. :func:`chromium_path` is None where no chromium is installed; the tests skip then.

:func:`load_page` opens a file from ``file://`` with JavaScript on (the report needs none; it is on
so that any script error would surface as a page error), waits for the load event, collects every
console message of type error or warning and every uncaught page error, reads every
``img[data-figure]`` (whether it finished loading, its natural size, its ``alt``, whether it sits in
a ``<figure>`` with a ``<figcaption>``, and the ``h2`` section it falls under), every link, and
writes a full-page screenshot.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

# Names Debian and other distributions give the chromium binary, in the order tried.
CHROMIUM_NAMES = ("chromium", "chromium-browser")

# Read in the page after load: one object per figure, per link and per h2 section.
_READ_PAGE = """() => {
  const sectionOf = (el) => {
    let node = el;
    while (node && node.parentElement !== document.body) node = node.parentElement;
    for (let prev = node; prev; prev = prev.previousElementSibling)
      if (prev.tagName === 'H2') return prev.id || prev.textContent.trim();
    return null;
  };
  const figures = [...document.querySelectorAll('img[data-figure]')].map((img) => ({
    id: img.dataset.figure, complete: img.complete, naturalWidth: img.naturalWidth,
    naturalHeight: img.naturalHeight, alt: img.getAttribute('alt') || '',
    inFigure: img.closest('figure') !== null,
    caption: img.closest('figure')?.querySelector('figcaption')?.textContent.trim() || '',
    section: sectionOf(img), src: img.getAttribute('src').slice(0, 22),
  }));
  const links = [...document.querySelectorAll('a[href]')].map((a) => ({
    href: a.getAttribute('href'), resolved: a.href, text: a.textContent.trim() }));
  const sections = [...document.querySelectorAll('h2')].map((h) => ({ id: h.id, title: h.textContent.trim() }));
  return { title: document.title, figures, links, sections,
           tables: document.querySelectorAll('table').length,
           scripts: document.querySelectorAll('script').length,
           width: document.documentElement.scrollWidth, height: document.documentElement.scrollHeight };
}"""


@dataclass
class LoadedPage:
    """What the browser saw: console messages (type, text), page errors, failed requests and the page's content."""

    url: str
    console: list[tuple[str, str]] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    content: dict = field(default_factory=dict)
    screenshot: Path | None = None
    browser_version: str = ""

    @property
    def console_errors(self) -> list[str]:
        return [text for kind, text in self.console if kind == "error"]


def chromium_path() -> str | None:
    """The system chromium binary, or None when none is installed."""
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def load_page(path: Path, screenshot: Path, *, executable: str, width: int = 1280, timeout_ms: int = 30_000) -> LoadedPage:
    """Open ``path`` (a local file) in headless chromium at ``executable``; read it and write a
    full-page PNG screenshot to ``screenshot``. Never touches the network: any request that is not
    ``file:`` or ``data:`` is recorded in ``failed_requests`` and aborted."""
    from playwright.sync_api import sync_playwright

    url = Path(path).resolve().as_uri()
    loaded = LoadedPage(url=url)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True)
        try:
            loaded.browser_version = browser.version
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.on("console", lambda message: loaded.console.append((message.type, message.text)))
            page.on("pageerror", lambda error: loaded.page_errors.append(str(error)))
            page.on("requestfailed", lambda request: loaded.failed_requests.append(f"{request.url}: {request.failure}"))

            def only_local(route):
                if route.request.url.startswith(("file:", "data:")):
                    route.continue_()
                else:
                    loaded.failed_requests.append(f"{route.request.url}: not a local resource")
                    route.abort()

            page.route("**/*", only_local)
            page.goto(url, wait_until="load", timeout=timeout_ms)
            loaded.content = page.evaluate(_READ_PAGE)
            page.screenshot(path=str(screenshot), full_page=True)
            loaded.screenshot = Path(screenshot)
        finally:
            browser.close()
    return loaded
