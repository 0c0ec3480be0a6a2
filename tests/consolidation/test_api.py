"""The consolidation API (SPEC §11): the fact ledger (list with filters, cursor pages,
POST), on-demand consolidation (prepare, applied, rejected, model failure, template and
word-limit validation), the run audit, and the experience document (current, a version,
a section, markdown). Other teams' kins are covered by tests/sessions_app/test_api_access.py."""
import json

import pytest
from django.core.cache import cache

from consolidation import services
from consolidation.models import ConsolidationRun, ExperienceVersion, Fact
from kinsite.llm.providers import provider_override
from kinsite.llm.types import LLMError
from kinsite.models import ApiToken
from tests.factories import ConsolidationRunFactory, ExperienceVersionFactory
from tests.support.scripted_model import ScriptedProvider

API = "/api/v1/"

DOCUMENT = """# Master AI Experience
## 1. User Directives & Preferences
- Maria wants weekly reports.
## 2. Defensive Safeguards & Heuristics
- Check the date column before joining.
## 3. Project-Specific Constraints
- The churn report deduplicates by customer id.
## 4. Anti-Patterns & Critical Gotchas
## 5. Mistake Corrections & Fixes
"""


def answer(*, markdown=DOCUMENT, processed=(), superseded=(), summary="Folded in the new facts.") -> str:
    return json.dumps({
        "updated_experience_markdown": markdown,
        "processed_pending_ids": list(processed),
        "superseded_fact_ids": list(superseded),
        "summary_of_changes": summary,
    })


def fact(kin, statement, **fields) -> Fact:
    return services.fact_record(kin=kin, statement=statement, source=Fact.Source.API, **fields)


def version(kin, number, markdown=DOCUMENT) -> ExperienceVersion:
    return ExperienceVersionFactory(kin=kin, version=number, markdown=markdown, word_count=len(markdown.split()))


def assert_error(response, status, code=None) -> dict:
    assert response.status_code == status, response.content[:500]
    error = response.json()["error"]
    assert set(error) == {"code", "message", "details"}
    if code:
        assert error["code"] == code
    return error


# --- facts -----------------------------------------------------------------------------------


def test_post_fact_records_a_pending_api_fact(api_client, kin):
    token = ApiToken.objects.get()

    response = api_client.post(f"{API}kins/{kin.pk}/facts/", {"statement": "Maria wants weekly reports.",
                                                               "category": "preference"}, format="json")

    assert response.status_code == 201
    body = response.json()
    row = Fact.objects.get(pk=body["id"])
    assert row.kin == kin and row.statement == "Maria wants weekly reports." and row.category == "preference"
    assert row.source == "api" and row.source_ref == f"token:{token.prefix}"
    assert body["source"] == "api" and body["source_ref"] == f"token:{token.prefix}"
    assert body["pending"] is True and body["status"] == "active" and body["is_consolidated"] is False


def test_post_fact_category_defaults_to_fact(api_client, kin):
    response = api_client.post(f"{API}kins/{kin.pk}/facts/", {"statement": "The warehouse is in Leeds."}, format="json")

    assert response.status_code == 201
    assert response.json()["category"] == "fact"


@pytest.mark.parametrize(
    "body, field",
    [
        ({"statement": "", "category": "fact"}, "statement"),
        ({"category": "fact"}, "statement"),
        ({"statement": "x" * (services.STATEMENT_MAX_CHARS + 1)}, "statement"),
        ({"statement": "A fact.", "category": "rumour"}, "category"),
        ({"statement": "A fact.", "status": "superseded"}, "status"),
        ({"statement": "A fact.", "source": "admin"}, "source"),
    ],
)
def test_post_fact_with_an_invalid_body_answers_400(api_client, kin, body, field):
    response = api_client.post(f"{API}kins/{kin.pk}/facts/", body, format="json")

    error = assert_error(response, 400)
    assert field in error["details"]
    assert not Fact.objects.exists()


def test_fact_list_is_newest_first_and_filters_by_pending_and_status(api_client, kin):
    old = fact(kin, "Old pending fact.")
    consolidated = fact(kin, "Consolidated fact.")
    superseded = fact(kin, "Superseded fact.")
    new = fact(kin, "New pending fact.")
    Fact.objects.filter(pk=consolidated.pk).update(is_consolidated=True)
    Fact.objects.filter(pk=superseded.pk).update(status=Fact.Status.SUPERSEDED)

    def ids(query=""):
        response = api_client.get(f"{API}kins/{kin.pk}/facts/{query}")
        assert response.status_code == 200
        return [row["id"] for row in response.json()["results"]]

    assert ids() == [new.pk, superseded.pk, consolidated.pk, old.pk]
    assert ids("?pending=true") == [new.pk, old.pk]
    assert ids("?pending=false") == [superseded.pk, consolidated.pk]
    assert ids("?status=superseded") == [superseded.pk]
    assert ids("?status=active&pending=false") == [consolidated.pk]


def test_fact_list_is_cursor_paginated(api_client, kin):
    facts = [fact(kin, f"Fact number {n}.") for n in range(5)]

    first = api_client.get(f"{API}kins/{kin.pk}/facts/?limit=2").json()
    second = api_client.get(first["next"]).json()

    assert [row["id"] for row in first["results"]] == [facts[4].pk, facts[3].pk]
    assert [row["id"] for row in second["results"]] == [facts[2].pk, facts[1].pk]


@pytest.mark.parametrize("query", ["?status=deleted", "?pending=maybe"])
def test_fact_list_with_an_invalid_filter_answers_400(api_client, kin, query):
    assert_error(api_client.get(f"{API}kins/{kin.pk}/facts/{query}"), 400)


# --- consolidate -----------------------------------------------------------------------------


def consolidate(api_client, kin, **body):
    return api_client.post(f"{API}kins/{kin.pk}/consolidate/", body, format="json")


def test_prepare_renders_the_prompt_without_calling_the_model(api_client, kin):
    pending = fact(kin, "Maria wants weekly reports.")

    with provider_override(ScriptedProvider([])):  # any model call would fail the test
        response = consolidate(api_client, kin, prepare=True)

    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "prepared" and body["trigger"] == "api"
    assert body["template_source"] == "default"
    assert f"[id {pending.pk}]" in body["rendered_prompt"] and "Maria wants weekly reports." in body["rendered_prompt"]
    assert body["raw_answers"] == [] and body["experience_version"] is None
    assert not ExperienceVersion.objects.exists()
    assert Fact.objects.get(pk=pending.pk).is_consolidated is False


def test_consolidate_applies_a_valid_answer_and_answers_with_the_run(api_client, kin):
    older = fact(kin, "The churn report deduplicates by email.")
    Fact.objects.filter(pk=older.pk).update(is_consolidated=True)
    newer = fact(kin, "The churn report deduplicates by customer id.")
    model = ScriptedProvider([answer(processed=[newer.pk], superseded=[older.pk], summary="Dedupe by customer id.")])

    with provider_override(model):
        response = consolidate(api_client, kin, max_words=500)

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "applied"
    assert body["processed_fact_ids"] == [newer.pk] and body["superseded_fact_ids"] == [older.pk]
    assert body["summary_of_changes"] == "Dedupe by customer id."
    assert body["experience_version"] == 1 and body["max_words"] == 500
    assert body["word_count"] > 0 and body["tokens_in"] > 0
    assert body["validation_errors"] == [] and body["error"] == ""
    assert len(body["raw_answers"]) == 1 and body["rendered_prompt"]
    assert ExperienceVersion.objects.get(kin=kin).markdown.startswith("# Master AI Experience")
    assert Fact.objects.get(pk=older.pk).status == Fact.Status.SUPERSEDED
    assert Fact.objects.get(pk=newer.pk).is_consolidated is True


def test_a_rejected_run_answers_200_with_its_status(api_client, kin):
    fact(kin, "Maria wants weekly reports.")
    missing_sections = answer(markdown="# Master AI Experience\n- Maria wants weekly reports.\n")

    with provider_override(ScriptedProvider([missing_sections, missing_sections])):
        response = consolidate(api_client, kin)

    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "rejected"
    assert len(body["raw_answers"]) == 2
    assert any("Missing section heading" in problem for problem in body["validation_errors"])
    assert body["experience_version"] is None
    assert not ExperienceVersion.objects.exists()


def test_a_model_failure_answers_502_and_records_the_run_failed(api_client, kin):
    fact(kin, "Maria wants weekly reports.")

    with provider_override(ScriptedProvider([LLMError("The endpoint is down.")])):
        response = consolidate(api_client, kin)

    error = assert_error(response, 502, "upstream_error")
    assert "The endpoint is down." in error["message"]
    run = ConsolidationRun.objects.get(kin=kin)
    assert run.status == ConsolidationRun.Status.FAILED
    assert error["details"]["run"]["id"] == run.pk and error["details"]["run"]["status"] == "failed"
    assert not ExperienceVersion.objects.exists()


def test_an_explicit_template_is_used(api_client, kin):
    template = "Rewrite the document of {kin_name} in {max_words} words.\n{current_experience}\n{pending_facts}"

    response = consolidate(api_client, kin, template=template, prepare=True)

    body = response.json()
    assert body["template_source"] == "explicit"
    assert body["rendered_prompt"].startswith(f"Rewrite the document of {kin.name} in 1200 words.")


@pytest.mark.parametrize(
    "template, expected",
    [
        ("Hello {kin_nmae}", "unknown placeholder {kin_nmae} (did you mean {kin_name}?)"),
        ("Hello {max_words.__class__}", "reaches into an attribute or item"),
        ("", "The template is empty."),
    ],
)
def test_an_invalid_template_answers_400_with_each_problem(api_client, kin, template, expected):
    response = consolidate(api_client, kin, template=template)

    error = assert_error(response, 400)
    problems = error["details"]["template"]
    assert any(expected in problem for problem in problems), problems
    assert not ConsolidationRun.objects.exists()


@pytest.mark.parametrize(
    "body, field",
    [
        ({"max_words": 99}, "max_words"),
        ({"max_words": 10_001}, "max_words"),
        ({"max_words": "many"}, "max_words"),
        ({"prepare": "perhaps"}, "prepare"),
        ({"maxwords": 500}, "maxwords"),
    ],
)
def test_an_invalid_consolidate_body_answers_400(api_client, kin, body, field):
    error = assert_error(consolidate(api_client, kin, **body), 400)

    assert field in error["details"]
    assert not ConsolidationRun.objects.exists()


def test_max_words_bounds_are_accepted(api_client, kin):
    for max_words in (100, 10_000):
        response = consolidate(api_client, kin, max_words=max_words, prepare=True)
        assert response.status_code == 200
        assert response.json()["max_words"] == max_words


# --- runs ------------------------------------------------------------------------------------


def test_consolidation_runs_are_newest_first_and_light_unless_full(api_client, kin):
    first = ConsolidationRunFactory(kin=kin, trigger="nightly", status="rejected", template_source="team",
                                    rendered_prompt="PROMPT", raw_answers=["RAW"],
                                    validation_errors=["Missing key(s): summary_of_changes."])
    second = ConsolidationRunFactory(kin=kin, trigger="api", status="prepared", template_source="default",
                                     rendered_prompt="PROMPT 2")

    light = api_client.get(f"{API}kins/{kin.pk}/consolidations/").json()["results"]
    full = api_client.get(f"{API}kins/{kin.pk}/consolidations/?full=true").json()["results"]

    assert [run["id"] for run in light] == [second.pk, first.pk]
    assert "rendered_prompt" not in light[0] and "raw_answers" not in light[0]
    assert light[1]["template_source"] == "team" and light[1]["status"] == "rejected"
    assert light[1]["validation_errors"] == ["Missing key(s): summary_of_changes."]
    assert {"summary_of_changes", "word_count", "tokens_in", "tokens_out", "error"} <= set(light[1])
    assert full[1]["rendered_prompt"] == "PROMPT" and full[1]["raw_answers"] == ["RAW"]


def test_consolidation_runs_are_cursor_paginated(api_client, kin):
    runs = ConsolidationRunFactory.create_batch(3, kin=kin, trigger="api", status="prepared")

    first = api_client.get(f"{API}kins/{kin.pk}/consolidations/?limit=2").json()
    second = api_client.get(first["next"]).json()

    assert [run["id"] for run in first["results"]] == [runs[2].pk, runs[1].pk]
    assert [run["id"] for run in second["results"]] == [runs[0].pk]


# --- experience ------------------------------------------------------------------------------


def test_experience_without_a_document_answers_404(api_client, kin):
    error = assert_error(api_client.get(f"{API}kins/{kin.pk}/experience/"), 404, "not_found")
    assert error["message"] == f"Kin {kin.pk} has no experience document yet."


def test_experience_is_the_current_version_by_default(api_client, kin):
    version(kin, 1, "# Master AI Experience\n- old\n")
    current = version(kin, 2)

    response = api_client.get(f"{API}kins/{kin.pk}/experience/")

    assert response.status_code == 200
    body = response.json()
    assert body["version"] == 2 and body["markdown"] == DOCUMENT
    assert body["word_count"] == current.word_count and body["created_at"]
    assert "section" not in body


def test_experience_any_version(api_client, kin):
    version(kin, 1, "# Master AI Experience\n- old\n")
    version(kin, 2)

    body = api_client.get(f"{API}kins/{kin.pk}/experience/?version=1").json()

    assert body["version"] == 1 and body["markdown"] == "# Master AI Experience\n- old\n"


@pytest.mark.parametrize(
    "section",
    ["3", "Project-Specific Constraints", "3. Project-Specific Constraints", "project-specific constraints"],
)
def test_experience_one_section_by_number_or_heading(api_client, kin, section):
    version(kin, 1)

    response = api_client.get(f"{API}kins/{kin.pk}/experience/", {"section": section})

    body = response.json()
    assert response.status_code == 200
    assert body["section"] == section and body["version"] == 1
    assert body["markdown"] == "## 3. Project-Specific Constraints\n- The churn report deduplicates by customer id."


def test_experience_unknown_version_or_section_answers_404(api_client, kin):
    version(kin, 1)

    assert_error(api_client.get(f"{API}kins/{kin.pk}/experience/?version=7"), 404, "not_found")
    assert_error(api_client.get(f"{API}kins/{kin.pk}/experience/?section=9"), 404, "not_found")
    assert_error(api_client.get(f"{API}kins/{kin.pk}/experience/?section=Nowhere"), 404, "not_found")


@pytest.mark.parametrize("query", ["?version=latest", "?version=0"])
def test_experience_malformed_version_answers_400(api_client, kin, query):
    version(kin, 1)

    assert_error(api_client.get(f"{API}kins/{kin.pk}/experience/{query}"), 400)


def test_experience_as_markdown(api_client, kin):
    version(kin, 1)

    whole = api_client.get(f"{API}kins/{kin.pk}/experience/", HTTP_ACCEPT="text/markdown")
    section = api_client.get(f"{API}kins/{kin.pk}/experience/?section=1", HTTP_ACCEPT="text/markdown")

    assert whole.status_code == 200
    assert whole["Content-Type"] == "text/markdown; charset=utf-8"
    assert whole.content.decode() == DOCUMENT
    assert section.content.decode() == "## 1. User Directives & Preferences\n- Maria wants weekly reports."


def test_experience_as_markdown_still_answers_errors_as_json(api_client, kin):
    response = api_client.get(f"{API}kins/{kin.pk}/experience/", HTTP_ACCEPT="text/markdown")

    assert response["Content-Type"] == "application/json"
    assert_error(response, 404, "not_found")


def test_experience_as_markdown_with_the_format_parameter(api_client, kin):
    version(kin, 1)

    response = api_client.get(f"{API}kins/{kin.pk}/experience/?format=md")

    assert response["Content-Type"].startswith("text/markdown")
    assert response.content.decode() == DOCUMENT


def test_the_schema_describes_the_consolidation_endpoints(anon_client):
    schema = anon_client.get(f"{API}schema/?format=json").json()

    for route in ("facts", "consolidate", "consolidations", "experience"):
        assert f"/api/v1/kins/{{kin_id}}/{route}/" in schema["paths"]


def test_consolidate_while_another_run_holds_the_kin_answers_409(api_client, kin):
    key = services.LOCK_KEY.format(kin_id=kin.pk)
    cache.add(key, "another-run", timeout=60)
    try:
        response = consolidate(api_client, kin)
    finally:
        cache.delete(key)

    assert_error(response, 409, "consolidation_busy")
    assert not ConsolidationRun.objects.exists()


def test_consolidate_without_pending_facts_answers_409_and_calls_no_model(api_client, kin):
    version(kin, 1)
    with provider_override(ScriptedProvider([])):  # any model call would fail the test
        response = api_client.post(f"{API}kins/{kin.pk}/consolidate/", {}, format="json")

    error = assert_error(response, 409, "nothing_to_consolidate")
    assert error["message"] == f"Nothing to consolidate: {kin.name} has no pending facts."
    assert not ConsolidationRun.objects.exists()
    assert list(ExperienceVersion.objects.filter(kin=kin).values_list("version", flat=True)) == [1]


def test_prepare_without_pending_facts_still_renders_the_prompt(api_client, kin):
    response = api_client.post(f"{API}kins/{kin.pk}/consolidate/", {"prepare": True}, format="json")

    assert response.status_code == 200 and response.json()["status"] == "prepared"
    assert "<pending_facts>\n(none)\n</pending_facts>" in response.json()["rendered_prompt"]
