from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from loadwatch.daemon.app import run_daemon
from loadwatch.daemon.config import (
    ConfigError,
    load_config,
    parse_config,
    parse_listen,
    with_api_key,
)
from loadwatch.daemon.parts import state_config
from loadwatch.daemon.state.session import StateConfig
from loadwatch.parsers.grammar import available, load


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "loadwatch.toml"
    p.write_text(text, encoding="utf-8")
    return p


def test_defaults_are_safe() -> None:
    cfg = parse_config({})
    assert cfg.http.host == "127.0.0.1" and cfg.http.port == 9321
    assert cfg.http.loopback
    assert cfg.vllm is None and not cfg.supervise
    assert cfg.gpu.source == "nvml"


def test_full_file(tmp_path: Path) -> None:
    cfg = load_config(
        write(
            tmp_path,
            """
state_dir = "/tmp/lw"
events_file = "/tmp/lw/events.jsonl"
[log]
path = "/var/log/vllm/vllm.log"
mode = "poll"
poll_interval_s = 0.5
[http]
listen = "0.0.0.0:9400"
bearer_token_file = "/etc/loadwatch/token"
[gpu]
source = "simulated"
simulated_count = 4
[forecast]
stall_factor = 4
stall_floor_s = 60
load_budget_s = 1200
[vllm]
argv = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/k"]
env = { VLLM_NO_USAGE_STATS = "1" }
restart = "always"
stall_policy = "restart"
[model]
dir = "/models/k"
""",
        )
    )
    assert cfg.log.path == Path("/var/log/vllm/vllm.log") and cfg.log.mode == "poll"
    assert (cfg.http.host, cfg.http.port) == ("0.0.0.0", 9400) and not cfg.http.loopback
    assert cfg.gpu.simulated_count == 4 and cfg.forecast.load_budget_s == 1200.0
    assert cfg.vllm is not None and cfg.vllm.argv[0] == "python" and cfg.supervise
    assert cfg.vllm.env == {"VLLM_NO_USAGE_STATS": "1"} and cfg.vllm.restart == "always"


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ("[log]\npoll_interval_s = 'fast'\n", "[log] poll_interval_s", "expected a number"),
        ("[log]\npoll_intervl_s = 1\n", "[log] poll_intervl_s", "unknown key"),
        ("[http]\nlisten = 'nowhere'\n", "[http] listen", "HOST:PORT"),
        ("[http]\nlisten = '1.2.3.4:99999'\n", "[http] listen", "0..65535"),
        ("[gpu]\nsource = 'amd'\n", "[gpu] source", "must be one of"),
        ("[vllm]\nargv = 'vllm serve /m'\n", "[vllm] argv", "never a shell"),
        ("[vllm]\nrestart = 'always'\n", "[vllm] argv", "needs argv"),
        ("[http]\ntls_cert = '/c.pem'\n", "[http] tls_cert", "go together"),
        ("log = 3\n", "[log]", "must be a table"),
        ("bogus = 1\n", "bogus", "unknown key"),
        ("[vllm]\nargv = ['x']\ncrash_loop_starts = 0\n", "[vllm] crash_loop_starts", "between 1"),
        ("[vllm]\nuser = 'no-such-user-here'\n", "[vllm] user", "no such user"),
        ("[vllm]\nuser = -1\n", "[vllm] user", "a uid is 0 to"),
        ("[vllm]\nuser = 1.5\n", "[vllm] user", "user name or uid"),
        ("[vllm]\nuser = ''\n", "[vllm] user", "user name or uid"),
        ("[vllm]\nargv = ['x']\nuser = 'root'\n", "[vllm] user", "watch mode only"),
        ("[vllm]\nallowed_hosts = '10.0.0.5'\n", "[vllm] allowed_hosts", "expected a list"),
        ("[vllm]\nallowed_hosts = ['0.0.0.0']\n", "[vllm] allowed_hosts", "a wildcard"),
        ("[vllm]\nallowed_hosts = ['::']\n", "[vllm] allowed_hosts", "a wildcard"),
        ("[vllm]\nallowed_hosts = ['a host']\n", "[vllm] allowed_hosts", "not a host name"),
        ("[vllm]\nallowed_hosts = ['*.example']\n", "[vllm] allowed_hosts", "not a host name"),
        ("[vllm]\nallowed_hosts = ['']\n", "[vllm] allowed_hosts", "expected a host name"),
        ("[vllm]\nallowed_hosts = [8000]\n", "[vllm] allowed_hosts", "expected a host name"),
        ("[vllm]\nhealth_url = 'ftp://127.0.0.1/health'\n", "[vllm] health_url", "http or https"),
        ("[vllm]\nhealth_url = 'http://127.0.0.1:80x/health'\n", "[vllm] health_url", "port"),
        ("[vllm]\nhealth_url = 'file:///etc/passwd'\n", "[vllm] health_url", "no host"),
        ("[vllm]\napi_key_file = ''\n", "[vllm] api_key_file", "non-empty"),
        ("[model]\nallowed_roots = '/models'\n", "[model] allowed_roots", "a list of"),
        ("[model]\nallowed_roots = ['models']\n", "[model] allowed_roots", "absolute"),
        ('[model]\nallowed_roots = ["/m\\u0000x"]\n', "[model] allowed_roots", "NUL byte"),
        ("[forecast]\nquiet_stall_s = 30\n", "[forecast] quiet_stall_s", "between 60 and"),
        ("[forecast]\nquiet_stall_s = '1h'\n", "[forecast] quiet_stall_s", "expected a number"),
        ("[log]\ngrammar = 'sglang'\n", "[log] grammar", "vllm"),  # (the grammars there are)
        # a setting that went (the event log always folds k/v warnings): said, not "unknown"
        ("[events]\nfold = false\n", "[events] fold", "no longer a setting"),
    ],
)
def test_each_problem_names_its_key(tmp_path: Path, text: str, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    assert info.value.key == key
    assert words in info.value.problem


def test_unreadable_files_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[log\n"))
    bad = tmp_path / "bin.toml"
    bad.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(bad)


def test_vllm_user_is_a_name_this_host_knows_or_a_uid() -> None:
    def user(value: object) -> int | None:
        cfg = parse_config({"vllm": {"user": value}})
        assert cfg.vllm is not None and not cfg.supervise  # a watch-mode key
        return cfg.vllm.user

    assert user("root") == 0 and user("nobody") == 65534
    assert user(1234) == 1234 and user("1234") == 1234  # a container's uid needs no name here
    assert parse_config({"vllm": {"health_interval_s": 5}}).vllm.user is None  # type: ignore[union-attr]


def test_overrides_win_over_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[log]\npath = '/a.log'\n[http]\nlisten = '127.0.0.1:1'\n")
    cfg = load_config(
        path, {"log.path": "/b.log", "http.listen": "127.0.0.1:2", "gpu.source": None}
    )
    assert cfg.log.path == Path("/b.log") and cfg.http.port == 2 and cfg.gpu.source == "nvml"


def test_parse_listen_forms() -> None:
    assert parse_listen(":9000") == ("127.0.0.1", 9000)
    assert parse_listen("[::1]:9000") == ("::1", 9000)
    assert parse_listen("localhost:1") == ("localhost", 1)


def test_watch_mode_bounds_of_the_probes(tmp_path: Path) -> None:
    cfg = parse_config(
        {
            "vllm": {
                "allowed_hosts": ["10.0.0.5", "[FD00::2]", "VLLM.internal."],
                "api_key_file": str(tmp_path / "key"),
            }
        }
    )
    assert cfg.vllm is not None and not cfg.supervise
    assert cfg.vllm.allowed_hosts == ("10.0.0.5", "fd00::2", "vllm.internal")
    assert cfg.vllm.api_key_file == tmp_path / "key" and cfg.vllm.api_key is None


def test_the_api_key_is_read_once_stripped_and_never_shown(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("\n  sk-from-file-123  \n")
    argv = ["vllm", "serve", "/m", "--api-key", "sk-from-argv-456"]
    from_argv = with_api_key(parse_config({"vllm": {"argv": argv}}))
    assert from_argv.vllm is not None and from_argv.vllm.api_key == "sk-from-argv-456"
    both = with_api_key(parse_config({"vllm": {"argv": argv, "api_key_file": str(key)}}))
    assert both.vllm is not None and both.vllm.api_key == "sk-from-file-123"
    assert "sk-from-file" not in repr(both)
    assert with_api_key(parse_config({})).vllm is None


@pytest.mark.parametrize(("content", "words"), [(None, "cannot read"), ("  \n", "is empty")])
def test_an_unusable_api_key_file_is_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, words: str
) -> None:
    key = tmp_path / "key"
    if content is not None:
        key.write_text(content)
    cfg = parse_config(
        {
            "state_dir": str(tmp_path / "st"),
            "log": {"path": str(tmp_path / "vllm.log")},
            "gpu": {"source": "none"},
            "vllm": {"api_key_file": str(key)},
        }
    )
    with pytest.raises(ConfigError) as info:
        with_api_key(cfg)
    assert info.value.key == "[vllm] api_key_file" and words in info.value.problem
    assert run_daemon(cfg) == 78  # before anything starts
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "[vllm] api_key_file" in line and words in line


def test_model_allowed_roots(tmp_path: Path) -> None:
    assert load_config(None).model.allowed_roots is None  # unset: the default rule applies
    cfg = load_config(write(tmp_path, "[model]\nallowed_roots = ['/models', '/srv/ckpt']\n"))
    assert cfg.model.allowed_roots == (Path("/models"), Path("/srv/ckpt"))
    assert load_config(write(tmp_path, "[model]\nallowed_roots = []\n")).model.allowed_roots == ()


def test_the_quiet_stall_floor_is_a_forecast_key(tmp_path: Path) -> None:
    """Outside the weights bar (model init, torch.compile, CUDA graphs, the KV-cache profile) a
    load stalls after `[forecast] quiet_stall_s` with no step of it in the log: the state gets
    it."""
    default = parse_config({})
    assert default.forecast.quiet_stall_s == StateConfig().quiet_stall_s == 1800.0
    assert state_config(default).quiet_stall_s == 1800.0
    cfg = load_config(write(tmp_path, "[forecast]\nquiet_stall_s = 5400\n"))
    assert cfg.forecast.quiet_stall_s == 5400.0 and state_config(cfg).quiet_stall_s == 5400.0


def run_with(tmp_path: Path, toml: str) -> subprocess.CompletedProcess[str]:
    """`loadwatch run --config` a file holding `toml`, to its exit."""
    return subprocess.run(
        [sys.executable, "-m", "loadwatch.daemon.cli", "run", "--config", str(write(tmp_path, toml))],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


def test_a_bad_quiet_stall_floor_exits_78(tmp_path: Path) -> None:
    out = run_with(tmp_path, "[forecast]\nquiet_stall_s = -5\n")
    assert out.returncode == 78
    assert out.stderr.strip().splitlines() == [
        "loadwatch: config error: [forecast] quiet_stall_s: must be between 60 and 86400, got -5"
    ]


def test_the_log_grammar_is_a_grammar_folder(tmp_path: Path) -> None:
    assert available() == ("vllm",)  # parsers/vllm/grammar.py
    cfg = load_config(write(tmp_path, "[log]\ngrammar = 'vllm'\n"))
    assert cfg.log.grammar == "vllm" and load(cfg.log.grammar).name == "vllm"


@pytest.mark.parametrize(
    ("log", "want"),
    [
        ({}, "auto"),
        ({"input": "cri"}, "cri"),
        ({"input": "file"}, "file"),
        ({"format": "plain"}, "file"),  # the older key, as documented: read into `input`
        ({"format": "docker"}, "docker"),
        ({"format": "docker", "input": "docker"}, "docker"),
        ({"journal_unit": "vllm.service"}, "journal"),
        ({"journal_unit": "vllm.service", "input": "journal"}, "journal"),
    ],
)
def test_the_log_input_is_one_key(log: dict[str, str], want: str) -> None:
    assert parse_config({"log": log}).log.input == want


@pytest.mark.parametrize(
    ("log", "key", "words"),
    [
        ({"input": "kubernetes"}, "[log] input", "must be one of auto, file, cri, docker, journal"),
        ({"input": "journal"}, "[log] input", "needs journal_unit"),
        ({"input": "cri", "format": "docker"}, "[log] format", "input says cri"),
        ({"input": "file", "journal_unit": "v"}, "[log] journal_unit", "input journal"),
    ],
)
def test_a_bad_log_input_names_its_key(log: dict[str, str], key: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"log": log})
    assert info.value.key == key
    assert words in info.value.problem


def test_a_wrong_log_input_exits_78_in_one_line(tmp_path: Path) -> None:
    out = run_with(tmp_path, "[log]\npath = '/x.log'\ninput = 'pod'\n")
    assert out.returncode == 78
    assert out.stderr.strip().splitlines() == [
        "loadwatch: config error: [log] input: must be one of auto, file, cri, docker, journal; "
        "got 'pod'"
    ]
