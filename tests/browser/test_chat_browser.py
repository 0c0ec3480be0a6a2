"""The session chat in a real browser: the prompt preview follows what is typed, and a
posted message and its reply (tool calls folded) appear without a page load."""
import pytest
from playwright.sync_api import expect

from kinsite.llm.providers import ScriptedProvider, provider_override
from sessions_app.models import Event
from tests.factories import KinFactory, MessageFactory, SessionFactory

pytestmark = pytest.mark.browser

SCREENSHOT_PATH = "/tmp/kinsite-chat.png"


@pytest.fixture
def scripted():
    # A module-level override: the live server's thread sees it too.
    with provider_override(ScriptedProvider()) as provider:
        yield provider


def test_post_a_message_and_see_the_reply_and_the_preview_update(logged_in_page, browser_team, browser_user, scripted):
    page = logged_in_page
    kin = KinFactory(team=browser_team, name="Ada", role="Data assistant")
    chat = SessionFactory(kin=kin, title="Weekly report")
    MessageFactory(session=chat, content="I run the data team at Northwind.", sender="Maria", platform="web")
    scripted.add(
        {"tool_calls": [{"name": "memorize", "arguments": {"content": "The weekly report is due on Friday.",
                                                            "category": "fact"}}]},
        "Noted: the weekly report is due on Friday.",
    )

    page.goto(f"/sessions/{chat.pk}/")
    preview = page.locator("#prompt-preview")
    expect(preview.locator('[data-section="identity"]')).to_be_visible()
    expect(preview.locator("[data-history-count]")).to_have_attribute("data-history-count", "1")
    expect(page.locator("#chat-sender")).to_have_value(browser_user.username)

    # A full page load would wipe this marker; htmx swaps keep it.
    page.evaluate("window.__kinsiteMarker = 'same-page'")
    page.fill("#chat-content", "The weekly report is due on Friday, remember that.")
    # The typed message counts as the one about to be sent.
    expect(preview.locator("[data-history-count]")).to_have_attribute("data-history-count", "2")
    expect(preview).to_contain_text(f"Sender: {browser_user.username}")

    page.click("#chat-form button[type=submit]")
    conversation = page.locator("#conversation")
    expect(conversation).to_contain_text("Noted: the weekly report is due on Friday.")
    expect(conversation).to_contain_text("The weekly report is due on Friday, remember that.")
    expect(page.locator("#chat-content")).to_have_value("")
    # The stored message, the tool round and the reply are history now; nothing is typed.
    expect(preview.locator("[data-history-count]")).to_have_attribute("data-history-count", "5")
    expect(preview).to_contain_text("(3 messages, the rest tool calls and results)")
    assert page.evaluate("window.__kinsiteMarker") == "same-page"

    tool_calls = conversation.locator("details.tool-calls")
    expect(tool_calls).to_have_count(1)
    expect(tool_calls.locator("summary")).to_contain_text("1 tool call: memorize")
    expect(tool_calls.locator(".tool-result")).not_to_be_visible()
    tool_calls.locator("summary").click()
    expect(tool_calls.locator(".tool-result")).to_be_visible()
    preview.locator('[data-section="participants"] summary').click()
    page.screenshot(path=SCREENSHOT_PATH, full_page=True)

    assert [(e.role, e.kind) for e in Event.objects.filter(session=chat).order_by("created_at", "id")] == [
        ("user", "message"), ("user", "message"), ("assistant", "tool_call"), ("tool", "tool_result"),
        ("assistant", "message"),
    ]
