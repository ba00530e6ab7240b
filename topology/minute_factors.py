"""Within-hour burstiness as both the planner and the simulator read it: minute factors drawn from a mean-1
Gamma(α, 1/α), with α set so that the expected busiest of an hour's 60 minutes is the endpoint's
`within_hour_peak_factor`. One definition here, so the plan and the simulated traffic it is checked against
cannot drift apart. Pure: math only."""

from __future__ import annotations

import math

Z_PEAK_MINUTE = 2.13  # standard normal quantile at 60/61: the expected largest of 60 draws


def busiest_minute_factor(alpha: float) -> float:
    """The expected busiest of 60 Gamma(α, 1/α) minute factors over their mean (Wilson–Hilferty)."""
    return (1 - 1 / (9 * alpha) + Z_PEAK_MINUTE / (3 * math.sqrt(alpha))) ** 3


def gamma_alpha_for_peak(peak_factor: float) -> float | None:
    """α of a mean-1 Gamma whose expected largest of 60 draws is `peak_factor` (Wilson–Hilferty); None = flat."""
    if peak_factor <= 1.0 + 1e-9:
        return None
    lo, hi = 0.05, 1e7
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        if busiest_minute_factor(mid) > peak_factor:
            lo = mid
        else:
            hi = mid
    return lo


def factor_keep(correlation_s: float) -> float:
    """The probability that a minute keeps the previous minute's factor, for a factor whose autocorrelation falls
    as e^(−lag / correlation_s) (`traffic.within_hour_correlation_s`; 0 s: independent minutes)."""
    return math.exp(-60.0 / correlation_s) if correlation_s > 0 else 0.0
