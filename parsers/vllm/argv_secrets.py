"""Keep secrets inside the process: vLLM's argv and environment may carry API keys and tokens.

A `Redactor` learns the secret values once (from the flags and variables that carry them) and
replaces them wherever they would leave the process: /status, the event log, the console, error
messages.

Which argument is a secret follows vLLM's own parser (FlexibleArgumentParser, vllm/utils/
argparse_utils.py, on argparse's defaults), so every spelling vLLM accepts is caught:
- `_` and `-` are the same in a flag's name (`--api_key` is `--api-key`);
- the value is after `=` or in the next argument(s): `--api-key` takes one or more values
  (nargs `+`, up to the next option), `--hf-token` an optional one (nargs `?`);
- argparse takes any unambiguous prefix of a long flag (allow_abbrev is not turned off): in
  vLLM 0.32 `--api-k` and `--hf-t` are the shortest. Every prefix of two letters or more is
  taken as the flag here, whatever vLLM's version: a prefix too short to be unambiguous makes vLLM
  refuse to start, and masking its value costs nothing then.

A URL with a password in it (`scheme://user:PASSWORD@host`), wherever an argument holds one (a
flag's value, after `=`, inside a JSON value, a positional), has its password masked and keeps
its user and host; the environment's URLs (a proxy's) teach their passwords too.

Values are masked in text only when at least `MIN_SECRET_LEN` long (a shorter one would mask
ordinary words); in an argv list the value of a secret flag is masked by its place, whatever
its length.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

MASK = "***"
# vLLM's flags whose value is a secret, with how many values each takes (argparse's nargs), as
# `vllm serve`'s parser has them (0.32: `--api-key` nargs "+", `--hf-token` nargs "?").
VLLM_SECRET_FLAGS: dict[str, str] = {"--api-key": "+", "--hf-token": "?"}
# Secret flags of wrappers and other servers, taken as written only (`--ssl-keyfile` is a real
# vLLM flag, a path, and a prefix of the third).
OTHER_SECRET_FLAGS = ("--token", "--password", "--ssl-keyfile-password")
SECRET_FLAGS = (*VLLM_SECRET_FLAGS, *OTHER_SECRET_FLAGS)
# Environment variables whose value is a secret, by name fragment.
SECRET_ENV_WORDS = ("TOKEN", "API_KEY", "APIKEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
MIN_SECRET_LEN = 4  # shorter values would mask ordinary text
_MIN_ABBREV = 2  # letters after `--`: argparse needs a unique prefix, and no flag is one letter


def secret_flag(arg: str) -> tuple[str, str | None] | None:
    """`(nargs, value after "=")` when `arg` names a secret flag as vLLM's parser reads it."""
    if not arg.startswith("--"):
        return None
    key, eq, value = arg.partition("=")
    name = "--" + key[2:].split(".", 1)[0].replace("_", "-")
    if "." in key or len(name) < 2 + _MIN_ABBREV:
        return None  # `--x.y` is one of vLLM's JSON keys, not a flag of its own
    for flag, nargs in VLLM_SECRET_FLAGS.items():
        if flag.startswith(name):
            return nargs, (value if eq else None)
    return ("1", value if eq else None) if name in OTHER_SECRET_FLAGS else None


def secret_positions(argv: Sequence[str]) -> dict[int, str | None]:
    """The indexes of `argv` that hold a secret: index -> None for a whole argument, or the
    flag part to keep for `--flag=SECRET`."""
    out: dict[int, str | None] = {}
    i = 0
    while i < len(argv):
        found = secret_flag(argv[i])
        i += 1
        if found is None:
            continue
        nargs, value = found
        if value is not None:
            out[i - 1] = argv[i - 1].partition("=")[0]
            continue
        while i < len(argv) and not argv[i].startswith("-"):
            out[i] = None
            i += 1
            if nargs != "+":
                break
    return out


_SCHEME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-.")
_NETLOC_ENDS = frozenset("/?#\"'<>\\ \t\r\n")


def url_password_spans(arg: str) -> list[tuple[int, int]]:
    """Where the passwords of the URLs in `arg` stand: `scheme://user:PASSWORD@host` as
    urllib.parse splits it (the userinfo ends at the host part's last `@`, the password after
    its first `:`). One pass over the argument, no pattern to backtrack."""
    spans: list[tuple[int, int]] = []
    at = arg.find("://")
    while at >= 0:
        begin = at
        while begin > 0 and arg[begin - 1] in _SCHEME_CHARS:
            begin -= 1
        while begin < at and not arg[begin].isalpha():
            begin += 1  # a scheme starts with a letter
        start = end = at + 3
        while end < len(arg) and arg[end] not in _NETLOC_ENDS:
            end += 1
        userinfo, sep, _ = arg[start:end].rpartition("@")
        user, colon, password = userinfo.partition(":")
        if begin < at and sep and colon and password:
            spans.append((start + len(user) + 1, start + len(userinfo)))
        at = arg.find("://", max(end, at + 3))
    return spans


def mask_url_passwords(arg: str) -> str:
    for begin, end in reversed(url_password_spans(arg)):
        arg = arg[:begin] + MASK + arg[end:]
    return arg


def is_secret_env(name: str) -> bool:
    upper = name.upper()
    return any(word in upper for word in SECRET_ENV_WORDS)


class Redactor:
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: list[str] = []
        self._flags = False  # a secret flag was seen: argv lists in data are masked by place
        for s in secrets:
            self.add(s)

    def add(self, secret: str) -> None:
        if len(secret) >= MIN_SECRET_LEN and secret not in self._secrets:
            self._secrets.append(secret)
            self._secrets.sort(key=len, reverse=True)  # longest first: no partial leftovers

    def learn(self, argv: Iterable[str] = (), env: Mapping[str, str] | None = None) -> None:
        args = list(argv)
        for i, keep in secret_positions(args).items():
            self._flags = True
            self.add(args[i] if keep is None else args[i][len(keep) + 1 :])
        for arg in args:
            for begin, end in url_password_spans(arg):
                self._flags = True
                self.add(arg[begin:end])
        for name, value in (env or {}).items():
            if is_secret_env(name):
                self.add(value)
            for begin, end in url_password_spans(value):
                self.add(value[begin:end])

    def text(self, value: str) -> str:
        for secret in self._secrets:
            if secret in value:
                value = value.replace(secret, MASK)
        for secret in self._secrets:
            value = _cut_ends(value, secret)
        return value

    def argv(self, argv: Iterable[str]) -> list[str]:
        """Each argument redacted as text, and a secret flag's value and a URL's password
        masked whatever their length."""
        args = list(argv)
        masked = secret_positions(args)
        return [
            (MASK if masked[i] is None else f"{masked[i]}={MASK}")
            if i in masked
            else self.text(mask_url_passwords(a))
            for i, a in enumerate(args)
        ]

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        return {k: MASK if is_secret_env(k) else self.text(v) for k, v in env.items()}

    @property
    def active(self) -> bool:
        """Whether there is anything to redact (else `value` returns what it is given)."""
        return bool(self._secrets) or self._flags

    def value(self, value: Any) -> Any:
        """Redact strings anywhere inside JSON-like data (an `argv` list as `argv()` does)."""
        if not self._secrets and not self._flags:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {
                k: self.argv(v) if k == "argv" and _strings(v) else self.value(v)
                for k, v in value.items()
            }
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


def _strings(value: Any) -> bool:
    return isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)
