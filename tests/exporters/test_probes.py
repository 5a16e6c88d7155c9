"""/livez and the probe listener: the kubelet's probes reach loadwatch without credentials."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadwatch.daemon.config import ConfigError, HttpConfig, parse_config
from loadwatch.exporters.http.board import Board, decode, encode
from loadwatch.exporters.http.process import HttpProcess
from tests.exporters.test_httpd import get
from tests.helpers import wait_for


@given(st.booleans(), st.text(max_size=64), st.booleans(), st.text(max_size=64))
def test_the_live_flag_and_its_reason_travel_in_the_frame(
    ready: bool, why: str, live: bool, dead: str
) -> None:
    board = Board(b"m", b"{}", ready, why, live, dead)
    assert decode(encode(board)[4:]) == board


def _wait(url: str, path: str, code: int) -> tuple[int, bytes]:
    wait_for(lambda: get(url, path)[0] == code, f"{path} to say {code}", 5)
    return get(url, path)


def test_with_auth_on_the_probes_answer_on_their_own_bind_without_credentials(
    tmp_path: Path,
) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    config = HttpConfig(port=0, bearer_token_file=token, probe_host="127.0.0.1", probe_port=0)
    server = HttpProcess(config)
    url = server.start()
    try:
        probes = server.probe_url
        assert probes is not None and probes != url
        server.send(Board(b"loadwatch_up 1\n", b'{"phase": "loading_weights"}\n', False, "n", True))
        assert _wait(probes, "/livez", 200) == (200, b"live\n")
        assert get(probes, "/readyz") == (503, b"n\n")
        assert get(probes, "/healthz") == (200, b"ok\n")
        # the probe bind serves nothing else: metrics and status stay behind the token
        assert get(probes, "/metrics")[0] == 404
        assert get(probes, "/status")[0] == 404
        for path in ("/livez", "/readyz", "/metrics", "/status"):
            assert get(url, path)[0] == 401, path
        server.send(Board(b"", b"{}", False, "n", False, "stalled for 130 s: no progress"))
        assert _wait(probes, "/livez", 503) == (503, b"not live: stalled for 130 s: no progress\n")
        server.send(Board(b"", b"{}", True, "", True))
        assert _wait(probes, "/readyz", 200) == (200, b"ready\n")
        assert get(probes, "/livez") == (200, b"live\n")
    finally:
        server.stop()


def test_probe_listen_is_read_and_checked() -> None:
    cfg = parse_config({"http": {"listen": "0.0.0.0:9321", "probe_listen": "0.0.0.0:9322"}})
    assert (cfg.http.probe_host, cfg.http.probe_port) == ("0.0.0.0", 9322)
    with pytest.raises(ConfigError, match=r"\[http\] probe_listen: must differ"):
        parse_config({"http": {"listen": "0.0.0.0:9321", "probe_listen": "0.0.0.0:9321"}})
    with pytest.raises(ConfigError, match=r"\[http\] probe_listen: expected HOST:PORT"):
        parse_config({"http": {"probe_listen": "9322"}})
