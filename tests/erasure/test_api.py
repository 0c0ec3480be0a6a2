"""POST /api/v1/erasures/: a dry run lists what would go, the erasure removes every copy of
the person's text and keeps a receipt, a second one changes nothing. Runs on both databases."""
import pytest
from rest_framework.test import APIClient

from consolidation.models import ExperienceVersion, Fact
from erasure.models import Erasure
from kinsite.models import Membership
from kinsite.services import api_token_issue
from memories.models import Memory, MemoryChange, MemoryVector
from sessions_app.models import Event, Session, Summary, Turn
from tests.erasure.conftest import HERS, KEPT, database_text
from tests.factories import KinFactory, MembershipFactory, MessageFactory, SessionFactory, UserFactory

pytestmark = pytest.mark.usefixtures("empty_cache")

URL = "/api/v1/erasures/"


def erase(client, **body):
    return client.post(URL, body, format="json")


def test_a_dry_run_lists_what_would_go_and_changes_nothing(api_client, kin, zelda):
    before = database_text()

    response = erase(api_client, sender="Zelda Quist", subject="Zelda", dry_run=True)

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["dry_run"] is True
    found = {(row["store"], row["id"]) for row in body["found"]}
    assert ("messages", zelda["hers"].pk) in found and ("messages", zelda["about"].pk) in found
    assert ("messages", zelda["other"].pk) not in found
    assert ("memories", zelda["named"].pk) in found and ("memories", zelda["kept"].pk) not in found
    assert body["counts"]["facts"] == 1 and body["counts"]["experience_versions"] == 2
    assert any("Lark Lane" in row["excerpt"] for row in body["found"])
    assert database_text() == before
    assert not Erasure.objects.exists()


def test_the_erasure_removes_every_copy_and_keeps_what_is_not_theirs(api_client, kin, zelda):
    dry = erase(api_client, sender="Zelda Quist", subject="Zelda", dry_run=True).json()

    response = erase(api_client, sender="Zelda Quist", subject="Zelda")

    assert response.status_code == 201, response.content
    receipt = response.json()
    # The dry run matched what was erased.
    assert receipt["counts"] == dry["counts"]
    assert {store: ids for store, ids in receipt["items"].items() if store in dry["items"]} == dry["items"]
    assert receipt["total"] == dry["total"] > 0
    text = database_text()
    for needle in HERS:
        assert needle not in text, needle
    for needle in KEPT:
        assert needle in text, needle
    # Messages, their derived reply and tool steps, and the summary covering them are gone.
    erased = [zelda["hers"], zelda["about"], zelda["reply"], *zelda["tool_events"]]
    assert not Event.objects.filter(pk__in=[event.pk for event in erased]).exists()
    assert Event.objects.filter(pk=zelda["other"].pk).exists()
    assert not Summary.objects.filter(pk=zelda["summary"].pk).exists()
    # Memories with their vectors; the kept memory keeps its vector and a redacted history.
    assert set(Memory.objects.values_list("pk", flat=True)) == {zelda["kept"].pk}
    assert set(MemoryVector.objects.values_list("memory_id", flat=True)) == {zelda["kept"].pk}
    change = MemoryChange.objects.get(memory=zelda["kept"], action="update")
    assert change.before == {"content": "[erased]"} and change.reason == "[erased]"
    assert list(Fact.objects.values_list("statement", flat=True)) == ["Deploys happen on Fridays"]
    # A new experience version without her lines; the old ones redacted.
    current = ExperienceVersion.objects.filter(kin=kin).order_by("-version").first()
    assert current.version == 3
    assert current.markdown == "# Experience\n- Deploys happen on Fridays\n"
    assert receipt["items"]["experience_new_versions"] == [current.pk]
    assert "[erased]" in ExperienceVersion.objects.get(kin=kin, version=2).markdown
    session = Session.objects.get(pk=zelda["session"].pk)
    assert session.working_memory == "[erased]\nTeam standup at nine"
    # The pending turn whose message went will not run.
    pending = Turn.objects.get(pk=zelda["pending"].pk)
    assert pending.status == Turn.Status.FAILED and "erased" in pending.error
    # The receipt stays, readable by the team.
    stored = api_client.get(f"{URL}{receipt['id']}/").json()
    assert stored["counts"] == receipt["counts"] and stored["sender"] == "Zelda Quist"
    assert [row["id"] for row in api_client.get(URL).json()["results"]] == [receipt["id"]]


def test_no_api_read_returns_their_text_afterwards(api_client, kin, zelda):
    assert erase(api_client, sender="Zelda Quist", subject="Zelda").status_code == 201
    session = zelda["session"]
    reads = [
        f"/api/v1/sessions/{session.pk}/messages/",
        f"/api/v1/sessions/{session.pk}/",
        f"/api/v1/sessions/{session.pk}/history/search/?q=Lark%20Lane",
        f"/api/v1/kins/{kin.pk}/history/search/?q=Zelda",
        f"/api/v1/sessions/{session.pk}/prompt/?message=Where%20is%20Lark%20Lane",
        f"/api/v1/sessions/{session.pk}/introspections/",
        f"/api/v1/kins/{kin.pk}/memories/",
        f"/api/v1/kins/{kin.pk}/memories/search/?q=Lark%20Lane",
        f"/api/v1/memories/{zelda['kept'].pk}/history/",
        f"/api/v1/kins/{kin.pk}/facts/",
        f"/api/v1/kins/{kin.pk}/experience/",
        f"/api/v1/kins/{kin.pk}/experience/?version=1",
        f"/api/v1/kins/{kin.pk}/consolidations/",
        f"/api/v1/kins/{kin.pk}/export/?sessions=1",
        f"/api/v1/turns/{zelda['turn'].pk}/",
    ]
    for url in reads:
        response = api_client.get(url)
        assert response.status_code == 200, (url, response.content)
        body = response.content.decode().lower().replace("where is lark lane", "")
        for needle in HERS:
            assert needle not in body, (url, needle)
    assert "office closes at six" in api_client.get(f"/api/v1/kins/{kin.pk}/memories/").content.decode().lower()


def test_a_second_erasure_changes_nothing(api_client, kin, zelda):
    erase(api_client, sender="Zelda Quist", subject="Zelda")
    before = database_text()

    response = erase(api_client, sender="Zelda Quist", subject="Zelda")

    assert response.status_code == 201
    assert response.json()["total"] == 0
    assert database_text() == before
    assert Erasure.objects.count() == 2


def test_an_erasure_limited_to_a_kin_leaves_other_kins_and_shared_memories(api_client, team, kin, zelda):
    other_kin = KinFactory(team=team)
    theirs = MessageFactory(session=SessionFactory(kin=other_kin), sender="Zelda Quist", content="Hi from Lark Lane")

    response = erase(api_client, sender="Zelda Quist", kin_id=kin.pk)

    assert response.status_code == 201
    assert Event.objects.filter(pk=theirs.pk).exists()
    assert Memory.objects.filter(pk=zelda["shared"].pk).exists()
    assert not Event.objects.filter(pk=zelda["hers"].pk).exists()
    assert response.json()["kin_id"] == kin.pk


def test_bad_requests_answer_400_and_change_nothing(api_client, kin, zelda):
    before = database_text()
    for body in ({}, {"sender": "  "}, {"subject": "Z"}, {"sender": "x" * 201}, {"sender": "Zelda", "kin_id": 0},
                 {"sender": "Zelda", "dry_run": "perhaps"}):
        response = erase(api_client, **body)
        assert response.status_code == 400, (body, response.content)
        assert "error" in response.json()
    assert database_text() == before and not Erasure.objects.exists()


def test_another_teams_kin_is_not_found(api_client, other_team, zelda):
    response = erase(api_client, sender="Zelda Quist", kin_id=KinFactory(team=other_team).pk)
    assert response.status_code == 404
    assert Event.objects.filter(pk=zelda["hers"].pk).exists()


def test_only_owners_and_admins_may_erase(team, zelda):
    member = UserFactory()
    MembershipFactory(team=team, user=member, role=Membership.Role.MEMBER)
    clients = {}
    for name, user in (("member", member), ("no user", None)):
        _, raw = api_token_issue(team=team, name=name, user=user)
        clients[name] = APIClient()
        clients[name].credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")

    for client in clients.values():
        assert erase(client, sender="Zelda Quist").status_code == 403
        assert client.get(URL).status_code == 403
    assert Event.objects.filter(pk=zelda["hers"].pk).exists()


def test_a_running_turn_on_their_message_makes_the_erasure_wait(api_client, zelda):
    Turn.objects.filter(pk=zelda["pending"].pk).update(status=Turn.Status.RUNNING)
    before = database_text()

    response = erase(api_client, sender="Zelda Quist")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "erasure_busy"
    assert f"turn {zelda['pending'].pk}" in response.json()["error"]["details"]["running"]
    assert database_text() == before


def test_what_a_compaction_would_fold_afterwards_holds_none_of_it(api_client, kin, zelda):
    """The summary that covered her message is gone, so the next compaction folds only what is
    left; the preview builds the very messages a compaction sends."""
    from kinsite.prompt_template_kinds import COMPACTION_DEFAULT
    from sessions_app.compaction import compaction_preview

    erase(api_client, sender="Zelda Quist", subject="Zelda")
    messages, _notes = compaction_preview(session=zelda["session"], template_body=COMPACTION_DEFAULT)

    sent = " ".join(message["content"] for message in messages).lower()
    assert "weather is mild" in sent
    for needle in HERS:
        assert needle not in sent


def test_a_summary_whose_time_holds_an_imported_message_of_theirs_goes(api_client, kin):
    """Imported later (a higher id) into summarised time: the next compaction would fold it in."""
    from tests.erasure.conftest import at
    from tests.factories import SummaryFactory

    session = SessionFactory(kin=kin)
    first = MessageFactory(session=session, sender="Bob", content="Morning", created_at=at(0))
    last = MessageFactory(session=session, sender="Bob", content="Evening", created_at=at(60))
    summary = SummaryFactory(session=session, first_event=first, last_event=last, message_count=2,
                             content="Bob greeted twice.", seen_through_id=last.pk)
    MessageFactory(session=session, sender="Zelda Quist", content="Noon", created_at=at(30))
    kept = SummaryFactory(session=session, first_event=first, last_event=first, message_count=1,
                          content="Bob said morning.")

    erase(api_client, sender="Zelda Quist")

    assert not Summary.objects.filter(pk=summary.pk).exists()
    assert Summary.objects.filter(pk=kept.pk).exists()
