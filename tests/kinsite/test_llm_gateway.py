"""The LLM gateway end to end over real HTTP against the fake server, plus the scripted and offline providers."""
import json
import time

import pytest

from kinsite.llm.gateway import llm_chat, llm_embed
from kinsite.llm.openai_client import OpenAICompatibleProvider
from kinsite.llm.providers import OfflineProvider, get_default_provider, provider_override
from kinsite.llm.types import ChatResult, LLMBadResponse, LLMError, LLMHTTPError, LLMTimeout, ToolCall
from kinsite.models import LLMCall, Team
from tests.factories import KinFactory, TeamFactory
from tests.support.outbound import closed_port
from tests.support.scripted_model import ScriptedProvider, ScriptExhausted

SEARCH_TOOL = {
    "name": "memory_search",
    "description": "Search the team's memories.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
}


def make_team(slug: str = "acme") -> Team:
    return TeamFactory(name=slug.title(), slug=slug)


def only_call() -> LLMCall:
    calls = list(LLMCall.objects.all())
    assert len(calls) == 1, calls
    return calls[0]


def provider_for(server, **overrides) -> OpenAICompatibleProvider:
    options = dict(base_url=server.base_url, model="fake-model", timeout=0.3, max_retries=2, backoff=0.01)
    options.update(overrides)
    return OpenAICompatibleProvider(**options)


# --- OpenAI-compatible provider over HTTP, through llm_chat ---------------------------------


@pytest.mark.django_db
def test_tool_call_round_trip_sends_tools_and_tool_result(fake_llm, fake_llm_provider):
    team = make_team()
    fake_llm.tool_call("memory_search", {"query": "deploy day"}, call_id="call_abc")
    fake_llm.reply("Deploys happen on Tuesdays.")
    messages = [{"role": "user", "content": "When do we deploy?"}]

    first = llm_chat(purpose="kin_turn", messages=messages, team=team, tools=[SEARCH_TOOL], provider=fake_llm_provider)

    assert first.content is None
    assert first.finish_reason == "tool_calls"
    assert first.tool_calls == [ToolCall(id="call_abc", name="memory_search", arguments='{"query": "deploy day"}')]
    assert first.tool_calls[0].parsed_arguments() == {"query": "deploy day"}

    messages.append(first.as_assistant_message())
    messages.append({"role": "tool", "tool_call_id": "call_abc", "content": "Deploys: Tuesdays."})
    second = llm_chat(purpose="kin_turn", messages=messages, team=team, tools=[SEARCH_TOOL], provider=fake_llm_provider)

    assert second.content == "Deploys happen on Tuesdays."
    assert second.tool_calls == []
    first_body, second_body = fake_llm.requests
    assert first_body["tools"] == [{"type": "function", "function": SEARCH_TOOL}]
    assert first_body["model"] == "fake-model"
    assert second_body["messages"][1]["tool_calls"][0]["id"] == "call_abc"
    assert second_body["messages"][2] == {"role": "tool", "tool_call_id": "call_abc", "content": "Deploys: Tuesdays."}
    assert fake_llm.received[0].headers["Authorization"] == "Bearer test-key"

    rows = list(LLMCall.objects.order_by("id"))
    assert [(r.purpose, r.provider, r.model, r.kind, r.status, r.attempts, r.team_id) for r in rows] == [
        ("kin_turn", "openai", "fake-model", "chat", "ok", 1, team.id),
        ("kin_turn", "openai", "fake-model", "chat", "ok", 1, team.id),
    ]
    # The fake reports usage; the row carries the endpoint's numbers.
    assert rows[1].tokens_in == second.tokens_in > 0
    assert rows[1].tokens_out == second.tokens_out == 4


@pytest.mark.django_db
def test_json_answer_is_parsed(fake_llm, fake_llm_provider):
    fake_llm.json_answer({"facts": ["deploys on Tuesday"]})

    result = llm_chat(
        purpose="extract", messages=[{"role": "user", "content": "x"}], json_mode=True, provider=fake_llm_provider
    )

    assert result.json() == {"facts": ["deploys on Tuesday"]}
    assert fake_llm.requests[0]["response_format"] == {"type": "json_object"}
    assert only_call().status == "ok"


@pytest.mark.django_db
def test_json_answer_in_code_fence_is_accepted(fake_llm, fake_llm_provider):
    fake_llm.reply('```json\n{"ok": true}\n```')

    result = llm_chat(purpose="extract", messages=[{"role": "user", "content": "x"}], json_mode=True,
                      provider=fake_llm_provider)

    assert result.json() == {"ok": True}


@pytest.mark.django_db
def test_non_json_answer_in_json_mode_raises_bad_response(fake_llm, fake_llm_provider):
    fake_llm.reply("Sure! Here are the facts: deploys on Tuesday.")

    with pytest.raises(LLMBadResponse, match="not JSON"):
        llm_chat(purpose="extract", messages=[{"role": "user", "content": "x"}], json_mode=True,
                 provider=fake_llm_provider)

    row = only_call()
    assert row.status == "error"
    assert "Here are the facts" in row.error
    assert row.attempts == 1


@pytest.mark.django_db
def test_server_error_is_retried_then_succeeds(fake_llm, fake_llm_provider):
    fake_llm.error(500, "upstream hiccup")
    fake_llm.reply("recovered")

    result = llm_chat(purpose="kin_turn", messages=[{"role": "user", "content": "hi"}], provider=fake_llm_provider)

    assert result.content == "recovered"
    assert result.attempts == 2
    assert len(fake_llm.requests) == 2
    row = only_call()
    assert (row.status, row.attempts, row.error) == ("ok", 2, "")


@pytest.mark.django_db
def test_rate_limit_waits_for_retry_after(fake_llm, fake_llm_provider):
    fake_llm.error(429, "slow down", retry_after=0.25)
    fake_llm.reply("after the wait")

    started = time.monotonic()
    result = llm_chat(purpose="kin_turn", messages=[{"role": "user", "content": "hi"}], provider=fake_llm_provider)

    # Backoff alone would be 0.01 s; the wait came from Retry-After.
    assert time.monotonic() - started >= 0.25
    assert result.content == "after the wait"
    assert only_call().attempts == 2


def test_retry_after_is_capped_at_30_seconds(fake_llm, fake_llm_provider, monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(fake_llm_provider, "_sleep", slept.append)
    fake_llm.error(429, retry_after=3600)
    fake_llm.reply("ok")

    assert fake_llm_provider.chat([{"role": "user", "content": "hi"}]).content == "ok"
    assert slept == [30.0]


@pytest.mark.django_db
def test_timeout_gives_clear_error_after_bounded_attempts(fake_llm):
    provider = provider_for(fake_llm, timeout=0.3, max_retries=1)
    fake_llm.stall(2)
    fake_llm.stall(2)
    fake_llm.reply("never reached")

    started = time.monotonic()
    with pytest.raises(LLMTimeout) as caught:
        llm_chat(purpose="kin_turn", messages=[{"role": "user", "content": "hi"}], provider=provider)

    assert time.monotonic() - started < 1.5
    message = str(caught.value)
    assert message == (
        "The model endpoint at …/chat/completions did not answer within 0.3 s (2 attempts)."
    )
    assert caught.value.attempts == 2
    assert caught.value.status == 502
    row = only_call()
    assert (row.status, row.attempts, row.error) == ("error", 2, message)
    assert row.latency_ms >= 600


@pytest.mark.django_db
def test_client_error_is_not_retried(fake_llm, fake_llm_provider):
    fake_llm.error(400, "messages[0].role must be one of system, user, assistant, tool")
    fake_llm.reply("never reached")

    with pytest.raises(LLMHTTPError) as caught:
        llm_chat(purpose="kin_turn", messages=[{"role": "user", "content": "hi"}], provider=fake_llm_provider)

    assert caught.value.status_code == 400
    assert caught.value.attempts == 1
    assert "HTTP 400: messages[0].role must be one of" in str(caught.value)
    assert len(fake_llm.requests) == 1
    row = only_call()
    assert (row.status, row.attempts) == ("error", 1)
    assert "messages[0].role must be one of" in row.error


@pytest.mark.django_db
def test_persistent_server_error_gives_up_after_max_retries(fake_llm, fake_llm_provider):
    for _ in range(3):
        fake_llm.error(503, "overloaded")

    with pytest.raises(LLMHTTPError, match=r"HTTP 503: overloaded \(3 attempts\)"):
        llm_chat(purpose="kin_turn", messages=[{"role": "user", "content": "hi"}], provider=fake_llm_provider)

    assert len(fake_llm.requests) == 3
    assert only_call().attempts == 3


@pytest.mark.django_db
def test_unreachable_endpoint_is_a_clear_error():
    provider = OpenAICompatibleProvider(
        base_url=f"http://127.0.0.1:{closed_port()}/v1", model="m", timeout=0.3, max_retries=1, backoff=0.01
    )

    with pytest.raises(LLMError, match=r"Could not reach the model endpoint at …/chat/completions: .*refused"):
        llm_chat(purpose="kin_turn", messages=[{"role": "user", "content": "hi"}], provider=provider)

    assert only_call().attempts == 2


@pytest.mark.django_db
def test_body_that_is_not_json_raises_bad_response(fake_llm, fake_llm_provider):
    fake_llm.raw("<html>502 Bad Gateway</html>", status=200, content_type="text/html")

    with pytest.raises(LLMBadResponse, match="not JSON"):
        llm_chat(purpose="kin_turn", messages=[{"role": "user", "content": "hi"}], provider=fake_llm_provider)


@pytest.mark.django_db
def test_missing_usage_is_estimated(fake_llm, fake_llm_provider):
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "hello there"},
                         "finish_reason": "stop"}]}
    fake_llm.raw(json.dumps(body), content_type="application/json")

    result = llm_chat(purpose="kin_turn", messages=[{"role": "user", "content": "say hello to the team"}],
                      provider=fake_llm_provider)

    assert result.tokens_in > 0 and result.tokens_out > 0
    row = only_call()
    assert (row.tokens_in, row.tokens_out) == (result.tokens_in, result.tokens_out)


@pytest.mark.django_db
def test_model_is_explicit_then_kin_then_provider_default(fake_llm, fake_llm_provider):
    team = make_team()
    kin = KinFactory(team=team, name="Ada", model="kin-model")
    plain_kin = KinFactory(team=team, name="Bob")
    messages = [{"role": "user", "content": "hi"}]

    llm_chat(purpose="p", messages=messages, kin=kin, model="explicit-model", provider=fake_llm_provider)
    llm_chat(purpose="p", messages=messages, kin=kin, provider=fake_llm_provider)
    llm_chat(purpose="p", messages=messages, kin=plain_kin, provider=fake_llm_provider)

    assert [body["model"] for body in fake_llm.requests] == ["explicit-model", "kin-model", "fake-model"]
    rows = LLMCall.objects.order_by("id")
    assert [r.model for r in rows] == ["explicit-model", "kin-model", "fake-model"]
    # A call made for a kin is counted against the kin's team.
    assert {(r.team_id, r.kin_id is not None) for r in rows} == {(team.id, True)}


@pytest.mark.django_db
def test_embeddings_over_http_are_logged(fake_llm, fake_llm_provider):
    vectors = llm_embed(purpose="memory_index", texts=["deploy on tuesday", "lunch menu"],
                        provider=fake_llm_provider)

    assert len(vectors) == 2 and all(len(v) == 16 for v in vectors)
    assert fake_llm.requests_to("embeddings") == [
        {"model": "fake-embedding", "input": ["deploy on tuesday", "lunch menu"]}
    ]
    row = only_call()
    assert (row.kind, row.model, row.status, row.tokens_in) == ("embedding", "fake-embedding", "ok", 5)


@pytest.mark.django_db
def test_embedding_server_error_is_retried(fake_llm, fake_llm_provider):
    fake_llm.error(502, "bad gateway", endpoint="embeddings")

    assert len(llm_embed(purpose="memory_index", texts=["a"], provider=fake_llm_provider)) == 1
    assert only_call().attempts == 2


def test_fixed_delay_applies_to_every_answer():
    from tests.support.fake_openai import FakeOpenAIServer

    with FakeOpenAIServer(delay=0.2) as server:
        provider = provider_for(server, timeout=2)
        started = time.monotonic()
        result = provider.chat([{"role": "user", "content": "ping"}])
        assert time.monotonic() - started >= 0.2
        assert result.content == "echo: ping"


# --- scripted provider ----------------------------------------------------------------------


def test_scripted_provider_replays_in_order_and_records_calls():
    error = LLMHTTPError("boom", status_code=500, attempts=3)
    canned = ChatResult(content="canned", tool_calls=[], model="x", tokens_in=1, tokens_out=1,
                        finish_reason="stop", raw={})
    provider = ScriptedProvider([
        {"tool_calls": [{"name": "memory_search", "arguments": {"query": "q"}}]},
        "plain reply",
        canned,
        error,
    ])
    messages = [{"role": "user", "content": "hi"}]

    first = provider.chat(messages, tools=[SEARCH_TOOL])
    messages.append({"role": "assistant", "content": "mutated after the call"})
    second = provider.chat(messages, model="other-model")
    third = provider.chat(messages, json_mode=False)
    with pytest.raises(LLMHTTPError):
        provider.chat(messages)

    assert first.tool_calls[0].name == "memory_search"
    assert first.tool_calls[0].parsed_arguments() == {"query": "q"}
    assert first.finish_reason == "tool_calls"
    assert (second.content, second.model) == ("plain reply", "other-model")
    assert third is canned
    assert len(provider.calls) == 4
    assert provider.calls[0].messages == [{"role": "user", "content": "hi"}]  # copied, not aliased
    assert provider.calls[0].tools == [SEARCH_TOOL]
    assert provider.calls[1].model == "other-model"


def test_scripted_provider_says_when_the_script_runs_out():
    provider = ScriptedProvider(["only one"])
    provider.chat([{"role": "user", "content": "a"}])

    with pytest.raises(ScriptExhausted, match="ran out of replies at call 2"):
        provider.chat([{"role": "user", "content": "b"}])


def test_scripted_provider_enforces_json_in_json_mode():
    provider = ScriptedProvider(['{"a": 1}', "not json"])

    assert provider.chat([], json_mode=True).json() == {"a": 1}
    with pytest.raises(LLMBadResponse):
        provider.chat([], json_mode=True)


def test_scripted_embeddings_are_deterministic_unit_vectors():
    provider = ScriptedProvider()
    a1, a2, b = provider.embed(["deploy on Tuesday", "deploy on tuesday", "lunch menu"])

    assert a1 == a2
    assert len(a1) == 64
    assert sum(x * x for x in a1) == pytest.approx(1.0)
    cosine = sum(x * y for x, y in zip(a1, b, strict=True))
    assert cosine < 0.99


@pytest.mark.django_db
def test_provider_override_routes_gateway_calls():
    scripted = ScriptedProvider(["from the script"])

    with provider_override(scripted):
        result = llm_chat(purpose="kin_turn", messages=[{"role": "user", "content": "hi"}])

    assert result.content == "from the script"
    assert only_call().provider == "scripted"
    assert get_default_provider() is not scripted


@pytest.mark.django_db
def test_gateway_logs_a_failed_call_and_reraises():
    team = make_team()
    provider = ScriptedProvider([LLMHTTPError("endpoint said no", status_code=503, attempts=3)])

    with pytest.raises(LLMHTTPError):
        llm_chat(purpose="consolidate", messages=[{"role": "user", "content": "x"}], team=team, provider=provider)

    row = only_call()
    assert (row.purpose, row.status, row.error, row.attempts, row.team_id, row.model) == (
        "consolidate", "error", "endpoint said no", 3, team.id, "scripted-model"
    )


# --- offline provider and defaults ------------------------------------------------------------


@pytest.mark.django_db
def test_offline_provider_says_no_model_is_configured(settings):
    settings.LLM_BASE_URL = ""

    result = llm_chat(purpose="kin_turn", messages=[{"role": "user", "content": "hi"}], tools=[SEARCH_TOOL])

    assert "No language model is configured" in result.content
    assert "LLM_BASE_URL" in result.content
    assert result.tool_calls == []
    row = only_call()
    assert (row.provider, row.model, row.status) == ("offline", "offline", "ok")


def test_offline_provider_json_mode_and_embeddings():
    provider = OfflineProvider()

    answer = provider.chat([{"role": "user", "content": "hi"}], json_mode=True).json()
    assert "No language model is configured" in answer["error"]
    assert provider.supports_embeddings is False
    with pytest.raises(LLMError, match="LLM_BASE_URL"):
        provider.embed(["text"])


def test_default_provider_follows_settings(settings):
    settings.LLM_BASE_URL = ""
    assert isinstance(get_default_provider(), OfflineProvider)

    settings.LLM_BASE_URL = "http://127.0.0.1:9/v1/"
    settings.LLM_MODEL = "configured-model"
    provider = get_default_provider()
    assert isinstance(provider, OpenAICompatibleProvider)
    assert (provider.base_url, provider.model) == ("http://127.0.0.1:9/v1", "configured-model")
