"""Debian's headless Chromium driven through its own chromedriver (selenium), for the browser tests.

The packages are installed when they are missing and the tests run as root; otherwise the test
fails with the command to run. A browser test is never skipped."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
INSTALL = "apt-get update && apt-get install -y chromium chromium-driver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--lang=en-US",
)
WIDTH, HEIGHT = 1360, 900


def _present() -> bool:
    return CHROMIUM.exists() and CHROMEDRIVER.exists()


def ensure_chromium() -> None:
    if _present():
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        done = subprocess.run(["bash", "-c", INSTALL], capture_output=True, text=True, timeout=900)
        if _present():
            return
        pytest.fail(f"installing Chromium failed ({INSTALL}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    pytest.fail(f"the browser tests need Debian's Chromium and its driver; run as root: {INSTALL}")


def start_driver(profile: Path) -> Any:
    """A fresh headless Chromium with its own profile directory; nothing is downloaded."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    ensure_chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_argument(f"--window-size={WIDTH},{HEIGHT}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=str(CHROMEDRIVER), log_output=subprocess.DEVNULL)
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(20)
    return driver


def screenshot(driver: Any, path: Path, max_height: int = 2000) -> None:
    """The page down to the end of its content (at most ``max_height`` CSS pixels), as a PNG."""
    bottom = driver.execute_script("return Math.ceil(document.querySelector('main').getBoundingClientRect().bottom);")
    height = min(int(bottom) + 8, max_height)
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": WIDTH, "height": max(height, 200), "scale": 1},
        },
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(base64.b64decode(shot["data"]))


def csp_violations(driver: Any) -> list[str]:
    """What the browser's console said about the Content-Security-Policy since the last call."""
    return [e["message"] for e in driver.get_log("browser") if "Content Security Policy" in e["message"]]
