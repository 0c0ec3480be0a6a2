"""A model outage in the chat, in Chromium against the local fake OpenAI-compatible server: the
failed turn shows its error, what to check and Retry (no "Answering…" left behind, streamed or
not); once the model answers again, Retry gets the reply onto the page, with the message stored
and shown once."""
import pytest
from playwright.sync_api import expect

from sessions_app.models import Event, Turn
from tests.browser.test_chat_stream_browser import turn_threads_ended
from tests.factories import KinFactory, SessionFactory

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("empty_turn_events", "fake_llm_gateway")]


@pytest.fixture
def chat(browser_team):
    return SessionFactory(kin=KinFactory(team=browser_team, name="Ada"), title="Outage")


def model_down(fake_llm):
    # Every attempt of the provider (fake_llm_provider retries twice) answers 503.
    for _ in range(3):
        fake_llm.error(503, "The model is overloaded")


def test_a_model_outage_shows_the_error_with_retry_and_retry_answers_once_it_is_back(logged_in_page, chat, fake_llm):
    page = logged_in_page
    model_down(fake_llm)
    page.goto(f"/sessions/{chat.pk}/")

    page.fill("#chat-content", "Is the report due Friday?")
    page.press("#chat-content", "Enter")

    message = page.locator("#conversation .message.role-user").last
    error = message.locator(".turn-error")
    expect(error).to_contain_text("HTTP 503")
    expect(error).to_contain_text("The model is overloaded")
    expect(error).to_contain_text("Check LLM_BASE_URL, the API key")
    expect(error.locator("code").first).to_have_text("…/chat/completions")
    expect(error.get_by_role("link", name="model call")).to_have_count(1)
    expect(page.locator("#conversation")).not_to_contain_text("Answering…")
    expect(page.locator("#conversation .message.streaming")).to_have_count(0)
    turn_threads_ended(chat)
    assert Turn.objects.get().status == Turn.Status.FAILED

    fake_llm.reply("Yes, Friday at noon.")  # the model is back
    error.get_by_role("button", name="Retry").click()

    reply = page.locator("#conversation .message.role-assistant")
    expect(reply).to_have_count(1)
    expect(reply).to_contain_text("Yes, Friday at noon.")
    expect(page.locator("#conversation .turn-error")).to_have_count(0)
    expect(page.locator("#conversation .message.role-user")).to_have_count(1)
    turn = Turn.objects.get()
    assert turn.status == Turn.Status.DONE and turn.attempts == 2
    assert list(Event.objects.filter(session=chat).order_by("created_at", "id").values_list("role", "content")) == [
        ("user", "Is the report due Friday?"), ("assistant", "Yes, Friday at noon."),
    ]

    page.reload()  # as stored
    expect(page.locator("#conversation .message.role-user")).to_have_count(1)
    expect(page.locator("#conversation .message.role-assistant")).to_contain_text("Yes, Friday at noon.")


def test_without_javascript_the_outage_and_the_retry_work_as_form_posts(browser, live_server, browser_user, chat,
                                                                        fake_llm):
    from tests.browser.conftest import PASSWORD, TIMEOUT_MS, log_in

    context = browser.new_context(base_url=live_server.url, java_script_enabled=False)
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    try:
        log_in(page, username=browser_user.username, password=PASSWORD)
        model_down(fake_llm)
        page.goto(f"/sessions/{chat.pk}/")
        page.fill("#chat-content", "Is the report due Friday?")
        page.locator("#chat-form button[type=submit]").click()

        error = page.locator("#conversation .turn-error")
        expect(error).to_contain_text("HTTP 503")
        expect(page.locator("#conversation")).not_to_contain_text("on its way")

        fake_llm.reply("Yes, Friday at noon.")
        error.get_by_role("button", name="Retry").click()

        expect(page.locator("#conversation .message.role-assistant")).to_contain_text("Yes, Friday at noon.")
        expect(page.locator("#conversation .message.role-user")).to_have_count(1)
        expect(page.locator("#conversation .turn-error")).to_have_count(0)
    finally:
        context.close()
