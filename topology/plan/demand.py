"""Demand: the hour-of-week profile the planner sizes against (mean and within-hour peak requests/s)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..inputs import EndpointInputs
from .errors import PlanningError


@dataclass
class Demand:
    mean_rps: np.ndarray  # HOURS_PER_WEEK
    peak_rps: np.ndarray  # HOURS_PER_WEEK, mean × within-hour peak factor


def demand_of(ep: EndpointInputs) -> Demand:
    if ep.traffic.hourly_mean_requests_per_s is None:
        raise PlanningError(
            f"endpoint {ep.name}: traffic.rate_trace must be resolved into hourly_mean_requests_per_s "
            "before planning (topology.load_inputs does this)"
        )
    mean = np.asarray(ep.traffic.hourly_mean_requests_per_s, dtype=float)
    return Demand(mean_rps=mean, peak_rps=mean * ep.traffic.within_hour_peak_factor)


def replicas_needed_by_hour(peak_rps: np.ndarray, planning_rps: float) -> np.ndarray:
    """Replicas that carry each hour's within-hour peak at the planning utilisation (headroom included)."""
    return np.ceil(peak_rps / planning_rps - 1e-9).astype(int)
