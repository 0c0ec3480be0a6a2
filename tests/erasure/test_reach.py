"""After an erasure no MCP tool, vector search, admin page or turn stream gives the person's
text back, and the dashboard's Erasure page previews and erases as the API does."""
import pytest
from django.contrib import admin
from django.urls import NoReverseMatch, reverse

from erasure.matching import Person
from erasure.models import Erasure
from erasure.services import erasure_run
from kinsite.api.auth import TokenPrincipal
from kinsite.llm.providers import provider_override
from kinsite.models import Membership
from kinsite.services import api_token_issue
from memories import services as memory_services
from memories.search.selectors import memory_search
from memories.services import Actor
from sessions_app.models import Event
from sessions_app.turns import events as turn_events
from tests.erasure.conftest import HERS, build_zelda
from tests.factories import MembershipFactory, UserFactory
from tests.support.scripted_model import ScriptedProvider

pytestmark = pytest.mark.usefixtures("empty_cache", "empty_turn_events")

ZELDA = Person(sender="Zelda Quist", subject="Zelda")


def run_erasure(team, user):
    return erasure_run(team=team, kin=None, person=ZELDA, actor="user:test", actor_user=user)


def assert_none_of_hers(text: str, where) -> None:
    text = text.lower()
    for needle in HERS:
        assert needle not in text, (where, needle)


def test_no_mcp_tool_returns_their_text(team, kin, user):
    from agent_mcp import tools

    zelda = build_zelda(kin)
    token, _raw = api_token_issue(team=team, name="mcp", user=user)
    caller = TokenPrincipal(token)
    run_erasure(team, user)

    session = zelda["session"]
    answers = [
        tools.memory_search(caller, kin_id=kin.pk, query="Zelda Lark Lane"),
        tools.history_search(caller, query="Lark Lane", session_id=session.pk),
        tools.history_search(caller, query="Zelda", kin_id=kin.pk),
        tools.experience_read(caller, kin_id=kin.pk),
        tools.experience_read(caller, kin_id=kin.pk, version=1),
        tools.prompt_preview(caller, session_id=session.pk, message="hello"),
    ]
    for answer in answers:
        assert_none_of_hers(repr(answer), answer)
    assert "weather is mild" in repr(answers[-1]).lower()


def test_vector_search_no_longer_finds_an_erased_memory(team, kin, user):
    with provider_override(ScriptedProvider()):
        add = memory_services.memory_add
        hers = add(team=team, kin=kin, content="Zelda Quist parks at the harbour", actor=Actor(label="test")).memory
        add(team=team, kin=kin, content="Bob parks at the station", actor=Actor(label="test"))
        before = memory_search(team=team, kin=kin, query="who parks at the harbour", limit=5)
        assert hers in [hit.memory for hit in before]  # found, and the scope's vectors are cached

        run_erasure(team, user)
        after = memory_search(team=team, kin=kin, query="who parks at the harbour", limit=5)

    assert [hit.memory.content for hit in after] == ["Bob parks at the station"]


def test_no_admin_page_shows_their_text(client, team, kin, user):
    zelda = build_zelda(kin)
    user.is_staff = user.is_superuser = True
    user.save()
    client.force_login(user)
    run_erasure(team, user)

    pages = 0
    for model in admin.site._registry:
        if model._meta.app_label in ("erasure", "auth"):
            continue
        info = (model._meta.app_label, model._meta.model_name)
        try:
            url = reverse(f"admin:{info[0]}_{info[1]}_changelist")
        except NoReverseMatch:
            continue
        for query in ("", "?q=Lark"):  # the page repeats the query: not one of HERS
            response = client.get(url + query)
            assert response.status_code == 200, url
            assert_none_of_hers(response.content.decode(), url + query)
            pages += 1
    for obj in (zelda["session"], zelda["kept"]):
        url = reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[obj.pk])
        assert_none_of_hers(client.get(url).content.decode(), url)
    assert pages > 20


def test_an_erased_turns_stream_is_dropped(team, kin, user, django_capture_on_commit_callbacks):
    zelda = build_zelda(kin)
    turn = zelda["turn"]
    turn_events.turn_event_publish(turn, turn_events.DELTA, {"text": "Noted, 12 Heron Street"})
    assert turn_events.turn_events_read(turn, after=None, timeout=0)

    with django_capture_on_commit_callbacks(execute=True):
        run_erasure(team, user)

    assert turn_events.turn_events_read(turn, after=None, timeout=0) == []


def test_the_dashboard_previews_then_erases(client, team, kin, user):
    zelda = build_zelda(kin)
    client.force_login(user)
    url = reverse("dashboard:erasures")
    form = {"sender": "Zelda Quist", "subject": "Zelda", "kin": ""}

    preview = client.post(url, {**form, "action": "preview"})

    assert preview.status_code == 200
    assert "12 Lark Lane" in preview.content.decode() and 'id="erase-confirm"' in preview.content.decode()
    assert Event.objects.filter(pk=zelda["hers"].pk).exists() and not Erasure.objects.exists()

    erased = client.post(url, {**form, "action": "erase"})

    receipt = Erasure.objects.get()
    assert erased.status_code == 302 and f"receipt={receipt.pk}" in erased["Location"]
    assert not Event.objects.filter(pk=zelda["hers"].pk).exists()
    assert receipt.actor == f"user:{user.username}" and receipt.total > 0
    page = client.get(erased["Location"]).content.decode()
    assert f'id="receipt-{receipt.pk}"' in page and "Zelda Quist" in page
    assert_none_of_hers(page.replace("Zelda Quist", "").replace("Zelda", ""), "receipts")


def test_the_dashboard_refuses_members_and_empty_forms(client, team, kin, user):
    build_zelda(kin)
    url = reverse("dashboard:erasures")
    client.force_login(user)
    assert client.post(url, {"sender": " ", "subject": "", "action": "erase"}).status_code == 400
    member = UserFactory()
    MembershipFactory(team=team, user=member, role=Membership.Role.MEMBER)
    client.force_login(member)
    assert client.get(url).status_code == 403
    assert client.post(url, {"sender": "Zelda Quist", "action": "erase"}).status_code == 403
    assert not Erasure.objects.exists()
