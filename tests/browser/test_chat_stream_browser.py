"""The streamed chat (kinsite/static/kinsite/chat.js) in a real browser: the reply grows
piece by piece before the turn ends, the keys (Enter sends, Shift+Enter adds a line, IME
composition does not send), one send at a time, a refused post gives the text back, a
failed turn keeps the message with its error, and the session panel refreshes after a
command without a page load."""
import threading
import time
from itertools import pairwise

import pytest
from playwright.sync_api import expect

from kinsite.llm.providers import provider_override
from kinsite.llm.types import LLMError
from sessions_app import services
from sessions_app.models import Event, IntrospectionRun, Turn
from tests.browser.conftest import PASSWORD, TIMEOUT_MS, log_in
from tests.factories import KinFactory, MessageFactory, SessionFactory
from tests.support.held_model import HeldProvider
from tests.support.scripted_model import ScriptedProvider

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("empty_turn_events")]

SCREENSHOT_PATH = "/tmp/kinsite-chat-stream.png"
REPLY = "The weekly report is due on Friday at noon, in the shared folder."

# Records every text the streamed reply showed, in order, until the server's entries replace it.
WATCH_STREAMED_TEXT = """() => {
  window.__streamed = [];
  new MutationObserver(() => {
    const text = document.querySelector("#conversation .streamed-text");
    if (text && text.textContent && text.textContent !== window.__streamed.at(-1)) {
      window.__streamed.push(text.textContent);
    }
  }).observe(document.getElementById("conversation"), {childList: true, subtree: true, characterData: true});
}"""


@pytest.fixture
def scripted():
    # A module-level override: the live server's threads see it too.
    with provider_override(ScriptedProvider()) as provider:
        yield provider


@pytest.fixture
def held():
    provider = HeldProvider(hold_after=3)
    with provider_override(provider):
        yield provider
        provider.release.set()  # a failed test must not leave the turn's thread waiting


@pytest.fixture
def chat(browser_team):
    kin = KinFactory(team=browser_team, name="Ada", role="Data assistant")
    chat = SessionFactory(kin=kin, title="Weekly report")
    MessageFactory(session=chat, content="I run the data team at Northwind.", sender="Maria", platform="web")
    return chat


def turn_threads_ended(chat):
    """Waits for the session's streamed turns to end (their threads, with any eager task they
    ran): with SQLite's in-memory test database, a read here while such a thread writes fails
    ("table is locked")."""
    for thread in threading.enumerate():
        if thread.name == f"turn-stream-session-{chat.pk}":
            thread.join(timeout=30)


def user_messages(chat):
    turn_threads_ended(chat)
    return list(Event.objects.filter(session=chat, role="user").order_by("created_at", "id")
                .values_list("content", flat=True))


def test_the_reply_streams_in_pieces_then_becomes_the_stored_entries(logged_in_page, chat, held):
    page = logged_in_page
    held.piece_delay = 0.05
    held.add(
        {"tool_calls": [{"name": "memorize", "arguments": {"content": "The weekly report is due on Friday.",
                                                            "category": "fact"}}]},
        REPLY,
    )
    page.goto(f"/sessions/{chat.pk}/")
    page.evaluate("window.__kinsiteMarker = 'same-page'")
    page.evaluate(WATCH_STREAMED_TEXT)

    page.fill("#chat-content", "When is the weekly report due?")
    page.press("#chat-content", "Enter")

    conversation = page.locator("#conversation")
    # At once: the message shows, the box is emptied, and Send waits for the reply.
    expect(conversation).to_contain_text("When is the weekly report due?")
    expect(page.locator("#chat-content")).to_have_value("")
    expect(page.locator("#chat-form button[type=submit]")).to_be_disabled()
    expect(page.locator("#chat-form .htmx-indicator")).to_be_visible()
    # The model is held after three pieces: they are shown, under the tool call that ran.
    streaming = conversation.locator(".message.streaming")
    expect(streaming.locator(".streamed-text")).to_have_text("The weekly report ")
    expect(streaming.locator("details.tool-calls summary")).to_have_text("1 tool call: memorize")
    expect(streaming.locator(".tool-result")).to_contain_text('"status": "created"')
    page.screenshot(path=SCREENSHOT_PATH, full_page=True)
    held.release.set()

    reply = conversation.locator(".message.role-assistant").last
    expect(reply.locator(".content")).to_have_text(REPLY)
    expect(conversation.locator(".message.streaming")).to_have_count(0)
    expect(page.locator("#chat-form button[type=submit]")).to_be_enabled()
    shown = page.evaluate("window.__streamed")
    # The last pieces may come with `done`, in one read: the observer then sees the entries only.
    assert len(shown) >= 3 and all(REPLY.startswith(text) for text in shown)
    assert all(later.startswith(earlier) and later != earlier for earlier, later in pairwise(shown))
    # The streamed bubble became the stored entries (their ids), without a page load.
    turn_threads_ended(chat)
    turn = Turn.objects.get()
    expect(conversation.locator(f"#event-{turn.user_message_id}")).to_contain_text("When is the weekly report due?")
    expect(conversation.locator(f"#event-{turn.reply_id}")).to_contain_text(REPLY)
    # Folded, as the page shows it.
    expect(conversation.locator(f"#event-{turn.reply_id} .tool-result")).not_to_be_visible()
    expect(page.locator("#chat-form .htmx-indicator")).not_to_be_visible()
    assert page.evaluate("window.__kinsiteMarker") == "same-page"


def test_enter_sends_and_shift_enter_adds_a_line(logged_in_page, chat, scripted):
    page = logged_in_page
    for index in range(30):
        MessageFactory(session=chat, content=f"older message {index}", sender="Maria", platform="web")
    scripted.add("Two lines received.", "Sent with Ctrl+Enter.")
    page.goto(f"/sessions/{chat.pk}/")
    box = page.locator("#chat-content")
    # Reading the oldest messages, the window scrolled down to the panel, the box focused.
    page.evaluate("""() => {
      const scroller = document.querySelector(".chat-scroll");
      scroller.scrollTop = -scroller.scrollHeight;
      window.scrollTo(0, document.body.scrollHeight);
      document.getElementById("chat-content").focus({preventScroll: true});
    }""")
    expect(page.locator("#conversation > li").last).not_to_be_in_viewport()

    page.keyboard.type("first line")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("second line")

    expect(box).to_have_value("first line\nsecond line")
    assert user_messages(chat)[-1] == "older message 29"

    page.keyboard.press("Enter")
    expect(page.locator("#conversation")).to_contain_text("Two lines received.")
    expect(box).to_have_value("")
    # The view follows the newest message.
    expect(page.locator("#conversation > li").last).to_contain_text("Two lines received.")
    expect(page.locator("#conversation > li").last).to_be_in_viewport()
    assert user_messages(chat)[-1] == "first line\nsecond line"

    page.keyboard.type("third")
    page.keyboard.press("Control+Enter")
    expect(page.locator("#conversation")).to_contain_text("Sent with Ctrl+Enter.")
    assert user_messages(chat)[-1] == "third"


def test_enter_while_composing_or_streaming_does_not_send(logged_in_page, chat, held):
    page = logged_in_page
    held.add(REPLY)
    page.goto(f"/sessions/{chat.pk}/")
    box = page.locator("#chat-content")

    box.fill("かな")
    # An IME confirming a word with Enter: not a send (a send starts at once, in the key's handler).
    prevented = box.evaluate("""box => {
      const event = new KeyboardEvent("keydown", {key: "Enter", isComposing: true, bubbles: true, cancelable: true});
      box.dispatchEvent(event);
      return event.defaultPrevented;
    }""")
    assert prevented is False
    expect(page.locator("#conversation .message.pending")).to_have_count(0)
    expect(box).to_have_value("かな")

    box.press("Enter")
    expect(page.locator("#conversation .message.streaming .streamed-text")).to_have_text("The weekly report ")
    box.fill("a second message")
    box.press("Enter")
    expect(page.locator("#chat-form button[type=submit]")).to_be_disabled()
    expect(page.locator("#conversation .message.pending")).to_have_count(0)
    held.release.set()

    expect(page.locator("#conversation")).to_contain_text(REPLY)
    # The second message waits in the box: one send at a time.
    expect(box).to_have_value("a second message")
    assert user_messages(chat)[1:] == ["かな"]


def test_a_refused_post_gives_the_text_back(logged_in_page, chat, scripted):
    page = logged_in_page
    page.goto(f"/sessions/{chat.pk}/")
    # The page's own requests are answered (the live server shares this thread's SQLite connection).
    expect(page.locator('#prompt-preview [data-section="identity"]')).to_be_visible()
    services.session_archive(session=chat)  # archived by someone else since the page loaded

    page.fill("#chat-content", "Are you still there?")
    page.press("#chat-content", "Enter")

    expect(page.locator("#chat-form-fields .errors")).to_contain_text("archived")
    expect(page.locator("#chat-content")).to_have_value("Are you still there?")
    expect(page.locator("#conversation")).not_to_contain_text("Are you still there?")
    expect(page.locator("#chat-form button[type=submit]")).to_be_enabled()
    assert len(user_messages(chat)) == 1


def test_a_failed_turn_keeps_the_message_and_shows_the_error_as_text(logged_in_page, chat, scripted):
    page = logged_in_page
    scripted.add(LLMError("The endpoint answered 503 <img src=x onerror=\"window.__pwned=1\">."))
    page.goto(f"/sessions/{chat.pk}/")

    page.fill("#chat-content", "Are you there?")
    page.press("#chat-content", "Enter")

    message = page.locator("#conversation .message.role-user").last
    expect(message.locator(".turn-error")).to_contain_text('The endpoint answered 503 <img src=x onerror=')
    expect(message).to_contain_text("Are you there?")
    expect(page.locator("#conversation .message.streaming")).to_have_count(0)
    turn_threads_ended(chat)
    [stored] = Event.objects.filter(session=chat, content="Are you there?")
    expect(message).to_have_attribute("id", f"event-{stored.pk}")
    assert page.evaluate("window.__pwned") is None
    assert Turn.objects.get().status == Turn.Status.FAILED


def test_the_panel_refreshes_after_a_checkpoint_command(logged_in_page, chat, scripted):
    page = logged_in_page
    scripted.add(
        {"tool_calls": [
            {"name": "working_memory_update", "arguments": {"content": "Goal: weekly report by Friday."}},
            {"name": "session_description_update", "arguments": {"description": "Weekly report planning"}},
        ]},
        "Updated the notes.",
    )
    page.goto(f"/sessions/{chat.pk}/")
    panel = page.locator("#introspection")
    expect(panel.locator(".introspection-runs")).to_contain_text("No introspection runs yet.")
    page.evaluate("window.__kinsiteMarker = 'same-page'")

    page.fill("#chat-content", "/checkpoint")
    page.press("#chat-content", "Enter")

    expect(page.locator("#conversation")).to_contain_text("Checkpoint recorded")
    run = page.locator("#introspection .introspection-run")
    expect(run).to_have_count(1)
    expect(run.locator(".run-trigger")).to_have_text("Checkpoint")
    expect(page.locator('#introspection [data-field="working_memory"]')).to_have_text(
        "Goal: weekly report by Friday.")
    expect(page.locator("#session-description")).to_have_text("Weekly report planning")
    expect(page.locator('#prompt-preview [data-section="working_memory"]')).to_contain_text("Goal: weekly report")
    assert page.evaluate("window.__kinsiteMarker") == "same-page"
    turn_threads_ended(chat)
    assert IntrospectionRun.objects.get(session=chat).trigger == "checkpoint"


def test_on_a_phone_keyboard_enter_adds_a_line_and_the_button_sends(browser, live_server, browser_user, chat,
                                                                     scripted):
    """A touch screen has no Shift+Enter: there Enter makes the new line and Send sends."""
    context = browser.new_context(base_url=live_server.url, viewport={"width": 390, "height": 844},
                                  is_mobile=True, has_touch=True)
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    in_flight = set()
    page.on("request", lambda request: in_flight.add(request))
    page.on("requestfinished", lambda request: in_flight.discard(request))
    page.on("requestfailed", lambda request: in_flight.discard(request))
    try:
        log_in(page, username=browser_user.username, password=PASSWORD)
        scripted.add("Got both lines.")
        page.goto(f"/sessions/{chat.pk}/")
        box = page.locator("#chat-content")
        expect(page.locator(".chat-keys")).to_have_text("Enter adds a line; Send sends")

        box.click()
        page.keyboard.type("first line")
        page.keyboard.press("Enter")
        page.keyboard.type("second line")
        expect(box).to_have_value("first line\nsecond line")
        expect(page.locator("#conversation .message.pending")).to_have_count(0)

        page.locator("#chat-form button[type=submit]").tap()
        expect(page.locator("#conversation")).to_contain_text("Got both lines.")
        assert user_messages(chat)[-1] == "first line\nsecond line"
        # The stream's end and the panel refresh after it: no request may still be served when
        # the test's database is flushed (a live-server thread would find it locked).
        deadline = time.monotonic() + 10
        while in_flight and time.monotonic() < deadline:
            page.wait_for_timeout(50)
    finally:
        context.close()
