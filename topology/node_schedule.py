"""Node capacity on the clock: the planner's floor windows, as the minimum node count of each on-demand pool.

The floor schedule says how many replicas must be ready in each window (KEDA cron triggers start them
`lead_time_s` ahead of the demand rise). Pods cannot start without nodes, and a GPU node takes the endpoint's
`node_cold_start_s` to join; so each on-demand pool's minimum is raised that node cold start ahead of the pod
window, to the nodes the window's replicas need beyond the reserved pools, and lowered again when the window
ends (the node autoscaler then removes nodes once their pods are gone). Pure: the Auto Scaling scheduled
actions are written by components/gpu_node_pool.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .spec import EndpointSpec, NodePoolSpec, TopologySpec
from .windows import clear_of_clock_gaps

MINUTES_PER_WEEK = 7 * 24 * 60


@dataclass(frozen=True)
class NodeMinimum:
    """From `minute_of_week` (Monday 00:00 = 0, in `timezone`) on, the pool keeps at least `min_nodes`."""

    pool: str
    minute_of_week: int
    min_nodes: int
    timezone: str


def replicas_per_node(endpoint: EndpointSpec, pool: NodePoolSpec) -> int:
    c = endpoint.capacity
    return max(1, pool.gpus_per_node * c.replicas_per_gpu // c.gpus_per_replica)


def node_lead_minutes(endpoint: EndpointSpec) -> int:
    return math.ceil(endpoint.node_cold_start_s / 60)


def _active(start: int, end: int, minute: int) -> bool:
    """[start, end) on the weekly clock; a window may wrap past Sunday 24:00."""
    return (minute - start) % MINUTES_PER_WEEK < (end - start) % MINUTES_PER_WEEK


def pool_minimums(spec: TopologySpec) -> dict[str, tuple[NodeMinimum, ...]]:
    """For each on-demand pool that follows a clock: the change points of its minimum over the week.

    Empty for pools with no windows. The minimum never exceeds the pool's max_nodes nor drops below its
    min_nodes.
    """
    pools = {p.name: p for p in spec.node_pools}
    out: dict[str, tuple[NodeMinimum, ...]] = {}
    for e in spec.endpoints:
        if not e.node_pools or not e.floor.windows:
            continue
        mine = [pools[n] for n in e.node_pools]
        reserved_replicas = sum(p.min_nodes * replicas_per_node(e, p) for p in mine if p.capacity_type == "reserved")
        lead = node_lead_minutes(e)
        for pool in (p for p in mine if p.capacity_type == "on_demand"):
            per_node = replicas_per_node(e, pool)

            def nodes_at(minute: int, pool=pool, per_node=per_node) -> int:
                replicas = max((w.replicas for w in e.floor.windows
                                if _active((w.start_minute_of_week - lead) % MINUTES_PER_WEEK, w.end_minute_of_week, minute)),
                               default=0)
                need = math.ceil(max(0, replicas - reserved_replicas) / per_node)
                return min(pool.max_nodes, max(pool.min_nodes, need))

            # the minimum can only change where a window (shifted by the lead) starts or ends: evaluated at those
            # minutes against the minute before (m - 1 wraps to Sunday 23:59), not at all 10,080
            edges = sorted({(w.start_minute_of_week - lead) % MINUTES_PER_WEEK for w in e.floor.windows}
                           | {w.end_minute_of_week for w in e.floor.windows})
            # a change in an hour a clock change skips is moved out of it, a rise earlier and a fall later (as the
            # floor's KEDA windows: components/floor_replicas.py cron_triggers)
            changes = tuple(
                NodeMinimum(pool.name, clear_of_clock_gaps(m, e.floor.timezone, earlier=level > before), level,
                            e.floor.timezone)
                for m in edges
                if (level := nodes_at(m)) != (before := nodes_at((m - 1) % MINUTES_PER_WEEK))
            )
            if changes:
                out[pool.name] = changes
    return out


def weekly_cron(minute_of_week: int) -> str:
    """Unix cron `M H * * DOW` (DOW 0 = Sunday) for a minute of the week (Monday 00:00 = 0)."""
    day, rest = divmod(minute_of_week, 1440)
    hour, minute = divmod(rest, 60)
    return f"{minute} {hour} * * {(day + 1) % 7}"
