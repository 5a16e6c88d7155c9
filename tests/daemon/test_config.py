from __future__ import annotations

from pathlib import Path

import pytest

from loadwatch.daemon.config import ConfigError, load_config, parse_config, parse_listen


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
