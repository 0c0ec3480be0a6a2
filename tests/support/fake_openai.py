"""A local fake OpenAI-compatible HTTP server for end-to-end tests: scripted replies, errors and delays, no network.

    with FakeOpenAIServer() as server:
        server.tool_call("memory_search", {"query": "x"})
        server.reply("done")
        provider = OpenAICompatibleProvider(base_url=server.base_url, model="fake-model", ...)

Chat and embeddings have separate queues; an empty chat queue echoes the last
user message, an empty embeddings queue answers deterministic vectors.

Streaming: a chat request with "stream": true is answered as text/event-stream in
OpenAI's chunk format, whatever chat answer is queued (reply, json_answer, tool_call(s),
the echo, stall, hold; error and raw answer as they always do). The chunks, in order: a
role chunk, one chunk per content piece (the content cut into words), per tool call a
fragment with its id and name and then its arguments in 8-character pieces, a
finish_reason chunk, a usage chunk when the request has stream_options.include_usage,
and "data: [DONE]". stream() scripts one streamed answer in detail:

    resume = server.stream("Hello there", pieces=["Hel", "lo", " there"], chunk_delay=0.01,
                           hold_after=2, break_after=None, break_with="drop", send_usage=True)
    # hold_after=2: send the role chunk and the first piece, then wait until resume.set()
    server.stream("partial answer", break_after=3)            # drop the connection after 3 chunks
    server.stream("partial answer", break_after=3, break_with="error")    # an in-stream error object
    server.stream("partial answer", break_after=3, break_with="garbage")  # a chunk that is not JSON
    server.stream(tool_calls=[{"name": "memory_search", "arguments": {"query": "x"}}])

Chunk counts (hold_after, break_after) count every "data:" event sent, the role chunk
first. Each request's `chunks_sent_at` (in `received`) holds the time.monotonic() at
which each event was written, [DONE] included, so a benchmark can compare the model's
first token with the client's first delta. FakeOpenAIServer(chunk_delay=s) spaces the
chunks of every streamed answer.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CHAT = "chat"
EMBEDDINGS = "embeddings"
EMBEDDING_DIMENSIONS = 16


@dataclass
class ScriptedResponse:
    """One queued answer. `body` None with status 200 means: build the default answer for the request."""

    status: int = 200
    body: dict[str, Any] | str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    message: dict[str, Any] | None = None  # chat only: the assistant message to wrap in a completion
    finish_reason: str | None = None
    usage: dict[str, int] | None = None
    gate: threading.Event | None = None  # answer only once it is set (see FakeOpenAIServer.hold)
    # Streamed answers only (see FakeOpenAIServer.stream):
    pieces: list[str] | None = None  # the content's pieces; None: the content cut into words
    chunk_delay: float = 0.0  # seconds between chunks
    hold_after: int | None = None  # send this many chunks, then wait for `resume`
    resume: threading.Event | None = None
    break_after: int | None = None  # send this many chunks, then break the stream (`break_with`)
    break_with: str = "drop"  # "drop" the connection, send an "error" object, or "garbage" (not JSON)
    send_usage: bool = True  # the usage chunk, when the request asks for it


@dataclass
class ReceivedRequest:
    path: str
    headers: dict[str, str]
    body: Any
    # A streamed answer: time.monotonic() just before each "data:" event was written.
    chunks_sent_at: list[float] = field(default_factory=list)


class FakeOpenAIServer:
    def __init__(self, *, delay: float = 0.0, model: str = "fake-model", chunk_delay: float = 0.0):
        self.delay = delay  # a fixed extra delay before every answer (load tests)
        self.chunk_delay = chunk_delay  # a fixed extra delay between the chunks of every streamed answer
        self.model = model
        self.received: list[ReceivedRequest] = []
        self._queues: dict[str, deque[ScriptedResponse]] = {CHAT: deque(), EMBEDDINGS: deque()}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --

    def start(self) -> FakeOpenAIServer:
        handler = type("FakeOpenAIHandler", (_Handler,), {"fake": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        # A short poll interval so stop() (and every test's teardown) returns in milliseconds, not 0.5 s.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-openai", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # wakes handlers sleeping on a delay
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._httpd is not None, "the fake server is not started"
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def requests(self) -> list[Any]:
        """The JSON bodies received, in order (all endpoints); `received` also has paths and headers."""
        with self._lock:
            return [request.body for request in self.received]

    def requests_to(self, endpoint: str) -> list[Any]:
        with self._lock:
            return [r.body for r in self.received if r.path.rstrip("/").endswith(_PATHS[endpoint])]

    # -- scripting chat answers --

    def reply(self, text: str, *, delay: float = 0.0, usage: dict[str, int] | None = None) -> None:
        self._push(CHAT, ScriptedResponse(message={"role": "assistant", "content": text}, delay=delay, usage=usage))

    def json_answer(self, value: Any, *, delay: float = 0.0) -> None:
        self.reply(json.dumps(value), delay=delay)

    def tool_call(
        self, name: str, arguments: dict[str, Any] | str, *, content: str | None = None,
        call_id: str | None = None, delay: float = 0.0,
    ) -> None:
        self.tool_calls([{"name": name, "arguments": arguments, "id": call_id}], content=content, delay=delay)

    def tool_calls(self, calls: list[dict[str, Any]], *, content: str | None = None, delay: float = 0.0) -> None:
        """Several tool calls in one assistant turn: each {"name", "arguments", optional "id"}."""
        message = {"role": "assistant", "content": content, "tool_calls": _tool_call_parts(calls)}
        self._push(CHAT, ScriptedResponse(message=message, finish_reason="tool_calls", delay=delay))

    def stream(
        self, text: str | None = None, *, pieces: list[str] | None = None,
        tool_calls: list[dict[str, Any]] | None = None, delay: float = 0.0, chunk_delay: float = 0.0,
        hold_after: int | None = None, break_after: int | None = None, break_with: str = "drop",
        send_usage: bool = True, usage: dict[str, int] | None = None,
    ) -> threading.Event:
        """One streamed chat answer (see the module docstring): `text` or `pieces` (joined, the
        content), optional tool calls ({"name", "arguments", optional "id"}). Returns the event
        that releases a `hold_after` hold. A request without "stream" gets the same message whole."""
        if break_with not in ("drop", "error", "garbage"):
            raise ValueError(f"break_with must be drop, error or garbage, not {break_with!r}")
        content = "".join(pieces) if pieces is not None else text
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = _tool_call_parts(tool_calls)
        resume = threading.Event()
        self._push(CHAT, ScriptedResponse(
            message=message, finish_reason="tool_calls" if tool_calls else None, delay=delay, usage=usage,
            pieces=pieces, chunk_delay=chunk_delay, hold_after=hold_after, resume=resume,
            break_after=break_after, break_with=break_with, send_usage=send_usage,
        ))
        return resume

    # -- scripting failures (either endpoint) --

    def error(
        self, status: int, message: str = "", *, retry_after: float | str | None = None,
        endpoint: str = CHAT, delay: float = 0.0,
    ) -> None:
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
        body = {"error": {"message": message or f"fake error {status}", "type": "fake_error", "code": status}}
        self._push(endpoint, ScriptedResponse(status=status, body=body, headers=headers, delay=delay))

    def stall(self, seconds: float, *, endpoint: str = CHAT) -> None:
        """Sleep `seconds` before giving the default answer (to provoke client timeouts)."""
        self._push(endpoint, ScriptedResponse(delay=seconds))

    def hold(self, *, endpoint: str = CHAT) -> threading.Event:
        """Give the default answer only once the returned event is set (or the server stops):
        a call the test keeps in flight for as long as it needs, with no timing to guess."""
        gate = threading.Event()
        self._push(endpoint, ScriptedResponse(gate=gate))
        return gate

    def raw(self, body: str, *, status: int = 200, endpoint: str = CHAT, content_type: str = "text/plain") -> None:
        """Answer exactly this text, e.g. a body that is not JSON."""
        self._push(endpoint, ScriptedResponse(status=status, body=body, headers={"Content-Type": content_type}))

    # -- scripting embeddings --

    def embeddings(self, vectors: list[list[float]], *, delay: float = 0.0) -> None:
        data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
        body = {"object": "list", "data": data, "model": self.model, "usage": {"prompt_tokens": 1, "total_tokens": 1}}
        self._push(EMBEDDINGS, ScriptedResponse(body=body, delay=delay))

    def pending(self, endpoint: str = CHAT) -> int:
        with self._lock:
            return len(self._queues[endpoint])

    # -- internals --

    def _push(self, endpoint: str, response: ScriptedResponse) -> None:
        with self._lock:
            self._queues[endpoint].append(response)

    def _next(self, endpoint: str, request: ReceivedRequest) -> ScriptedResponse:
        with self._lock:
            self.received.append(request)
            queue = self._queues[endpoint]
            return queue.popleft() if queue else ScriptedResponse()

    def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._stopping.wait(seconds)

    def _chat_message(self, request: dict[str, Any], scripted: ScriptedResponse) -> dict[str, Any]:
        return scripted.message or {"role": "assistant", "content": f"echo: {_last_user_text(request)}"}

    def _chat_usage(self, request: dict[str, Any], scripted: ScriptedResponse) -> dict[str, int]:
        message = self._chat_message(request, scripted)
        reply_text = (message.get("content") or "") + "".join(
            call["function"]["arguments"] for call in message.get("tool_calls") or []
        )
        prompt_tokens = sum(_rough_tokens(m.get("content")) for m in request.get("messages") or [])
        completion_tokens = _rough_tokens(reply_text)
        return scripted.usage or {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }

    def _chat_body(self, request: dict[str, Any], scripted: ScriptedResponse) -> dict[str, Any]:
        message = self._chat_message(request, scripted)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:16]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.get("model") or self.model,
            "choices": [
                {"index": 0, "message": message, "finish_reason": scripted.finish_reason or "stop", "logprobs": None}
            ],
            "usage": self._chat_usage(request, scripted),
        }

    def _chat_chunks(self, request: dict[str, Any], scripted: ScriptedResponse) -> list[dict[str, Any]]:
        """The "data:" events of a streamed answer, in OpenAI's chunk format ([DONE] not included)."""
        message = self._chat_message(request, scripted)
        head = {"id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": request.get("model") or self.model}

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}

        content = message.get("content")
        chunks = [chunk({"role": "assistant", "content": "" if isinstance(content, str) else None})]
        pieces = scripted.pieces if scripted.pieces is not None else _WORDS.findall(content or "")
        chunks += [chunk({"content": piece}) for piece in pieces]
        for index, call in enumerate(message.get("tool_calls") or []):
            function = call["function"]
            chunks.append(chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                                 "function": {"name": function["name"], "arguments": ""}}]}))
            arguments = function["arguments"]
            chunks += [
                chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments[at:at + 8]}}]})
                for at in range(0, len(arguments), 8)
            ]
        chunks.append(chunk({}, scripted.finish_reason or "stop"))
        if (request.get("stream_options") or {}).get("include_usage") and scripted.send_usage:
            chunks.append({**head, "choices": [], "usage": self._chat_usage(request, scripted)})
        return chunks

    def _embeddings_body(self, request: dict[str, Any]) -> dict[str, Any]:
        texts = request.get("input") or []
        if isinstance(texts, str):
            texts = [texts]
        tokens = sum(_rough_tokens(t) for t in texts)
        return {
            "object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": _vector(t)} for i, t in enumerate(texts)],
            "model": request.get("model") or self.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }


_PATHS = {CHAT: "/chat/completions", EMBEDDINGS: "/embeddings"}


class _Handler(BaseHTTPRequestHandler):
    fake: FakeOpenAIServer  # set on the per-server subclass
    protocol_version = "HTTP/1.1"  # keep-alive, like real endpoints, so clients reuse connections

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw_body = self.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw_body or b"null")
        except ValueError:
            body = raw_body.decode(errors="replace")
        path = self.path.split("?")[0].rstrip("/")
        endpoint = next((name for name, suffix in _PATHS.items() if path.endswith(suffix)), None)
        request = ReceivedRequest(path=self.path, headers=dict(self.headers.items()), body=body)
        if endpoint is None:
            with self.fake._lock:
                self.fake.received.append(request)
            self._send(404, {"error": {"message": f"Unknown path {self.path}", "type": "invalid_request_error"}}, {})
            return

        scripted = self.fake._next(endpoint, request)
        self.fake._sleep(self.fake.delay + scripted.delay)
        while scripted.gate is not None and not scripted.gate.wait(0.05) and not self.fake._stopping.is_set():
            pass
        if self.fake._stopping.is_set():
            self.close_connection = True
            return
        if scripted.body is not None or scripted.status != 200:
            out = scripted.body if scripted.body is not None else {"error": {"message": "fake error"}}
        elif endpoint == CHAT and isinstance(body, dict) and body.get("stream") is True:
            self._stream(body, scripted, request)
            return
        elif endpoint == CHAT:
            out = self.fake._chat_body(body if isinstance(body, dict) else {}, scripted)
        else:
            out = self.fake._embeddings_body(body if isinstance(body, dict) else {})
        self._send(scripted.status, out, scripted.headers)

    def _stream(self, body: dict[str, Any], scripted: ScriptedResponse, request: ReceivedRequest) -> None:
        fake = self.fake
        events = [f"data: {json.dumps(chunk)}\n\n" for chunk in fake._chat_chunks(body, scripted)]
        events.append("data: [DONE]\n\n")
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            for name, value in scripted.headers.items():
                if name.lower() != "content-type":
                    self.send_header(name, value)
            self.end_headers()
            for number, event in enumerate(events):
                if number == scripted.hold_after and scripted.resume is not None:
                    while not scripted.resume.wait(0.05) and not fake._stopping.is_set():
                        pass
                if number:
                    fake._sleep(fake.chunk_delay + scripted.chunk_delay)
                if fake._stopping.is_set():
                    self.close_connection = True
                    return
                if number == scripted.break_after:
                    if scripted.break_with == "drop":
                        # No last chunk: the client sees the body end mid-stream, as when a server dies.
                        self.close_connection = True
                        return
                    error = {"error": {"message": "fake stream error", "type": "server_error", "code": None}}
                    event = f"data: {json.dumps(error)}\n\n" if scripted.break_with == "error" else "data: {oops\n\n"
                    request.chunks_sent_at.append(time.monotonic())
                    self._write_chunk(event.encode())
                    break
                # Before the write, so a client reacting to this chunk already finds its time here.
                request.chunks_sent_at.append(time.monotonic())
                self._write_chunk(event.encode())
            self._write_chunk(b"")  # the last chunk: the body is complete
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _send(self, status: int, body: dict[str, Any] | str, headers: dict[str, str]) -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", headers.get("Content-Type", "application/json"))
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                if name.lower() != "content-type":
                    self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test); nothing to tell it

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean


def _tool_call_parts(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "id": call.get("id") or f"call_{uuid.uuid4().hex[:12]}",
            "type": "function",
            "function": {
                "name": call["name"],
                "arguments": call["arguments"] if isinstance(call["arguments"], str) else json.dumps(call["arguments"]),
            },
        }
        for call in calls
    ]


_WORDS = re.compile(r"\s*\S+|\s+")  # word pieces that join back into the text


def _last_user_text(request: dict[str, Any]) -> str:
    for message in reversed(request.get("messages") or []):
        if message.get("role") == "user":
            return str(message.get("content") or "")
    return ""


def _rough_tokens(text: Any) -> int:
    return len(str(text).split()) if text else 0


def _vector(text: str) -> list[float]:
    vector = [0.0] * EMBEDDING_DIMENSIONS
    for word in str(text).lower().split():
        vector[int(hashlib.md5(word.encode()).hexdigest(), 16) % EMBEDDING_DIMENSIONS] += 1.0
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]


def fake_openai_server(*, delay: float = 0.0, chunk_delay: float = 0.0) -> Iterator[FakeOpenAIServer]:
    """Generator for a pytest fixture: `yield from fake_openai_server()` gives a started server."""
    with FakeOpenAIServer(delay=delay, chunk_delay=chunk_delay) as server:
        yield server


def main() -> None:
    """Serve the fake on its own (scripts/check-fresh-install runs it beside real processes):
    `python tests/support/fake_openai.py --port-file PATH` writes the chosen port to PATH
    and answers until it is terminated. Only the standard library, so any Python runs it."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--port-file", required=True, help="where to write the port the server listens on")
    args = parser.parse_args()
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    with FakeOpenAIServer() as server:
        with open(args.port_file, "w") as handle:
            handle.write(str(server.port))
        stopped.wait()


if __name__ == "__main__":
    main()
