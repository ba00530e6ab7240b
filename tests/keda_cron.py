"""When KEDA's cron scaler says a window is active, on a real clock: a Python port of the parts it runs.

Ported (not copied) from robfig/cron v3.0.1 `spec.go` `SpecSchedule.Next` (MIT licence; the version KEDA v2.20.2
pins in its go.mod) for the 5-field specs the project renders (`M H * * DOW`), and KEDA v2.20.2
`pkg/scalers/cron_scaler.go` `getMetricsAndActivity` (Apache-2.0): the next start and the next end after now,
each found by `Next` in the trigger's time zone; the window is active when the next end does not come before
the next start. The property that matters here is `Next`'s walk over a clock change: it steps hours by adding an
hour to the instant, so a local time the clock skips is never matched that day (spring forward), and one the
clock repeats is matched twice. Used by tests/test_clock_changes.py.
"""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo


class Spec:
    """`M H * * DOW` with single values (what components.floor_replicas.minute_of_week_cron writes)."""

    def __init__(self, text: str):
        minute, hour, dom, month, dow = text.split()
        if (dom, month) != ("*", "*"):
            raise ValueError(f"only 'M H * * DOW' specs are ported: {text!r}")
        self.minute, self.hour, self.dow = int(minute), int(hour), int(dow)


def _date(y: int, mo: int, d: int, h: int, mi: int, zone: ZoneInfo) -> float:
    """Go's time.Date: normalises overflowing fields; a local time in a gap takes the offset before it."""
    base = dt.datetime(y, mo, 1) + dt.timedelta(days=d - 1, hours=h, minutes=mi)
    return base.replace(tzinfo=zone, fold=0).timestamp()


def _local(ts: float, zone: ZoneInfo) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, zone)


def next_time(spec: Spec, now: float, zone: ZoneInfo) -> float:
    """robfig's SpecSchedule.Next for a spec with every month and day of month: the first instant after `now`."""
    ts = float(int(now) + 1)
    added = False
    year_limit = _local(ts, zone).year + 5
    while True:
        loc = _local(ts, zone)
        if loc.year > year_limit:
            raise RuntimeError("no time found in five years")
        wrapped = False
        # days: the weekday must match (day of month is '*')
        while (loc.weekday() + 1) % 7 != spec.dow:
            if not added:
                added = True
                ts = _date(loc.year, loc.month, loc.day, 0, 0, zone)
                loc = _local(ts, zone)
            ts = _date(loc.year, loc.month, loc.day + 1, loc.hour, loc.minute, zone)
            loc = _local(ts, zone)
            # robfig: "Notice if the hour is no longer midnight due to DST. Add an hour if it's 23, subtract if 1"
            if loc.hour != 0:
                ts += ((24 - loc.hour) if loc.hour > 12 else -loc.hour) * 3600
                loc = _local(ts, zone)
            if loc.day == 1:
                wrapped = True
                break
        if wrapped:
            continue
        while loc.hour != spec.hour:
            if not added:
                added = True
                ts = _date(loc.year, loc.month, loc.day, loc.hour, 0, zone)
                loc = _local(ts, zone)
            ts += 3600  # by the clock: a skipped local hour is never seen
            loc = _local(ts, zone)
            if loc.hour == 0:
                wrapped = True
                break
        if wrapped:
            continue
        while loc.minute != spec.minute:
            if not added:
                added = True
                ts -= ts % 60
            ts += 60
            loc = _local(ts, zone)
            if loc.minute == 0:
                wrapped = True
                break
        if wrapped:
            continue
        if loc.second != 0:
            added = True
            ts = ts - loc.second + 60
            continue
        return ts


def keda_cron_active(start: str, end: str, timezone: str, now: float) -> bool:
    """KEDA's cron scaler at `now`: active unless the next start comes before the next end."""
    zone = ZoneInfo(timezone)
    next_start, next_end = next_time(Spec(start), now, zone), next_time(Spec(end), now, zone)
    if next_start < next_end:
        return now > next_start and now < next_end  # next_start is after now: never true
    return now > next_start or now < next_end
