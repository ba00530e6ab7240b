"""Clock windows on a real clock across daylight-saving changes (America/New_York, Europe/Berlin, 2026).

The floor's KEDA cron triggers and the on-demand pools' scheduled minimums are weekly crons in the profile's time
zone. A local time the spring-forward change skips does not exist that day: robfig/cron (which KEDA uses) never
fires it, and KEDA judges a window active when its next end comes before its next start — a start in the gap
kept the window active all the week before, an end in the gap dropped the window that day (tests/keda_cron.py
ports both). Edges in a gap are moved out of it: a start (a rise) to the minute before, an end (a fall) to the
minute after.
"""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from components.floor_replicas import cron_triggers
from tests.keda_cron import keda_cron_active
from topology.spec import FloorSchedule, FloorWindow
from topology.windows import clear_of_clock_gaps

SUN = 6 * 24 * 60  # Sunday 00:00 as a minute of the week (Monday 00:00 = 0)


def _schedule(timezone: str, start: int, end: int) -> FloorSchedule:
    return FloorSchedule(timezone=timezone, replicas_by_hour=(1,) * 168, base_replicas=1, reserved_replicas=1,
                         lead_time_s=600, windows=(FloorWindow(start_minute_of_week=start, end_minute_of_week=end,
                                                               replicas=3, demand_rise_minute_of_week=None),))


def _active_spans(timezone: str, start: int, end: int, first: dt.datetime, last: dt.datetime) -> list[tuple[str, str]]:
    """Where KEDA, as ported, holds the rendered window active between two local instants, sampled every 5 min."""
    (trigger,) = cron_triggers(_schedule(timezone, start, end))
    md = trigger["metadata"]
    zone = ZoneInfo(timezone)
    spans, t, t1, on = [], first.replace(tzinfo=zone).timestamp(), last.replace(tzinfo=zone).timestamp(), None
    while t < t1:
        if keda_cron_active(md["start"], md["end"], timezone, t):
            on = on or t
        elif on is not None:
            spans.append((on, t))
            on = None
        t += 300
    if on is not None:
        spans.append((on, t1))
    fmt = lambda ts: dt.datetime.fromtimestamp(ts, zone).strftime("%m-%d %H:%M")  # noqa: E731
    return [(fmt(a), fmt(b)) for a, b in spans]


@pytest.mark.parametrize("timezone, change_day", [("America/New_York", 8), ("Europe/Berlin", 29)])
def test_a_window_starting_in_the_skipped_hour_runs_that_sunday_and_not_the_week_before(timezone, change_day):
    """Sun 02:53–10:00 (a rise at 03:00 with its lead). Before: active from the Sunday before at 10:00 through the
    change (about a week of replicas and nodes nobody planned). Now: each Sunday's window from 01:59 (the minute
    before the gap, every week: 54 minutes more a week), seen at the first sample after it — 02:00, and 03:00 on
    the change day, when 02:00 does not exist."""
    change = dt.datetime(2026, 3, change_day)
    spans = _active_spans(timezone, SUN + 2 * 60 + 53, SUN + 10 * 60, change - dt.timedelta(days=8),
                          change + dt.timedelta(days=8))
    days = [(change + dt.timedelta(days=k)).strftime("%m-%d") for k in (-7, 0, 7)]
    assert spans == [(f"{days[0]} 02:00", f"{days[0]} 10:00"), (f"{days[1]} 03:00", f"{days[1]} 10:00"),
                     (f"{days[2]} 02:00", f"{days[2]} 10:00")], spans


@pytest.mark.parametrize("timezone, change_day", [("America/New_York", 8), ("Europe/Berlin", 29)])
def test_a_window_ending_in_the_skipped_hour_still_runs_on_the_change_day(timezone, change_day):
    """Sun 00:53–02:00. Before: on the change day the end never came before the next start, so KEDA held the
    window inactive: no replicas for it. Now it runs until 03:00 (the first minute after the gap) that day."""
    change = dt.datetime(2026, 3, change_day)
    spans = _active_spans(timezone, SUN + 53, SUN + 2 * 60, change - dt.timedelta(hours=12), change + dt.timedelta(hours=12))
    day = change.strftime("%m-%d")
    assert spans == [(f"{day} 00:55", f"{day} 03:00")], spans


def test_edges_outside_any_gap_are_unchanged():
    """A weekday window, one wrapping Sunday → Monday, and UTC: the edges are the planned minutes."""
    for tz in ("America/New_York", "Europe/Berlin", "UTC"):
        for m in (7 * 60 + 53, 17 * 60, SUN + 23 * 60 + 53, 2 * 60, SUN + 1 * 60 + 59, SUN + 3 * 60):
            assert clear_of_clock_gaps(m, tz, earlier=True) == m == clear_of_clock_gaps(m, tz, earlier=False)
    assert clear_of_clock_gaps(SUN + 2 * 60 + 53, "America/New_York", earlier=True) == SUN + 1 * 60 + 59
    assert clear_of_clock_gaps(SUN + 2 * 60, "Europe/Berlin", earlier=False) == SUN + 3 * 60
