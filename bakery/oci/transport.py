"""HTTP to one registry host: auth challenges, retries, nothing about images."""

from __future__ import annotations

import base64
import email.utils
import ipaddress
import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from .. import crashpoint, untrusted
from ..errors import AuthError, InputError, IntegrityError, NotFound, RegistryError, TransientError
from .http import PACE, TIMEOUT, ConnectionFailed, Connections, Response

RETRY_STATUSES = {429, 500, 502, 503, 504}
ATTEMPTS = 5
DOCUMENT_LIMIT = 4 << 20  # manifests, indexes, configs, signatures, envelopes: distribution's own cap
ERROR_BODY_LIMIT = 64 << 10  # what a registry may say about a failure
QUOTED_LIMIT = 500  # characters of it, or of a header, that an error message quotes
REDIRECTS = {301, 302, 303, 307, 308}
MAX_REDIRECTS = 5


@dataclass(frozen=True)
class Credentials:
    """A registry login, sent as Basic or exchanged for a bearer token."""
    username: str
    password: str


def api_host(registry: str) -> str:
    """The host serving the API: Docker Hub's name differs from its API host."""
    return "registry-1.docker.io" if registry == "docker.io" else registry


IDEMPOTENT = {"GET", "HEAD", "PUT", "DELETE"}  # POST opens an upload session, PATCH appends: never resent


def host_name(host: str) -> str:
    """'127.0.0.1:5000' -> '127.0.0.1', '[::1]:5000' -> '::1', 'Example.com' -> 'example.com'."""
    if host.startswith("["):
        return host[1:].split("]")[0]
    return (host.rsplit(":", 1)[0] if host.count(":") == 1 else host).lower()


def is_loopback(host: str) -> bool:
    """By address, not by name prefix: 127.example.com is a public name."""
    name = host_name(host)
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def realm_may_receive_credentials(realm: str) -> bool:
    """Basic credentials go to a token service only over https, or on this machine."""
    url = urllib.parse.urlsplit(realm)
    return url.scheme == "https" or (url.scheme == "http" and is_loopback(url.netloc))


def scheme_for(registry: str) -> str:
    """Loopback registries and those listed in BAKERY_INSECURE_REGISTRIES speak plain HTTP."""
    insecure = {h for h in os.environ.get("BAKERY_INSECURE_REGISTRIES", "").split(",") if h}
    return "http" if is_loopback(registry) or registry in insecure else "https"


def load_credentials(registry: str) -> Credentials | None:
    """Credentials from the environment (only for the registries BAKERY_REGISTRY_HOSTS names), else
    from ~/.docker/config.json (auths or a helper)."""
    user, password = os.environ.get("BAKERY_REGISTRY_USER"), os.environ.get("BAKERY_REGISTRY_PASSWORD")
    if user or password:
        hosts = [h.strip() for h in os.environ.get("BAKERY_REGISTRY_HOSTS", "").split(",") if h.strip()]
        if not hosts:
            raise InputError("BAKERY_REGISTRY_USER/PASSWORD are set but BAKERY_REGISTRY_HOSTS is not: name the "
                             "registries these credentials are for (comma-separated, e.g. ghcr.io), so that they "
                             "are never sent anywhere else")
        if registry in hosts:
            if not (user and password):
                raise InputError("set both BAKERY_REGISTRY_USER and BAKERY_REGISTRY_PASSWORD, or neither")
            return Credentials(user, password)
    config_dir = Path(os.environ.get("DOCKER_CONFIG", Path.home() / ".docker"))
    try:
        config = json.loads((config_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    keys = [registry, f"https://{registry}", f"http://{registry}"]
    if registry == "docker.io":
        keys += ["https://index.docker.io/v1/", "index.docker.io"]
    for key in keys:
        entry = (config.get("auths") or {}).get(key) or {}
        if entry.get("auth"):
            user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            return Credentials(user, password)
    helper = (config.get("credHelpers") or {}).get(registry) or config.get("credsStore")
    if helper:
        return _from_helper(helper, keys[0] if registry != "docker.io" else "https://index.docker.io/v1/")
    return None


def _from_helper(helper: str, server: str) -> Credentials | None:
    try:
        out = subprocess.run([f"docker-credential-{helper}", "get"], input=server.encode(),
                             capture_output=True, timeout=30, check=True).stdout
        data = json.loads(out)
        return Credentials(data["Username"], data["Secret"])
    except (OSError, subprocess.SubprocessError, ValueError, KeyError):
        return None


def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) with the scheme's default port made explicit: what credentials are bound to."""
    try:
        parts = urllib.parse.urlsplit(url)
        return parts.scheme, (parts.hostname or "").lower(), parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:  # a malformed host or port: an origin of its own, matching nothing
        return "", "", -1


# the instance metadata services of the clouds whose addresses are not link-local (AWS's IPv6 one is
# a unique local address, Alibaba's in the shared address space)
METADATA_SERVICES = {"169.254.169.254", "fd00:ec2::254", "100.100.100.200"}
# what Python's is_global still calls global but is not the public internet: IETF protocol assignments,
# IPv6's deprecated site-local addresses, local-use NAT64
NOT_PUBLIC = tuple(ipaddress.ip_network(n) for n in ("192.0.0.0/24", "fec0::/10", "64:ff9b:1::/48"))
LAN = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"))
NAT64 = ipaddress.ip_network("64:ff9b::/96")  # the well-known prefix: the IPv4 address is its last 32 bits


def carried(address):
    """The IPv4 address an IPv6 one stands for (mapped, 6to4, NAT64's well-known prefix), else itself:
    what the packets finally reach."""
    if address.version == 6:
        if address.ipv4_mapped or address.sixtofour:
            return address.ipv4_mapped or address.sixtofour
        if address in NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def unreachable_by_hop(address, local: bool, private_ok: bool) -> str | None:
    """Pure: why a hop may not go to `address`, or None: a public address; loopback only from a registry
    on loopback; a LAN address (RFC 1918, unique local) only where `private_ok`; never a metadata service."""
    reached = carried(address)
    if reached.is_loopback:
        return None if local else "loopback"
    if str(reached) in METADATA_SERVICES:
        return "a cloud's metadata service"
    if private_ok and any(reached in net for net in LAN):
        return None
    if reached.is_global and not any(reached in net for net in NOT_PUBLIC):
        return None
    return "link-local, private or otherwise not public"


@dataclass(frozen=True)
class Hop:
    """The judgement of a URL the registry sent us to: why it is not followed (None: followed), and
    the address to connect to, the one judged (None: the registry's own origin, resolved as usual),
    so that a name is not resolved again to another address between the check and the connection."""
    refused: str | None
    address: str | None = None


def judge_hop(registry: tuple[str, str, int | None], url: str, private_ok: bool = False) -> Hop:
    """May we follow the registry at `registry` (its origin) to `url`: it stays at the registry's own
    origin, or goes over https to a public address; plain http, a link-local or private address, or
    loopback only for a registry that is itself on loopback (a hostile registry would otherwise send
    a rebuild's reads, or ours, to a cloud's metadata service or a LAN service). A name is judged by
    every address it resolves to, and connected to at the first of them. `private_ok`: a private
    address may be followed to as well (a token service on a LAN, as on-premises registries have)."""
    import socket

    target = origin(url)
    if target == registry:
        return Hop(None)
    scheme, host, port = target
    shown = untrusted.safe(f"[{host}]" if ":" in host else host, limit=80)  # the registry's text, in our message
    local = is_loopback(registry[1])
    if scheme != "https" and not (local and scheme == "http" and is_loopback(host)):
        return Hop(f"{untrusted.safe(scheme, limit=20)}://{shown} (only https leaves the registry's origin)")
    try:
        addresses = [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        try:
            addresses = [ipaddress.ip_address(str(a[4][0]).split("%")[0]) for a in
                         socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]
        except (OSError, UnicodeError, ValueError):
            return Hop(f"{shown}, which does not resolve")
    if not addresses:
        return Hop(f"{shown}, which does not resolve")
    for address in addresses:
        why = unreachable_by_hop(address, local, private_ok)
        if why:
            return Hop(f"{shown} ({carried(address)}: {why})")
    return Hop(None, str(addresses[0]))


def read_bounded(resp: Response, limit: int, what: str, error: type) -> bytes:
    """The whole body, or `error` as soon as it is known to exceed `limit` (from Content-Length, or
    while reading a body of unannounced length): a hostile server cannot make us read gigabytes."""
    declared = resp.headers.get("Content-Length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > limit:  # "²" is a digit to isdigit
        resp.close()
        raise error(f"{what}: the response announces {int(declared)} bytes, over the {limit}-byte limit for it; "
                    f"refused without reading it (the server is broken or hostile)")
    body = bytearray()
    try:
        for chunk in resp.iter_content(64 << 10):
            body += chunk
            if len(body) > limit:
                raise error(f"{what}: the response is over the {limit}-byte limit for it; refused after reading "
                            f"{len(body)} bytes (the server is broken or hostile)")
    except ConnectionFailed as e:
        raise TransientError(f"{what}: the response broke off after {len(body)} bytes ({e}); retry") from None
    finally:
        resp.close()
    resp.content = bytes(body)  # what .content, .text and .json() read from now on
    return resp.content


RETRY_AFTER_LIMIT_S = 60.0  # a registry's Retry-After is waited for, up to this each time
# and up to this in all for one request (two full waits): past it, a registry that keeps saying
# "later" fails the command rather than hold it for ever
RETRY_AFTER_TOTAL_S = 120.0


def backoff(attempt: int) -> float:
    return min(0.25 * 2 ** attempt, 4.0)


def asked_wait(resp: Response | None) -> float | None:
    """The seconds a 429's or 503's Retry-After asks for (seconds or an HTTP date); None without one."""
    if resp is None or resp.status_code not in (429, 503):
        return None
    return retry_after_seconds(resp.headers.get("Retry-After") or "")


def retry_after_seconds(header: str) -> float | None:
    """A Retry-After's seconds (a number of them, or an HTTP date from now); None if it is neither."""
    said = header.strip()
    if said.isascii() and said.isdigit():  # "²" is a digit to isdigit, and not to float
        return float(said)
    try:
        return email.utils.parsedate_to_datetime(said).timestamp() - time.time()
    except (TypeError, ValueError, IndexError, OverflowError):  # absent or unreadable
        return None


def retry_delay(resp: Response | None, attempt: int) -> float:
    """How long to wait before asking again: what Retry-After asks, at most a minute, never less
    than our own backoff; else the backoff."""
    asked = asked_wait(resp)
    return backoff(attempt) if asked is None else min(max(asked, backoff(attempt)), RETRY_AFTER_LIMIT_S)


def parse_challenge(header: str) -> tuple[str, dict]:
    """Split 'Bearer realm="x",service="y"' into ('bearer', {...})."""
    scheme, _, rest = header.strip().partition(" ")
    params = dict(re.findall(r'(\w+)="([^"]*)"', rest))
    return scheme.lower(), params


# the defaults' overrides (a link slower than the pace; tests of a stalled or trickling registry)
READ_TIMEOUT_ENV = "BAKERY_REGISTRY_READ_TIMEOUT"  # seconds a read may wait
GRACE_ENV = "BAKERY_REGISTRY_SLOW_GRACE"  # seconds a body's reading may wait before the pace counts
MIN_RATE_ENV = "BAKERY_REGISTRY_MIN_RATE"  # bytes per second a body must average after that
WAIT_LIMIT_ENV = "BAKERY_REGISTRY_RETRY_AFTER_LIMIT"  # seconds one request waits on Retry-After in all


def _env_number(name: str, default: float, unit: str) -> float:
    said = os.environ.get(name, "")
    try:
        value = float(said) if said else default
    except ValueError:
        value = 0.0
    if not value > 0:  # nan and negatives too
        raise InputError(f"{name}={said[:40]!r}: give {unit}, e.g. {default:g}")
    return value


def _connections() -> Connections:
    """Our own connections; in a rebuild's sandbox (no network), every one to the broker outside."""
    from ..broker_client import SOCKET_ENV

    timeout = (TIMEOUT[0], _env_number(READ_TIMEOUT_ENV, TIMEOUT[1], "seconds"))
    pace = (_env_number(GRACE_ENV, PACE[0], "seconds"), _env_number(MIN_RATE_ENV, PACE[1], "bytes per second"))
    return Connections(os.environ.get(SOCKET_ENV) or None, timeout, pace)


class Transport:
    """Requests to one registry, authenticating on demand and retrying transient failures.
    Credentials (basic or a token) go only to the registry's own origin: an upload Location or a
    redirect that points elsewhere is followed without them."""

    def __init__(self, registry: str, credentials: Credentials | None = None,
                 connections: Connections | None = None):
        self.registry = registry
        self.base = f"{scheme_for(registry)}://{api_host(registry)}"
        self.origin = origin(self.base)
        self.credentials = credentials if credentials is not None else load_credentials(registry)
        self.connections = connections or _connections()
        self.wait_limit = _env_number(WAIT_LIMIT_ENV, RETRY_AFTER_TOTAL_S, "seconds")
        self._tokens: dict[str, str] = {}
        self._basic = False

    def request(self, method: str, path: str, *, scopes: tuple[str, ...] = (), ok=(200,),
                headers: dict | None = None, body=None, stream: bool = False,
                limit: int = DOCUMENT_LIMIT) -> Response:
        """Send one request; body may be bytes or a callable returning a fresh body per attempt.
        Unless `stream`, the response body is read here, refused past `limit` bytes (an error
        body past 64 KiB)."""
        url = path if path.startswith("http") else self.base + path
        attempts = ATTEMPTS if method in IDEMPOTENT else 1  # a resent POST/PATCH could act twice
        waited = 0.0
        for attempt in range(attempts):
            resp = self._send(method, url, scopes, headers, body)
            crashpoint.reached(f"{method} {path.split('?')[0]} answered {resp.status_code if resp is not None else '-'}")
            if resp is not None and resp.status_code == 401:
                resp.close()
                if origin(resp.url) != self.origin:
                    raise AuthError(f"{method} {untrusted.safe(resp.url, limit=QUOTED_LIMIT)}: that server asked for "
                                    f"credentials, but it is not {self.registry}, which sent us there; credentials go "
                                    f"only to the registry's own origin ({self.base}): the registry is misconfigured "
                                    f"or hostile")
                self._authenticate(resp, scopes)
                resp = self._send(method, url, scopes, headers, body)
                if resp is not None and resp.status_code == 401:
                    raise AuthError(
                        f"{method} {url}: access denied by {self.registry}: log in with "
                        f"`docker login {self.registry}` or set BAKERY_REGISTRY_USER/BAKERY_REGISTRY_PASSWORD")
            if resp is not None and resp.status_code not in RETRY_STATUSES:
                if resp.status_code not in ok:
                    raise (NotFound if resp.status_code == 404 else RegistryError)(self._describe(method, url, resp))
                if method == "HEAD":
                    resp.close()  # no body: its connection is free for the next request
                elif not stream:  # an answer that says "not there" says little
                    try:
                        read_bounded(resp, limit if resp.status_code < 400 else ERROR_BODY_LIMIT, f"{method} {url}",
                                     IntegrityError)
                    except TransientError as e:  # the body broke off: as good as no answer
                        if attempt + 1 == attempts:
                            raise TransientError(f"{e} ({self._tries(attempts)})") from None
                        time.sleep(backoff(attempt))
                        continue
                return resp
            if resp is not None and attempt + 1 < attempts:
                resp.close()  # a retried 5xx may be streaming: give its connection back
            if attempt + 1 < attempts:
                waited = self._pause(resp, attempt, waited, f"{method} {untrusted.safe(url, limit=QUOTED_LIMIT)}")
        tries = self._tries(attempts)
        if resp is None:
            raise TransientError(f"{method} {url}: {self.registry} unreachable ({tries}): "
                                 f"{self._last_error}; is the registry running and the name right?")
        raise TransientError(self._describe(method, url, resp) + f" ({tries})")

    def _pause(self, resp: Response | None, attempt: int, waited: float, what: str) -> float:
        """Wait before asking again; the seconds waited so far in all. A Retry-After that would take
        them past the limit is not waited for: a registry that keeps saying "later" ends the command
        (not a TransientError, which an upload would start over on)."""
        asked, delay = asked_wait(resp), retry_delay(resp, attempt)
        if asked is not None and resp is not None and waited + delay > self.wait_limit:  # asked: resp said so
            raise RegistryError(f"{what}: {self.registry} kept asking us to wait (HTTP {resp.status_code}, "
                                f"Retry-After): {waited:.0f} s waited and {asked:.0f} s more asked, past the "
                                f"{self.wait_limit:g} s one request waits in all ({WAIT_LIMIT_ENV}); try again later")
        time.sleep(delay)
        return waited + delay

    @staticmethod
    def _tries(attempts: int) -> str:
        return f"after {attempts} attempts" if attempts > 1 else "not resent: it is not idempotent"

    def _send(self, method, url, scopes, headers, body):
        """One request, following redirects ourselves: credentials only where the origin is the
        registry's, and a redirect's body never read. None when the connection failed. A URL the
        registry gave us (an upload's Location) is judged as a redirect is before it is asked."""
        hop = judge_hop(self.origin, url)  # the registry's own origin: Hop(None), resolved as usual
        if hop.refused:
            raise RegistryError(f"{method}: {self.registry} sent us to {hop.refused}: not followed")
        address = hop.address
        for _ in range(MAX_REDIRECTS + 1):
            hdrs = dict(headers or {})
            auth = self._auth_header(scopes) if origin(url) == self.origin else None
            if auth:
                hdrs["Authorization"] = auth
            data = body() if callable(body) else body
            try:
                resp = self._send_once(method, url, hdrs, data, address=address)
            except ConnectionFailed as e:  # refused, reset or timed out
                self._last_error = str(e)
                return None
            if resp.status_code not in REDIRECTS or "Location" not in resp.headers:
                return resp
            resp.close()
            try:
                url = urllib.parse.urljoin(url, resp.headers["Location"])
                urllib.parse.urlsplit(url).port  # noqa: B018 (raises on a malformed host or port)
            except ValueError:
                raise RegistryError(f"{method} {url}: {self.registry} redirected to an unreadable Location "
                                    f"{resp.headers['Location'][:100]!r}") from None
            hop = judge_hop(self.origin, url)
            if hop.refused:
                raise RegistryError(f"{method}: {self.registry} redirected to {hop.refused}: not followed")
            address = hop.address
            if resp.status_code == 303 or (resp.status_code in (301, 302) and method == "POST"):
                method, body = "GET", None
        raise RegistryError(f"{method} {untrusted.safe(url, limit=QUOTED_LIMIT)}: more than {MAX_REDIRECTS} redirects "
                            f"from {self.registry}")

    def _send_once(self, method: str, url: str, headers: dict, data, params=None, auth=None,
                   address: str | None = None) -> Response:
        """One HTTP exchange, its body left unread, no redirect followed; `params` are added to the
        query, `auth` (user, password) is sent as Basic; `address`: connect there, not to the URL's
        host resolved anew."""
        if params:
            url = url.split("#", 1)[0]  # a fragment is never sent; the query goes before it
            url += ("&" if urllib.parse.urlsplit(url).query else "?") + urllib.parse.urlencode(params)
        if auth:
            headers = {**headers, "Authorization": "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()}
        return self.connections.send(method, url, headers, data, address=address)

    def _auth_header(self, scopes) -> str | None:
        token = self._tokens.get(" ".join(scopes))
        if token:
            return f"Bearer {token}"
        if self._basic and self.credentials:
            raw = f"{self.credentials.username}:{self.credentials.password}".encode()
            return "Basic " + base64.b64encode(raw).decode()
        return None

    def _authenticate(self, resp, scopes) -> None:
        scheme, params = parse_challenge(resp.headers.get("WWW-Authenticate", ""))
        if scheme == "basic":
            if not self.credentials:
                raise AuthError(f"{self.registry} requires a login: run `docker login {self.registry}` "
                                f"or set BAKERY_REGISTRY_USER and BAKERY_REGISTRY_PASSWORD")
            self._basic = True
        elif scheme == "bearer" and "realm" in params:
            self._tokens[" ".join(scopes)] = self._fetch_token(params, scopes)
        else:
            raise AuthError(f"{self.registry} asked for unsupported authentication {scheme!r}")

    def _fetch_token(self, params: dict, scopes) -> str:
        # an https registry sends us to https token services only, and a plain-http one (loopback or
        # listed insecure) to its own host: any other realm would have us fetch whatever URL it
        # names (an internal one) and hand its answer back to it
        scheme, host, _ = origin(params["realm"])
        if not (scheme == "https" and host) and not (scheme == "http" and self.base.startswith("http://")
                                                     and host == self.origin[1]):
            raise AuthError(f"{self.registry} names a token service {params['realm'][:100]!r}: refused (an https "
                            f"registry's must be https; a plain one's must be on its own host)")
        realm = untrusted.safe(params["realm"], limit=QUOTED_LIMIT)  # the registry's text, in our messages
        # elsewhere than the registry's own host: where a redirect could go, or a LAN address (an
        # on-premises registry's token service), never a metadata service or this machine's loopback
        # (the answer goes back to the registry as the token), at the address judged
        hop = judge_hop(self.origin, params["realm"], private_ok=True) if host != self.origin[1] else Hop(None)
        if hop.refused:
            raise AuthError(f"{self.registry} names a token service at {hop.refused}: refused")
        query = [("service", params["service"])] if "service" in params else []
        wanted = list(scopes) or ([params["scope"]] if "scope" in params else [])
        query += [("scope", s) for s in wanted]
        auth = (self.credentials.username, self.credentials.password) \
            if self.credentials and realm_may_receive_credentials(params["realm"]) else None
        if self.credentials and auth is None:
            print(f"warning: {self.registry}'s token service {realm} is not https: asking it "
                  f"anonymously, credentials withheld", file=sys.stderr)
        waited = 0.0
        for attempt in range(ATTEMPTS):
            try:  # no redirects: a token service that moves elsewhere would take the credentials along
                resp = self._send_once("GET", params["realm"], {}, None, params=query, auth=auth,
                                       address=hop.address)
            except ConnectionFailed as e:
                resp, err = None, e
            if resp is not None and resp.status_code not in RETRY_STATUSES:
                break
            if resp is not None:
                resp.close()
            waited = self._pause(resp, attempt, waited, f"token service {realm}")
        if resp is None:
            raise RegistryError(f"token service {realm} unreachable: {err}")
        if resp.status_code in (401, 403):
            resp.close()
            raise AuthError(f"token service for {self.registry} refused "
                            f"{'our credentials' if auth else 'anonymous access'} for {' '.join(wanted)}: "
                            f"check `docker login {self.registry}` or BAKERY_REGISTRY_USER/PASSWORD")
        if resp.status_code != 200:
            resp.close()
            raise RegistryError(f"token service {realm} answered HTTP {resp.status_code}")
        read_bounded(resp, DOCUMENT_LIMIT, f"token service {realm}", RegistryError)
        try:
            data = resp.json()
            token = data.get("token") or data.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not token or not isinstance(token, str) or not re.fullmatch(r"[\x21-\x7e]+", token):
            raise AuthError(f"token service {realm} returned no token (or one that is not printable "
                            f"ASCII, which no header may carry)")
        return token

    @staticmethod
    def _describe(method: str, url: str, resp) -> str:
        """What the registry said went wrong: its error codes, else the start of its body (read up
        to 64 KiB; a longer error body is refused). Its words are the registry's: quoted on one line,
        inert and in part (the edge keeps our own messages' line breaks, so a new line of its text
        would start a line of its choosing, and a long one would push off what we say after it)."""
        read_bounded(resp, ERROR_BODY_LIMIT, f"{method} {url}: HTTP {resp.status_code} error body", RegistryError)
        detail = ""
        try:
            errors = resp.json().get("errors") or []
            detail = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors)
        except (ValueError, AttributeError, TypeError):
            detail = (resp.text or "")[:200].strip()
        detail = untrusted.safe(detail, limit=QUOTED_LIMIT)
        said = f"{method} {untrusted.safe(url, limit=QUOTED_LIMIT)}: HTTP {resp.status_code}"
        return said + (f" ({detail})" if detail else "")
