"""The memory browser in a real browser: open a kin's memories, search with htmx
(no page load), edit a memory and read the change in its history."""
import pytest
from playwright.sync_api import expect

from memories import services
from memories.models import Memory
from tests.factories import KinFactory

pytestmark = pytest.mark.browser

SCREENSHOT_PATH = "/tmp/kinsite-memories.png"


def test_search_edit_and_read_the_history(logged_in_page, browser_team, browser_user):
    page = logged_in_page
    kin = KinFactory(team=browser_team, name="Ada")
    actor = services.Actor("test")
    services.memory_add(team=browser_team, kin=kin, content="The warehouse is in Leeds.", category="fact", actor=actor)
    services.memory_add(
        team=browser_team, kin=kin, content="Maria likes short answers.", category="preference", actor=actor
    )

    page.goto(f"/kins/{kin.pk}/")
    page.click("text=Memories")
    rows = page.locator("#memory-rows")
    expect(rows).to_contain_text("The warehouse is in Leeds.")
    expect(rows).to_contain_text("Maria likes short answers.")

    # A full page load would wipe this marker; an htmx swap keeps it.
    page.evaluate("window.__kinsiteMarker = 'same-page'")
    page.fill("#memory-search", "warehouse")
    expect(page.locator("#memory-rows")).not_to_contain_text("Maria likes short answers.")
    expect(page.locator("#memory-rows")).to_contain_text("The warehouse is in Leeds.")
    assert page.evaluate("window.__kinsiteMarker") == "same-page"
    assert "q=warehouse" in page.url

    page.locator("#memory-rows").get_by_role("link", name="Edit").click()
    page.fill("textarea[name=content]", "The warehouse moved to York.")
    page.fill("input[name=importance]", "8")
    page.click("text=Save")

    expect(page.locator("#memory-content")).to_have_text("The warehouse moved to York.")
    history = page.locator("#memory-history")
    expect(history.locator(".change")).to_have_count(2)
    latest = history.locator(".change").nth(1)
    expect(latest).to_contain_text("Update")
    expect(latest).to_contain_text(f"user:{browser_user.username}")
    expect(latest.locator(".before").first).to_have_text("The warehouse is in Leeds.")
    expect(latest.locator(".after").first).to_have_text("The warehouse moved to York.")
    page.screenshot(path=SCREENSHOT_PATH, full_page=True)

    memory = Memory.objects.get(content="The warehouse moved to York.")
    assert memory.importance == 8
