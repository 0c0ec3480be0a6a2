"""The prompt template admin's preview with a kin's real data (issue 16): the change form's
text, saved or not, rendered by the job's own prompt code for a chosen kin (and session),
shown escaped; nothing saved or changed, no model called; refused exactly as a save would
refuse the template; only for whoever may change the template, only with their teams' kins."""
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from consolidation import services as consolidation_services
from consolidation.models import ConsolidationRun, ExperienceVersion, Fact
from kinsite.models import LLMCall, PromptTemplate
from memories.models import Memory
from sessions_app.models import CompactionRun, Event, IntrospectionRun, Session, Summary
from tests.factories import (
    ExperienceVersionFactory,
    KinFactory,
    MembershipFactory,
    MemoryFactory,
    MessageFactory,
    PromptTemplateFactory,
    SessionFactory,
    SummaryFactory,
    UserFactory,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("model")]  # `model`: any model call fails

HTMX = {"HTTP_HX_REQUEST": "true"}
SAVED_BODY = "Saved text for {kin_name}."


@pytest.fixture
def staff_client(client, staff):
    """Staff of `team` with every permission, not a superuser (tests/kinsite/conftest.py)."""
    client.force_login(staff)
    return client


@pytest.fixture
def ada(team):
    return KinFactory(team=team, name="Ada")


@pytest.fixture
def churn_session(ada):
    """A session of Ada with a compaction summary, two newer messages and working notes."""
    session = SessionFactory(kin=ada, title="Churn report", description="Quarterly churn report",
                             working_memory="Goal: churn report by Friday.")
    old = timezone.now() - timedelta(hours=2)
    first = MessageFactory(session=session, content="Start the churn report.", created_at=old)
    SummaryFactory(session=session, first_event=first, content="Maria asked for the churn report; APAC is done.")
    MessageFactory(session=session, content="Please add the EMEA region.")
    MessageFactory(session=session, sender="", role=Event.Role.ASSISTANT, content="EMEA is in.")
    return session


def template_of(kin, kind, body=SAVED_BODY):
    return PromptTemplateFactory(team=kin.team, kin=kin, kind=kind, name="Ada's", body=body)


def preview_url(template=None):
    if template is None:
        return reverse("admin:kinsite_prompttemplate_preview_add")
    return reverse("admin:kinsite_prompttemplate_preview", args=[template.pk])


def form_data(template, **fields):
    """The change form as the browser posts it, with the preview's choices."""
    data = {"team": template.team_id, "kin": template.kin_id or "", "kind": template.kind, "name": template.name,
            "body": template.body, "is_active": "on", **fields}
    return {key: value for key, value in data.items() if value is not None}


def rendered(response) -> str:
    page = response.content.decode()
    assert 'id="template-preview-result"' in page
    return page.split('id="template-preview-result"', 1)[1]


def counts():
    models = (PromptTemplate, LLMCall, ConsolidationRun, ExperienceVersion, Fact, Memory, Event, Summary,
              CompactionRun, IntrospectionRun, Session, LogEntry)
    return {model.__name__: model.objects.count() for model in models}


def test_compaction_preview_renders_the_unsaved_text_with_the_sessions_real_data_and_saves_nothing(
        staff_client, churn_session):
    template = template_of(churn_session.kin, "compaction")
    before, saved = counts(), PromptTemplate.objects.values().get(pk=template.pk)
    body = "UNSAVED for {kin_name}: {message_count} messages.\n{previous_block}{transcript}"

    response = staff_client.post(preview_url(template), form_data(
        template, body=body, preview_kin=churn_session.kin.pk, preview_session=churn_session.pk), **HTMX)

    assert response.status_code == 200
    result = rendered(response)
    assert "UNSAVED for Ada: 2 messages." in result
    assert "Maria asked for the churn report; APAC is done." in result  # the previous summary, merged
    assert "Maria: Please add the EMEA region." in result and "Ada: EMEA is in." in result
    assert "Start the churn report." not in result  # summarised already: not in the transcript
    assert "Saved text" not in result
    assert "You write the running summary of a conversation" in result  # the job's system message
    assert "tokens" in result and "Nothing was saved." in result
    assert counts() == before
    assert PromptTemplate.objects.values().get(pk=template.pk) == saved


def test_introspection_preview_reads_the_chosen_session_not_the_latest(staff_client, churn_session, ada):
    SessionFactory(kin=ada, title="Newer", working_memory="Newer notes.", last_activity_at=timezone.now())
    template = template_of(ada, "introspection")
    before = counts()

    response = staff_client.post(preview_url(template), form_data(
        template, body="{kin_name} | {description} | {working_memory} | {max_tool_calls}\n{events}",
        preview_kin=ada.pk, preview_session=churn_session.pk), **HTMX)

    result = rendered(response)
    assert "Ada | Quarterly churn report | &gt; Goal: churn report by Friday. | 10" in result
    assert "Maria: Please add the EMEA region." in result
    assert "Newer notes." not in result
    assert "memory_recall" in result  # the tools the run is offered, in the notes
    assert counts() == before
    churn_session.refresh_from_db()
    assert churn_session.working_memory == "Goal: churn report by Friday."


def test_without_a_session_the_kins_most_recently_active_one_is_used(staff_client, churn_session, ada):
    SessionFactory(kin=ada, working_memory="Newest notes.", last_activity_at=timezone.now() + timedelta(minutes=1))
    template = template_of(ada, "introspection")

    response = staff_client.post(preview_url(template), form_data(
        template, body="{working_memory}", preview_kin=ada.pk, preview_session=""), **HTMX)

    assert "Newest notes." in rendered(response)


def test_consolidation_preview_shows_the_kins_facts_and_document_and_changes_nothing(staff_client, ada):
    memory = MemoryFactory(kin=ada, content="The churn report deduplicates by customer id.")
    fact = consolidation_services.fact_record(kin=ada, statement=memory.content, source="introspection",
                                              memory=memory)
    ExperienceVersionFactory(kin=ada, version=1, markdown="# Master AI Experience\n- Maria wants bullet points.")
    template = template_of(ada, "consolidation")
    before = counts()

    response = staff_client.post(preview_url(template), form_data(
        template, body="Fold for {kin_name} in {max_words} words.\n{pending_facts}\n{current_experience}",
        preview_kin=ada.pk), **HTMX)

    result = rendered(response)
    assert "Fold for Ada in 1200 words." in result
    assert f"[id {fact.pk}] (fact, " in result and "The churn report deduplicates by customer id." in result
    assert "- Maria wants bullet points." in result
    assert "1 pending facts" in result
    assert counts() == before
    fact.refresh_from_db()
    assert fact.status == Fact.Status.ACTIVE and not fact.is_consolidated


def test_the_add_page_previews_too(staff_client, churn_session, team):
    response = staff_client.post(preview_url(), {
        "team": team.pk, "kind": "compaction", "name": "New", "body": "NEW {transcript}",
        "preview_kin": churn_session.kin.pk}, **HTMX)

    assert "NEW [" in rendered(response) and "Please add the EMEA region." in rendered(response)
    assert not PromptTemplate.objects.exists()


@pytest.mark.parametrize("body, error", [
    ("Hello {kin_nam}.", "unknown placeholder {kin_nam} (did you mean {kin_name}?)"),
    ("JSON: {\"a\": {max_tool_calls}}", "write {{ and }} for literal braces"),
    ("{events.__class__}", "reaches into an attribute or item"),
])
def test_an_invalid_template_shows_the_saves_error_and_renders_nothing(staff_client, churn_session, body, error):
    template = template_of(churn_session.kin, "introspection")
    before = counts()

    preview = staff_client.post(preview_url(template), form_data(
        template, body=body, preview_kin=churn_session.kin.pk), **HTMX)
    save = staff_client.post(reverse("admin:kinsite_prompttemplate_change", args=[template.pk]),
                             form_data(template, body=body))

    result = rendered(preview)
    assert preview.status_code == 200 and "Nothing rendered" in result
    assert error in result
    assert error in save.content.decode()  # the same words as the save's
    assert "Maria" not in result  # nothing of the session
    assert counts() == before
    assert PromptTemplate.objects.get(pk=template.pk).body == SAVED_BODY


def test_a_session_with_nothing_to_summarise_says_so(staff_client, ada):
    empty = SessionFactory(kin=ada, title="Empty")
    template = template_of(ada, "compaction")

    response = staff_client.post(preview_url(template), form_data(
        template, body="{transcript}", preview_kin=ada.pk, preview_session=empty.pk), **HTMX)

    assert "Empty has nothing to summarise: no messages after its latest summary." in rendered(response)


def test_another_teams_kin_posted_by_hand_is_refused_without_its_data(staff_client, ada, other_team):
    stranger = KinFactory(team=other_team, name="Borealis kin")
    SessionFactory(kin=stranger, working_memory="Borealis secret plan.")
    template = template_of(ada, "introspection")

    response = staff_client.post(preview_url(template), form_data(
        template, body="{kin_name} {working_memory}", preview_kin=stranger.pk), **HTMX)

    result = rendered(response)
    assert "Choose one of the kins offered (a kin of your teams)." in result
    assert "Borealis" not in response.content.decode()
    # Without htmx: the error page, 400.
    response = staff_client.post(preview_url(template), form_data(
        template, body="{kin_name} {working_memory}", preview_kin=stranger.pk))
    assert response.status_code == 400 and "Borealis" not in response.content.decode()


def test_another_teams_session_posted_by_hand_is_refused_without_its_data(staff_client, ada, other_team):
    foreign = SessionFactory(kin=KinFactory(team=other_team), working_memory="Borealis secret plan.")
    SessionFactory(kin=ada)
    template = template_of(ada, "introspection")

    response = staff_client.post(preview_url(template), form_data(
        template, body="{working_memory}", preview_kin=ada.pk, preview_session=foreign.pk), **HTMX)

    result = rendered(response)
    assert f"Session {foreign.pk} is not a session of Ada" in result
    assert "Borealis" not in result


def test_another_teams_template_cannot_be_previewed(staff_client, other_team, ada):
    foreign = PromptTemplateFactory(team=other_team, kind="introspection", body="{kin_name}")

    response = staff_client.post(preview_url(foreign), form_data(foreign, preview_kin=ada.pk), **HTMX)

    assert response.status_code == 404


def test_staff_without_change_permission_is_refused(client, team, ada, churn_session):
    viewer = UserFactory(is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(codename="view_prompttemplate"))
    MembershipFactory(team=team, user=viewer, role="admin")
    client.force_login(get_user_model().objects.get(pk=viewer.pk))
    template = template_of(ada, "introspection")

    page = client.get(reverse("admin:kinsite_prompttemplate_change", args=[template.pk]))
    response = client.post(preview_url(template), form_data(
        template, body="{working_memory}", preview_kin=ada.pk), **HTMX)
    add = client.post(preview_url(), form_data(template, body="{working_memory}", preview_kin=ada.pk), **HTMX)

    assert page.status_code == 200 and "real-data-preview" not in page.content.decode()  # view only: no preview
    assert response.status_code == 403 and add.status_code == 403
    assert "Goal: churn report" not in response.content.decode()


def test_the_preview_needs_a_csrf_token_and_a_post(staff, ada, churn_session):
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff)
    template = template_of(ada, "introspection")

    assert client.post(preview_url(template), form_data(template, preview_kin=ada.pk), **HTMX).status_code == 403
    assert client.get(preview_url(template), **HTMX).status_code == 405


def test_stored_markup_is_shown_as_text(staff_client, team):
    kin = KinFactory(team=team, name="<script>alert('kin')</script>")
    SessionFactory(kin=kin, working_memory="<img src=x onerror=alert(1)>")
    template = PromptTemplateFactory(team=team, kind="introspection", body="<script>alert('body')</script> {kin_name}")

    response = staff_client.post(preview_url(template), form_data(
        template, body="<script>alert('body')</script> {working_memory}", preview_kin=kin.pk), **HTMX)

    result = rendered(response)
    assert "<script" not in result and "<img" not in result
    assert "&lt;script&gt;alert(&#x27;body&#x27;)&lt;/script&gt;" in result  # the template text, escaped
    assert "&lt;script&gt;alert(&#x27;kin&#x27;)&lt;/script&gt;" in result  # the kin's name, escaped


def test_without_javascript_the_preview_is_a_page_of_its_own(staff_client, churn_session):
    template = template_of(churn_session.kin, "compaction")

    response = staff_client.post(preview_url(template), form_data(
        template, body="PAGE {transcript}", preview_kin=churn_session.kin.pk))

    page = response.content.decode()
    assert response.status_code == 200 and "<html" in page
    assert "PAGE [" in rendered(response)
    assert reverse("admin:kinsite_prompttemplate_change", args=[template.pk]) in page  # the way back


def test_the_change_page_offers_the_users_kins_and_the_templates_kins_sessions(staff_client, churn_session, other_team):
    KinFactory(team=other_team, name="Borealis kin")
    template = template_of(churn_session.kin, "compaction")

    page = staff_client.get(reverse("admin:kinsite_prompttemplate_change", args=[template.pk])).content.decode()

    controls = page.split('id="real-data-preview"', 1)[1]
    assert f'<option value="{churn_session.kin.pk}" selected>Ada' in controls
    assert "Borealis" not in page
    assert f'<option value="{churn_session.pk}">Churn report' in controls
    assert preview_url(template) in controls


def test_the_session_choices_are_the_kins_and_only_for_kinds_that_read_one(staff_client, churn_session, other_team):
    stranger = KinFactory(team=other_team)
    SessionFactory(kin=stranger, title="Borealis session")
    url = reverse("admin:kinsite_prompttemplate_preview_sessions")

    mine = staff_client.get(url, {"preview_kin": churn_session.kin.pk, "kind": "introspection"}).content.decode()
    theirs = staff_client.get(url, {"preview_kin": stranger.pk, "kind": "introspection"}).content.decode()
    consolidation = staff_client.get(url, {"preview_kin": churn_session.kin.pk, "kind": "consolidation"})

    assert f'<option value="{churn_session.pk}">Churn report' in mine
    assert "Borealis" not in theirs and "<option value=\"\">" in theirs
    assert "this kind reads no session" in consolidation.content.decode()


def test_ids_out_of_range_or_not_numbers_are_refused_cleanly(staff_client, ada):
    template = template_of(ada, "introspection")
    url = reverse("admin:kinsite_prompttemplate_preview_sessions")

    for kin_id in ("9" * 30, "²", "x"):
        choices = staff_client.get(url, {"preview_kin": kin_id, "kind": "compaction"}).content.decode()
        assert choices.count("<option") == 1  # the blank one: no kin, no sessions
        response = staff_client.post(preview_url(template), form_data(template, preview_kin=kin_id), **HTMX)
        assert "Choose one of the kins offered" in rendered(response)
    response = staff_client.post(preview_url(template), form_data(
        template, preview_kin=ada.pk, preview_session="9" * 30), **HTMX)
    assert "Nothing rendered" in rendered(response)
