"""Where this node stands in a multi-node vLLM deployment: its role, the ranks it hosts, the head.

Facts come from two places. The supervised argv (`--headless`, `--nnodes`, `--node-rank`,
`--master-addr`, `--data-parallel-*`, `-tp`/`-pp`) says what was asked; the log says what vLLM
did: every worker prints `world_size=W rank=R local_rank=L distributed_init_method=M backend=B`
as it joins torch.distributed, and a node without the API server prints `Launching vLLM (vX)
headless multiproc executor, with head node address A ...` (TP/PP across nodes) or `Launching N
data parallel engine(s) in headless mode, with head node address tcp://A.` (DP). Under Ray, the
head's log carries the remote workers' lines behind a `(RayWorkerProc pid=N, ip=A)` prefix.
The log wins over the argv where both speak.

`NodeFacts` is kept on the state (`StateData.node`), outside the sessions: a restart of vLLM
does not move the node in the deployment. The load's progress as this node sees it
(nodeprogress.py) is the other half of the node's record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

NodeRole = Literal["head", "headless_tp_pp", "headless_dp", "ray_head"]
MAX_RANKS = 1024  # ranks remembered per node; a node holds 8 or 16 GPUs


@dataclass(frozen=True, slots=True)
class ArgvLayout:
    """What the vLLM command line says about the deployment; None where it says nothing."""

    headless: bool = False
    nnodes: int | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    tensor_parallel: int | None = None
    pipeline_parallel: int | None = None
    data_parallel: int | None = None
    data_parallel_local: int | None = None
    data_parallel_start_rank: int | None = None
    data_parallel_address: str | None = None
    data_parallel_rpc_port: int | None = None
    expert_parallel: bool = False
    executor_backend: str | None = None  # --distributed-executor-backend (mp, ray, ...)


_INT_FLAGS = {
    "--nnodes": "nnodes",
    "--node-rank": "node_rank",
    "--master-port": "master_port",
    "--tensor-parallel-size": "tensor_parallel",
    "-tp": "tensor_parallel",
    "--pipeline-parallel-size": "pipeline_parallel",
    "-pp": "pipeline_parallel",
    "--data-parallel-size": "data_parallel",
    "-dp": "data_parallel",
    "--data-parallel-size-local": "data_parallel_local",
    "-dpl": "data_parallel_local",
    "--data-parallel-start-rank": "data_parallel_start_rank",
    "-dpr": "data_parallel_start_rank",
    "--data-parallel-rpc-port": "data_parallel_rpc_port",
    "-dpp": "data_parallel_rpc_port",
}
_STR_FLAGS = {
    "--master-addr": "master_addr",
    "--data-parallel-address": "data_parallel_address",
    "-dpa": "data_parallel_address",
    "--distributed-executor-backend": "executor_backend",
}


def argv_layout(argv: Sequence[str]) -> ArgvLayout:
    """The deployment flags of a vLLM command line (`--flag value` and `--flag=value`; snake
    case too, as vLLM's parser accepts). A flag given twice: the last one wins, as in argparse."""
    values: dict[str, object] = {}
    args = list(argv)
    i = 0
    while i < len(args):
        word = args[i]
        flag, eq, inline = word.partition("=")
        flag = flag.replace("_", "-") if flag.startswith("--") else flag
        i += 1
        if flag == "--headless":
            values["headless"] = True
            continue
        if flag in ("--enable-expert-parallel", "-ep"):
            values["expert_parallel"] = True
            continue
        name = _INT_FLAGS.get(flag) or _STR_FLAGS.get(flag)
        if name is None:
            continue
        if eq:
            text = inline
        elif i < len(args):
            text = args[i]
            i += 1
        else:
            break
        if flag in _INT_FLAGS:
            if text.isdigit():
                values[name] = int(text)
        elif text:
            values[name] = text
    return ArgvLayout(**values)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class NodeFacts:
    argv: ArgvLayout | None = None
    launch_mode: str | None = None  # "headless_tp_pp" / "headless_dp", from the log
    launch_address: str | None = None  # the head's address, as the launch line prints it
    engines: int | None = None  # headless DP: engines on this node
    world_size: int | None = None
    ranks: frozenset[int] = frozenset()  # global ranks whose workers logged here
    local_ranks: frozenset[int] = frozenset()
    backend: str | None = None  # torch.distributed backend: nccl, gloo, ...
    init_method: str | None = None
    ray: bool = False  # a `(RayWorker... pid=N)` prefix was seen

    def with_argv(self, argv: Sequence[str]) -> NodeFacts:
        return replace(self, argv=argv_layout(argv)) if argv else self

    def with_launch(self, mode: str, address: str | None, engines: int | None) -> NodeFacts:
        return replace(self, launch_mode=mode, launch_address=address, engines=engines)

    def with_rank(
        self,
        world_size: int,
        rank: int,
        local_rank: int,
        backend: str | None,
        init_method: str | None,
    ) -> NodeFacts:
        ranks: frozenset[int]
        local: frozenset[int]
        if world_size != self.world_size:  # a new layout (a restart with other flags)
            ranks, local = frozenset(), frozenset()
        else:
            ranks, local = self.ranks, self.local_ranks
        if len(ranks) < MAX_RANKS:
            ranks, local = ranks | {rank}, local | {local_rank}
        return replace(
            self,
            world_size=world_size,
            ranks=ranks,
            local_ranks=local,
            backend=backend,
            init_method=init_method,
        )

    def with_process(self, name: str | None) -> NodeFacts:
        if name is not None and not self.ray and name.startswith("RayWorker"):
            return replace(self, ray=True)
        return self


@dataclass(frozen=True, slots=True)
class NodeRoleView:
    """The node's place in the deployment, for /status and `loadwatch_node_info`."""

    role: NodeRole
    node_rank: int | None
    nnodes: int | None
    head_address: str | None
    world_size: int | None
    ranks: str | None  # "8-15", "0,2"; None before any worker logged its rank
    local_workers: int  # workers that logged their rank here
    backend: str | None
    share: float  # the part of the checkpoint this node reads (1.0: all of it)
    source: str  # "log", "argv", "log+argv" or "default": where the role came from


def rank_ranges(ranks: frozenset[int]) -> str | None:
    """`{8, 9, 10, 12}` -> `"8-10,12"`."""
    if not ranks:
        return None
    out: list[str] = []
    ordered = sorted(ranks)
    start = prev = ordered[0]
    for r in (*ordered[1:], None):
        if r is not None and r == prev + 1:
            prev = r
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ",".join(out)


def _tcp_address(method: str | None) -> str | None:
    if method is not None and method.startswith("tcp://"):
        return method.removeprefix("tcp://") or None
    return None


def role_of(facts: NodeFacts) -> tuple[NodeRole, str]:
    a = facts.argv
    if facts.launch_mode in ("headless_tp_pp", "headless_dp"):
        via = "log+argv" if a is not None and a.headless else "log"
        return facts.launch_mode, via  # type: ignore[return-value]
    if a is not None and a.headless:
        multi_dp = (a.data_parallel or 1) > 1 or a.data_parallel_local is not None
        tp_pp_follower = (a.nnodes or 1) > 1 and (a.node_rank or 0) > 0
        return ("headless_tp_pp" if tp_pp_follower and not multi_dp else "headless_dp"), "argv"
    if facts.ray or (a is not None and a.executor_backend == "ray"):
        return "ray_head", "log" if facts.ray else "argv"
    return "head", "argv" if a is not None else ("log" if facts.world_size else "default")


def read_share(facts: NodeFacts, role: NodeRole) -> float:
    """The part of the checkpoint this node's workers read. A data-parallel replica reads all
    of it; a TP/PP group spread over nodes splits it by the ranks each node hosts (a PP stage
    reads its layers, a TP rank its slice of each tensor). Expert-parallel filtering (vLLM's
    `--enable-ep-weight-filter`) is not counted: the share is then an upper bound."""
    a = facts.argv
    if role == "headless_dp":
        return 1.0
    group = None
    if a is not None and (a.tensor_parallel or a.pipeline_parallel):
        group = (a.tensor_parallel or 1) * (a.pipeline_parallel or 1)
    if a is not None and group and (a.nnodes or 1) > 1 and (a.data_parallel or 1) == 1:
        return max(min(1.0, 1.0 / a.nnodes), 1.0 / group) if a.nnodes else 1.0
    if facts.world_size and facts.ranks and (a is None or (a.data_parallel or 1) == 1):
        return min(1.0, len(facts.ranks) / facts.world_size)
    return 1.0


def role_view(facts: NodeFacts) -> NodeRoleView:
    role, source = role_of(facts)
    a = facts.argv or ArgvLayout()
    head = facts.launch_address
    if head is None and a.master_addr:
        head = f"{a.master_addr}:{a.master_port}" if a.master_port else a.master_addr
    if head is None and a.data_parallel_address:
        port = a.data_parallel_rpc_port
        head = f"{a.data_parallel_address}:{port}" if port else a.data_parallel_address
    if head is None:
        head = _tcp_address(facts.init_method)
    if head is not None:
        head = head.removeprefix("tcp://")
    node_rank = a.node_rank
    if node_rank is None and role in ("head", "ray_head"):
        node_rank = 0
    return NodeRoleView(
        role=role,
        node_rank=node_rank,
        nnodes=a.nnodes,
        head_address=head,
        world_size=facts.world_size,
        ranks=rank_ranges(facts.ranks),
        local_workers=len(facts.ranks),
        backend=facts.backend,
        share=read_share(facts, role),
        source=source,
    )


__all__ = [
    "ArgvLayout",
    "NodeFacts",
    "NodeRole",
    "NodeRoleView",
    "argv_layout",
    "rank_ranges",
    "read_share",
    "role_of",
    "role_view",
]
