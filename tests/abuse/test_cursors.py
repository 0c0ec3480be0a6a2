"""Crafted pagination cursors on every cursor-paginated list (read from the OpenAPI schema,
so a new list is swept without editing this file): a cursor the API did not issue answers
400 in the §11 shape with code invalid_cursor, never a 500, and the links it does issue
still work."""
from base64 import b64encode

import pytest
from django.db import transaction

from tests.abuse.support import api_operations, assert_api_error
from tests.factories import (
    ConsolidationRunFactory,
    FactFactory,
    IntrospectionRunFactory,
    KinFactory,
    MemoryChangeFactory,
    MemoryFactory,
    MessageFactory,
    SessionFactory,
    WorkflowFactory,
)

pytestmark = pytest.mark.django_db

LISTS = [operation for operation in api_operations() if "cursor" in operation.query_params]


def cursor(querystring: str) -> str:
    return b64encode(querystring.encode()).decode()


# What DRF puts in a cursor: o (offset), r (reverse, 0 or 1), p (the position: the value of
# the first ordering field of the last row seen, an id or a date-time on these lists).
CRAFTED = [
    ("position not a number or date-time", cursor("p=abc")),
    ("position an impossible date-time", cursor("p=2026-13-45 25:61:00%2B00:00")),
    ("position a date-time out of range", cursor("p=99999-01-01 00:00:00%2B00:00")),
    ("position empty", cursor("p=")),
    ("position with NUL", cursor("p=1%00")),
    ("position a float", cursor("p=1e5")),
    ("offset not a number", cursor("o=abc")),
    ("offset negative", cursor("o=-1")),
    ("offset of 5,000 digits", cursor("o=" + "9" * 5_000)),
    ("reverse flag not a number", cursor("r=yes")),
    ("reverse flag and position both bad", cursor("r=x&p=abc")),
    ("not base64", "%%%"),
    ("base64 of invalid UTF-8", b64encode(b"p=\xff\xfe").decode()),
]


@pytest.fixture
def paged(own):
    """`own` with two more rows in every cursor-paginated list (seed_team writes one or
    none), so `limit=1` reads two pages or more and no list is empty."""
    for _ in range(2):
        KinFactory(team=own.kin.team)
        ConsolidationRunFactory(kin=own.kin, trigger="api", status="applied")
        FactFactory(kin=own.kin)
        MemoryFactory(team=own.kin.team, kin=own.kin)
        MemoryChangeFactory(memory=own.memory, action="update", after={"content": own.memory.content})
        IntrospectionRunFactory(session=own.session)
        MessageFactory(session=own.session)
        SessionFactory(kin=own.kin)
        WorkflowFactory(team=own.kin.team)
    return own


def test_the_sweep_covers_every_cursor_paginated_list():
    paths = {operation.path for operation in LISTS}
    assert {"/api/v1/kins/", "/api/v1/sessions/{session_id}/messages/",
            "/api/v1/kins/{kin_id}/memories/"} <= paths
    assert len(LISTS) >= 8


@pytest.mark.parametrize("operation", LISTS, ids=str)
def test_crafted_cursors_answer_400_invalid_cursor(operation, api, own):
    problems = []
    for label, value in CRAFTED:
        try:
            with transaction.atomic():
                response = api.get(operation.url(own.ids, f"cursor={value}"))
                transaction.set_rollback(True)
            error = assert_api_error(response, 400, "invalid_cursor")
            assert "cursor" in error["details"], error
        except AssertionError as exc:
            problems.append(f"{label} ({value[:40]}): {exc}")
        except Exception as exc:  # the test client re-raises what would be a 500
            problems.append(f"{label} ({value[:40]}): raised {exc.__class__.__name__}: {str(exc)[:200]}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("operation", LISTS, ids=str)
def test_a_huge_offset_reads_an_empty_page(operation, api, paged):
    # DRF caps offsets at 1,000 rows past the position; past the rows there is nothing to read.
    assert api.get(operation.url(paged.ids, "limit=500")).json()["results"], "the list is empty"
    response = api.get(operation.url(paged.ids, f"cursor={cursor('o=' + '9' * 30)}"))
    assert response.status_code == 200, response.content[:300]
    assert response.json()["results"] == []


@pytest.mark.parametrize("operation", LISTS, ids=str)
def test_issued_cursors_still_page_through_the_list(operation, api, paged):
    first = api.get(operation.url(paged.ids, "limit=1"))
    assert first.status_code == 200, first.content[:300]
    seen = list(first.json()["results"])
    link = first.json()["next"]
    assert link, f"one page only: {first.json()}"
    pages = 1
    while link:
        page = api.get(link)
        assert page.status_code == 200, page.content[:300]
        seen += page.json()["results"]
        previous = page.json()["previous"]
        assert api.get(previous).status_code == 200
        link = page.json()["next"]
        pages += 1
    whole = api.get(operation.url(paged.ids, "limit=500")).json()["results"]
    assert seen == whole
    assert pages == len(whole) >= 2, (pages, len(whole))
