import pytest


@pytest.mark.django_db
def test_healthz_reports_database_and_broker(client, settings):
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["database"]["ok"] is True
    assert body["broker"]["ok"] is True
    assert body["broker"]["kind"] == ("redis" if settings.REDIS_URL else "eager")


@pytest.mark.django_db
def test_healthz_reports_unreachable_broker_as_503(client, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    response = client.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["broker"]["ok"] is False
    assert body["database"]["ok"] is True
