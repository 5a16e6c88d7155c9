"""Run a real vLLM OpenAI server on the CPU as a child process, and clean up after it.

Standard library only, so the project's own test environment can drive a vLLM that lives in
another virtual environment (``scripts/ensure-vllm.sh``). The server runs in its own session, so
its engine-core and worker processes share one process group: stopping sends SIGTERM to the group,
waits, then SIGKILLs whatever is left, and nothing outlives :meth:`VllmServer.stop`.

Its combined stdout and stderr go straight to a file (no TTY, no pipe through this process), as
under a service manager: the bytes are exactly what vLLM wrote, ``\\r`` progress updates
included.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from loadwatch.daemon.tools.ports import free_port as free_port  # (the tests import it here)

DEFAULT_VENV = Path.home() / ".cache" / "loadwatch" / "vllm-0.32.0"
# vLLM's own cache, shared by every start as an operator's ~/.cache/vllm is: what it keeps there
# for an eager CPU start is the model classes' inspection (keyed by the module's hash), which a
# cold cache redoes in a subprocess that imports torch again (about 9 s of a 34 s start here).
SHARED_VLLM_CACHE = Path.home() / ".cache" / "loadwatch" / "vllm-cache"
Clock = Callable[[], float]


def vllm_python() -> Path:
    """The python of the vLLM environment (``LOADWATCH_VLLM_VENV`` overrides the default)."""
    venv = os.environ.get("LOADWATCH_VLLM_VENV")
    return (Path(venv) if venv else DEFAULT_VENV) / "bin" / "python"


def vllm_available(python: Path | None = None) -> bool:
    """True when that python exists and can import vllm (a few seconds: it imports torch)."""
    py = python or vllm_python()
    if not py.is_file():
        return False
    probe = subprocess.run(
        [str(py), "-c", "import vllm"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=120,
        check=False,
    )
    return probe.returncode == 0


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """Everything that decides how the server is started."""

    model: Path
    work_dir: Path  # TORCHINDUCTOR_CACHE_DIR lives under it, and TMPDIR is named for it
    port: int
    host: str = "127.0.0.1"
    python: Path = field(default_factory=vllm_python)
    max_model_len: int = 512
    max_num_seqs: int = 4
    enforce_eager: bool = True
    kv_cache_space_gib: int | None = 1  # VLLM_CPU_KVCACHE_SPACE; None leaves it unset
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = ()
    vllm_cache: Path = SHARED_VLLM_CACHE  # VLLM_CACHE_ROOT

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def server_argv(spec: ServerSpec) -> list[str]:
    """The command line. The ``vllm`` console script of vllm-cpu looks for a distribution named
    ``vllm`` and fails, so the server module is run directly."""
    argv = [
        str(spec.python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(spec.model),
    ]
    if spec.enforce_eager:
        argv.append("--enforce-eager")
    argv += [
        "--max-model-len",
        str(spec.max_model_len),
        "--max-num-seqs",
        str(spec.max_num_seqs),
        "--host",
        spec.host,
        "--port",
        str(spec.port),
        *spec.extra_args,
    ]
    return argv


def short_tmp(work_dir: Path) -> Path:
    """The server's TMPDIR: one per work dir, short whatever the work dir's length. vLLM's ZMQ
    IPC sockets live there under a 36-character name, and a socket path over 107 bytes fails the
    start (`tests/fixtures/real-v0.32-zmq-ipc-path-too-long.log`): a work dir under pytest's
    temporary directories, a worker's of `-n` most of all, is longer than that leaves."""
    digest = hashlib.sha256(str(work_dir.resolve()).encode()).hexdigest()[:12]
    return Path("/tmp") / f"lw-vllm-{digest}"


def server_env(spec: ServerSpec, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment: the caller's, minus any inherited vLLM/Hugging Face settings, plus an
    offline hub, no usage reporting, vLLM's cache at ``vllm_cache`` and the other caches and temp
    files under ``work_dir``."""
    src = os.environ if base is None else base
    env = {k: v for k, v in src.items() if not k.startswith(("VLLM_", "HF_", "TRANSFORMERS_"))}
    cache = spec.work_dir / "cache"
    tmp = short_tmp(spec.work_dir)
    env |= {
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CACHE_ROOT": str(spec.vllm_cache),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "TMPDIR": str(tmp),
    }
    if spec.kv_cache_space_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(spec.kv_cache_space_gib)
    env |= dict(spec.extra_env)
    return env


@dataclass(frozen=True, slots=True)
class HealthResult:
    """How waiting for ``/health`` ended."""

    healthy: bool
    elapsed_s: float
    exit_code: int | None  # set when the server exited before it became healthy
    last_error: str | None = None


@dataclass(frozen=True, slots=True)
class RssPeak:
    """Peak resident memory of the server's process group, sampled from /proc."""

    total_bytes: int  # the largest sum over the group seen in one sample
    largest_process_bytes: int
    samples: int


class _RssSampler:
    """Samples the RSS of every live process in one process group on a background thread."""

    def __init__(self, pgid: int, interval_s: float) -> None:
        self._pgid = pgid
        self._interval_s = interval_s
        self._stop = threading.Event()
        self.total = 0
        self.largest = 0
        self.samples = 0
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        while not self._stop.is_set():
            rss = [pages * page for _, pages in group_members(self._pgid)]
            if rss:
                self.samples += 1
                self.total = max(self.total, sum(rss))
                self.largest = max(self.largest, max(rss))
            self._stop.wait(self._interval_s)

    def close(self) -> RssPeak:
        self._stop.set()
        self._thread.join()
        return RssPeak(self.total, self.largest, self.samples)


def group_members(pgid: int, proc_root: Path = Path("/proc")) -> list[tuple[int, int]]:
    """(pid, resident pages) of every live, non-zombie process whose process group is ``pgid``."""
    out: list[tuple[int, int]] = []
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields start after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        # fields[0] is the state, [2] the process group, [21] the resident set in pages.
        if len(fields) > 21 and fields[0] != "Z" and int(fields[2]) == pgid:
            out.append((int(entry.name), int(fields[21])))
    return out


class VllmServer:
    """One vLLM server process group. Use as a context manager so it is always stopped."""

    def __init__(self, spec: ServerSpec, log_path: Path, clock: Clock = time.monotonic) -> None:
        self.spec = spec
        self.log_path = log_path
        self._clock = clock
        self._proc: subprocess.Popen[bytes] | None = None
        self._sampler: _RssSampler | None = None
        self.started_at: float | None = None
        self.rss_peak: RssPeak | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self, rss_interval_s: float | None = 0.5) -> None:
        """Start the server in a new session with its output going to ``log_path``."""
        if self._proc is not None:
            raise RuntimeError("server already started")
        env = server_env(self.spec)
        for key in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TMPDIR"):
            Path(env[key]).mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                server_argv(self.spec),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self.started_at = self._clock()
        if rss_interval_s is not None:
            self._sampler = _RssSampler(self._proc.pid, rss_interval_s)

    def elapsed_s(self) -> float | None:
        """Seconds since :meth:`start` on the server's clock."""
        return None if self.started_at is None else self._clock() - self.started_at

    def poll(self) -> int | None:
        """The exit code once the main process has exited, else None."""
        return None if self._proc is None else self._proc.poll()

    def health_status(self, timeout_s: float = 2.0) -> int | None:
        """The HTTP status of ``GET /health``; None while nothing answers."""
        try:
            with urllib.request.urlopen(self.spec.base_url + "/health", timeout=timeout_s) as r:
                status: int = r.status
                return status
        except urllib.error.HTTPError as exc:
            return exc.code
        except (urllib.error.URLError, OSError):
            return None

    def wait_healthy(
        self,
        deadline_s: float,
        interval_s: float = 0.25,
        sleep: Callable[[float], None] = time.sleep,
    ) -> HealthResult:
        """Poll ``/health`` until it answers 200, the server exits, or ``deadline_s`` passes
        (counted from :meth:`start`)."""
        if self._proc is None or self.started_at is None:
            raise RuntimeError("server not started")
        last: str | None = None
        while True:
            elapsed = self._clock() - self.started_at
            code = self._proc.poll()
            if code is not None:
                return HealthResult(False, elapsed, code, last)
            status = self.health_status()
            if status == 200:
                return HealthResult(True, self._clock() - self.started_at, None, None)
            last = "no answer" if status is None else f"HTTP {status}"
            if elapsed >= deadline_s:
                return HealthResult(False, elapsed, None, last)
            sleep(interval_s)

    def wait_exit(self, timeout_s: float) -> int | None:
        """Wait for the main process to exit on its own; its code, or None on timeout."""
        if self._proc is None:
            raise RuntimeError("server not started")
        try:
            return self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def complete(
        self, prompt: str, max_tokens: int = 4, timeout_s: float = 120.0
    ) -> dict[str, object]:
        """One ``POST /v1/completions`` (greedy); returns the decoded JSON answer."""
        body = json.dumps(
            {
                "model": str(self.spec.model),
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0.0,
            }
        ).encode()
        req = urllib.request.Request(
            self.spec.base_url + "/v1/completions",
            data=body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            answer: dict[str, object] = json.loads(r.read())
            return answer

    def stop(self, grace_s: float = 30.0) -> int | None:
        """SIGTERM the process group, SIGKILL what remains after ``grace_s``; returns the main
        process's exit code (negative for a signal, as subprocess reports it)."""
        proc = self._proc
        if proc is None:
            return None
        pgid = proc.pid  # leader of its own session, so its pid is the group id
        _signal_group(pgid, signal.SIGTERM)
        deadline = self._clock() + grace_s
        code: int | None = None
        while self._clock() < deadline:
            code = proc.poll()
            if code is not None and not group_members(pgid):
                break
            time.sleep(0.1)
        if proc.poll() is None or group_members(pgid):
            _signal_group(pgid, signal.SIGKILL)
        code = proc.wait()
        # Orphaned members of the group are reparented and reaped elsewhere; wait them out.
        end = self._clock() + 10.0
        while group_members(pgid) and self._clock() < end:
            time.sleep(0.05)
        if self._sampler is not None:
            self.rss_peak = self._sampler.close()
            self._sampler = None
        return code

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._proc is not None and (self._proc.poll() is None or group_members(self._proc.pid)):
            self.stop()
        elif self._sampler is not None:
            self.rss_peak = self._sampler.close()
            self._sampler = None
        shutil.rmtree(short_tmp(self.spec.work_dir), ignore_errors=True)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
