"""What the abuse tests share: the API's operations read from its OpenAPI schema, the
dashboard's routes read from the URLconf (so a new endpoint is swept without editing
these tests), a seeded team with one object of each kind an id can name, and a
snapshot of every row to prove that refused requests changed nothing."""
from __future__ import annotations

import functools
import inspect
import json
import re
import sys
from dataclasses import dataclass, field

from django import forms
from django.apps import apps
from django.db import connection
from django.urls import URLPattern, URLResolver, get_resolver
from drf_spectacular.generators import SchemaGenerator

from consolidation.models import Fact
from erasure.models import Erasure
from kinsite.models import ApiToken, LLMCall
from memories.models import Memory, MemoryChange
from sessions_app.models import Turn
from tests.factories import (
    ConsolidationRunFactory,
    EdgeFactory,
    ExperienceVersionFactory,
    FactFactory,
    KinFactory,
    LLMCallFactory,
    MemoryChangeFactory,
    MemoryFactory,
    MessageFactory,
    NodeFactory,
    SessionFactory,
    TurnFactory,
    WorkflowFactory,
)

API_PREFIX = "/api/v1/"
PROJECT_APPS = ("kinsite", "sessions_app", "memories", "consolidation", "workflows", "erasure", "auth")


# --- the API, from its schema -------------------------------------------------------------------


@functools.cache
def schema_and_registry():
    """The OpenAPI document /api/v1/schema/ serves, and drf-spectacular's component registry
    (which knows the serializer behind each request body)."""
    generator = SchemaGenerator()
    schema = generator.get_schema(request=None, public=True)
    return schema, generator.registry


def api_schema() -> dict:
    return schema_and_registry()[0]


def resolve(fragment: dict) -> dict:
    """A schema fragment with its $ref (or single-item allOf, as enums are written) followed."""
    if "$ref" in fragment:
        name = fragment["$ref"].rsplit("/", 1)[-1]
        return resolve(api_schema()["components"]["schemas"][name])
    if "allOf" in fragment and len(fragment["allOf"]) == 1:
        return {**resolve(fragment["allOf"][0]), **{k: v for k, v in fragment.items() if k != "allOf"}}
    return fragment


def component_name(fragment: dict) -> str | None:
    return fragment["$ref"].rsplit("/", 1)[-1] if "$ref" in fragment else None


@dataclass(frozen=True)
class Operation:
    method: str
    path: str  # as in the schema: "/api/v1/kins/{kin_id}/memories/"
    path_params: tuple[str, ...]
    query_params: tuple[str, ...]
    body_ref: str | None  # the request body's component name
    text_path_params: tuple[str, ...] = ()  # the path parameters that are strings, not integers

    def __str__(self):
        return f"{self.method} {self.path}"

    @property
    def body_schema(self) -> dict | None:
        return resolve({"$ref": f"#/components/schemas/{self.body_ref}"}) if self.body_ref else None

    @property
    def is_write(self) -> bool:
        return self.method not in ("GET", "HEAD", "OPTIONS")

    def url(self, ids: dict[str, object], query: str = "", *, raw: dict[str, str] | None = None) -> str:
        """The path with each parameter filled from `ids` (by what it names), or from `raw`."""
        raw = raw or {}
        url = self.path
        for name in self.path_params:
            url = url.replace("{" + name + "}", raw[name] if name in raw else str(path_value(self, name, ids)))
        return f"{url}?{query}" if query else url


def api_operations() -> list[Operation]:
    operations = []
    for path, item in api_schema()["paths"].items():
        for method, operation in item.items():
            parameters = operation.get("parameters", [])
            body = operation.get("requestBody")
            body_ref = None
            if body:
                [media] = body["content"].values()
                body_ref = component_name(media["schema"])
                assert body_ref, f"{method.upper()} {path}: the request body is not a named component"
            operations.append(Operation(
                method=method.upper(),
                path=path,
                path_params=tuple(p["name"] for p in parameters if p["in"] == "path"),
                query_params=tuple(p["name"] for p in parameters if p["in"] == "query"),
                body_ref=body_ref,
                text_path_params=tuple(p["name"] for p in parameters
                                       if p["in"] == "path" and p["schema"].get("type") == "string"),
            ))
    return operations


def body_operations() -> list[Operation]:
    return [operation for operation in api_operations() if operation.body_ref]


# What a path parameter names: "<kind>_id", or "id" after the collection it is in.
COLLECTION_KINDS = {"kins": "kin", "sessions": "session", "memories": "memory", "turns": "turn",
                    "workflows": "workflow", "nodes": "node", "tokens": "token",
                    "erasures": "erasure"}
ID_KINDS = {"kin", "session", "memory", "turn", "workflow", "node", "token", "model_call", "erasure"}


def param_kind(path: str, name: str) -> str:
    if name == "id":
        collection = path.split("{id}", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        kind = COLLECTION_KINDS.get(collection, "")
    else:
        kind = {"client_id": "node"}.get(name, name.removesuffix("_id"))
    assert kind in ID_KINDS, (
        f"{path}: the abuse tests do not know what the path parameter {name!r} names; teach "
        "tests/abuse/support.py (param_kind and Seeded) about it"
    )
    return kind


def path_value(operation_or_path, name: str, ids: dict[str, object]):
    path = operation_or_path.path if isinstance(operation_or_path, Operation) else operation_or_path
    return ids[param_kind(path, name)]


# --- bodies from the schema -------------------------------------------------------------------

RAW = "@@raw@@"  # stands for a raw JSON fragment json.dumps cannot write (1e400, invalid bytes)


def dumps(body, raw: bytes = b"") -> bytes:
    return json.dumps(body).encode().replace(f'"{RAW}"'.encode(), raw)


def example(fragment: dict):
    """A valid value for a schema fragment: required properties only, one item for lists of objects."""
    schema = resolve(fragment)
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if "properties" in schema:
        return {name: example(prop) for name, prop in schema["properties"].items()
                if name in schema.get("required", [])}
    if kind == "array":
        items = schema.get("items", {})
        return [example(items)] if "$ref" in items else []
    if kind == "string":
        return "2026-03-02T09:00:00Z" if schema.get("format") == "date-time" else "Abuse test"
    if kind == "integer":
        return schema.get("minimum", 1)
    if kind == "boolean":
        return False
    return {}


def base_body(operation: Operation) -> dict:
    """A body the endpoint accepts: the required fields, or the first string (else boolean)
    field when none is required (an empty PATCH may be refused for being empty)."""
    schema = operation.body_schema
    body = example(schema)
    if not body:
        kinds = {name: resolve(prop).get("type") for name, prop in schema["properties"].items()}
        name = next((n for n, kind in kinds.items() if kind == "string"), None) or next(
            n for n, kind in kinds.items() if kind == "boolean")
        body[name] = example(schema["properties"][name])
    return body


def request_serializer(operation: Operation):
    """The serializer behind the operation's request body (drf-spectacular's registry knows it)."""
    _, registry = schema_and_registry()
    for (name, _kind), component in registry._components.items():
        if name == operation.body_ref:
            return component.object
    raise AssertionError(f"{operation}: no component {operation.body_ref}")


# --- the dashboard, from the URLconf -----------------------------------------------------------


@dataclass(frozen=True)
class Route:
    name: str  # "dashboard:memory_detail"
    route: str  # "kins/<int:kin_id>/memories/<int:memory_id>/"
    kwargs: tuple[str, ...]
    callback: object = field(compare=False, repr=False)

    def __str__(self):
        return self.name


def _walk(patterns, prefix="", namespace=""):
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            inner = f"{namespace}{pattern.namespace}:" if pattern.namespace else namespace
            yield from _walk(pattern.url_patterns, prefix + str(pattern.pattern), inner)
        elif isinstance(pattern, URLPattern):
            yield prefix + str(pattern.pattern), namespace + (pattern.name or ""), pattern


_KWARG = re.compile(r"<(?:\w+:)?(\w+)>")


def dashboard_routes() -> list[Route]:
    routes = []
    for route, name, pattern in _walk(get_resolver().url_patterns):
        if not name.startswith("dashboard:"):
            continue
        routes.append(Route(name=name, route=route, kwargs=tuple(_KWARG.findall(route)), callback=pattern.callback))
    return routes


def dashboard_kwarg_value(route: Route, name: str, ids: dict[str, object]):
    if name == "fmt":
        return "json"  # a lineage export format; the ids around it are what is tested
    return ids[param_kind(route.route, name)]


def dashboard_modules():
    return sorted({sys.modules[route.callback.__module__] for route in dashboard_routes()}, key=lambda m: m.__name__)


_GET_OR_POST_NAME = re.compile(r"""request\.(?:GET|POST)\.get\(\s*["'](\w+)["']""")


def _form_sample(form_field) -> str:
    if isinstance(form_field, forms.BooleanField):
        return "on"
    if isinstance(form_field, forms.ChoiceField):
        # A model choice field lists its rows: a database without any (this test alone) gives an id.
        return str(next((value for value, _ in form_field.choices if value != ""), 1))
    if isinstance(form_field, forms.IntegerField):
        return str(form_field.min_value or 1)
    return "Probe text"


def dashboard_query_names(route: Route) -> list[str]:
    """The names the module of the route's view reads from request.GET."""
    source = inspect.getsource(sys.modules[route.callback.__module__])
    return sorted(set(re.findall(r"""request\.GET\.get\(\s*["'](\w+)["']""", source)))


@functools.cache
def dashboard_inputs() -> dict[str, str]:
    """Every input the dashboard's views read, with a valid-looking value: the fields of
    the forms their modules define and the names they read from request.GET / request.POST
    (so a new form field or filter is swept without editing the tests)."""
    inputs = {"page": "1"}
    for module in dashboard_modules():
        for name in _GET_OR_POST_NAME.findall(inspect.getsource(module)):
            inputs.setdefault(name, "1")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, forms.BaseForm) and value.__module__ == module.__name__:
                for name, form_field in value.base_fields.items():
                    inputs[name] = _form_sample(form_field)
    return inputs


# --- seeded rows --------------------------------------------------------------------------------


@dataclass
class Seeded:
    """One team's objects that ids can name, plus the raw API token of the team."""

    kin: object
    session: object
    memory: object
    turn: object
    workflow: object
    node: object
    token: object
    raw_token: str
    secret: str  # a word only this team's rows contain
    model_call: object
    erasure: object

    @property
    def ids(self) -> dict[str, object]:
        return {"kin": self.kin.pk, "session": self.session.pk, "memory": self.memory.pk, "turn": self.turn.pk,
                "workflow": self.workflow.pk, "node": self.node.client_id, "token": self.token.pk,
                "model_call": self.model_call.pk, "erasure": self.erasure.pk}


def seed_team(team, *, secret: str, user=None) -> Seeded:
    """A kin with a session (a message and its turn), a memory with its change row, a fact,
    a consolidation run with an experience document, a two-node workflow, a model call and a token."""
    from kinsite.services import api_token_issue

    kin = KinFactory(team=team, name=f"Kin {secret}", character=f"Knows {secret}.")
    session = SessionFactory(kin=kin, title=f"Session {secret}")
    message = MessageFactory(session=session, content=f"The {secret} plan is due in May.", external_id=f"{secret}-1")
    turn = TurnFactory(session=session, user_message=message, status=Turn.Status.DONE)
    memory = MemoryFactory(
        team=team, kin=kin, content=f"The {secret} plan is due in May.", category=Memory.Category.FACT
    )
    MemoryChangeFactory(memory=memory, action=MemoryChange.Action.ADD, after={"content": memory.content}, actor="test")
    FactFactory(kin=kin, statement=f"The {secret} fact.", source=Fact.Source.API)
    run = ConsolidationRunFactory(kin=kin, trigger="api", status="applied", summary_of_changes=secret)
    ExperienceVersionFactory(kin=kin, version=1, markdown=f"# Master AI Experience\n- {secret}", run=run)
    ConsolidationRunFactory(kin=kin, trigger="api", status="failed", error=f"The {secret} model failed.")
    workflow = WorkflowFactory(team=team, name=f"Workflow {secret}")
    # Client ids differ between teams, so "another team's node id" never names one of ours.
    node = NodeFactory(workflow=workflow, client_id=f"records-{secret}", type="inline_records",
                       label=f"Records {secret}", config={"records": [{"note": secret}]})
    table = NodeFactory(workflow=workflow, client_id=f"table-{secret}", type="table_output", label="Table", config={})
    EdgeFactory(workflow=workflow, source=node, target=table)
    model_call = LLMCallFactory(team=team, kin=kin, status=LLMCall.Status.ERROR, error=f"The {secret} call failed.")
    token, raw = api_token_issue(team=team, name=f"token {secret}", user=user)
    # Two receipts, so a list of them has more than one page at page size 1.
    erasure = Erasure.objects.create(team=team, sender=f"Person {secret}", actor=f"token:{token.prefix}")
    Erasure.objects.create(team=team, subject=f"Other {secret}", actor=f"token:{token.prefix}")
    return Seeded(kin=kin, session=session, memory=memory, turn=turn, workflow=workflow, node=node, token=token,
                  raw_token=raw, secret=secret, model_call=model_call, erasure=erasure)


# --- "nothing changed" --------------------------------------------------------------------------

# Written by reads, not by the writes under test.
VOLATILE_FIELDS = {(ApiToken, "last_used_at"), (Memory, "retrieval_count"), (Memory, "last_retrieved_at")}


def project_models():
    return [model for label in PROJECT_APPS for model in apps.get_app_config(label).get_models()]


@functools.cache
def _snapshot_query() -> tuple[list[str], str]:
    """One SELECT with a column per table: the table's rows as text, in primary-key order.
    One round trip, since it runs after every request of the sweeps."""
    quote = connection.ops.quote_name
    labels, columns = [], []
    for model in project_models():
        names = [quote(f.column) for f in model._meta.concrete_fields if (model, f.name) not in VOLATILE_FIELDS]
        table, pk = quote(model._meta.db_table), quote(model._meta.pk.column)
        if connection.vendor == "postgresql":
            rows = f"SELECT string_agg(ROW({', '.join(names)})::text, '|' ORDER BY {pk}) FROM {table}"
        else:
            row = " || ',' || ".join(f"quote({name})" for name in names)
            rows = f"SELECT group_concat(r, '|') FROM (SELECT {row} AS r FROM {table} ORDER BY {pk})"
        labels.append(model._meta.label)
        columns.append(f"({rows})")
    return labels, "SELECT " + ", ".join(columns)


def snapshot() -> dict[str, str | None]:
    """Every row of every project table (a few rows in these tests) as text, minus the
    fields reads write."""
    labels, sql = _snapshot_query()
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return dict(zip(labels, cursor.fetchone(), strict=True))


def assert_unchanged(before: dict, context: str = "", *, ignore: tuple[str, ...] = ()) -> None:
    after = snapshot()
    changed = [label for label in before if before[label] != after[label] and label not in ignore]
    assert not changed, f"{context}: rows changed in {changed}"


# --- the error shape (SPEC §11) ---------------------------------------------------------------


def assert_api_error(response, status: int | set[int], code: str | None = None) -> dict:
    """The response has `status` (or one of them) and the §11 error shape; returns the error."""
    allowed = {status} if isinstance(status, int) else status
    assert response.status_code in allowed, (response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"code", "message", "details"}, error
    assert isinstance(error["code"], str) and error["code"], error
    assert isinstance(error["message"], str) and error["message"].strip(), error
    assert isinstance(error["details"], (dict, list)), error
    if code is not None:
        assert error["code"] == code, error
    return error
