"""Two posts to one session run one after the other, never interleaved (SPEC §4)."""
import threading
import time

import pytest
from django.db import connection
from rest_framework.test import APIClient

from kinsite.errors import Conflict
from kinsite.llm.providers import provider_override
from kinsite.services import api_token_issue
from sessions_app.locks import session_lock
from sessions_app.models import Event, Turn
from tests.factories import KinFactory, SessionFactory, TeamFactory


@pytest.mark.postgres
def test_two_concurrent_posts_make_two_whole_turns(transactional_db, fake_llm, fake_llm_provider):
    team = TeamFactory()
    session = SessionFactory(kin=KinFactory(team=team))
    _, raw = api_token_issue(team=team, name="concurrency")
    # Each model answer takes a while, so without the lock the two turns would overlap.
    fake_llm.delay = 0.15
    barrier = threading.Barrier(2)
    responses = {}

    def post(text):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
        try:
            barrier.wait()
            responses[text] = client.post(
                f"/api/v1/sessions/{session.pk}/messages/", {"content": text, "sender": text.split()[0]},
                format="json",
            )
        finally:
            connection.close()

    with provider_override(fake_llm_provider):
        threads = [threading.Thread(target=post, args=(text,)) for text in ("Alice asks one", "Bob asks two")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)

    assert {text: r.status_code for text, r in responses.items()} == {"Alice asks one": 201, "Bob asks two": 201}
    events = list(Event.objects.filter(session=session).order_by("created_at", "id"))
    assert [(e.role, e.kind) for e in events] == [("user", "message"), ("assistant", "message")] * 2
    for message, reply in (events[0:2], events[2:4]):
        # The fake model echoes the last user message: each reply answers its own message.
        assert reply.content == f"echo: [{message.sender}] {message.content}"
    # The second turn saw the whole first turn in its history.
    second_request = fake_llm.requests_to("chat")[1]
    assert [m["content"] for m in second_request["messages"][1:]] == [
        f"[{events[0].sender}] {events[0].content}", events[1].content, f"[{events[2].sender}] {events[2].content}",
    ]
    turns = list(Turn.objects.filter(session=session).order_by("started_at"))
    assert [t.status for t in turns] == ["done", "done"]
    assert turns[0].finished_at <= turns[1].started_at


def test_session_lock_makes_the_second_holder_wait():
    order = []
    first_in = threading.Event()

    def hold():
        with session_lock(987_654):
            first_in.set()
            order.append("first in")
            time.sleep(0.2)
            order.append("first out")

    thread = threading.Thread(target=hold)
    thread.start()
    first_in.wait(5)
    with session_lock(987_654, timeout=5):
        order.append("second in")
    thread.join()

    assert order == ["first in", "first out", "second in"]


def test_session_lock_gives_up_with_a_conflict_after_its_timeout():
    with session_lock(987_655):
        outcome = []

        def try_lock():
            try:
                with session_lock(987_655, timeout=0.1):
                    outcome.append("got it")
            except Conflict as exc:
                outcome.append(exc.code)

        thread = threading.Thread(target=try_lock)
        thread.start()
        thread.join()

    assert outcome == ["session_busy"]
