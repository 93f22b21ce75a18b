"""A real browser for the console's tests: Debian's headless Chromium through its chromedriver
(Selenium), and finding what a page shows once it shows it.

Not here: the console's HTTP client (console.py), the pages' own checks (tests/test_console_browser.py).
"""

from __future__ import annotations

from pathlib import Path

from tests.helpers.support import wait_for

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"  # scripts/test.sh installs both
NEXT_PAGE_S = 30  # a click's page on a loaded machine
PAGE_LOAD_S = 60


def chromium(profile: Path, *flags: str):
    """A headless Chromium with its own profile folder and nothing of its own on the network
    (no updates, no sync), its console log kept for the test to read; and any `flags` more."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        *flags,
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(PAGE_LOAD_S)
    return driver


def arrived(driver, selector: str):
    """The element, once the page a click navigated to has it."""
    return wait_for(lambda: (by_css(driver, selector) or [None])[0], f"{selector} on the next page", NEXT_PAGE_S)


def by_css(driver, selector: str):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)
