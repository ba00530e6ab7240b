"""Clock windows over the week: an hour-of-week schedule as minute-of-week windows for cron-style triggers.

Shared by the planner (which writes the windows into the spec) and the simulator (which re-derives them
when a drill overrides the floor): a reading of the spec's schedule, not a planning decision.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .costs import cyclic_runs
from .spec import FloorWindow, MinContainersWindow
from .timebase import HOURS_PER_WEEK, MINUTES_PER_HOUR, MINUTES_PER_WEEK


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
