"""The dashboard shell through Django's test client: login, team scoping, the
htmx partial, escaping, the no-model banner and query counts."""
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tests.factories import KinFactory, MembershipFactory, MessageFactory, SessionFactory, UserFactory

pytestmark = pytest.mark.django_db

NO_MODEL_TEXT = "No language model is configured (LLM_BASE_URL)"


@pytest.fixture
def logged_in(client, user, team):
    client.force_login(user)
    return client


@pytest.mark.parametrize(
    "url",
    [
        reverse("dashboard:home"),
        reverse("dashboard:kins"),
        reverse("dashboard:kin_detail", args=[1]),
        reverse("dashboard:session_detail", args=[1]),
    ],
)
def test_pages_redirect_anonymous_users_to_login(client, url):
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"] == f"{reverse('login')}?next={url}"


def test_login_form_logs_in_and_lands_on_kins(client, user, team):
    response = client.post(reverse("login"), {"username": user.username, "password": "pass-word-123"}, follow=True)
    assert response.redirect_chain[-1][0] == reverse("dashboard:kins")
    assert team.name in response.content.decode()


def test_logout_is_a_post_that_returns_to_login(logged_in):
    response = logged_in.post(reverse("logout"))
    assert response.status_code == 302
    assert response["Location"] == reverse("login")
    assert logged_in.get(reverse("dashboard:kins")).status_code == 302


def test_kins_list_shows_only_the_teams_kins(logged_in, team, other_team):
    ada = KinFactory(team=team, name="Ada", role="Data assistant")
    SessionFactory(kin=ada)
    SessionFactory(kin=ada)
    KinFactory(team=other_team, name="Mallory")

    response = logged_in.get(reverse("dashboard:kins"))

    assert response.status_code == 200
    body = response.content.decode()
    assert "Ada" in body and "Data assistant" in body
    assert "Mallory" not in body
    assert response.context["kins"].get().session_count == 2


def test_kins_search_without_htmx_renders_the_full_page_filtered(logged_in, team):
    KinFactory(team=team, name="Ada")
    KinFactory(team=team, name="Grace")

    response = logged_in.get(reverse("dashboard:kins"), {"q": "gra"})

    body = response.content.decode()
    assert "<html" in body
    assert "Grace" in body and ">Ada<" not in body


def test_htmx_search_returns_only_the_filtered_rows_partial(logged_in, team):
    KinFactory(team=team, name="Ada")
    KinFactory(team=team, name="Grace")

    response = logged_in.get(reverse("dashboard:kins"), {"q": "ad"}, HTTP_HX_REQUEST="true")

    assert response.status_code == 200
    # The rows partial (and the identity it includes per kin), not the page.
    assert {t.name for t in response.templates} == {"dashboard/_kin_rows.html", "dashboard/_kin_identity.html"}
    body = response.content.decode()
    assert "<html" not in body and "<tbody" not in body
    assert "Ada" in body and "Grace" not in body
    assert "HX-Request" in response["Vary"]


def test_htmx_history_restore_gets_the_full_page(logged_in, team):
    KinFactory(team=team, name="Ada")
    response = logged_in.get(
        reverse("dashboard:kins"), {"q": "ad"}, HTTP_HX_REQUEST="true", HTTP_HX_HISTORY_RESTORE_REQUEST="true"
    )
    assert "<html" in response.content.decode()


def test_other_teams_kin_and_session_answer_404(logged_in, other_team):
    foreign_kin = KinFactory(team=other_team, name="Mallory")
    foreign_session = SessionFactory(kin=foreign_kin, title="Secret plans")

    assert logged_in.get(reverse("dashboard:kin_detail", args=[foreign_kin.pk])).status_code == 404
    response = logged_in.get(reverse("dashboard:session_detail", args=[foreign_session.pk]))
    assert response.status_code == 404
    assert "Secret plans" not in response.content.decode()


def test_kin_detail_shows_identity_and_sessions_with_message_counts(logged_in, team):
    kin = KinFactory(team=team, name="Ada", character="Calm, precise.", expertise="CSV cleaning")
    chat = SessionFactory(kin=kin, title="Welcome chat")
    MessageFactory.create_batch(3, session=chat)
    SessionFactory(kin=kin, title="Empty chat")

    response = logged_in.get(reverse("dashboard:kin_detail", args=[kin.pk]))

    body = response.content.decode()
    assert "Calm, precise." in body and "CSV cleaning" in body
    counts = {s.title: s.message_count for s in response.context["chat_sessions"]}
    assert counts == {"Welcome chat": 3, "Empty chat": 0}
    assert reverse("dashboard:session_detail", args=[chat.pk]) in body


def test_script_tags_in_kin_names_and_messages_are_escaped(logged_in, team):
    kin = KinFactory(team=team, name="<script>alert('kin')</script>")
    chat = SessionFactory(kin=kin, title="<script>alert('title')</script>")
    MessageFactory(session=chat, content="<script>alert('message')</script>", sender="<b>Eve</b>")

    pages = [
        logged_in.get(reverse("dashboard:kins")),
        logged_in.get(reverse("dashboard:kins"), {"q": "script"}, HTTP_HX_REQUEST="true"),
        logged_in.get(reverse("dashboard:kin_detail", args=[kin.pk])),
        logged_in.get(reverse("dashboard:session_detail", args=[chat.pk])),
    ]

    for response in pages:
        body = response.content.decode()
        assert "<script>alert" not in body
        assert "<b>Eve</b>" not in body
    assert "&lt;script&gt;alert(&#x27;message&#x27;)&lt;/script&gt;" in pages[-1].content.decode()


def test_no_model_banner_shown_when_llm_base_url_is_empty(logged_in, settings):
    settings.LLM_BASE_URL = ""
    assert NO_MODEL_TEXT in logged_in.get(reverse("dashboard:kins")).content.decode()


def test_no_model_banner_absent_when_llm_base_url_is_set(logged_in, settings):
    settings.LLM_BASE_URL = "http://127.0.0.1:9999/v1"
    assert NO_MODEL_TEXT not in logged_in.get(reverse("dashboard:kins")).content.decode()


def test_user_without_a_team_sees_a_clear_message(client):
    client.force_login(UserFactory())
    response = client.get(reverse("dashboard:kins"))
    assert response.status_code == 200
    assert "You are not a member of any team" in response.content.decode()


def test_staff_see_the_admin_link_and_members_do_not(client, team):
    member, staff = UserFactory(), UserFactory(is_staff=True)
    MembershipFactory(team=team, user=member)
    MembershipFactory(team=team, user=staff)
    admin_href = f'href="{reverse("admin:index")}"'

    client.force_login(member)
    assert admin_href not in client.get(reverse("dashboard:kins")).content.decode()
    client.force_login(staff)
    assert admin_href in client.get(reverse("dashboard:kins")).content.decode()


def _kins_page_queries(client) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(reverse("dashboard:kins")).status_code == 200
    return len(captured)


def test_kins_list_query_count_does_not_grow_with_kins(logged_in, team, django_assert_max_num_queries):
    for _ in range(2):
        SessionFactory(kin=KinFactory(team=team))
    few = _kins_page_queries(logged_in)

    for _ in range(20):
        kin = KinFactory(team=team)
        SessionFactory.create_batch(2, kin=kin)
    # Session and user lookup, the team (once: the context processor reuses it), the kins,
    # their imports.
    with django_assert_max_num_queries(5):
        logged_in.get(reverse("dashboard:kins"))
    assert _kins_page_queries(logged_in) == few
