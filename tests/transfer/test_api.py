"""GET /api/v1/kins/{id}/export/ and POST /api/v1/kins/import/ (SPEC §11): team scoping,
201 then 200 for the same document, and bad documents answering 400 (or 413) in the error
shape with every table's rows unchanged."""
import json
import uuid

import pytest
from django.utils.text import slugify

from kinsite.models import Kin
from tests.factories import KinFactory
from tests.transfer.conftest import normalise, table_counts

IMPORT_URL = "/api/v1/kins/import/"


@pytest.fixture(autouse=True)
def private_cache(settings):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                                   "LOCATION": f"transfer-api-{uuid.uuid4()}"}}


def export(api_client, kin, query="") -> dict:
    response = api_client.get(f"/api/v1/kins/{kin.pk}/export/{query}")
    assert response.status_code == 200, response.content
    return response.json()


def post_document(api_client, body, **extra):
    if not isinstance(body, (bytes, str)):
        body = json.dumps(body)
    return api_client.post(IMPORT_URL, data=body, content_type="application/json", **extra)


def test_export_answers_the_kin_document_as_a_download(api_client, full_kin):
    response = api_client.get(f"/api/v1/kins/{full_kin.pk}/export/")
    assert response.status_code == 200
    filename = f"kin-{full_kin.pk}-{slugify(full_kin.name)}.kin.json"
    assert response["Content-Disposition"] == f'attachment; filename="{filename}"'
    document = response.json()
    assert (document["format"], document["version"], document["kin"]["name"]) == ("kinsite.kin", 1, full_kin.name)
    assert document["includes_sessions"] is False and document["events"] == []
    assert len(document["memories"]) == 2


def test_export_with_sessions(api_client, full_kin):
    document = export(api_client, full_kin, "?sessions=1")
    assert document["includes_sessions"] is True
    assert {session["title"] for session in document["sessions"]} == {"Tea talk", "Soup"}
    assert any(event["content"] == "Pumpkin soup, too" for event in document["events"])


def test_export_of_another_teams_kin_is_404(api_client, other_team):
    stranger = KinFactory(team=other_team)
    response = api_client.get(f"/api/v1/kins/{stranger.pk}/export/")
    assert response.status_code == 404
    assert response.json() == {"error": {"code": "not_found", "message": "Not found.", "details": {}}}


def test_export_needs_a_token(client, full_kin):
    assert client.get(f"/api/v1/kins/{full_kin.pk}/export/").status_code == 401


def test_import_creates_a_kin_then_answers_it_again(api_client, full_kin, team):
    document = export(api_client, full_kin, "?sessions=1")
    created = post_document(api_client, document)
    assert created.status_code == 201, created.content
    kin = Kin.objects.get(pk=created.json()["id"])
    assert (kin.team, kin.name) == (team, full_kin.name) and kin.pk != full_kin.pk

    counts = table_counts()
    again = post_document(api_client, json.dumps(document, indent=2))  # the same document, spaced differently
    assert again.status_code == 200 and again.json()["id"] == kin.pk
    assert table_counts() == counts

    assert normalise(export(api_client, kin, "?sessions=1")) == normalise(document)


def _truncated(document) -> str:
    text = json.dumps(document)
    return text[: len(text) // 2]


@pytest.mark.parametrize(
    ("mangle", "path", "code"),
    [
        (_truncated, None, "parse_error"),
        (lambda d: {**d, "version": 2}, "version", "invalid_document"),
        (lambda d: {**d, "format": "letta.agent_file"}, "format", "invalid_document"),
        (lambda d: {"agents": [], "version": "0.1"}, "format", "invalid_document"),
        (lambda d: {k: v for k, v in d.items() if k != "facts"}, "$.facts", "invalid_document"),
        (lambda d: {**d, "memories": d["memories"][:1]}, "memories[0].superseded_by", "invalid_document"),
        (lambda d: [], "$", "invalid_document"),
        (lambda d: {**d, "kin": {**d["kin"], "overrides": {"tone": "cheerful"}}}, "kin.overrides",
         "invalid_document"),
        (lambda d: {**d, "kin": {**d["kin"], "overrides": {f"k{n}": n for n in range(50_000)}}}, "kin.overrides",
         "invalid_document"),
        (lambda d: {**d, "events": [{**d["events"][0], "created_at": "9999-12-31T23:59:59+00:00"}, *d["events"][1:]]},
         "events[0].created_at", "invalid_document"),
        (lambda d: {**d, "events": [{**d["events"][0], "sender": "  "}, *d["events"][1:]]},
         "events[0].sender", "invalid_document"),
    ],
    ids=["cut-in-half", "wrong-version", "other-format", "other-format-shape", "missing-key", "dangling-ref",
         "not-an-object", "unknown-override-section", "oversized-overrides", "year-9999", "blank-sender"],
)
def test_a_bad_document_answers_400_and_changes_nothing(api_client, full_kin, mangle, path, code):
    document = export(api_client, full_kin, "?sessions=1")
    counts = table_counts()
    response = post_document(api_client, mangle(document))
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == code
    if path is not None:
        assert error["details"]["errors"][0]["path"] == path
        assert error["message"].startswith(f"The kin document is invalid: {path}: ")
    assert table_counts() == counts


def test_a_document_over_the_size_cap_answers_413(api_client, full_kin, settings):
    document = export(api_client, full_kin)
    settings.TRANSFER_MAX_DOCUMENT_BYTES = 1_000
    counts = table_counts()
    response = post_document(api_client, document)
    assert response.status_code == 413
    assert "TRANSFER_MAX_DOCUMENT_BYTES" in response.json()["error"]["message"]
    assert table_counts() == counts


def test_the_import_cap_is_its_own_not_the_request_cap(api_client, full_kin, settings):
    # A kin with its sessions is larger than any other request: the general cap does not apply.
    document = export(api_client, full_kin, "?sessions=1")
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1_000
    assert post_document(api_client, document).status_code == 201


def test_the_schema_describes_both_endpoints(api_client):
    response = api_client.get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    paths = json.loads(response.content)["paths"]
    export_op = paths["/api/v1/kins/{kin_id}/export/"]["get"]
    import_op = paths["/api/v1/kins/import/"]["post"]
    assert {"200"} <= set(export_op["responses"]) and any(p["name"] == "sessions" for p in export_op["parameters"])
    assert {"200", "201"} <= set(import_op["responses"])
    assert "kinsite.kin" in export_op["description"]
