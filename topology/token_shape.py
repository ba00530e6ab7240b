"""Token counts as both the planner and the simulator read them: the shape gives a mean and a 99th percentile,
and both fit the same lognormal to them. One definition here, so the plan's p99 arithmetic and the simulated
requests it is checked against cannot drift apart. Pure: math only."""

from __future__ import annotations

import math

Z_P99 = 2.3263  # standard normal quantile at 0.99


def lognormal_params(mean: float, p99: float) -> tuple[float, float]:
    """μ, σ of the lognormal with this mean and 99th percentile (the narrower of the two solutions)."""
    r = math.log(p99 / mean)  # = zσ − σ²/2
    disc = Z_P99 * Z_P99 - 2 * r
    sigma = Z_P99 - math.sqrt(disc) if disc > 0 else Z_P99
    return math.log(mean) - sigma * sigma / 2, sigma
