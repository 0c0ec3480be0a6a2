"""The workflow page in a real browser: the drawn graph, a run from the Run button that
updates statuses and counts, and the lineage inspector of the last node."""
import pytest
from playwright.sync_api import expect

from workflows import services

pytestmark = pytest.mark.browser

SCREENSHOT_PATH = "/tmp/kinsite-workflow.png"
INSPECTOR_SCREENSHOT_PATH = "/tmp/kinsite-workflow-inspector.png"
PEOPLE = [{"name": "Ada", "age": 36}, {"name": "Bo", "age": 17}, {"name": "Cy", "age": 52}, {"name": "Di", "age": 44}]


def test_run_a_workflow_and_inspect_the_last_node(logged_in_page, browser_team):
    page = logged_in_page
    document = services.document_clean({
        "name": "Adults",
        "nodes": [
            {"id": "people", "type": "inline_records", "label": "People", "config": {"records": PEOPLE}},
            {"id": "adults", "type": "filter", "label": "Adults",
             "config": {"conditions": [{"field": "age", "op": "gte", "value": 18}]}},
            {"id": "table", "type": "table_output", "label": "Result table", "config": {"columns": ["name", "age"]}},
        ],
        "edges": [{"source": "people", "target": "adults"}, {"source": "adults", "target": "table"}],
    })
    workflow = services.workflow_create(team=browser_team, document=document)

    page.click("nav >> text=Workflows")
    page.click("text=Adults")
    graph = page.locator("svg#workflow-graph")
    expect(graph).to_be_visible()
    expect(graph.locator("a.wf-node")).to_have_count(3)
    expect(graph.locator("path.wf-edge")).to_have_count(2)
    expect(graph.locator("a.wf-node.status-idle")).to_have_count(3)

    page.click("#run-workflow")
    expect(page.locator("#run-state")).to_contain_text("done")
    expect(graph.locator("a.wf-node.status-done")).to_have_count(3)
    expect(graph.locator('a.wf-node[data-node="adults"] .wf-counts')).to_have_text("4 in · 3 out")
    expect(page.locator('#workflow-nodes tr[data-node="table"]')).to_contain_text("Shows 3 rows")
    page.screenshot(path=SCREENSHOT_PATH, full_page=True)

    graph.locator('a.wf-node[data-node="table"]').click()
    page.wait_for_url(f"**/workflows/{workflow.pk}/nodes/table/")
    narrative = page.locator("#lineage-narrative")
    expect(narrative).to_contain_text("1. Provides 4 inline records")
    expect(narrative).to_contain_text("2. Keeps records where age ≥ 18")
    expect(narrative).to_contain_text("3. Shows the records as a table")
    expect(page.locator("#lineage-entries tbody tr")).to_have_count(3)
    expect(page.locator("#node-results tbody tr")).to_have_count(3)
    expect(page.locator("#stale-warning")).to_have_count(0)

    page.select_option("#max-chars", "500")
    page.wait_for_url("**max_chars=500**")
    expect(page.locator("#max-chars")).to_have_value("500")
    page.screenshot(path=INSPECTOR_SCREENSHOT_PATH, full_page=True)


def test_a_workflow_with_an_unknown_node_type_has_a_disabled_run_button_saying_why(logged_in_page, browser_team):
    page = logged_in_page
    document = services.document_clean({
        "name": "Pivoted",
        "nodes": [
            {"id": "people", "type": "inline_records", "label": "People", "config": {"records": PEOPLE}},
            {"id": "pivot", "type": "pivot_table", "label": "Pivot", "config": {"by": "age"}},
        ],
        "edges": [{"source": "people", "target": "pivot"}],
    })
    services.workflow_create(team=browser_team, document=document)

    page.click("nav >> text=Workflows")
    page.click("text=Pivoted")

    run = page.locator("#run-workflow")
    expect(run).to_be_disabled()
    expect(page.locator("#run-blocked")).to_contain_text("Unknown node types cannot run: pivot_table")
    expect(run).to_have_attribute("aria-describedby", "run-blocked")
