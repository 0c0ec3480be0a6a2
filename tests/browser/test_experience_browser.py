"""The experience page in a real browser: open it from the kin's page, read the current
document, compare two chosen versions, and log a fact from the facts page."""
import pytest
from playwright.sync_api import expect

from consolidation.models import Fact
from tests.factories import ExperienceVersionFactory, KinFactory

pytestmark = pytest.mark.browser

SCREENSHOT_PATH = "/tmp/kinsite-experience.png"

V1 = """# Master AI Experience
## 1. User Directives & Preferences
- Maria wants answers in bullet points.
## 2. Defensive Safeguards & Heuristics
## 3. Project-Specific Constraints
- The churn report deduplicates by email.
## 4. Anti-Patterns & Critical Gotchas
## 5. Mistake Corrections & Fixes"""
V2 = V1.replace("in bullet points.", "in bullet points <b>always</b>.")
V3 = V2.replace("by email.", "by customer id.")


def test_read_the_document_and_diff_two_versions(logged_in_page, browser_team, browser_user):
    page = logged_in_page
    kin = KinFactory(team=browser_team, name="Ada")
    for number, markdown in enumerate([V1, V2, V3], start=1):
        ExperienceVersionFactory(kin=kin, version=number, markdown=markdown, word_count=len(markdown.split()))

    page.goto(f"/kins/{kin.pk}/")
    page.get_by_role("link", name="Experience").click()

    document = page.locator("#experience-markdown")
    expect(document).to_contain_text("The churn report deduplicates by customer id.")
    # Markdown/HTML in the document is shown as text, never rendered.
    expect(document).to_contain_text("in bullet points <b>always</b>.")
    expect(page.locator("#experience-markdown b")).to_have_count(0)
    expect(page.locator("#experience-versions tbody tr")).to_have_count(3)

    page.select_option("#diff-from", "1")
    page.select_option("#diff-to", "3")
    page.click("text=Show diff")

    expect(page.locator("h3")).to_have_text("Changes from version 1 to version 3")
    diff = page.locator("#experience-diff")
    expect(diff.locator(".diff-del")).to_contain_text(["-- Maria wants answers in bullet points.",
                                                       "-- The churn report deduplicates by email."])
    expect(diff.locator(".diff-add")).to_contain_text(["+- Maria wants answers in bullet points <b>always</b>.",
                                                       "+- The churn report deduplicates by customer id."])
    assert "from=1" in page.url and "to=3" in page.url
    page.screenshot(path=SCREENSHOT_PATH, full_page=True)

    page.get_by_role("link", name="facts").first.click()
    page.click("text=Add fact")
    page.fill("textarea[name=statement]", "Reports go out on Mondays.")
    page.select_option("select[name=category]", "decision")
    page.get_by_role("button", name="Add fact").click()
    expect(page.locator("#fact-rows")).to_contain_text("Reports go out on Mondays.")
    fact = Fact.objects.get(kin=kin)
    assert fact.source_ref == f"user:{browser_user.username}" and fact.category == "decision"
