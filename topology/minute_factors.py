"""Within-hour burstiness as both the planner and the simulator read it: minute factors drawn from a mean-1
Gamma(α, 1/α), with α set so that the expected busiest of an hour's 60 minutes is the endpoint's
`within_hour_peak_factor`. One definition here, so the plan and the simulated traffic it is checked against
cannot drift apart. Pure: math only."""

from __future__ import annotations

import math
from statistics import NormalDist

Z_PEAK_MINUTE = 2.13  # standard normal quantile at 60/61: the expected largest of 60 draws


def busiest_minute_factor(alpha: float, z: float = Z_PEAK_MINUTE) -> float:
    """The expected busiest of 60 Gamma(α, 1/α) minute factors over their mean (Wilson–Hilferty); with z, the
    Gamma's quantile at that standard normal quantile."""
    return (1 - 1 / (9 * alpha) + z / (3 * math.sqrt(alpha))) ** 3


def _alpha_for_busiest(target: float, z: float, lo: float) -> float:
    """The α ≥ lo at which busiest_minute_factor(α, z) is `target`, by bisection in log α (it falls with α there)."""
    hi = 1e7
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        if busiest_minute_factor(mid, z) > target:
            lo = mid
        else:
            hi = mid
    return lo


def gamma_alpha_for_peak(peak_factor: float) -> float | None:
    """α of a mean-1 Gamma whose expected largest of 60 draws is `peak_factor` (Wilson–Hilferty); None = flat."""
    if peak_factor <= 1.0 + 1e-9:
        return None
    return _alpha_for_busiest(peak_factor, Z_PEAK_MINUTE, 0.05)


def factor_keep(correlation_s: float) -> float:
    """The probability that a minute keeps the previous minute's factor, for a factor whose autocorrelation falls
    as e^(−lag / correlation_s) (`traffic.within_hour_correlation_s`; 0 s: independent minutes)."""
    return math.exp(-60.0 / correlation_s) if correlation_s > 0 else 0.0


def active_minute_z(idle_share: float) -> float:
    """The standard normal quantile at which Wilson–Hilferty reads the busiest of the hour's minutes with traffic,
    n = 60·(1 − p) of them at an idle share p: the expected largest of n draws is taken at the quantile n/(n + 1),
    the rule Z_PEAK_MINUTE applies to all 60 (p = 0: Z_PEAK_MINUTE itself, the input's meaning unchanged)."""
    if idle_share <= 0.0:
        return Z_PEAK_MINUTE
    n = 60.0 * (1.0 - idle_share)
    return NormalDist().inv_cdf(n / (n + 1.0))


def gamma_alpha_for_peak_with_idle(peak_factor: float, idle_share: float) -> float | None:
    """α of the Gamma of the minutes with traffic when a share `idle_share` (p) of minutes has none: those minutes'
    factor is G/(1 − p), G ~ Gamma(α, 1/α) (the factor's mean over the hour stays 1), and the busiest of the hour's
    minutes — the busiest of its 60·(1 − p) active ones — stays `peak_factor` × the hour's mean:
    (1 − 1/(9α) + z/(3√α))³ / (1 − p) = peak_factor, z = active_minute_z(p). None: the active minutes flat (their
    rate alone, 1/(1 − p), already reaches the peak factor). p = 0: gamma_alpha_for_peak."""
    if idle_share <= 0.0:
        return gamma_alpha_for_peak(peak_factor)
    target = peak_factor * (1.0 - idle_share)
    if target <= 1.0 + 1e-9:
        return None
    z = active_minute_z(idle_share)
    # the transform falls with α only above 4/(9z²), where it peaks at (1 + z²/4)³: a larger target is taken there
    # (the most bursty Gamma Wilson–Hilferty reads)
    lo = 4.0 / (9.0 * z * z)
    if target >= busiest_minute_factor(lo, z):
        return lo
    return _alpha_for_busiest(target, z, lo)
