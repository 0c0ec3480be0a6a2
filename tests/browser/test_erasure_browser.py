"""Erasing a person from the dashboard in Chromium: an admin previews what would go, erases
it, and sees the receipt; the messages are gone from the session page."""
import pytest
from playwright.sync_api import expect

from erasure.models import Erasure
from tests.browser.conftest import PASSWORD, log_in
from tests.erasure.conftest import build_zelda
from tests.factories import KinFactory, MembershipFactory, UserFactory

pytestmark = pytest.mark.browser


def test_admin_previews_and_erases_a_person(page, live_server, browser_team):
    admin = UserFactory()
    MembershipFactory(team=browser_team, user=admin, role="admin")
    kin = KinFactory(team=browser_team, name="Ada")
    zelda = build_zelda(kin)
    log_in(page, username=admin.username, password=PASSWORD)

    page.get_by_role("link", name="Erasure").click()
    expect(page.locator("h1")).to_have_text("Erase a person")
    page.fill("#id_sender", "Zelda Quist")
    page.fill("#id_subject", "Zelda")
    page.get_by_role("button", name="Preview").click()
    expect(page.locator("#erasure-preview")).to_contain_text("12 Lark Lane")
    assert not Erasure.objects.exists()

    page.locator("#erase-confirm").click()
    receipt = Erasure.objects.get()
    row = page.locator(f"#receipt-{receipt.pk}")
    expect(row).to_contain_text("Zelda Quist")
    expect(row).to_contain_text(f"messages {receipt.counts['messages']}")

    page.goto(f"{live_server.url}/sessions/{zelda['session'].pk}/")
    expect(page.locator("main")).to_contain_text("The weather is mild today")
    expect(page.locator("main")).not_to_contain_text("Lark Lane")
