"""Creating and managing from the dashboard in Chromium: an admin creates a kin through
the form (after a refused first try), starts a session on it attached to a workflow,
renames it and archives it."""
import pytest
from playwright.sync_api import expect

from kinsite.models import Kin
from sessions_app.models import Session
from tests.browser.conftest import PASSWORD, log_in
from tests.factories import MembershipFactory, UserFactory, WorkflowFactory

pytestmark = pytest.mark.browser


@pytest.fixture
def admin_page(page, browser_team):
    admin = UserFactory()
    MembershipFactory(team=browser_team, user=admin, role="admin")
    log_in(page, username=admin.username, password=PASSWORD)
    return page


def _right_edge(locator) -> float:
    box = locator.bounding_box()
    return box["x"] + box["width"]


def test_admin_creates_a_kin_and_a_session_then_renames_and_archives_it(admin_page, browser_team):
    page = admin_page
    workflow = WorkflowFactory(team=browser_team, name="Churn pipeline")

    page.get_by_role("link", name="New kin").click()
    expect(page.locator("h1")).to_have_text("New kin")
    # Spaces pass the browser's `required`; the server refuses them and keeps what was typed.
    page.fill("#id_name", "   ")
    page.fill("#id_role", "Data assistant")
    page.fill("#id_introspection__max_tool_calls", "3")
    page.get_by_role("button", name="Create kin").click()
    expect(page.locator("main [role=alert]")).to_contain_text("Nothing was saved")
    expect(page.locator("#id_name_error")).to_have_text("Give the kin a name.")
    expect(page.locator("#id_role")).to_have_value("Data assistant")
    assert not Kin.objects.filter(team=browser_team).exists()

    page.fill("#id_name", "Ada")
    page.fill("#id_character", "Careful and brief.")
    page.get_by_role("button", name="Create kin").click()
    expect(page.locator("h1")).to_have_text("Ada")
    expect(page.locator("main")).to_contain_text("Kin created.")
    kin = Kin.objects.get(team=browser_team)
    assert (kin.name, kin.role, kin.overrides) == ("Ada", "Data assistant", {"introspection": {"max_tool_calls": 3}})

    page.get_by_role("link", name="New session").click()
    page.fill("#id_title", "Churn review")
    page.select_option("#id_workflow", label="Churn pipeline")
    page.get_by_role("button", name="Start session").click()
    expect(page.locator("h1")).to_have_text("Churn review")
    chat_session = Session.objects.get(kin=kin)
    assert page.url.endswith(f"/sessions/{chat_session.pk}/")
    assert chat_session.workflow_id == workflow.pk
    expect(page.locator("#chat-form")).to_be_visible()

    page.locator(".session-manage summary").click()
    page.fill(".session-manage #id_title", "Churn review, final")
    page.get_by_role("button", name="Rename").click()
    expect(page.locator("h1")).to_have_text("Churn review, final")

    page.locator(".session-manage summary").click()
    page.get_by_role("button", name="Archive").click()
    expect(page.locator("main")).to_contain_text("This session was archived on")
    expect(page.locator("#chat-form")).to_have_count(0)
    expect(page.get_by_role("button", name="Unarchive")).to_be_visible()
    chat_session.refresh_from_db()
    assert chat_session.title == "Churn review, final" and chat_session.archived_at is not None

    page.get_by_role("link", name="Ada").click()
    expect(page.locator("main table")).not_to_contain_text("Churn review, final")
    page.get_by_role("link", name="Show archived (1)").click()
    expect(page.locator("main table")).to_contain_text("Churn review, final")


def test_kin_and_session_forms_fit_a_phone_screen(admin_page, browser_team):
    page = admin_page
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto("/kins/new/")
    for selector in ("form.kin-form", "#id_character", "#id_history_token_budget", "form.kin-form fieldset"):
        assert _right_edge(page.locator(selector)) <= 390, selector
    page.fill("#id_name", "Ada")
    page.get_by_role("button", name="Create kin").click()
    page.get_by_role("link", name="New session").click()
    for selector in ("form.session-form", "#id_workflow", "#id_title"):
        assert _right_edge(page.locator(selector)) <= 390, selector
