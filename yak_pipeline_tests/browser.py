"""A real headless Chromium for the web page's tests: Debian's ``chromium`` driven through its
``chromedriver`` by Selenium (``make browser`` installs both; ``.ci/run`` runs it through ``make test``).

The driver path is given explicitly, so Selenium never tries to download a driver or a browser.
A missing browser fails the tests with one line saying how to install it: they never skip.
Chromium starts with the flags that keep it off the network (no background requests, updates,
sync or QUIC) and a fresh profile, so it talks only to the test's server on 127.0.0.1.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER_PATH", "/usr/bin/chromedriver")
QUIET_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--disable-default-apps", "--disable-extensions", "--window-size=1280,900")


@contextmanager
def chromium() -> Iterator[WebDriver]:
    """A headless Chromium with a fresh profile, quit (and its profile removed) afterwards."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        pytest.fail(f"{' and '.join(missing)} not found: run `make browser` (Debian's chromium and chromium-driver), "
                    "or set CHROMIUM_PATH and CHROMEDRIVER_PATH", pytrace=False)
    profile = Path(tempfile.mkdtemp(prefix="yak-chromium-"))
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*QUIET_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
