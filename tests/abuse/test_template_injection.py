"""Template injection (SPEC §13: bad template placeholders get a clear 4xx; memory and
message content is untrusted text everywhere). Two sides:

- Templates written by people (prompt templates in the admin and the API's explicit
  consolidation template, a workflow's LLM prompt): Django template tags, attribute and
  index access, format specs and positional fields are refused on save with a message
  saying what is wrong; other template languages' syntax ({{ }}, %(x)s, ${x}) is inert
  text, never evaluated, and no secret or object comes out.
- Text that flows into a template (messages, memories, facts, the kin's identity, session
  notes, previous summaries, workflow records): placeholders inside it are shown literally
  in the prompt, never expanded.

tests/kinsite/test_prompt_templates.py covers the parser itself (every refusal with its
position, rendering that never looks into values); these tests go through the real
entry points."""
import json

import pytest
from django.urls import reverse

from consolidation.models import ConsolidationRun, Fact
from kinsite.llm.providers import provider_override
from kinsite.models import PromptTemplate
from memories.models import Memory
from sessions_app.compaction import build_compaction_messages
from sessions_app.models import Event, Session
from tests.abuse.support import assert_api_error, assert_unchanged, snapshot
from tests.factories import FactFactory, MemoryFactory, MessageFactory, SummaryFactory, UserFactory
from tests.support.scripted_model import ScriptedProvider
from workflows.nodes.llm import render_template

pytestmark = pytest.mark.django_db

SECRET_KEY = "abuse-secret-key-7Hq2"
# Placeholders of every template language in reach, in one text.
INJECTION = ("{kin_name} {{identity}} {0.__class__} {max_words.__class__.__mro__} %(kin_name)s %s "
             "{% debug %} {{ settings.SECRET_KEY }} ${kin_name} {transcript} {events} {pending_facts} "
             "{{_lineage}} {{ note }}")

# Refused in a template body, with (a piece of) the message that says why.
REFUSED = [
    ("{% load static %}", "is not a placeholder"),
    ("{% debug %}", "is not a placeholder"),
    ("{% include 'x.html' %}", "is not a placeholder"),
    ("{0.__class__}", "is not a placeholder"),
    ("{0}", "positional placeholder"),
    ("{kin_name.__class__.__mro__}", "reaches into an attribute or item"),
    ("{kin_name.__init__.__globals__[SECRET_KEY]}", "reaches into an attribute or item"),
    ("{kin_name[0]}", "reaches into an attribute or item"),
    ("{kin_name!r}", "has a conversion"),
    ("{kin_name:{kin_name}}", "has a format spec"),
    ("{settings}", "unknown placeholder {settings}"),
    ("{ kin_name }", "is not a placeholder"),
]
# Accepted and rendered as the literal text on the right (nothing evaluated).
INERT = [
    ("{{ settings.SECRET_KEY }}", "{ settings.SECRET_KEY }"),
    ("{{kin.__class__}}", "{kin.__class__}"),
    ("%(kin_name)s and %s", "%(kin_name)s and %s"),
    ("<%= kin_name %> and $kin_name", "<%= kin_name %> and $kin_name"),
]
KINDS = [PromptTemplate.Kind.CONSOLIDATION, PromptTemplate.Kind.INTROSPECTION, PromptTemplate.Kind.COMPACTION]


@pytest.fixture(autouse=True)
def distinctive_secret_key(settings):
    settings.SECRET_KEY = SECRET_KEY


class Recorder(ScriptedProvider):
    """Answers every call (a short reply; "{}" in JSON mode) and keeps every call's messages."""

    def chat(self, messages, *, json_mode=False, **kwargs):
        self.script = ["{}" if json_mode else "Nothing worth storing."]
        return super().chat(messages, json_mode=json_mode, **kwargs)


@pytest.fixture
def recorder():
    with provider_override(Recorder()) as provider:
        yield provider


def sent_text(recorder) -> str:
    return "\n".join(str(message.get("content")) for call in recorder.calls for message in call.messages)


# --- templates people write: the admin ------------------------------------------------------------


@pytest.fixture
def staff(shared_client):
    shared_client.cookies.clear()
    shared_client.force_login(UserFactory(is_staff=True, is_superuser=True))
    yield shared_client
    shared_client.cookies.clear()


def admin_add(client, team, kind, body):
    return client.post(reverse("admin:kinsite_prompttemplate_add"),
                       {"team": team.pk, "kin": "", "kind": kind, "name": "Probe", "body": f"Hello {body}",
                        "is_active": "on"})


@pytest.mark.parametrize("kind", KINDS)
def test_admin_refuses_template_syntax_and_attribute_access_in_every_kind(staff, team, kind):
    problems = []
    for body, expected in REFUSED:
        page = admin_add(staff, team, kind, body).content.decode()
        if "errorlist" not in page or expected not in page:
            problems.append(body)
    assert not problems, f"not refused with a clear message: {problems}"
    assert not PromptTemplate.objects.exists()


@pytest.mark.parametrize("kind", KINDS)
def test_admin_saves_other_template_syntax_as_inert_text(staff, team, kind):
    for body, literal in INERT:
        response = admin_add(staff, team, kind, body)
        assert response.status_code == 302, body
        template = PromptTemplate.objects.get(name="Probe")
        page = staff.get(reverse("admin:kinsite_prompttemplate_change", args=[template.pk])).content.decode()
        preview = page.split('<pre class="prompt-preview"', 1)[1].split("</pre>", 1)[0]
        assert f"Hello {literal}".replace("<", "&lt;").replace(">", "&gt;") in preview.replace("&#x27;", "'")
        assert SECRET_KEY not in page and "<class" not in preview
        template.delete()


# --- templates people write: the API ----------------------------------------------------------------


def consolidate(api, kin, **body):
    return api.post(f"/api/v1/kins/{kin.pk}/consolidate/", body, format="json")


def test_api_refuses_an_explicit_template_with_template_syntax(api, own):
    before = snapshot()
    for body, expected in REFUSED:
        response = consolidate(api, own.kin, template=f"Hello {body}", prepare=True)
        error = assert_api_error(response, 400)
        assert any(expected in problem for problem in error["details"]["template"]), (body, error)
    assert_unchanged(before)


def test_api_renders_other_template_syntax_as_inert_text(api, own):
    for body, literal in INERT:
        response = consolidate(api, own.kin, template=f"Hello {body} within {{max_words}} words", prepare=True)
        assert response.status_code == 200, response.content
        run = response.json()
        assert run["status"] == ConsolidationRun.Status.PREPARED
        # The kin's document and pending facts follow, in tags: the template has no placeholder for them.
        assert run["rendered_prompt"].split("\n\n<", 1)[0] == f"Hello {literal} within 1200 words"
        assert SECRET_KEY not in response.content.decode()


def test_workflow_llm_prompt_refuses_template_logic_and_renders_the_rest_inert(api, own):
    def post(prompt):
        node = {"id": "ask", "type": "llm_inference", "config": {"prompt": prompt}}
        return api.post("/api/v1/workflows/", {"name": "Probe", "nodes": [node], "edges": []}, format="json")

    before = snapshot()
    for prompt in ["{{ note|upper }}", "{{ note.__class__() }}", "{{ 7*7 }}", "{{ }}", "{{ note", "note }}"]:
        response = post(f"Summarise {prompt}")
        error = assert_api_error(response, 400)
        assert "malformed placeholder" in json.dumps(error), (prompt, error)
    assert_unchanged(before)
    assert post("Summarise {{ note }} {% debug %} %(note)s ${note}").status_code == 201

    # Rendering looks up record fields only, and pastes values without reading them again.
    record = {"note": "{{_lineage}} {{ other }} " + INJECTION, "other": "OTHER", "kin": {"name": "Ada"}}
    rendered = render_template("{{ note }} | {{ settings.SECRET_KEY }} | {{ kin.__class__ }} | {{ kin.name }}",
                               record, lambda: "LINEAGE")
    assert rendered == f"{record['note']} |  |  | Ada"


# --- text that flows into templates ------------------------------------------------------------------


def test_kin_prompt_shows_placeholders_in_stored_text_literally(api, own):
    kin, session = own.kin, own.session
    type(kin).objects.filter(pk=kin.pk).update(character=f"Character: {INJECTION}", expertise=INJECTION)
    Session.objects.filter(pk=session.pk).update(working_memory=f"Notes: {INJECTION}", description=INJECTION)
    MemoryFactory(kin=kin, content=f"Probe memory about invoices: {INJECTION}", category=Memory.Category.FACT)
    MessageFactory(session=session, content=f"Earlier: {INJECTION}", sender=INJECTION[:200])

    response = api.get(f"/api/v1/sessions/{session.pk}/prompt/", {"message": f"invoices {INJECTION}"})

    assert response.status_code == 200
    body = response.json()
    system = body["system_prompt"]
    for text in (f"Character: {INJECTION}", f"Notes: {INJECTION}", f"Probe memory about invoices: {INJECTION}"):
        assert text in system
    sent = json.dumps([item["sent"] for item in body["history"]])
    assert json.dumps(f"Earlier: {INJECTION}")[1:-1] in sent
    assert json.dumps(f"invoices {INJECTION}")[1:-1] in sent
    assert SECRET_KEY not in response.content.decode()


def test_consolidation_prompt_shows_placeholders_in_facts_and_names_literally(api, own):
    type(own.kin).objects.filter(pk=own.kin.pk).update(name="Ada {max_words} {pending_facts}")
    FactFactory(kin=own.kin, statement=f"Probe fact: {INJECTION}", source=Fact.Source.API)

    run = consolidate(api, own.kin, prepare=True).json()

    assert run["status"] == ConsolidationRun.Status.PREPARED
    assert f"Probe fact: {INJECTION}" in run["rendered_prompt"]
    assert "Ada {max_words} {pending_facts}" in run["rendered_prompt"]
    assert SECRET_KEY not in run["rendered_prompt"]


def test_introspection_prompt_shows_placeholders_in_events_and_notes_literally(
    api, own, recorder, django_capture_on_commit_callbacks
):
    session = own.session
    Session.objects.filter(pk=session.pk).update(working_memory=f"Notes: {INJECTION}", introspection_pending=True)
    MessageFactory(session=session, content=f"Probe event: {INJECTION}")

    with django_capture_on_commit_callbacks(execute=True):  # the run is queued after commit
        response = api.post(f"/api/v1/sessions/{session.pk}/checkpoint/")

    assert response.status_code == 202, response.content
    sent = sent_text(recorder)
    assert f"Probe event: {INJECTION}" in sent
    assert f"Notes: {INJECTION}" in sent
    assert SECRET_KEY not in sent


def test_compaction_prompt_shows_placeholders_in_messages_and_the_previous_summary_literally(own):
    session = own.session
    events = [MessageFactory(session=session, content=f"Probe message {n}: {INJECTION}") for n in range(2)]
    previous = SummaryFactory(session=session, content=f"Previous: {INJECTION}", first_event=events[0])

    messages = build_compaction_messages(kin_name="Ada {transcript}", events=list(Event.objects.filter(
        pk__in=[e.pk for e in events]).order_by("id")), previous=previous)

    prompt = messages[-1]["content"]
    assert f"Probe message 1: {INJECTION}" in prompt
    assert f"Previous: {INJECTION}" in prompt
    assert "Ada {transcript}" in prompt
