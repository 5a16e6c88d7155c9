"""The systemd units, checked by systemd's own tools: verify, security, timespan, sysusers."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from loadwatch.daemon.config import load_config
from loadwatch.daemon.tools.install_files import ops_files

from .common import ROOT, SYSTEMD, require

WATCH = SYSTEMD / "loadwatch.service"
SUPERVISE = SYSTEMD / "loadwatch-supervise.service"
TEMPLATE = SYSTEMD / "loadwatch@.service"
WATCH_CONFIG = SYSTEMD / "loadwatch.toml.example"
SUPERVISE_CONFIG = SYSTEMD / "loadwatch-supervise.toml.example"
INSTALLED_BINARY = "/opt/loadwatch/bin/loadwatch"

Unit = dict[str, dict[str, list[str]]]


def parse_unit(path: Path) -> Unit:
    """Section -> key -> every value given (systemd lets most keys repeat)."""
    unit: Unit = defaultdict(lambda: defaultdict(list))
    section = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not a key=value line: {raw!r}"
        unit[section][key.strip()].append(value.strip())
    return unit


def one(unit: Unit, key: str, section: str = "Service") -> str:
    values = unit[section][key]
    assert len(values) == 1, f"{key} given {len(values)} times"
    return values[0]


def microseconds(span: str) -> int:
    """A systemd time span as systemd reads it."""
    out = subprocess.run(
        [require("systemd-analyze"), "timespan", span],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    found = re.search(r"μs: (\d+)", out)
    assert found, out
    return int(found.group(1))


def venv_loadwatch() -> Path:
    script = Path(sys.executable).with_name("loadwatch")
    assert script.exists(), f"{script} missing: run scripts/ensure-venv.sh"
    return script


@pytest.mark.parametrize("unit_path", [WATCH, SUPERVISE, TEMPLATE], ids=lambda p: p.name)
def test_verify_clean(unit_path: Path, tmp_path: Path) -> None:
    """`systemd-analyze verify` on a copy whose ExecStart names the venv's real loadwatch."""
    text = unit_path.read_text(encoding="utf-8")
    assert f"ExecStart={INSTALLED_BINARY} run --config " in text
    copy = tmp_path / unit_path.name
    copy.write_text(
        text.replace(f"ExecStart={INSTALLED_BINARY} ", f"ExecStart={venv_loadwatch()} ")
    )
    changed = [
        (a, b)
        for a, b in zip(text.splitlines(), copy.read_text().splitlines(), strict=True)
        if a != b
    ]
    assert len(changed) == 1 and changed[0][0].startswith("ExecStart=")
    result = subprocess.run(
        [require("systemd-analyze"), "verify", str(copy)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "" and result.stdout.strip() == ""


@pytest.mark.parametrize("unit_path", [WATCH, SUPERVISE, TEMPLATE], ids=lambda p: p.name)
def test_documentation_names_files_the_install_writes(unit_path: Path) -> None:
    """`systemctl help` opens what Documentation= names: files the README's install writes
    (`loadwatch install-files /opt/loadwatch/share`), never a web page that may not exist."""
    share = "file:/opt/loadwatch/share/"
    docs = [
        uri for value in parse_unit(unit_path)["Unit"]["Documentation"] for uri in value.split()
    ]
    assert docs, "no Documentation="
    installed = ops_files()
    for uri in docs:
        assert uri.startswith(share), uri
        assert uri.removeprefix(share) in installed, f"{uri}: install-files does not write it"
    assert f"{share}docs/runbook.md" in docs


def test_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    """The check above can fail: an unknown key and a missing binary are both reported."""
    copy = tmp_path / "loadwatch.service"
    copy.write_text(WATCH.read_text().replace("NoNewPrivileges=yes", "NoNewPrivilege=yes"))
    result = subprocess.run(
        [require("systemd-analyze"), "verify", str(copy)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert "NoNewPrivilege" in result.stderr
    assert INSTALLED_BINARY in result.stderr and result.returncode != 0


def measured_scores() -> dict[str, tuple[float, str]]:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "systemd_security.py")],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    scores = {
        m.group(1): (float(m.group(2)), m.group(3))
        for m in re.finditer(r"^(\S+\.service): ([0-9.]+) (\w+)", result.stdout, re.M)
    }
    assert set(scores) == {WATCH.name, SUPERVISE.name}, result.stdout + result.stderr
    assert result.returncode == 0, result.stdout  # the watch goal is met
    return scores


def test_security_scores_and_what_the_docs_claim() -> None:
    scores = measured_scores()
    assert scores[WATCH.name][0] <= 2.5
    readme = (SYSTEMD / "README.md").read_text()
    for unit_path in (WATCH, SUPERVISE):
        score, rating = scores[unit_path.name]
        claim = f"systemd-analyze security --offline=true {unit_path.name}: {score:.1f} {rating}"
        assert claim in unit_path.read_text(), f"{unit_path.name} should say: {claim}"
        assert f"| `{unit_path.name}` |" in readme
        assert f"| {score:.1f} {rating} |" in readme


@pytest.mark.parametrize("unit_path", [WATCH, SUPERVISE], ids=lambda p: p.name)
def test_common_settings(unit_path: Path) -> None:
    unit = parse_unit(unit_path)
    common_with_the_template(unit)
    assert one(unit, "StateDirectory") == "loadwatch"
    assert one(unit, "LogsDirectory") == "loadwatch"


def test_the_template_keeps_each_instance_apart() -> None:
    """loadwatch@NAME: its own config (with its own port and GPUs), state and event log."""
    unit = parse_unit(TEMPLATE)
    common_with_the_template(unit)
    assert one(unit, "StateDirectory") == "loadwatch/%i"
    assert one(unit, "LogsDirectory") == "loadwatch/%i"
    argv = one(unit, "ExecStart").split()
    assert argv[argv.index("--config") + 1] == "/etc/loadwatch/%i.toml"
    assert argv[argv.index("--state-dir") + 1] == "/var/lib/loadwatch/%i"
    assert argv[argv.index("--events-file") + 1] == "/var/log/loadwatch/%i/events.jsonl"
    assert unit["Unit"]["Conflicts"] == []  # instances run side by side
    watch = parse_unit(WATCH)["Service"]
    same = {"DeviceAllow", "SystemCallFilter", "IPAddressDeny", "RestrictAddressFamilies"}
    assert {k: watch[k] for k in same} == {k: unit["Service"][k] for k in same}


def common_with_the_template(unit: Unit) -> None:
    expected = {
        "Type": "notify",
        "NotifyAccess": "main",
        "Restart": "on-failure",
        "RestartPreventExitStatus": "78",
        "User": "loadwatch",
        "Group": "loadwatch",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "NoNewPrivileges": "yes",
        "CapabilityBoundingSet": "",
        "DevicePolicy": "closed",
        "SystemCallArchitectures": "native",
        "SystemCallErrorNumber": "EPERM",
    }
    for key, value in expected.items():
        assert one(unit, key) == value, key
    assert microseconds(one(unit, "WatchdogSec")) >= 10_000_000
    assert unit["Service"]["SystemCallFilter"][0] == "@system-service"
    families = one(unit, "RestrictAddressFamilies").split()
    assert {"AF_UNIX", "AF_INET", "AF_INET6"} <= set(families)
    assert "AF_PACKET" not in families
    assert "char-nvidia rw" in unit["Service"]["DeviceAllow"]  # NVML in both modes
    assert one(unit, "WantedBy", "Install") == "multi-user.target"


def test_gpu_compute_devices_only_in_supervise_mode() -> None:
    watch = parse_unit(WATCH)["Service"]["DeviceAllow"]
    supervise = parse_unit(SUPERVISE)["Service"]["DeviceAllow"]
    assert not any("uvm" in d for d in watch)
    assert "char-nvidia-uvm rw" in supervise
    assert set(watch) < set(supervise)
    assert one(parse_unit(WATCH), "IPAddressDeny") == "any"
    assert parse_unit(SUPERVISE)["Service"]["IPAddressDeny"] == []


def test_examples_load_and_match_their_units() -> None:
    for unit_path, config_path, supervise in (
        (WATCH, WATCH_CONFIG, False),
        (SUPERVISE, SUPERVISE_CONFIG, True),
    ):
        unit = parse_unit(unit_path)
        cfg = load_config(config_path)
        assert cfg.supervise is supervise
        installed_as = one(unit, "ExecStart").split("--config ", 1)[1]
        assert f"install as {installed_as}" in config_path.read_text()
        assert cfg.state_dir == Path("/var/lib") / one(unit, "StateDirectory")
        logs = Path("/var/log") / one(unit, "LogsDirectory")
        assert cfg.events_file is not None and cfg.events_file.parent == logs
        assert cfg.log.path is not None
        assert cfg.http.loopback
    supervised = load_config(SUPERVISE_CONFIG)
    assert supervised.log.path is not None and supervised.log.path.parent == Path(
        "/var/log/loadwatch"
    )
    assert supervised.vllm is not None
    argv = supervised.vllm.argv
    assert argv[argv.index("--tensor-parallel-size") + 1] == "8"
    assert "Kimi-K2.5-NVFP4" in " ".join(argv)


def test_stop_timeouts_leave_room_for_the_vllm_grace() -> None:
    watch, supervise = parse_unit(WATCH), parse_unit(SUPERVISE)
    assert microseconds(one(watch, "TimeoutStopSec")) >= 5_000_000  # clean exit within 2 s
    grace_s = load_config(SUPERVISE_CONFIG).vllm.stop_grace_s  # type: ignore[union-attr]
    assert grace_s == 30.0  # the daemon's default, stated in the unit's comment
    assert microseconds(one(supervise, "TimeoutStopSec")) >= (grace_s + 20) * 1_000_000
    # systemd signals only loadwatch; loadwatch stops vLLM in order.
    assert one(supervise, "KillMode") == "mixed"


def test_sysusers_creates_the_service_user(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    subprocess.run(
        [require("systemd-sysusers"), f"--root={tmp_path}", str(SYSTEMD / "loadwatch.sysusers")],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    users = [line.split(":") for line in (tmp_path / "etc/passwd").read_text().splitlines()]
    groups = [line.split(":") for line in (tmp_path / "etc/group").read_text().splitlines()]
    (user,) = (u for u in users if u[0] == "loadwatch")
    assert any(g[0] == "loadwatch" and g[2] == user[3] for g in groups)
    assert user[5] == "/var/lib/" + one(parse_unit(WATCH), "StateDirectory")
    assert user[6] == "/usr/sbin/nologin"
    assert 0 < int(user[2]) < 1000  # a system user
