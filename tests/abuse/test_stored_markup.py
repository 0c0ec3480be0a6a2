"""Stored text is shown as text (SPEC §13: dashboard output is escaped; memory and message
content is untrusted everywhere). Every free-text column of every table, and the text
inside JSON the pages show (tool calls, records, audit lists), holds a script, an event
handler or Django template syntax (tests/abuse/markup.py); then every dashboard page
(from the URLconf; full page, htmx partial, and with every query input set to the payload
too) and every admin list and change page is read as a signed-in user. Nothing may come
out as markup or as a template's output, and each text is shown, escaped, where the
page is meant to show it. The browser test runs the main pages in Chromium."""
import pytest
from django.contrib import admin
from django.urls import reverse
from django.utils.html import escape

from kinsite.prompt_safety import escape_tags
from tests.abuse.markup import FORBIDDEN, HTML_PAYLOAD, PROBE, TEMPLATE_PAYLOAD, build_markup_world
from tests.abuse.support import dashboard_inputs, dashboard_kwarg_value, dashboard_routes
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

# Where each stored text is meant to be read: (table or JSON field, name) → dashboard page.
SHOWN_ON = {
    ("kinsite.Team", "name"): "dashboard:kins",
    ("kinsite.ApiToken", "name"): "dashboard:tokens",
    ("kinsite.Kin", "name"): "dashboard:kins",
    ("kinsite.Kin", "role"): "dashboard:kins",
    ("kinsite.Kin", "character"): "dashboard:kin_detail",
    ("kinsite.Kin", "expertise"): "dashboard:kin_detail",
    ("kinsite.Kin", "model"): "dashboard:kin_detail",
    ("kinsite.Kin", "spawn_reason"): "dashboard:kin_detail",
    ("sessions_app.Session", "title"): "dashboard:kin_detail",
    ("sessions_app.Session", "description"): "dashboard:session_detail",
    ("sessions_app.Session", "working_memory"): "dashboard:session_detail",
    ("sessions_app.Event", "content"): "dashboard:session_detail",
    ("sessions_app.Event", "sender"): "dashboard:session_detail",
    ("Event.data", "tool name"): "dashboard:session_detail",
    ("Event.data", "tool arguments"): "dashboard:session_detail",
    ("sessions_app.Turn", "error"): "dashboard:session_detail",
    ("sessions_app.IntrospectionRun", "summary"): "dashboard:session_detail",
    ("sessions_app.IntrospectionRun", "error"): "dashboard:session_detail",
    ("IntrospectionRun.tool_calls", "name"): "dashboard:session_detail",
    ("IntrospectionRun.tool_calls", "arguments"): "dashboard:session_detail",
    ("IntrospectionRun.tool_calls", "result"): "dashboard:session_detail",
    ("IntrospectionRun.tool_calls", "applied"): "dashboard:session_detail",
    ("IntrospectionRun.memories_touched", "action"): "dashboard:session_detail",
    ("sessions_app.Summary", "content"): "dashboard:session_prompt_preview",
    ("memories.Memory", "content"): "dashboard:memory_list",
    ("memories.Memory", "subject"): "dashboard:memory_detail",
    ("memories.Memory", "source_ref"): "dashboard:memory_detail",
    ("memories.MemoryChange", "actor"): "dashboard:memory_detail",
    ("memories.MemoryChange", "reason"): "dashboard:memory_detail",
    ("MemoryChange.after", "content"): "dashboard:memory_detail",
    ("consolidation.Fact", "statement"): "dashboard:fact_list",
    ("consolidation.ExperienceVersion", "markdown"): "dashboard:experience",
    ("consolidation.ConsolidationRun", "summary_of_changes"): "dashboard:experience",
    ("consolidation.ConsolidationRun", "error"): "dashboard:experience",
    ("consolidation.ConsolidationRun", "rendered_prompt"): "dashboard:experience",
    ("ConsolidationRun.raw_answers", "item"): "dashboard:experience",
    ("ConsolidationRun.validation_errors", "item"): "dashboard:experience",
    ("ConsolidationRun.processed_fact_ids", "item"): "dashboard:experience",
    ("workflows.Workflow", "name"): "dashboard:workflows",
    ("workflows.Workflow", "description"): "dashboard:workflows",
    ("workflows.Node", "label"): "dashboard:workflow_detail",
    ("workflows.Node", "type"): "dashboard:workflow_detail",
    ("workflows.Node", "client_id"): "dashboard:workflow_detail",
    ("workflows.Node", "error"): "dashboard:workflow_node",
    ("Node.config", "records"): "dashboard:workflow_node",
    ("NodeResult.records", "value"): "dashboard:workflow_node",
    ("NodeResult.records", "key"): "dashboard:workflow_node",
    ("workflows.WorkflowRun", "error"): "dashboard:workflow_detail",
    ("kinsite.LLMCall", "error"): "dashboard:model_call_detail",
    ("kinsite.LLMCall", "model"): "dashboard:activity",
}
# Downloads, not pages: JSON with Content-Disposition: attachment (never rendered as HTML).
DOWNLOADS = {"dashboard:workflow_node_export", "dashboard:kin_export"}


@pytest.fixture(params=[HTML_PAYLOAD, TEMPLATE_PAYLOAD], ids=["html", "template"])
def world(request, team, user):
    return build_markup_world(team=team, user=user, payload=request.param)


@pytest.fixture
def member(shared_client, user):
    shared_client.cookies.clear()
    shared_client.force_login(user)
    yield shared_client
    shared_client.cookies.clear()


def url_of(route, world) -> str:
    return reverse(route.name, kwargs={name: dashboard_kwarg_value(route, name, world.ids) for name in route.kwargs})


def problems_in(body: str, world) -> list[str]:
    found = [bad for bad in FORBIDDEN[world.payload] if bad in body]
    if world.user.password in body:
        found.append("the user's password hash")
    return found


def read_pages(client, world) -> dict[str, str]:
    """Every dashboard page a GET reaches, as the full page, the htmx partial and with every
    query input the views read set to the payload; name → body of the plain page."""
    pages, problems = {}, []
    reflected = {name: world.payload for name in dashboard_inputs()}
    for route in dashboard_routes():
        url = url_of(route, world)
        for variant, response in [
            ("page", client.get(url)),
            ("htmx", client.get(url, headers={"HX-Request": "true"})),
            ("inputs", client.get(url, reflected)),
        ]:
            if response.status_code in (302, 405):
                continue  # a redirect to another page read here, or a POST-only route
            if route.name in DOWNLOADS:
                assert response["Content-Type"].startswith("application/json")
                assert response["Content-Disposition"].startswith("attachment")
                continue
            # With the payload as input, a page may refuse it (?version=<script> is no version).
            allowed = (200,) if variant != "inputs" else (200, 400, 404)
            assert response.status_code in allowed, (url, variant, response.status_code)
            body = response.content.decode()
            problems += [f"{route} ({variant}): {problem}" for problem in problems_in(body, world)]
            if variant == "page":
                pages[route.name] = body
    assert not problems, problems
    return pages


# Shown inside the prompt preview, where the prompt itself has neutralised its tags first
# ("<script" → "&lt;script", kinsite.prompt_safety) before the page escapes it.
SHOWN_AS_PROMPT_TEXT = {("sessions_app.Summary", "content")}


def _shown(world, marker: str, where: tuple[str, str]) -> str:
    if where in SHOWN_AS_PROMPT_TEXT:
        return escape(f"{marker} {escape_tags(PROBE[world.payload])}")
    return world.shown(marker)


def test_stored_text_is_shown_escaped_and_never_as_markup(member, world):
    pages = read_pages(member, world)  # asserts that no page has the payload as markup
    assert len(pages) >= 15, sorted(pages)
    missing = []
    for where, page in SHOWN_ON.items():
        markers = [marker for marker, location in world.markers.items() if location == where]
        assert markers, f"{where} holds no marked text: markup.py no longer writes it"
        if not any(_shown(world, marker, where) in pages[page] for marker in markers):
            missing.append(f"{where} on {page}")
    assert not missing, "not shown (escaped) where expected: " + ", ".join(missing)


def test_search_results_and_the_run_notice_escape_too(member, world):
    marker = world.markers_of("memories.Memory", "content")[0]
    responses = {
        "memory search": member.get(reverse("dashboard:memory_list", args=[world.kin.pk]), {"q": marker}),
        "memory search (htmx)": member.get(reverse("dashboard:memory_list", args=[world.kin.pk]), {"q": marker},
                                           headers={"HX-Request": "true"}),
        "consolidation run notice": member.get(reverse("dashboard:experience", args=[world.kin.pk]),
                                               {"run": world.run.pk}),
        "experience, side-by-side diff": member.get(reverse("dashboard:experience", args=[world.kin.pk]),
                                                    {"layout": "side-by-side", "from": 1, "to": 2}),
        "prompt preview of a typed message": member.get(
            reverse("dashboard:session_prompt_preview", args=[world.session.pk]),
            {"message": world.payload, "sender": world.payload}),
    }
    for name, response in responses.items():
        assert response.status_code == 200, name
        body = response.content.decode()
        assert problems_in(body, world) == [], name
    assert world.shown(marker) in responses["memory search"].content.decode()
    assert world.shown(marker) in responses["memory search (htmx)"].content.decode()
    error_marker = world.markers_of("consolidation.ConsolidationRun", "error")[0]
    assert world.shown(error_marker) in responses["consolidation run notice"].content.decode()
    assert escape(world.payload) in responses["prompt preview of a typed message"].content.decode()
    # The experience document, rendered from Markdown and in both columns of the side-by-side diff.
    experience = responses["experience, side-by-side diff"].content.decode()
    rendered = experience.split('id="experience-markdown">')[1].split("</div>")[0]
    assert escape(PROBE[world.payload]) in rendered
    side_by_side = experience.split('<table class="experience-side-by-side" id="experience-diff">')[1]
    before, after = (side_by_side.split(f'<td class="diff-{kind}">')[1].split("</td>")[0] for kind in ("del", "add"))
    assert escape(PROBE[world.payload]) in before and escape(PROBE[world.payload]) in after


# --- Django admin ---------------------------------------------------------------------------------


@pytest.fixture
def staff(shared_client, db):
    shared_client.cookies.clear()
    shared_client.force_login(UserFactory(is_staff=True, is_superuser=True))
    yield shared_client
    shared_client.cookies.clear()


def test_admin_lists_and_change_pages_escape_every_stored_text(staff, world):
    problems, unshown = [], []
    assert len(admin.site._registry) >= 20
    for model in admin.site._registry:
        app_label, model_name = model._meta.app_label, model._meta.model_name
        label = model._meta.label
        pages = {"list": staff.get(reverse(f"admin:{app_label}_{model_name}_changelist"))}
        row = model.objects.order_by("pk").first()
        if row is not None:
            pages["change"] = staff.get(reverse(f"admin:{app_label}_{model_name}_change", args=[row.pk]))
        for name, response in pages.items():
            assert response.status_code == 200, (label, name, response.status_code)
            problems += [f"{label} {name}: {problem}" for problem in problems_in(response.content.decode(), world)]
        markers = [m for m, (where, _) in world.markers.items() if where == label]
        change = pages.get("change")
        if markers and change is not None and not any(world.shown(m) in change.content.decode() for m in markers):
            unshown.append(label)
    assert not problems, problems
    # Each table's change page shows at least one of its texts, escaped.
    assert not unshown, unshown
