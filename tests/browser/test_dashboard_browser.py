"""The dashboard in a real browser: log in, see the demo kin, filter with htmx
without a page load, open the kin and its session."""
import json
from io import StringIO

import pytest
from django.core.management import call_command
from playwright.sync_api import expect

from kinsite.models import Team
from tests.browser.conftest import log_in
from tests.factories import KinFactory

pytestmark = pytest.mark.browser

SCREENSHOT_PATH = "/tmp/kinsite-dashboard.png"


def _create_demo() -> dict:
    out = StringIO()
    call_command("create_demo", stdout=out)
    return json.loads(out.getvalue().strip().splitlines()[-1])


def test_demo_user_logs_in_filters_kins_and_opens_the_session(page):
    demo = _create_demo()
    KinFactory(team=Team.objects.get(slug=demo["team"]), name="Grace", role="Reviewer")

    log_in(page, username=demo["dashboard_user"], password=demo["dashboard_password"])
    rows = page.locator("#kin-rows")
    expect(rows).to_contain_text("Ada")
    expect(rows).to_contain_text("Grace")
    expect(page.locator(".banner-warning")).to_contain_text("No language model is configured")

    # A full page load would wipe this marker; an htmx swap keeps it.
    page.evaluate("window.__kinsiteMarker = 'same-page'")
    page.fill("#kin-search", "ad")
    expect(rows).not_to_contain_text("Grace")
    expect(rows).to_contain_text("Ada")
    assert page.evaluate("window.__kinsiteMarker") == "same-page"
    assert "q=ad" in page.url

    page.click("#kin-rows >> text=Ada")
    expect(page.locator("h1")).to_have_text("Ada")
    expect(page.locator("main")).to_contain_text("Data assistant")
    page.click("text=Welcome chat")
    expect(page.locator(".messages")).to_contain_text("I run the data team at Northwind")
    page.screenshot(path=SCREENSHOT_PATH, full_page=True)


def test_logged_in_page_sees_its_team_and_can_log_out(logged_in_page, browser_team):
    expect(logged_in_page.locator(".team")).to_have_text(browser_team.name)
    expect(logged_in_page.locator("#kin-rows")).to_contain_text("This team has no kins yet.")
    logged_in_page.click("text=Log out")
    logged_in_page.wait_for_url("**/login/")
    expect(logged_in_page.locator("h1")).to_have_text("Log in")
