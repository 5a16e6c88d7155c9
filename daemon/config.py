"""Configuration: a TOML file plus command-line overrides, validated once into a frozen object.

Every problem is reported as one `ConfigError` naming the key (`[section] key`) and what is wrong;
the CLI turns it into one line and exit code 78 (EX_CONFIG). Unknown keys are errors, so a typo
never silently falls back to a default. The typed table reader is config_table.py.
"""

from __future__ import annotations

import ipaddress
import pwd
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from loadwatch.daemon.config_table import ConfigError as ConfigError
from loadwatch.daemon.config_table import Table as _Table
from loadwatch.daemon.state.session import FAILURE_HOLD_S
from loadwatch.exporters.http.settings import DEFAULT_PORT as DEFAULT_PORT
from loadwatch.exporters.http.settings import HttpConfig as HttpConfig
from loadwatch.parsers.grammar import available as grammars
from loadwatch.parsers.vllm.argv import option

EX_CONFIG = 78


@dataclass(frozen=True)
class LogConfig:
    path: Path | None = None
    mode: Literal["auto", "inotify", "poll"] = "auto"
    poll_interval_s: float = 0.25
    # After a change event, the appends of this long are read in one wake-up, which costs more
    # than the read (bench/wake_cost.py). Longer loses rotations that outrun it (tiny files).
    coalesce_ms: float = 200.0
    max_record_bytes: int = 65536
    # Where vLLM's lines come from (daemon/sources/log/inputs.py); `format`, the older key, is
    # read into it. auto: the journal when a unit is given, else by the path or first line.
    input: Literal["auto", "file", "cri", "docker", "journal"] = "auto"
    grammar: str = "vllm"  # the log grammar: a folder under parsers/ (parsers/grammar.py)
    # Or the journal: vLLM as a systemd unit (daemon/sources/log/journal.py), read through
    # journalctl; journal_file / journal_directory for a journal that is not this host's own.
    journal_unit: str | None = None
    journal_file: Path | None = None
    journal_directory: Path | None = None


@dataclass(frozen=True)
class GpuConfig:
    source: Literal["nvml", "simulated", "none"] = "nvml"
    poll_interval_s: float = 1.0
    deadline_s: float = 2.0
    simulated_count: int = 8
    # The GPUs to watch (NVML index, GPU-... or MIG-... UUID); None: every GPU NVML sees, or the
    # supervised vLLM's CUDA_VISIBLE_DEVICES (daemon/sources/gpu/scope.py).
    devices: tuple[int | str, ...] | None = None


@dataclass(frozen=True)
class ForecastConfig:
    stall_factor: float = 5.0  # a stall is no progress for stall_factor x the typical shard time...
    stall_floor_s: float = 120.0  # ...and never less than this
    # Outside the weights bar (model init; after the weights: torch.compile, CUDA graphs, the
    # KV-cache profile) a load is stalled after this long with no step in the log, nothing read.
    quiet_stall_s: float = 1800.0
    load_budget_s: float | None = None  # exported so an alert can fire when the ETA overruns it
    # a fatal failure is held this long for the crash's echoes before the session fails of its
    # root cause (state/session.py)
    failure_hold_s: float = FAILURE_HOLD_S


@dataclass(frozen=True)
class VllmConfig:
    argv: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    inherit_env: bool = True
    cwd: Path | None = None
    restart: Literal["on-failure", "always", "never"] = "on-failure"
    backoff_initial_s: float = 5.0
    backoff_max_s: float = 300.0
    crash_loop_starts: int = 5
    crash_loop_window_s: float = 900.0
    stop_grace_s: float = 30.0
    stall_policy: Literal["alert", "restart"] = "alert"
    stall_restart_after_s: float = 900.0
    preflight: Literal["warn", "refuse", "off"] = "warn"
    # Remedies tried, in this order, when a start fails for a known reason (supervise/remedies.py)
    remedies: tuple[str, ...] = ()
    remedy_min_model_len: int = 2048  # the `max_model_len` remedy never goes below this
    remedy_gpu_memory_step: float = 0.05  # the `gpu_memory_utilization` remedy's step down
    remedy_fp8: str = "flag"  # the `fp8_kv_unsupported` remedy: `--kv-cache-dtype` or a patch
    log_max_bytes: int = 256 * 1024 * 1024
    log_keep: int = 3
    output: Literal["file", "file+stdout"] = "file"  # where vLLM's output goes besides the log
    health_url: str | None = None  # default: from --host/--port in argv, or the URL vLLM logs
    # Hosts besides loopback that the URL vLLM logs may name (the log is untrusted input).
    allowed_hosts: tuple[str, ...] = ()
    api_key_file: Path | None = None  # the key the servable check sends (else argv's --api-key)
    # The key itself, read once from api_key_file before the daemon starts (`with_api_key`).
    api_key: str | None = field(default=None, repr=False)
    health_interval_s: float = 5.0  # /health probes once the API server is up
    servable: bool = False  # ready only once one tiny completion succeeded after /health
    servable_prompt: str = "Hello"
    servable_timeout_s: float = 120.0
    # Watch mode: the uid vLLM runs as, which a pid the log names must run as to be taken for
    # vLLM's (sources/proc/logged_process.py); None: the log file's owner.
    user: int | None = None


# The [vllm] keys that also apply in watch mode (a [vllm] table without argv); `user` only there.
WATCH_KEYS = frozenset(
    {
        "user",
        "health_url",
        "allowed_hosts",
        "health_interval_s",
        "servable",
        "servable_prompt",
        "servable_timeout_s",
        "api_key_file",
    }
)


@dataclass(frozen=True)
class ModelConfig:
    dir: Path | None = None
    kv_cache_dtype: str | None = None  # what --kv-cache-dtype will be; read from argv when absent
    # Where the model path the log names may be read; None: `dir`, else the supervised argv's
    # model, else nowhere (aftercare.ModelDirs.roots).
    allowed_roots: tuple[Path, ...] | None = None


@dataclass(frozen=True)
class EventsConfig:
    stdout: Literal["transitions", "all", "none"] = "transitions"


@dataclass(frozen=True)
class Config:
    log: LogConfig = field(default_factory=LogConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    forecast: ForecastConfig = field(default_factory=ForecastConfig)
    vllm: VllmConfig | None = None
    model: ModelConfig = field(default_factory=ModelConfig)
    events: EventsConfig = field(default_factory=EventsConfig)
    state_dir: Path = Path("/var/lib/loadwatch")
    events_file: Path | None = None
    sessions_kept: int = 20

    @property
    def supervise(self) -> bool:
        return self.vllm is not None and bool(self.vllm.argv)


# -- reading ----------------------------------------------------------------------------------


def load_config(path: Path | None, overrides: Mapping[str, Any] | None = None) -> Config:
    """Read `path` (if any), apply `overrides` (`"section.key": value`), validate."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(str(path), "no such file") from None
        except IsADirectoryError:
            raise ConfigError(str(path), "is a directory, not a TOML file") from None
        except PermissionError:
            raise ConfigError(str(path), "permission denied") from None
        except UnicodeDecodeError:
            raise ConfigError(str(path), "not UTF-8 text") from None
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(str(path), f"not valid TOML: {exc}") from None
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        section, _, key = dotted.rpartition(".")
        target = raw.setdefault(section, {}) if section else raw
        if not isinstance(target, dict):
            raise ConfigError(f"[{section}]", "must be a table")
        target[key] = value
    return parse_config(raw)


def parse_config(raw: Mapping[str, Any]) -> Config:
    top = _Table("", raw)
    cfg = Config(
        log=_section(top, "log", LogConfig, _log_fields),
        http=_section(top, "http", HttpConfig, _http_fields),
        gpu=_section(top, "gpu", GpuConfig, _gpu_fields),
        forecast=_section(top, "forecast", ForecastConfig, _forecast_fields),
        vllm=_section(top, "vllm", VllmConfig, _vllm_fields) if "vllm" in raw else None,
        model=_section(top, "model", ModelConfig, _model_fields),
        events=_section(top, "events", EventsConfig, _events_fields),
        state_dir=top.path("state_dir", Config.state_dir) or Config.state_dir,
        events_file=top.path("events_file", None),
        sessions_kept=top.integer("sessions_kept", 20, minimum=1, maximum=1000),
    )
    top.done({"log", "http", "gpu", "forecast", "vllm", "model", "events"})
    _check_http(cfg.http)
    return cfg


C = TypeVar("C")


def _section(top: _Table, name: str, cls: type[C], read: Callable[[_Table], dict[str, Any]]) -> C:
    table = _Table(name, top.data.get(name, {}))
    values = read(table)
    table.done()
    return cls(**values)


def _log_fields(t: _Table) -> dict[str, Any]:
    d = LogConfig()
    return {
        "path": t.path("path", None),
        "mode": t.choice("mode", d.mode, ("auto", "inotify", "poll")),
        "poll_interval_s": t.number("poll_interval_s", d.poll_interval_s, minimum=0.01, maximum=60),
        "coalesce_ms": t.number("coalesce_ms", d.coalesce_ms, minimum=0, maximum=1000),
        "max_record_bytes": t.integer(
            "max_record_bytes", d.max_record_bytes, minimum=1024, maximum=1 << 26
        ),
        "grammar": t.choice("grammar", d.grammar, grammars()),
        **_input_fields(t),
    }


def _input_fields(t: _Table) -> dict[str, Any]:
    """`input`, with `format` (its older name for a file's kind) and the journal's keys."""
    kind = t.choice("input", "auto", ("auto", "file", "cri", "docker", "journal"))
    fmt = t.choice("format", "auto", ("auto", "plain", "cri", "docker"))
    said = {"auto": kind, "plain": "file"}.get(fmt, fmt)  # (the input either key names)
    if kind not in ("auto", said):
        raise ConfigError(t.key("format"), f"says {fmt}, input says {kind}: give input alone")
    unit = t.string("journal_unit", None)
    values = {
        "journal_unit": unit,
        "journal_file": t.path("journal_file", None),
        "journal_directory": t.path("journal_directory", None),
    }
    if unit is None:
        if said == "journal":
            raise ConfigError(t.key("input"), "journal needs journal_unit, the unit to read")
        for key in ("journal_file", "journal_directory"):
            if values[key] is not None:
                raise ConfigError(t.key(key), "goes with journal_unit, the unit to read")
    elif t.data.get("path") is not None:
        raise ConfigError(t.key("journal_unit"), "choose a log path or a journal unit, not both")
    elif said not in ("auto", "journal"):
        raise ConfigError(t.key("journal_unit"), f"is read by input journal, not {said}")
    if values["journal_file"] is not None and values["journal_directory"] is not None:
        raise ConfigError(t.key("journal_file"), "choose journal_file or journal_directory")
    return {"input": "journal" if unit is not None else said, **values}


def _http_fields(t: _Table) -> dict[str, Any]:
    d = HttpConfig()
    values: dict[str, Any] = {}
    listen = t.string("listen", None)
    if listen is not None:
        values["host"], values["port"] = parse_listen(listen, t.key("listen"))
    probes = t.string("probe_listen", None)
    if probes is not None:
        values["probe_host"], values["probe_port"] = parse_listen(probes, t.key("probe_listen"))
    values.update(
        tls_cert=t.path("tls_cert", None),
        tls_key=t.path("tls_key", None),
        bearer_token_file=t.path("bearer_token_file", None),
        basic_auth_user=t.string("basic_auth_user", None),
        basic_auth_password_file=t.path("basic_auth_password_file", None),
        max_connections=t.integer("max_connections", d.max_connections, minimum=1, maximum=10000),
        request_timeout_s=t.number(
            "request_timeout_s", d.request_timeout_s, minimum=0.1, maximum=600
        ),
        publish_interval_s=t.number(
            "publish_interval_s", d.publish_interval_s, minimum=0.05, maximum=10
        ),
    )
    return values


def _gpu_fields(t: _Table) -> dict[str, Any]:
    d = GpuConfig()
    return {
        "source": t.choice("source", d.source, ("nvml", "simulated", "none")),
        "poll_interval_s": t.number(
            "poll_interval_s", d.poll_interval_s, minimum=0.05, maximum=3600
        ),
        "deadline_s": t.number("deadline_s", d.deadline_s, minimum=0.01, maximum=60),
        "simulated_count": t.integer("simulated_count", d.simulated_count, minimum=1, maximum=1024),
        "devices": t.devices("devices"),
    }


def _forecast_fields(t: _Table) -> dict[str, Any]:
    d = ForecastConfig()
    return {
        "stall_factor": t.number("stall_factor", d.stall_factor, minimum=1.0, maximum=1000),
        "stall_floor_s": t.number("stall_floor_s", d.stall_floor_s, minimum=0.0, maximum=86400),
        "quiet_stall_s": t.number("quiet_stall_s", d.quiet_stall_s, minimum=60.0, maximum=86400),
        "load_budget_s": t.opt_number("load_budget_s", minimum=1.0),
        "failure_hold_s": t.number("failure_hold_s", d.failure_hold_s, minimum=0.0, maximum=60),
    }


def _vllm_fields(t: _Table) -> dict[str, Any]:
    # (the supervisor's modules, imported only for a [vllm] table: `analyze` reads no config)
    from loadwatch.daemon.supervise.remedies import FP8_MODES, REMEDY_NAMES

    d = VllmConfig()
    argv = t.strings("argv")
    if not argv and not set(t.data) <= WATCH_KEYS:
        raise ConfigError(t.key("argv"), "the [vllm] table needs argv, the vLLM command as a list")
    return {
        "argv": argv,
        "env": t.mapping("env"),
        "inherit_env": t.boolean("inherit_env", d.inherit_env),
        "cwd": t.path("cwd", None),
        "restart": t.choice("restart", d.restart, ("on-failure", "always", "never")),
        "backoff_initial_s": t.number(
            "backoff_initial_s", d.backoff_initial_s, minimum=0.0, maximum=3600
        ),
        "backoff_max_s": t.number("backoff_max_s", d.backoff_max_s, minimum=0.0, maximum=86400),
        "crash_loop_starts": t.integer(
            "crash_loop_starts", d.crash_loop_starts, minimum=1, maximum=1000
        ),
        "crash_loop_window_s": t.number(
            "crash_loop_window_s", d.crash_loop_window_s, minimum=1.0, maximum=86400 * 7
        ),
        "stop_grace_s": t.number("stop_grace_s", d.stop_grace_s, minimum=0.0, maximum=3600),
        "stall_policy": t.choice("stall_policy", d.stall_policy, ("alert", "restart")),
        "stall_restart_after_s": t.number(
            "stall_restart_after_s", d.stall_restart_after_s, minimum=1.0, maximum=86400
        ),
        "preflight": t.choice("preflight", d.preflight, ("warn", "refuse", "off")),
        "remedies": t.names("remedies", REMEDY_NAMES),
        "remedy_min_model_len": t.integer(
            "remedy_min_model_len", d.remedy_min_model_len, minimum=16, maximum=1 << 24
        ),
        "remedy_gpu_memory_step": t.number(
            "remedy_gpu_memory_step", d.remedy_gpu_memory_step, minimum=0.01, maximum=0.4
        ),
        "remedy_fp8": t.choice("remedy_fp8", d.remedy_fp8, FP8_MODES),
        "log_max_bytes": t.integer("log_max_bytes", d.log_max_bytes, minimum=4096, maximum=1 << 40),
        "log_keep": t.integer("log_keep", d.log_keep, minimum=1, maximum=100),
        "output": t.choice("output", d.output, ("file", "file+stdout")),
        "health_url": _health_url(t),
        "allowed_hosts": t.hosts("allowed_hosts"),
        "health_interval_s": t.number(
            "health_interval_s", d.health_interval_s, minimum=0.1, maximum=3600
        ),
        "servable": t.boolean("servable", d.servable),
        "servable_prompt": t.string("servable_prompt", d.servable_prompt) or d.servable_prompt,
        "servable_timeout_s": t.number(
            "servable_timeout_s", d.servable_timeout_s, minimum=1.0, maximum=3600
        ),
        "user": _vllm_user(t, argv),
        "api_key_file": t.path("api_key_file", None),
    }


def _vllm_user(t: _Table, argv: tuple[str, ...]) -> int | None:
    """A user name this host knows, or a uid (which needs no name here: a container's user
    often has none on the host)."""
    value = t.user("user")
    if value is None:
        return None
    if argv:
        raise ConfigError(
            t.key("user"), "applies in watch mode only: the supervised vLLM is loadwatch's child"
        )
    if isinstance(value, int):
        return value
    try:
        return pwd.getpwnam(value).pw_uid
    except KeyError:
        raise ConfigError(t.key("user"), f"no such user on this host: {value!r}") from None


def _health_url(t: _Table) -> str | None:
    url = t.string("health_url", None)
    if url is not None:
        from loadwatch.daemon.sources.health import UrlRefused, endpoint_from_config

        try:
            endpoint_from_config(url)
        except UrlRefused as exc:
            raise ConfigError(t.key("health_url"), str(exc)) from None
    return url


def _events_fields(t: _Table) -> dict[str, Any]:
    if "fold" in t.data:
        raise ConfigError(
            t.key("fold"),
            "no longer a setting: k/v scale warnings back to back are always one line, which "
            "lists each record's offset and time (docs/usage.md: The event log)",
        )
    return {"stdout": t.choice("stdout", "transitions", ("transitions", "all", "none"))}


def _model_fields(t: _Table) -> dict[str, Any]:
    return {
        "dir": t.path("dir", None),
        "kv_cache_dtype": t.string("kv_cache_dtype", None),
        "allowed_roots": t.paths("allowed_roots"),
    }


def parse_listen(text: str, key: str = "--listen") -> tuple[str, int]:
    """`HOST:PORT`, `[v6]:PORT` or `:PORT` (loopback)."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ConfigError(key, f"expected HOST:PORT, got {text!r}")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ConfigError(key, f"port must be 0..65535, got {port}")
    host = host.strip("[]") or "127.0.0.1"
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ConfigError(key, f"not an IP address (nor localhost): {host!r}") from None
    return host, port


def _check_http(http: HttpConfig) -> None:
    if (http.tls_cert is None) != (http.tls_key is None):
        raise ConfigError("[http] tls_cert", "tls_cert and tls_key go together")
    if (http.basic_auth_user is None) != (http.basic_auth_password_file is None):
        raise ConfigError(
            "[http] basic_auth_user", "basic_auth_user and basic_auth_password_file go together"
        )
    same = (http.probe_host, http.probe_port) == (http.host, http.port)
    if http.probe_host is not None and same and http.port != 0:
        raise ConfigError("[http] probe_listen", "must differ from [http] listen")
    if http.bearer_token_file is not None and http.basic_auth_user is not None:
        raise ConfigError(
            "[http] bearer_token_file", "choose a bearer token or basic auth, not both"
        )


def with_api_key(cfg: Config) -> Config:
    """`[vllm] api_key_file` read (once, stripped), else the supervised argv's `--api-key`: the
    key the servable check sends. An unreadable or empty file is a ConfigError."""
    vllm = cfg.vllm
    if vllm is None:
        return cfg
    key = option(vllm.argv, "--api-key") if vllm.argv else None
    path = vllm.api_key_file
    if path is not None:
        try:
            key = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            why = getattr(exc, "strerror", None) or str(exc)
            raise ConfigError("[vllm] api_key_file", f"cannot read {path}: {why}") from None
        if not key:
            raise ConfigError("[vllm] api_key_file", f"{path} is empty")
    return replace(cfg, vllm=replace(vllm, api_key=key or None))


def with_overrides(cfg: Config, **sections: Any) -> Config:
    """A copy with whole sections or top-level values replaced (used by `loadwatch demo`)."""
    known = {f.name for f in fields(Config)}
    bad = set(sections) - known
    if bad:
        raise ConfigError(sorted(bad)[0], "unknown key")
    return replace(cfg, **sections)
