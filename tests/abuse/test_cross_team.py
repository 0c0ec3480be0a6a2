"""Other teams' ids, everywhere an id goes (SPEC §3: another team's object answers 404,
never 403 and never its data): every API path parameter (from the OpenAPI schema), every
object id inside an API body (the request serializers' relation fields), every dashboard
route (from the URLconf, with GET and POST carrying valid-looking form data) and the
dashboard's query parameters. Each answer must be exactly what a never-existing id gets,
carry nothing of the other team, and change nothing.

tests/sessions_app/test_api_access.py keeps its hand list of API endpoints for the 401
checks (and 404s for single ids); this file is the generated sweep."""
import re

import pytest
from django.db import transaction
from rest_framework.relations import ManyRelatedField, RelatedField

from tests.abuse.support import (
    api_operations,
    assert_api_error,
    assert_unchanged,
    base_body,
    body_operations,
    dashboard_inputs,
    dashboard_kwarg_value,
    dashboard_query_names,
    dashboard_routes,
    dumps,
    param_kind,
    request_serializer,
    snapshot,
)

pytestmark = pytest.mark.django_db

MISSING = {"node": "no-such-node"}  # and for integer ids: MISSING_ID
MISSING_ID = 987_654_321


def variants(params) -> list[tuple[str, frozenset]]:
    """Which parameters get the other team's id: all of them, and each alone when there are several."""
    found = [("all foreign", frozenset(params))]
    if len(params) > 1:
        found += [(f"foreign {name}", frozenset({name})) for name in params]
    return found


def ids_with(own_ids: dict, kinds: set, source: dict) -> dict:
    return {kind: (source[kind] if kind in kinds else value) for kind, value in own_ids.items()}


def missing_ids(own_ids: dict) -> dict:
    return {kind: MISSING.get(kind, MISSING_ID) for kind in own_ids}


# --- API: path parameters -------------------------------------------------------------------------

API_CASES = [
    pytest.param(operation, foreign_params, id=f"{operation}:{label}")
    for operation in api_operations() if operation.path_params
    for label, foreign_params in variants(operation.path_params)
]


def test_the_api_sweep_covers_every_operation_with_an_id():
    covered = {str(param.values[0]) for param in API_CASES}
    assert {"DELETE /api/v1/memories/{memory_id}/", "POST /api/v1/sessions/{session_id}/messages/",
            "GET /api/v1/workflows/{workflow_id}/nodes/{node_id}/lineage/", "GET /api/v1/turns/{turn_id}/"} <= covered
    assert len(covered) == len([o for o in api_operations() if o.path_params]) > 25


def _api_call(api, operation, ids):
    body = dumps(base_body(operation)) if operation.body_ref else b""
    with transaction.atomic():
        response = api.generic(operation.method, operation.url(ids), body, content_type="application/json")
        transaction.set_rollback(True)
    return response


@pytest.mark.parametrize(("operation", "foreign_params"), API_CASES)
def test_api_answers_another_teams_id_like_a_missing_one(operation, foreign_params, api, own, foreign):
    kinds = {param_kind(operation.path, name) for name in foreign_params}
    before = snapshot()

    response = _api_call(api, operation, ids_with(own.ids, kinds, foreign.ids))

    assert_api_error(response, 404, code="not_found")
    assert foreign.secret not in response.content.decode()
    assert_unchanged(before)
    missing = _api_call(api, operation, ids_with(own.ids, kinds, missing_ids(own.ids)))
    assert (missing.status_code, missing.json()) == (response.status_code, response.json())


# --- API: ids inside bodies -----------------------------------------------------------------------


def relation_fields(serializer) -> list[tuple[str, object]]:
    """(name, model) of each field of the serializer that takes an object's id."""
    found = []
    for name, field in serializer.fields.items():
        if field.read_only:
            continue
        relation = field.child_relation if isinstance(field, ManyRelatedField) else field
        if isinstance(relation, RelatedField):
            found.append((name, relation.queryset.model))
    return found


BODY_ID_CASES = [
    pytest.param(operation, name, model, id=f"{operation}:{name}")
    for operation in body_operations()
    for name, model in relation_fields(request_serializer(operation))
]


def test_the_body_sweep_finds_the_relation_fields():
    assert {(str(p.values[0]), p.values[1]) for p in BODY_ID_CASES} >= {
        ("POST /api/v1/kins/", "parent"), ("POST /api/v1/kins/{kin_id}/sessions/", "workflow"),
    }


def _foreign_object(seeded, model):
    for value in vars(seeded).values():
        if isinstance(value, model):
            return value
    raise AssertionError(f"seed_team has no {model.__name__} to point at; add one")


@pytest.mark.parametrize(("operation", "name", "model"), BODY_ID_CASES)
def test_another_teams_id_in_a_body_is_refused_like_a_missing_one(operation, name, model, api, own, foreign):
    target = _foreign_object(foreign, model)
    body = base_body(operation)
    before = snapshot()

    with transaction.atomic():
        response = api.generic(operation.method, operation.url(own.ids), dumps({**body, name: target.pk}),
                               content_type="application/json")
        transaction.set_rollback(True)

    error = assert_api_error(response, 400)
    assert name in error["details"]
    assert foreign.secret not in response.content.decode()
    assert_unchanged(before)
    with transaction.atomic():
        missing = api.generic(operation.method, operation.url(own.ids), dumps({**body, name: MISSING_ID}),
                              content_type="application/json")
        transaction.set_rollback(True)
    same_words = re.sub(r"\d+", "N", missing.content.decode()) == re.sub(r"\d+", "N", response.content.decode())
    assert same_words, "another team's id must get the words a missing id gets"


# --- dashboard: path parameters -------------------------------------------------------------------


def _dashboard_url(route, ids: dict) -> str:
    from django.urls import reverse

    return reverse(route.name, kwargs={name: dashboard_kwarg_value(route, name, ids) for name in route.kwargs})


ROUTES_WITH_IDS = [route for route in dashboard_routes() if set(route.kwargs) - {"fmt"}]


def test_the_dashboard_sweep_covers_every_route_with_an_id():
    covered = {route.name for route in ROUTES_WITH_IDS}
    assert {"dashboard:memory_delete", "dashboard:session_post", "dashboard:token_revoke",
            "dashboard:workflow_node_export"} <= covered
    assert len(covered) >= 18


def _dashboard_call(client, method, url):
    with transaction.atomic():
        # POST: valid-looking data for any form.
        response = client.get(url) if method == "GET" else client.post(url, dashboard_inputs())
        transaction.set_rollback(True)
    return response


@pytest.mark.parametrize("route", ROUTES_WITH_IDS, ids=str)
def test_dashboard_answers_another_teams_id_like_a_missing_one(route, dashboard, own, foreign):
    before = snapshot()
    for method in ("GET", "POST"):
        for label, foreign_params in variants([name for name in route.kwargs if name != "fmt"]):
            kinds = {param_kind(route.route, name) for name in foreign_params}
            case = f"{method} {label}"

            response = _dashboard_call(dashboard, method, _dashboard_url(route, ids_with(own.ids, kinds, foreign.ids)))

            # 405 where the route takes only the other method: refused before any lookup.
            assert response.status_code in (404, 405), (case, response.status_code)
            assert foreign.secret not in response.content.decode(), case
            assert_unchanged(before, case)
            missing = _dashboard_call(dashboard, method,
                                      _dashboard_url(route, ids_with(own.ids, kinds, missing_ids(own.ids))))
            assert missing.status_code == response.status_code, case


# --- dashboard: ids in query parameters -----------------------------------------------------------


@pytest.mark.parametrize("route", [r for r in dashboard_routes() if dashboard_query_names(r)], ids=str)
def test_dashboard_query_parameters_never_reach_another_teams_rows(route, dashboard, own, foreign):
    # Each query parameter the view's module reads (?run=, ?version=, ?added=...), one at a
    # time, set to the id of each of the other team's rows.
    foreign_pks = {value for value in foreign.ids.values() if isinstance(value, int)}
    foreign_pks |= {row.pk for row in foreign.kin.consolidation_runs.all()}
    url = _dashboard_url(route, own.ids)
    if dashboard.get(url).status_code == 405:
        return  # POST only: nothing is read from its query string
    before = snapshot()
    for name in dashboard_query_names(route):
        for pk in sorted(foreign_pks):
            response = dashboard.get(url, {name: str(pk)})
            assert response.status_code < 500
            assert foreign.secret not in response.content.decode(), f"{url}?{name}={pk}"
    assert_unchanged(before, ignore=("kinsite.LLMCall",))
