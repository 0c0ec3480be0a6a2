"""Without a language model, in Chromium: the experience page's "Consolidate now" is disabled
and says why, its link leads to the help page (what works without a model, how to connect
one), and "Prepare only" still renders the prompt."""
import pytest
from playwright.sync_api import expect

from consolidation.models import ConsolidationRun, Fact
from consolidation.services import fact_record
from tests.factories import KinFactory

pytestmark = pytest.mark.browser


@pytest.fixture(autouse=True)
def no_model(settings):
    settings.LLM_BASE_URL = ""


def test_consolidate_now_explains_itself_and_links_the_help_page(logged_in_page, browser_team):
    page = logged_in_page
    kin = KinFactory(team=browser_team, name="Ada")
    fact_record(kin=kin, statement="Maria wants weekly reports.", source=Fact.Source.API)

    page.goto(f"/kins/{kin.pk}/experience/")

    button = page.get_by_role("button", name="Consolidate now")
    expect(button).to_be_disabled()
    expect(button).to_have_accessible_description(
        "Consolidation needs a language model, and none is configured (LLM_BASE_URL is empty): how to connect one. "
        "Prepare only renders the prompt without one.")

    page.get_by_role("button", name="Prepare only").click()
    expect(page.locator("#run-outcome")).to_contain_text("The prompt is rendered below (no model was called).")
    run = ConsolidationRun.objects.get()
    assert run.status == ConsolidationRun.Status.PREPARED and "Maria wants weekly reports." in run.rendered_prompt

    page.locator(".consolidate-form").get_by_role("link", name="how to connect one").click()
    page.wait_for_url("**/help/model/")
    expect(page.locator("#model-state")).to_contain_text("No language model is connected")
    expect(page.locator("#model-needs tbody tr")).to_have_count(7)
    expect(page.locator("#model-needs")).to_contain_text("Prepare only still renders the prompt")
    expect(page.get_by_role("status").filter(has_text="No language model is configured")).to_have_count(1)
