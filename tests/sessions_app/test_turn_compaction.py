"""Turns and compaction end to end: once a session's history outgrows its share of
the budget, the turn schedules compaction, and the next prompt carries the summary
in place of the messages it covers (raw messages stay searchable)."""
import pytest

from sessions_app.models import Summary
from tests.sessions_app.test_turns import chat_requests, post

pytestmark = pytest.mark.usefixtures("fake_llm_gateway")

SUMMARY = (
    "## Key facts & decisions\n- Maria: the zeppelin launch moved to Friday.\n"
    "## Completed work\n- Checklist drafted.\n"
    "## Open threads\n- Tom still owes the permit.\n"
)


def long_message(topic: str) -> str:
    return f"About the {topic}: " + " ".join(f"detail{n} of the {topic} plan" for n in range(80))


def test_turn_past_the_threshold_compacts_and_the_next_prompt_carries_the_summary(
    api_client, chat_session, fake_llm, django_capture_on_commit_callbacks
):
    kin = chat_session.kin
    kin.history_token_budget = 1000
    kin.save()
    fake_llm.reply("Noted the zeppelin launch.")
    fake_llm.reply("Noted the permit.")
    fake_llm.reply(SUMMARY)  # the compaction call, scheduled after the second turn

    with django_capture_on_commit_callbacks(execute=True):
        assert post(api_client, chat_session, long_message("zeppelin launch")).status_code == 201
    assert not Summary.objects.exists()
    with django_capture_on_commit_callbacks(execute=True):
        assert post(api_client, chat_session, long_message("permit")).status_code == 201

    summary = Summary.objects.get(session=chat_session)
    compaction_prompt = chat_requests(fake_llm)[2]["messages"][-1]["content"]
    assert "## Open threads" in compaction_prompt and "zeppelin launch" in compaction_prompt

    preview = api_client.get(f"/api/v1/sessions/{chat_session.pk}/prompt/", {"message": "What is still open?"})
    sections = {section["id"]: section["text"] for section in preview.json()["sections"]}
    assert sections["summary"] == "\n".join(f"> {line}" for line in SUMMARY.strip().splitlines())
    assert "search_history" in sections["conversation_state"]
    history_ids = [item["id"] for item in preview.json()["history"] if item["id"] is not None]
    assert summary.last_event_id not in history_ids
    assert all(item_id > summary.last_event_id for item_id in history_ids)

    search = api_client.get(f"/api/v1/sessions/{chat_session.pk}/history/search/", {"q": "zeppelin"})
    assert summary.first_event_id in [hit["id"] for hit in search.json()["results"]]
