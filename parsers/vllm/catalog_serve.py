"""The catalog's entries for the API server: coming up (its URL, its routes, uvicorn's start-up
lines) and going down (vLLM's `[shutdown]` lines, uvicorn's)."""

from __future__ import annotations

from loadwatch.parsers.entries import (
    Entry,
    rx,
)
from loadwatch.parsers.vllm.builders import (
    milestone,
    shutdown,
)

# the API server's files: openai/api_server.py, entry.py (0.32), api_utils.py, launcher.py
API_SERVER = ("api_server.py", "entry.py", "api_utils.py", "launcher.py")
# uvicorn's own loggers (server.py, lifespan/on.py), should a log config give them vLLM's header
UVICORN = ("server.py", "on.py", "main.py", "config.py")

SERVE: tuple[Entry, ...] = (
    Entry(
        "ms.api_server",
        ("Starting vLLM",),
        rx(r"Starting vLLM (?:API )?server(?: \d{1,4}+)? on (?P<url>\S{1,400}+)"),
        milestone("api_server_start", value="url"),
        "info",
        loggers=API_SERVER,
    ),
    Entry(
        "ms.uvicorn_running",
        ("Uvicorn running on",),
        rx(r"Uvicorn running on (?P<url>\S{1,400}+)"),
        milestone("api_server_start", detail="uvicorn", value="url"),
        "info",
        serving=True,  # uvicorn prints it after "Application startup complete"
        loggers=UVICORN,
    ),
    Entry(
        "ms.routes",
        ("Available routes are",),
        rx(r"^Available routes are:"),
        milestone("api_server_start", detail="routes"),
        "info",
        loggers=API_SERVER,
    ),
    Entry(
        "ms.uvicorn_started",
        ("Started server process",),
        rx(r"^Started server process \[(?P<pid>\d{1,10}+)\]"),
        milestone("api_server_start", detail="server_process", value="pid"),
        "info",
        loggers=UVICORN,
    ),
    Entry(
        "ms.app_waiting",
        ("Waiting for application startup",),
        rx(r"^Waiting for application startup\."),
        milestone("api_server_start", detail="waiting_startup"),
        "info",
        loggers=UVICORN,
    ),
    Entry(
        "ms.app_complete",
        ("Application startup complete",),
        rx(r"^Application startup complete\."),
        milestone("app_startup_complete"),
        "info",
        loggers=UVICORN,
    ),
    Entry(
        "ms.shutdown",
        ("[shutdown]", "Shutting down", "application shutdown", "Application shutdown complete"),
        rx(
            r"^\[shutdown\] (?P<what>.{1,200}+)|^(?P<uv>Shutting down|Waiting for application shutdown"
            r"|Application shutdown complete)"
        ),
        shutdown,
        "info",
        serving=True,  # a stop usually comes while serving
        # vLLM's `[shutdown]` lines (2026-05, #43707) from the engine core, its client, the
        # executor, the process manager and the API server; uvicorn's own
        loggers=(
            *API_SERVER,
            *UVICORN,
            "serve.py",
            "core.py",
            "core_client.py",
            "multiproc_executor.py",
            "utils.py",
            "system_utils.py",
            "async_llm.py",
        ),
    ),
)
