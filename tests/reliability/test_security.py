"""Security through the real daemon: where it listens, TLS and authentication, secrets.

- Loopback by default: `--listen :0` binds 127.0.0.1 (the kernel's socket table says so, and a
  connection to this machine's other address is refused). Listening elsewhere must be asked for,
  and is said in the event log.
- TLS with a bearer token, configured in a config file, on 0.0.0.0: a real client (urllib, and
  curl when installed) gets 401 without the token or with a wrong one, 200 with it, over either
  address; plain HTTP to the port fails; the token shows nowhere in what the daemon writes.
  TLS with basic auth the same way, through `load_config` and `run_daemon`.
- Secrets planted in vLLM's argv (`--api-key X`, `--hf-token=X`), in the configured environment
  (`HF_TOKEN`, `DB_PASSWORD`) and in the daemon's own environment (`OPENAI_API_KEY`, passed on
  to vLLM), and printed back by the supervised simulated vLLM in errors, warnings, a traceback,
  and cut in two by the parser's message limit: no secret, nor any 8 characters of one, is in
  /status, /metrics, the console, the event log file or stderr.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from loadwatch.daemon.config import load_config
from loadwatch.daemon.tools.demo import free_port, make_model_dir
from tests.daemon.harness import running
from tests.exporters.test_http import make_cert
from tests.reliability.proc import DaemonProc, wait_for


def _other_address() -> str | None:
    """This machine's address on a network, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 9))  # no packet is sent: this only picks a route
        except OSError:
            return None
        addr = str(s.getsockname()[0])
    return None if addr.startswith("127.") else addr


def _listening(port: int) -> set[str]:
    """The local addresses with a listening TCP socket on `port`, from /proc/net/tcp."""
    out = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        hexaddr, hexport = local.split(":")
        if state == "0A" and int(hexport, 16) == port:
            raw = bytes.fromhex(hexaddr)[::-1]
            out.add(socket.inet_ntoa(raw))
    return out


def _get(
    url: str, token: str | None = None, ctx: ssl.SSLContext | None = None, auth: str | None = None
) -> int:
    headers = {}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if auth is not None:
        headers["Authorization"] = f"Basic {auth}"
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5, context=ctx) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        assert e.code != 401 or e.headers.get("WWW-Authenticate"), "a 401 names its scheme"
        return int(e.code)


def test_loopback_unless_asked(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("")
    d = DaemonProc(
        ["--log", str(log), "--state-dir", str(tmp_path / "st"), "--gpu", "none", "--listen", ":0"],
        tmp_path / "out.jsonl",
    )
    d.wait_listening()
    try:
        port = int(d.url.rsplit(":", 1)[1])
        assert d.url.startswith("http://127.0.0.1:")
        assert _listening(port) == {"127.0.0.1"}
        other = _other_address()
        if other is not None:
            with pytest.raises(OSError):
                socket.create_connection((other, port), timeout=2).close()
        assert not [e for e in d.events() if e.get("event") == "daemon.warning"]
    finally:
        assert d.stop() == 0


def test_tls_and_bearer_token_from_a_config_file(tmp_path: Path) -> None:
    cert, key = make_cert(tmp_path)
    token = "tok-" + base64.b32encode(os.urandom(15)).decode()
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    log = tmp_path / "vllm.log"
    log.write_text("")
    cfg = tmp_path / "loadwatch.toml"
    cfg.write_text(
        f"state_dir = '{tmp_path / 'st'}'\nevents_file = '{tmp_path / 'events.jsonl'}'\n"
        f"[log]\npath = '{log}'\n[gpu]\nsource = 'none'\n"
        f"[http]\nlisten = '0.0.0.0:0'\ntls_cert = '{cert}'\ntls_key = '{key}'\n"
        f"bearer_token_file = '{token_file}'\n"
    )
    d = DaemonProc(["--config", str(cfg)], tmp_path / "out.jsonl")
    d.wait_listening()
    ctx = ssl.create_default_context(cafile=str(cert))
    try:
        port = int(d.url.rsplit(":", 1)[1])
        assert d.url.startswith("https://0.0.0.0:")
        warning = [e for e in d.events() if e.get("event") == "daemon.warning"]
        assert warning and "not loopback" in warning[0]["warning"]
        base = f"https://127.0.0.1:{port}"
        for path in ("/metrics", "/status", "/readyz"):
            assert _get(base + path, ctx=ctx) == 401
            assert _get(base + path, token="wrong", ctx=ctx) == 401
            assert _get(base + path, token=token + "x", ctx=ctx) == 401
        assert _get(base + "/metrics", token=token, ctx=ctx) == 200
        assert _get(base + "/status", token=token, ctx=ctx) == 200
        other = _other_address()
        if other is not None:  # listening elsewhere, as asked; the certificate names 127.0.0.1
            raw = ssl.create_default_context(cafile=str(cert))
            raw.check_hostname = False
            assert _get(f"https://{other}:{port}/metrics", token=token, ctx=raw) == 200
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3).read()
        curl = shutil.which("curl")
        if curl is not None:
            out = subprocess.run(
                [curl, "-sS", "--cacert", str(cert), "-H", f"Authorization: Bearer {token}",
                 "-o", "/dev/null", "-w", "%{http_code} %{ssl_verify_result}", base + "/metrics"],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            assert out.stdout == "200 0", out
            out = subprocess.run(
                [curl, "-sS", "--cacert", str(cert), "-o", "/dev/null", "-w", "%{http_code}", base + "/metrics"],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            assert out.stdout == "401", out
    finally:
        assert d.stop() == 0
    written = (tmp_path / "out.jsonl").read_text() + (tmp_path / "events.jsonl").read_text()
    assert token not in written + d.stderr()


def test_tls_and_basic_auth_from_a_config_file(tmp_path: Path) -> None:
    cert, key = make_cert(tmp_path)
    pw = tmp_path / "pw"
    pw.write_text("correct horse battery\n")
    log = tmp_path / "vllm.log"
    log.write_text("")
    path = tmp_path / "loadwatch.toml"
    path.write_text(
        f"state_dir = '{tmp_path / 'st'}'\n[log]\npath = '{log}'\n[gpu]\nsource = 'none'\n"
        f"[http]\nlisten = '127.0.0.1:0'\ntls_cert = '{cert}'\ntls_key = '{key}'\n"
        f"basic_auth_user = 'prometheus'\nbasic_auth_password_file = '{pw}'\n"
    )
    ctx = ssl.create_default_context(cafile=str(cert))
    good = base64.b64encode(b"prometheus:correct horse battery").decode()
    bad = base64.b64encode(b"prometheus:correct horse").decode()
    with running(load_config(path)) as d:
        assert d.url.startswith("https://127.0.0.1:")
        assert _get(d.url + "/metrics", ctx=ctx) == 401
        assert _get(d.url + "/metrics", auth=bad, ctx=ctx) == 401
        assert _get(d.url + "/metrics", token=good, ctx=ctx) == 401  # the wrong scheme
        assert _get(d.url + "/metrics", auth=good, ctx=ctx) == 200
    assert "correct horse" not in d.out.getvalue()


# -- secrets ---------------------------------------------------------------------------------

SECRETS = {
    "argv": "sk-ARGV0secret0value0abcdef0123456789",
    "argv_eq": "hf_ARGVEQ0secret0value0zyxwvut98765",
    "env": "hf_ENV0secret0value0QWERTYUIOP123456",
    "env_pw": "pw-ENV0secret0value0ASDFGHJKL0099887",
    "inherited": "sk-INHERITED0secret0value0mnbvcxz5544",
}

# The "vLLM": prints what vLLM may print about its secrets, then fails to start.
CHILD = """
import os, sys
argv = sys.argv[1:]
key = argv[argv.index("--api-key") + 1]
hf = next(a.split("=", 1)[1] for a in argv if a.startswith("--hf-token="))
env, pw, inherited = os.environ["HF_TOKEN"], os.environ["DB_PASSWORD"], os.environ["OPENAI_API_KEY"]
p = "(APIServer pid=%d) " % os.getpid()
out = sys.stdout
out.write(p + "INFO 11-30 10:00:00 [api_server.py:1] vLLM API server version 0.15.1\\n")
out.write(p + "INFO 11-30 10:00:00 [utils.py:1] non-default args: {'api_key': '%s', 'hf_token': '%s'}\\n" % (key, hf))
out.write(p + "WARNING 11-30 10:00:01 [hub.py:1] token %s was refused; retrying with %s\\n" % (env, inherited))
out.write(p + "WARNING 11-30 10:00:01 [hub.py:2] " + "x" * 1990 + env + "\\n")
out.write(p + "ERROR 11-30 10:00:02 [core.py:1] Traceback (most recent call last):\\n")
out.write(p + 'ERROR 11-30 10:00:02 [core.py:1]   File "db.py", line 1, in connect\\n')
out.write(p + "ERROR 11-30 10:00:02 [core.py:1] PermissionError: login with %s failed\\n" % pw)
out.write(p + "RuntimeError: Engine core initialization failed. api_key=%s\\n" % key)
out.flush()
sys.exit(1)
"""


def _leaks(text: str) -> list[str]:
    found = []
    for name, secret in SECRETS.items():
        for i in range(len(secret) - 7):
            if secret[i : i + 8] in text:
                found.append(f"{name}: {secret[i : i + 8]!r}")
                break
    return found


def test_secrets_never_leave_the_process(tmp_path: Path) -> None:
    argv = [
        sys.executable, "-c", CHILD, "--model", "/models/m",
        "--api-key", SECRETS["argv"], f"--hf-token={SECRETS['argv_eq']}", "--port", str(free_port()),
    ]  # fmt: skip
    model = make_model_dir(tmp_path / "models", fp8_kv=False, shards=2, total_bytes=2 * 10**9)
    cfg = tmp_path / "loadwatch.toml"
    cfg.write_text(
        f"state_dir = '{tmp_path / 'st'}'\nevents_file = '{tmp_path / 'events.jsonl'}'\n"
        "[log]\npoll_interval_s = 0.05\n[http]\nlisten = '127.0.0.1:0'\n[gpu]\nsource = 'none'\n"
        f"[model]\ndir = '{model}'\n"
        f"[vllm]\nargv = {json.dumps(argv)}\nrestart = 'never'\npreflight = 'off'\n"
        f"[vllm.env]\nHF_TOKEN = '{SECRETS['env']}'\nDB_PASSWORD = '{SECRETS['env_pw']}'\n"
    )
    d = DaemonProc(
        ["--config", str(cfg)], tmp_path / "out.jsonl", env={"OPENAI_API_KEY": SECRETS["inherited"]}
    )
    d.wait_listening()
    try:
        # what the child printed reaches the daemon (through the log): the secrets are there
        wait_for(
            lambda: (
                (s := d.status()["session"])["phase"] == "failed"
                and s["failures_total"] >= 2
                and s["warnings_total"] >= 2
            ),
            "the failed start, read from the log",
        )
        wait_for(
            lambda: any(e.get("event") == "vllm.exited" for e in d.events()), "the exit reported"
        )
        status = json.dumps(d.status())
        metrics = d.get("/metrics")[1].decode()
        vllm_log = (tmp_path / "st" / "vllm.log").read_text()
        assert SECRETS["argv"] in vllm_log and SECRETS["env"] in vllm_log
    finally:
        assert d.stop() == 0
    places = {
        "/status": status,
        "/metrics": metrics,
        "console": (tmp_path / "out.jsonl").read_text(),
        "event log file": (tmp_path / "events.jsonl").read_text(),
        "stderr": d.stderr(),
    }
    masked = places["console"].count("***")
    leaks = {where: found for where, text in places.items() if (found := _leaks(text))}
    print(f"\nsecrets planted={len(SECRETS)} masked occurrences on the console={masked}")
    assert leaks == {}, leaks
    assert masked >= 5
