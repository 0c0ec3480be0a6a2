"""kinsite.netguard, the SSRF guard for outbound fetches: which addresses a policy refuses
(however they are embedded), the allow-list, and the fetch's mechanics beyond the http_json
node's tests (tests/workflows/nodes/test_http.py): TLS by host name over a pinned address,
falling back across the checked addresses, and a deadline that covers the lookup too."""
import ipaddress
import re
import shutil
import socket
import ssl
import subprocess
import time

import pytest

from kinsite import netguard
from kinsite.netguard import FetchError, Policy, address_refusal
from tests.support.outbound import (
    LocalServer,
    no_real_dns,  # noqa: F401 (a fixture, used by pytestmark)
    record_connections,
    scripted_dns,
)

DEFAULT = Policy()


# A test that needs a name scripts it; no query leaves (no_real_dns, tests/support/outbound.py).
pytestmark = pytest.mark.usefixtures("no_real_dns")


@pytest.mark.parametrize("address, kind", [
    ("127.0.0.1", "loopback"), ("127.255.0.9", "loopback"), ("::1", "loopback"),
    ("0.0.0.0", "unspecified"), ("::", "unspecified"),
    ("10.1.2.3", "private"), ("172.31.255.1", "private"), ("192.168.0.1", "private"), ("fd12:3456::1", "private"),
    ("169.254.1.1", "link-local"), ("fe80::1", "link-local"),
    ("224.0.0.251", "multicast"), ("239.255.255.250", "multicast"), ("ff05::2", "multicast"),
    ("240.0.0.1", "reserved"), ("255.255.255.255", "reserved"), ("fec0::1", "site-local"),
    ("100.64.0.1", "not globally reachable"), ("198.18.0.1", "private"),
    # IPv6 spellings of IPv4 addresses: judged by the IPv4 address they reach or carry.
    ("::ffff:127.0.0.1", "loopback"), ("::ffff:10.0.0.1", "private"), ("64:ff9b::a9fe:a9fe", "cloud metadata"),
    ("64:ff9b::7f00:1", "loopback"), ("::127.0.0.1", "reserved"), ("2002:7f00:1::1", "loopback"),
    ("2002:c0a8:101::1", "private"), ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "private"),
    ("169.254.169.254", "cloud metadata"), ("fd00:ec2::254", "cloud metadata"), ("168.63.129.16", "cloud metadata"),
])
def test_non_public_addresses_are_refused_with_their_kind(address, kind):
    refusal = address_refusal(ipaddress.ip_address(address), DEFAULT)

    assert refusal is not None and kind in refusal


@pytest.mark.parametrize("address", [
    "93.184.215.14", "8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1",
])
def test_public_addresses_are_allowed(address):
    assert address_refusal(ipaddress.ip_address(address), DEFAULT) is None


def test_the_allow_list_takes_addresses_networks_and_names():
    policy = Policy.build(["10.0.0.0/8", "127.0.0.1", " Intranet.Example. ", "fd00::/8", ""])

    assert policy.allowed_names == frozenset({"intranet.example"})
    for allowed in ["10.200.0.1", "127.0.0.1", "::ffff:127.0.0.1", "fd00::7"]:
        assert address_refusal(ipaddress.ip_address(allowed), policy) is None
    for refused in ["127.0.0.2", "192.168.0.1", "169.254.169.254"]:
        assert address_refusal(ipaddress.ip_address(refused), policy) is not None
    with pytest.raises(ValueError, match="10.0.0.0/33"):
        Policy.build(["10.0.0.0/33"])


@pytest.mark.parametrize("entry, reason", [
    ("https://intranet.example", "URL"), ("intranet.example:8080", "port"), ("*.intranet.example", "wildcard"),
    ("intra net.example", "neither"), ("intranet..example", "neither"), ("-intranet.example", "neither"),
    ("10.0.0.0/33", "neither"), ("[::1]", "neither"),
])
def test_a_malformed_allow_list_entry_is_refused_by_name(entry, reason):
    problem = netguard.allow_list_problem(entry)
    assert problem is not None and reason in problem
    with pytest.raises(ValueError, match=re.escape(repr(entry))):
        Policy.build(["127.0.0.1", entry])


@pytest.mark.parametrize("entry", ["intranet.example", "Intranet.Example.", "files_svc", "localhost", "10.0.0.0/8",
                                   "::1", "fd00::/8"])
def test_well_formed_allow_list_entries_pass(entry):
    assert netguard.allow_list_problem(entry) is None


def test_allow_private_allows_all_but_metadata_unless_named():
    policy = Policy.build([], allow_private=True)

    for allowed in ["127.0.0.1", "10.0.0.1", "fd00::1", "169.254.1.1"]:
        assert address_refusal(ipaddress.ip_address(allowed), policy) is None
    assert "cloud metadata" in address_refusal(ipaddress.ip_address("169.254.169.254"), policy)
    assert address_refusal(ipaddress.ip_address("169.254.169.254"), Policy.build(["169.254.169.254"])) is None


def test_a_name_on_the_allow_list_is_fetched_wherever_it_resolves(monkeypatch):
    scripted_dns(monkeypatch, {"intranet.example": [["10.1.2.3", "10.1.2.4"]]})

    assert netguard.resolve("intranet.example", Policy.build(["intranet.example"]), time.monotonic() + 5) == [
        "10.1.2.3", "10.1.2.4"
    ]
    with pytest.raises(FetchError, match="intranet.example resolves to 10.1.2.3: 10.1.2.3 is private"):
        netguard.resolve("intranet.example", DEFAULT, time.monotonic() + 5)


def test_the_deadline_covers_a_slow_lookup(monkeypatch):
    real_getaddrinfo = socket.getaddrinfo

    def slow_getaddrinfo(host, *args, **kwargs):
        if host == "slow.test":
            time.sleep(3)  # the abandoned lookup thread ends on its own, with no answer
            raise socket.gaierror(socket.EAI_AGAIN, "a resolver that never answered")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", slow_getaddrinfo)
    connections = record_connections(monkeypatch)

    started = time.monotonic()
    with pytest.raises(FetchError, match="looking up slow.test took longer"):
        netguard.fetch("http://slow.test/", policy=DEFAULT, timeout=0.5, max_bytes=1000)

    assert time.monotonic() - started < 1.5
    assert connections == []


def test_each_checked_address_is_tried_in_turn(monkeypatch):
    server = LocalServer().start()
    try:
        server.json("/x", {"ok": True})
        # Nothing listens on [::1] at this port: the connect falls through to 127.0.0.1.
        scripted_dns(monkeypatch, {"both.test": [["::1", "127.0.0.1"]]})
        connections = record_connections(monkeypatch)
        policy = Policy.build(["::1", "127.0.0.1"])

        body = netguard.fetch(f"http://both.test:{server.port}/x", policy=policy, timeout=5, max_bytes=1000)
    finally:
        server.stop()

    assert body == b'{"ok": true}'
    assert connections == [("::1", server.port), ("127.0.0.1", server.port)]


@pytest.fixture
def tls_server(tmp_path, monkeypatch):
    """An HTTPS server on 127.0.0.1 whose certificate names kinsite.test only, trusted through
    SSL_CERT_FILE (which the fetch honours, as httpx does); records the SNI it was sent."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=kinsite.test",
         "-addext", "subjectAltName=DNS:kinsite.test"],
        check=True, capture_output=True,
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server_names = []
    context.sni_callback = lambda sock, name, ctx: server_names.append(name)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    server = LocalServer(ssl_context=context).start()
    server.json("/x", {"tls": True})
    yield server, server_names
    server.stop()


def test_tls_is_verified_against_the_host_name_over_the_pinned_address(tls_server, monkeypatch):
    server, server_names = tls_server
    scripted_dns(monkeypatch, {"kinsite.test": [["127.0.0.1"]], "other.test": [["127.0.0.1"]]})
    connections = record_connections(monkeypatch)
    policy = Policy.build(["127.0.0.1"])

    body = netguard.fetch(f"https://kinsite.test:{server.port}/x", policy=policy, timeout=5, max_bytes=1000)

    assert body == b'{"tls": true}'
    assert server_names == ["kinsite.test"]
    assert server.hits == [("/x", f"kinsite.test:{server.port}")]
    assert connections == [("127.0.0.1", server.port)]
    # The certificate covers kinsite.test only: the same address under another name, or bare, fails.
    for url in [f"https://other.test:{server.port}/x", f"https://127.0.0.1:{server.port}/x"]:
        with pytest.raises(FetchError, match="CERTIFICATE_VERIFY_FAILED|certificate"):
            netguard.fetch(url, policy=policy, timeout=5, max_bytes=1000)
    assert len(server.hits) == 1
