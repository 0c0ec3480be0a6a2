"""Bad input on every dashboard route (SPEC §13: a clear 4xx, never a 500): a NUL
character in any query parameter, form field or path part answers 400 and changes
nothing (PostgreSQL text cannot hold it); oversized values and bodies over the upload
limit are refused or ignored, never a 500. The routes come from the URLconf and the
inputs from the forms and request.GET/POST reads of the views' modules."""
import pytest
from django.db import transaction
from django.urls import reverse

from tests.abuse.support import (
    assert_unchanged,
    dashboard_inputs,
    dashboard_kwarg_value,
    dashboard_routes,
    snapshot,
)

pytestmark = pytest.mark.django_db

ROUTES = dashboard_routes()


def url_of(route, own, **raw) -> str:
    kwargs = {name: raw.get(name, dashboard_kwarg_value(route, name, own.ids)) for name in route.kwargs}
    return reverse(route.name, kwargs=kwargs)


def send(client, method, url, data):
    """The response, or the exception a 500 would have been (re-raised by the test client)."""
    try:
        with transaction.atomic():
            response = client.get(url, data) if method == "GET" else client.post(url, data)
            transaction.set_rollback(True)
        return response
    except Exception as exc:
        return exc


def test_the_sweep_knows_the_dashboards_inputs():
    inputs = dashboard_inputs()
    assert {"q", "content", "sender", "statement", "subject", "message", "name", "run", "version"} <= set(inputs)
    assert len(ROUTES) >= 20


def refused_status(route) -> set[int]:
    # 405: the route takes the other method (refused before any input is read). The home
    # page reads no input at all: it redirects to the kins page whatever it is sent.
    return {302} if route.name == "dashboard:home" else {400, 405}


@pytest.mark.parametrize("route", ROUTES, ids=str)
def test_nul_in_the_inputs_answers_400_and_changes_nothing(route, dashboard, own):
    before = snapshot()
    nul = {name: value[:1] + "\x00" + value[1:] for name, value in dashboard_inputs().items()}
    for method in ("GET", "POST"):
        response = send(dashboard, method, url_of(route, own), nul)
        assert not isinstance(response, Exception), (method, response)
        assert response.status_code in refused_status(route), method
    assert_unchanged(before)


@pytest.mark.parametrize("method", ["GET", "POST"])
@pytest.mark.parametrize("route_name", ["dashboard:memory_list", "dashboard:fact_list", "dashboard:tokens",
                                        "dashboard:session_post", "dashboard:session_prompt_preview"])
def test_nul_in_any_single_input_is_enough(route_name, method, dashboard, own):
    # The check does not depend on which input carries the NUL (or on the others being valid).
    [route] = [r for r in ROUTES if r.name == route_name]
    before = snapshot()
    for name in dashboard_inputs():
        response = send(dashboard, method, url_of(route, own), {**dashboard_inputs(), name: "a\x00b"})
        assert not isinstance(response, Exception), (name, response)
        assert response.status_code in refused_status(route), name
    assert_unchanged(before)


@pytest.mark.parametrize("route", [r for r in ROUTES if "client_id" in r.kwargs], ids=str)
def test_nul_in_a_path_part_answers_400(route, dashboard, own):
    before = snapshot()
    response = send(dashboard, "GET", url_of(route, own, client_id="records\x00"), {})
    assert not isinstance(response, Exception), response
    assert response.status_code == 400
    assert_unchanged(before)


@pytest.mark.parametrize("route", ROUTES, ids=str)
def test_oversized_inputs_never_answer_500(route, dashboard, own, settings):
    # Longer than any field allows: forms refuse (400), searches cut the text; the page
    # must still answer.
    huge = {name: "x" * (settings.MESSAGE_MAX_CHARS + 1) for name in dashboard_inputs()}
    for method in ("GET", "POST"):
        response = send(dashboard, method, url_of(route, own), huge)
        assert not isinstance(response, Exception), (method, response)
        assert response.status_code < 500, method


def test_a_form_body_over_the_upload_limit_answers_400_and_stores_nothing(dashboard, own, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 50_000
    before = snapshot()
    url = reverse("dashboard:session_post", args=[own.session.pk])
    response = send(dashboard, "POST", url, {"content": "x" * 60_000, "sender": "Maria"})
    assert not isinstance(response, Exception), response
    assert response.status_code == 400
    assert_unchanged(before)
