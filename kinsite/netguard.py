"""Outbound HTTP made on a team's behalf, guarded against SSRF: only http(s), the host
resolved once and every address checked against the Policy, the connection pinned to a
checked address, redirects checked the same way, one deadline and one size cap per fetch
(docs/concepts/workflows.md#outbound-requests).

Free of Django. FetchError's text is the real reason, for the server log only: callers show
users one neutral sentence, so answers cannot map a network or scan ports.

Built on httpcore because only its network backend lets us choose the address a connection
goes to; httpx does not expose it. Nor can a proxy from the environment route around the check."""
from __future__ import annotations

import ipaddress
import re
import socket
import ssl
import threading
import time
from dataclasses import dataclass

import httpcore
import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

SCHEMES = ("http", "https")
REDIRECT_STATUSES = (301, 302, 303, 307, 308)

# Cloud metadata endpoints hand out credentials: refused even with allow_private, unless named
# in the allow-list. The names are refused before any lookup, so no resolver can remap them.
METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata.goog"})
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254",  # AWS, GCP, Azure, OCI, DigitalOcean, OpenStack
    "169.254.170.2",  # AWS ECS task credentials
    "fd00:ec2::254",  # AWS, over IPv6
    "100.100.100.200",  # Alibaba Cloud
    "168.63.129.16",  # Azure WireServer: a public-range address, so only this list refuses it
))
# NAT64 (RFC 6052): the last 32 bits are the IPv4 address the gateway connects to.
NAT64_WELL_KNOWN = ipaddress.ip_network("64:ff9b::/96")


class FetchError(Exception):
    """The fetch was refused or failed; the message says why (for the server log only)."""


@dataclass(frozen=True)
class Policy:
    """What an operator allows beyond public addresses."""

    allowed_names: frozenset[str] = frozenset()  # host names fetched wherever they resolve
    allowed_networks: tuple[IPNetwork, ...] = ()  # addresses fetched even if not public
    allow_private: bool = False  # every address except the metadata ones

    @classmethod
    def build(cls, entries: list[str], *, allow_private: bool = False) -> Policy:
        """From allow-list entries: host names, IP addresses or CIDR networks."""
        names, networks = set(), []
        for entry in (e.strip() for e in entries):
            if not entry:
                continue
            problem = allow_list_problem(entry)
            if problem:  # better loud than an entry that silently matches nothing
                raise ValueError(f"{entry!r} {problem}.")
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                names.add(_normal_name(entry))
        return cls(frozenset(names), tuple(networks), allow_private)


# A host name as a resolver takes it: dot-separated labels of letters, digits and hyphens (and
# underscores, which container service names use), no label starting or ending with a hyphen.
_HOST_NAME = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)(\.(?!-)[a-z0-9_-]{1,63}(?<!-))*\.?", re.IGNORECASE)


def allow_list_problem(entry: str) -> str | None:
    """What makes `entry` unusable in an allow-list (a host name, IP or CIDR), as the end of a
    sentence about it, or None. Settings check each entry at load, so a typo stops the start."""
    entry = entry.strip()
    try:
        ipaddress.ip_network(entry, strict=False)
        return None
    except ValueError:
        pass
    if "://" in entry:
        return "is a URL: give the host name alone (every port and path of it is allowed)"
    if "*" in entry:
        return "has a wildcard, which the allow-list does not take: name each host, or give its network"
    if re.fullmatch(r"[^:/\s]+:\d+", entry):
        return "has a port: give the host name alone (every port of it is allowed)"
    if "/" in entry or not _HOST_NAME.fullmatch(entry) or len(entry.rstrip(".")) > 253:
        return "is neither a host name, an IP address nor a CIDR network"
    return None


def url_problem(url: str) -> str | None:
    """What makes `url` unfetchable, judged from its text alone, as the end of a sentence
    about it, or None."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        return "must be an http:// or https:// address"
    if parsed.scheme not in SCHEMES or not parsed.host:
        return "must be an http:// or https:// address"
    # A password in a workflow's config is readable by the whole team and would be sent to
    # wherever the URL (or a redirect) leads; user@host is also a classic way to disguise a host.
    if parsed.userinfo:
        return "must not contain a user name or password"
    return None


def literal_host_refusal(url: str, policy: Policy) -> str | None:
    """Why `policy` refuses `url` whatever DNS answers, judged without a lookup: its host is an
    IP literal in any spelling the resolver reads as one (127.0.0.1, 2130706433, 0x7f.1,
    [::1]), `localhost` (RFC 6761: always loopback) or a metadata host name. None for every
    other name, judged when fetched (resolve). From the URL and the policy alone, so saying it
    tells nothing about the network."""
    try:
        host = httpx.URL(url).host
    except (httpx.InvalidURL, TypeError):
        return None
    name = _normal_name(host)
    if not name or name in policy.allowed_names:
        return None
    if name in METADATA_HOSTS:
        return f"{host} is a cloud metadata host name"
    if name == "localhost" or name.endswith(".localhost"):
        refusal = address_refusal(ipaddress.ip_address("127.0.0.1"), policy)
        return f"{host} is loopback" if refusal else None
    try:
        address: IPAddress = ipaddress.ip_address(name)
    except ValueError:
        try:  # the older IPv4 spellings getaddrinfo also reads as numbers (inet_aton's)
            address = ipaddress.IPv4Address(socket.inet_aton(name))
        except OSError:
            return None
    return address_refusal(address, policy)


def address_refusal(address: IPAddress, policy: Policy) -> str | None:
    """Why `policy` refuses a connection to `address` (None: allowed)."""
    target = _reached_ipv4(address) or address
    if any(target in network for network in policy.allowed_networks):
        return None
    if target in METADATA_ADDRESSES:
        return f"{address} is a cloud metadata address"
    if policy.allow_private:
        return None
    for candidate in (target, *_embedded_ipv4(target)):
        kind = _non_public_kind(candidate)
        if kind:
            return f"{address} is {kind}" + (f" (it embeds {candidate})" if candidate != address else "")
    return None


def fetch(url: str, *, policy: Policy, timeout: float, max_bytes: int, max_redirects: int = 3,
          headers: dict[str, str] | None = None) -> bytes:
    """GET `url` and answer its 2xx body, following up to `max_redirects` redirects. `timeout`
    bounds the whole fetch, not each read. FetchError for every refusal and failure."""
    deadline = time.monotonic() + timeout
    ssl_context = httpx.create_ssl_context()  # certifi, or SSL_CERT_FILE / SSL_CERT_DIR
    current = url
    for _ in range(max_redirects + 1):
        target = _checked_url(current)
        addresses = resolve(target.raw_host.decode("ascii"), policy, deadline)
        status, location, body = _get(target, addresses, deadline, max_bytes, ssl_context, headers or {})
        if status in REDIRECT_STATUSES and location:
            try:
                current = str(target.join(location))
            except httpx.InvalidURL as exc:
                raise FetchError(f"{target} redirected to an invalid URL: {exc}") from exc
            continue
        if not 200 <= status < 300:
            raise FetchError(f"{target} answered HTTP {status}")
        return body
    raise FetchError(f"more than {max_redirects} redirects, the last to {current}")


def resolve(host: str, policy: Policy, deadline: float) -> list[str]:
    """The addresses `host` resolves to, each allowed by `policy`: the only ones to connect to.
    An IP literal in any spelling (2130706433, 0x7f.1, [::ffff:127.0.0.1]) resolves to itself."""
    name = _normal_name(host)
    name_allowed = name in policy.allowed_names
    if name in METADATA_HOSTS and not name_allowed:
        raise FetchError(f"{host} is a cloud metadata host name")
    infos = _getaddrinfo(host, deadline)
    addresses = list(dict.fromkeys(info[4][0] for info in infos if info[0] in (socket.AF_INET, socket.AF_INET6)))
    if not addresses:
        raise FetchError(f"{host} has no address")
    if not name_allowed:
        # Every answer, not only the first: the connection may go to any of them.
        for address in addresses:
            refusal = address_refusal(ipaddress.ip_address(address), policy)
            if refusal:
                raise FetchError(f"{host} resolves to {address}: {refusal}")
    return addresses


# --- address classes -------------------------------------------------------------------------


def _non_public_kind(address: IPAddress) -> str | None:
    # The specific words first, for the log; `is_global` last catches the rest of the IANA
    # special-purpose registries (shared 100.64/10, benchmarking, documentation, ...).
    for kind, flag in (
        ("unspecified", address.is_unspecified), ("loopback", address.is_loopback),
        ("link-local", address.is_link_local), ("multicast", address.is_multicast),
        ("reserved", address.is_reserved), ("private", address.is_private),
        ("site-local", getattr(address, "is_site_local", False)),  # fec0::/10: deprecated, still routed by some
        ("not globally reachable", not address.is_global),
    ):
        if flag:
            return kind
    return None


def _reached_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address a connection to this IPv6 address really reaches, where that is fixed:
    IPv4-mapped (::ffff:a.b.c.d, what a dual-stack socket uses) and NAT64's well-known prefix."""
    if address.version != 6:
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in NAT64_WELL_KNOWN:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _embedded_ipv4(address: IPAddress) -> list[ipaddress.IPv4Address]:
    """IPv4 addresses carried inside an IPv6 one by a tunnelling scheme (6to4, Teredo), which
    a relay may connect to. (IPv4-compatible ::a.b.c.d needs no unwrapping: ::/8 is reserved.)"""
    if address.version != 6:
        return []
    embedded = [address.sixtofour] if address.sixtofour is not None else []
    if address.teredo is not None:
        embedded.extend(address.teredo)
    return embedded


def _normal_name(host: str) -> str:
    return host.strip().lower().rstrip(".")


# --- lookups and connections ------------------------------------------------------------------


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise FetchError("the time limit passed")
    return left


def _getaddrinfo(host: str, deadline: float) -> list[tuple]:
    # getaddrinfo takes no timeout, so it runs in a daemon thread abandoned at the deadline.
    outcome: dict = {}

    def lookup() -> None:
        try:
            outcome["infos"] = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=lookup, name="netguard-lookup", daemon=True)
    thread.start()
    thread.join(_remaining(deadline))
    if thread.is_alive():
        raise FetchError(f"looking up {host} took longer than the time limit")
    if "error" in outcome:
        raise FetchError(f"{host} could not be resolved: {outcome['error']}")
    return outcome["infos"]


def _checked_url(url: str) -> httpx.URL:
    problem = url_problem(url)
    if problem:
        raise FetchError(f"{url} {problem}")
    return httpx.URL(url)


def _get(url: httpx.URL, addresses: list[str], deadline: float, max_bytes: int, ssl_context: ssl.SSLContext,
         headers: dict[str, str]) -> tuple[int, str | None, bytes]:
    """One GET over a connection to one of `addresses`: (status, Location of a redirect, body)."""
    request_url = httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path)
    request_headers = [
        (b"Host", url.netloc),  # the name, not the address; brackets and port as in the URL
        (b"User-Agent", b"Kinsite"),
        # A compressed body would need decoding, and its size after decoding is the one that matters.
        (b"Accept-Encoding", b"identity"),
        *((name.encode("ascii"), value.encode("latin-1")) for name, value in headers.items()),
    ]
    backend = _PinnedBackend(addresses, deadline)
    try:
        with (
            httpcore.ConnectionPool(ssl_context=ssl_context, network_backend=backend, max_connections=1) as pool,
            pool.stream(b"GET", request_url, headers=request_headers) as response,
        ):
            response_headers = {name.lower(): value for name, value in response.headers}
            if response.status in REDIRECT_STATUSES:
                location = response_headers.get(b"location")
                return response.status, location.decode("latin-1") if location else None, b""
            if not 200 <= response.status < 300:
                return response.status, None, b""
            announced = response_headers.get(b"content-length", b"")
            if announced.isdigit() and int(announced) > max_bytes:
                raise FetchError(f"{url} announced {int(announced)} bytes; the limit is {max_bytes}")
            body = bytearray()
            for chunk in response.iter_stream():
                body.extend(chunk)
                if len(body) > max_bytes:
                    raise FetchError(f"{url} sent more than {max_bytes} bytes")
            return response.status, None, bytes(body)
    except (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError,
            httpcore.UnsupportedProtocol, OSError) as exc:
        raise FetchError(f"{url} via {', '.join(addresses)}: {type(exc).__name__}: {exc}") from exc


class _PinnedBackend(httpcore.NetworkBackend):
    """Connects to the addresses resolve() checked, whatever host httpcore asks for, so DNS
    rebinding between check and connect cannot steer the connection. Host, SNI and the
    certificate check still use the URL's name."""

    def __init__(self, addresses: list[str], deadline: float):
        self._addresses = addresses
        self._deadline = deadline
        self._sockets = httpcore.SyncBackend()

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        failure: Exception | None = None
        for address in self._addresses:  # in the resolver's order, like socket.create_connection
            try:
                stream = self._sockets.connect_tcp(address, port, _remaining(self._deadline), local_address,
                                                   socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
                continue
            return _DeadlineStream(stream, self._deadline)
        raise failure or httpcore.ConnectError("no address to connect to")

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        raise httpcore.UnsupportedProtocol("outbound fetches use TCP only")

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class _DeadlineStream(httpcore.NetworkStream):
    """A stream whose reads and writes time out at the fetch's deadline, not per call: a server
    that sends one byte just before each read timeout would otherwise hold a worker forever."""

    def __init__(self, stream: httpcore.NetworkStream, deadline: float):
        self._stream = stream
        self._deadline = deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _remaining(self._deadline))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _remaining(self._deadline))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None) -> httpcore.NetworkStream:
        tls = self._stream.start_tls(ssl_context, server_hostname, _remaining(self._deadline))
        return _DeadlineStream(tls, self._deadline)

    def get_extra_info(self, info: str):
        return self._stream.get_extra_info(info)
