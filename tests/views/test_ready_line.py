"""The status screen says when the start will be ready, as earlier starts of the model tell it
(`session.startup_eta`), and why it cannot while there are none."""

from __future__ import annotations

from loadwatch.exporters.terminal.watch import status_text

from .test_status import T0, mid_load


def test_the_screen_shows_the_eta_to_ready_of_a_repeat_start() -> None:
    state, now, _ = mid_load()
    doc = state.snapshot(now).to_dict()
    doc["session"]["startup_eta"] = {
        "remaining_low_s": 540.0,
        "remaining_s": 600.0,
        "remaining_high_s": 660.0,
        "ready_at": T0 + 3600.0,
        "step": "weights",
        "past_starts": 3,
        "overdue_s": 0.0,
        "basis": "the weights bar's ETA and the median of 3 earlier starts",
    }
    text = " ".join(status_text(doc, width=160).split())
    assert "ready in 10m00s (9m00s – 11m00s), about" in text
    assert "the median of 3 earlier starts" in text


def test_the_screen_says_why_a_first_start_has_no_eta_to_ready() -> None:
    state, now, _ = mid_load()
    doc = state.snapshot(now).to_dict()
    reason = doc["session"]["startup_eta_reason"]
    assert doc["session"]["startup_eta"] is None and reason
    text = " ".join(status_text(doc, width=160).split())
    assert f"ready no ETA yet: {reason}" in text
