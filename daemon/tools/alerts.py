"""`loadwatch alerts`: the shipped alert rules with the runbooks' base URL filled in.

The rules (prometheus/alerts.yml) name each alert's runbook as `RUNBOOK_BASE_URL/runbook.md#anchor`:
the one place to say where the runbooks live (a wiki, an internal docs site, the copy of
docs/runbook.md next to the install) is `--runbook-base-url`, which writes the rules with that
base. Nothing else in the rules changes, so `promtool check rules` and the shipped unit tests
hold for the output as for the file.
"""

from __future__ import annotations

import os
import sys
import urllib.parse
from importlib.resources import files
from pathlib import Path

TOKEN = "RUNBOOK_BASE_URL"
RULES_ENV = "LOADWATCH_ALERTS_FILE"


class AlertsError(Exception):
    """One line for the user, and the exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def check_base(url: str) -> str:
    """An absolute http(s) or file URL, without a trailing slash."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https", "file") or not (parts.netloc or parts.path):
        raise AlertsError(
            f"--runbook-base-url {url!r}: expected an absolute http://, https:// or file:// URL",
            64,
        )
    if any(c in url for c in " \"'{}\n"):
        raise AlertsError(f"--runbook-base-url {url!r}: quotes, braces and spaces cannot go", 64)
    return url.strip().rstrip("/")


def render(text: str, base_url: str) -> str:
    if TOKEN not in text:
        raise AlertsError(f"the rules name no {TOKEN}: not loadwatch's alerts file?", 65)
    return text.replace(TOKEN, check_base(base_url))


def _packaged(name: str) -> str | None:
    """The rules file the wheel carries (loadwatch.ops.prometheus), when on disk."""
    try:
        from importlib.resources import files

        return str(files("loadwatch.ops.prometheus") / name)
    except (ImportError, TypeError):
        return None


def default_rules() -> Path | None:
    """Where the rules file is: $LOADWATCH_ALERTS_FILE, else the one the install carries (the
    wheel's ops files, which `loadwatch install-files` writes out)."""
    given = os.environ.get(RULES_ENV)
    if given:
        return Path(given)
    try:
        carried = files("loadwatch.ops.prometheus") / "alerts.yml"
    except ModuleNotFoundError:
        return None
    return Path(str(carried)) if carried.is_file() else None


def alerts_command(base_url: str, rules: Path | None, output: Path | None) -> int:
    try:
        path = rules or default_rules()
        if path is None:
            raise AlertsError(f"no alerts file found: give --rules FILE (or set {RULES_ENV})", 66)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise AlertsError(f"{path}: {exc.strerror or exc}", 66) from None
        out = render(text, base_url)
        if output is None:
            sys.stdout.write(out)
            return 0
        tmp = output.with_name(f".{output.name}.tmp")
        try:
            tmp.write_text(out, encoding="utf-8")
            os.replace(tmp, output)  # atomic: Prometheus never reads half a file
        except OSError as exc:
            raise AlertsError(f"{output}: {exc.strerror or exc}", 73) from None
        return 0
    except AlertsError as exc:
        print(f"loadwatch: {exc}", file=sys.stderr)
        return exc.code
