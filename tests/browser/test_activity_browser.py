"""The activity page in a real browser: a failed introspection run and a failed workflow run
are listed, found through the Failures filter, and their links open their details; the
list fits a 390 px wide phone screen."""
import pytest
from playwright.sync_api import expect

from sessions_app.models import IntrospectionRun, Turn
from tests.factories import (
    IntrospectionRunFactory,
    KinFactory,
    SessionFactory,
    TurnFactory,
    WorkflowFactory,
    WorkflowRunFactory,
)
from workflows.models import WorkflowRun

pytestmark = pytest.mark.browser

SCREENSHOT_PATH = "/tmp/kinsite-activity.png"


def test_failed_runs_are_found_through_the_failures_filter(logged_in_page, browser_team):
    page = logged_in_page
    kin = KinFactory(team=browser_team, name="Ada")
    chat = SessionFactory(kin=kin, title="Churn questions")
    TurnFactory(session=chat, status=Turn.Status.DONE)
    failed = IntrospectionRunFactory(session=chat, status=IntrospectionRun.Status.FAILED,
                                     error="LLMUnavailable: the model did not answer\n(after 3 attempts)")
    IntrospectionRunFactory(session=chat, status=IntrospectionRun.Status.DONE, summary="All fine.")
    workflow = WorkflowFactory(team=browser_team, name="Churn <report>")
    WorkflowRunFactory(workflow=workflow, status=WorkflowRun.Status.FAILED, error="Node 'load' failed")

    page.goto("/kins/")
    page.locator(".site-nav").get_by_role("link", name="Activity").click()
    rows = page.locator("#activity-rows > li")
    expect(rows).to_have_count(4)

    page.click("#activity-failures")
    expect(rows).to_have_count(2)
    assert "status=failed" in page.url
    expect(page.locator("#activity-status")).to_have_value("failed")
    run_row = page.locator(".activity-row.kind-introspection")
    expect(run_row).to_contain_text("failed")
    expect(run_row).to_contain_text("Churn questions")
    expect(run_row.locator(".activity-error")).to_have_text("LLMUnavailable: the model did not answer")
    expect(page.locator(".activity-row.kind-workflow_run")).to_contain_text("Churn <report>")
    expect(page.locator(".activity-row.kind-turn")).to_have_count(0)

    run_row.get_by_role("link").click()
    page.wait_for_url(f"**/sessions/{chat.pk}/?run={failed.pk}#introspection-run-{failed.pk}")
    detail = page.locator(f"#introspection-run-{failed.pk}")
    expect(detail).to_be_visible()
    expect(detail.locator(".run-error")).to_contain_text("(after 3 attempts)")

    page.go_back()
    page.locator(".activity-row.kind-workflow_run").get_by_role("link").click()
    page.wait_for_url(f"**/workflows/{workflow.pk}/")
    expect(page.locator("h1")).to_contain_text("Churn <report>")


def test_activity_list_fits_a_phone_screen(logged_in_page, browser_team):
    page = logged_in_page
    kin = KinFactory(team=browser_team, name="Ada")
    chat = SessionFactory(kin=kin, title="A rather long session title that has to wrap on a narrow phone screen")
    IntrospectionRunFactory(session=chat, status=IntrospectionRun.Status.FAILED, error="x" * 180)
    page.set_viewport_size({"width": 390, "height": 800})

    page.goto(f"/kins/{kin.pk}/activity/?status=failed")

    rows = page.locator("#activity-rows > li")
    expect(rows).to_have_count(1)
    for selector in ("#activity-rows", ".activity-filters"):
        box = page.locator(selector).bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390, (selector, box)
    page.screenshot(path=SCREENSHOT_PATH, full_page=True)
