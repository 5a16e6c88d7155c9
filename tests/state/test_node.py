"""The node's role, ranks and head address (daemon/state/node.py), folded from real log lines
and the supervised argv, and its progress without a bar (nodeprogress.py)."""

from __future__ import annotations

from pathlib import Path

from loadwatch.daemon.sources.inputs import (
    GpuReading,
    GpuSample,
    IoSample,
    ModelInfo,
    ProcessEvent,
    Tick,
)
from loadwatch.daemon.state.loadstate import LoadState
from loadwatch.daemon.state.node import argv_layout, rank_ranges
from loadwatch.parsers import EventStream, split_records
from loadwatch.parsers.events import NodeLaunch
from loadwatch.parsers.vllm.catalog import CATALOG

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GIB = 1 << 30


def fold(data: bytes, state: LoadState | None = None, now: float = 100.0) -> LoadState:
    st = state or LoadState()
    for ev in EventStream(ref_ts=0).feed_all(split_records(data)):
        st = st.apply(ev, now)
    return st


def test_a_headless_tp_pp_node_from_its_real_log() -> None:
    st = fold((FIXTURES / "real-v0.32-headless-pp-node1.log").read_bytes())
    role = st.snapshot(101).node.role  # type: ignore[union-attr]
    assert (role.role, role.head_address, role.source) == (
        "headless_tp_pp",
        "127.0.0.1:29611",
        "log",
    )
    assert st.session is not None  # its log opens a session though it prints no version line


def test_a_headless_dp_node_from_its_launch_line() -> None:
    # vLLM's line as quoted (its stamp elided) in a 2026 multi-node debugging note: serve.py's
    # `Launching %d data parallel engine(s) in headless mode, with head node address %s.`
    body = (
        "Launching 1 data parallel engine(s) in headless mode, with head node address "
        "tcp://10.10.71.96:29550."
    )
    (entry,) = [e for e in CATALOG if e.id == "node.headless_dp"]
    m = entry.pattern.search(body)
    assert m is not None and (m["n"], m["addr"]) == ("1", "tcp://10.10.71.96:29550")
    ev = NodeLaunch(mode="headless_dp", head_address=m["addr"], engines=1)
    role = LoadState().apply(ev, 1.0).snapshot(2.0).node.role  # type: ignore[union-attr]
    assert (role.role, role.head_address, role.share) == ("headless_dp", "10.10.71.96:29550", 1.0)


def test_a_single_node_head_from_a_real_log() -> None:
    st = fold((FIXTURES / "real-v0.32-llama.log").read_bytes())
    role = st.snapshot(101).node.role  # type: ignore[union-attr]
    assert (role.role, role.node_rank, role.world_size, role.ranks, role.backend) == (
        "head",
        0,
        1,
        "0",
        "gloo",
    )


def test_the_ranks_a_node_hosts() -> None:
    # the worker line of vLLM's troubleshooting guide, one per rank of the second node
    lines = b"".join(
        b"DEBUG 06-10 21:32:17 parallel_state.py:88] world_size=16 rank=%d local_rank=%d "
        b"distributed_init_method=tcp://10.0.0.1:54641 backend=nccl\n" % (8 + i, i)
        for i in range(8)
    )
    role = fold(lines).snapshot(101).node.role  # type: ignore[union-attr]
    assert (role.ranks, role.world_size, role.local_workers) == ("8-15", 16, 8)
    assert role.head_address == "10.0.0.1:54641"  # the tcp rendezvous, when nothing else says
    assert role.share == 0.5


def test_argv_flags() -> None:
    a = argv_layout(
        ["vllm", "serve", "/m", "--headless", "--nnodes=2", "--node-rank", "1", "-tp", "8",
         "--pipeline_parallel_size", "2", "--master-addr", "10.0.0.1", "--master-port", "29501"]
    )  # fmt: skip
    assert (a.headless, a.nnodes, a.node_rank, a.tensor_parallel, a.pipeline_parallel) == (
        True, 2, 1, 8, 2,
    )  # fmt: skip
    st = LoadState().apply(ProcessEvent(kind="started", ts=1.0, pid=5, argv=("vllm", "serve", "/m", "--headless", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1")), 1.0)  # fmt: skip
    role = st.snapshot(2).node.role  # type: ignore[union-attr]
    assert (role.role, role.node_rank, role.nnodes, role.head_address, role.source) == (
        "headless_tp_pp", 1, 2, "10.0.0.1", "argv",
    )  # fmt: skip
    dp = argv_layout(["--headless", "--data-parallel-size", "4", "--data-parallel-size-local", "2",
                      "--data-parallel-start-rank", "2", "--data-parallel-address", "10.99.48.128"])  # fmt: skip
    st = LoadState().apply(ProcessEvent(kind="started", ts=1.0, pid=5, argv=("--headless", "-dp", "4", "-dpl", "2")), 1.0)  # fmt: skip
    assert dp.data_parallel_start_rank == 2
    assert st.snapshot(2).node.role.role == "headless_dp"  # type: ignore[union-attr]
    ray = LoadState().apply(ProcessEvent(kind="started", ts=1.0, pid=5, argv=("--distributed-executor-backend", "ray")), 1.0)  # fmt: skip
    assert ray.snapshot(2).node.role.role == "ray_head"  # type: ignore[union-attr]


def test_rank_ranges() -> None:
    assert rank_ranges(frozenset({8, 9, 10, 12})) == "8-10,12"
    assert rank_ranges(frozenset()) is None


def _gpus(t: float, used: int, n: int = 2) -> GpuReading:
    samples = tuple(
        GpuSample(index=i, health="ok", memory_used_bytes=used, memory_total_bytes=96 * GIB)
        for i in range(n)
    )
    return GpuReading(ts=t, samples=samples)


def headless_load() -> LoadState:
    st = fold((FIXTURES / "real-v0.32-headless-pp-node1.log").read_bytes(), now=0.0)
    st = st.apply(ModelInfo(path="/m", total_bytes=100 * GIB), 0.0)
    return st.apply(_gpus(0.0, 1 * GIB), 0.0).apply(IoSample(ts=0.0, read_bytes=5 * GIB), 0.0)


def test_progress_eta_and_stall_without_a_bar() -> None:
    st = headless_load()
    # 100 GiB checkpoint, this node reads all of it (nothing says otherwise): 1 GiB/s
    for t in range(1, 41):
        st = st.apply(IoSample(ts=float(t), read_bytes=(5 + t) * GIB), float(t))
        st = st.apply(_gpus(float(t), (1 + t // 2) * GIB), float(t))
    p = st.snapshot(40.0).node.progress  # type: ignore[union-attr]
    assert p.loading and p.bar_ratio is None
    assert p.io_ratio is not None and abs(p.io_ratio - 0.40) < 0.01
    assert p.ratio == p.io_ratio  # the further of the two signals (GPU: 20/50 GiB per GPU)
    assert p.eta_s is not None and 55 < p.eta_s < 65  # 60 GiB left at 1 GiB/s
    assert p.eta_low_s is not None and p.eta_high_s is not None
    assert p.eta_low_s <= p.eta_s <= p.eta_high_s
    assert not p.stalled
    # both signals flat for the stall floor (60 s by default): stalled
    for t in range(41, 110, 5):
        st = st.apply(IoSample(ts=float(t), read_bytes=45 * GIB), float(t)).apply(Tick(), float(t))
        st = st.apply(_gpus(float(t), 21 * GIB), float(t))
    p = st.snapshot(106.0).node.progress  # type: ignore[union-attr]
    assert p.stalled and p.stalled_for_s is not None and p.stalled_for_s >= 60
    # one signal moving is not a stall (a warm cache reads nothing while GPUs fill)
    st = st.apply(_gpus(107.0, 30 * GIB), 107.0)
    assert not st.snapshot(107.0).node.progress.stalled  # type: ignore[union-attr]


def test_the_checkpoint_size_line_stands_in_for_the_model_directory() -> None:
    # the 2026 line (vllm PR #39422), as docs/vllm-log-formats.md quotes it
    line = (
        b"INFO 04-20 10:00:00 [weight_utils.py:100] Filesystem type for checkpoints: AUTOFS. "
        b"Checkpoint size: 432.90 GiB. Available RAM: 748.13 GiB.\n"
    )
    st = fold(line, now=0.0).apply(IoSample(ts=0.0, read_bytes=0), 0.0)
    st = st.apply(IoSample(ts=1.0, read_bytes=int(43.29 * GIB)), 1.0)
    p = st.snapshot(1.0).node.progress  # type: ignore[union-attr]
    assert p.expected_bytes == int(432.90 * GIB)
    assert p.io_ratio is not None and abs(p.io_ratio - 0.1) < 0.001


def test_the_head_checks_its_bar_against_the_signals() -> None:
    st = fold(
        b"Loading safetensors checkpoint shards:   0% Completed | 0/10 [00:00<?, ?it/s]\n",
        now=0.0,
    )
    st = st.apply(ModelInfo(path="/m", total_bytes=100 * GIB), 0.0)
    st = st.apply(IoSample(ts=0.0, read_bytes=0), 0.0)
    st = fold(
        b"Loading safetensors checkpoint shards:  80% Completed | 8/10 [00:08<00:02, 1.00it/s]\n",
        st,
        now=8.0,
    )
    st = st.apply(IoSample(ts=8.0, read_bytes=10 * GIB), 8.0)
    p = st.snapshot(8.0).node.progress  # type: ignore[union-attr]
    assert p.bar_ratio == 0.8 and p.ratio == 0.8 and p.bar_unbacked
    st = st.apply(IoSample(ts=9.0, read_bytes=75 * GIB), 9.0)
    assert not st.snapshot(9.0).node.progress.bar_unbacked  # type: ignore[union-attr]


def test_a_real_two_node_pipeline_parallel_deployment() -> None:
    """Both logs of one real PP=2 deployment over two nodes (vLLM 0.32 on the CPU)."""
    head = fold((FIXTURES / "real-v0.32-pp2-head.log").read_bytes()).snapshot(101).node
    node1 = fold((FIXTURES / "real-v0.32-pp2-node1.log").read_bytes()).snapshot(101).node
    assert head is not None and node1 is not None
    assert (head.role.role, head.role.ranks, head.role.world_size) == ("head", "0", 2)
    assert head.progress.bar_ratio == 1.0  # global rank 0 prints the bar
    assert (node1.role.role, node1.role.ranks, node1.role.head_address) == (
        "headless_tp_pp",
        "1",
        "127.0.0.1:29611",
    )
    assert node1.role.share == head.role.share == 0.5  # each stage reads its half
    assert node1.progress.bar_ratio is None and node1.progress.weights_done
    assert node1.ready  # its own `Loading weights took`, no failure


def test_the_head_node_eta_is_the_bars() -> None:
    st = fold(b"Starting to load model /m...\n", now=0.0)
    st = st.apply(ModelInfo(path="/m", total_bytes=100 * GIB), 0.0)
    st = st.apply(IoSample(ts=0.0, read_bytes=0), 0.0)
    for n in range(0, 5):
        line = (
            b"Loading safetensors checkpoint shards: %3d%% Completed | %d/10 [00:%02d<00:10, 1.00it/s]\n"
            % (
                n * 10,
                n,
                n,
            )
        )
        st = fold(line, st, now=float(n))
        st = st.apply(IoSample(ts=float(n), read_bytes=n * 10 * GIB), float(n))
    snap = st.snapshot(4.0)
    assert snap.session is not None and snap.session.progress.eta is not None
    node = snap.node
    assert node is not None and node.progress.loading
    assert node.progress.eta_s == snap.session.progress.eta.remaining_s
    assert node.progress.eta_low_s == snap.session.progress.eta.low_s


def test_a_saturated_signal_gives_way_to_the_moving_one() -> None:
    st = headless_load()
    for t in range(1, 11):
        st = st.apply(IoSample(ts=float(t), read_bytes=(5 + t) * GIB), float(t))
        st = st.apply(_gpus(float(t), 60 * GIB), float(t))  # far past its share at once
    p = st.snapshot(10.0).node.progress  # type: ignore[union-attr]
    assert p.gpu_ratio == 1.0 and p.io_ratio is not None and abs(p.io_ratio - 0.1) < 0.01
    assert p.ratio == p.io_ratio and p.eta_s is not None


def test_a_ray_head_from_a_real_ray_log() -> None:
    st = fold((FIXTURES / "gh-vllm-16707-nccl-ray.log").read_bytes())
    role = st.snapshot(101).node.role  # type: ignore[union-attr]
    assert (role.role, role.node_rank, role.source) == ("ray_head", 0, "log")
    assert 880 not in st.node_pids  # a Ray actor's pid may be another host's


def test_only_vllm_processes_of_this_host_are_read(tmp_path: Path) -> None:
    """The pids of the log's prefixes whose bytes are read: vLLM's processes under vLLM's user
    (a number that is another process here, or a look-alike of another user, is not)."""
    from loadwatch.daemon.sources.proc.io_counters import vllm_processes
    from loadwatch.daemon.sources.proc.logged_process import ExpectedUser

    own = (Path("/proc/self/stat").read_text().split(") ", 1)[1]).split()
    procs = (
        (10, b"VLLM::Worker_TP0\x00", 1000),
        (11, b"/usr/bin/postgres\x00", 1000),
        (12, b"python3\x00-m\x00vllm.entrypoints.openai.api_server\x00", 1000),
        (14, b"python3\x00-m\x00vllm.entrypoints.openai.api_server\x00", 65534),
    )
    for pid, cmd, uid in procs:
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "cmdline").write_bytes(cmd)
        (d / "stat").write_text(f"{pid} (x) S 1 " + " ".join(own[2:]) + "\n")
        (d / "status").write_text(f"Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    user = ExpectedUser(1000, "[vllm] user")
    assert vllm_processes([10, 11, 12, 13, 14], user, tmp_path) == (10, 12)
