"""The LLM nodes: llm_inference (one model call per record, a prompt template with
{{field}} and {{_lineage}}) and llm_smart_filter (the model turns an instruction into
filter conditions, kept in the config and reused while the instruction is unchanged)."""
from __future__ import annotations

import json
import re
from collections.abc import Callable

from workflows.nodes.base import (
    NodeError,
    NodeType,
    Param,
    Record,
    RunContext,
    concat,
    fields_of,
    get_field,
    quote,
    shorten,
)
from workflows.nodes.filtering import OPS, apply_conditions, check_conditions, describe_conditions

# Each record is one model call; a typo'd upstream filter must not cost 50,000 calls.
LLM_DEFAULT_MAX_RECORDS = 200
LLM_MAX_RECORDS_LIMIT = 5_000
# The range OpenAI-compatible endpoints accept; outside it every call would come back a 400.
LLM_TEMPERATURE_RANGE = (0, 2)
# A prompt template is rendered once per record and sent as one message.
PROMPT_MAX_CHARS = 50_000
SMART_FILTER_SAMPLE_RECORDS = 3

TOKEN = re.compile(r"\{\{\s*([A-Za-z_][\w.]*)\s*\}\}")
LINEAGE_TOKEN = "_lineage"


def template_errors(template: str) -> list[str]:
    leftover = TOKEN.sub("", template)
    # The first stray "{{" or "}}", shown up to its closing braces: found with str.find, since
    # a lazy regex retried from every "{{" is quadratic in a long line of them.
    starts = [at for at in (leftover.find("{{"), leftover.find("}}")) if at != -1]
    if not starts:
        return []
    start = min(starts)
    end = leftover.find("}}", start + 2) if leftover.startswith("{{", start) else -1
    newline = leftover.find("\n", start)
    bad = leftover[start: end + 2] if end != -1 and (newline == -1 or end < newline) else leftover[start: start + 2]
    bad = shorten(bad, 24)
    return [f"'prompt' has a malformed placeholder {bad!r}; use {{{{field}}}} or {{{{_lineage}}}}."]


def render_template(template: str, record: Record, lineage: Callable[[], str]) -> str:
    def value(match: re.Match) -> str:
        name = match.group(1)
        if name == LINEAGE_TOKEN:
            return lineage()
        found = get_field(record, name)
        if found is None:
            return ""
        return found if isinstance(found, str) else json.dumps(found, ensure_ascii=False)

    return TOKEN.sub(value, template)


def _model_required(node: str) -> None:
    """A NodeError saying what to configure, instead of the offline stand-in's placeholder
    landing in the records (or failing as "not JSON")."""
    from kinsite.llm.providers import chat_model_configured, model_not_configured_message

    if not chat_model_configured():
        raise NodeError(model_not_configured_message(f"The {node} node"))


def _max_records(config: dict) -> int:
    limit = config.get("max_records")
    return LLM_DEFAULT_MAX_RECORDS if limit is None else limit


class LlmInference(NodeType):
    name = "llm_inference"
    title = "LLM inference"
    description = "Asks the model once per record with a prompt template and writes the answer into a field."
    params = {
        "prompt": Param(str, required=True, doc="a template with {{field}} and {{_lineage}} tokens", widget="prompt",
                        schema={"maxLength": PROMPT_MAX_CHARS}),
        "output_field": Param(str, doc="the field the answer goes into", default="llm_output"),
        "system": Param(str, doc="a system message sent before every prompt"),
        "temperature": Param((int, float), doc="the model's sampling temperature (default: the model's)",
                             schema={"minimum": LLM_TEMPERATURE_RANGE[0], "maximum": LLM_TEMPERATURE_RANGE[1]}),
        "max_records": Param(int, doc="refuse to run on more records than this (one model call each)",
                             default=LLM_DEFAULT_MAX_RECORDS, schema={"minimum": 1, "maximum": LLM_MAX_RECORDS_LIMIT}),
    }

    def check(self, config: dict) -> list[str]:
        if len(config["prompt"]) > PROMPT_MAX_CHARS:
            return [f"'prompt' is {len(config['prompt'])} characters; the limit is {PROMPT_MAX_CHARS}."]
        errors = template_errors(config["prompt"])
        if not config["prompt"].strip():
            errors.append("'prompt' is empty.")
        limit = _max_records(config)
        if not 1 <= limit <= LLM_MAX_RECORDS_LIMIT:
            errors.append(f"'max_records' must be between 1 and {LLM_MAX_RECORDS_LIMIT}.")
        temperature = config.get("temperature")
        low, high = LLM_TEMPERATURE_RANGE
        if temperature is not None and not low <= temperature <= high:
            errors.append(f"'temperature' must be between {low} and {high}.")
        return errors

    def run(self, ctx: RunContext, config: dict, inputs: list[list[Record]]) -> list[Record]:
        from kinsite.llm.gateway import llm_chat

        records = concat(inputs)
        limit = _max_records(config)
        if len(records) > limit:
            raise NodeError(
                f"{len(records)} records would mean {len(records)} model calls; this node allows {limit} "
                "(raise its max_records or filter upstream)."
            )
        if records:
            _model_required("LLM")
        output_field = config.get("output_field") or "llm_output"
        messages_prefix = [{"role": "system", "content": config["system"]}] if config.get("system") else []
        out = []
        for record in records:
            prompt = render_template(config["prompt"], record, ctx.lineage)
            result = llm_chat(
                purpose="workflow_inference",
                messages=[*messages_prefix, {"role": "user", "content": prompt}],
                team=ctx.team,
                temperature=config.get("temperature"),
            )
            out.append({**record, output_field: (result.content or "").strip()})
        return out

    def describe(self, config: dict) -> str:
        return (
            f"Asks the model once per record with the prompt {quote(config.get('prompt', ''), 100)} "
            f"and writes the answer to {config.get('output_field') or 'llm_output'}"
        )


SMART_FILTER_SYSTEM = (
    "You turn a plain-language instruction into filter conditions over JSON records. "
    "Answer with one JSON object: {\"conditions\": [{\"field\": str, \"op\": one of "
    + ", ".join(OPS)
    + ", \"value\": any}], \"combine\": \"and\" or \"or\", \"explanation\": one sentence}. "
    "Use only field names that occur in the records. 'in' takes a list; 'exists' takes true or false."
)


def _generated_conditions(ctx: RunContext, config: dict, records: list[Record]) -> dict:
    """The conditions for the instruction: reused while the instruction is unchanged, else asked for."""
    from kinsite.llm.gateway import llm_chat

    generated = config.get("generated")
    if (
        isinstance(generated, dict)
        and generated.get("instruction") == config["instruction"]
        and not check_conditions(generated.get("conditions"), generated.get("combine", "and"))
    ):
        return generated
    _model_required("smart filter")
    sample = json.dumps(records[:SMART_FILTER_SAMPLE_RECORDS], ensure_ascii=False, default=str)[:3000]
    user = (
        f"Instruction: {config['instruction']}\n"
        f"Fields: {', '.join(fields_of(records)) or '(no records yet)'}\n"
        f"Sample records: {sample}"
    )
    result = llm_chat(
        purpose="workflow_smart_filter",
        messages=[{"role": "system", "content": SMART_FILTER_SYSTEM}, {"role": "user", "content": user}],
        team=ctx.team,
        json_mode=True,
    )
    try:
        answer = result.json()
    except ValueError as exc:
        raise NodeError("The model's answer was not JSON.") from exc
    if not isinstance(answer, dict):
        raise NodeError("The model's answer was not a JSON object of conditions.")
    combine = answer.get("combine") or "and"
    problems = check_conditions(answer.get("conditions"), combine)
    if problems:
        raise NodeError(f"The model's conditions are unusable: {' '.join(problems)}")
    generated = {
        "instruction": config["instruction"],
        "conditions": answer["conditions"],
        "combine": combine,
        "explanation": str(answer.get("explanation") or "")[:1000],
    }
    ctx.save_config({**config, "generated": generated})
    return generated


class LlmSmartFilter(NodeType):
    name = "llm_smart_filter"
    title = "LLM smart filter"
    description = ("Turns a plain-language instruction into filter conditions once, with the model, and keeps "
                   "the records that meet them.")
    params = {
        "instruction": Param(str, required=True, doc="what to keep, in plain language"),
        "generated": Param(dict, doc="the conditions the model wrote for the instruction"),
    }

    def check(self, config: dict) -> list[str]:
        if not config["instruction"].strip():
            return ["'instruction' is empty."]
        return []

    def run(self, ctx: RunContext, config: dict, inputs: list[list[Record]]) -> list[Record]:
        records = concat(inputs)
        generated = _generated_conditions(ctx, config, records)
        return apply_conditions(records, generated["conditions"], generated["combine"])

    def describe(self, config: dict) -> str:
        generated = config.get("generated") or {}
        conditions = ""
        if isinstance(generated, dict) and generated.get("conditions"):
            read_as = describe_conditions(generated["conditions"], generated.get("combine") or "and")
            conditions = f", which the model read as {read_as}"
        return f"Filters by the instruction {quote(config.get('instruction', ''))}{conditions}"
