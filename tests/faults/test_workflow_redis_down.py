"""A workflow run requested while Redis is down (SPEC §13: nothing waits for a person): a
real redis-server, the test's cache, rate-limit counters and Celery broker, is stopped and
started again, and a real worker runs the run once it is back."""
import time

import pytest
from django.urls import reverse

from tests.faults.conftest import wait_for
from tests.faults.test_redis_down import HANG_SECONDS, assert_unavailable
from workflows.models import Node, WorkflowRun

pytestmark = pytest.mark.postgres

RUN_SECONDS = 30
DOCUMENT = {
    "name": "Adults",
    "nodes": [
        {"id": "people", "type": "inline_records",
         "config": {"records": [{"name": "Ada", "age": 36}, {"name": "Bo", "age": 17}]}},
        {"id": "adults", "type": "filter", "config": {"conditions": [{"field": "age", "op": "gte", "value": 18}]}},
    ],
    "edges": [{"source": "people", "target": "adults"}],
}


def test_a_run_requested_while_redis_is_down_stores_nothing_and_the_next_request_runs(
    transactional_db, client, user, api_client, on_redis, fake_llm, workers
):
    """POST /workflows/{id}/run/ with Redis stopped, then again once it is back.

    The user sees: 503 `service_unavailable` with Retry-After, at once, saying the run was
    not started and nothing was stored (details.stored false), so it should be requested
    again; the dashboard's Run button says the same. Stored: nothing, no run and no node
    left pending, so nothing blocks the workflow. Runs again: the next request after Redis
    is back answers 202 (not 409 for an hour), and a worker runs it to the end."""
    created = api_client.post("/api/v1/workflows/", DOCUMENT, format="json")
    assert created.status_code == 201, created.content
    workflow_id = created.json()["id"]
    on_redis.stop()

    started = time.monotonic()
    refused = api_client.post(f"/api/v1/workflows/{workflow_id}/run/")

    assert time.monotonic() - started < HANG_SECONDS
    error = assert_unavailable(refused, "service_unavailable")
    assert error["details"]["stored"] is False and "not started" in error["message"]
    assert not WorkflowRun.objects.exists()
    assert set(Node.objects.values_list("status", flat=True)) == {"idle"}

    client.force_login(user)
    page = client.post(reverse("dashboard:workflow_run", args=[workflow_id]))
    assert page.status_code == 503 and "not started" in page.content.decode()
    assert not WorkflowRun.objects.exists()

    on_redis.start()
    accepted = api_client.post(f"/api/v1/workflows/{workflow_id}/run/")
    assert accepted.status_code == 202, accepted.content
    run_id = accepted.json()["run"]["id"]

    worker = workers(redis_url=on_redis.url, llm_base_url=fake_llm.base_url)
    wait_for(lambda: WorkflowRun.objects.filter(pk=run_id, status__in=["done", "failed"]).exists(),
             seconds=RUN_SECONDS, what="the worker to run the workflow", workers=[worker])
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == "done", run.error
    assert dict(Node.objects.values_list("client_id", "records_out")) == {"people": 2, "adults": 1}
