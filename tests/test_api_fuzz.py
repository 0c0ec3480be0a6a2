"""Schemathesis against the live OpenAPI schema (SPEC §11, §13): every operation, fuzzed
with a real bearer token of a seeded team, must never answer 500, and every answer must
match the schema (documented status code, content type and body).

The app runs in-process through WSGI, inside the test's transaction; each generated
request runs in a savepoint that is rolled back, so a DELETE or a fuzzed PATCH cannot
take the seeded rows away from the examples after it. The LLM is a scripted provider
that always answers, so chat turns and consolidations never leave the process."""
import zlib

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections, transaction
from hypothesis import HealthCheck, Phase, settings as hypothesis_settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from consolidation.models import Fact
from kinsite.llm.providers import provider_override
from kinsite.services import api_token_issue
from memories.models import MemoryChange
from sessions_app.models import Turn
from tests.factories import (
    ConsolidationRunFactory,
    EdgeFactory,
    ExperienceVersionFactory,
    FactFactory,
    KinFactory,
    MemoryChangeFactory,
    MemoryFactory,
    MessageFactory,
    NodeFactory,
    SessionFactory,
    TurnFactory,
    WorkflowFactory,
)
from tests.support.scripted_model import ScriptedProvider

# Per operation, for the random (fuzzing) phase; schemathesis's coverage phase adds its boundary and
# invalid-input cases on top. derandomize makes every run the same (~1 min per database pass).
MAX_EXAMPLES = 25
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]

_django_app = get_wsgi_application()


def wsgi_app(environ, start_response):
    """Django's WSGI app, minus the end-of-request connection close: the request shares the
    test's connection and its open transaction (as django.test.Client does)."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        response = _django_app(environ, start_response)
        body = b"".join(response)
        response.close()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)
    return [body]


schema = schemathesis.openapi.from_wsgi("/api/v1/schema/", wsgi_app)


class AlwaysAnswers(ScriptedProvider):
    """A scripted model with an endless script: a short reply, or an empty JSON object in JSON mode."""

    def chat(self, messages, *, json_mode=False, **kwargs):
        self.script = ["{}" if json_mode else "Noted."]
        self.calls.clear()
        return super().chat(messages, json_mode=json_mode, **kwargs)


@pytest.fixture
def seeded(team, user):
    """A kin with a session, messages, a turn, memories, facts, a consolidation with an
    experience document, and a two-node workflow; returns the ids the paths take."""
    kin = KinFactory(team=team, name="Fuzz kin")
    session = SessionFactory(kin=kin, title="Fuzz session")
    first = MessageFactory(session=session, content="We ship the beta in May.", external_id="fuzz-1")
    MessageFactory(session=session, content="Maria owns the release notes.", external_id="fuzz-2")
    turn = TurnFactory(session=session, user_message=first, status=Turn.Status.DONE)
    memory = MemoryFactory(team=team, kin=kin, content="The beta ships in May.", category="fact")
    MemoryChangeFactory(memory=memory, action=MemoryChange.Action.ADD, after={"content": memory.content}, actor="test")
    MemoryFactory(team=team, kin=None, content="The team works in English.", category="preference")
    FactFactory(kin=kin, statement="Maria owns the release notes.", source=Fact.Source.API)
    run = ConsolidationRunFactory(kin=kin, trigger="api", status="applied", summary_of_changes="First.")
    ExperienceVersionFactory(kin=kin, version=1, markdown="# Experience\n\n## Release\n- Beta in May.", run=run)
    workflow = WorkflowFactory(team=team, name="Fuzz workflow")
    source = NodeFactory(workflow=workflow, client_id="records", type="inline_records", label="Records",
                         config={"records": [{"note": "beta"}]})
    table = NodeFactory(workflow=workflow, client_id="table", type="table_output", label="Table", config={})
    EdgeFactory(workflow=workflow, source=source, target=table)
    _, raw = api_token_issue(team=team, name="fuzz", user=user)
    return {
        "token": raw,
        "ids": {"kin_id": kin.pk, "id": None, "session_id": session.pk, "turn_id": turn.pk,
                "memory_id": memory.pk, "workflow_id": workflow.pk, "node_id": "records"},
    }


def _point_at_seeded_rows(case, ids):
    """Most examples address the seeded rows (so the operation does real work); the rest keep
    their generated ids, which must answer a clean 404."""
    for name, value in list((case.path_parameters or {}).items()):
        if name == "id":
            seeded = ids["session_id"] if case.path.startswith("/api/v1/sessions/") else ids["kin_id"]
        else:
            seeded = ids.get(name)
        if seeded is not None and zlib.crc32(str(value).encode()) % 5 != 0:
            case.path_parameters[name] = seeded


@pytest.mark.django_db
@schema.parametrize()
@hypothesis_settings(
    max_examples=MAX_EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: the failure report is enough
    suppress_health_check=list(HealthCheck),
)
def test_api_conforms_to_its_schema(case, seeded, settings):
    settings.API_THROTTLE_RATES = {}  # 429 is documented; the fuzzer should reach the views
    _point_at_seeded_rows(case, seeded["ids"])
    # Set on the case: the generated (empty) bearer credentials would win over call headers.
    case.headers = {**(case.headers or {}), "Authorization": f"Bearer {seeded['token']}"}
    with provider_override(AlwaysAnswers()), transaction.atomic():
        case.call_and_validate(checks=CHECKS)
        transaction.set_rollback(True)
