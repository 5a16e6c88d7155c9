"""A real Prometheus server for tests: loopback only, its own storage, short intervals.

`PromServer` runs `/usr/bin/prometheus` against any targets (a scripted exposition server now,
the real daemon later), loads rule files, waits until it is ready, and answers `query()`,
`alerts()`, `rules()` and `targets()` through the HTTP API. `short_rules_copy()` makes a test copy
of an alert file with every `for:` cut to a short window, so alerts go pending and fire within
seconds; nothing else in the file changes.

The rewrite is line-based (no YAML library): a `for:` is rewritten only where it is a key of a
rule, that is at the same indentation as the rule's first key (`- alert:`). Text inside block
scalars (descriptions) is indented deeper and is never touched.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from loadwatch.daemon.tools.ports import free_port as free_port  # (tests import it from here)

DEFAULT_BINARY = "/usr/bin/prometheus"
T = TypeVar("T")

# -- durations ----------------------------------------------------------------------------------

_UNITS_S = {"y": 365 * 86400.0, "w": 7 * 86400.0, "d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_UNITS_S["ms"] = 0.001
_DURATION = re.compile(r"(\d+)(ms|y|w|d|h|m|s)")


def parse_duration(text: str) -> float:
    """A Prometheus duration (`1h30m`, `90s`, `500ms`, `0`) in seconds."""
    if text == "0":
        return 0.0
    pos, total = 0, 0.0
    for match in _DURATION.finditer(text):
        if match.start() != pos:
            break
        total += int(match.group(1)) * _UNITS_S[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return total


def format_duration(seconds: float) -> str:
    """Seconds as a Prometheus duration, in whole milliseconds."""
    ms = round(seconds * 1000)
    if ms < 0:
        raise ValueError(f"negative duration: {seconds}")
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


# -- the for: rewrite ---------------------------------------------------------------------------

_ITEM = re.compile(r"^(?P<lead>[ ]*-[ ]+)(?P<key>[A-Za-z_]+):")
_KEY = re.compile(r"^(?P<indent>[ ]*)(?:-[ ]+)?(?P<key>[A-Za-z_]+):")
_BLOCK_START = re.compile(r":[ ]+[|>][-+0-9]*[ ]*(?:#.*)?$")
_FOR = re.compile(
    r"^(?P<indent>[ ]*)(?P<item>-[ ]+)?for:[ ]*(?P<q>[\"']?)(?P<dur>[0-9a-z]+)(?P=q)"
    r"(?P<tail>[ ]*(?:#.*)?)$"
)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def shorten_for(text: str, window_s: float) -> tuple[str, int]:
    """`text` with each rule's `for:` set to min(its value, `window_s`); and how many it saw.

    Block scalars (`description: >-` and the deeper lines after it) pass through untouched.
    Raises ValueError for a `for:` at a rule's key level whose value is not a plain duration.
    """
    short = format_duration(window_s)
    out: list[str] = []
    key_indent: int | None = None  # the indentation of the current list item's keys
    block_parent: int | None = None  # inside a block scalar opened by a key at this indentation
    seen = 0
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        ending = line[len(body) :]
        if block_parent is not None:
            if not body.strip() or _indent(body) > block_parent:
                out.append(line)
                continue
            block_parent = None
        key = _KEY.match(body)
        if key and _BLOCK_START.search(body):
            block_parent = _indent(body)
        item = _ITEM.match(body)
        if item:
            key_indent = len(item.group("lead"))
        elif key and key_indent is not None and _indent(body) < key_indent:
            key_indent = None  # left the list
        at_key_level = (item is not None and item.group("key") == "for") or (
            item is None
            and key is not None
            and key.group("key") == "for"
            and _indent(body) == key_indent
        )
        if not at_key_level:
            out.append(line)
            continue
        found = _FOR.match(body)
        if found is None:
            raise ValueError(f"cannot read this for: line: {body.strip()!r}")
        value = found.group("dur")
        new = value if parse_duration(value) <= window_s else short
        indent, lead = found.group("indent"), found.group("item") or ""
        out.append(f"{indent}{lead}for: {new}{found.group('tail')}{ending}")
        seen += 1
    return "".join(out), seen


def short_rules_copy(src: Path, dst_dir: Path, window_s: float = 2.0) -> Path:
    """Write `src` with every `for:` cut to `window_s` into `dst_dir`; return the copy's path."""
    text, count = shorten_for(src.read_text(encoding="utf-8"), window_s)
    if count == 0:
        raise ValueError(f"{src}: no for: found to shorten")
    dst = dst_dir / f"{src.stem}.short{src.suffix}"
    dst.write_text(text, encoding="utf-8")
    return dst


# -- the server ---------------------------------------------------------------------------------


class PrometheusError(RuntimeError):
    """Prometheus failed to start, stopped answering, or rejected a request."""


@dataclass(frozen=True)
class Sample:
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class Alert:
    name: str
    state: str  # "pending" or "firing"
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    active_at: str
    value: str


class PromServer:
    """One Prometheus process. Use as a context manager, or call start() and stop()."""

    def __init__(
        self,
        workdir: Path,
        targets: Sequence[str],
        *,
        job: str = "loadwatch",
        rule_files: Sequence[Path] = (),
        scrape_interval_s: float = 1.0,
        evaluation_interval_s: float = 1.0,
        metrics_path: str = "/metrics",
        binary: str = DEFAULT_BINARY,
    ) -> None:
        self.workdir = workdir
        self.target_addresses = list(targets)
        self.job = job
        self.rule_files = [Path(p).resolve() for p in rule_files]
        self.scrape_interval_s = scrape_interval_s
        self.evaluation_interval_s = evaluation_interval_s
        self.metrics_path = metrics_path
        self.binary = binary
        self.port = 0
        self.log_path = workdir / "prometheus.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None  # once stopped: 0 for a clean shutdown

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict[str, Any]:
        interval = format_duration(self.scrape_interval_s)
        return {
            "global": {
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "evaluation_interval": format_duration(self.evaluation_interval_s),
            },
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [
                {
                    "job_name": self.job,
                    "metrics_path": self.metrics_path,
                    "static_configs": [{"targets": self.target_addresses}],
                }
            ],
        }

    def start(self, timeout_s: float = 30.0) -> None:
        if not os.access(self.binary, os.X_OK):
            raise PrometheusError(
                f"{self.binary} not found: run scripts/ensure-tools.sh (make tools) to install it"
            )
        config_path = self.workdir / "prometheus.yml"
        config_path.write_text(json.dumps(self.config(), indent=2))  # JSON is YAML
        for attempt in range(3):  # a free port can be taken between the probe and the bind
            self.port = free_port()
            storage = self.workdir / f"data-{attempt}"
            with self.log_path.open("ab") as log:
                self._proc = subprocess.Popen(
                    [
                        self.binary,
                        f"--config.file={config_path}",
                        f"--storage.tsdb.path={storage}",
                        f"--web.listen-address=127.0.0.1:{self.port}",
                        "--storage.tsdb.retention.time=1d",
                        "--log.level=warn",
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.workdir,
                )
            if self._wait_ready(timeout_s):
                return
            self._kill()
            if "address already in use" not in self.log_tail():
                break
        raise PrometheusError(f"prometheus did not become ready: {self.log_tail()}")

    def _wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        return False

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout_s`. Safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout_s)
        self.returncode = proc.returncode

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    def __enter__(self) -> PromServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""

    # -- API -----------------------------------------------------------------------------------

    def api(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """GET /api/v1/<path>; the `data` of a success, PrometheusError otherwise."""
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as err:
            try:
                body = json.load(err)
            except ValueError:
                raise PrometheusError(f"{path}: HTTP {err.code}") from None
        except (urllib.error.URLError, OSError) as err:
            raise PrometheusError(f"{path}: {err}") from None
        if body.get("status") != "success":
            raise PrometheusError(f"{path}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query_data(self, expr: str) -> Mapping[str, Any]:
        """The raw instant-query result: `resultType` and `result`."""
        data = self.api("query", {"query": expr})
        assert isinstance(data, Mapping)
        return data

    def query(self, expr: str) -> list[Sample]:
        """An instant query whose result is a vector (a scalar comes back as one sample)."""
        data = self.query_data(expr)
        if data["resultType"] == "vector":
            return [Sample(r["metric"], float(r["value"][1])) for r in data["result"]]
        if data["resultType"] == "scalar":
            return [Sample({}, float(data["result"][1]))]
        raise PrometheusError(f"{expr}: a {data['resultType']}, not a vector")

    def alerts(self) -> list[Alert]:
        """Active alerts (pending and firing); resolved ones are gone."""
        return [
            Alert(
                name=a["labels"]["alertname"],
                state=a["state"],
                labels=a["labels"],
                annotations=a.get("annotations", {}),
                active_at=a.get("activeAt", ""),
                value=a.get("value", ""),
            )
            for a in self.api("alerts")["alerts"]
        ]

    def rules(self) -> list[Mapping[str, Any]]:
        """Rule groups as the server loaded them (with file, rules, health, lastEvaluation)."""
        groups = self.api("rules")["groups"]
        assert isinstance(groups, list)
        return groups

    def targets(self) -> list[Mapping[str, Any]]:
        active = self.api("targets")["activeTargets"]
        assert isinstance(active, list)
        return active

    def wait_until(
        self,
        check: Callable[[], T],
        what: str,
        timeout_s: float = 20.0,
        interval_s: float = 0.1,
    ) -> T:
        """Poll `check` until it returns something truthy, and return that; bounded by timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = check()
            if result:
                return result
            if time.monotonic() >= deadline:
                raise TimeoutError(f"waited {timeout_s:g}s for {what}")
            if self._proc is None or self._proc.poll() is not None:
                raise PrometheusError(f"prometheus exited while waiting for {what}")
            time.sleep(interval_s)

    def wait_scraped(self, timeout_s: float = 20.0, scrapes: int = 1) -> None:
        """Until every target is up and has been scraped `scrapes` more times from now."""

        def up_after(since: float) -> bool:
            ts = self.targets()
            return bool(ts) and all(
                t["health"] == "up" and _api_time(t["lastScrape"]) > since for t in ts
            )

        for _ in range(scrapes):
            mark = time.time()
            self.wait_until(partial(up_after, mark), "a scrape of every target", timeout_s)

    def wait_evaluated(self, timeout_s: float = 20.0, rounds: int = 1) -> None:
        """Until every rule group has been evaluated `rounds` more times from now."""

        def evaluated_after(since: float) -> bool:
            groups = self.rules()
            return bool(groups) and all(_api_time(g["lastEvaluation"]) > since for g in groups)

        for _ in range(rounds):
            mark = time.time()
            self.wait_until(partial(evaluated_after, mark), "a rule evaluation", timeout_s)


def _api_time(text: str) -> float:
    """An API timestamp (RFC 3339, nanoseconds allowed) as epoch seconds; Go's zero time is 0."""
    stamp = datetime.fromisoformat(text)
    return 0.0 if stamp.year == 1 else stamp.timestamp()
