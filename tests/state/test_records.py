"""`evolve`, the copy the fold and the forecasts make of their frozen records."""

from __future__ import annotations

import dataclasses

import pytest

from loadwatch.daemon.state.forecast import EtaState, Regime, Segment
from loadwatch.daemon.state.memfit import MemoryFit
from loadwatch.daemon.state.records import evolve
from loadwatch.daemon.state.session import WarningTally


def test_evolve_changes_the_copy_and_leaves_the_original() -> None:
    seg = Segment(serial=3, t0=1.0, t1=2.5, x0=0.0, x1=10.0, items=2)
    new = evolve(seg, resid=0.25, items=4)
    assert (new.resid, new.items, new.t1) == (0.25, 4, 2.5)
    assert (seg.resid, seg.items) == (0.0, 2)
    assert type(new) is Segment
    assert dataclasses.replace(seg, resid=0.25, items=4) == new


def test_evolve_refuses_a_field_the_record_does_not_have() -> None:
    with pytest.raises(KeyError, match="Regime has no field"):
        evolve(Regime(), n_items=1)
    tally = WarningTally("c", "warning", 0, 0.0, 0.0, 0, 0, frozenset(), frozenset(), "")
    with pytest.raises(KeyError, match="WarningTally has no field"):
        evolve(tally, counted=1)


def test_evolved_records_stay_frozen() -> None:
    fit = evolve(MemoryFit(), last_used=5.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fit.last_used = 6.0  # type: ignore[misc]


def test_an_eta_update_leaves_the_state_it_came_from_alone() -> None:
    st = EtaState.start(0.0, 0, 10)
    steps = [st]
    for d in range(1, 8):
        steps.append(steps[-1].update(float(d) * 2.0, d))
    before = [dataclasses.astuple(s) for s in steps]
    for s in steps:  # updating any of them again must not touch the others
        s.update(100.0, 9)
    assert [dataclasses.astuple(s) for s in steps] == before
    assert steps[-1].regime is not None and steps[-1].regime.n >= 5
    assert steps[-1].last_done == 7 and steps[0].last_done == 0
