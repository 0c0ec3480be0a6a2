"""Empty dashboard lists say why they are empty and what to do next, with a link to the
action where the dashboard has one."""
import pytest
from django.urls import reverse

from tests.factories import FactFactory, KinFactory, MembershipFactory, SessionFactory, UserFactory, WorkflowFactory

pytestmark = pytest.mark.django_db


def url(name, *args):
    return reverse(f"dashboard:{name}", args=args)


@pytest.fixture
def owner(client, user, team):
    client.force_login(user)
    return client


@pytest.fixture
def member(client, team):
    someone = UserFactory()
    MembershipFactory(team=team, user=someone, role="member")
    client.force_login(someone)
    return client


def test_no_kins_offers_new_kin_to_managers(owner):
    body = owner.get(url("kins")).content.decode()

    assert "This team has no kins yet." in body
    assert f'<a href="{url("kin_create")}">Create the first kin</a>' in body


def test_no_kins_tells_members_whom_to_ask(member):
    body = member.get(url("kins")).content.decode()

    assert "This team has no kins yet. Ask a team owner or admin to create one." in body
    assert url("kin_create") not in body


def test_kin_search_without_results_offers_every_kin(owner, kin):
    body = owner.get(url("kins"), {"q": "zebra"}, HTTP_HX_REQUEST="true").content.decode()

    assert "No kin's name contains “zebra”." in body
    assert f'<a href="{url("kins")}">show every kin</a>' in body


def test_kin_without_sessions_offers_a_new_session(member, kin):
    body = member.get(url("kin_detail", kin.pk)).content.decode()

    assert f'No sessions yet. <a href="{url("session_create", kin.pk)}">Start a session</a> to chat' in body


def test_session_without_messages_says_to_write_the_first(member, kin):
    chat = SessionFactory(kin=kin)
    body = member.get(url("session_detail", chat.pk)).content.decode()

    assert f"No messages yet. Write the first one below and {kin.name} answers." in body
    assert 'id="chat-form"' in body


def test_kin_without_memories_offers_to_add_one(member, kin):
    body = member.get(url("memory_list", kin.pk)).content.decode()

    assert "This kin has no memories yet" in body
    assert f'<a href="{url("memory_add", kin.pk)}">add a memory</a>' in body


def test_memories_hidden_by_the_filters_say_how_to_see_them(member, team, kin):
    from memories import services

    memory = services.memory_add(team=team, kin=kin, content="Old news.", actor=services.Actor("test")).memory
    services.memory_delete(memory=memory, actor=services.Actor("test"))

    body = member.get(url("memory_list", kin.pk)).content.decode()

    assert "No memory matches these filters; choose “All” under Status" in body
    assert "has no memories yet" not in body


def test_memory_search_without_results_says_what_to_try(member, kin):
    body = member.get(url("memory_list", kin.pk), {"q": "zebra"}).content.decode()

    assert "No active memory matches “zebra”. Try other words, or choose “All” under Status" in body


def test_facts_without_any_name_where_they_come_from(member, kin):
    body = member.get(url("fact_list", kin.pk)).content.decode()

    assert "No facts logged yet. Introspection logs them" in body
    assert f"/api/v1/kins/{kin.pk}/facts/" in body and "or add one with “Add fact” above." in body


def test_experience_without_a_version_points_to_facts_or_to_consolidation(member, kin):
    without_facts = member.get(url("experience", kin.pk)).content.decode()
    assert f'<a href="{url("fact_list", kin.pk)}">add a fact</a>' in without_facts
    assert "No versions yet. Each consolidation that is applied writes one" in without_facts
    assert "No consolidation has run yet. Press “Consolidate now” above" in without_facts

    FactFactory(kin=kin)
    FactFactory(kin=kin)
    with_facts = member.get(url("experience", kin.pk)).content.decode()
    assert "2 pending facts are waiting: press “Consolidate now” above." in with_facts


def test_no_workflows_points_to_the_api_docs_and_tokens(member):
    body = member.get(url("workflows")).content.decode()

    assert "No workflows yet. Push one through the API with <code>POST /api/v1/workflows/</code>" in body
    assert '(see the <a href="/api/v1/schema/docs/">API docs</a>' in body
    assert f'<a href="{url("tokens")}">create a token</a>' in body


def test_workflow_without_nodes_or_runs_says_how_to_fill_it(member, team):
    workflow = WorkflowFactory(team=team)
    body = member.get(url("workflow_detail", workflow.pk)).content.decode()

    assert ("This workflow has no nodes. Replace its graph through the API with "
            f"<code>PUT /api/v1/workflows/{workflow.pk}/") in body
    assert "Never ran. “Run” starts the first run" in body


def test_no_tokens_points_managers_to_the_form(owner, team):
    body = owner.get(url("tokens")).content.decode()
    assert 'No tokens yet. <a href="#token-name">Create a token</a>' in body
    assert 'id="token-name"' in body


def test_no_tokens_tells_members_whom_to_ask(member):
    body = member.get(url("tokens")).content.decode()

    assert "No tokens yet. Ask a team owner or admin to create one" in body


def test_kin_names_in_empty_states_are_escaped(member, team):
    kin = KinFactory(team=team, name="<i>Eve</i>")
    for page in (url("kin_detail", kin.pk), url("session_detail", SessionFactory(kin=kin).pk), url("fact_list", kin.pk),
                 url("experience", kin.pk)):
        body = member.get(page).content.decode()
        assert "<i>Eve</i>" not in body, page
        assert "&lt;i&gt;Eve&lt;/i&gt;" in body, page
