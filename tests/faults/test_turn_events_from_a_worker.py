"""Following a queued turn (SPEC §11: `?async=1`, then GET /turns/{id}/events/) that a real
Celery worker runs in its own process: the worker's model call streams from the fake
OpenAI server over HTTP, the worker publishes the deltas to Redis, and the web process
(the live server) serves them to the client while the turn is still running; the last
event is the stored turn."""
import httpx
import pytest

from kinsite.services import api_token_issue
from sessions_app.models import Turn
from tests.faults.conftest import wait_for
from tests.support.sse import sse_events

pytestmark = pytest.mark.postgres

WORK_SECONDS = 60
ANSWER = "A worker streams this answer to whoever follows the turn."


def test_a_follower_gets_a_workers_deltas_while_the_turn_runs(
    transactional_db, live_server, chat_session, on_redis, fake_llm, workers
):
    release = fake_llm.stream(ANSWER, hold_after=3)  # the role chunk and two pieces, then held
    env = {"INTROSPECTION_TURN_INTERVAL": "0"}
    worker = workers(redis_url=on_redis.url, llm_base_url=fake_llm.base_url, env=env)
    _, token = api_token_issue(team=chat_session.kin.team, name="follow")
    auth = {"Authorization": f"Bearer {token}"}
    try:
        with httpx.Client(base_url=live_server.url, headers=auth, timeout=WORK_SECONDS) as client:
            posted = client.post(f"/api/v1/sessions/{chat_session.pk}/messages/?async=1",
                                 json={"content": "Tell me in pieces.", "sender": "Maria"})
            assert posted.status_code == 202, posted.text
            turn_id = posted.json()["turn"]["id"]

            with client.stream("GET", f"/api/v1/turns/{turn_id}/events/",
                               headers={"Accept": "text/event-stream"}) as response:
                assert response.status_code == 200
                events = sse_events(response)
                first = next(events)
                deltas = [next(events), next(events)]
                # The worker is inside the model call: nothing of the reply is stored yet.
                turn = Turn.objects.get(pk=turn_id)
                assert turn.status == Turn.Status.RUNNING and turn.reply_id is None
                release.set()
                rest = list(events)
            stored = client.get(f"/api/v1/turns/{turn_id}/").json()
    finally:
        release.set()

    assert first.event == "message" and first.data["content"] == "Tell me in pieces."
    assert [event.event for event in deltas] == ["delta", "delta"]
    assert [event.event for event in rest[:-1]] == ["delta"] * (len(rest) - 1)
    assert "".join(event.data["text"] for event in deltas + rest[:-1]) == ANSWER
    assert rest[-1].event == "done"
    assert rest[-1].data == {"message": stored["message"], "reply": stored["reply"], "turn": stored}
    assert stored["status"] == "done" and stored["reply"]["content"] == ANSWER
    wait_for(lambda: "succeeded" in worker.log(), seconds=WORK_SECONDS, what="the worker's task", workers=[worker])
