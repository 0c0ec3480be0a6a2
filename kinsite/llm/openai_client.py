"""The OpenAI-compatible HTTP client: chat (plain or streamed) and embeddings, with retries."""
from __future__ import annotations

import contextlib
import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from kinsite.llm.replies import check_json_answer, estimate_prompt_tokens, estimate_reply_tokens, normalize_tools
from kinsite.llm.types import (
    ChatResult,
    DeltaSink,
    EmbeddingResult,
    LLMBadResponse,
    LLMError,
    LLMHTTPError,
    LLMStreamInterrupted,
    LLMTimeout,
    Message,
    ToolCall,
)
from kinsite.tokencount import count_tokens

logger = logging.getLogger(__name__)

RETRY_AFTER_CAP_SECONDS = 30.0
# Rate limits and server errors are worth another try; any other 4xx will fail the same way again.
RETRYABLE_STATUSES = frozenset({429}) | frozenset(range(500, 600))

T = TypeVar("T")


class OpenAICompatibleProvider:
    """Any endpoint speaking the OpenAI chat/embeddings API (OpenAI, vLLM, Ollama, llama.cpp, LM Studio)."""

    name = "openai"

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str = "",
        model: str,
        embedding_model: str = "",
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff: float = 1.0,
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.embedding_model = embedding_model
        self.timeout = timeout
        self.max_retries = max(0, max_retries)  # retries after the first attempt
        self.backoff = backoff
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        # One client per provider so connections are reused between calls.
        self._client = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout))

    @property
    def supports_embeddings(self) -> bool:
        return bool(self.embedding_model)

    def chat(
        self,
        messages: list[Message],
        *,
        tools: list[dict[str, Any]] | None = None,
        json_mode: bool = False,
        model: str | None = None,
        temperature: float | None = None,
        on_delta: DeltaSink | None = None,
    ) -> ChatResult:
        """One chat completion. With on_delta the answer is streamed (server-sent events): each piece of
        text goes to on_delta as its chunk arrives; failures are retried only until a piece went out,
        after that they raise LLMStreamInterrupted."""
        model = model or self.model
        payload: dict[str, Any] = {"model": model, "messages": messages}
        if tools:
            payload["tools"] = normalize_tools(tools)
        if json_mode:
            payload["response_format"] = {"type": "json_object"}
        if temperature is not None:
            payload["temperature"] = temperature
        with self._logged("/chat/completions") as url:
            if on_delta is None:
                body, attempts = self._post(url, payload)
                return self._chat_result(body, attempts, messages=messages, model=model, json_mode=json_mode,
                                         where=self._where(url))
            payload["stream"] = True
            payload["stream_options"] = {"include_usage": True}
            reader = _StreamReader(self, url, on_delta, messages=messages, model=model, json_mode=json_mode)
            return self._request(url, payload, reader.read, stream=True)

    def _chat_result(self, body, attempts, *, messages, model, json_mode, where: str) -> ChatResult:
        try:
            choice = body["choices"][0]
            message = choice["message"]
            content = message.get("content")
            raw_calls = message.get("tool_calls") or []
            tool_calls = [self._parse_tool_call(raw, index) for index, raw in enumerate(raw_calls)]
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise LLMBadResponse(
                f"The model endpoint at {where} answered without a usable choice ({exc!r}): "
                f"{self._redact(json.dumps(body)[:300])}",
                attempts=attempts,
            ) from exc
        return self._answer(
            content, tool_calls, usage=body.get("usage"), finish_reason=choice.get("finish_reason"), raw=body,
            attempts=attempts, messages=messages, model=model, json_mode=json_mode, where=where,
        )

    def _answer(self, content, tool_calls, *, usage, finish_reason, raw, attempts, messages, model, json_mode,
                where: str) -> ChatResult:
        """The ChatResult of a streamed or plain answer: a json_mode answer checked, usage estimated when missing."""
        if json_mode and not tool_calls:
            try:
                content = check_json_answer(content, source=f"The model at {where}")
            except LLMBadResponse as exc:
                exc.attempts = attempts
                raise
        usage = usage if isinstance(usage, dict) else {}
        return ChatResult(
            content=content,
            tool_calls=tool_calls,
            model=model,
            tokens_in=_int_or(usage.get("prompt_tokens"), lambda: estimate_prompt_tokens(messages)),
            tokens_out=_int_or(usage.get("completion_tokens"), lambda: estimate_reply_tokens(content, tool_calls)),
            finish_reason=finish_reason,
            raw=raw,
            attempts=attempts,
        )

    def embed(self, texts: list[str], *, model: str | None = None) -> list[list[float]]:
        return self.embed_result(texts, model=model).vectors

    def embed_result(self, texts: list[str], *, model: str | None = None) -> EmbeddingResult:
        model = model or self.embedding_model
        if not model:
            raise LLMError("No embedding model is configured: set LLM_EMBEDDING_MODEL to use embeddings.")
        if not texts:
            return EmbeddingResult(vectors=[], model=model, tokens_in=0, attempts=0)
        with self._logged("/embeddings") as url:
            body, attempts = self._post(url, {"model": model, "input": texts})
            try:
                rows = sorted(body["data"], key=lambda row: row.get("index", 0))
                vectors = [[float(x) for x in row["embedding"]] for row in rows]
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise LLMBadResponse(
                    f"The embeddings endpoint at {self._where(url)} answered without usable vectors ({exc!r}).",
                    attempts=attempts,
                ) from exc
            if len(vectors) != len(texts):
                raise LLMBadResponse(
                    f"The embeddings endpoint at {self._where(url)} returned {len(vectors)} vectors "
                    f"for {len(texts)} texts.",
                    attempts=attempts,
                )
        usage = body.get("usage") or {}
        tokens_in = _int_or(usage.get("prompt_tokens"), lambda: sum(count_tokens(t) for t in texts))
        return EmbeddingResult(vectors=vectors, model=model, tokens_in=tokens_in, attempts=attempts)

    def close(self) -> None:
        self._client.close()

    # -- transport --

    @contextlib.contextmanager
    def _logged(self, path: str) -> Iterator[str]:
        """The endpoint's URL for one call, logged with a failure. The error itself names only the
        path: it reaches API bodies and the dashboard, and where the model lives is the operator's."""
        url = f"{self.base_url}{path}"
        try:
            yield url
        except LLMError as exc:
            logger.warning("Model call to %s failed: %s", url, exc.message)
            raise

    def _redact(self, text: str) -> str:
        """Text from the endpoint or the network library, without the endpoint's address (a proxy
        may echo it in its error)."""
        if not self.base_url:
            return text
        url = httpx.URL(self.base_url)
        text = text.replace(self.base_url, "…")
        # Then host:port and the bare host, as whole names only ("llm" the host, not "llm_error").
        for name in (url.netloc.decode("ascii", "replace"), url.host):
            if name:
                text = re.sub(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", "…", text)
        return text

    def _post(self, url: str, payload: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """POST with bounded retries; returns the decoded body and the number of attempts made."""
        return self._request(url, payload, lambda response, attempt: (self._json_body(url, response, attempt), attempt))

    def _request(self, url: str, payload: dict[str, Any], read: Callable[[httpx.Response, int], T], *,
                 stream: bool = False) -> T:
        """POST with bounded retries; `read(response, attempt)` turns a 2xx answer into the result.
        Retried: 429/5xx, connect errors, timeouts and network errors `read` lets through (a
        streamed read only until text went out); an LLMError from `read` never is."""
        max_attempts = self.max_retries + 1
        for attempt in range(1, max_attempts + 1):
            last = attempt == max_attempts
            try:
                # send(stream=True) rather than client.stream(): the same request, but the retry
                # loop decides when the response is done with.
                request = self._client.build_request("POST", url, json=payload)
                response = self._client.send(request, stream=stream)
                try:
                    if response.status_code >= 400:
                        response.read()  # the error text (already read when not streaming)
                        retryable = response.status_code in RETRYABLE_STATUSES
                        if retryable and not last:
                            self._sleep(self._retry_delay(response, attempt))
                            continue
                        raise LLMHTTPError(
                            f"The model endpoint at {self._where(url)} answered HTTP {response.status_code}: "
                            f"{self._redact(_error_text(response))} ({_attempts(attempt)}).",
                            status_code=response.status_code,
                            attempts=attempt,
                        )
                    return read(response, attempt)
                finally:
                    response.close()
            except httpx.TimeoutException as exc:
                if last:
                    raise LLMTimeout(
                        f"The model endpoint at {self._where(url)} did not answer within {self.timeout:g} s "
                        f"({_attempts(attempt)}).",
                        attempts=attempt,
                    ) from exc
                self._sleep(self._backoff_delay(attempt))
            except httpx.TransportError as exc:
                if last:
                    raise LLMError(
                        f"Could not reach the model endpoint at {self._where(url)}: "
                        f"{self._redact(str(exc)) or type(exc).__name__} "
                        f"({_attempts(attempt)}).",
                        attempts=attempt,
                    ) from exc
                self._sleep(self._backoff_delay(attempt))
        raise AssertionError("unreachable: the loop returns or raises on its last attempt")

    def _json_body(self, url: str, response: httpx.Response, attempt: int) -> dict[str, Any]:
        try:
            body = response.json()
        except ValueError as exc:
            raise LLMBadResponse(
                f"The model endpoint at {self._where(url)} answered with a body that is not JSON: "
                f"{self._redact(repr(response.text[:200]))}",
                attempts=attempt,
            ) from exc
        if not isinstance(body, dict):
            raise LLMBadResponse(
                f"The model endpoint at {self._where(url)} answered with JSON that is not an object: "
                f"{self._redact(repr(response.text[:200]))}",
                attempts=attempt,
            )
        return body

    def _where(self, url: str) -> str:
        return "…" + url.removeprefix(self.base_url)  # "…/chat/completions"

    def _backoff_delay(self, attempt: int) -> float:
        return self.backoff * (2 ** (attempt - 1))

    def _retry_delay(self, response: httpx.Response, attempt: int) -> float:
        retry_after = response.headers.get("Retry-After")
        if retry_after:
            try:
                return min(max(float(retry_after), 0.0), RETRY_AFTER_CAP_SECONDS)
            except ValueError:
                pass  # an HTTP-date: fall back to our own backoff rather than parse dates
        return self._backoff_delay(attempt)

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def _parse_tool_call(self, raw: dict[str, Any], index: int) -> ToolCall:
        function = raw["function"]
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            # Some servers send the arguments as an object instead of a JSON string.
            arguments = json.dumps(arguments if arguments is not None else {})
        return ToolCall(id=raw.get("id") or f"call_{index}", name=function["name"], arguments=arguments)


@dataclass
class _StreamedAnswer:
    """What one attempt's stream has brought so far."""

    content: list[str] | None = None  # None until a content field arrives (a tool-call answer has none)
    calls: dict[Any, dict[str, Any]] = field(default_factory=dict)  # by the fragments' index, in order of arrival
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    done: bool = False  # "data: [DONE]" arrived
    chunks: int = 0
    id: str | None = None


class _StreamReader:
    """Reads a streamed chat answer (OpenAI's chunk format over server-sent events): each piece
    of text goes to on_delta as it arrives; the result is what the unstreamed answer would give."""

    def __init__(self, provider: OpenAICompatibleProvider, url: str, on_delta: DeltaSink, *,
                 messages: list[Message], model: str, json_mode: bool):
        self.provider = provider
        self.url = url
        self.on_delta = on_delta
        self.messages = messages
        self.model = model
        self.json_mode = json_mode
        # Characters passed to on_delta. Only an attempt that delivered nothing may be retried,
        # so at most one attempt ever delivers.
        self.delivered = 0

    def read(self, response: httpx.Response, attempt: int) -> ChatResult:
        if response.headers.get("Content-Type", "").split(";")[0].strip().lower() == "application/json":
            return self._read_plain(response, attempt)
        answer = _StreamedAnswer()
        try:
            # Read to the end even after [DONE], so the connection goes back to the pool.
            for line in response.iter_lines():
                if not line.startswith("data:") or answer.done:
                    continue  # blank separators, comments (": keep-alive"), event:/id: fields
                data = line[5:].strip()
                if data == "[DONE]":
                    answer.done = True
                    continue
                piece = self._take(answer, data, attempt)
                if piece:
                    self.delivered += len(piece)
                    self.on_delta(piece)
        except httpx.TransportError as exc:
            if not self.delivered:
                raise  # nothing went out yet: the provider's retry policy decides
            if isinstance(exc, httpx.TimeoutException):
                reason = f"the endpoint sent nothing for {self.provider.timeout:g} s"
            else:
                reason = f"the connection failed: {self.provider._redact(str(exc)) or type(exc).__name__}"
            raise self._failure(reason, attempt) from exc
        if not answer.done and answer.finish_reason is None:
            raise self._failure("the stream ended before the answer was complete", attempt)
        return self._result(answer, attempt)

    def _read_plain(self, response: httpx.Response, attempt: int) -> ChatResult:
        """An endpoint that ignores "stream" answers one JSON completion: its text goes out in one piece."""
        response.read()
        body = self.provider._json_body(self.url, response, attempt)
        result = self.provider._chat_result(body, attempt, messages=self.messages, model=self.model,
                                            json_mode=self.json_mode, where=self.provider._where(self.url))
        if result.content:
            self.delivered += len(result.content)
            self.on_delta(result.content)
        return result

    def _take(self, answer: _StreamedAnswer, data: str, attempt: int) -> str:
        """Fold one chunk into the answer; returns its piece of text ("" when it has none)."""
        try:
            chunk = json.loads(data)
        except ValueError:
            chunk = None
        if not isinstance(chunk, dict):
            snippet = self.provider._redact(repr(data[:200]))
            raise self._failure(f"the endpoint sent a chunk that is not a JSON object: {snippet}", attempt)
        if chunk.get("error"):
            # Some servers (vLLM, llama.cpp, proxies) report a failure mid-answer as an error chunk.
            message = self.provider._redact(_error_message(chunk) or json.dumps(chunk)[:300])
            raise self._failure(f"the endpoint sent an error: {message}", attempt, kind=LLMError)
        answer.chunks += 1
        answer.id = answer.id or chunk.get("id")
        if isinstance(chunk.get("usage"), dict):
            answer.usage = chunk["usage"]  # the last chunk's, with stream_options.include_usage
        try:
            if not chunk.get("choices"):
                return ""
            choice = chunk["choices"][0]
            answer.finish_reason = choice.get("finish_reason") or answer.finish_reason
            delta = choice.get("delta") or {}
            for position, part in enumerate(delta.get("tool_calls") or []):
                # id and name come in a call's first fragment, its arguments in pieces after it.
                call = answer.calls.setdefault(part.get("index", position), {"id": "", "name": "", "arguments": []})
                function = part.get("function") or {}
                call["id"] = call["id"] or part.get("id") or ""
                call["name"] = call["name"] or function.get("name") or ""
                arguments = function.get("arguments")
                if arguments is not None:
                    call["arguments"].append(arguments if isinstance(arguments, str) else json.dumps(arguments))
            piece = delta.get("content")
            if piece is not None and not isinstance(piece, str):
                raise TypeError(f"content is a {type(piece).__name__}")
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            snippet = self.provider._redact(data[:200])
            raise self._failure(f"the endpoint sent a chunk without a usable choice ({exc!r}): {snippet}",
                                attempt) from exc
        if piece is None:
            return ""
        if answer.content is None:
            answer.content = []
        answer.content.append(piece)
        return piece

    def _result(self, answer: _StreamedAnswer, attempt: int) -> ChatResult:
        tool_calls = []
        for position, call in enumerate(answer.calls.values()):
            if not call["name"]:
                raise self._failure("the endpoint sent a tool call without a name", attempt)
            arguments = "".join(call["arguments"]) if call["arguments"] else "{}"
            tool_calls.append(ToolCall(id=call["id"] or f"call_{position}", name=call["name"], arguments=arguments))
        content = "".join(answer.content) if answer.content is not None else None
        # A summary, not every chunk: the text is in content.
        raw = {"streamed": True, "id": answer.id, "chunks": answer.chunks, "usage": answer.usage}
        return self.provider._answer(
            content, tool_calls, usage=answer.usage, finish_reason=answer.finish_reason, raw=raw, attempts=attempt,
            messages=self.messages, model=self.model, json_mode=self.json_mode,
            where=self.provider._where(self.url),
        )

    def _failure(self, reason: str, attempt: int, *, kind: type[LLMError] = LLMBadResponse) -> LLMError:
        """The error for a stream gone wrong: once text went out, LLMStreamInterrupted (never retried)."""
        where = self.provider._where(self.url)
        if self.delivered:
            return LLMStreamInterrupted(
                f"The streamed answer from the model endpoint at {where} broke off after "
                f"{self.delivered} characters: {reason}.",
                delivered_chars=self.delivered,
                attempts=attempt,
            )
        return kind(f"The streamed answer from the model endpoint at {where} failed: {reason}.", attempts=attempt)


def _int_or(value: Any, estimate) -> int:
    return value if isinstance(value, int) and value >= 0 else estimate()


def _attempts(count: int) -> str:
    return f"{count} attempt" if count == 1 else f"{count} attempts"


def _error_text(response: httpx.Response) -> str:
    """The endpoint's own error message: OpenAI's {"error": {"message"}} or whatever text it sent."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    return (_error_message(body) if isinstance(body, dict) else "") or response.text.strip()[:500]


def _error_message(body: dict[str, Any]) -> str:
    """OpenAI's {"error": {"message"}} or the other shapes servers use; "" when there is none."""
    error = body.get("error")
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])[:500]
    if isinstance(error, str):
        return error[:500]
    if body.get("detail"):
        return str(body["detail"])[:500]
    if body.get("message"):
        return str(body["message"])[:500]
    return ""

