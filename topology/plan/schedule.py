"""Stage 2, the per-node schedule: the load-duration curve cut into node-sized layers, each node reserved,
on the clock (an on/off schedule per node by dynamic programming) or left to serverless, and what
serverless costs a layer when it is not running (its share of the hour's bill from serverless.py). Also the
spec's floor schedule: replicas by hour and the clock windows that start a cold-start lead ahead of each rise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..inputs import CostInputs, EndpointInputs
from ..spec import Derivation, FloorSchedule, HerdSpec
from ..timebase import HOURS_PER_WEEK
from ..windows import floor_windows
from .demand import Demand, replicas_needed_by_hour
from .container_price import container_price
from .placement import Placement
from .section import Section
from .timing import lead_time_s


@dataclass(frozen=True)
class Prices:
    serverless_container_hour: float
    on_demand_node_hour: float
    reserved_node_hour: float


def prices_for(inp: CostInputs, ep: EndpointInputs, pl: Placement, sls: Placement) -> Prices:
    od_gpu = inp.prices.dedicated_on_demand_usd_per_gpu_hour[pl.gpu_kind]
    res_gpu = od_gpu * (1 - inp.prices.reserved_discount_fraction)
    return Prices(
        serverless_container_hour=container_price(inp, ep, sls.gpus_per_replica).usd_per_hour,
        on_demand_node_hour=od_gpu * pl.gpus_per_node,
        reserved_node_hour=res_gpu * pl.gpus_per_node,
    )


@dataclass
class NodeGroups:
    """One placement's demand cut into node-sized layers: group g carries replicas g·rpn+1 … (g+1)·rpn.

    Nodes are what is paid for, so the load-duration choice is made per node: reserved (all hours),
    on-demand in the hours the clock schedules it, or serverless in the hours it is not running."""

    need: np.ndarray  # (HOURS_PER_WEEK,) replicas needed at the within-hour peak
    needed: np.ndarray  # (G, HOURS_PER_WEEK) the group's lowest layer is needed
    serverless_usd: np.ndarray  # (G, HOURS_PER_WEEK) serverless cost of carrying the group's layers in that hour
    reserved_usd_week: float  # one reserved node for the week
    on_demand_node_hour: float
    rise_usd: float  # a scheduled node starts lead_s before its hour and is billed from then
    rpn: int
    ratio: float  # serverless containers per dedicated replica of capacity

    @property
    def groups(self) -> int:
        return self.needed.shape[0]


def node_groups(
    demand: Demand, pl: Placement, sls: Placement, pr: Prices, lead_s: float, sls_overhead_s: float,
    warm_container: bool = False, serverless_all_usd: np.ndarray | None = None,
) -> NodeGroups:
    """serverless_all_usd: what serverless bills each hour for the whole demand (serverless.py); the layers'
    shares of an hour are scaled to it."""
    need = replicas_needed_by_hour(demand.peak_rps, pl.planning_rps)
    rpn = pl.replicas_per_node
    top = int(need.max()) if need.size else 0
    groups = math.ceil(top / rpn)
    ks = np.arange(1, groups * rpn + 1)
    active = need[None, :] >= ks[:, None]  # (layers, HOURS_PER_WEEK)
    # serverless bills per second for the share of each layer's band that mean demand occupies, in
    # containers of the serverless placement's size, plus a cold start and scaledown tail per active hour
    fill = np.clip(demand.mean_rps[None, :] / pl.planning_rps - (ks[:, None] - 1), 0.0, 1.0) * active
    ratio = pl.planning_rps / sls.planning_rps
    per_layer = (fill * ratio + active * math.ceil(ratio) * sls_overhead_s / 3600.0) * pr.serverless_container_hour
    if serverless_all_usd is not None:
        # the layers' shares of each hour, scaled to what serverless bills for the whole demand that hour
        # (serverless.py: containers stay up while in flight reaches them, not just at the mean)
        total = per_layer.sum(axis=0)
        per_layer = per_layer * np.where(total > 0, serverless_all_usd / np.maximum(total, 1e-300), 0.0)
    starts = np.arange(groups) * rpn
    sls_usd = np.add.reduceat(per_layer, starts, axis=0) if groups else np.zeros((0, HOURS_PER_WEEK))
    if warm_container and groups:
        # a restore slower than the TTFT SLO keeps a container warm in every hour the burst carries anything
        sls_usd = np.maximum(sls_usd, pr.serverless_container_hour * active[starts])
    return NodeGroups(
        need=need, needed=active[starts] if groups else np.zeros((0, HOURS_PER_WEEK), bool), serverless_usd=sls_usd,
        reserved_usd_week=HOURS_PER_WEEK * pr.reserved_node_hour, on_demand_node_hour=pr.on_demand_node_hour,
        rise_usd=lead_s / 3600.0 * pr.on_demand_node_hour, rpn=rpn, ratio=ratio,
    )


def schedule_dp(run_usd: np.ndarray, idle_usd: np.ndarray, rise_usd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cheapest on/off schedule per row over the week's hours (rows = node groups, all placements at once).

    A running node costs run_usd that hour; a stopped one costs idle_usd (what serverless pays instead,
    inf where it may not stop); starting costs rise_usd (the cold-start lead billed ahead of the hour).
    Returns (weekly cost per row, running mask). The week is treated as starting stopped, which can only
    overcount one rise at the wrap. Rows are independent (each one's arithmetic is elementwise), so rows
    of many node groups, placements and endpoints stacked into one call give each row's result unchanged:
    the per-hour loop's cost is paid once instead of once per choice."""
    n = run_usd.shape[0]
    # hour-major copies: each step of the loop reads one contiguous row
    run_h = np.ascontiguousarray(run_usd.T)
    idle_h = np.ascontiguousarray(idle_usd.T)
    on = np.full(n, np.inf)
    off = np.zeros(n)
    came_on_from_on = np.empty((HOURS_PER_WEEK, n), bool)
    came_off_from_on = np.empty((HOURS_PER_WEEK, n), bool)
    for h in range(HOURS_PER_WEEK):
        start = off + rise_usd
        np.less_equal(on, start, out=came_on_from_on[h])
        np.less_equal(on, off, out=came_off_from_on[h])
        new_on = np.minimum(on, start)
        new_on += run_h[h]
        off = np.minimum(on, off)
        off += idle_h[h]
        on = new_on
    cost = np.minimum(on, off)
    state = on <= off
    running_h = np.empty((HOURS_PER_WEEK, n), bool)
    for h in range(HOURS_PER_WEEK - 1, -1, -1):
        running_h[h] = state
        state = np.where(state, came_on_from_on[h], came_off_from_on[h])
    return cost, np.ascontiguousarray(running_h.T)


@dataclass
class FloorChoice:
    reserved_nodes: int
    running: np.ndarray  # (G, HOURS_PER_WEEK) node g runs in hour h
    floor: np.ndarray  # (HOURS_PER_WEEK,) replicas ready
    estimated_weekly_usd: float = math.inf  # the DP's own cost of it (its serverless price, not the exact bill)


@dataclass
class FloorProblem:
    """A floor choice up to its schedule DP: the rows `schedule_dp` solves for one placement's node groups.

    Kept apart so the rows of every placement and endpoint go through one `schedule_dp` call
    (`solve_floor_problems`); `finish_floors` then picks the reserved nodes from the solved rows."""

    ng: NodeGroups
    max_replicas: int
    max_nodes: int
    run_usd: np.ndarray  # (G, HOURS_PER_WEEK)
    idle_usd: np.ndarray  # (G, HOURS_PER_WEEK)
    rise_usd: np.ndarray  # (G,)


def floor_problem(
    ng: NodeGroups, *, allow_serverless: bool, max_replicas: int, min_floor: int, burst_cap_containers: int,
    serverless_price_scale: float = 1.0,
) -> FloorProblem | FloorChoice | str:
    """The schedule DP's rows for one placement's node groups, or already the answer: a FloorChoice when there
    is nothing to schedule, a reason when no floor meets the caps. serverless_price_scale multiplies what a
    stopped node's serverless alternative costs (see options.SERVERLESS_PRICE_SCALES)."""
    g_count, rpn = ng.groups, ng.rpn
    max_nodes = max_replicas // rpn
    if g_count == 0:
        return FloorChoice(0, np.zeros((0, HOURS_PER_WEEK), bool), np.full(HOURS_PER_WEEK, min_floor if max_nodes else 0))
    # hours where serverless may not carry a group: not allowed at all, or beyond the burst cap
    if allow_serverless:
        burst_replicas = math.floor(burst_cap_containers / ng.ratio + 1e-9)
        min_nodes = np.ceil(np.maximum(ng.need - burst_replicas, 0) / rpn).astype(int)
    else:
        min_nodes = np.ceil(ng.need / rpn).astype(int)
    if min_floor:
        min_nodes = np.maximum(min_nodes, 1)
    if int(min_nodes.max()) > max_nodes:
        h = int(np.argmax(min_nodes))
        what = f"burst cap {burst_cap_containers} containers" if allow_serverless else "no burst"
        return (f"hour {h} needs {int(min_nodes[h]) * rpn} dedicated replicas ({int(ng.need[h])} at peak, {what}) "
                f"> max_dedicated_replicas={max_replicas}")
    g_index = np.arange(g_count)[:, None]
    forced = g_index < min_nodes[None, :]
    idle = np.where(ng.needed, ng.serverless_usd, 0.0)
    idle = np.where(forced, np.inf, idle * serverless_price_scale)
    run = np.where(g_index < max_nodes, ng.on_demand_node_hour, np.inf) * np.ones((1, HOURS_PER_WEEK))
    return FloorProblem(ng, max_replicas, max_nodes, run, idle, np.full(g_count, ng.rise_usd))


def finish_floors(pb: FloorProblem, dp_cost: np.ndarray, running: np.ndarray) -> FloorChoice | str:
    """Reserved nodes at the bottom (R nodes all week), the rest as the DP scheduled them."""
    ng, rpn = pb.ng, pb.ng.rpn
    best_r, best = 0, math.inf
    suffix = np.concatenate([np.cumsum(dp_cost[::-1])[::-1], [0.0]])
    for r in range(0, min(ng.groups, pb.max_nodes) + 1):
        total = r * ng.reserved_usd_week + suffix[r]
        if total < best - 1e-9:
            best_r, best = r, total
    if not math.isfinite(best):
        return "no schedule meets the caps"
    running = running.copy()
    running[:best_r] = True
    floor = np.minimum(running.sum(axis=0) * rpn, pb.max_replicas)
    return FloorChoice(best_r, running, floor.astype(int), best)


def solve_floor_problems(problems: list[FloorProblem | FloorChoice | str]) -> list[FloorChoice | str]:
    """Each problem's floor choice, the DP run once on all their rows stacked (answers pass through)."""
    todo = [pb for pb in problems if isinstance(pb, FloorProblem)]
    if not todo:
        return [pb for pb in problems if not isinstance(pb, FloorProblem)]
    cost, running = schedule_dp(
        np.concatenate([pb.run_usd for pb in todo]), np.concatenate([pb.idle_usd for pb in todo]),
        np.concatenate([pb.rise_usd for pb in todo]),
    )
    out: list[FloorChoice | str] = []
    row = 0
    for pb in problems:
        if isinstance(pb, FloorProblem):
            g = pb.ng.groups
            out.append(finish_floors(pb, cost[row:row + g], running[row:row + g]))
            row += g
        else:
            out.append(pb)
    return out


def choose_floors(
    ng: NodeGroups, *, allow_serverless: bool, max_replicas: int, min_floor: int, burst_cap_containers: int
) -> FloorChoice | str:
    """Reserved nodes at the bottom, then each node group on the clock where it pays, serverless elsewhere.

    Returns the choice, or a reason why none meets the caps. (The planner solves many at once through
    `floor_problem` and `solve_floor_problems`; this is the same for one.)"""
    pb = floor_problem(ng, allow_serverless=allow_serverless, max_replicas=max_replicas, min_floor=min_floor,
                       burst_cap_containers=burst_cap_containers)
    return solve_floor_problems([pb])[0]


def floor_section(ep: EndpointInputs, floor_by_hour: np.ndarray, reserved_replicas: int, herd: HerdSpec) -> Section[FloorSchedule]:
    """The floor the winner keeps ready by hour, and the clock windows above its base (each rise starts a lead early)."""
    floor_list = [int(x) for x in floor_by_hour]
    base = min(floor_list)
    lead = lead_time_s(ep, herd)
    windows = floor_windows(floor_list, base, lead)
    spec = FloorSchedule(
        timezone=ep.traffic.timezone, replicas_by_hour=tuple(floor_list), base_replicas=base,
        reserved_replicas=reserved_replicas, lead_time_s=round(lead, 1), windows=windows,
    )
    derivs = (Derivation(
        figure="floor_lead_time_s", value=round(lead, 1), unit="s",
        formula=f"new node + pod {ep.cold_starts.new_node_and_pod_s:g} s + start jitter {herd.start_jitter_s} s",
        inputs=("cold_starts.new_node_and_pod_s", "weight_path.shared_path_gb_per_s", "weight_path.per_node_gb_per_s"),
    ),)
    return Section(spec, derivs)
