"""`evolve`, the copy the fold makes of its frozen records; the forecast's copies (compiled
records, which have no `__dict__`)."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest

from loadwatch.daemon.state.forecast import EtaState, Regime, Segment
from loadwatch.daemon.state.memfit import MemoryFit
from loadwatch.daemon.state.records import evolve
from loadwatch.daemon.state.session import WarningTally


def test_evolve_changes_the_copy_and_leaves_the_original() -> None:
    tally = WarningTally("c", "warning", 2, 1.0, 2.5, 0, 0, frozenset(), frozenset(), "")
    new = evolve(tally, count=4, last_at=3.0)
    assert (new.count, new.last_at, new.first_at) == (4, 3.0, 1.0)
    assert (tally.count, tally.last_at) == (2, 2.5)
    assert type(new) is WarningTally
    assert dataclasses.replace(tally, count=4, last_at=3.0) == new


def test_evolve_refuses_a_field_the_record_does_not_have() -> None:
    with pytest.raises(KeyError, match="MemoryFit has no field"):
        evolve(MemoryFit(), n_items=1)
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
    before = [tuple(s) for s in steps]
    for s in steps:  # updating any of them again must not touch the others
        s.update(100.0, 9)
    assert [tuple(s) for s in steps] == before
    assert steps[-1].regime is not None and steps[-1].regime.n >= 5
    assert steps[-1].last_done == 7 and steps[0].last_done == 0


def test_a_regime_add_is_a_copy_with_the_segment_in_its_sums() -> None:
    seg = Segment(serial=3, t0=1.0, t1=2.5, x0=0.0, x1=10.0, items=2, resid=0.5)
    r0 = Regime(sigma_prior=0.3)
    r1 = r0.add(seg)
    assert (r1.n, r1.t_sum, r1.x_sum, r1.r2_sum, r1.s_nn, r1.s_xt) == (1, 1.5, 10.0, 0.25, 4, 15)
    assert r0 == Regime(sigma_prior=0.3)  # the one it came from, left alone
    assert r0.add(seg, resid=0.0).r2_sum == 0.0  # (a new regime's segments start untested)
    r2 = r1.add(seg, cusum=(1.0, 0.5, 3, 4))
    assert (r2.cusum_pos, r2.cusum_neg, r2.pos_from, r2.neg_from) == (1.0, 0.5, 3, 4)
    assert (r2.n, r2.sigma_prior, r2.tested_from) == (2, 0.3, 0)
    assert r2.add(seg).cusum_pos == 1.0  # (the CUSUM's state kept when none is given)


def test_forecast_records_copy_and_pickle_whole() -> None:
    """A copy or a pickle of the estimator is the same estimator (its records are named tuples;
    its configuration, a dataclass, goes through `__reduce__`, compiled)."""
    st = EtaState.start(0.0, 0, 10)
    for d in range(1, 6):
        st = st.update(float(d) * 2.0, d)
    assert st.regime is not None and st.recent
    for made in (copy.deepcopy(st), copy.copy(st), pickle.loads(pickle.dumps(st))):
        assert made == st and type(made) is EtaState
        assert tuple(made) == tuple(st)
