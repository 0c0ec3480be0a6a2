"""The session chat in a real browser: the prompt preview follows what is typed, a
posted message and its reply (tool calls folded) appear without a page load, and
"Checkpoint now" swaps in the introspection run with what it changed."""
import pytest
from playwright.sync_api import expect

from kinsite.llm.providers import provider_override
from sessions_app.models import Event, IntrospectionRun, Session
from tests.factories import KinFactory, MessageFactory, SessionFactory
from tests.support.scripted_model import ScriptedProvider

pytestmark = pytest.mark.browser

SCREENSHOT_PATH = "/tmp/kinsite-chat.png"
INTROSPECTION_SCREENSHOT_PATH = "/tmp/kinsite-introspection.png"


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


def test_checkpoint_now_shows_the_run_and_what_it_changed(logged_in_page, browser_team, scripted):
    page = logged_in_page
    kin = KinFactory(team=browser_team, name="Ada", role="Data assistant")
    chat = SessionFactory(kin=kin, title="Churn report", working_memory="Goal: churn report.")
    MessageFactory(session=chat, content="Our churn report deduplicates by customer id from now on.",
                   sender="Maria", platform="web")
    Session.objects.filter(pk=chat.pk).update(introspection_pending=True)
    scripted.add(
        {"tool_calls": [
            {"name": "memory_add", "arguments": {"content": "The churn report deduplicates by customer id.",
                                                 "category": "decision", "importance": 7}},
            {"name": "working_memory_update", "arguments": {"content": "Goal: churn report.\nDecided: dedup by id."}},
            {"name": "session_description_update", "arguments": {"description": "Churn report: dedup rules"}},
        ]},
        "Stored the dedup decision.",
    )

    page.goto(f"/sessions/{chat.pk}/")
    panel = page.locator("#introspection")
    expect(panel.locator(".introspection-runs")).to_contain_text("No introspection runs yet.")
    expect(panel.locator(".introspection-state")).to_contain_text("Introspection pending")
    page.evaluate("window.__kinsiteMarker = 'same-page'")

    panel.get_by_role("button", name="Checkpoint now").click()

    run_item = page.locator(".introspection-run")
    expect(run_item).to_have_count(1)
    expect(run_item).to_have_attribute("data-run-status", "done")
    expect(run_item.locator(".run-trigger")).to_have_text("Checkpoint")
    expect(run_item).to_contain_text("1 event read")
    expect(run_item.locator(".run-summary")).to_contain_text("Introspection added 1 memory")
    expect(page.locator("#introspection .introspection-state")).to_contain_text("Nothing pending")
    expect(page.locator('#introspection [data-field="working_memory"]')).to_contain_text("Decided: dedup by id.")
    # The description under the title is refreshed out of band.
    expect(page.locator("#session-description")).to_have_text("Churn report: dedup rules")
    # The prompt preview reloads with the new working memory.
    expect(page.locator('#prompt-preview [data-section="working_memory"]')).to_contain_text("Decided: dedup by id.")
    assert page.evaluate("window.__kinsiteMarker") == "same-page"

    tool_calls = run_item.locator("details.tool-calls")
    expect(tool_calls.locator("summary")).to_contain_text(
        "3 tool calls: memory_add, working_memory_update, session_description_update")
    tool_calls.locator("summary").click()
    expect(tool_calls.locator(".tool-arguments").first).to_contain_text("deduplicates by customer id")
    run_item.locator(".memories-touched").scroll_into_view_if_needed()
    page.screenshot(path=INTROSPECTION_SCREENSHOT_PATH, full_page=True)

    run = IntrospectionRun.objects.get(session=chat)
    assert (run.trigger, run.status) == ("checkpoint", "done")
    [touched] = run.memories_touched
    run_item.locator(".memories-touched a").click()
    page.wait_for_url(f"**/kins/{kin.pk}/memories/{touched['id']}/")
    expect(page.locator("main")).to_contain_text("The churn report deduplicates by customer id.")
