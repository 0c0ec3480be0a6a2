"""The answer is validated in code (SPEC §8): one corrective retry, then "rejected, nothing
changed". Plus the pure pieces: canonical sections, cleaning, word counts, sections by number."""
import json

import pytest

from consolidation.prompt import answer_validate, canonical_sections, clean_markdown, word_count
from consolidation.selectors import experience_current, experience_nested, experience_section
from consolidation.services import consolidation_run
from kinsite.llm.types import ChatResult
from kinsite.prompt_template_kinds import template_default
from tests.consolidation.conftest import SECTIONS, add_fact, answer, document, runs_of, state_of
from tests.factories import KinFactory


@pytest.fixture
def facts(kin, team):
    """Two pending facts of the kin, one consolidated fact, and a pending fact of another kin."""
    old = add_fact(kin, "Reports go to Lena.")
    old.is_consolidated = True
    old.save()
    first, second = add_fact(kin, "Reports go to Tom now."), add_fact(kin, "Never deploy on Fridays.")
    stranger = add_fact(KinFactory(team=team), "Another kin's fact.")
    return {"old": old, "first": first, "second": second, "stranger": stranger}


def long_document(words: int) -> str:
    return document([" ".join(["word"] * (words - 22))])  # the six headings hold 22 words (numbers count)


def bad_answers(facts):
    """name → (a bad answer, a phrase its rejection reason contains)."""
    ids = [facts["first"].pk, facts["second"].pk]
    swapped = SECTIONS[:1] + [SECTIONS[2], SECTIONS[1]] + SECTIONS[3:]
    return {
        "malformed JSON": ('{"updated_experience_markdown": "# Master', "not valid JSON"),
        "not an object": ("[1, 2, 3]", "one JSON object"),
        "missing key": (json.dumps({"updated_experience_markdown": document(), "processed_pending_ids": ids,
                                    "superseded_fact_ids": []}), "Missing key(s): summary_of_changes"),
        "extra key": (answer(processed=ids, confidence=0.9), "Unexpected key(s): confidence"),
        "ids not ints": (answer(processed=[str(i) for i in ids]), "processed_pending_ids must be a list of integer"),
        "unknown id": (answer(processed=[*ids, 999_999]), "not pending facts of this kin: 999999"),
        "another kin's id": (answer(processed=[facts["stranger"].pk]),
                             f"not pending facts of this kin: {facts['stranger'].pk}"),
        "a consolidated fact as processed": (answer(processed=[facts["old"].pk]), "not pending facts of this kin"),
        "another kin's id superseded": (answer(processed=ids, superseded=[facts["stranger"].pk]),
                                        "not active facts of this kin"),
        "missing section": (answer(document(sections=SECTIONS[:4] + SECTIONS[5:]), processed=ids),
                            "Missing section heading '## 4. Anti-Patterns & Critical Gotchas'"),
        "sections out of order": (answer(document(sections=swapped), processed=ids), "out of order"),
        "a section twice": (answer(document(sections=SECTIONS + SECTIONS[1:2]), processed=ids), "appears 2 times"),
        "too many words": (answer(long_document(1201), processed=ids), "has 1201 words; the limit is 1200"),
        "empty document": (answer("", processed=ids), "non-empty string"),
    }


BAD = ["malformed JSON", "not an object", "missing key", "extra key", "ids not ints", "unknown id",
       "another kin's id", "a consolidated fact as processed", "another kin's id superseded", "missing section",
       "sections out of order", "a section twice", "too many words", "empty document"]


@pytest.mark.parametrize("case", BAD)
def test_a_bad_answer_twice_is_rejected_and_nothing_changes(kin, facts, model, case):
    bad, reason = bad_answers(facts)[case]
    # ChatResult: replayed as is, so even non-JSON reaches the validator as the model's text.
    model.add(*(ChatResult(content=bad, tool_calls=[], model="m", tokens_in=10, tokens_out=5, finish_reason="stop")
                for _ in range(2)))
    before = state_of(kin)

    run = consolidation_run(kin=kin, trigger="api")

    assert run.status == "rejected" and run.finished_at is not None
    assert any(reason in error for error in run.validation_errors), run.validation_errors
    assert run.raw_answers == [bad, bad] and run.experience_version is None
    assert (run.tokens_in, run.tokens_out) == (20, 10)
    assert state_of(kin) == before
    # The retry showed the model its answer and every reason.
    retry = model.calls[1].messages
    assert retry[2] == {"role": "assistant", "content": bad}
    assert retry[3]["role"] == "user" and reason in retry[3]["content"]


def test_text_that_is_not_json_in_json_mode_is_an_invalid_answer_too(kin, facts, model):
    # A str reply in JSON mode that is not JSON: the provider raises LLMBadResponse, as a real endpoint does.
    model.add("Sure! Here is the document: # Master AI Experience", "still not JSON")
    before = state_of(kin)

    run = consolidation_run(kin=kin, trigger="api")

    assert run.status == "rejected" and len(run.raw_answers) == 2
    assert "not valid JSON" in run.validation_errors[0] and state_of(kin) == before


def test_a_valid_retry_after_one_bad_answer_applies(kin, facts, model):
    ids = [facts["first"].pk, facts["second"].pk]
    bad = answer(processed=[*ids, 999_999])
    good = answer(document(["Reports go to Tom."]), processed=ids, superseded=[facts["old"].pk])
    model.add(bad, good)

    run = consolidation_run(kin=kin, trigger="api")

    assert run.status == "applied" and run.raw_answers == [bad, good]
    assert run.validation_errors == ["processed_pending_ids has id(s) that are not pending facts of this kin: 999999."]
    assert run.superseded_fact_ids == [facts["old"].pk]
    assert len(model.calls) == 2


def test_the_retry_for_a_command_line_model_is_one_text_with_the_reasons(kin, facts):
    prompts = []

    def model(prompt):
        prompts.append(prompt)
        return "not json" if len(prompts) == 1 else answer(processed=[facts["first"].pk])

    run = consolidation_run(kin=kin, trigger="command", llm=model)

    assert run.status == "applied"
    assert prompts[1].startswith(run.rendered_prompt)
    assert "Your previous answer was:\nnot json" in prompts[1] and "not valid JSON" in prompts[1]


def test_a_smaller_word_limit_is_enforced(kin, facts, model):
    model.add(answer(long_document(60)), answer(long_document(60)))
    run = consolidation_run(kin=kin, trigger="api", max_words=50)
    assert run.status == "rejected" and run.max_words == 50
    assert "has 60 words; the limit is 50" in run.validation_errors[-1]
    assert "At most 50 words" in run.rendered_prompt


def test_a_run_with_nothing_valid_changes_nothing_for_other_kins_either(kin, facts, model):
    stranger_kin = facts["stranger"].kin
    before = state_of(stranger_kin)
    model.add(answer(processed=[facts["stranger"].pk]), answer(processed=[facts["stranger"].pk]))
    assert consolidation_run(kin=kin, trigger="api").status == "rejected"
    assert state_of(stranger_kin) == before and runs_of(stranger_kin) == []


# --- the pure pieces -------------------------------------------------------------------------


def validate(raw, **overrides):
    options = dict(sections=SECTIONS, max_words=1200, pending_ids={1, 2}, active_ids={1, 2, 3})
    options.update(overrides)
    return answer_validate(raw, **options)


def test_the_canonical_sections_of_the_default_are_its_heading_list():
    assert canonical_sections(template_default("consolidation")) == SECTIONS


def test_the_canonical_sections_are_the_longest_run_of_heading_lines():
    body = "## Rules\nBe brief.\n\n# Doc\n\n## A\n##  B\nText\n## Lonely\n"
    assert canonical_sections(body) == ["# Doc", "## A", "## B"]
    assert canonical_sections("No headings at all: {kin_name}") == []


def test_a_fenced_json_answer_is_accepted():
    result, errors = validate("```json\n" + answer(processed=[1]) + "\n```")
    assert errors == [] and result.processed_ids == [1]


def test_duplicate_ids_are_harmless_and_booleans_are_not_ids():
    result, errors = validate(answer(processed=[1, 1, 2]))
    assert errors == [] and result.processed_ids == [1, 2]
    assert "must be a list of integer" in validate(answer(processed=[True]))[1][0]


def test_a_template_without_sections_checks_no_headings():
    result, errors = validate(answer("Just a paragraph.", processed=[1]), sections=[])
    assert errors == [] and result.markdown == "Just a paragraph.\n"


def test_every_problem_is_reported_at_once():
    _, errors = validate(answer("# Master AI Experience\n", processed=[9], superseded=[8]))
    assert len(errors) == 2 + 5  # two id problems, five missing sections


def test_clean_markdown_strips_comments_and_timestamps_only():
    text = (
        "# T <!-- x -->\n<!--\nmulti\nline\n-->\n"
        "- Met on 2026-03-02 at (2026-03-02 14:05 UTC) with Tom.\n  - nested\n"
    )
    assert clean_markdown(text) == "# T\n\n- Met on 2026-03-02 at with Tom.\n  - nested\n"


def test_words_are_runs_of_letters_and_digits():
    assert word_count("# Master AI Experience\n- don't dedupe by e-mail (v1.2) — ever!\n") == 9


# --- one section of a document ---------------------------------------------------------------

DOC = document(["Maria wants bullet points."], ["Check the region twice."], ["```", "## not a heading", "```"])


@pytest.mark.parametrize("key, expected_start", [
    (0, "# Master AI Experience"),
    ("title", "# Master AI Experience"),
    (1, "## 1. User Directives & Preferences\n- Maria wants bullet points."),
    ("2", "## 2. Defensive Safeguards & Heuristics\n- Check the region twice."),
    ("Project-Specific Constraints", "## 3. Project-Specific Constraints"),
    ("3. project-specific   constraints", "## 3. Project-Specific Constraints"),
    (5, "## 5. Mistake Corrections & Fixes"),
])
def test_experience_section_by_number_or_heading(key, expected_start):
    section = experience_section(DOC, key)
    assert section.startswith(expected_start)
    assert section.count("\n## ") == 0  # one section only


def test_experience_section_keeps_code_blocks_and_is_none_when_absent():
    assert "## not a heading" in experience_section(DOC, 3)
    assert experience_section(DOC, 6) is None and experience_section(DOC, "Nope") is None
    assert experience_section(DOC, -1) is None and experience_section("no headings", 0) is None
    assert experience_section(DOC, 0) == "# Master AI Experience"


def test_the_prompt_copy_nests_headings_under_the_experience_section():
    assert experience_nested("# T\n## 1. A\n- x\n```\n# code\n```\n##### deep\n###### deepest") == (
        "### T\n#### 1. A\n- x\n```\n# code\n```\n###### deep\n###### deepest")


# --- timestamps ------------------------------------------------------------------------------


def test_a_timestamp_inside_a_sentence_goes_back_to_the_model_instead_of_being_cut_out(kin, model):
    fact = add_fact(kin, "Use pnpm.")
    stamped = document(["Use pnpm (learned 2026-12-01 10:00)."])
    fixed = document(["Use pnpm."])
    model.add(answer(stamped, processed=[fact.pk]), answer(fixed, processed=[fact.pk]))

    run = consolidation_run(kin=kin, trigger="api")

    assert run.status == "applied"
    assert experience_current(kin).markdown == fixed
    retry = model.calls[1].messages[-1]["content"]
    assert "timestamp" in retry and "(learned 2026-12-01 10:00)" in retry


def test_an_answer_that_keeps_a_timestamp_in_a_sentence_is_rejected_never_stored_mangled(kin, model):
    fact = add_fact(kin, "Use pnpm.")
    stamped = answer(document(["Use pnpm (learned 2026-12-01 10:00)."]), processed=[fact.pk])
    model.add(stamped, stamped)

    run = consolidation_run(kin=kin, trigger="api")

    assert run.status == "rejected" and experience_current(kin) is None
    assert any("2026-12-01 10:00" in error for error in run.validation_errors)


def test_a_timestamp_in_brackets_of_its_own_is_removed_whole():
    result, errors = validate(answer(document(["[2026-03-02T09:00:00Z] Use pnpm.", "Use UTC (2026-03-02 14:05 UTC)."]),
                                     processed=[1]))
    assert errors == [] and "- Use pnpm.\n" in result.markdown and "- Use UTC.\n" in result.markdown
