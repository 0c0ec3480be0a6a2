"""The prompt template admin's preview in a real browser: edit the text, choose a kin,
preview (htmx, no page load), read the kin's real data rendered, leave without saving:
the template is unchanged."""
import pytest
from playwright.sync_api import expect

from kinsite.models import PromptTemplate
from tests.browser.conftest import PASSWORD
from tests.factories import (
    KinFactory,
    MembershipFactory,
    MessageFactory,
    PromptTemplateFactory,
    SessionFactory,
    UserFactory,
)

pytestmark = pytest.mark.browser

SAVED = "Saved introspection prompt for {kin_name}."


def test_preview_the_unsaved_text_and_leave_without_saving(page, browser_team):
    staff = UserFactory(is_staff=True, is_superuser=True)
    MembershipFactory(team=browser_team, user=staff, role="admin")
    kin = KinFactory(team=browser_team, name="Ada")
    session = SessionFactory(kin=kin, title="Churn report", working_memory="Goal: churn report by Friday.")
    MessageFactory(session=session, sender="Maria", content="Please add the EMEA region.")
    template = PromptTemplateFactory(team=browser_team, kind="introspection", name="Team prompt", body=SAVED)

    page.goto("/admin/login/")
    page.fill("#id_username", staff.username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.goto(f"/admin/kinsite/prompttemplate/{template.pk}/change/")
    page.fill("#id_body", "UNSAVED for {kin_name}: {working_memory}\n{events}")
    page.select_option("#id_preview_kin", str(kin.pk))
    expect(page.locator("#id_preview_session")).to_contain_text("Churn report")

    page.evaluate("window.__kinsiteMarker = 'same-page'")  # a full page load would wipe it
    page.click("#template-preview-button")
    result = page.locator("#template-preview-result")
    expect(result).to_contain_text("UNSAVED for Ada: > Goal: churn report by Friday.")
    expect(result).to_contain_text("Maria: Please add the EMEA region.")
    expect(result).to_contain_text("Nothing was saved.")
    assert page.evaluate("window.__kinsiteMarker") == "same-page"
    assert page.input_value("#id_body").startswith("UNSAVED for {kin_name}")  # the edit is still in the form

    page.goto("/admin/kinsite/prompttemplate/")
    expect(page.locator("#result_list")).to_contain_text("Team prompt")
    template.refresh_from_db()
    assert template.body == SAVED
    assert PromptTemplate.objects.count() == 1
