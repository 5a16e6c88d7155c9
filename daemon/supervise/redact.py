"""Keep secrets inside the process: vLLM's argv and environment may carry API keys and tokens.

A `Redactor` learns the secret values once (from the flags and variables that carry them) and
replaces them wherever they would leave the process: /status, the event log, the console, error
messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

MASK = "***"
# Flags whose value is a secret (`--api-key X` and `--api-key=X`).
SECRET_FLAGS = ("--api-key", "--hf-token", "--token", "--ssl-keyfile-password", "--password")
# Environment variables whose value is a secret, by name fragment.
SECRET_ENV_WORDS = ("TOKEN", "API_KEY", "APIKEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
MIN_SECRET_LEN = 4  # shorter values would mask ordinary text


def is_secret_env(name: str) -> bool:
    upper = name.upper()
    return any(word in upper for word in SECRET_ENV_WORDS)


class Redactor:
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: list[str] = []
        for s in secrets:
            self.add(s)

    def add(self, secret: str) -> None:
        if len(secret) >= MIN_SECRET_LEN and secret not in self._secrets:
            self._secrets.append(secret)
            self._secrets.sort(key=len, reverse=True)  # longest first: no partial leftovers

    def learn(self, argv: Iterable[str] = (), env: Mapping[str, str] | None = None) -> None:
        args = list(argv)
        for i, arg in enumerate(args):
            flag, eq, value = arg.partition("=")
            if flag in SECRET_FLAGS:
                if eq:
                    self.add(value)
                elif i + 1 < len(args):
                    self.add(args[i + 1])
        for name, value in (env or {}).items():
            if is_secret_env(name):
                self.add(value)

    def text(self, value: str) -> str:
        for secret in self._secrets:
            if secret in value:
                value = value.replace(secret, MASK)
        for secret in self._secrets:
            value = _cut_ends(value, secret)
        return value

    def argv(self, argv: Iterable[str]) -> list[str]:
        return [self.text(a) for a in argv]

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        return {k: MASK if is_secret_env(k) else self.text(v) for k, v in env.items()}

    def value(self, value: Any) -> Any:
        """Redact strings anywhere inside JSON-like data."""
        if not self._secrets:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {k: self.value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.value(v) for v in value]
        return value


def _cut_ends(value: str, secret: str) -> str:
    """Mask part of a secret at either end: a message cut to a length limit (the parser keeps
    the first 2000 characters of a line) may end in the first characters of one."""
    for n in range(len(secret) - 1, MIN_SECRET_LEN - 1, -1):
        if value.endswith(secret[:n]):
            value = value[:-n] + MASK
            break
    for n in range(len(secret) - 1, MIN_SECRET_LEN - 1, -1):
        if value.startswith(secret[-n:]):
            value = MASK + value[n:]
            break
    return value
