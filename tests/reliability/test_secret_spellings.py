"""Secrets spelled every way vLLM's parser accepts them, and the log copy supervise mode writes.

vLLM's `FlexibleArgumentParser` (vllm/utils/argparse_utils.py) turns `_` into `-` in a flag's
name, takes a value after `=` or in the next argument(s) (`--api-key` nargs `+`, `--hf-token`
nargs `?`), and argparse takes an unambiguous prefix (`--api-k`, `--hf-t`). The real daemon
supervises a stand-in vLLM started with `--api_key A1 A2`, `--hf_tok=H` and a 3-character key,
which prints them back as older vLLM builds do in `non-default args:`; none of them is in
/status, the console or the event log file (the short one: not in any argv shown). The copy of
vLLM's output (the supervise-mode log) keeps them, as vLLM wrote it, and is mode 0600.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from loadwatch.daemon.supervise.logsink import RotatingLog
from loadwatch.parsers.vllm.argv_secrets import MASK, Redactor
from tests.reliability.proc import DaemonProc, wait_for

KEY1 = "sk-UNDERSCORE0key0one0abcdef012345"
KEY2 = "sk-SECOND0key0of0the0nargs0plus0list"
HF = "hf_ABBREVIATED0token0zyxwvut98765"
SHORT = "k3y"

CHILD = """
import signal, sys
p = "(APIServer pid=1) "
out = sys.stdout
out.write(p + "INFO 11-30 10:00:00 [api_server.py:1] vLLM API server version 0.6.3\\n")
out.write(p + "INFO 11-30 10:00:00 [utils.py:1] non-default args: {'api_key': ['%s', '%s'], "
          "'hf_token': '%s'}\\n" % (sys.argv[2], sys.argv[3], sys.argv[4].split("=", 1)[1]))
out.write(p + "WARNING 11-30 10:00:01 [hub.py:1] token %s refused\\n" % sys.argv[4].split("=", 1)[1])
out.flush()
signal.pause()  # (until stopped)
"""


@pytest.mark.parametrize(
    ("argv", "secrets"),
    [
        (["--api-key", "A1xx"], ["A1xx"]),
        (["--api_key", "A1xx", "A2xx", "--port", "1"], ["A1xx", "A2xx"]),
        (["--api-k=A1xx"], ["A1xx"]),
        (["--hf_token=H1xx"], ["H1xx"]),
        (["--hf-tok", "H1xx", "m"], ["H1xx"]),  # nargs "?": one value, the rest is not its
        (["--hf-token", "--port", "1"], []),  # a bare --hf-token: the cached login
        (["--ssl-keyfile", "/k.pem"], []),  # a real flag of its own, not a prefix of a secret
        (["--api-server-count", "2"], []),
        (["--api-key.x", "1"], []),  # a JSON key of vLLM's, not a flag
    ],
)
def test_secret_flags_as_vllms_parser_reads_them(argv: list[str], secrets: list[str]) -> None:
    red = Redactor()
    red.learn(argv)
    shown = red.argv(argv)
    for s in secrets:
        assert s not in " ".join(shown) and red.text(f"x {s} y") == f"x {MASK} y"
    assert len(shown) == len(argv)
    plain = [a for a in argv if not any(s in a for s in secrets)]
    assert [a for a in shown if MASK not in a] == plain
    assert sum(MASK in a for a in shown) == len(secrets)


def test_short_secret_masked_in_argv_by_its_place() -> None:
    red = Redactor()
    argv = ["vllm", "--api-key", SHORT, "--model", "m"]
    red.learn(argv)
    assert red.argv(argv) == ["vllm", "--api-key", MASK, "--model", "m"]
    assert red.value({"session": {"argv": argv}}) == {"session": {"argv": red.argv(argv)}}
    assert red.text("keys k3y") == "keys k3y"  # too short to mask in free text (documented)


def test_supervised_secret_spellings_stay_inside(tmp_path: Path) -> None:
    argv = [
        sys.executable, "-c", CHILD, "--api_key", KEY1, KEY2, f"--hf_tok={HF}",
        "--api-key", SHORT, "--model", "/models/m",
    ]  # fmt: skip
    cfg = tmp_path / "loadwatch.toml"
    cfg.write_text(
        f"state_dir = '{tmp_path / 'st'}'\nevents_file = '{tmp_path / 'events.jsonl'}'\n"
        "[log]\npoll_interval_s = 0.05\n[http]\nlisten = '127.0.0.1:0'\n[gpu]\nsource = 'none'\n"
        f"[vllm]\nargv = {json.dumps(argv)}\nrestart = 'never'\npreflight = 'off'\n"
        "stop_grace_s = 1.0\n"
    )
    d = DaemonProc(["--config", str(cfg)], tmp_path / "out.jsonl")
    d.wait_listening()
    vllm_log = tmp_path / "st" / "vllm.log"
    try:
        wait_for(lambda: d.status()["session"]["warnings_total"] >= 1, "the echo read")
        status = json.dumps(d.status())
    finally:
        assert d.stop() == 0
    text = vllm_log.read_text()
    assert KEY1 in text and HF in text  # the copy is vLLM's output as it wrote it...
    assert stat.S_IMODE(vllm_log.stat().st_mode) == 0o600  # ...readable by the daemon's user only
    places = {
        "/status": status,
        "console": (tmp_path / "out.jsonl").read_text(),
        "event log file": (tmp_path / "events.jsonl").read_text(),
    }
    for where, written in places.items():
        for secret in (KEY1, KEY2, HF):
            assert secret[:12] not in written and secret[-12:] not in written, (where, secret)
    started = next(e for e in d.events() if e.get("event") == "vllm.started")
    assert SHORT not in started["argv"] and started["argv"][-3] == MASK
    assert f'"{SHORT}"' not in status


def test_vllm_log_copy_is_0600_even_when_it_was_wider(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        path = tmp_path / "v.log"
        path.write_bytes(b"old\n")
        path.chmod(0o644)  # left by an older loadwatch (0640) or made by hand
        log = RotatingLog(str(path), max_bytes=8, backups=2)
        log.write(b"abcdef\nghijkl\n")
        log.close()
    finally:
        os.umask(old)
    for p in (path, tmp_path / "v.log.1"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p


# A URL with a password in it, wherever vLLM's argv holds one: an option's value (vLLM's own
# `--otlp-traces-endpoint` takes a URL), after `=`, inside a JSON value, a positional.
URL_PW = "pw0URL0secret0in0the0userinfo0987"


@pytest.mark.parametrize(
    ("arg", "shown"),
    [
        (f"https://alice:{URL_PW}@collector:4317/v1", "https://alice:***@collector:4317/v1"),
        (
            f"--otlp-traces-endpoint=http://bob:{URL_PW}@h",
            "--otlp-traces-endpoint=http://bob:***@h",
        ),
        (f'{{"url": "redis://u:{URL_PW}@cache:6379/0"}}', '{"url": "redis://u:***@cache:6379/0"}'),
        ("postgres://carol:p@ss:w0rd@db/x", "postgres://carol:***@db/x"),  # `@` in the password
        ("https://dave:pw@h", "https://dave:***@h"),  # short: masked by its place all the same
        ("https://erin@host/x", "https://erin@host/x"),  # no password: nothing to mask
        ("https://host:8443/x", "https://host:8443/x"),  # a port is not a password
        ("/models/a:b@c", "/models/a:b@c"),  # not a URL
    ],
)
def test_url_passwords_in_argv_are_masked_keeping_user_and_host(arg: str, shown: str) -> None:
    argv = ["vllm", "serve", "--otlp-traces-endpoint", arg]
    red = Redactor()
    red.learn(argv)
    assert red.argv(argv) == ["vllm", "serve", "--otlp-traces-endpoint", shown]
    assert red.value({"argv": argv})["argv"][-1] == shown
    if URL_PW in arg:  # long enough to be masked in any text, as vLLM echoes it
        assert red.text(f"endpoint {arg} refused") == f"endpoint {shown} refused"


URL_CHILD = """
import signal, sys
p = "(APIServer pid=1) "
out = sys.stdout
out.write(p + "INFO 11-30 10:00:00 [api_server.py:1] vLLM API server version 0.6.3\\n")
out.write(p + "INFO 11-30 10:00:00 [utils.py:1] non-default args: "
          "{'otlp_traces_endpoint': '%s'}\\n" % sys.argv[2])
out.flush()
signal.pause()  # (until stopped)
"""


def test_supervised_url_passwords_stay_inside(tmp_path: Path) -> None:
    endpoint = f"https://alice:{URL_PW}@collector:4317/v1/traces"
    positional = "postgres://bob:k3y@db:5432/runs"  # short: masked by its place in the argv
    argv = [
        sys.executable, "-c", URL_CHILD, "--otlp-traces-endpoint", endpoint, positional,
    ]  # fmt: skip
    cfg = tmp_path / "loadwatch.toml"
    cfg.write_text(
        f"state_dir = '{tmp_path / 'st'}'\nevents_file = '{tmp_path / 'events.jsonl'}'\n"
        "[log]\npoll_interval_s = 0.05\n[http]\nlisten = '127.0.0.1:0'\n[gpu]\nsource = 'none'\n"
        f"[vllm]\nargv = {json.dumps(argv)}\nrestart = 'never'\npreflight = 'off'\n"
        "stop_grace_s = 1.0\n"
    )
    d = DaemonProc(["--config", str(cfg)], tmp_path / "out.jsonl")
    d.wait_listening()
    try:
        wait_for(lambda: (d.status().get("session") or {}).get("version"), "the log read")
        status = json.dumps(d.status())
    finally:
        assert d.stop() == 0
    assert URL_PW in (tmp_path / "st" / "vllm.log").read_text()  # vLLM's own output, kept
    places = {
        "/status": status,
        "console": (tmp_path / "out.jsonl").read_text(),
        "event log file": (tmp_path / "events.jsonl").read_text(),
    }
    for where, written in places.items():
        assert URL_PW[:10] not in written and URL_PW[-10:] not in written, where
        assert "bob:k3y@" not in written, where
    started = next(e for e in d.events() if e.get("event") == "vllm.started")
    assert started["argv"][-2:] == [
        "https://alice:***@collector:4317/v1/traces",
        "postgres://bob:***@db:5432/runs",
    ]


def test_a_proxy_urls_password_in_the_environment_is_learned() -> None:
    red = Redactor()
    red.learn((), {"HTTPS_PROXY": f"http://proxy-user:{URL_PW}@proxy:3128"})
    assert red.text(f"CONNECT via {URL_PW}") == f"CONNECT via {MASK}"
