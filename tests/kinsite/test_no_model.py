"""The default setup without a language model (no LLM_BASE_URL) explains itself: consolidation
is refused with 503 model_not_configured and records nothing (prepare still renders), the
nightly run and introspection and compaction runs are recorded as skipped with the reason,
the experience page says why "Consolidate now" cannot run and links to the help page, and
the help page says what works without a model and never shows the endpoint's address."""
import pytest
from django.urls import reverse

from consolidation.models import ConsolidationRun, Fact
from consolidation.services import consolidation_nightly, fact_record
from kinsite.llm.providers import provider_override
from kinsite.models import LLMCall
from memories.models import Memory
from sessions_app.compaction import compaction_request
from sessions_app.introspection.services import introspection_request
from sessions_app.models import CompactionRun, IntrospectionRun, Session, Summary
from sessions_app.tasks import compact_session_task, introspect_session_task
from tests.factories import MessageFactory
from tests.support.scripted_model import ScriptedProvider

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_model(settings):
    settings.LLM_BASE_URL = ""


@pytest.fixture
def logged_in(client, user, team):
    client.force_login(user)
    return client


def pending_fact(kin) -> Fact:
    return fact_record(kin=kin, statement="Maria wants weekly reports.", source=Fact.Source.API)


def assert_refusal(response) -> dict:
    assert response.status_code == 503, response.content[:500]
    assert "Retry-After" not in response  # it stays so until an operator sets the endpoint
    error = response.json()["error"]
    assert set(error) == {"code", "message", "details"}
    assert error["code"] == "model_not_configured"
    assert "LLM_BASE_URL" in error["message"] and "consolidation" in error["message"]
    return error


# --- consolidation ---------------------------------------------------------------------------


def test_consolidate_without_a_model_is_refused_and_records_nothing(api_client, kin):
    fact = pending_fact(kin)

    error = assert_refusal(api_client.post(f"/api/v1/kins/{kin.pk}/consolidate/", {}, format="json"))

    assert error["details"] == {"kin": kin.pk, "setting": "LLM_BASE_URL"}
    assert not ConsolidationRun.objects.exists() and not LLMCall.objects.exists()
    fact.refresh_from_db()
    assert fact.status == Fact.Status.ACTIVE and not fact.is_consolidated


def test_prepare_still_renders_the_prompt_without_a_model(api_client, kin):
    pending_fact(kin)

    response = api_client.post(f"/api/v1/kins/{kin.pk}/consolidate/", {"prepare": True}, format="json")

    assert response.status_code == 200, response.content[:500]
    assert response.json()["status"] == "prepared"
    assert "Maria wants weekly reports." in response.json()["rendered_prompt"]
    assert not LLMCall.objects.exists()


def test_nothing_to_consolidate_still_answers_409_first(api_client, kin):
    response = api_client.post(f"/api/v1/kins/{kin.pk}/consolidate/", {}, format="json")
    assert response.status_code == 409 and response.json()["error"]["code"] == "nothing_to_consolidate"


def test_with_a_model_the_same_request_runs(api_client, kin):
    pending_fact(kin)
    with provider_override(ScriptedProvider(["not json"] * 2)):
        response = api_client.post(f"/api/v1/kins/{kin.pk}/consolidate/", {}, format="json")
    assert response.status_code == 200 and response.json()["status"] == "rejected"


def test_the_nightly_run_is_recorded_as_skipped_once_with_the_reason(kin):
    fact = pending_fact(kin)
    Fact.objects.filter(pk=fact.pk).update(created_at=fact.created_at.replace(year=fact.created_at.year - 1))

    [run] = consolidation_nightly()
    again = consolidation_nightly()

    assert run.status == ConsolidationRun.Status.SKIPPED and run.trigger == "nightly"
    assert "LLM_BASE_URL" in run.error
    assert list(ConsolidationRun.objects.values_list("pk", flat=True)) == [run.pk]
    assert [r.pk for r in again] == []
    assert not Fact.objects.get(pk=fact.pk).is_consolidated
    assert not LLMCall.objects.exists()


def test_the_experience_page_says_why_consolidate_now_cannot_run(logged_in, kin):
    pending_fact(kin)
    page = reverse("dashboard:experience", args=[kin.pk])

    body = logged_in.get(page).content.decode()

    assert '<button type="button" disabled aria-describedby="consolidate-needs-model">Consolidate now</button>' in body
    assert reverse("dashboard:model_help") in body
    assert 'name="prepare" value="1"' in body

    # A form posted anyway (a page from before the endpoint was unset) says the same, runs nothing.
    response = logged_in.post(reverse("dashboard:experience_consolidate", args=[kin.pk]))
    assert response.status_code == 302 and response["Location"].endswith("?no_model=1")
    assert "consolidation needs a language model" in logged_in.get(response["Location"]).content.decode()
    assert not ConsolidationRun.objects.exists()

    prepared = logged_in.post(reverse("dashboard:experience_consolidate", args=[kin.pk]), {"prepare": "1"})
    assert prepared.status_code == 302
    assert ConsolidationRun.objects.get().status == ConsolidationRun.Status.PREPARED


def test_with_a_model_the_page_offers_consolidate_now(logged_in, kin):
    with provider_override(ScriptedProvider()):
        body = logged_in.get(reverse("dashboard:experience", args=[kin.pk])).content.decode()
    assert '<button type="submit">Consolidate now</button>' in body
    assert "consolidate-needs-model" not in body


# --- introspection and compaction ------------------------------------------------------------


def test_introspection_is_recorded_as_skipped_and_a_later_run_with_a_model_reads_the_events(
        api_client, chat_session, django_capture_on_commit_callbacks):
    message = MessageFactory(session=chat_session, content="I prefer short answers.", sender="Maria")
    Session.objects.filter(pk=chat_session.pk).update(introspection_pending=True)

    with django_capture_on_commit_callbacks(execute=True):
        response = api_client.post(f"/api/v1/sessions/{chat_session.pk}/checkpoint/")

    assert response.status_code == 202, response.content[:500]
    run = IntrospectionRun.objects.get()
    assert run.status == IntrospectionRun.Status.SKIPPED
    assert "Introspection needs a language model" in run.summary and "LLM_BASE_URL" in run.summary
    assert not Session.objects.get(pk=chat_session.pk).introspection_pending  # the idle scan leaves it be
    assert not LLMCall.objects.exists() and not Memory.objects.exists()

    with provider_override(ScriptedProvider(["Nothing worth storing."])):
        later = introspection_request(session=chat_session, trigger=IntrospectionRun.Trigger.MANUAL)
        introspect_session_task.apply(args=[later.pk])
    later.refresh_from_db()
    assert later.status == IntrospectionRun.Status.DONE and later.last_event_id == message.pk


def test_compaction_is_recorded_as_skipped_and_writes_no_summary(chat_session):
    chat_session.kin.history_token_budget = 300
    chat_session.kin.save()
    for minute in range(30):
        MessageFactory(session=chat_session, content=f"Please add region {minute} to the quarterly churn report.")

    run = compaction_request(session=chat_session)
    compact_session_task.apply(args=[run.pk])

    run.refresh_from_db()
    assert run.status == CompactionRun.Status.SKIPPED
    assert "Compaction needs a language model" in run.error and "LLM_BASE_URL" in run.error
    assert run.finished_at is not None
    assert not Summary.objects.exists() and not LLMCall.objects.exists()


# --- the help page ---------------------------------------------------------------------------


def test_the_banner_links_the_help_page_which_says_what_works_without_a_model(logged_in):
    home = logged_in.get("/", follow=True).content.decode()
    assert reverse("dashboard:model_help") in home

    body = logged_in.get(reverse("dashboard:model_help")).content.decode()

    assert "No language model is connected" in body
    for part in ("Chat", "Introspection", "Compaction", "Consolidation", "Workflows"):
        assert f"<td>{part}" in body
    assert "LLM_BASE_URL=" in body  # how to connect one


def test_the_help_page_says_a_model_is_connected_without_showing_its_address(logged_in, settings):
    settings.LLM_BASE_URL = "http://llm.internal.example:8080/v1"
    settings.LLM_MODEL = "house-model"
    settings.LLM_EMBEDDING_MODEL = ""

    body = logged_in.get(reverse("dashboard:model_help")).content.decode()

    assert "A chat model is connected" in body and "house-model" in body
    assert "llm.internal.example" not in body
    assert "No language model is configured" not in body  # no banner


@pytest.mark.parametrize(("embeddings", "base_url", "embedding_model", "says"), [
    ("local", "", "", "built-in local model <code>local:all-MiniLM-L6-v2</code>, in this process"),
    ("off", "", "", "Search by meaning is off: search uses words only"),
    ("endpoint", "http://llm.internal.example/v1", "house-embedder", "embedding model <code>house-embedder</code>"),
    ("endpoint", "http://llm.internal.example/v1", "", "no embedding model is"),
    ("endpoint", "", "house-embedder", "no embedding model is"),
])
def test_the_help_page_says_where_vectors_come_from(logged_in, settings, embeddings, base_url, embedding_model,
                                                    says):
    settings.EMBEDDINGS = embeddings
    settings.LLM_BASE_URL = base_url
    settings.LLM_EMBEDDING_MODEL = embedding_model

    body = logged_in.get(reverse("dashboard:model_help")).content.decode()

    assert says in body
    assert body.count('id="embedding-state"') == 1
    assert "llm.internal.example" not in body


def test_the_help_page_needs_a_login(client):
    response = client.get(reverse("dashboard:model_help"))
    assert response.status_code == 302 and reverse("login") in response["Location"]
