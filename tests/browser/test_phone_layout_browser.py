"""Every dashboard page on a 390 px wide phone screen: no horizontal scrolling of the page
(wide tables and the workflow graph scroll inside their own box), and the key controls are
inside the viewport and clickable. Seeded rows stress widths: long names, long unbroken
words and URLs, code, many columns. A new page adds one entry to PAGES."""
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import expect

from consolidation.models import ConsolidationRun
from kinsite import services as kinsite_services
from kinsite.models import LLMCall, Membership
from memories.models import MemoryChange
from sessions_app.models import Event, IntrospectionRun, Turn
from tests.browser.conftest import PASSWORD, TIMEOUT_MS, log_in
from tests.factories import (
    ConsolidationRunFactory,
    ExperienceVersionFactory,
    FactFactory,
    IntrospectionRunFactory,
    KinFactory,
    LLMCallFactory,
    MembershipFactory,
    MemoryChangeFactory,
    MemoryFactory,
    MessageFactory,
    SessionFactory,
    TeamFactory,
    ToolCallFactory,
    ToolResultFactory,
    TurnFactory,
    UserFactory,
    WorkflowRunFactory,
)
from workflows import services as workflow_services
from workflows.models import WorkflowRun

pytestmark = pytest.mark.browser

PHONE_WIDTH = 390
SCREENSHOT_DIR = Path("/tmp/kinsite-phone")

LONG_WORD = "Donaudampfschifffahrtsgesellschaftskapitän" * 4
LONG_URL = "https://example.com/reports/" + "/".join(f"segment-{n}_with_text" for n in range(12)) + "?q=" + "x" * 80
LONG_NAME = "Ada" + "Lovelace" * 12  # 99 characters, no space
LONG_TEXT = f"See {LONG_URL} and {LONG_WORD}; then a sentence with ordinary words that wraps as usual. " * 2
CODE = "def churn(rows):\n    return [row for row in rows if row['customer_id'] == '" + "9" * 120 + "']  # " + LONG_WORD
COLUMNS = [f"column_{n}_{'wide' * 4}" for n in range(9)]


@dataclass
class World:
    kin_id: int = 0
    session_id: int = 0
    memory_id: int = 0
    workflow_id: int = 0
    node_id: str = ""
    call_id: int = 0
    token_id: int = 0


@dataclass
class PhonePage:
    name: str
    path: Callable[[World], str]
    # Selectors of the controls that must be inside the viewport and clickable (each one's first match).
    controls: tuple[str, ...] = ()
    # A selector to wait for before measuring (content loaded by htmx).
    ready: str = ""
    logged_in: bool = True


SUBMIT = "main form button[type=submit]"
PAGES = [
    PhonePage("login", lambda w: "/login/", ("#id_username", "#id_password", "button[type=submit]"), logged_in=False),
    PhonePage("kins", lambda w: "/kins/?q=Ada", ("main a.button", "#kin-search", "form.search button[type=submit]")),
    PhonePage("kin new", lambda w: "/kins/new/", ("#id_name", SUBMIT)),
    PhonePage("kin detail", lambda w: f"/kins/{w.kin_id}/", ("main a.button", "main .listing a")),
    PhonePage("kin edit", lambda w: f"/kins/{w.kin_id}/edit/", ("#id_name", SUBMIT)),
    PhonePage("session new", lambda w: f"/kins/{w.kin_id}/sessions/new/", ("#id_title", SUBMIT)),
    PhonePage("session", lambda w: f"/sessions/{w.session_id}/",
              ("#chat-content", "#chat-sender", "#chat-form button[type=submit]", ".checkpoint-form button",
               ".session-manage summary", ".tool-calls summary"),
              ready="#prompt-preview .prompt-preview"),
    PhonePage("prompt preview", lambda w: f"/sessions/{w.session_id}/preview/?message={LONG_WORD}",
              ("#preview-message", SUBMIT, ".prompt-section summary")),
    PhonePage("memories", lambda w: f"/kins/{w.kin_id}/memories/",
              ("#memory-search", "#memory-status", "form.memory-filters button[type=submit]",
               "#memory-rows .actions a", ".add-memory summary")),
    PhonePage("memory search", lambda w: f"/kins/{w.kin_id}/memories/?q=churn",
              ("#memory-search", "#memory-rows .actions a")),
    PhonePage("memory detail", lambda w: f"/kins/{w.kin_id}/memories/{w.memory_id}/", ("main p.actions a",)),
    PhonePage("memory add", lambda w: f"/kins/{w.kin_id}/memories/add/", ("#id_content", SUBMIT)),
    PhonePage("memory edit", lambda w: f"/kins/{w.kin_id}/memories/{w.memory_id}/edit/", ("#id_content", SUBMIT)),
    PhonePage("memory delete", lambda w: f"/kins/{w.kin_id}/memories/{w.memory_id}/delete/", (SUBMIT,)),
    PhonePage("experience", lambda w: f"/kins/{w.kin_id}/experience/",
              (".consolidate-form button[type=submit]", "#diff-from", ".diff-form button[type=submit]",
               ".run-detail summary")),
    PhonePage("experience diff", lambda w: f"/kins/{w.kin_id}/experience/?from=1&to=2",
              (".diff-form button[type=submit]",), ready="#experience-diff"),
    PhonePage("experience side-by-side diff",
              lambda w: f"/kins/{w.kin_id}/experience/?from=1&to=2&layout=side-by-side",
              (".diff-form button[type=submit]", "nav.diff-layouts a"), ready="#experience-diff"),
    PhonePage("experience old version", lambda w: f"/kins/{w.kin_id}/experience/?version=1",
              (".markdown-source summary",), ready="#experience-markdown"),
    PhonePage("facts", lambda w: f"/kins/{w.kin_id}/facts/", (".add-fact summary",)),
    PhonePage("workflows", lambda w: "/workflows/", ("main .listing a",)),
    PhonePage("workflow detail", lambda w: f"/workflows/{w.workflow_id}/",
              ("#run-workflow", "#workflow-graph a.wf-node", "#workflow-nodes a")),
    PhonePage("node inspector", lambda w: f"/workflows/{w.workflow_id}/nodes/{w.node_id}/",
              ("#max-chars", ".narrative-form button[type=submit]", ".exports a")),
    PhonePage("tokens", lambda w: "/tokens/", ("#token-name", "form.search button[type=submit]",
                                              "a[href$='/revoke/']")),
    PhonePage("token revoke", lambda w: f"/tokens/{w.token_id}/revoke/", (SUBMIT, "main form a")),
    PhonePage("kin activity", lambda w: f"/kins/{w.kin_id}/activity/",
              ("#activity-status", ".activity-filters button[type=submit]", "#activity-failures",
               ".activity-row a")),
    PhonePage("team activity", lambda w: "/activity/?status=failed",
              ("#activity-status", ".activity-filters button[type=submit]", ".activity-row a")),
    PhonePage("model call", lambda w: f"/model-calls/{w.call_id}/", ("main .breadcrumbs a",)),
]
HEADER_CONTROLS = (".site-nav a", ".logout button")


def seed(team) -> World:
    """One kin, session, memory, experience, workflow and model call, all with wide content."""
    world = World()
    kin = KinFactory(team=team, name=LONG_NAME, role=f"Analyst of {LONG_WORD}", character=LONG_TEXT,
                     expertise=CODE, model="provider/" + "very-long-model-name-" * 8)
    world.kin_id = kin.pk
    KinFactory(team=team, name="Bo")

    chat = SessionFactory(kin=kin, title=f"Churn {LONG_WORD}", description=LONG_TEXT, working_memory=CODE)
    world.session_id = chat.pk
    question = MessageFactory(session=chat, sender="Maria " + LONG_WORD, content=LONG_TEXT)
    turn = TurnFactory(session=chat, user_message=question, status=Turn.Status.DONE)
    ToolCallFactory(session=chat, data={"turn": turn.pk, "tool_calls": [
        {"id": "call_1", "name": "memory_recall_" + "x" * 60,
         "arguments": json.dumps({"query": LONG_WORD, "url": LONG_URL})},
    ]})
    ToolResultFactory(session=chat, content=json.dumps([{"content": LONG_TEXT, "url": LONG_URL}]),
                      data={"turn": turn.pk, "tool_call_id": "call_1"})
    reply = MessageFactory(session=chat, role=Event.Role.ASSISTANT, sender=kin.name, content=CODE,
                           data={"turn": turn.pk})
    Turn.objects.filter(pk=turn.pk).update(reply=reply)
    MessageFactory(session=chat, kind=Event.Kind.COMMAND, role=Event.Role.SYSTEM, content=f"/checkpoint {LONG_WORD}")
    failed_question = MessageFactory(session=chat, content=LONG_URL)
    TurnFactory(session=chat, user_message=failed_question, status=Turn.Status.FAILED,
                error="LLMUnavailable: " + LONG_WORD)
    IntrospectionRunFactory(session=chat, status=IntrospectionRun.Status.FAILED, error=LONG_TEXT, summary=LONG_TEXT)

    memory = MemoryFactory(kin=kin, content=f"churn report: {LONG_TEXT}", subject=LONG_WORD, source_ref=LONG_WORD)
    world.memory_id = memory.pk
    MemoryChangeFactory(memory=memory, action=MemoryChange.Action.UPDATE, reason=LONG_TEXT,
                        before={"content": LONG_URL, "subject": LONG_WORD}, after={"content": memory.content})
    MemoryFactory(kin=kin, content="churn is measured monthly", subject="churn")

    first = "# Master AI Experience\n## 1. User Directives & Preferences\n- " + LONG_TEXT + "\n- " + CODE
    ExperienceVersionFactory(kin=kin, version=1, markdown=first, word_count=len(first.split()))
    second = first.replace("ordinary words", "ordinary and longer words") + "\n- " + LONG_URL
    ExperienceVersionFactory(kin=kin, version=2, markdown=second, word_count=len(second.split()))
    ConsolidationRunFactory(kin=kin, status=ConsolidationRun.Status.FAILED, error=LONG_TEXT,
                            rendered_prompt=CODE, raw_answers=[LONG_TEXT], validation_errors=[LONG_WORD],
                            template_source="kin")
    FactFactory(kin=kin, statement=LONG_TEXT, source_ref="user:" + LONG_WORD)

    records = [{column: f"{LONG_WORD}-{row}" for column in COLUMNS} for row in range(3)]
    nodes = [{"id": "people-" + LONG_WORD[:60], "type": "inline_records", "label": "People " + LONG_WORD,
              "config": {"records": records}}]
    for number in range(1, 5):
        nodes.append({"id": f"step-{number}", "type": "filter", "label": f"Step {number}",
                      "config": {"conditions": [{"field": COLUMNS[0], "op": "ne", "value": "none"}]}})
    nodes.append({"id": "table", "type": "table_output", "label": "Result table", "config": {"columns": COLUMNS}})
    edges = [{"source": source["id"], "target": target["id"]} for source, target in zip(nodes, nodes[1:], strict=False)]
    document = workflow_services.document_clean({"name": "Churn " + LONG_WORD, "description": LONG_TEXT,
                                                 "nodes": nodes, "edges": edges})
    workflow = workflow_services.workflow_create(team=team, document=document)
    workflow_services.workflow_run_start(workflow=workflow)
    WorkflowRunFactory(workflow=workflow, status=WorkflowRun.Status.FAILED, error="Node failed: " + LONG_WORD)
    world.workflow_id = workflow.pk
    world.node_id = "table"

    token, _ = kinsite_services.api_token_issue(team=team, name="bot-" + "x" * 90)
    world.token_id = token.pk
    call = LLMCallFactory(team=team, kin=kin, status=LLMCall.Status.ERROR, error=LONG_TEXT,
                          model="provider/" + "very-long-model-name-" * 8, purpose="kin_turn")
    world.call_id = call.pk
    return world


@pytest.fixture
def phone_page(browser, live_server, transactional_db):
    context = browser.new_context(base_url=live_server.url, viewport={"width": PHONE_WIDTH, "height": 844},
                                  device_scale_factor=3, is_mobile=True, has_touch=True)
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    yield page
    context.close()


def assert_no_horizontal_scroll(page, name: str) -> None:
    widths = page.evaluate("""() => ({
        inner: window.innerWidth,
        html: document.documentElement.scrollWidth,
        body: document.body.scrollWidth,
        wider: [...document.querySelectorAll("body *")]
            .filter(element => element.getBoundingClientRect().right > window.innerWidth + 0.5)
            .slice(0, 5)
            .map(element => element.tagName.toLowerCase() + (element.id ? "#" + element.id : "")
                 + (element.className && typeof element.className === "string" ? "." + element.className : "")),
    })""")
    # A phone widens its layout viewport (innerWidth) to fit content wider than the screen.
    assert widths["inner"] == PHONE_WIDTH, (name, widths)
    assert widths["html"] <= PHONE_WIDTH and widths["body"] <= PHONE_WIDTH, (name, widths)


def assert_reachable(page, selector: str) -> None:
    """The control scrolls into view (its own box scrolling, if it is in one), then lies
    inside the viewport and would receive a click (nothing covers it)."""
    control = page.locator(selector).first
    expect(control).to_be_visible()
    control.evaluate("element => element.scrollIntoView({block: 'center', inline: 'center'})")
    box = control.bounding_box()
    assert box is not None, selector
    assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE_WIDTH + 0.5, (selector, box)
    assert box["y"] >= 0 and box["y"] + box["height"] <= 844 + 0.5, (selector, box)
    control.click(trial=True)


@pytest.mark.parametrize("phone", PAGES, ids=[phone.name for phone in PAGES])
def test_page_fits_a_phone_screen(phone_page, phone: PhonePage):
    page = phone_page
    team = TeamFactory(name="Team " + LONG_WORD)
    user = UserFactory(username="maria.fernandez-" + "x" * 50)
    MembershipFactory(team=team, user=user, role=Membership.Role.OWNER)
    world = seed(team)
    if phone.logged_in:
        log_in(page, username=user.username, password=PASSWORD)

    response = page.goto(phone.path(world))
    assert response is not None and response.ok, (phone.name, response and response.status)
    if phone.ready:
        expect(page.locator(phone.ready)).to_be_attached()
    # Folded content (tool steps, prompt sections, rendered prompts, forms) must fit too.
    page.evaluate("document.querySelectorAll('details').forEach(details => { details.open = true; })")
    SCREENSHOT_DIR.mkdir(exist_ok=True)
    page.screenshot(path=SCREENSHOT_DIR / f"{phone.name.replace(' ', '-')}.png", full_page=True)

    assert_no_horizontal_scroll(page, phone.name)
    for selector in phone.controls + (HEADER_CONTROLS if phone.logged_in else ()):
        assert_reachable(page, selector)
    if phone.logged_in:
        for index in range(page.locator(".site-nav a").count()):
            assert_reachable(page, f".site-nav a >> nth={index}")
