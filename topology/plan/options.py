"""Stage 3, the options and the decision: managed API, serverless only, dedicated only, floor + burst —
each at its cheapest placement and layer split, costed exactly on the week's profile (whole nodes, warm
minimums, cold starts, tails); each dedicated option carries its share of the cluster's fixed cost; the
cheapest feasible one wins and the reason the runner-up lost is written down.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from .. import costs
from ..catalog import GpuKind
from ..inputs import CostInputs, EndpointInputs
from ..spec import CapacityLayer, HerdSpec, Tier
from ..timebase import HOURS_PER_WEEK, SECONDS_PER_MINUTE
from ..feasibility import dedicated_cap_shortfall
from .demand import Demand, demand_of
from .errors import PlanningError
from .placement import Placement, placements
from .schedule import (
    FloorChoice,
    FloorProblem,
    NodeGroups,
    Prices,
    floor_problem,
    node_groups,
    prices_for,
    solve_floor_problems,
)
from .serverless import buffer_containers, expected_containers, service_time_s
from ..minute_factors import gamma_alpha_for_peak_with_idle
from .limits import SpikeWarm, spike_warm_for
from .timing import herd_limits, lead_time_s, serverless_cold_start_s, ttft_budget_s

# α of the minute factors from the peak factor is a bisection; every option of an endpoint asks for the same one
_alpha_of_peak = functools.lru_cache(maxsize=256)(gamma_alpha_for_peak_with_idle)


def _previous_hour(x: np.ndarray) -> np.ndarray:
    """Each hour's value an hour earlier along the last axis, the week wrapping (np.roll by 1, without its
    generic overhead: the planner calls it thousands of times)."""
    return np.concatenate((x[..., -1:], x[..., :-1]), axis=-1)


@dataclass
class OptionEval:
    tier: Tier
    feasible: bool
    reason: str
    weekly_usd: float = math.inf
    breakdown_weekly: dict[str, float] = field(default_factory=dict)
    placement: Placement | None = None
    reserved_layers: int = 0
    scheduled_layers: int = 0
    floor_by_hour: np.ndarray | None = None
    burst_max_containers: int = 0
    warm_min_by_hour: np.ndarray | None = None
    warm_min_without_spike_by_hour: np.ndarray | None = None  # the same less the spike's (limits.spike_warm_for)
    spike_warm: SpikeWarm | None = None  # the spike's warm containers this option holds (None: none asked for)
    spike_warm_weekly_usd: float = 0.0  # what the spike's warm minimum adds to the serverless bill (the winner's)
    serverless_usd_by_hour: np.ndarray | None = None  # what the serverless tier bills in each hour of the week
    layers: list[CapacityLayer] = field(default_factory=list)

    @property
    def uses_cluster(self) -> bool:
        """Dedicated replicas on the cluster."""
        return self.tier in ("dedicated_only", "floor_plus_burst")

    @property
    def uses_platform(self) -> bool:
        """Served behind the gateway, on the cluster the stack runs (and so a share of its fixed cost): every tier
        but the managed API. A serverless-only endpoint needs the gateway (auth, tenancy, limits) as much as a
        floor does; the program deploys the cluster, the gateway and monitoring for it."""
        return self.tier != "managed_api"

    @property
    def uses_burst(self) -> bool:
        return self.tier in ("serverless_only", "floor_plus_burst")


def serverless_usd_by_hour(
    tier: Tier, ep: EndpointInputs, demand: Demand, pl: Placement, sls: Placement, pr: Prices, floor: np.ndarray,
    warm_min: np.ndarray, max_containers: int, start_hour: int | None = None,
) -> np.ndarray:
    """What the serverless tier bills in each hour: containers alive (from the arrival process and the
    routing, topology.plan.serverless) plus each launch's cold start. start_hour: see expected_containers."""
    if max_containers <= 0 and not warm_min.any():
        return np.zeros(HOURS_PER_WEEK)
    cold = serverless_cold_start_s(ep)
    # the burst schedule starts each rise of the warm minimum the cold start early, in whole minutes
    # (topology/windows.py, as burst.burst_spec deploys it): those minutes bill the containers it launches
    lead_s = math.ceil(cold / SECONDS_PER_MINUTE) * SECONDS_PER_MINUTE
    cap = max(1, min(ep.serverless.max_containers_cap, max_containers))  # the BurstSpec's planned max_containers
    target = sls.planned_inflight  # its target_inputs
    idle = ep.traffic.idle_minute_share
    alpha = _alpha_of_peak(ep.traffic.within_hour_peak_factor, idle)
    window = ep.serverless.scaledown_window_s
    if tier == "serverless_only":
        buffer = buffer_containers(demand.peak_rps, sls.planning_rps, cold, cap)
        # requests spread over the alive containers: the batch one sees sets its service time
        batch = np.full(HOURS_PER_WEEK, float(target))
        for _ in range(2):
            service = service_time_s(ep, sls, batch)
            ch = expected_containers(demand.mean_rps, service, target_inputs=target, buffer_containers=buffer,
                                     scaledown_window_s=window, alpha=alpha, warm_min=warm_min, max_containers=cap,
                                     start_hour=start_hour, cluster_size=ep.traffic.arrival_cluster_size,
                                     startup=(cold, float(service_time_s(ep, sls, 1))),
                                     factor_correlation_s=ep.traffic.within_hour_correlation_s, warm_lead_s=lead_s,
                                     idle_share=idle)
            batch = 1.0 + demand.mean_rps * service / np.maximum(ch.alive, 1.0)
    else:
        # the gateway sends to burst what the floor's replicas × overflow threshold places cannot hold
        # the GatewaySpec's threshold is this, lowered to the admission cap where that is smaller
        # (limits.floor_overflow); the cost model keeps the planned batch
        overflow = pl.planned_inflight
        service = service_time_s(ep, pl, overflow)
        s1 = float(service_time_s(ep, pl, 2) - service_time_s(ep, pl, 1))  # the decode line, per request
        line = (float(service_time_s(ep, pl, 1)) - s1, s1, floor, overflow)
        ch = expected_containers(demand.mean_rps, service, floor_inflight=floor * overflow, target_inputs=target,
                                 scaledown_window_s=window, alpha=alpha, warm_min=warm_min, max_containers=cap,
                                 start_hour=start_hour, cluster_size=ep.traffic.arrival_cluster_size,
                                 floor_service_line=line, startup=(cold, float(service_time_s(ep, sls, 1))),
                                 factor_correlation_s=ep.traffic.within_hour_correlation_s, warm_lead_s=lead_s,
                                 idle_share=idle)
    # billed launch to stop: the time alive, plus each launch's cold start before it serves
    return (ch.alive + ch.launches * cold / 3600.0) * pr.serverless_container_hour


def with_spike_warm_price(ev: OptionEval, ep: EndpointInputs, demand: Demand, sls: Placement, pr: Prices) -> None:
    """Set ev.spike_warm_weekly_usd: its serverless bill less the same without the spike's warm minimum (one more
    run of the cost model, for a tier's winner only)."""
    base_warm, warm = ev.warm_min_without_spike_by_hour, ev.warm_min_by_hour
    if base_warm is None or warm is None or ev.serverless_usd_by_hour is None or np.array_equal(base_warm, warm):
        return
    floor = ev.floor_by_hour if ev.tier == "floor_plus_burst" else np.zeros(HOURS_PER_WEEK, int)
    pl = ev.placement if ev.tier == "floor_plus_burst" and ev.placement is not None else sls
    base = serverless_usd_by_hour(ev.tier, ep, demand, pl, sls, pr, floor, base_warm, ev.burst_max_containers)
    ev.spike_warm_weekly_usd = float(ev.serverless_usd_by_hour.sum() - base.sum())


def dedicated_weekly_usd(pl: Placement, pr: Prices, floor: np.ndarray, reserved_nodes: int,
                         lead_s: float) -> tuple[float, float]:
    """(reserved, on demand) weekly bill of a floor: whole nodes, each node the clock adds billed from lead_s
    before its hour."""
    od_nodes = np.maximum(np.ceil(floor / pl.replicas_per_node).astype(int) - reserved_nodes, 0)
    node_rises = np.maximum(od_nodes - _previous_hour(od_nodes), 0).sum()
    reserved_usd = HOURS_PER_WEEK * reserved_nodes * pr.reserved_node_hour
    return reserved_usd, float((od_nodes.sum() + node_rises * lead_s / 3600.0) * pr.on_demand_node_hour)


def evaluate_floor(
    tier: Tier, ep: EndpointInputs, demand: Demand, pl: Placement, sls: Placement, pr: Prices,
    floor: np.ndarray, reserved_nodes: int, lead_s: float, ng: NodeGroups | None = None,
    running: np.ndarray | None = None,
) -> OptionEval:
    """Exact weekly cost of a floor on the profile: whole nodes, warm minimums, cold starts, tails."""
    rpn = pl.replicas_per_node
    nodes = np.ceil(floor / rpn).astype(int)
    reserved_usd, od_usd = dedicated_weekly_usd(pl, pr, floor, reserved_nodes, lead_s)
    # burst: what the floor cannot carry, in serverless containers
    over_peak = np.maximum(demand.peak_rps - floor * pl.planning_rps, 0.0)
    containers_peak = np.ceil(over_peak / sls.planning_rps - 1e-9)
    burst_active = containers_peak > 0
    cold = serverless_cold_start_s(ep)
    warm_min = np.zeros(HOURS_PER_WEEK, int)
    if burst_active.any() and cold > ttft_budget_s(ep):
        # a restore slower than the TTFT SLO means burst hours keep one container warm
        warm_min = np.where(burst_active, 1, 0)
    if tier == "serverless_only" and not ep.scale_to_zero_allowed:
        warm_min = np.maximum(warm_min, 1)
    warm_base, spike_warm = warm_min, None
    if tier != "dedicated_only" and ep.traffic.spike_warm_hours_fraction > 0:
        # warm for the spike in the protected hours (topology/plan/limits.py): the decision sees its price
        spike_warm = spike_warm_for(ep, demand.peak_rps, floor if tier == "floor_plus_burst" else None,
                                    pl if tier == "floor_plus_burst" else None, sls, cold)
        warm_min = np.maximum(warm_min, spike_warm.containers)
    max_containers = int(containers_peak.max()) if containers_peak.size else 0
    serverless_by_hour = serverless_usd_by_hour(tier, ep, demand, pl, sls, pr, floor, warm_min, max_containers)
    serverless_usd = float(serverless_by_hour.sum())
    scheduled_nodes = int(max(0, nodes.max(initial=0) - reserved_nodes))
    ev = OptionEval(
        tier=tier, feasible=True, reason="", placement=pl, reserved_layers=reserved_nodes * rpn,
        scheduled_layers=scheduled_nodes * rpn, floor_by_hour=floor.astype(int), burst_max_containers=max_containers,
        warm_min_by_hour=warm_min, warm_min_without_spike_by_hour=warm_base, spike_warm=spike_warm,
        serverless_usd_by_hour=serverless_by_hour,
    )
    ev.breakdown_weekly = {"reserved": reserved_usd, "on_demand": float(od_usd), "serverless": serverless_usd}
    ev.weekly_usd = reserved_usd + float(od_usd) + serverless_usd
    if ng is not None and running is not None:
        ev.layers = layers_of(ng, running, reserved_nodes, np.maximum(nodes, reserved_nodes), lead_s, serverless_usd)
    return ev


def layers_of(
    ng: NodeGroups, running: np.ndarray, reserved_nodes: int, nodes_by_hour: np.ndarray, lead_s: float,
    serverless_usd: float,
) -> list[CapacityLayer]:
    """One row per node of the load-duration curve: its duty, its tier, what the plan pays for it, and what
    each tier would cost for it alone.

    What it pays is the option's own bill split by node, so the rows sum to the option's variable cost:
    node g (from 0) runs in the hours the option runs more than g nodes — reserved nodes all week, the
    others on demand in those hours plus the lead billed ahead of each start — and the serverless bill goes
    to the nodes in proportion to the serverless cost of the hours each is needed but not running."""
    out = []
    on = np.arange(ng.groups)[:, None] < nodes_by_hour[None, :]  # (G, HOURS_PER_WEEK)
    carried = ng.needed & ~on
    share = np.where(carried, ng.serverless_usd, 0.0).sum(axis=1)
    if serverless_usd > 0 and share.sum() <= 0:
        share = ng.needed.sum(axis=1).astype(float)  # a warm minimum only: by the hours each node is needed
    share = share / share.sum() if share.sum() > 0 else np.zeros(ng.groups)
    hours_by_group = ng.needed.sum(axis=1)
    rises_by_group = (ng.needed & ~_previous_hour(ng.needed)).sum(axis=1)
    for g in range(ng.groups):
        needed = ng.needed[g]
        hours = int(hours_by_group[g])
        rises = int(rises_by_group[g]) if hours < HOURS_PER_WEEK else 0
        c = {
            "reserved": ng.reserved_usd_week,
            "scheduled_on_demand": hours * ng.on_demand_node_hour + rises * ng.rise_usd,
            "serverless_burst": float(ng.serverless_usd[g][needed].sum()),
        }
        tier = "reserved" if g < reserved_nodes else ("scheduled_on_demand" if running[g].any() else "serverless_burst")
        if g < reserved_nodes:
            paid, runs = ng.reserved_usd_week, HOURS_PER_WEEK
        else:
            runs = int(on[g].sum())
            starts = int((on[g] & ~_previous_hour(on[g])).sum()) if runs < HOURS_PER_WEEK else 0
            paid = (runs + starts * lead_s / 3600.0) * ng.on_demand_node_hour
        burst = serverless_usd * share[g]
        out.append(CapacityLayer(
            index=g + 1, duty_fraction=round(hours / HOURS_PER_WEEK, 4), tier=tier,
            monthly_usd=round(costs.monthly_from_weekly(paid + burst), 2),
            costs_usd_per_month={k: round(costs.monthly_from_weekly(v), 2) for k, v in c.items()},
            runs_fraction=round(runs / HOURS_PER_WEEK, 4),
            serverless_usd_per_month=round(costs.monthly_from_weekly(burst), 2),
        ))
    return out


def better(a: OptionEval, b: OptionEval) -> bool:
    """Cheaper wins; within 1% the placement with more, smaller replicas wins (MIG: isolation and
    redundancy at the same price)."""
    if a.weekly_usd < b.weekly_usd * 0.99:
        return True
    if a.weekly_usd > b.weekly_usd * 1.01:
        return False
    assert a.placement is not None and b.placement is not None  # dedicated options always carry one
    return a.placement.gpu_fraction_per_replica < b.placement.gpu_fraction_per_replica


# The layer DP prices a node's serverless alternative by its share of the hour's serverless bill, which is not
# the exact marginal (containers, tails and launches do not split by layer). So floor + burst runs the DP with
# that price scaled by each of these factors, each schedule it yields is costed exactly, and the cheapest is
# kept: a family from "serverless cheaper than estimated" to "dearer", which always holds the unscaled choice.
# 0.95: pricing the containers' cores and memory (+6% on autocomplete's container) moved its DP at 1.0 to a schedule
# $20 a week dearer, when costed exactly, than one the DP gives at 0.95; the family is densest where the estimate errs.
SERVERLESS_PRICE_SCALES = (1.0, 0.8, 0.95, 1.1, 1.25, 1.5, 2.0)


@dataclass
class FloorCandidate:
    """A dedicated tier at one placement (and, for floor + burst, one serverless price scale): its node
    groups and the floor the schedule DP chooses for them (a FloorProblem until `solve_floor_candidates`
    has run)."""

    tier: Tier
    pl: Placement
    burst_pl: Placement
    pr: Prices
    ng: NodeGroups | None  # None when the caps refuse it before any sizing
    choice: FloorProblem | FloorChoice | str
    serverless_price_scale: float = 1.0


def floor_candidates(
    inp: CostInputs, ep: EndpointInputs, demand: Demand, ded: list[Placement], sls: Placement | None, herd: HerdSpec,
) -> list[FloorCandidate]:
    """Every (dedicated tier, placement) whose floor must be chosen, not yet solved: the planner solves the
    candidates of all endpoints in one schedule DP."""
    if not inp.floor_replicas_allowed or not ded:
        return []
    lead = lead_time_s(ep, herd)
    cold = serverless_cold_start_s(ep)
    sls_overhead = cold + ep.serverless.scaledown_window_s
    burst_pl_of = [sls if sls is not None else pl for pl in ded]
    prices = [prices_for(inp, ep, pl, bpl) for pl, bpl in zip(ded, burst_pl_of)]
    tiers = [t for t in ("dedicated_only", "floor_plus_burst") if t == "dedicated_only" or sls is not None]

    def shortfall(tier: str, pl: Placement, bpl: Placement) -> str | None:
        # refuse from the peak before the O(replicas × 168) work
        return dedicated_cap_shortfall(
            demand.peak_rps, pl.planning_rps, pl.replicas_per_node, ep.max_dedicated_replicas,
            burst_planning_rps=bpl.planning_rps if tier == "floor_plus_burst" else None,
            burst_cap_containers=ep.serverless.max_containers_cap,
        )

    short = {(t, i): shortfall(t, pl, bpl) for t in tiers for i, (pl, bpl) in enumerate(zip(ded, burst_pl_of))}

    sls_all_by_burst: dict[tuple[str, float], np.ndarray] = {}

    def serverless_all(i: int, bpl: Placement, pr: Prices) -> np.ndarray | None:
        # what carrying the whole demand on serverless bills each hour: burst containers at their own full
        # batch (only the floor + burst DP reads the serverless price); the same for every floor placement
        if short.get(("floor_plus_burst", i), "no burst tier") is not None:
            return None
        key = (bpl.label, pr.serverless_container_hour)
        if key not in sls_all_by_burst:
            peak_c = int(np.ceil(demand.peak_rps / bpl.planning_rps - 1e-9).max(initial=0))
            none = np.zeros(HOURS_PER_WEEK, int)
            sls_all_by_burst[key] = serverless_usd_by_hour("floor_plus_burst", ep, demand, bpl, bpl, pr, none, none,
                                                           peak_c)
        return sls_all_by_burst[key]

    # both tiers cut the same demand into the same node groups; only the DP's constraints differ
    groups = [node_groups(demand, pl, bpl, pr, lead, sls_overhead, warm_container=cold > ttft_budget_s(ep),
                          serverless_all_usd=serverless_all(i, bpl, pr))
              if any(short[(t, i)] is None for t in tiers) else None
              for i, (pl, bpl, pr) in enumerate(zip(ded, burst_pl_of, prices))]
    out: list[FloorCandidate] = []
    for tier in tiers:
        burst = tier == "floor_plus_burst"
        for i, (pl, bpl, pr, ng) in enumerate(zip(ded, burst_pl_of, prices, groups)):
            if short[(tier, i)] is not None:
                out.append(FloorCandidate(tier, pl, bpl, pr, ng, short[(tier, i)]))
                continue
            # without a burst the serverless price is unused: one DP
            for scale in SERVERLESS_PRICE_SCALES if burst else (1.0,):
                problem = floor_problem(
                    ng, allow_serverless=burst, max_replicas=ep.max_dedicated_replicas,
                    min_floor=0 if ep.scale_to_zero_allowed else 1,
                    burst_cap_containers=ep.serverless.max_containers_cap, serverless_price_scale=scale,
                )
                out.append(FloorCandidate(tier, pl, bpl, pr, ng, problem, scale))
                if not isinstance(problem, FloorProblem):
                    break  # answered before the DP: the same at every price
    return out


def solve_floor_candidates(candidates: list[FloorCandidate]) -> None:
    """Choose every candidate's floor, the DP run once over all of them."""
    for c, choice in zip(candidates, solve_floor_problems([c.choice for c in candidates])):
        c.choice = choice


def _estimate(c: FloorCandidate) -> float:
    return c.choice.estimated_weekly_usd if isinstance(c.choice, FloorChoice) else math.inf


def options_for(
    inp: CostInputs, ep: EndpointInputs, demand: Demand, ded: list[Placement], sls: Placement | None,
    sls_bad: str, herd: HerdSpec, floors: list[FloorCandidate] | None = None,
) -> list[OptionEval]:
    """Every alternative, each at its cheapest placement and layer split. `floors`: this endpoint's
    solved floor candidates (solved here when not given)."""
    if floors is None:
        floors = floor_candidates(inp, ep, demand, ded, sls, herd)
        solve_floor_candidates(floors)
    out: list[OptionEval] = []
    lead = lead_time_s(ep, herd)
    s = ep.shape
    # managed API
    if ep.managed_api is None:
        out.append(OptionEval("managed_api", False, "no managed API serves this model (custom weights or data rules)"))
    elif ep.managed_api.measured_ttft_p99_ms > ep.slo.ttft_p99_ms:
        out.append(OptionEval(
            "managed_api", False,
            f"API p99 TTFT {ep.managed_api.measured_ttft_p99_ms:g} ms > SLO {ep.slo.ttft_p99_ms:g} ms",
        ))
    else:
        per_req = costs.api_usd_per_request(
            s.input_tokens_mean, s.output_tokens_mean,
            ep.managed_api.usd_per_million_input_tokens, ep.managed_api.usd_per_million_output_tokens,
        )
        weekly = costs.weekly_requests(demand.mean_rps) * per_req
        out.append(OptionEval("managed_api", True, f"{costs.weekly_requests(demand.mean_rps):,.0f} req/week × ${per_req:.6f}",
                              weekly_usd=weekly, breakdown_weekly={"api": weekly}))
    sls_fixed = inp.prices.serverless_fixed_usd_per_month / costs.WEEKS_PER_MONTH
    # serverless only
    if sls is None:
        out.append(OptionEval("serverless_only", False, sls_bad))
    else:
        pr = prices_for(inp, ep, sls, sls)
        ev = evaluate_floor("serverless_only", ep, demand, sls, sls, pr, np.zeros(HOURS_PER_WEEK, int), 0, lead)
        ev.breakdown_weekly["serverless_fixed"] = sls_fixed
        ev.weekly_usd += sls_fixed
        if ev.burst_max_containers > ep.serverless.max_containers_cap:
            ev.feasible, ev.reason = False, (
                f"peak needs {ev.burst_max_containers} containers > serverless.max_containers_cap "
                f"{ep.serverless.max_containers_cap}"
            )
        else:
            ev.reason = f"{sls.label} containers, up to {ev.burst_max_containers}"
            with_spike_warm_price(ev, ep, demand, sls, pr)
        out.append(ev)
    # dedicated only, floor + burst: cheapest placement
    for tier in ("dedicated_only", "floor_plus_burst"):
        if not inp.floor_replicas_allowed:
            out.append(OptionEval(tier, False, f"environment {inp.environment} allows no floor replicas"))
            continue
        if not ded:
            out.append(OptionEval(tier, False, "no dedicated placement meets the SLO and memory"))
            continue
        if tier == "floor_plus_burst" and sls is None:
            out.append(OptionEval(tier, False, f"no burst tier: {sls_bad}"))
            continue
        burst = tier == "floor_plus_burst"
        best: OptionEval | None = None
        best_floor: FloorCandidate | None = None
        why_not: list[str] = []
        # per placement, the cheapest of its candidate schedules by exact weekly cost (the DP at each price
        # scale); across placements, `better`
        by_placement: dict[str, tuple[OptionEval | None, FloorCandidate | None, str]] = {}
        seen: set[tuple[str, int, bytes]] = set()
        bound = math.inf  # the cheapest schedule of this tier costed so far
        # the DP's own estimate first, so the bound is tight early
        for c in sorted((c for c in floors if c.tier == tier), key=_estimate):
            pl, burst_pl, pr, choice = c.pl, c.burst_pl, c.pr, c.choice
            assert not isinstance(choice, FloorProblem), "floor candidates are solved before options_for reads them"
            top, top_c, why = by_placement.get(pl.label, (None, None, ""))
            if isinstance(choice, str):
                by_placement[pl.label] = (top, top_c, why or choice)
                continue
            key = (pl.label, choice.reserved_nodes, choice.floor.tobytes())
            if key in seen:
                continue
            seen.add(key)
            if burst and not choice.floor.any():
                by_placement[pl.label] = (top, top_c, why or "the cheapest mix runs no floor (that is serverless_only; "
                                          f"max_dedicated_replicas {ep.max_dedicated_replicas})")
                continue
            if bound < math.inf:
                # a schedule whose dedicated bill alone is past the cheapest option costed so far by more than
                # `better`'s 1% band cannot win: skip its serverless model (the planner's main cost)
                fixed = sls_fixed if burst else 0.0
                if sum(dedicated_weekly_usd(pl, pr, choice.floor, choice.reserved_nodes, lead)) + fixed > bound / 0.99:
                    continue
            ev = evaluate_floor(tier, ep, demand, pl, burst_pl, pr, choice.floor, choice.reserved_nodes, lead)
            if burst and ev.burst_max_containers == 0:
                by_placement[pl.label] = (top, top_c, why or
                                          "the cheapest floor leaves nothing to burst (that is dedicated_only)")
                continue
            if burst:
                ev.breakdown_weekly["serverless_fixed"] = sls_fixed
                ev.weekly_usd += sls_fixed
                if ev.burst_max_containers > ep.serverless.max_containers_cap:
                    by_placement[pl.label] = (top, top_c, why or f"burst needs {ev.burst_max_containers} containers > "
                                              f"cap {ep.serverless.max_containers_cap}")
                    continue
            if top is None or ev.weekly_usd < top.weekly_usd - 1e-9:
                by_placement[pl.label] = (ev, c, why)
            bound = min(bound, ev.weekly_usd)
        # across placements in the placements' own order (`better` breaks ties within its 1% band by order)
        for label in dict.fromkeys(c.pl.label for c in floors if c.tier == tier and c.pl.label in by_placement):
            ev, c, why = by_placement[label]
            if ev is None:
                why_not.append(f"{label}: {why or 'no feasible schedule'}")
            elif best is None or better(ev, best):
                best, best_floor = ev, c
        if best is None:
            out.append(OptionEval(tier, False, "; ".join(why_not) or "no feasible schedule"))
        else:
            # the layer table only for the placement that won the tier (the losers' are never read)
            assert best_floor is not None and isinstance(best_floor.choice, FloorChoice) and best.floor_by_hour is not None
            rpn = best.placement.replicas_per_node
            ch = best_floor.choice
            nodes = np.maximum(np.ceil(best.floor_by_hour / rpn).astype(int), ch.reserved_nodes)
            if burst:
                with_spike_warm_price(best, ep, demand, best_floor.burst_pl, best_floor.pr)
            # the spike's warm minimum is no node's: the report gives it a row of its own
            best.layers = layers_of(best_floor.ng, ch.running, ch.reserved_nodes, nodes, lead,
                                    best.breakdown_weekly["serverless"] - best.spike_warm_weekly_usd)
            reserved_nodes, scheduled_nodes = best.reserved_layers // rpn, best.scheduled_layers // rpn
            best.reason = (
                f"{best.placement.label}, {rpn} replica(s)/node: {reserved_nodes} reserved node(s)"
                + (f" + up to {scheduled_nodes} on the clock" if scheduled_nodes else "")
                + (f", burst up to {best.burst_max_containers} containers at the planned peak" if burst else "")
            )
            out.append(best)
    return out


@dataclass
class Prepared:
    """Everything about an endpoint that does not depend on how the fixed platform cost is shared."""

    demand: Demand
    ok: list[Placement]
    sls: Placement | None
    herd: HerdSpec
    options: list[OptionEval]  # dedicated options without their platform share


def prepare_endpoints(inp: CostInputs, catalog: Mapping[str, GpuKind]) -> list[Prepared]:
    """Every endpoint's options, the floor candidates of all endpoints solved in one schedule DP.

    Endpoints alike in everything but their name and their model's served name (copies per region or tenant,
    under one model name or several) are prepared once: nothing here reads either name
    except the errors, and the first copy in order raises the same error the others would."""
    first: dict[str, int] = {}
    rep = [first.setdefault(ep.model_dump_json(exclude={"name": True, "model": {"name"}}), i)
           for i, ep in enumerate(inp.endpoints)]
    todo = sorted(set(rep))
    staged = {i: _stage_endpoint(inp, inp.endpoints[i], catalog) for i in todo}
    solve_floor_candidates([c for i in todo for c in staged[i].floors])
    prepared = {i: _options_of(inp, inp.endpoints[i], staged[i]) for i in todo}
    return [prepared[i] if i == j else _copy_prepared(prepared[j]) for i, j in enumerate(rep)]


def _copy_prepared(p: Prepared) -> Prepared:
    """A copy's own options (their dicts and lists; the arrays, never written after planning, are shared)."""
    return dataclasses.replace(p, options=[
        dataclasses.replace(o, breakdown_weekly=dict(o.breakdown_weekly), layers=list(o.layers)) for o in p.options])


def prepare_endpoint(inp: CostInputs, ep: EndpointInputs, catalog: Mapping[str, GpuKind]) -> Prepared:
    st = _stage_endpoint(inp, ep, catalog)
    solve_floor_candidates(st.floors)
    return _options_of(inp, ep, st)


@dataclass
class _Staged:
    demand: Demand
    ok: list[Placement]
    sls: Placement | None
    sls_bad: str
    herd: HerdSpec
    floors: list[FloorCandidate]


def _stage_endpoint(inp: CostInputs, ep: EndpointInputs, catalog: Mapping[str, GpuKind]) -> _Staged:
    """An endpoint up to its schedule DP: demand, placements, the serverless placement, floor candidates."""
    demand = demand_of(ep)
    ok, bad = placements(ep, catalog)
    if not ok:
        reasons = "; ".join(f"{b.label}: {b.reason}" for b in bad)
        raise PlanningError(f"endpoint {ep.name}: no GPU or MIG slice can serve it at the SLO — {reasons}")
    sls_candidates = [p for p in ok if p.gpu_kind == ep.serverless.gpu_kind and p.mig_profile is None]
    sls = sls_candidates[0] if sls_candidates else None
    sls_bad = next(
        (f"{b.label}: {b.reason}" for b in bad if b.label.startswith(ep.serverless.gpu_kind) and " " not in b.label),
        f"serverless.gpu_kind={ep.serverless.gpu_kind} cannot serve the model",
    )
    herd = herd_limits(ep)
    return _Staged(demand, ok, sls, sls_bad, herd, floor_candidates(inp, ep, demand, ok, sls, herd))


def _options_of(inp: CostInputs, ep: EndpointInputs, st: _Staged) -> Prepared:
    return Prepared(st.demand, st.ok, st.sls, st.herd,
                    options_for(inp, ep, st.demand, st.ok, st.sls, st.sls_bad, st.herd, st.floors))


def with_platform_share(options: list[OptionEval], share_weekly: float,
                        serverless_share_weekly: float | None = None) -> list[OptionEval]:
    """Options served on the platform carry their share of its fixed cost (the same for every placement); with
    `serverless_share_weekly`, options with a serverless tier carry that share of the serverless plan's fixed cost
    in place of the whole of it (options_for prices each endpoint's alone), so the endpoints' bills add up to
    the stack's."""
    out = []
    for o in options:
        if o.feasible and o.uses_platform:
            o = dataclasses.replace(o, weekly_usd=o.weekly_usd + share_weekly,
                                    breakdown_weekly={**o.breakdown_weekly, "platform_fixed": share_weekly})
        if serverless_share_weekly is not None and o.feasible and "serverless_fixed" in o.breakdown_weekly:
            whole = o.breakdown_weekly["serverless_fixed"]
            o = dataclasses.replace(o, weekly_usd=o.weekly_usd - whole + serverless_share_weekly,
                                    breakdown_weekly={**o.breakdown_weekly, "serverless_fixed": serverless_share_weekly})
        out.append(o)
    return out


def decide(ep: EndpointInputs, options: list[OptionEval]) -> tuple[OptionEval, OptionEval | None, str]:
    feasible = sorted((o for o in options if o.feasible), key=lambda o: o.weekly_usd)
    if not feasible:
        raise PlanningError(
            f"endpoint {ep.name}: no option is feasible — "
            + "; ".join(f"{o.tier}: {o.reason}" for o in options)
        )
    win = feasible[0]
    runner = feasible[1] if len(feasible) > 1 else None
    if runner is None:
        infeasible = [o for o in options if not o.feasible]
        why = "the only feasible option; " + "; ".join(f"{o.tier}: {o.reason}" for o in infeasible)
    else:
        diff = costs.monthly_from_weekly(runner.weekly_usd - win.weekly_usd)
        why = (f"{runner.tier} costs ${costs.monthly_from_weekly(runner.weekly_usd):,.0f}/month, "
               f"${diff:,.0f} more than {win.tier} (${costs.monthly_from_weekly(win.weekly_usd):,.0f})")
    return win, runner, why


def mig_decision(ep: EndpointInputs, options: list[OptionEval], ok: list[Placement], win: OptionEval) -> str:
    migs = [p for p in ok if p.mig_profile]
    if not migs:
        return "whole GPUs: the model and its KV at the product's max context fit no MIG slice of the measured GPUs"
    ded = [o for o in options if o.uses_cluster and o.feasible]
    if not ded or win.placement is None or not win.uses_cluster:
        return f"no dedicated pool; slices that would fit: {', '.join(p.label for p in migs)}"
    chosen = win.placement
    est = " (slice capacity estimated from its bandwidth/SM share; measure it)" if chosen.estimated else ""
    if chosen.mig_profile:
        return (f"MIG {chosen.mig_profile}: {chosen.replicas_per_gpu} isolated replicas per {chosen.gpu_kind}, "
                f"{chosen.planning_rps:.2f} req/s each — cheaper than whole GPUs for this load{est}")
    return (f"whole {chosen.gpu_kind}: cheaper than the fitting slices "
            f"({', '.join(p.mig_profile or '' for p in migs)}) for this load")
