"""Text formatting shared by the simulator's reports and drills (terminal tables or Markdown for PR comments)."""

from __future__ import annotations

import math

from topology.timebase import DAYS_PER_WEEK, HOURS_PER_DAY

WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def fmt_seconds(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if math.isinf(x):
        return "∞"
    return f"{x * 1000:.0f} ms" if x < 10 else f"{x:.1f} s"


def hour_of_week_label(h: int) -> str:
    return f"{WEEKDAYS[(h // HOURS_PER_DAY) % DAYS_PER_WEEK]} {h % HOURS_PER_DAY:02d}:00"


def table(head: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), fmt.format(*("-" * w for w in widths))] + [fmt.format(*r) for r in rows])
