"""Clock windows over the week: an hour-of-week schedule as minute-of-week windows for cron-style triggers.

Shared by the planner (which writes the windows into the spec) and the simulator (which re-derives them
when a drill overrides the floor): a reading of the spec's schedule, not a planning decision.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
from collections.abc import Sequence

from .costs import cyclic_runs
from .spec import FloorWindow, MinContainersWindow
from .timebase import HOURS_PER_WEEK, MINUTES_PER_DAY, MINUTES_PER_HOUR, MINUTES_PER_WEEK


# Years whose clock changes a weekly edge is checked against (fixed, so a render does not depend on the day it runs)
CLOCK_CHANGE_YEARS = range(2025, 2041)


@functools.lru_cache(maxsize=4096)
def clear_of_clock_gaps(minute_of_week: int, timezone: str, earlier: bool) -> int:
    """The minute itself, or — where that local time is skipped by a clock change on its weekday (spring forward:
    Sunday 02:00–02:59 in New York and Berlin) in some year — the last minute before the gap (earlier: a window's
    start, a minimum that rises) or the first after it (a window's end, a minimum that falls).

    A weekly cron at a skipped time does not fire that week (robfig/cron v3.0.1 spec.go steps hours by the clock,
    which KEDA v2.20.2's cron scaler uses), and KEDA judges a window active when its next end comes before its next
    start: a start in the gap kept the window active for the whole week before, an end in the gap dropped the
    window that day. Moved out of the gap, both edges exist every week; the window is at most an hour longer."""
    from zoneinfo import ZoneInfo

    zone = ZoneInfo(timezone)
    day, rest = divmod(minute_of_week, MINUTES_PER_DAY)
    hour, minute = divmod(rest, MINUTES_PER_HOUR)

    def exists(local: dt.datetime) -> bool:
        back = local.replace(tzinfo=zone).astimezone(dt.timezone.utc).astimezone(zone).replace(tzinfo=None)
        return back == local

    for year in CLOCK_CHANGE_YEARS:
        first = dt.date(year, 1, 1)
        d = first + dt.timedelta(days=(day - first.weekday()) % 7)
        while d.year == year:
            local = dt.datetime(d.year, d.month, d.day, hour, minute)
            if not exists(local):
                step = dt.timedelta(minutes=-1 if earlier else 1)
                while not exists(local):
                    local += step
                return (local.weekday() * MINUTES_PER_DAY + local.hour * MINUTES_PER_HOUR + local.minute) % MINUTES_PER_WEEK
            d += dt.timedelta(days=7)
    return minute_of_week


def floor_windows(floor: Sequence[int], base: int, lead_s: float) -> tuple[FloorWindow, ...]:
    """Contiguous runs of constant floor above the base; a run that rises starts lead_s early."""
    n = len(floor)
    windows: list[FloorWindow] = []
    if all(v == floor[0] for v in floor):
        return ()
    # rotate so that we start right after a change, keeping runs intact across the week's wrap
    start = next(h for h in range(n) if floor[h] != floor[h - 1])
    h = 0
    lead_min = math.ceil(lead_s / 60.0)
    while h < n:
        s = (start + h) % n
        v = floor[s]
        length = 1
        while length < n and floor[(s + length) % n] == v:
            length += 1
        h += length
        if v <= base:
            continue
        prev = floor[(s - 1) % n]
        rise = v > prev
        begin = (s * MINUTES_PER_HOUR - (lead_min if rise else 0)) % MINUTES_PER_WEEK
        end = ((s + length) % n) * MINUTES_PER_HOUR
        windows.append(FloorWindow(
            start_minute_of_week=begin, end_minute_of_week=end % MINUTES_PER_WEEK, replicas=int(v),
            demand_rise_minute_of_week=(s * MINUTES_PER_HOUR) if rise else None,
        ))
    return tuple(sorted(windows, key=lambda w: (w.demand_rise_minute_of_week or w.start_minute_of_week)))


def hour_windows(active: Sequence[bool], value: int, lead_s: float) -> tuple[MinContainersWindow, ...]:
    """Runs of active hours as minimum-container windows starting lead_s early (empty when always active)."""
    out = []
    lead_min = math.ceil(lead_s / 60.0)
    for s, length in cyclic_runs([bool(x) for x in active]):
        if length == HOURS_PER_WEEK:
            return ()  # always on: expressed as min_containers instead
        out.append(MinContainersWindow(
            start_minute_of_week=(s * MINUTES_PER_HOUR - lead_min) % MINUTES_PER_WEEK,
            end_minute_of_week=((s + length) % HOURS_PER_WEEK) * MINUTES_PER_HOUR,
            min_containers=value,
        ))
    return tuple(out)


def level_windows(levels: Sequence[int], lead_s: float) -> tuple[int, tuple[MinContainersWindow, ...]]:
    """An hour-of-week minimum that varies by hour as (base, windows above it): each run of one level above the
    base is a window, a rising one starting lead_s early (the windows may overlap there: readers take the
    highest window touching a minute)."""
    base = int(min(levels))
    return base, tuple(MinContainersWindow(start_minute_of_week=w.start_minute_of_week,
                                           end_minute_of_week=w.end_minute_of_week, min_containers=w.replicas)
                       for w in floor_windows([int(x) for x in levels], base, lead_s))
