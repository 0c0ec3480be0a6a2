"""Helpers for tests of outbound fetches (kinsite/netguard.py): a real HTTP(S) server on
127.0.0.1 that counts what reached it, a scripted resolver, and a recorder of every TCP
connect that refuses anything but loopback, so no test ever sends a packet elsewhere.

    server = LocalServer().start()
    server.json("/people", [{"id": 1}])
    server.redirect("/hop", "http://127.0.0.1:80/")
    ...
    assert server.hits == []
"""
from __future__ import annotations

import ipaddress
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

Route = Callable[[BaseHTTPRequestHandler], None]


class LocalServer:
    def __init__(self, ssl_context: ssl.SSLContext | None = None):
        self.routes: dict[str, Route] = {}
        self.hits: list[tuple[str, str]] = []  # (path, Host header) of every request that arrived
        self.stopping = threading.Event()
        self._ssl_context = ssl_context
        self._httpd: ThreadingHTTPServer | None = None

    def start(self) -> LocalServer:
        handler = type("Handler", (_Handler,), {"server_side": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        if self._ssl_context is not None:
            self._httpd.socket = self._ssl_context.wrap_socket(self._httpd.socket, server_side=True)
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return self

    def stop(self) -> None:
        self.stopping.set()  # wakes handlers that drip or hang
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def base(self) -> str:
        scheme = "https" if self._ssl_context is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    # -- routes --

    def respond(self, path: str, status: int = 200, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        def route(handler: BaseHTTPRequestHandler) -> None:
            handler.send_response(status)
            for name, value in {"Content-Type": "application/json", "Content-Length": str(len(body)),
                                **(headers or {})}.items():
                handler.send_header(name, value)
            handler.end_headers()
            with suppress(OSError):  # the client stopped reading (a body over its cap)
                handler.wfile.write(body)

        self.routes[path] = route

    def json(self, path: str, value: Any, status: int = 200) -> None:
        self.respond(path, status, json.dumps(value).encode())

    def redirect(self, path: str, location: str, status: int = 302) -> None:
        self.respond(path, status, b"", {"Location": location})

    def echo_host(self, path: str) -> None:
        def route(handler: BaseHTTPRequestHandler) -> None:
            body = json.dumps({"host": handler.headers.get("Host")}).encode()
            handler.send_response(200)
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)

        self.routes[path] = route

    def drip(self, path: str, *, every: float, for_at_most: float) -> None:
        """A body sent one byte at a time: each read is quick, the whole answer is not."""
        def route(handler: BaseHTTPRequestHandler) -> None:
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json")
            handler.end_headers()
            handler.wfile.write(b"[")
            handler.wfile.flush()
            until = time.monotonic() + for_at_most
            try:
                while time.monotonic() < until and not self.stopping.wait(every):
                    handler.wfile.write(b" ")
                    handler.wfile.flush()
                handler.wfile.write(b"]")
            except OSError:  # the client gave up, as it should
                pass

        self.routes[path] = route

    def chunked(self, path: str, size: int) -> None:
        """`size` bytes without a Content-Length, so only counting can stop the reader."""
        def route(handler: BaseHTTPRequestHandler) -> None:
            handler.send_response(200)
            handler.send_header("Transfer-Encoding", "chunked")
            handler.end_headers()
            chunk = b"[" + b" " * (size - 2) + b"]"
            with suppress(OSError):
                handler.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(chunk), chunk))

        self.routes[path] = route


class _Handler(BaseHTTPRequestHandler):
    server_side: LocalServer
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        self.server_side.hits.append((self.path, self.headers.get("Host", "")))
        route = self.server_side.routes.get(self.path)
        if route is None:
            self.send_response(404)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")
            return
        route(self)
        self.close_connection = True

    def log_message(self, *args):
        pass


_closed_ports: list[socket.socket] = []


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on: bound and never listened on, for the rest of
    the process, so a connect is refused and no other server (another xdist worker's) can take it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    _closed_ports.append(sock)
    return sock.getsockname()[1]


def record_connections(monkeypatch) -> list[tuple[str, int]]:
    """Every TCP connect attempted from now on, as (host, port). Loopback IPs are connected for
    real; anything else (a private or public IP, a host name) is refused before a packet leaves."""
    attempts: list[tuple[str, int]] = []
    real_create_connection = socket.create_connection

    def create_connection(address, *args, **kwargs):
        host, port = address[0], address[1]
        attempts.append((host, port))
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ConnectionRefusedError(f"tests connect to loopback only, not {host}")
        return real_create_connection(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", create_connection)
    return attempts


def scripted_dns(monkeypatch, answers: dict[str, list[list[str]]]) -> list[str]:
    """Resolve the names in `answers` to scripted addresses: the first lookup of a name gets its
    first list, the next its second (the last one repeats). IP literals (in any spelling) and
    "localhost" resolve as usual, without a query; any other name fails, so no test sends a DNS
    query. Returns the scripted names looked up, in order."""
    lookups: list[str] = []
    real_getaddrinfo = socket.getaddrinfo
    calls: dict[str, int] = {}

    def getaddrinfo(host, port, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else host
        if name not in answers:
            if name != "localhost" and not _numeric(real_getaddrinfo, name):
                raise socket.gaierror(socket.EAI_NONAME, f"tests resolve scripted names only, not {name}")
            return real_getaddrinfo(host, port, *args, **kwargs)
        lookups.append(name)
        sequence = answers[name]
        addresses = sequence[min(calls.get(name, 0), len(sequence) - 1)]
        calls[name] = calls.get(name, 0) + 1
        infos = []
        for address in addresses:
            if ":" in address:
                infos.append((socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port or 0, 0, 0)))
            else:
                infos.append((socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port or 0)))
        return infos

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return lookups


@pytest.fixture
def no_real_dns(monkeypatch):
    """No DNS query leaves: a test that needs a name scripts it (scripted_dns). A module uses it
    for every test by importing it and saying `pytestmark = pytest.mark.usefixtures("no_real_dns")`."""
    scripted_dns(monkeypatch, {})


def _numeric(getaddrinfo, name) -> bool:
    try:
        getaddrinfo(name, None, flags=socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeError):
        return False
    return True
