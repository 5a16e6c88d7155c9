"""The grouping rules of failures as root causes (daemon/state/failures.py), on their own."""

from __future__ import annotations

from loadwatch.daemon.state.failures import (
    FailureTally,
    fold_failure,
    is_consequence,
    root_message,
    session_kind,
    shutdown_noise,
)
from loadwatch.parsers.events import Failure
from loadwatch.parsers.vllm.catalog import failure

OOM = "CUDA out of memory. Tried to allocate 2.00 GiB."
Roots = dict[tuple[str, str], FailureTally]


def f(kind: str, message: str, offset: int, process: str | None = "Worker_TP0") -> Failure:
    """A failure as the grammar makes it (it says which are consequences, what wrappers carry)."""
    return failure(kind=kind, message=message, offset=offset, process=process)


def fold_all(*events: Failure, fatal: bool = True) -> Roots:
    failures: Roots = {}
    for i, ev in enumerate(events):
        failures = dict(fold_failure(failures, ev, float(i), fatal, 32, 16).failures)
    return failures


def test_a_wrapper_names_its_inner_message() -> None:
    text = (
        f"Worker failed with error '{OOM}', please check the stack trace above for the root cause"
    )
    assert root_message(f("cuda_oom", text, 1)) == OOM
    assert root_message(f("other", "  spaced \n out ", 2)) == "spaced out"


def test_echoes_before_and_after_the_root_fold_into_it() -> None:
    failures = fold_all(
        f("engine_init_failed", "WorkerProc failed to start.", 10),
        f("cuda_oom", OOM, 20),
        f(
            "cuda_oom",
            f"Worker failed with error '{OOM}', please check the stack trace",
            30,
            "EngineCore",
        ),
        f("engine_init_failed", "Engine core initialization failed.", 40, "APIServer"),
    )
    (root,) = failures.values()
    assert (root.kind, root.count, root.echoes, root.offset) == ("cuda_oom", 4, 3, 20)
    assert root.processes == frozenset({"Worker_TP0", "EngineCore", "APIServer"})
    assert sorted(e.offset for e in root.evidence) == [10, 20, 30, 40]
    assert session_kind(failures) == "cuda_oom"


def test_two_different_root_causes_stay_two() -> None:
    failures = fold_all(f("cuda_oom", OOM, 1), f("nccl", "NCCL error: unhandled system error", 2))
    assert sorted(t.kind for t in failures.values()) == ["cuda_oom", "nccl"]
    assert session_kind(failures) == "cuda_oom"  # the most telling


def test_consequences_alone_are_one_provisional_root() -> None:
    failures = fold_all(
        f("worker_died", "Worker proc VllmWorker-0 died unexpectedly", 1, "EngineCore"),
        f("engine_init_failed", "Engine core initialization failed.", 2, "APIServer"),
    )
    (root,) = failures.values()
    assert root.provisional and root.count == 2 and root.kind == "worker_died"
    assert session_kind(failures) == "worker_died"


def test_what_is_a_consequence_and_what_a_stop_makes_of_it() -> None:
    dead = f("worker_died", "EngineCore encountered an issue.", 1)
    cut = f("other", "traceback without an exception line", 2)
    assert is_consequence(dead) and is_consequence(cut)
    assert not is_consequence(f("other", "ValueError: bad", 3))
    assert shutdown_noise(dead, stop_requested=True)
    assert not shutdown_noise(dead, stop_requested=False)
    assert not shutdown_noise(f("cuda_oom", OOM, 4), stop_requested=True)


def test_a_request_error_while_serving_explains_no_later_crash() -> None:
    failures: Roots = {}
    failures = dict(
        fold_failure(failures, f("other", "bad request", 1), 0.0, False, 32, 16).failures
    )
    dead = f("worker_died", "Worker proc VllmWorker-0 died unexpectedly", 2)
    failures = dict(fold_failure(failures, dead, 1.0, True, 32, 16).failures)
    assert sorted(t.kind for t in failures.values()) == ["other", "worker_died"]
    assert session_kind(failures) == "worker_died"


def test_past_the_kept_roots_the_rest_count_under_one_entry() -> None:
    failures: Roots = {}
    for i in range(5):
        ev = f("other", f"distinct error {i}", i)
        failures = dict(fold_failure(failures, ev, float(i), True, 3, 16).failures)
    assert len(failures) == 4 and failures[("other", "more failures than kept")].count == 2
