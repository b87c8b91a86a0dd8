"""The one HTTP client for requests to addresses a tenant configured (SSRF guard, ASVS V12.6).

Connector providers (``baseUrl``) and ``http`` agent adapters (``url``) send the tenant's
credentials to a URL a company admin chose. Every such request goes through
:func:`guarded_client`:

* the scheme is ``https``; plain ``http`` only with ``PAPERCLIP_OUTBOUND_ALLOW_HTTP`` and only to a
  loopback address (development, the demo and the tests);
* every address the host name resolves to is checked, and the connection is made to the checked
  address itself (so a DNS answer that changes between check and connect — rebinding — cannot
  redirect it); loopback, private, link-local (cloud metadata), shared, reserved, multicast and
  unspecified ranges are refused unless ``PAPERCLIP_OUTBOUND_ALLOWED_HOSTS`` names the host,
  ``host:port`` or a CIDR range containing the address (self-hosted Jira or GitHub Enterprise);
* redirects are never followed, proxies from the environment are ignored (a proxy would make the
  address check meaningless).

A refusal raises :class:`OutboundRefused`, before any byte is sent. git, which connects by itself
(an https project repository), asks :func:`checked_addresses` and is pinned to them
(issues.workspaces.gitops)."""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpcore
import httpx
from django.conf import settings

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class OutboundRefused(Exception):
    """The destination is not one this server sends requests to."""


@dataclass(frozen=True)
class OutboundPolicy:
    hosts: frozenset[str]          # host names or literal addresses, any port
    host_ports: frozenset[tuple[str, int]]
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]
    allow_http: bool

    @classmethod
    def from_settings(cls) -> OutboundPolicy:
        conf = getattr(settings, "PAPERCLIP", {}) or {}
        hosts, host_ports, networks = set(), set(), []
        for raw in conf.get("OUTBOUND_ALLOWED_HOSTS") or ():
            entry = raw.strip().lower()
            if not entry:
                continue
            if "/" in entry:
                networks.append(ipaddress.ip_network(entry, strict=False))
                continue
            host, port = _split_host_port(entry)
            if port is None:
                hosts.add(host)
            else:
                host_ports.add((host, port))
        return cls(frozenset(hosts), frozenset(host_ports), tuple(networks), bool(conf.get("OUTBOUND_ALLOW_HTTP")))

    def host_allowed(self, host: str, port: int) -> bool:
        host = host.lower().strip("[]")
        return host in self.hosts or (host, port) in self.host_ports

    def address_refusal(self, host: str, port: int, address: Address) -> str | None:
        """Why connecting to ``address`` (resolved from ``host``) is refused, or None."""
        if self.host_allowed(host, port) or self.host_allowed(str(address), port):
            return None
        if any(address in net for net in self.networks if net.version == address.version):
            return None
        if _public(address):
            return None
        return (f"{host} resolves to {address}, a non-public address; allow it with "
                f"PAPERCLIP_OUTBOUND_ALLOWED_HOSTS if it is a trusted service.")

    def url_refusal(self, url: str, *, resolve: bool = True) -> str | None:
        """Why a request to ``url`` would be refused (for validating configuration when it is
        written). A host name that does not resolve now is not refused here: it is checked again
        at every connection."""
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            return "Not a valid URL."
        scheme, host = (parts.scheme or "").lower(), (parts.hostname or "")
        if not host or scheme not in ("http", "https"):
            return "Must be an https:// URL."
        if parts.username or parts.password:
            return "Credentials in the URL are not allowed; use a secret reference."
        port = port or (443 if scheme == "https" else 80)
        if scheme == "http":
            refusal = self._http_refusal(host)
            if refusal:
                return refusal
        if not resolve:
            return None
        try:
            addresses = _resolve(host, port)
        except OSError:
            return None
        for address in addresses:
            refusal = self.address_refusal(host, port, address)
            if refusal:
                return refusal
        return None

    def _http_refusal(self, host: str) -> str | None:
        if not self.allow_http:
            return "Must be an https:// URL (plain http is allowed only for loopback with PAPERCLIP_OUTBOUND_ALLOW_HTTP)."
        if host.lower() == "localhost":
            return None
        try:
            if ipaddress.ip_address(host.strip("[]")).is_loopback:
                return None
        except ValueError:
            pass
        return "Plain http is allowed only to a loopback address; use https."


def _split_host_port(entry: str) -> tuple[str, int | None]:
    if entry.startswith("["):  # [::1]:8443
        host, _, rest = entry[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else None
    if entry.count(":") == 1:
        host, port = entry.split(":")
        return host, int(port)
    return entry, None


def _public(address: Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour or (address.teredo[1] if address.teredo else None)
        if embedded is not None:
            return _public(embedded)
    return address.is_global and not address.is_multicast


def _resolve(host: str, port: int) -> list[Address]:
    try:
        return [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        pass
    seen: list[Address] = []
    for *_, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        address = ipaddress.ip_address(sockaddr[0].split("%", 1)[0])
        if address not in seen:
            seen.append(address)
    return seen


def _checked(policy: OutboundPolicy, host: str, port: int) -> list[Address]:
    """Every address ``host`` resolves to, each checked: one non-public answer refuses the name (the
    rest could rebind). Raises OSError when it does not resolve, :class:`OutboundRefused` when refused."""
    addresses = _resolve(host, port)
    for address in addresses:
        refusal = policy.address_refusal(host, port, address)
        if refusal:
            raise OutboundRefused(refusal)
    return addresses


class _GuardedBackend(httpcore.SyncBackend):
    """Resolves once, checks every address, connects to a checked address and verifies the peer."""

    def __init__(self, policy: OutboundPolicy):
        self.policy = policy

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        try:
            addresses = _checked(self.policy, host, port)
        except OSError as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
        last: Exception | None = None
        for address in addresses:
            try:
                stream = super().connect_tcp(str(address), port, timeout=timeout, local_address=local_address,
                                             socket_options=socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
                continue
            peer = ipaddress.ip_address(stream.get_extra_info("server_addr")[0].split("%", 1)[0])
            if peer != address:
                stream.close()
                raise OutboundRefused(f"connected to {peer}, not the checked address {address}")
            return stream
        raise last or httpcore.ConnectError(f"{host} has no address")


class GuardedTransport(httpx.HTTPTransport):
    def __init__(self, *, policy: OutboundPolicy | None = None, verify=True, limits=httpx.Limits()):
        # HTTPTransport.__init__ only builds its pool; ours is built here, once, with the guarded
        # network backend (calling it too would load the CA bundle twice per client).
        self.policy = policy or OutboundPolicy.from_settings()
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify, trust_env=False),
            max_connections=limits.max_connections, max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry, network_backend=_GuardedBackend(self.policy))

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        scheme, host = request.url.scheme, request.url.host
        if scheme == "http":
            refusal = self.policy._http_refusal(host)
            if refusal:
                raise OutboundRefused(refusal)
        elif scheme != "https":
            raise OutboundRefused("Must be an https:// URL.")
        return super().handle_request(request)


def guarded_client(**kwargs) -> httpx.Client:
    """An ``httpx.Client`` whose every connection obeys the outbound policy (see module doc)."""
    kwargs.setdefault("follow_redirects", False)
    if kwargs["follow_redirects"]:
        raise ValueError("guarded clients never follow redirects")
    return httpx.Client(transport=GuardedTransport(), trust_env=False, **kwargs)


def url_refusal(url: str, *, resolve: bool = True) -> str | None:
    return OutboundPolicy.from_settings().url_refusal(url, resolve=resolve)


def checked_addresses(url: str) -> tuple[str, int, list[Address]]:
    """For a client that connects by itself (git): the URL's host, port and every address the host
    resolves to, each checked as above; raises :class:`OutboundRefused`. The caller connects only to
    these addresses (pinned), through no proxy, following no redirect."""
    policy = OutboundPolicy.from_settings()
    refusal = policy.url_refusal(url, resolve=False)
    if refusal:
        raise OutboundRefused(refusal)
    parts = urlsplit(url)
    host, port = parts.hostname, parts.port or (443 if parts.scheme.lower() == "https" else 80)
    try:
        addresses = _checked(policy, host, port)
    except OSError as exc:
        raise OutboundRefused(f"cannot resolve {host}: {exc}") from None
    if not addresses:
        raise OutboundRefused(f"{host} has no address")
    return host, port, addresses
