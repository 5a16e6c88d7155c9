"""Poll vLLM's ``/health``: 200 means serving, 503 means the engine is dead, refused means loading.

The probe is a blocking urllib call with a short timeout; ``HealthProber.probe`` runs it in a
worker thread so the event loop never waits on the network.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from loadwatch.parsers.vllm.argv import option

DEFAULT_PORT = 8000

# Loopback only: the daemon runs beside vLLM, and proxies from the environment must not apply.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True, slots=True)
class HealthResult:
    ok: bool  # True only for HTTP 200
    checked_at: float  # epoch seconds
    status: int | None = None  # HTTP status, None when no answer
    error: str | None = None  # one line when not ok
    elapsed_s: float | None = None


def probe_health(
    url: str, timeout_s: float = 2.0, clock: Callable[[], float] = time.time
) -> HealthResult:
    """One blocking GET of ``url``. Never raises for network faults."""
    started = time.monotonic()
    at = clock()
    try:
        with _OPENER.open(url, timeout=timeout_s) as resp:
            status = int(resp.status)
            resp.read(4096)
    except urllib.error.HTTPError as exc:
        return HealthResult(
            ok=False,
            checked_at=at,
            status=exc.code,
            error=f"HTTP {exc.code}",
            elapsed_s=time.monotonic() - started,
        )
    except urllib.error.URLError as exc:
        reason = exc.reason
        text = "timed out" if isinstance(reason, TimeoutError) else str(reason)
        return _fail(at, started, text)
    except TimeoutError:
        return _fail(at, started, "timed out")
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return _fail(at, started, f"{type(exc).__name__}: {exc}")
    elapsed = time.monotonic() - started
    if status == 200:
        return HealthResult(ok=True, checked_at=at, status=status, elapsed_s=elapsed)
    return HealthResult(
        ok=False, checked_at=at, status=status, error=f"HTTP {status}", elapsed_s=elapsed
    )


def _fail(at: float, started: float, text: str) -> HealthResult:
    return HealthResult(
        ok=False, checked_at=at, error=" ".join(text.split()), elapsed_s=time.monotonic() - started
    )


def health_url(api_url: str) -> str:
    """``/health`` next to the URL vLLM logged (``Starting vLLM API server on http://0.0.0.0:8000``).

    A wildcard bind address is not a destination, so it becomes the loopback address.
    """
    parts = urllib.parse.urlsplit(api_url.strip())
    scheme = parts.scheme or "http"
    host = parts.hostname or "127.0.0.1"
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    port = parts.port or DEFAULT_PORT
    return f"{scheme}://{host}:{port}/health"


def health_url_from_argv(argv: Sequence[str]) -> str:
    """``/health`` from vLLM's ``--host``/``--port`` (and ``--ssl-keyfile`` for https)."""
    host = option(argv, "--host") or "127.0.0.1"
    port = option(argv, "--port") or str(DEFAULT_PORT)
    scheme = "https" if option(argv, "--ssl-keyfile") else "http"
    return health_url(f"{scheme}://{_bracket(host)}:{port}")


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


class HealthProber:
    """What the daemon calls once the log says the API is up."""

    def __init__(
        self, url: str, timeout_s: float = 2.0, clock: Callable[[], float] = time.time
    ) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._clock = clock
        self.last: HealthResult | None = None
        self.probes_total = 0
        self.failures_total = 0

    async def probe(self) -> HealthResult:
        result = await asyncio.to_thread(probe_health, self.url, self.timeout_s, self._clock)
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
    health: str,
    prompt: str,
    timeout_s: float = 60.0,
    clock: Callable[[], float] = time.time,
) -> CompletionResult:
    """Next to `health` (the /health URL): the served model from `GET /v1/models`, then one
    `POST /v1/completions` of `max_tokens` 1. Never raises for network or HTTP faults."""
    base = health.rsplit("/health", 1)[0]
    at = clock()
    try:
        with _OPENER.open(f"{base}/v1/models", timeout=timeout_s) as resp:
            listing = json.loads(resp.read(1 << 20))
        model = str(listing["data"][0]["id"])
    except urllib.error.HTTPError as exc:
        return CompletionResult(False, at, None, None, exc.code, f"/v1/models: HTTP {exc.code}")
    except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError, TypeError) as exc:
        return CompletionResult(False, at, None, None, None, f"/v1/models: {_line(exc)}")
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 1}).encode()
    req = urllib.request.Request(
        f"{base}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    started = time.monotonic()
    try:
        with _OPENER.open(req, timeout=timeout_s) as resp:
            answer = json.loads(resp.read(1 << 20))
        latency = time.monotonic() - started
        if not answer.get("choices"):
            return CompletionResult(False, at, latency, model, 200, "no choices in the answer")
    except urllib.error.HTTPError as exc:
        latency = time.monotonic() - started
        return CompletionResult(False, at, latency, model, exc.code, f"HTTP {exc.code}")
    except (OSError, http.client.HTTPException, ValueError, AttributeError) as exc:
        latency = time.monotonic() - started
        return CompletionResult(False, at, latency, model, None, _line(exc))
    return CompletionResult(True, at, latency, model, 200)


def _line(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    text = (
        "timed out" if isinstance(exc, TimeoutError) else str(reason or exc) or type(exc).__name__
    )
    return " ".join(text.split())[:300]
