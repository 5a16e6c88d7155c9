"""What loadwatch costs while it follows a serving vLLM's log for days, beside mtail, same run.

    .venv/bin/python bench/live_cost.py [--quick] [--repeat N] [--rates 10,300,3000]
        [--scrape-every 15] [--batch-ms 0] [--shape serving|requests]

A serving vLLM run with `--enable-log-requests` writes a few lines per request. Here a writer
process appends lines of that shape (`Received request ...: params: SamplingParams(...)`,
`Added request ...`, uvicorn's access line, the engine's `Avg prompt throughput` statistics
every 10 s, and a WARNING every half second on average, at random times, so events flow and
the latency an append sees is not locked to the reader's tick; the shapes are vLLM 0.32's, from
tests/fixtures/real-v0.32-*.log; `--shape requests`: with `--enable-log-outputs` at DEBUG,
each prompt and output echoed, client text some of which reads like vLLM's own lines) at a
steady rate, one `write` per line as vLLM's logging does (or, `--batch-ms N`, the lines due
every N ms in one write, as a writer that buffers does), to two files: one followed by `loadwatch run --log FILE --gpu none`, one by `mtail --progs
bench/vllm_load.mtail --logs FILE`. Both start on the same backlog: a real vLLM 0.32 start-up up
to `Application startup complete` (tests/fixtures/real-v0.32-llama.log), whose API server this
bench's own loopback `/health` answers, so loadwatch's session is a ready, probed one, as beside
a real server.

For each rate (lines/s) and each repeat, with both tools freshly started:
- cost: CPU over the writing window of each tool and all it started (loadwatch's HTTP server
  process included), as % of one core: from a cgroup of each tool's own where the machine lets
  the bench make one (to the microsecond, exited threads and children included), else utime +
  stime from /proc/PID/stat (10 ms ticks: at 0.3% of a core over 30 s, one tick is a ninth of
  the figure; the report says which), while a Prometheus-like
  scraper reads both tools' /metrics every `--scrape-every` seconds (15; 0: never), as a
  deployment does: both render what they export when scraped;
- latency, from the append of a line (the writer's clock) to (a) its event in loadwatch's event
  log (`--events-file`, tailed every 2 ms: the WARNING lines) and (b) /metrics showing it
  (`loadwatch_log_read_bytes_total` past the line's end; scraped 20 times a second in a second
  window, after the cost window, so the scrapes cost nothing above), p50/p99.
- idle: no writes, loadwatch with `[gpu] source = "simulated"` (8 GPUs) polled every 1 s, beside
  an idle mtail.
Goals: at 300 and 3,000 lines/s loadwatch's CPU <= mtail's; idle <= 0.3% of a core; event-log
p99 <= 250 ms; /metrics p99 <= 1.5 s. The 2 cores may be shared: run with --repeat and read the
spread. The last line is key=value pairs (medians over repeats).
"""

from __future__ import annotations

import argparse
import array
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from proctree import TreeCpu

from loadwatch.daemon.sim.kimilog import logged_requests

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MTAIL_PROGRAM = HERE / "vllm_load.mtail"
STARTUP = ROOT / "tests" / "fixtures" / "real-v0.32-llama.log"
STARTUP_PID, STARTUP_PORT = "21820", "8321"  # the fixture's API server pid and port
READ_BYTES = re.compile(rb"^loadwatch_log_read_bytes_total (\S+)$", re.M)
WARN_EVERY_S = 0.5  # on average: the gaps are random (exponential), as requests come
STATS_EVERY_S = 10.0  # vLLM's default VLLM_LOG_STATS_INTERVAL


# -- the writer (a process of its own: its pacing never waits for the bench's threads) ---------


def serving_lines(rng: random.Random, pid: int, clock: Any = time.time) -> Iterator[bytes]:
    """Lines of a serving vLLM 0.32, stamped now. Shapes: tests/fixtures/real-v0.32-deepseek-
    kvscales.log (request_logger.py, async_llm.py, the uvicorn access line and the model.py
    WARNING), tests/fixtures/tp1-enginecore.log (loggers.py's statistics line)."""
    api = f"(APIServer pid={pid}) "
    while True:
        stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(clock()))
        rid = f"cmpl-{rng.getrandbits(64):016x}-0"
        yield (
            f"{api}INFO {stamp} [request_logger.py:65] Received request {rid}: params: "
            "SamplingParams(n=1, presence_penalty=0.0, frequency_penalty=0.0, "
            f"repetition_penalty=1.0, temperature={rng.choice(('0.0', '0.7', '1.0'))}, "
            "watermarking=None, top_p=1.0, top_k=0, min_p=0.0, seed=None, stop=[], "
            "stop_token_ids=[], bad_words=[], thinking_token_budget=None, "
            "include_stop_str_in_output=False, ignore_eos=False, "
            f"max_tokens={rng.randint(4, 2048)}, min_tokens=0, logprobs=None, "
            "prompt_logprobs=None, skip_special_tokens=True, spaces_between_special_tokens=True, "
            "structured_outputs=None, extra_args=None), lora_request: None.\n"
        ).encode()
        yield f"{api}INFO {stamp} [async_llm.py:578] Added request {rid}-{rng.getrandbits(32):08x}.\n".encode()
        port = rng.randint(30000, 60000)
        yield f'INFO:     127.0.0.1:{port} - "POST /v1/completions HTTP/1.1" 200 OK\n'.encode()


class NowClock:
    """kimilog's clock for a live writer: lines stamped now; the writer paces them itself."""

    def advance(self, seconds: float) -> None:
        pass

    def shown(self, seconds: float) -> float:
        return seconds

    def stamp(self) -> str:
        return time.strftime("%m-%d %H:%M:%S")


def echoing_lines(rng: random.Random, pid: int) -> Iterator[bytes]:
    """Lines of vLLM 0.32 with `--enable-log-requests --enable-log-outputs` at DEBUG, stamped
    now: each request's parameters, its prompt and its output echoed (client text, some of it
    reading like vLLM's own lines), `Added request`, the access line (daemon/sim/kimilog.py
    `logged_requests`, the `requests` shape of bench/loggen.py)."""
    for line in logged_requests(rng, NowClock(), sys.maxsize, api=f"(APIServer pid={pid}) "):
        yield line.encode()


SHAPES = {"serving": serving_lines, "requests": echoing_lines}


def stats_line(rng: random.Random, pid: int) -> bytes:
    stamp = time.strftime("%m-%d %H:%M:%S")
    return (
        f"(APIServer pid={pid}) INFO {stamp} [loggers.py:123] Engine 000: Avg prompt throughput: "
        f"{rng.uniform(0, 5000):.1f} tokens/s, Avg generation throughput: "
        f"{rng.uniform(0, 900):.1f} tokens/s, Running: {rng.randint(0, 64)} reqs, Waiting: "
        f"{rng.randint(0, 8)} reqs, GPU KV cache usage: {rng.uniform(0, 100):.1f}%, Prefix cache "
        f"hit rate: {rng.uniform(0, 100):.1f}%\n"
    ).encode()


def warning_line(pid: int) -> bytes:
    stamp = time.strftime("%m-%d %H:%M:%S")
    return (
        f"(APIServer pid={pid}) WARNING {stamp} [model.py:1893] Default vLLM sampling parameters "
        "have been overridden by the model's `generation_config.json`: `{'temperature': 0.6, "
        "'top_p': 0.95}`. If this is not intended, please relaunch vLLM instance with "
        "`--generation-config vllm`.\n"
    ).encode()


def write_child(
    paths: list[str],
    rate: float,
    seconds: float,
    pid: int,
    seed: int,
    out: str,
    batch_s: float = 0.0,
    shape: str = "serving",
) -> None:
    """Append to every path at `rate` lines/s for `seconds`, one write per line as vLLM's
    logging does, or (`batch_s`) the lines due every `batch_s` seconds in one write, as a writer
    that buffers does; save (time, start, end, warning) of each line to `out` (the monotonic
    clock, which the bench's threads share; a batched line's time is its batch's write)."""
    rng = random.Random(seed)
    fds = [os.open(p, os.O_WRONLY | os.O_APPEND) for p in paths]
    offset = os.fstat(fds[0]).st_size
    times, starts, ends, warns = (
        array.array("d"),
        array.array("q"),
        array.array("q"),
        array.array("b"),
    )
    lines = SHAPES[shape](rng, pid)
    begin = time.monotonic()
    next_warn, next_stats = begin + rng.expovariate(1 / WARN_EVERY_S), begin
    i = 0
    batch: list[bytes] = []
    while True:
        now = time.monotonic()
        if now - begin >= seconds:
            break
        due = int((now - begin) * rate) + 1
        while i < due:
            warn = now >= next_warn
            if warn:
                line = warning_line(pid)
                next_warn += rng.expovariate(1 / WARN_EVERY_S)
            elif now >= next_stats:
                line, next_stats = stats_line(rng, pid), next_stats + STATS_EVERY_S
            else:
                line = next(lines)
            if batch_s:
                batch.append(line)  # (its time: when its batch is written)
            else:
                t = time.monotonic()
                for fd in fds:
                    os.write(fd, line)
                times.append(t)
            starts.append(offset)
            offset += len(line)
            ends.append(offset)
            warns.append(1 if warn else 0)
            i += 1
        if batch:
            t = time.monotonic()
            for fd in fds:
                os.write(fd, b"".join(batch))
            times.extend([t] * len(batch))
            batch.clear()
        if batch_s:
            time.sleep(batch_s)
        else:
            time.sleep(max(0.0005, min(0.01, begin + i / rate - time.monotonic())))
    for fd in fds:
        os.close(fd)
    with open(out, "wb") as f:
        for a in (times, starts, ends, warns):
            f.write(len(a).to_bytes(8, "little"))
            a.tofile(f)


@dataclass
class Appended:
    times: list[float]
    starts: list[int]
    ends: list[int]
    warns: list[int]

    @classmethod
    def load(cls, path: Path) -> Appended:
        parts: list[list[Any]] = []
        with path.open("rb") as f:
            for code in ("d", "q", "q", "b"):
                n = int.from_bytes(f.read(8), "little")
                a = array.array(code)
                a.fromfile(f, n)
                parts.append(a.tolist())
        return cls(*parts)


def write(
    paths: list[Path],
    rate: float,
    seconds: float,
    pid: int,
    seed: int,
    tmp: Path,
    batch_s: float = 0.0,
    shape: str = "serving",
) -> Appended:
    out = tmp / f"appended-{seed}.bin"
    argv = [sys.executable, __file__, "--write-child", json.dumps(
        {"paths": [str(p) for p in paths], "rate": rate, "seconds": seconds, "pid": pid,
         "seed": seed, "out": str(out), "batch_s": batch_s, "shape": shape})]  # fmt: skip
    subprocess.run(argv, check=True)
    return Appended.load(out)


# -- the tools ----------------------------------------------------------------------------------


class Health(BaseHTTPRequestHandler):
    """The API server the start-up names: /health says 200, as vLLM's does."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def startup_bytes(pid: int, port: int) -> bytes:
    """The fixture's start-up up to `Application startup complete`, the API server being this
    bench (its pid runs here, not as vLLM: loadwatch says so once and goes on) on `port`."""
    lines = STARTUP.read_bytes().splitlines(keepends=True)
    end = next(i for i, ln in enumerate(lines) if b"Application startup complete" in ln)
    text = b"".join(lines[: end + 1])
    return text.replace(STARTUP_PID.encode(), str(pid).encode()).replace(
        STARTUP_PORT.encode(), str(port).encode()
    )


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    meter: TreeCpu  # made as the process started, before it started anything
    url: str = ""

    def cpu(self) -> float:
        return self.meter.seconds()

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(15)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        self.meter.close()


def start_loadwatch(tmp: Path, log: Path, gpus: int, events: Path, extra: str = "") -> Proc:
    exe = shutil.which("loadwatch", path=str(Path(sys.executable).parent)) or "loadwatch"
    gpu = 'source = "none"\n'
    if gpus:
        gpu = f'source = "simulated"\nsimulated_count = {gpus}\npoll_interval_s = 1.0\n'
    config = tmp / "loadwatch.toml"
    config.write_text(
        f'state_dir = "{tmp / "state"}"\nevents_file = "{events}"\n'
        f'[log]\npath = "{log}"\n[http]\nlisten = "127.0.0.1:0"\n'
        f"[gpu]\n{gpu}"
        '[events]\nstdout = "none"\n'
    )
    if extra:  # TOML lines that go in the tables above ("[log] coalesce_ms = 50")
        text = config.read_text()
        for item in extra.split(";"):
            table, _, line = item.strip().partition(" ")
            text = text.replace(f"{table}\n", f"{table}\n{line}\n", 1)
        config.write_text(text)
    popen = subprocess.Popen(
        [exe, "run", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    proc = Proc("loadwatch", popen, TreeCpu(popen.pid))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if events.exists():
            for raw in events.read_text().splitlines():
                if '"daemon.listening"' in raw:
                    proc.url = json.loads(raw)["url"]
                    return proc
        if popen.poll() is not None:
            raise SystemExit(f"loadwatch exited {popen.returncode} at start")
        time.sleep(0.05)
    proc.stop()
    raise SystemExit("loadwatch did not start in 60 s")


def start_mtail(tmp: Path, log: Path) -> Proc:
    progs = tmp / "progs"
    progs.mkdir()
    shutil.copy(MTAIL_PROGRAM, progs)
    port = free_port()
    argv = ["mtail", "--progs", str(progs), "--logs", str(log), "--address", "127.0.0.1"]
    argv += ["--port", str(port), "--logtostderr"]
    popen = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc = Proc("mtail", popen, TreeCpu(popen.pid), f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(proc.url + "/metrics", timeout=2):
                return proc
        except OSError:
            time.sleep(0.05)
    proc.stop()
    raise SystemExit("mtail did not start in 30 s")


def scrape(url: str) -> bytes:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        return bytes(r.read())


def read_bytes(url: str) -> int:
    m = READ_BYTES.search(scrape(url))
    return int(float(m.group(1))) if m else -1


def wait_read(url: str, size: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while read_bytes(url) < size:
        if time.monotonic() > deadline:
            raise SystemExit(f"loadwatch did not read the {size}-byte backlog in {timeout_s} s")
        time.sleep(0.1)


# -- watching loadwatch's outputs ---------------------------------------------------------------


class EventTail(threading.Thread):
    """The event log's lines with an offset, each with when it was first seen."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.seen: dict[int, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        pos, rest = 0, b""
        while not self.stop.wait(0.002):
            try:
                with self.path.open("rb") as f:
                    f.seek(pos)
                    data = f.read()
            except OSError:
                continue
            if not data:
                continue
            now = time.monotonic()
            pos += len(data)
            lines = (rest + data).split(b"\n")
            rest = lines.pop()
            for raw in lines:
                if b'"log.' not in raw:
                    continue
                doc = json.loads(raw)
                if isinstance(doc.get("offset"), int):
                    self.seen.setdefault(doc["offset"], now)


class Prometheus(threading.Thread):
    """Scrapes every URL's /metrics every `every_s` seconds (the first after 1 s)."""

    def __init__(self, urls: list[str], every_s: float) -> None:
        super().__init__(daemon=True)
        self.urls, self.every_s = urls, every_s
        self.stop = threading.Event()
        self.scrapes = 0

    def run(self) -> None:
        wait = 1.0
        while self.every_s > 0 and not self.stop.wait(wait):
            for url in self.urls:
                scrape(url)
            self.scrapes += 1
            wait = self.every_s


class Scraper(threading.Thread):
    """(time of the answer, loadwatch_log_read_bytes_total) 20 times a second."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.05):
            value = read_bytes(self.url)
            self.samples.append((time.monotonic(), value))


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def metrics_latencies(app: Appended, samples: list[tuple[float, int]]) -> list[float]:
    out: list[float] = []
    j = 0
    for t, end in zip(app.times, app.ends, strict=True):
        while j < len(samples) and (samples[j][0] < t or samples[j][1] < end):
            j += 1
        if j == len(samples):
            break
        out.append(samples[j][0] - t)
    return out


# -- one trial ----------------------------------------------------------------------------------


@dataclass
class Trial:
    rate: float  # 0: idle
    lw_pct: float = 0.0
    mt_pct: float = 0.0
    ev_ms: list[float] = field(default_factory=list)
    metrics_ms: list[float] = field(default_factory=list)
    lines: int = 0
    bytes_per_line: float = 0.0
    warnings_written: int = 0
    warnings_logged: int = 0
    cpu_method: str = ""  # how CPU was read (proctree.TreeCpu)


def trial(
    rate: float,
    seconds: float,
    latency_s: float,
    seed: int,
    extra: str = "",
    scrape_s: float = 15,
    batch_s: float = 0.0,
    shape: str = "serving",
) -> Trial:
    out = Trial(rate)
    health = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=health.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory(prefix="lw-livecost-") as name:
        tmp = Path(name)
        lw_log, mt_log, events = tmp / "lw.log", tmp / "mt.log", tmp / "events.jsonl"
        backlog = startup_bytes(os.getpid(), health.server_address[1])
        for p in (lw_log, mt_log):
            p.write_bytes(backlog)
        lw = start_loadwatch(tmp, lw_log, 8 if rate == 0 else 0, events, extra)
        mt = None
        try:
            mt = start_mtail(tmp, mt_log)
            wait_read(lw.url, len(backlog))
            tail = EventTail(events)
            tail.start()
            time.sleep(2.0)  # both settle (loadwatch's first /health probe, mtail's first poll)
            c0, m0, t0 = lw.cpu(), mt.cpu(), time.monotonic()
            prometheus = Prometheus([lw.url, mt.url], scrape_s)
            prometheus.start()
            if rate == 0:
                time.sleep(seconds)
                app = None
            else:
                logs, pid = [lw_log, mt_log], os.getpid()
                app = write(logs, rate, seconds, pid, seed, tmp, batch_s, shape)
                time.sleep(0.3)  # what came last is read
            wall = time.monotonic() - t0
            prometheus.stop.set()
            prometheus.join()
            out.lw_pct = 100 * (lw.cpu() - c0) / wall
            out.mt_pct = 100 * (mt.cpu() - m0) / wall
            out.cpu_method = ", ".join(sorted({lw.meter.method, mt.meter.method}))
            if app is not None:
                scraper = Scraper(lw.url)
                scraper.start()
                late = write(logs, rate, latency_s, pid, seed + 1, tmp, batch_s, shape)
                time.sleep(2.0)
                scraper.stop.set()
                scraper.join()
                tail.stop.set()
                tail.join()
                out.metrics_ms = [1e3 * x for x in metrics_latencies(late, scraper.samples)]
                out.lines = len(app.times)
                out.bytes_per_line = (app.ends[-1] - app.starts[0]) / max(1, len(app.times))
                for a in (app, late):
                    for t, start, warn in zip(a.times, a.starts, a.warns, strict=True):
                        if warn:
                            out.warnings_written += 1
                            if start in tail.seen:
                                out.warnings_logged += 1
                                out.ev_ms.append(1e3 * (tail.seen[start] - t))
            else:
                tail.stop.set()
        finally:
            lw.stop()
            if mt is not None:
                mt.stop()
            health.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="a few seconds per rate")
    ap.add_argument("--repeat", type=int, default=1, help="trials per rate (median, spread)")
    ap.add_argument("--rates", default="10,300,3000", help="lines/s, comma-separated")
    ap.add_argument("--seconds", type=float, default=None, help="cost window per trial")
    ap.add_argument("--no-idle", action="store_true", help="skip the idle case")
    ap.add_argument(
        "--scrape-every", type=float, default=15.0, help="seconds between scrapes (0: none)"
    )
    ap.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default="serving",
        help="serving: request, access and statistics lines; requests: prompts and outputs "
        "echoed (--enable-log-requests --enable-log-outputs at DEBUG)",
    )
    ap.add_argument(
        "--batch-ms",
        type=float,
        default=0.0,
        help="write the lines due every N ms in one write (a buffering writer); 0: one write "
        "per line, as vLLM's logging does",
    )
    ap.add_argument(
        "--set",
        default="",
        help='loadwatch config lines, ";"-separated: "[log] coalesce_ms = 50; [http] ..."',
    )
    ap.add_argument("--write-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.write_child:
        spec = json.loads(args.write_child)
        write_child(**spec)
        return
    if shutil.which("mtail") is None:
        raise SystemExit("mtail is missing: apt-get install -y mtail (scripts/ensure-tools.sh)")
    seconds = args.seconds or (5.0 if args.quick else 20.0)
    latency_s = 4.0 if args.quick else 10.0
    idle_s = 10.0 if args.quick else 30.0
    cases = [float(r) for r in args.rates.split(",") if r]
    if not args.no_idle:
        cases.append(0.0)
    results: dict[float, list[Trial]] = {c: [] for c in cases}
    for rep in range(args.repeat):
        for c in cases:
            t = trial(
                c,
                idle_s if c == 0 else seconds,
                latency_s,
                1000 * rep + int(c),
                args.set,
                args.scrape_every,
                args.batch_ms / 1e3,
                args.shape,
            )
            results[c].append(t)
            ratio = f" ({t.lw_pct / t.mt_pct:.2f}x)" if t.mt_pct > 0 else ""
            print(f"  trial {rep + 1}/{args.repeat} {label(c)}: loadwatch {t.lw_pct:.3f}% "
                  f"mtail {t.mt_pct:.3f}%{ratio}", file=sys.stderr, flush=True)  # fmt: skip
    report(results, args)


def label(rate: float) -> str:
    return "idle (8 GPUs, 1 Hz)" if rate == 0 else f"{rate:,.0f} lines/s"


def spread(values: list[float]) -> str:
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.2f}"
    return f"{med:.2f} ({min(values):.2f}-{max(values):.2f})"


def methods(results: dict[float, list[Trial]]) -> str:
    return ", ".join(sorted({t.cpu_method for trials in results.values() for t in trials}))


def report(results: dict[float, list[Trial]], args: argparse.Namespace) -> None:
    print(f"\nlive cost, {os.cpu_count()} cores, repeats {args.repeat} (median (min-max)); "
          "CPU of each tool and all it started over the window, % of one core, read from "
          f"{methods(results)}; both scraped every {args.scrape_every:g} s; "
          + f"{args.shape} lines, "
          + (f"written in batches every {args.batch_ms:g} ms" if args.batch_ms
             else "one write per line"))  # fmt: skip
    head = f"{'case':<22}{'loadwatch %':>20}{'mtail %':>20}{'event log p50/p99 ms':>24}"
    print(head + f"{'/metrics p50/p99 ms':>24}{'B/line':>8}{'warn logged':>12}")
    kv: dict[str, str] = {}
    for rate, trials in results.items():
        lw = [t.lw_pct for t in trials]
        mt = [t.mt_pct for t in trials]
        ev = [x for t in trials for x in t.ev_ms]
        me = [x for t in trials for x in t.metrics_ms]
        row = f"{label(rate):<22}{spread(lw):>20}{spread(mt):>20}"
        if rate:
            row += f"{pct(ev, 50):>11.0f} / {pct(ev, 99):<10.0f}{pct(me, 50):>11.0f} / "
            row += f"{pct(me, 99):<10.0f}"
            row += f"{statistics.median(t.bytes_per_line for t in trials):>8.0f}"
            logged = sum(t.warnings_logged for t in trials)
            written = sum(t.warnings_written for t in trials)
            row += f"{logged:>6}/{written:<5}"
        print(row)
        key = "idle" if rate == 0 else f"r{rate:.0f}"
        kv[f"{key}_lw_pct"] = f"{statistics.median(lw):.3f}"
        kv[f"{key}_mtail_pct"] = f"{statistics.median(mt):.3f}"
        if rate:
            kv[f"{key}_event_p99_ms"] = f"{pct(ev, 99):.0f}"
            kv[f"{key}_metrics_p99_ms"] = f"{pct(me, 99):.0f}"
    print(" ".join(f"{k}={v}" for k, v in kv.items()))


if __name__ == "__main__":
    main()
