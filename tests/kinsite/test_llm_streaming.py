"""Streamed chat answers over real HTTP against the fake server, through llm_chat (so the LLMCall row too)."""
import json

import pytest

from kinsite.llm.gateway import llm_chat
from kinsite.llm.replies import estimate_prompt_tokens
from kinsite.llm.types import LLMBadResponse, LLMError, LLMStreamInterrupted, ToolCall
from kinsite.models import LLMCall
from kinsite.tokencount import count_tokens

MESSAGES = [{"role": "user", "content": "When do we deploy?"}]


def only_call() -> LLMCall:
    calls = list(LLMCall.objects.all())
    assert len(calls) == 1, calls
    return calls[0]


def stream_chat(provider, deltas: list[str], **options):
    return llm_chat(purpose="kin_turn", messages=MESSAGES, provider=provider, on_delta=deltas.append, **options)


@pytest.mark.django_db
def test_pieces_arrive_in_order_and_join_to_the_content(fake_llm, fake_llm_provider):
    fake_llm.stream(pieces=["Deploys ", "happen on", " Tuesdays", "."])
    deltas: list[str] = []

    result = stream_chat(fake_llm_provider, deltas)

    assert deltas == ["Deploys ", "happen on", " Tuesdays", "."]
    assert result.content == "Deploys happen on Tuesdays."
    assert (result.finish_reason, result.tool_calls, result.attempts) == ("stop", [], 1)
    body = fake_llm.requests[0]
    assert (body["stream"], body["stream_options"]) == (True, {"include_usage": True})
    # role, four pieces, finish, usage, [DONE]; stamped in the order sent.
    sent_at = fake_llm.received[0].chunks_sent_at
    assert len(sent_at) == 8 and sent_at == sorted(sent_at)
    row = only_call()
    assert (row.status, row.attempts, row.tokens_out) == ("ok", 1, result.tokens_out)


@pytest.mark.django_db
def test_a_call_without_on_delta_is_not_streamed(fake_llm, fake_llm_provider):
    fake_llm.reply("whole answer")

    result = llm_chat(purpose="kin_turn", messages=MESSAGES, provider=fake_llm_provider)

    assert result.content == "whole answer"
    assert "stream" not in fake_llm.requests[0]
    assert fake_llm.received[0].chunks_sent_at == []


@pytest.mark.django_db
def test_the_first_piece_reaches_the_caller_before_the_rest_is_sent(fake_llm, fake_llm_provider):
    # The server sends the role chunk and the first piece, then waits until the callback lets it go on:
    # a client that buffered the answer would never see a piece and time out instead.
    resume = fake_llm.stream("first then the rest", hold_after=2)
    seen: list[tuple[str, int, bool]] = []

    def on_delta(piece: str) -> None:
        seen.append((piece, len(fake_llm.received[0].chunks_sent_at), resume.is_set()))
        resume.set()

    result = llm_chat(purpose="kin_turn", messages=MESSAGES, provider=fake_llm_provider, on_delta=on_delta)

    assert seen[0] == ("first", 2, False)
    assert [piece for piece, _, _ in seen] == ["first", " then", " the", " rest"]
    assert result.content == "first then the rest"


@pytest.mark.django_db
def test_tool_call_fragments_are_assembled_by_index(fake_llm, fake_llm_provider):
    fake_llm.stream("Let me look.", tool_calls=[
        {"name": "memory_search", "arguments": {"query": "deploy day and rollback plan"}, "id": "call_a"},
        {"name": "memory_add", "arguments": {"content": "asked about deploys", "kind": "fact"}, "id": "call_b"},
    ])
    deltas: list[str] = []

    result = stream_chat(fake_llm_provider, deltas)

    assert result.tool_calls == [
        ToolCall(id="call_a", name="memory_search", arguments='{"query": "deploy day and rollback plan"}'),
        ToolCall(id="call_b", name="memory_add", arguments='{"content": "asked about deploys", "kind": "fact"}'),
    ]
    assert result.finish_reason == "tool_calls"
    assert "".join(deltas) == result.content == "Let me look."
    # The arguments came in 8-character pieces: many chunks, one result per call.
    assert result.raw["chunks"] > 12


@pytest.mark.django_db
def test_queued_tool_call_streams_without_text(fake_llm, fake_llm_provider):
    fake_llm.tool_call("memory_search", {"query": "deploy day"}, call_id="call_abc")
    deltas: list[str] = []

    result = stream_chat(fake_llm_provider, deltas)

    assert deltas == []
    assert result.content is None
    assert result.tool_calls == [ToolCall(id="call_abc", name="memory_search", arguments='{"query": "deploy day"}')]
    assert result.as_assistant_message()["tool_calls"][0]["function"]["name"] == "memory_search"


@pytest.mark.django_db
def test_usage_comes_from_the_usage_chunk(fake_llm, fake_llm_provider):
    fake_llm.stream("short answer", usage={"prompt_tokens": 321, "completion_tokens": 45, "total_tokens": 366})

    result = stream_chat(fake_llm_provider, [])

    assert (result.tokens_in, result.tokens_out) == (321, 45)
    row = only_call()
    assert (row.tokens_in, row.tokens_out) == (321, 45)


@pytest.mark.django_db
def test_usage_is_estimated_without_a_usage_chunk(fake_llm, fake_llm_provider):
    fake_llm.stream("an answer of several words", send_usage=False)

    result = stream_chat(fake_llm_provider, [])

    assert result.tokens_in == estimate_prompt_tokens(MESSAGES) > 0
    assert result.tokens_out == count_tokens("an answer of several words") > 0
    assert result.raw["usage"] is None
    row = only_call()
    assert (row.tokens_in, row.tokens_out) == (result.tokens_in, result.tokens_out)


@pytest.mark.django_db
def test_server_error_before_the_first_chunk_is_retried_without_duplicate_text(fake_llm, fake_llm_provider):
    fake_llm.error(503, "overloaded")
    fake_llm.stream("Hello world")
    deltas: list[str] = []

    result = stream_chat(fake_llm_provider, deltas)

    assert deltas == ["Hello", " world"]
    assert (result.content, result.attempts) == ("Hello world", 2)
    assert len(fake_llm.requests) == 2
    row = only_call()
    assert (row.status, row.attempts) == ("ok", 2)


@pytest.mark.django_db
def test_a_drop_before_any_text_went_out_is_retried(fake_llm, fake_llm_provider):
    fake_llm.stream("never shown", break_after=1)  # only the role chunk, then the connection drops
    fake_llm.stream("second try")
    deltas: list[str] = []

    result = stream_chat(fake_llm_provider, deltas)

    assert deltas == ["second", " try"]
    assert result.attempts == 2
    assert only_call().attempts == 2


@pytest.mark.django_db
def test_a_drop_after_some_text_is_not_retried(fake_llm, fake_llm_provider):
    fake_llm.stream("partial answer that breaks", break_after=3)  # role, "partial", " answer"
    fake_llm.reply("never sent")
    deltas: list[str] = []

    with pytest.raises(LLMStreamInterrupted) as caught:
        stream_chat(fake_llm_provider, deltas)

    message = str(caught.value)
    assert message.startswith(
        "The streamed answer from the model endpoint at …/chat/completions broke off after 14 characters: "
        "the connection failed: "
    )
    assert "127.0.0.1" not in message
    assert caught.value.code == "llm_stream_interrupted"
    assert caught.value.details == {"delivered_chars": 14}
    assert deltas == ["partial", " answer"]
    assert len(fake_llm.requests) == 1
    assert fake_llm.pending() == 1
    row = only_call()
    assert (row.status, row.attempts, row.error) == ("error", 1, message)


@pytest.mark.django_db
def test_silence_between_chunks_after_some_text_breaks_the_stream(fake_llm, fake_llm_provider):
    resume = fake_llm.stream("stalls after one word", hold_after=2)  # never resumed: the read times out
    deltas: list[str] = []

    with pytest.raises(LLMStreamInterrupted, match=r"after 6 characters: the endpoint sent nothing for 0.3 s\.$"):
        stream_chat(fake_llm_provider, deltas)

    resume.set()
    assert deltas == ["stalls"]
    assert len(fake_llm.requests) == 1
    assert only_call().status == "error"


@pytest.mark.django_db
def test_an_error_object_in_the_stream_breaks_it(fake_llm, fake_llm_provider):
    fake_llm.stream("half an answer", break_after=3, break_with="error")
    deltas: list[str] = []

    broke = r"after 7 characters: the endpoint sent an error: fake stream error\.$"
    with pytest.raises(LLMStreamInterrupted, match=broke):
        stream_chat(fake_llm_provider, deltas)

    assert "".join(deltas) == "half an"
    assert len(fake_llm.requests) == 1
    row = only_call()
    assert row.status == "error" and "fake stream error" in row.error


@pytest.mark.django_db
def test_an_error_object_before_any_text_is_an_llm_error(fake_llm, fake_llm_provider):
    fake_llm.stream("never shown", break_after=1, break_with="error")
    fake_llm.reply("never sent")

    with pytest.raises(LLMError) as caught:
        stream_chat(fake_llm_provider, [])

    assert not isinstance(caught.value, LLMStreamInterrupted)
    assert str(caught.value) == (
        "The streamed answer from the model endpoint at …/chat/completions failed: "
        "the endpoint sent an error: fake stream error."
    )
    assert len(fake_llm.requests) == 1


@pytest.mark.django_db
def test_a_malformed_chunk_breaks_the_stream(fake_llm, fake_llm_provider):
    fake_llm.stream("half an answer", break_after=2, break_with="garbage")
    deltas: list[str] = []

    with pytest.raises(LLMStreamInterrupted, match=r"after 4 characters: the endpoint sent a chunk that is not a JSON"):
        stream_chat(fake_llm_provider, deltas)

    assert deltas == ["half"]
    assert only_call().status == "error"


@pytest.mark.django_db
def test_a_malformed_chunk_before_any_text_is_a_bad_response(fake_llm, fake_llm_provider):
    fake_llm.stream("never shown", break_after=1, break_with="garbage")

    with pytest.raises(LLMBadResponse, match="a chunk that is not a JSON object: '{oops'"):
        stream_chat(fake_llm_provider, [])

    assert len(fake_llm.requests) == 1


@pytest.mark.django_db
def test_a_plain_json_answer_to_a_stream_request_goes_out_in_one_piece(fake_llm, fake_llm_provider):
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "not streamed at all"},
                         "finish_reason": "stop"}], "usage": {"prompt_tokens": 9, "completion_tokens": 4}}
    fake_llm.raw(json.dumps(body), content_type="application/json")
    deltas: list[str] = []

    result = stream_chat(fake_llm_provider, deltas)

    assert deltas == ["not streamed at all"]
    assert (result.content, result.tokens_in, result.tokens_out) == ("not streamed at all", 9, 4)
    assert fake_llm.requests[0]["stream"] is True
    assert only_call().status == "ok"


@pytest.mark.django_db
def test_json_mode_answer_is_checked_at_the_end(fake_llm, fake_llm_provider):
    fake_llm.stream(pieces=['```json\n{"facts": ', '["deploys on Tuesday"]}', "\n```"])
    deltas: list[str] = []

    result = stream_chat(fake_llm_provider, deltas, json_mode=True)

    assert result.json() == {"facts": ["deploys on Tuesday"]}
    assert len(deltas) == 3
    assert fake_llm.requests[0]["response_format"] == {"type": "json_object"}


@pytest.mark.django_db
def test_json_mode_text_answer_fails_after_streaming(fake_llm, fake_llm_provider):
    fake_llm.stream("Sure! Deploys are on Tuesday.")
    deltas: list[str] = []

    with pytest.raises(LLMBadResponse, match="not JSON"):
        stream_chat(fake_llm_provider, deltas, json_mode=True)

    assert "".join(deltas) == "Sure! Deploys are on Tuesday."
    row = only_call()
    assert (row.status, row.attempts) == ("error", 1)
