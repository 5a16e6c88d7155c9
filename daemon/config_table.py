"""The typed reading of one TOML table, for daemon/config.py: getters that name the key
(`[section] key`) in the one-line `ConfigError` they raise, and unknown keys as errors. The
getters also record what they read, so the configuration's schema is the code that reads it
(`SCHEMA`: docs/config.md is generated from it and cannot drift)."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from loadwatch.daemon.sources.gpu.scope import parse_selector

T = TypeVar("T")


class ConfigError(Exception):
    """A configuration problem: `key` is `[section] name`, `problem` one line."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key
        self.problem = problem


@dataclass(frozen=True)
class Key:
    """One key a reader asked for: its table ('' for the top level), name, kind and default."""

    table: str
    name: str
    kind: str
    default: Any

    @property
    def ref(self) -> str:
        return f"[{self.table}] {self.name}" if self.table else self.name


# While set, every getter appends the key it reads (config_reference.py sets it).
SCHEMA: ContextVar[list[Key] | None] = ContextVar("SCHEMA", default=None)


class Table:
    """One TOML table being read: typed getters that name the key in their errors."""

    def __init__(self, name: str, data: Any) -> None:
        if not isinstance(data, Mapping):
            raise ConfigError(f"[{name}]", "must be a table")
        self.name = name
        self.data = data
        self.seen: set[str] = set()

    def key(self, key: str) -> str:
        return f"[{self.name}] {key}" if self.name else key

    def _get(self, key: str, default: T, check: Callable[[Any], T], kind: str) -> T:
        self.seen.add(key)
        schema = SCHEMA.get()
        if schema is not None:
            schema.append(Key(self.name, key, kind, default))
        if key not in self.data:
            return default
        try:
            return check(self.data[key])
        except ValueError as exc:
            raise ConfigError(self.key(key), str(exc)) from None

    def number(
        self, key: str, default: float, *, minimum: float = 0.0, maximum: float = 1e9
    ) -> float:
        def check(v: Any) -> float:
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ValueError(f"expected a number, got {_show(v)}")
            if not minimum <= v <= maximum:
                raise ValueError(f"must be between {minimum:g} and {maximum:g}, got {v:g}")
            return float(v)

        return self._get(key, default, check, f"number, {minimum:g} to {maximum:g}")

    def opt_number(self, key: str, *, minimum: float = 0.0) -> float | None:
        if key not in self.data:
            self._get(key, None, lambda v: None, f"number, {minimum:g} or more; unset: none")
            return None
        return self.number(key, 0.0, minimum=minimum)

    def integer(self, key: str, default: int, *, minimum: int = 0, maximum: int = 2**62) -> int:
        def check(v: Any) -> int:
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"expected an integer, got {_show(v)}")
            if not minimum <= v <= maximum:
                raise ValueError(f"must be between {minimum} and {maximum}, got {v}")
            return v

        return self._get(key, default, check, f"integer, {minimum} to {maximum}")

    def boolean(self, key: str, default: bool) -> bool:
        def check(v: Any) -> bool:
            if not isinstance(v, bool):
                raise ValueError(f"expected true or false, got {_show(v)}")
            return v

        return self._get(key, default, check, "true or false")

    def string(self, key: str, default: str | None, kind: str = "string") -> str | None:
        def check(v: Any) -> str:
            if not isinstance(v, str) or not v:
                raise ValueError(f"expected a non-empty string, got {_show(v)}")
            return v

        return self._get(key, default, check, kind)

    def choice(self, key: str, default: str, options: tuple[str, ...]) -> str:
        def check(v: Any) -> str:
            if v not in options:
                raise ValueError(f"must be one of {', '.join(options)}; got {_show(v)}")
            return cast(str, v)

        return self._get(key, default, check, "one of " + ", ".join(f"`{o}`" for o in options))

    def path(self, key: str, default: Path | None) -> Path | None:
        value = self.string(key, None, "path")
        if value is not None and "\0" in value:
            # No system call takes one: a path with it names nothing (and open() raises).
            raise ConfigError(self.key(key), f"a path cannot hold a NUL byte: {_show(value)}")
        return default if value is None else Path(value).expanduser()

    def paths(self, key: str) -> tuple[Path, ...] | None:
        """A list of absolute paths; None when the key is absent."""

        def check(v: Any) -> tuple[Path, ...]:
            if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
                raise ValueError("expected a list of absolute paths, e.g. ['/models']")
            out = []
            for x in v:
                if "\0" in x:
                    raise ValueError(f"a path cannot hold a NUL byte: {_show(x)}")
                path = Path(x).expanduser()
                if not path.is_absolute():
                    raise ValueError(f"expected an absolute path, got {_show(x)}")
                out.append(path)
            return tuple(out)

        return self._get(key, None, check, "list of absolute paths")

    def strings(self, key: str) -> tuple[str, ...]:
        def check(v: Any) -> tuple[str, ...]:
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise ValueError("expected a list of strings (an argv list, never a shell line)")
            return tuple(v)

        return self._get(key, (), check, "list of strings")

    def names(self, key: str, known: tuple[str, ...]) -> tuple[str, ...]:
        """A list of names out of `known`, each once (order kept: it may matter)."""

        def check(v: Any) -> tuple[str, ...]:
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise ValueError(f"expected a list of names out of {', '.join(known)}")
            for x in v:
                if x not in known:
                    raise ValueError(f"unknown name {_show(x)}; known: {', '.join(known)}")
            if len(set(v)) != len(v):
                raise ValueError("a name is listed twice")
            return tuple(v)

        return self._get(key, (), check, "list of " + ", ".join(f"`{k}`" for k in known))

    def user(self, key: str) -> int | str | None:
        """A user name, or a uid (an integer, or a string of digits)."""

        def check(v: Any) -> int | str:
            if isinstance(v, str) and v.isdigit():
                v = int(v)
            if isinstance(v, bool) or not isinstance(v, int | str) or v == "":
                raise ValueError(f"expected a user name or uid, got {_show(v)}")
            if isinstance(v, int) and not 0 <= v < 2**32 - 1:
                raise ValueError(f"a uid is 0 to {2**32 - 2}, got {v}")
            return v

        return self._get(key, None, check, "user name or uid")

    def hosts(self, key: str) -> tuple[str, ...]:
        """Host names or IP addresses (an IPv6 one with or without brackets), lower-cased."""

        def check(v: Any) -> tuple[str, ...]:
            if not isinstance(v, list):
                raise ValueError("expected a list of host names or IP addresses")
            return tuple(_host(x) for x in v)

        return self._get(key, (), check, "list of host names or IP addresses")

    def devices(self, key: str) -> tuple[int | str, ...] | None:
        def check(v: Any) -> tuple[int | str, ...]:
            if not isinstance(v, list):
                raise ValueError("expected a list of GPU indices or UUIDs, e.g. [0, 1]")
            out: list[int | str] = []
            for x in v:
                if isinstance(x, bool) or not isinstance(x, int | str):
                    raise ValueError(f"expected a GPU index or UUID, got {_show(x)}")
                if isinstance(x, int):
                    if x < 0:
                        raise ValueError(f"a GPU index is 0 or more, got {x}")
                    out.append(x)
                else:
                    out.append(parse_selector(x))
            return tuple(out)

        return self._get(key, None, check, "list of GPU indices or UUIDs")

    def mapping(self, key: str) -> dict[str, str]:
        def check(v: Any) -> dict[str, str]:
            if not isinstance(v, Mapping) or not all(
                isinstance(k, str) and isinstance(x, str) for k, x in v.items()
            ):
                raise ValueError("expected a table of string values")
            return dict(v)

        return self._get(key, {}, check, "table of strings")

    def done(self, tables: frozenset[str] | set[str] = frozenset()) -> None:
        unknown = sorted(set(self.data) - self.seen - tables)
        if unknown:
            raise ConfigError(self.key(unknown[0]), "unknown key")


def _host(v: Any) -> str:
    """One host: an IP address (not a wildcard) or a DNS name of letters, digits, `-` and `.`."""
    if not isinstance(v, str) or not v:
        raise ValueError(f"expected a host name or IP address, got {_show(v)}")
    text = v[1:-1] if v.startswith("[") and v.endswith("]") else v
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        pass
    else:
        if ip.is_unspecified:
            raise ValueError(f"{_show(v)} is a wildcard, no host (a wildcard bind is loopback)")
        return str(ip)
    labels = text.lower().removesuffix(".").split(".")
    if len(text) > 253 or not all(_label(x) for x in labels):
        raise ValueError(f"not a host name or IP address: {_show(v)}")
    return ".".join(labels)


def _label(x: str) -> bool:
    ok = set("abcdefghijklmnopqrstuvwxyz0123456789-")
    return 0 < len(x) <= 63 and set(x) <= ok and not x.startswith("-") and not x.endswith("-")


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."
