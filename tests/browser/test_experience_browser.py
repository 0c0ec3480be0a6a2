"""The experience page in a real browser: open it from the kin's page, read the current
document (rendered from Markdown, its source one click away), compare two chosen versions
in the unified and the side-by-side layout, and log a fact from the facts page; a hostile
document runs nothing."""
import pytest
from playwright.sync_api import expect

from consolidation.models import Fact
from tests.factories import ExperienceVersionFactory, KinFactory

pytestmark = pytest.mark.browser

SCREENSHOT_PATH = "/tmp/kinsite-experience.png"
SIDE_BY_SIDE_SCREENSHOT_PATH = "/tmp/kinsite-experience-side-by-side.png"

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
    # Markdown renders: headings and list items; HTML in the document is shown as text.
    expect(document.locator("h1")).to_have_text("Master AI Experience")
    expect(document.locator("h2")).to_have_count(5)
    expect(document.locator("h2").first).to_have_text("1. User Directives & Preferences")
    expect(document.locator("li")).to_have_text(["Maria wants answers in bullet points <b>always</b>.",
                                                 "The churn report deduplicates by customer id."])
    expect(page.locator("#experience-markdown b")).to_have_count(0)
    source = page.locator("#experience-source")
    expect(source).to_be_hidden()
    page.get_by_text("Source (Markdown)").click()
    expect(source).to_contain_text("## 3. Project-Specific Constraints\n- The churn report deduplicates by")
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

    # The side-by-side layout: before | after, changed lines paired, the changed words marked.
    page.get_by_role("link", name="Side by side").click()
    assert "from=1" in page.url and "to=3" in page.url and "layout=side-by-side" in page.url
    table = page.locator("table#experience-diff")
    expect(table.locator("thead th")).to_have_text(["Version 1", "Version 3"])
    expect(table.locator("td.diff-del")).to_have_text(["- Maria wants answers in bullet points.",
                                                       "- The churn report deduplicates by email."])
    expect(table.locator("td.diff-add")).to_have_text(["- Maria wants answers in bullet points <b>always</b>.",
                                                       "- The churn report deduplicates by customer id."])
    expect(table.locator("td.diff-add mark")).to_have_text(["points <b>always</b>.", "customer id."])
    paired = table.locator("tr", has=page.locator("td.diff-del")).first
    expect(paired.locator("td.diff-number")).to_have_text(["3", "3"])
    before_box, after_box = (table.locator(f"td.diff-{kind}").first.bounding_box() for kind in ("del", "add"))
    assert before_box["x"] + before_box["width"] <= after_box["x"]  # two columns, side by side
    page.screenshot(path=SIDE_BY_SIDE_SCREENSHOT_PATH, full_page=True)
    page.get_by_role("link", name="Unified").click()
    expect(page.locator("pre#experience-diff .diff-add")).to_have_count(2)

    page.get_by_role("link", name="facts").first.click()
    page.click("text=Add fact")
    page.fill("textarea[name=statement]", "Reports go out on Mondays.")
    page.select_option("select[name=category]", "decision")
    page.get_by_role("button", name="Add fact").click()
    expect(page.locator("#fact-rows")).to_contain_text("Reports go out on Mondays.")
    fact = Fact.objects.get(kin=kin)
    assert fact.source_ref == f"user:{browser_user.username}" and fact.category == "decision"


HOSTILE = """# Notes <script>window.__pwned=1</script>
- <img src=x onerror="window.__pwned=1">
- [click me](javascript:window.__pwned=1)
- ![chart](https://tracker.example.com/pixel.gif)
- <a href="https://example.com" onmouseover="window.__pwned=1">hover</a>"""


def test_a_hostile_document_runs_nothing(logged_in_page, browser_team):
    page = logged_in_page
    kin = KinFactory(team=browser_team, name="Ada")
    ExperienceVersionFactory(kin=kin, version=1, markdown=V1)
    ExperienceVersionFactory(kin=kin, version=2, markdown=HOSTILE)

    page.goto(f"/kins/{kin.pk}/experience/")

    document = page.locator("#experience-markdown")
    expect(document.locator("h1")).to_have_text("Notes <script>window.__pwned=1</script>")
    expect(document.locator("li").first).to_have_text('<img src=x onerror="window.__pwned=1">')
    expect(document.locator("img, script, [onmouseover]")).to_have_count(0)
    # The javascript: link stays text; the image is a link to it, loading nothing.
    expect(document.locator("a")).to_have_count(1)
    expect(document.locator("a")).to_have_text("Image: chart")
    expect(document.locator("a")).to_have_attribute("rel", "nofollow noopener noreferrer")
    document.get_by_text("hover").hover()
    document.get_by_text("[click me](javascript:window.__pwned=1)").click()
    page.goto(f"/kins/{kin.pk}/experience/?layout=side-by-side")
    expect(page.locator("table#experience-diff td.diff-add").first).to_contain_text("<script>window.__pwned=1")
    assert page.evaluate("typeof window.__pwned") == "undefined"
