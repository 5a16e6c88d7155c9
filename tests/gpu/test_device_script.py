"""The parts of tests/device/nvml_track.py that run without a GPU."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from loadwatch.daemon.sources.gpu.nvml import NvmlSource
from tests.device import nvml_track as nt
from tests.gpu import fake_pynvml as fk

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "device" / "nvml_track.py"
GIB = nt.GIB
MIB = nt.MIB


def test_tolerance_is_64_mib_or_one_percent() -> None:
    assert nt.tolerance_bytes(0) == 64 * MIB
    assert nt.tolerance_bytes(2 * GIB) == 64 * MIB
    assert nt.tolerance_bytes(16 * GIB) == round(16 * GIB * 0.01)
    assert nt.within(2 * GIB + 64 * MIB, 2 * GIB)
    assert not nt.within(2 * GIB + 65 * MIB, 2 * GIB)
    assert not nt.within(None, 0)


def test_table_columns_line_up() -> None:
    text = nt.format_table(("a", "bbbb"), [(1, "x"), ("long", 22)])
    lines = text.splitlines()
    assert lines == ["   a  bbbb", "----  ----", "   1     x", "long    22"]


def test_checks_print_pass_and_fail_and_remember_failures() -> None:
    out = io.StringIO()
    c = nt.Checks(out=out)
    assert c.add("one", True, "fine")
    assert not c.add("two", False, "broken")
    assert out.getvalue() == "PASS one: fine\nFAIL two: broken\n"
    assert c.failed == ["two"]


def test_child_protocol_allocates_each_step_on_next() -> None:
    allocated: list[int] = []
    reserved = {"n": 2 * MIB}

    def allocate(n: int) -> object:
        allocated.append(n)
        reserved["n"] += n
        return bytearray(0)

    stdin = io.StringIO("NEXT\nNEXT\nNEXT\nSTOP\n")
    stdout = io.StringIO()
    rc = nt.run_child(
        [0, 2 * GIB, 6 * GIB, 8 * GIB], allocate, lambda: reserved["n"], stdin, stdout
    )
    assert rc == 0
    assert allocated == [2 * GIB, 4 * GIB]  # the step to 0 allocates nothing; STOP ends it
    lines = stdout.getvalue().splitlines()
    assert lines[0].startswith("READY ") and lines[0].endswith(f" {2 * MIB}")
    assert lines[1:] == [
        f"STEP 0 {2 * MIB}",
        f"STEP {2 * GIB} {2 * GIB + 2 * MIB}",
        f"STEP {6 * GIB} {6 * GIB + 2 * MIB}",
    ]


def test_line_reader_waits_with_a_timeout_on_a_real_pipe() -> None:
    # it prints, then holds its stdout open until its stdin closes
    code = "import sys; print('noise'); print('READY 7 9', flush=True); sys.stdin.readline()"
    p = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout is not None and p.stdin is not None
        r = nt.LineReader(p.stdout)
        assert r.expect("READY", 10) == ["7", "9"]
        with pytest.raises(TimeoutError, match="no 'STEP' line"):
            r.expect("STEP", 0.05)
        p.stdin.close()
        with pytest.raises(EOFError):
            r.expect("STEP", 10)
    finally:
        p.kill()
        p.wait()


def test_track_sees_an_allocation_through_the_real_nvml_source_code() -> None:
    fake = fk.FakeNvml(fk.devices(1))
    dev = fake.devices[0]
    dev.processes = [(555, 500 * MIB)]
    src = NvmlSource(fake, xid_events=False)
    s0 = nt.sample_of(src, 0)
    base_used, base_proc = s0.memory_used_bytes, nt.process_bytes(s0, 555)
    assert base_used is not None and base_proc == 500 * MIB
    dev.used += 4 * GIB + 6 * MIB  # the driver rounds up a little
    dev.processes = [(555, 500 * MIB + 4 * GIB + 2 * MIB)]
    t = nt.track(src, 0, 555, base_used, base_proc, 4 * GIB, timeout_s=1.0)
    assert t.ok and t.process_seen
    assert (t.device_delta, t.process_delta) == (4 * GIB + 6 * MIB, 4 * GIB + 2 * MIB)


def test_track_fails_after_its_timeout_when_memory_does_not_move() -> None:
    fake = fk.FakeNvml(fk.devices(1))
    src = NvmlSource(fake, xid_events=False)
    now = {"t": 0.0}

    def nap(s: float) -> None:  # the injected sleep: time moves, none passes
        now["t"] += s

    t = nt.track(
        src,
        0,
        1000,
        1 * GIB,
        1 * GIB,
        8 * GIB,
        timeout_s=1.0,
        sleep=nap,
        monotonic=lambda: now["t"],
    )
    assert not t.ok and t.device_delta == 0 and t.waited_s >= 1.0


def test_script_imports_loadwatch_from_the_repo_when_not_installed(tmp_path: Path) -> None:
    # -S: no site-packages, so the installed loadwatch is out of reach; the shim must do it
    code = (
        f"import sys; sys.path.insert(0, {str(SCRIPT.parent)!r}); import nvml_track as t; "
        "t.ensure_loadwatch_importable(); import loadwatch.daemon.supervise.orphans as o; print(o.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("daemon/supervise/orphans.py")


def test_script_without_a_gpu_says_so_and_exits_2() -> None:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a working NVIDIA driver")
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--timeout-s", "60"],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=REPO,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "FAIL nvml-init: NVML init failed: " in out.stdout
    assert "Traceback" not in out.stderr


def test_multi_gpu_loader_prints_the_weights_bar_as_vllm_does() -> None:
    """Every bar line of a real vLLM 0.32 load, from its n, total and rate."""
    from tests.device import multi_gpu as mg

    fixture = REPO / "tests" / "fixtures" / "real-v0.32-deepseek-kvscales.log"
    lines = [
        rec + "\n"
        for raw in fixture.read_text(encoding="utf-8").split("\n")
        for rec in raw.split("\r")
        if rec.startswith("Loading safetensors checkpoint shards:")
    ]
    assert len(lines) >= 13
    pattern = re.compile(r"\| (\d+)/(\d+) \[[^,]*, +([0-9.]+|\?)(it/s|s/it)\]")
    for line in lines:
        m = pattern.search(line)
        assert m is not None, line
        n, total = int(m[1]), int(m[2])
        if n == 0:
            assert mg.bar(0, total, 0.0) == line
            continue
        rate = float(m[3]) if m[4] == "it/s" else 1 / float(m[3])
        assert mg.bar(n, total, n / rate) == line
    assert mg.bar(3, 100, 6.0).endswith("3/100 [00:06<03:14,  2.00s/it]\n")
    compile(mg.SERVER, "server.py", "exec")  # the functions are spliced into the loader
