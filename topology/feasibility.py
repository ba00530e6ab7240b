"""Cheap refusals before the planner's expensive work: is a tier's peak beyond its hard caps?

The planner sizes a dedicated option from a (layers × 168) matrix, one row per replica the peak needs.
A profile of 1,000,000 requests/s needs millions of rows (minutes and gigabytes) only to find that the
caps (`max_dedicated_replicas`, `serverless.max_containers_cap`) are exceeded. The same test the
floor chooser applies at the peak hour is made here first, from the peak alone, in O(168).
"""

from __future__ import annotations

import math

import numpy as np


def dedicated_cap_shortfall(
    peak_rps: np.ndarray,
    planning_rps: float,
    replicas_per_node: int,
    max_replicas: int,
    *,
    burst_planning_rps: float | None,
    burst_cap_containers: int,
) -> str | None:
    """Why a dedicated placement cannot carry the peak hour within its caps, or None when it may.

    `burst_planning_rps` is the burst placement's planned requests/s per container (None: no burst tier).
    Mirrors the planner's rule: dedicated nodes must carry whatever the burst cap cannot, and at most
    max_replicas // replicas_per_node nodes exist."""
    need = np.ceil(np.asarray(peak_rps, dtype=float) / planning_rps - 1e-9)
    burst_replicas = 0.0
    if burst_planning_rps is not None:
        burst_replicas = math.floor(burst_cap_containers / (planning_rps / burst_planning_rps) + 1e-9)
    nodes = np.ceil(np.maximum(need - burst_replicas, 0) / replicas_per_node)
    h = int(np.argmax(nodes))
    if nodes[h] <= max_replicas // replicas_per_node:
        return None
    # the planner's own wording for the same refusal (choose_floors), so the spec reads the same either way
    what = f"burst cap {burst_cap_containers} containers" if burst_planning_rps is not None else "no burst"
    return (f"hour {h} needs {int(nodes[h]) * replicas_per_node} dedicated replicas ({int(need[h])} at peak, {what}) "
            f"> max_dedicated_replicas={max_replicas}")
