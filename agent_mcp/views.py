"""POST /mcp/: the MCP server over streamable HTTP, as one Django async view.

A Django view rather than the SDK's Starlette app mounted in kinsite/asgi.py, so the URL works
under both ASGI and `runserver` and passes through Django's middleware like any other. The SDK
runs stateless with JSON responses, so any web process can answer any request. The view
authenticates the Bearer token as the API does and hands the SDK an ASGI scope carrying the
token's principal.
"""
import anyio
from asgiref.sync import sync_to_async
from django.core.exceptions import RequestDataTooBig
from django.http import HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from rest_framework import exceptions

from agent_mcp.server import SCOPE_CALLER_KEY, mcp_server
from kinsite.api.auth import BearerTokenAuthentication, TokenPrincipal
from kinsite.api.errors import error_body

# Hop-by-hop and length headers: Django sets its own for the body it sends.
_SKIPPED_HEADERS = {b"content-length", b"connection", b"transfer-encoding", b"keep-alive"}


def _unauthorized(code: str, message: str) -> JsonResponse:
    response = JsonResponse(error_body(code, message), status=401)
    response["WWW-Authenticate"] = BearerTokenAuthentication().authenticate_header(None)
    return response


def _authenticate(request) -> TokenPrincipal | JsonResponse:
    """The token's principal, or the 401 the API would answer (the API's error shape, docs/api.md)."""
    try:
        authenticated = BearerTokenAuthentication().authenticate(request)
    except exceptions.AuthenticationFailed as exc:
        return _unauthorized("authentication_failed", str(exc.detail))
    if authenticated is None:
        return _unauthorized("not_authenticated", "Authentication credentials were not provided.")
    return authenticated[0]


def _asgi_scope(request, caller: TokenPrincipal) -> dict:
    headers = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in request.headers.items()]
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": request.scheme,
        "path": request.path,
        "raw_path": request.path.encode(),
        "root_path": "",
        "query_string": request.META.get("QUERY_STRING", "").encode("latin-1"),
        "headers": headers,
        "client": (request.META.get("REMOTE_ADDR", ""), 0),
        "server": (request.META.get("SERVER_NAME", ""), int(request.META.get("SERVER_PORT") or 0)),
        "state": {},
        SCOPE_CALLER_KEY: caller,
    }


async def _answer(scope: dict, body: bytes) -> HttpResponse:
    """Run one request through the SDK and collect its answer, buffered whole (JSON mode
    answers with one body)."""
    answered = anyio.Event()
    sent_body = False
    status, headers, chunks = 500, [], []

    async def receive():
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}
        # Asked again: the SDK is listening for a disconnect, which comes once it has answered.
        await answered.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status, headers = message["status"], message.get("headers", [])
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                answered.set()

    # A manager per request: stateless, it holds nothing between requests. It serves the
    # MCPServer's private low-level Server, as the SDK's own mcp.client.Client does.
    manager = StreamableHTTPSessionManager(app=mcp_server._lowlevel_server, json_response=True, stateless=True)
    try:
        async with manager.run():
            await manager.handle_request(scope, receive, send)
    finally:
        answered.set()
    response = HttpResponse(b"".join(chunks), status=status)
    for name, value in headers:
        if name.lower() not in _SKIPPED_HEADERS:
            response[name.decode("latin-1")] = value.decode("latin-1")
    return response


@csrf_exempt  # Bearer tokens, never cookies: no cross-site request can carry one.
async def mcp_endpoint(request):
    if request.method != "POST":
        # Stateless, there is no stream to offer (GET) nor session to end (DELETE). Handed to
        # the SDK, a GET would be held open as an event stream whose buffered answer never comes.
        response = JsonResponse(error_body("method_not_allowed", "The MCP endpoint takes POST only."), status=405)
        response["Allow"] = "POST"
        return response
    caller = await sync_to_async(_authenticate, thread_sensitive=True)(request)
    if isinstance(caller, HttpResponse):
        return caller
    try:
        body = request.body
    except RequestDataTooBig:
        return JsonResponse(error_body("too_large", "The request body is too large."), status=413)
    return await _answer(_asgi_scope(request, caller), body)
