"""The LLM nodes with a scripted provider: per-record inference with {{field}} and
{{_lineage}}, and the smart filter's generated conditions."""
import json

import pytest

from kinsite.llm.providers import provider_override
from tests.support.scripted_model import ScriptedProvider
from tests.workflows.nodes.support import PEOPLE, run
from workflows.nodes import llm
from workflows.nodes.base import NodeError, RunContext, validate_params
from workflows.nodes.registry import NODE_TYPES, describe


@pytest.mark.django_db
def test_llm_inference_renders_fields_and_lineage_per_record():
    provider = ScriptedProvider(["first answer", "second answer"])
    lineage_calls = []

    def lineage():
        lineage_calls.append(1)
        return "1. Provides 2 records."

    config = {"prompt": "About {{name}} ({{ city }}). How they came here: {{_lineage}}", "output_field": "summary"}
    with provider_override(provider):
        records = run("llm_inference", config, PEOPLE[:2], ctx=RunContext(lineage=lineage))

    assert [r["summary"] for r in records] == ["first answer", "second answer"]
    assert provider.calls[0].messages[-1]["content"] == "About Ada (London). How they came here: 1. Provides 2 records."
    assert describe("llm_inference", config, records_in=2, records_out=2) == (
        'Asks the model once per record with the prompt "About {{name}} ({{ city }}). How they came here: '
        '{{_lineage}}" and writes the answer to summary (2 in, 2 out).'
    )


def test_llm_inference_refuses_malformed_placeholders_and_too_many_records():
    assert validate_params(NODE_TYPES["llm_inference"], {"prompt": "Hi {{ name"}) == [
        "'prompt' has a malformed placeholder '{{'; use {{field}} or {{_lineage}}."
    ]
    with pytest.raises(NodeError, match="3 model calls; this node allows 2"):
        run("llm_inference", {"prompt": "x", "max_records": 2}, PEOPLE)


@pytest.mark.django_db
def test_llm_smart_filter_stores_generated_conditions_and_reuses_them():
    answer = {"conditions": [{"field": "age", "op": "gte", "value": 18}], "combine": "and", "explanation": "Adults."}
    provider = ScriptedProvider([json.dumps(answer)])
    saved = {}
    config = {"instruction": "only adults"}

    with provider_override(provider):
        records = run("llm_smart_filter", config, PEOPLE, ctx=RunContext(save_config=saved.update))
        again = NODE_TYPES["llm_smart_filter"].run(RunContext(), dict(saved), [PEOPLE])

    assert [r["id"] for r in records] == [1, 3] == [r["id"] for r in again]
    assert len(provider.calls) == 1  # the second run reused the stored conditions
    assert provider.calls[0].json_mode
    assert saved["generated"]["conditions"] == answer["conditions"]
    assert saved["generated"]["explanation"] == "Adults."
    assert describe("llm_smart_filter", saved, records_in=3, records_out=2) == (
        'Filters by the instruction "only adults", which the model read as age ≥ 18 (3 in, 2 out).'
    )


@pytest.mark.django_db
def test_llm_smart_filter_fails_on_unusable_conditions():
    provider = ScriptedProvider([json.dumps({"conditions": [{"field": "age", "op": "between"}]})])
    with provider_override(provider), pytest.raises(NodeError, match="unusable"):
        run("llm_smart_filter", {"instruction": "middle aged"}, PEOPLE)


def test_llm_prompt_placeholder_check_is_linear_and_the_prompt_is_bounded():
    # A backtracking scan for "{{…}}" retried from every "{{" is quadratic on a long line.
    prompt = "{{" * 5_000 + "x"
    errors = validate_params(NODE_TYPES["llm_inference"], {"prompt": prompt})
    assert errors == ["'prompt' has a malformed placeholder '{{'; use {{field}} or {{_lineage}}."]
    too_long = validate_params(NODE_TYPES["llm_inference"], {"prompt": "x" * (llm.PROMPT_MAX_CHARS + 1)})
    assert too_long == [f"'prompt' is {llm.PROMPT_MAX_CHARS + 1} characters; the limit is "
                        f"{llm.PROMPT_MAX_CHARS}."]


def test_without_a_model_the_llm_nodes_fail_saying_what_to_configure():
    # No provider override and no LLM_BASE_URL: the offline stand-in would answer a placeholder.
    with pytest.raises(NodeError, match="The LLM node needs a language model.*LLM_BASE_URL"):
        run("llm_inference", {"prompt": "About {{name}}"}, PEOPLE)
    with pytest.raises(NodeError, match="The smart filter node needs a language model.*LLM_BASE_URL"):
        run("llm_smart_filter", {"instruction": "only adults"}, PEOPLE)
    assert run("llm_inference", {"prompt": "About {{name}}"}, []) == []  # nothing to ask, nothing refused
