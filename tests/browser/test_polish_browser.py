"""What a team notices, in a real browser: the favicon loads, revoking a token asks first,
the memory search keeps its status filter, an empty list's link leads to the action."""
import pytest
from playwright.sync_api import expect

from kinsite.models import ApiToken
from kinsite.services import api_token_issue
from memories import services
from tests.factories import KinFactory

pytestmark = pytest.mark.browser


def test_the_favicon_link_loads_an_svg(logged_in_page):
    page = logged_in_page
    content_type = page.evaluate(
        "fetch(document.querySelector('link[rel=icon]').href).then(r => r.ok && r.headers.get('content-type'))"
    )
    assert content_type.startswith("image/svg+xml")
    assert page.evaluate("fetch('/favicon.ico').then(r => r.ok && r.url.endsWith('/static/kinsite/favicon.svg'))")


def test_revoke_asks_first_cancel_keeps_the_token_and_revoke_says_so(logged_in_page, browser_team, browser_user):
    page = logged_in_page
    token, _ = api_token_issue(team=browser_team, name="support-bot", user=browser_user)

    page.goto("/tokens/")
    page.locator(f"#token-{token.pk}").get_by_role("link", name="Revoke…").click()
    expect(page.locator("h1")).to_have_text("Revoke the token “support-bot”?")
    expect(page.locator("#token-details")).to_contain_text(f"{token.prefix}…")
    page.get_by_role("link", name="Cancel").click()
    page.wait_for_url("**/tokens/")
    expect(page.locator(f"#token-{token.pk}")).to_contain_text("active")
    token.refresh_from_db()
    assert token.revoked_at is None

    page.locator(f"#token-{token.pk}").get_by_role("link", name="Revoke…").click()
    page.get_by_role("button", name="Revoke").click()
    page.wait_for_url("**/tokens/")
    expect(page.locator(".token-message")).to_contain_text("The token “support-bot” is revoked")
    expect(page.locator(f"#token-{token.pk}")).to_contain_text("revoked")
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None


def test_memory_search_keeps_the_status_filter(logged_in_page, browser_team):
    page = logged_in_page
    kin = KinFactory(team=browser_team, name="Ada")
    actor = services.Actor("test")
    old = services.memory_add(team=browser_team, kin=kin, content="The warehouse is in Leeds.", actor=actor).memory
    newer = services.memory_add(team=browser_team, kin=kin, content="The warehouse moved to York.", actor=actor).memory
    services.memory_supersede(memory=old, actor=actor, reason="moved", superseded_by=newer)

    page.goto(f"/kins/{kin.pk}/memories/")
    page.evaluate("window.__kinsiteMarker = 'same-page'")
    page.fill("#memory-search", "warehouse")
    rows = page.locator("#memory-rows")
    expect(rows).to_contain_text("The warehouse moved to York.")
    expect(rows).not_to_contain_text("Leeds")

    page.select_option("#memory-status", "superseded")
    expect(rows).to_contain_text("The warehouse is in Leeds.")
    expect(rows).not_to_contain_text("York")
    assert "status=superseded" in page.url and "q=warehouse" in page.url
    assert page.evaluate("window.__kinsiteMarker") == "same-page"


def test_the_empty_kin_list_leads_to_the_new_kin_form(logged_in_page):
    page = logged_in_page
    page.goto("/kins/")
    page.locator("#kin-rows .empty").get_by_role("link", name="Create the first kin").click()
    page.wait_for_url("**/kins/new/")
    expect(page.locator("h1")).to_have_text("New kin")
