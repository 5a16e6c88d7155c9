"""The HTTP side's settings: what `[http]` in the config (daemon/config.py reads and checks it)
decides for the server. A frozen value the server is handed, so the exporters need nothing of
the daemon to know how to serve; and whether the files it names are of use to the server."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PORT = 9321


@dataclass(frozen=True)
class HttpConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    tls_cert: Path | None = None
    tls_key: Path | None = None
    bearer_token_file: Path | None = None
    basic_auth_user: str | None = None
    basic_auth_password_file: Path | None = None
    max_connections: int = 256
    request_timeout_s: float = 10.0
    # Counters that only grow (lines read, GPU readings) are rendered when a scrape asks for
    # them, at most this often; a transition, a failure, a stall or a change of readiness at
    # once. A scrape sees nothing older than this.
    publish_interval_s: float = 1.0
    # A second listener for /healthz, /readyz and /livez only, without TLS or credentials: the
    # kubelet's probes carry none. None: the probes are served on the main listener only.
    probe_host: str | None = None
    probe_port: int | None = None

    @property
    def authenticated(self) -> bool:
        return self.bearer_token_file is not None or self.basic_auth_user is not None

    @property
    def loopback(self) -> bool:
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return self.host == "localhost"


def files_problem(http: HttpConfig) -> str | None:
    """A certificate, key or secret file the HTTP server could not use, in one line: checked
    before anything starts, as a configuration error (a restart would not mend it)."""
    files = (
        ("tls_cert", http.tls_cert, False),
        ("tls_key", http.tls_key, False),
        ("bearer_token_file", http.bearer_token_file, True),
        ("basic_auth_password_file", http.basic_auth_password_file, True),
    )
    for name, path, secret in files:
        if path is None:
            continue
        try:
            data = path.read_bytes()
        except OSError as exc:
            return f"[http] {name}: cannot read {path}: {exc.strerror or exc}"
        if secret and not data.strip():
            return f"[http] {name}: {path} is empty"
        if not secret and not data:
            return f"[http] {name}: {path} is empty"
    if http.tls_cert is not None and http.tls_key is not None:
        import ssl  # (for a configured certificate alone: `analyze` reads these settings too)

        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(http.tls_cert, http.tls_key)
        except (OSError, ssl.SSLError) as exc:
            return f"[http] tls_cert: {http.tls_cert} and {http.tls_key} are no certificate and key: {exc}"
    return None
