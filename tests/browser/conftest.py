"""Browser fixtures: one headless Debian Chromium per test run (Playwright's
sync API), a fresh page per test, and a page already logged in to a team."""
import os
import threading
import time

import pytest
from playwright.sync_api import sync_playwright

from tests.factories import MembershipFactory, TeamFactory, UserFactory

# Playwright's sync API keeps an asyncio loop registered on the main thread for
# the whole run, so Django's async-safety check would refuse every ORM call in
# test code (here and in test files collected after this one).
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM_PATH = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
TIMEOUT_MS = 10_000
PASSWORD = "pass-word-123"  # tests.factories.UserFactory's password


@pytest.fixture(scope="session")
def browser():
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM_PATH, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, live_server):
    """A fresh browser context (no cookies) per test, against the live server."""
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1200, "height": 800})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    yield page
    context.close()
    live_server_requests_ended()


def live_server_requests_ended(timeout: float = 10.0) -> None:
    """Waits (up to `timeout` seconds) for the live server's request threads, and the streamed
    turns they started, to end. A request the page started just before the test ended (an htmx
    refresh after a streamed turn, say) can still be reading when the test database is emptied;
    with SQLite's shared in-memory database that read makes the teardown's DELETE fail
    ("database table is locked")."""
    deadline = time.monotonic() + timeout
    for thread in threading.enumerate():
        if thread.name.endswith("(process_request_thread)") or thread.name.startswith("turn-stream-"):
            thread.join(timeout=max(0.0, deadline - time.monotonic()))


def log_in(page, *, username: str, password: str) -> None:
    """Log in through the real login form and wait for the dashboard."""
    page.goto("/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url("**/kins/**")


@pytest.fixture
def browser_team(transactional_db):
    return TeamFactory()


@pytest.fixture
def browser_user(browser_team):
    user = UserFactory()
    MembershipFactory(team=browser_team, user=user, role="owner")
    return user


@pytest.fixture
def logged_in_page(page, browser_user):
    """A page logged in as `browser_user`, an owner of `browser_team`; add rows
    to `browser_team` and `page.goto()` the page under test."""
    log_in(page, username=browser_user.username, password=PASSWORD)
    return page
