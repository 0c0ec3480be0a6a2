"""GET /sessions/{id}/prompt/?message= (SPEC §4): exactly what a turn would send."""
from datetime import timedelta

import pytest
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from kinsite.tokencount import count_tokens
from memories.models import Memory
from sessions_app.models import Event
from tests.factories import MemoryFactory, MessageFactory, SummaryFactory, ToolCallFactory, ToolResultFactory
from tests.sessions_app.test_api_access import assert_api_error
from tests.sessions_app.test_turns import chat_requests, post

pytestmark = pytest.mark.usefixtures("fake_llm_gateway")


def preview(api_client, session, **params):
    return api_client.get(f"/api/v1/sessions/{session.pk}/prompt/", params)


def test_preview_is_what_the_turn_then_sends(api_client, chat_session, fake_llm):
    MemoryFactory(kin=chat_session.kin, content="Lena owns the launch checklist.", subject="launch", importance=8)
    MessageFactory(session=chat_session, content="We launch on Monday.", sender="Tom")

    response = preview(api_client, chat_session, message="Who owns the launch checklist?", sender="Maria",
                       platform="web")

    assert response.status_code == 200, response.content
    body = response.json()
    ids = [section["id"] for section in body["sections"]]
    assert ids[:3] == ["identity", "instructions", "platforms"]
    assert ids[-2:] == ["current_source", "context"]
    memories = next(s for s in body["sections"] if s["id"] == "memories")
    assert "★ [fact] Lena owns the launch checklist. (subject: launch) — just now" in memories["text"]
    assert all(section["tokens"] > 0 for section in body["sections"])
    assert [(item["sender"], item["content"]) for item in body["history"]] == [
        ("Tom", "We launch on Monday."), ("Maria", "Who owns the launch checklist?"),
    ]
    assert body["history"][-1]["id"] is None
    totals = body["totals"]
    assert totals["system_tokens"] == sum(s["tokens"] for s in body["sections"])
    assert totals["history_tokens"] == sum(item["tokens"] for item in body["history"])
    assert totals["total_tokens"] == totals["system_tokens"] + totals["history_tokens"]
    assert totals["budget"] == chat_session.kin.effective_history_budget
    assert "search_history" in body["tools"]
    # Previewing changes nothing: no retrieval counted, nothing stored, no model call.
    assert Memory.objects.get().retrieval_count == 0
    assert Event.objects.count() == 1 and chat_requests(fake_llm) == []

    fake_llm.reply("Lena.")
    post(api_client, chat_session, "Who owns the launch checklist?", sender="Maria", platform="web")
    sent = chat_requests(fake_llm)[0]["messages"]
    # The same prompt but for the clock line(s) of the context section.
    def strip_clock(text):
        return [line for line in text.splitlines() if not line.startswith(("Time:", "ISO timestamp:"))]

    assert strip_clock(sent[0]["content"]) == strip_clock(body["system_prompt"])
    assert sent[1:] == [item["sent"] for item in body["history"]]


def test_the_context_block_uses_the_teams_time_zone(api_client, chat_session, team):
    team.timezone = "Europe/Paris"
    team.save(update_fields=["timezone"])

    body = preview(api_client, chat_session, message="What time is it?").json()

    context = next(s for s in body["sections"] if s["id"] == "context")["text"]
    assert "Timezone: Europe/Paris" in context
    assert "+01:00" in context or "+02:00" in context  # the ISO timestamp is Paris time


def test_preview_history_respects_budget_and_compaction_boundary(api_client, chat_session, kin):
    kin.history_token_budget = 1000
    kin.save()
    start = timezone.now() - timedelta(hours=1)
    old = [
        MessageFactory(session=chat_session, content=f"old message {i}", created_at=start + timedelta(seconds=i))
        for i in range(3)
    ]
    SummaryFactory(
        session=chat_session, content="Earlier they discussed the old plan.", first_event=old[0],
        last_event=old[-1], message_count=3,
    )
    long_text = "word " * 400  # about 400 tokens each
    for i in range(5):
        MessageFactory(session=chat_session, content=f"{i} {long_text}", created_at=start + timedelta(minutes=10 + i))

    body = preview(api_client, chat_session, message="and now?").json()

    contents = [item["content"] for item in body["history"]]
    assert not any(c.startswith("old message") for c in contents)
    assert contents[-1] == "and now?"
    assert [c.split()[0] for c in contents[:-1]] == ["3", "4"]  # the newest that fit 1,000 tokens
    assert body["totals"]["history_tokens"] <= 1000
    sections = {s["id"]: s["text"] for s in body["sections"]}
    assert sections["summary"] == "> Earlier they discussed the old plan."
    assert "Visible messages: 3 of 9" in sections["conversation_state"]
    assert "Summarised messages: 3" in sections["conversation_state"]
    assert "search_history" in sections["conversation_state"]


def test_newest_message_is_kept_even_over_budget(api_client, chat_session, kin):
    kin.history_token_budget = 1000
    kin.save()
    MessageFactory(session=chat_session, content="short")
    huge = "token " * 1500

    body = preview(api_client, chat_session, message=huge).json()

    assert [item["content"] for item in body["history"]] == [huge]
    assert body["history"][0]["tokens"] == count_tokens(huge)


def test_preview_without_message_shows_the_stored_history(api_client, chat_session):
    MessageFactory(session=chat_session, content="hello")

    body = preview(api_client, chat_session).json()

    assert [item["content"] for item in body["history"]] == ["hello"]
    assert "memories" not in [s["id"] for s in body["sections"]]


def test_preview_rejects_bad_platform(api_client, chat_session):
    assert_api_error(preview(api_client, chat_session, message="hi", platform="fax"), 400)


def test_preview_keeps_tool_calls_with_their_results(api_client, chat_session, kin):
    kin.history_token_budget = 1000
    kin.save()
    MessageFactory(session=chat_session, content="remember this")
    ToolCallFactory(session=chat_session, token_count=600,
                    data={"tool_calls": [{"id": "c1", "name": "memorize", "arguments": "{}"}]})
    ToolResultFactory(session=chat_session, content="ok", token_count=600,
                      data={"tool_call_id": "c1", "name": "memorize"})
    MessageFactory(session=chat_session, content="done", role="assistant", sender="")

    body = preview(api_client, chat_session, message="next").json()

    # Call + result (1,200 tokens) do not fit next to the newest messages: both go, never one alone.
    assert [item["kind"] for item in body["history"]] == ["message", "message"]


def test_preview_history_carries_the_stored_times(api_client, chat_session):
    # History rows are read as plain rows (not Event instances), their times parsed on use:
    # the preview still shows each stored message's own time, and the state its age.
    at = timezone.now() - timedelta(days=2, hours=1, microseconds=123)
    stored = MessageFactory(session=chat_session, content="earlier", created_at=at)
    MessageFactory(session=chat_session, content="later", created_at=at + timedelta(days=1))

    body = preview(api_client, chat_session).json()

    assert [item["content"] for item in body["history"]] == ["earlier", "later"]
    assert parse_datetime(body["history"][0]["created_at"]) == stored.created_at
    sections = {s["id"]: s["text"] for s in body["sections"]}
    assert "Oldest visible message: 2d ago" in sections["conversation_state"]
