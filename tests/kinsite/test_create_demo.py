"""create_demo gives every dashboard page something to show (pending facts, two experience
versions, turns, an introspection run, a workflow run), lists those pages with their real
ids, creates nothing new when run again, and the documentation's examples (README.md, docs/) use ids it creates."""
import json
import re
from io import StringIO

import pytest
from django.apps import apps
from django.core.management import call_command

from consolidation.models import ConsolidationRun, ExperienceVersion, Fact
from kinsite.models import ApiToken, Kin
from memories.models import Memory
from sessions_app.models import Event, IntrospectionRun, Session, Turn
from tests.support.docs import documentation_text
from workflows.models import WorkflowRun

pytestmark = pytest.mark.django_db

OUR_APPS = {"kinsite", "sessions_app", "memories", "consolidation", "workflows"}
PAGE_LINE = re.compile(r"^  (\S+)\s+http://127\.0\.0\.1:8000(/\S*)$")


@pytest.fixture
def create_demo(django_capture_on_commit_callbacks):
    """Runs the command, with what it queues after its commit (the workflow run, the
    /checkpoint's introspection: eager tasks) run as a real commit would run it; returns its
    output lines before the JSON one, and the JSON line."""

    def run() -> tuple[list[str], dict]:
        out = StringIO()
        with django_capture_on_commit_callbacks(execute=True):
            call_command("create_demo", stdout=out)
        lines = out.getvalue().strip().splitlines()
        return lines[:-1], json.loads(lines[-1])

    return run


def listed_pages(lines: list[str]) -> dict[str, str]:
    return {match[1]: match[2] for line in lines if (match := PAGE_LINE.match(line))}


def row_counts() -> dict[str, int]:
    return {model._meta.label: model.objects.count() for model in apps.get_models()
            if model._meta.app_label in OUR_APPS}


def test_demo_has_pending_facts_two_experience_versions_turns_and_runs(create_demo):
    _, demo = create_demo()
    kin = Kin.objects.get(pk=demo["kin_id"])
    session = Session.objects.get(pk=demo["session_id"])

    pending = Fact.objects.filter(kin=kin, status=Fact.Status.ACTIVE, is_consolidated=False)
    assert pending.count() == 2
    # Learnings from the demo chat: each names the message of the demo session it came from.
    demo_messages = set(Event.objects.filter(session=session, kind=Event.Kind.MESSAGE).values_list("pk", flat=True))
    assert all(int(fact.source_ref.removeprefix("event:")) in demo_messages
               for fact in Fact.objects.filter(kin=kin))

    runs = list(ConsolidationRun.objects.filter(kin=kin).order_by("id"))
    assert [(run.status, run.trigger) for run in runs] == [("applied", "command")] * 2
    versions = list(ExperienceVersion.objects.filter(kin=kin).order_by("version"))
    assert [(version.version, version.run_id) for version in versions] == [(1, runs[0].pk), (2, runs[1].pk)]
    assert versions[0].markdown != versions[1].markdown
    # The second round's preference replaced the first's, as a consolidation supersedes a fact.
    superseded = Fact.objects.get(kin=kin, status=Fact.Status.SUPERSEDED)
    assert superseded.statement == "Maria wants short answers."
    assert superseded.superseded_by_run_id == runs[1].pk

    assert Memory.objects.filter(kin=kin).count() == 4
    assert list(Turn.objects.filter(session=session).values_list("status", flat=True)) == ["done", "done"]
    assert Event.objects.filter(session=session, kind=Event.Kind.COMMAND, content="/checkpoint").exists()
    # No model on the embedded defaults: the run is recorded as skipped, saying why.
    runs = list(IntrospectionRun.objects.filter(session=session).values_list("trigger", "status", "summary"))
    assert [(trigger, status) for trigger, status, _ in runs] == [("checkpoint", "skipped")]
    assert "LLM_BASE_URL" in runs[0][2]
    assert list(WorkflowRun.objects.filter(workflow_id=demo["workflow_id"]).values_list("status", flat=True)) == [
        "done"]


def test_every_listed_page_answers_and_shows_the_demo_data(client, create_demo):
    lines, demo = create_demo()
    pages = listed_pages(lines)
    kin, session, workflow = demo["kin_id"], demo["session_id"], demo["workflow_id"]
    assert pages == {
        "Kins": "/kins/",
        "Kin": f"/kins/{kin}/",
        "Session": f"/sessions/{session}/",
        "Memories": f"/kins/{kin}/memories/",
        "Experience": f"/kins/{kin}/experience/",
        "Facts": f"/kins/{kin}/facts/",
        "Workflow": f"/workflows/{workflow}/",
        "Activity": f"/kins/{kin}/activity/",
        "Admin": "/admin/",
    }
    assert client.login(username=demo["dashboard_user"], password=demo["dashboard_password"])
    shown = {}
    for label, path in pages.items():
        response = client.get(path)
        assert response.status_code == 200, path
        shown[label] = response.content.decode()

    assert "Ada" in shown["Kins"]
    assert "Welcome chat" in shown["Kin"]
    assert "I run the data team at Northwind" in shown["Session"]
    assert "What did we decide about dedupe?" in shown["Session"]
    assert "Introspection needs a language model" in shown["Session"]  # the /checkpoint's skipped run
    assert "Maria prefers short answers." in shown["Memories"]
    # The current version, and the diff from version 1 to it.
    assert "The quarterly report is built from the cleaned customer CSV exports." in shown["Experience"]
    assert "Changes from version 1 to version 2" in shown["Experience"]
    assert "-- Maria wants short answers." in shown["Experience"]  # the removed line ("-" + "- ...")
    assert "+- Maria wants short answers as bullet points." in shown["Experience"]
    # Both pending facts, marked pending.
    for statement in ("Inactive customers stay out of the quarterly report.", "Maria runs the data team at Northwind."):
        row = re.search(rf"<tr[^>]*>(?:(?!</tr>).)*{re.escape(statement)}(?:(?!</tr>).)*</tr>", shown["Facts"], re.S)
        assert row is not None and "<strong>pending</strong>" in row[0], statement
    assert "Customer export cleanup" in shown["Workflow"]
    for kind in ("Turn", "Introspection", "Consolidation", "Model call"):
        assert re.search(rf">\s*{kind}\s*<", shown["Activity"]), kind
    assert "Facts and experience" in shown["Admin"]


def test_second_run_reuses_everything_and_prints_the_same_lines(create_demo):
    first_lines, first = create_demo()
    counts = row_counts()
    second_lines, second = create_demo()

    assert second_lines == first_lines
    assert {**second, "token": None} == {**first, "token": None}
    assert second["token"] != first["token"]  # a fresh token each run, for scripts
    assert row_counts() == {**counts, "kinsite.ApiToken": counts["kinsite.ApiToken"] + 1}
    assert ApiToken.objects.filter(name="create_demo").count() == 2
    # Only the token printed last still works: scripts/serve runs the command at every start.
    live = ApiToken.objects.filter(name="create_demo", revoked_at__isnull=True)
    assert [token.prefix for token in live] == [second["token"][:10]]


# Sequences start again at 1, as on a fresh database (PostgreSQL's do not roll back with a test).
@pytest.mark.django_db(transaction=True, reset_sequences=True)
def test_readme_examples_use_ids_the_demo_creates(create_demo):
    _, demo = create_demo()
    readme = documentation_text()
    # The JSON create_demo prints, as the README's "The two commands" and docs/getting-started.md show it.
    blocks = re.findall(r'```json\n(\{"token".*?\})\n```', readme, re.S)
    assert blocks
    for block in blocks:
        shown = json.loads(block.replace("\n", " "))
        assert {key: shown[key] for key in ("kin_id", "session_id", "workflow_id")} == {
            key: demo[key] for key in ("kin_id", "session_id", "workflow_id")}
    # Every id in a curl example's path is a row the demo made, in the demo's team.
    exists = {
        "kins": lambda pk: Kin.objects.filter(pk=pk, team__slug=demo["team"]).exists(),
        "sessions": lambda pk: Session.objects.filter(pk=pk, kin__team__slug=demo["team"]).exists(),
        "turns": lambda pk: Turn.objects.filter(pk=pk, session__kin__team__slug=demo["team"]).exists(),
        "memories": lambda pk: Memory.objects.filter(pk=pk, team__slug=demo["team"]).exists(),
        "workflows": lambda pk: pk == demo["workflow_id"],
    }
    paths = re.findall(r"\$API/([a-z_-]+)/(\d+)/", readme)
    assert paths
    missing = sorted({f"{resource}/{pk}/" for resource, pk in paths if not exists[resource](int(pk))})
    assert missing == []
    versions = {int(number) for number in re.findall(r"\$API/kins/\d+/experience/\?version=(\d+)", readme)}
    assert versions <= set(ExperienceVersion.objects.filter(kin_id=demo["kin_id"]).values_list("version", flat=True))
