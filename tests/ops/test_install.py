"""The README's install, as written, every line, with Debian's system Python (root runs its
apt-get line): no checkout on sys.path, with and without a compiler; then the unit's ExecStart
runs and `systemd-analyze verify` accepts the units."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
import tomllib
import urllib.request
import zipfile
from pathlib import Path

import pytest

from .common import ROOT, require

pytestmark = pytest.mark.slow
OPT = "/opt/loadwatch"
VERSION = "0.1.0"


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        argv, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"{argv}: {result.stdout[-2000:]}{result.stderr[-3000:]}"
    return result.stdout


def readme_install_lines() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("<!-- install:begin", 1)[1].split("<!-- install:end -->", 1)[0]
    body = block.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line.split("  #", 1)[0].strip() for line in body.splitlines() if line.strip()]


# Debian's own Python, whatever a developer's PATH puts first (pyenv, a venv): the README is
# written for it, and it is the one that refuses `pip install` (PEP 668).
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
DEBIAN_PACKAGES = ("python3-venv", "python3-build")


def _system_env() -> dict[str, str]:
    """The environment an operator's root shell has: no venv, no pyenv, no pip overrides."""
    keep = {k: v for k, v in os.environ.items()
            if not k.startswith(("PYTHON", "PIP_", "VIRTUAL_ENV", "PYENV", "CONDA"))}  # fmt: skip
    return {**keep, "PATH": SYSTEM_PATH, "DEBIAN_FRONTEND": "noninteractive"}


def _run_line(line: str, cwd: Path, env: dict[str, str]) -> str:
    """One README line through a shell, as an operator pastes it (`&&`, `VAR=x cmd`): what it
    printed."""
    result = subprocess.run(
        ["/bin/sh", "-ec", line], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"{line}: {result.stdout[-2000:]}{result.stderr[-3000:]}"
    return result.stdout + result.stderr


def _debian_packages_missing() -> list[str]:
    result = subprocess.run(
        ["dpkg-query", "-W", "-f=${Package} ${Status}\n", *DEBIAN_PACKAGES],
        env=_system_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    installed = {ln.split()[0] for ln in result.stdout.splitlines() if ln.endswith(" installed")}
    return [name for name in DEBIAN_PACKAGES if name not in installed]


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The source as a checkout has it (tracked files only), built and installed by the README's
    lines, every one of them, with Debian's system Python."""
    env = _system_env()
    python3 = subprocess.run(
        ["/bin/sh", "-c", "command -v python3"], env=env, capture_output=True, text=True,
        timeout=60, check=False,
    ).stdout.strip()  # fmt: skip
    assert python3 == "/usr/bin/python3", python3
    assert list(Path("/usr/lib").glob("python3.*/EXTERNALLY-MANAGED")), "not Debian's Python"
    work = tmp_path_factory.mktemp("install")
    src = work / "src"
    listed = _run(["git", "ls-files", "-co", "--exclude-standard"], ROOT).splitlines()
    for rel in listed:
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_bytes((ROOT / rel).read_bytes())
    opt = work / "opt" / "loadwatch"
    said: dict[str, str] = {}  # what each line printed
    for line in readme_install_lines():
        if line.startswith("apt-get ") and os.geteuid() != 0:
            # Only root can run it; as another user the packages it installs must be there.
            missing = _debian_packages_missing()
            assert not missing, f"run as root, or `apt-get install -y {' '.join(missing)}`"
            continue
        said[line] = _run_line(line.replace(OPT, str(opt)), src, env)
    (work / "said.json").write_text(json.dumps(said))
    return {"src": src, "dist": src / "dist", "opt": opt, "work": work}


def test_the_dist_holds_an_sdist_a_platform_wheel_and_a_pure_one(host: dict[str, Path]) -> None:
    names = sorted(p.name for p in host["dist"].iterdir())
    assert f"loadwatch-{VERSION}.tar.gz" in names
    assert f"loadwatch-{VERSION}-py3-none-any.whl" in names
    assert any(n.startswith(f"loadwatch-{VERSION}-cp3") and "linux" in n for n in names), names
    listing = _run(["tar", "tzf", str(host["dist"] / f"loadwatch-{VERSION}.tar.gz")], host["src"])
    for rel in ("LICENSE", "systemd/loadwatch.service", "systemd/loadwatch@.service",
                "prometheus/alerts.yml", "grafana/loadwatch.json", "docs/runbook.md"):  # fmt: skip
        assert f"loadwatch-{VERSION}/{rel}" in listing, rel
    for page in (ROOT / "docs").glob("*.md"):
        assert f"loadwatch-{VERSION}/docs/{page.name}" in listing, page.name


def _scanner(python: Path, cwd: Path) -> dict[str, object]:
    out = _run(
        [str(python), "-c", "import json, sys, loadwatch.parsers.scan as s; "
         "print(json.dumps({'native': s.NATIVE, 'file': s.__file__, 'path': sys.path}))"],
        cwd,
    )  # fmt: skip
    doc: dict[str, object] = json.loads(out)
    return doc


def _fresh_venv(where: Path) -> Path:
    _run(["python3", "-m", "venv", str(where)], where.parent)
    return where / "bin"


def test_the_readme_install_runs_from_its_venv_alone(host: dict[str, Path]) -> None:
    bin_ = host["opt"] / "bin"
    doc = _scanner(bin_ / "python", host["work"])
    assert str(doc["file"]).startswith(str(host["opt"]))  # the venv's copy, not a checkout
    assert not any(str(host["src"]) in p or str(ROOT) in p for p in doc["path"])  # type: ignore[attr-defined]
    assert doc["native"] is False  # the pure wheel, as the README installs it
    assert (host["opt"] / "share" / "systemd" / "loadwatch.service").is_file()
    assert (host["opt"] / "share" / "prometheus" / "alerts.yml").is_file()
    for page in (ROOT / "docs").glob("*.md"):  # every page the README's Documentation lists
        assert (host["opt"] / "share" / "docs" / page.name).is_file(), page.name
    # the units' Documentation= names files this install wrote (`systemctl status` shows them)
    for unit in (host["opt"] / "share" / "systemd").glob("*.service"):
        docs = [uri for line in unit.read_text().splitlines() if line.startswith("Documentation=")
                for uri in line.removeprefix("Documentation=").split()]  # fmt: skip
        assert docs, unit.name
        for uri in docs:
            assert uri.startswith(f"file:{OPT}/share/"), uri
            assert Path(uri.removeprefix("file:").replace(OPT, str(host["opt"]))).is_file(), uri


def test_the_platform_wheel_is_the_sdist_built_with_a_compiler(host: dict[str, Path]) -> None:
    """`python3 -m build` (neither --sdist nor --wheel) builds the sdist, then the wheel from
    that sdist, in an isolated environment as pip's install of the sdist would: with the
    README host's compiler, the compiled parts are in it. (Installing the sdist with a compiler
    again would only compile the same sources the same way a second time.)"""
    build = json.loads((host["work"] / "said.json").read_text())["python3 -m build"]
    assert "Building wheel from sdist" in build, build[-3000:]
    wheel = next(host["dist"].glob(f"loadwatch-{VERSION}-cp3*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("loadwatch/parsers/_scan.") and n.endswith(".so") for n in names)
    compiled = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["loadwatch"]["compiled"]
    for rel in compiled:  # every module listed as compiled, compiled
        stem = "loadwatch/" + rel.removesuffix(".py")
        assert any(n.startswith(stem + ".") and n.endswith(".so") for n in names), rel


@pytest.mark.parametrize(
    "what", ["the sdist, pure", "the platform wheel, compiled"], ids=["sdist", "wheel"]
)
def test_without_a_compiler_the_sdist_installs_pure_and_the_wheel_compiled(
    host: dict[str, Path], tmp_path: Path, what: str
) -> None:
    bin_ = _fresh_venv(tmp_path / "venv")
    env = {"CC": "/nonexistent/cc", "LDSHARED": "/nonexistent/cc -shared"}
    if what.startswith("the sdist"):
        dist = host["dist"] / f"loadwatch-{VERSION}.tar.gz"
    else:
        dist = next(host["dist"].glob(f"loadwatch-{VERSION}-cp3*.whl"))
    _run([str(bin_ / "pip"), "install", "-q", str(dist)], tmp_path, env)
    # the sdist goes on with the Python its compiled parts are made from; the wheel has them
    assert _scanner(bin_ / "python", tmp_path)["native"] is what.endswith("compiled")


def test_the_units_execstart_runs_and_systemd_analyze_verifies_the_units(
    host: dict[str, Path], tmp_path: Path
) -> None:
    share = host["opt"] / "share" / "systemd"
    unit = (share / "loadwatch.service").read_text()
    exec_line = next(x for x in unit.splitlines() if x.startswith("ExecStart="))
    argv = shlex.split(exec_line.removeprefix("ExecStart=").replace(OPT, str(host["opt"])))
    assert Path(argv[0]).is_file() and argv[1:3] == ["run", "--config"]
    example = (share / "loadwatch.toml.example").read_text()
    config = tmp_path / "loadwatch.toml"
    (tmp_path / "vllm.log").write_bytes(b"")
    config.write_text(
        example.replace("/var/lib/loadwatch", str(tmp_path / "state"))
        .replace("/var/log/loadwatch", str(tmp_path))
        .replace("/var/log/vllm/vllm.log", str(tmp_path / "vllm.log"))
        .replace('dir = "/models/Kimi-K2.5-NVFP4"', "")
        .replace("127.0.0.1:9321", "127.0.0.1:0")
        .replace('source = "nvml"', 'source = "none"')
    )
    argv[3] = str(config)
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        url = ""
        end = time.monotonic() + 60
        while not url and time.monotonic() < end:
            line = proc.stdout.readline()
            if not line:
                break
            doc = json.loads(line) if line.startswith(b"{") else {}
            url = doc.get("url", "") if doc.get("event") == "daemon.listening" else ""
        assert url, proc.stderr.read() if proc.poll() is not None else "no daemon.listening"
        with urllib.request.urlopen(url + "/healthz", timeout=10) as r:
            assert r.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    assert code == 0
    for name in ("loadwatch.service", "loadwatch-supervise.service", "loadwatch@.service"):
        copy = tmp_path / name
        copy.write_text((share / name).read_text().replace(OPT, str(host["opt"])))
        result = subprocess.run(
            [require("systemd-analyze"), "verify", str(copy)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert result.returncode == 0 and not result.stderr.strip(), (name, result.stderr)
