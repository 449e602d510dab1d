"""Headless Chromium driven through Selenium, for the tests that open a page in a real browser:
Debian's `chromium` and `chromium-driver` (`make test` installs them), so nothing downloads a
browser. Screenshots and logs go to test-artifacts/ at the repository root (gitignored), where
they stay after the run for CI to keep."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver

from pipeline.config import REPO_ROOT

ARTIFACTS = REPO_ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# Without the background-networking flags Chromium's own connections are refused on a closed network.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1600,1000",
)


@contextmanager
def chromium(profile: Path) -> Iterator[WebDriver]:
    """A headless Chromium with its profile in `profile`, quit on leaving."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    assert not missing, f"{', '.join(missing)} missing: `make test` installs Debian's chromium and chromium-driver"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def full_page_screenshot(driver: WebDriver, name: str) -> Path:
    """The whole page, however long, as test-artifacts/{name}; its path is printed for whoever looks for it."""
    ARTIFACTS.mkdir(exist_ok=True)
    width = driver.get_window_size()["width"]
    driver.set_window_size(width, driver.execute_script("return document.documentElement.scrollHeight") + 100)
    path = ARTIFACTS / name
    assert driver.save_screenshot(str(path)), "the browser did not save the screenshot"
    print(f"screenshot: {path}")
    return path
