"""The http_json source: JSON fetched over HTTP under the SSRF policy of kinsite.netguard."""
from __future__ import annotations

import json
import logging
from typing import Any

from django.conf import settings

from kinsite import netguard
from workflows.nodes.base import NodeError, NodeType, Param, Record, RunContext, get_field

logger = logging.getLogger(__name__)


def _policy() -> netguard.Policy:
    """The SSRF policy of the WORKFLOW_HTTP_* settings, read per call (tests and operators may
    change them)."""
    return netguard.Policy.build(settings.WORKFLOW_HTTP_ALLOWED_HOSTS,
                                 allow_private=settings.WORKFLOW_HTTP_ALLOW_PRIVATE)


def fetch_json(url: str, *, ctx: RunContext) -> Any:
    """The JSON at `url`, fetched under the SSRF policy and its time and size limits."""
    timeout, max_bytes = settings.WORKFLOW_HTTP_TIMEOUT_SECONDS, settings.WORKFLOW_HTTP_MAX_BYTES
    policy = _policy()
    try:
        body = netguard.fetch(url, policy=policy, timeout=timeout, max_bytes=max_bytes,
                              headers={"Accept": "application/json"})
        return json.loads(body)
    # RecursionError: deeply nested JSON ("[[[[…") is an invalid body like any other.
    except (netguard.FetchError, ValueError, RecursionError) as exc:
        reason = exc if isinstance(exc, netguard.FetchError) else f"the body is not usable JSON: {exc!r:.200}"
        logger.warning("http_json fetch of %s refused or failed (team %s, node %s): %s", url,
                       getattr(ctx.team, "pk", None), getattr(ctx.node, "pk", None), reason)
        # One sentence for every refusal and failure: if a refused address, a closed port, a
        # timeout and a wrong answer read differently, the node becomes a port scanner.
        raise NodeError(
            f"Could not fetch JSON from {url}: the address is not allowed or not reachable, or the answer was "
            f"an error, too slow, too large or not JSON (limits: {timeout:g} s, {max_bytes} bytes). "
            "The server log has the reason."
        ) from None


class HttpJson(NodeType):
    name = "http_json"
    title = "JSON over HTTP"
    description = "Fetches a JSON list of records from an http(s) URL (never a private or loopback address)."
    params = {
        "url": Param(str, required=True, doc="an http(s) URL answering JSON", widget="url"),
        "path": Param(str, doc="a dotted path to the list in the answer, empty for the answer itself", default=""),
    }
    min_inputs, max_inputs = 0, 0

    def check(self, config: dict) -> list[str]:
        problem = netguard.url_problem(config["url"])
        if problem:
            return [f"'url' {problem}."]
        # A literal address the policy refuses is refused on its node when saved, not at every
        # run; a host name is judged when fetched (where DNS may answer anything).
        refusal = netguard.literal_host_refusal(config["url"], _policy())
        if refusal:
            return [f"'url' cannot be fetched: {refusal}, which workflows may not reach "
                    "(an operator can allow it with WORKFLOW_HTTP_ALLOWED_HOSTS)."]
        return []

    def run(self, ctx: RunContext, config: dict, inputs: list[list[Record]]) -> list[Record]:
        data = fetch_json(config["url"], ctx=ctx)
        path = config.get("path") or ""
        if path:
            data = get_field(data, path) if isinstance(data, dict) else None
            if data is None:
                raise NodeError(f"The JSON from {config['url']} has nothing at path '{path}'.")
        if isinstance(data, dict):
            data = [data]
        if not isinstance(data, list):
            raise NodeError(f"The JSON from {config['url']} at path '{path or '(root)'}' is not a list of records.")
        # A list of plain values becomes one record per value.
        return [item if isinstance(item, dict) else {"value": item} for item in data]

    def describe(self, config: dict) -> str:
        at_path = f" at path {config['path']}" if config.get("path") else ""
        return f"Fetches JSON from {config.get('url', '(no URL)')}{at_path}"
