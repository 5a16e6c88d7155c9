"""Poll vLLM's ``/health``: 200 means serving, 503 means the engine is dead, refused means loading.

Where the probes go is an `Endpoint`, one scheme, host and port, checked before any connection:
- ``[vllm] health_url`` or the supervised argv's ``--host``/``--port``: the operator's word;
- else the URL the log printed (``Starting vLLM API server 0 on http://0.0.0.0:8000``). The log is
  untrusted (vLLM prints text its clients choose), so that URL must be ``http`` and its host
  loopback (a wildcard bind meaning loopback) or one of ``[vllm] allowed_hosts``; anything
  else is `UrlRefused` and nothing is asked.

Every request is one ``http.client`` connection to the endpoint: no proxy from the environment,
no redirect followed (a 3xx is a failed probe), no other scheme. The probe is blocking with a
short timeout; ``HealthProber.probe`` runs it in a worker thread so the event loop never waits.
"""

from __future__ import annotations

import asyncio
import http.client
import ipaddress
import json
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loadwatch.parsers.vllm.argv import option

DEFAULT_PORT = 8000  # vLLM's, for a URL that names none
# A wildcard bind address is no destination: the server is reached on loopback.
WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1"}
SHOWN_CHARS = 120  # of a refused URL in its message (it is the log's text, of any length)


class UrlRefused(ValueError):
    """A URL the probes will not go to; the message says why in one line."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """The one place every probe of a vLLM goes: `/health`, and for the servable check its
    OpenAI routes under the same prefix."""

    scheme: str  # "http", or "https" where the operator configured it
    host: str  # without brackets
    port: int
    health_path: str = "/health"

    @property
    def api_prefix(self) -> str:
        """The path before ``/health`` (a configured URL's, such as a gateway's ``/vllm``)."""
        path = self.health_path.split("?", 1)[0]
        return path[: -len("/health")] if path.endswith("/health") else ""

    @property
    def netloc(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def health_url(self) -> str:
        return f"{self.scheme}://{self.netloc}{self.health_path}"


def _show(url: str) -> str:
    text = url if len(url) <= SHOWN_CHARS else url[: SHOWN_CHARS - 3] + "..."
    return repr(text)


def _split(url: str, default_port: int | None) -> tuple[urllib.parse.SplitResult, str, int]:
    """The parts, the host (a wildcard made loopback) and the port, or UrlRefused."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:  # (a port that is no number, a bad IPv6 literal)
        raise UrlRefused(f"{_show(url)} is no URL with a valid port: {exc}") from None
    host = parts.hostname
    if not host:
        raise UrlRefused(f"{_show(url)} names no host")
    if parts.username is not None or parts.password is not None:
        raise UrlRefused(f"{_show(url)} carries credentials")
    if port is None:
        port = default_port if default_port is not None else _scheme_port(parts.scheme)
    if port == 0:
        raise UrlRefused(f"{_show(url)} names port 0")
    return parts, WILDCARDS.get(host, host), port


def _scheme_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _same_host(host: str, allowed: str) -> bool:
    try:
        return ipaddress.ip_address(host) == ipaddress.ip_address(allowed)
    except ValueError:
        return host.lower() == allowed.lower()


def endpoint_from_log(logged: str, allowed_hosts: Sequence[str] = ()) -> Endpoint:
    """Where the URL vLLM logged points, if the probes may go there: ``http`` only, to a loopback
    host (a wildcard bind is loopback) or one of `allowed_hosts`. Its path is not used."""
    parts, host, port = _split(logged, DEFAULT_PORT)
    if parts.scheme != "http":
        raise UrlRefused(f"{_show(logged)}: only an http URL is probed, not {parts.scheme!r}")
    if not is_loopback(host) and not any(_same_host(host, a) for a in allowed_hosts):
        raise UrlRefused(
            f"{_show(logged)}: {host} is not loopback nor in [vllm] allowed_hosts"
            " (or set [vllm] health_url)"
        )
    return Endpoint("http", host, port)


def endpoint_from_config(url: str) -> Endpoint:
    """``[vllm] health_url``: any host the operator names, http or https, a valid port."""
    parts, host, port = _split(url, None)
    if parts.scheme not in ("http", "https"):
        raise UrlRefused(f"{_show(url)}: the URL must be http or https, not {parts.scheme!r}")
    path = (parts.path or "/health") + (f"?{parts.query}" if parts.query else "")
    return Endpoint(parts.scheme, host, port, path)


def endpoint_from_argv(argv: Sequence[str]) -> Endpoint:
    """``/health`` from vLLM's ``--host``/``--port`` (and ``--ssl-keyfile`` for https)."""
    host = option(argv, "--host") or "127.0.0.1"
    port = option(argv, "--port") or str(DEFAULT_PORT)
    scheme = "https" if option(argv, "--ssl-keyfile") else "http"
    bracketed = f"[{host}]" if ":" in host and not host.startswith("[") else host
    parts, host, port_n = _split(f"{scheme}://{bracketed}:{port}", DEFAULT_PORT)
    return Endpoint(parts.scheme, host, port_n)


# -- requests ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int
    body: bytes


def _request(
    ep: Endpoint,
    method: str,
    path: str,
    timeout_s: float,
    *,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    limit: int = 1 << 20,
) -> _Answer:
    """One request on its own connection to `ep`; raises OSError, HTTPException."""
    conn_type = http.client.HTTPSConnection if ep.scheme == "https" else http.client.HTTPConnection
    conn = conn_type(ep.host, ep.port, timeout=timeout_s)
    try:
        conn.request(method, path, body=body, headers=dict(headers or {}))
        resp = conn.getresponse()
        return _Answer(resp.status, resp.read(limit))
    finally:
        conn.close()


def _status_error(status: int) -> str:
    if 300 <= status < 400:
        return f"HTTP {status}: a redirect, not followed"
    return f"HTTP {status}"


def _line(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())[:300]


@dataclass(frozen=True, slots=True)
class HealthResult:
    ok: bool  # True only for HTTP 200
    checked_at: float  # epoch seconds
    status: int | None = None  # HTTP status, None when no answer
    error: str | None = None  # one line when not ok
    elapsed_s: float | None = None


def probe_health(
    ep: Endpoint, timeout_s: float = 2.0, clock: Callable[[], float] = time.time
) -> HealthResult:
    """One blocking GET of the endpoint's ``/health``. Never raises for network faults."""
    started = time.monotonic()
    at = clock()
    try:
        answer = _request(ep, "GET", ep.health_path, timeout_s, limit=4096)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return HealthResult(False, at, None, _line(exc), time.monotonic() - started)
    elapsed = time.monotonic() - started
    if answer.status == 200:
        return HealthResult(True, at, 200, None, elapsed)
    return HealthResult(False, at, answer.status, _status_error(answer.status), elapsed)


class HealthProber:
    """What the daemon calls once the log says the API is up."""

    def __init__(
        self, endpoint: Endpoint, timeout_s: float = 2.0, clock: Callable[[], float] = time.time
    ) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._clock = clock
        self.last: HealthResult | None = None
        self.probes_total = 0
        self.failures_total = 0

    async def probe(self) -> HealthResult:
        result = await asyncio.to_thread(probe_health, self.endpoint, self.timeout_s, self._clock)
        self.last = result
        self.probes_total += 1
        if not result.ok:
            self.failures_total += 1
        return result

    @property
    def ready(self) -> bool:
        return self.last is not None and self.last.ok


# -- servable: one tiny completion ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CompletionResult:
    ok: bool
    checked_at: float  # epoch seconds, when the request was sent
    latency_s: float | None  # the completion request's round trip (one token: the first)
    model: str | None  # the served model name /v1/models gave
    status: int | None = None
    error: str | None = None  # one line when not ok


def probe_completion(
    ep: Endpoint,
    prompt: str,
    timeout_s: float = 60.0,
    clock: Callable[[], float] = time.time,
    api_key: str | None = None,
) -> CompletionResult:
    """At the endpoint (where /health is probed): the served model from `GET /v1/models`, then
    one `POST /v1/completions` of `max_tokens` 1, both with the API key vLLM asks for when it
    has one (``Authorization: Bearer``). Never raises for network or HTTP faults."""
    at = clock()
    auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        answer = _request(ep, "GET", f"{ep.api_prefix}/v1/models", timeout_s, headers=auth)
        if answer.status != 200:
            error = f"/v1/models: {_status_error(answer.status)}"
            return CompletionResult(False, at, None, None, answer.status, error)
        model = str(json.loads(answer.body)["data"][0]["id"])
    except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError, TypeError) as exc:
        return CompletionResult(False, at, None, None, None, f"/v1/models: {_line(exc)}")
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 1}).encode()
    headers = {"Content-Type": "application/json", **auth}
    started = time.monotonic()
    try:
        answer = _request(
            ep, "POST", f"{ep.api_prefix}/v1/completions", timeout_s, body=body, headers=headers
        )
        latency = time.monotonic() - started
        if answer.status != 200:
            error = _status_error(answer.status)
            return CompletionResult(False, at, latency, model, answer.status, error)
        doc: Any = json.loads(answer.body)
        if not isinstance(doc, dict) or not doc.get("choices"):
            return CompletionResult(False, at, latency, model, 200, "no choices in the answer")
    except (OSError, http.client.HTTPException, ValueError) as exc:
        latency = time.monotonic() - started
        return CompletionResult(False, at, latency, model, None, _line(exc))
    return CompletionResult(True, at, latency, model, 200)
