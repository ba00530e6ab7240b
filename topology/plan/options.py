"""Stage 3, the options and the decision: managed API, serverless only, dedicated only, floor + burst —
each at its cheapest placement and layer split, costed exactly on the week's profile (whole nodes, warm
minimums, cold starts, tails); each dedicated option carries its share of the cluster's fixed cost; the
cheapest feasible one wins and the reason the runner-up lost is written down.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from .. import costs
from ..catalog import GpuKind
from ..inputs import CostInputs, EndpointInputs
from ..spec import CapacityLayer, HerdSpec, Tier
from ..timebase import HOURS_PER_WEEK
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
    serverless_alive_container_hours,
    solve_floor_problems,
)
from .timing import herd_limits, lead_time_s, serverless_cold_start_s, ttft_budget_s


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
    layers: list[CapacityLayer] = field(default_factory=list)

    @property
    def uses_cluster(self) -> bool:
        """Dedicated replicas on the cluster (and so a share of its fixed cost)."""
        return self.tier in ("dedicated_only", "floor_plus_burst")

    @property
    def uses_burst(self) -> bool:
        return self.tier in ("serverless_only", "floor_plus_burst")


def evaluate_floor(
    tier: Tier, ep: EndpointInputs, demand: Demand, pl: Placement, sls: Placement, pr: Prices,
    floor: np.ndarray, reserved_nodes: int, lead_s: float, ng: NodeGroups | None = None,
    running: np.ndarray | None = None,
) -> OptionEval:
    """Exact weekly cost of a floor on the profile: whole nodes, warm minimums, cold starts, tails."""
    rpn = pl.replicas_per_node
    nodes = np.ceil(floor / rpn).astype(int)
    od_nodes = np.maximum(nodes - reserved_nodes, 0)
    # each node added by the clock starts lead_s before its hour and is billed from then
    node_rises = np.maximum(od_nodes - np.roll(od_nodes, 1), 0).sum()
    reserved_usd = HOURS_PER_WEEK * reserved_nodes * pr.reserved_node_hour
    od_usd = (od_nodes.sum() + node_rises * lead_s / 3600.0) * pr.on_demand_node_hour
    # burst: what the floor cannot carry, in serverless containers
    over_mean = np.maximum(demand.mean_rps - floor * pl.planning_rps, 0.0)
    over_peak = np.maximum(demand.peak_rps - floor * pl.planning_rps, 0.0)
    containers_mean = over_mean / sls.planning_rps
    containers_peak = np.ceil(over_peak / sls.planning_rps - 1e-9)
    burst_active = containers_peak > 0
    cold = serverless_cold_start_s(ep)
    warm_min = np.zeros(HOURS_PER_WEEK, int)
    if burst_active.any() and cold > ttft_budget_s(ep):
        # a restore slower than the TTFT SLO means burst hours keep one container warm
        warm_min = np.where(burst_active, 1, 0)
    if tier == "serverless_only" and not ep.scale_to_zero_allowed:
        warm_min = np.maximum(warm_min, 1)
    sls_hours = np.maximum(serverless_alive_container_hours(over_mean, containers_mean, containers_peak,
                                                            ep.serverless.scaledown_window_s), warm_min)
    overhead = containers_peak * cold / 3600.0  # each start bills its cold start
    serverless_usd = float((sls_hours.sum() + overhead.sum()) * pr.serverless_container_hour)
    max_containers = int(containers_peak.max()) if containers_peak.size else 0
    scheduled_nodes = int(max(0, nodes.max(initial=0) - reserved_nodes))
    ev = OptionEval(
        tier=tier, feasible=True, reason="", placement=pl, reserved_layers=reserved_nodes * rpn,
        scheduled_layers=scheduled_nodes * rpn, floor_by_hour=floor.astype(int), burst_max_containers=max_containers,
        warm_min_by_hour=warm_min,
    )
    ev.breakdown_weekly = {"reserved": reserved_usd, "on_demand": float(od_usd), "serverless": serverless_usd}
    ev.weekly_usd = reserved_usd + float(od_usd) + serverless_usd
    if ng is not None and running is not None:
        ev.layers = layers_of(ng, running, reserved_nodes)
    return ev


def layers_of(ng: NodeGroups, running: np.ndarray, reserved_nodes: int) -> list[CapacityLayer]:
    """One row per node of the load-duration curve: its duty, the tier it went to, what each tier would cost."""
    out = []
    hours_by_group = ng.needed.sum(axis=1)
    rises_by_group = (ng.needed & ~np.roll(ng.needed, 1, axis=1)).sum(axis=1)
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
        out.append(CapacityLayer(
            index=g + 1, duty_fraction=round(hours / HOURS_PER_WEEK, 4), tier=tier,
            monthly_usd=round(costs.monthly_from_weekly(c[tier]), 2),
            costs_usd_per_month={k: round(costs.monthly_from_weekly(v), 2) for k, v in c.items()},
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


@dataclass
class FloorCandidate:
    """A dedicated tier at one placement: its node groups and the floor the schedule DP chooses for them
    (a FloorProblem until `solve_floor_candidates` has run)."""

    tier: Tier
    pl: Placement
    burst_pl: Placement
    pr: Prices
    ng: NodeGroups | None  # None when the caps refuse it before any sizing
    choice: FloorProblem | FloorChoice | str


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
    # both tiers cut the same demand into the same node groups; only the DP's constraints differ
    groups = [node_groups(demand, pl, bpl, pr, lead, sls_overhead, warm_container=cold > ttft_budget_s(ep))
              if any(short[(t, i)] is None for t in tiers) else None
              for i, (pl, bpl, pr) in enumerate(zip(ded, burst_pl_of, prices))]
    out: list[FloorCandidate] = []
    for tier in tiers:
        for i, (pl, bpl, pr, ng) in enumerate(zip(ded, burst_pl_of, prices, groups)):
            if short[(tier, i)] is not None:
                out.append(FloorCandidate(tier, pl, bpl, pr, ng, short[(tier, i)]))
                continue
            problem = floor_problem(
                ng, allow_serverless=tier == "floor_plus_burst", max_replicas=ep.max_dedicated_replicas,
                min_floor=0 if ep.scale_to_zero_allowed else 1, burst_cap_containers=ep.serverless.max_containers_cap,
            )
            out.append(FloorCandidate(tier, pl, bpl, pr, ng, problem))
    return out


def solve_floor_candidates(candidates: list[FloorCandidate]) -> None:
    """Choose every candidate's floor, the DP run once over all of them."""
    for c, choice in zip(candidates, solve_floor_problems([c.choice for c in candidates])):
        c.choice = choice


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
        for c in floors:
            if c.tier != tier:
                continue
            pl, burst_pl, pr, choice = c.pl, c.burst_pl, c.pr, c.choice
            assert not isinstance(choice, FloorProblem), "floor candidates are solved before options_for reads them"
            if isinstance(choice, str):
                why_not.append(f"{pl.label}: {choice}")
                continue
            ev = evaluate_floor(tier, ep, demand, pl, burst_pl, pr, choice.floor, choice.reserved_nodes, lead)
            if burst and ev.burst_max_containers == 0:
                why_not.append(f"{pl.label}: the cheapest floor leaves nothing to burst (that is dedicated_only)")
                continue
            if burst and not choice.floor.any():
                why_not.append(f"{pl.label}: the cheapest mix runs no floor (that is serverless_only)")
                continue
            if burst:
                ev.breakdown_weekly["serverless_fixed"] = sls_fixed
                ev.weekly_usd += sls_fixed
                if ev.burst_max_containers > ep.serverless.max_containers_cap:
                    why_not.append(f"{pl.label}: burst needs {ev.burst_max_containers} containers > cap "
                                   f"{ep.serverless.max_containers_cap}")
                    continue
            if best is None or better(ev, best):
                best, best_floor = ev, c
        if best is None:
            out.append(OptionEval(tier, False, "; ".join(why_not) or "no feasible schedule"))
        else:
            # the layer table only for the placement that won the tier (the losers' are never read)
            assert best_floor is not None and isinstance(best_floor.choice, FloorChoice)
            best.layers = layers_of(best_floor.ng, best_floor.choice.running, best_floor.choice.reserved_nodes)
            rpn = best.placement.replicas_per_node
            reserved_nodes, scheduled_nodes = best.reserved_layers // rpn, best.scheduled_layers // rpn
            best.reason = (
                f"{best.placement.label}, {rpn} replica(s)/node: {reserved_nodes} reserved node(s)"
                + (f" + up to {scheduled_nodes} on the clock" if scheduled_nodes else "")
                + (f", burst up to {best.burst_max_containers} containers" if burst else "")
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
    """Every endpoint's options, the floor candidates of all endpoints solved in one schedule DP."""
    staged = [_stage_endpoint(inp, ep, catalog) for ep in inp.endpoints]
    solve_floor_candidates([c for st in staged for c in st.floors])
    return [_options_of(inp, ep, st) for ep, st in zip(inp.endpoints, staged)]


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


def with_platform_share(options: list[OptionEval], share_weekly: float) -> list[OptionEval]:
    """Dedicated options carry their share of the cluster's fixed cost (the same for every placement)."""
    out = []
    for o in options:
        if o.feasible and o.uses_cluster:
            o = dataclasses.replace(o, weekly_usd=o.weekly_usd + share_weekly,
                                    breakdown_weekly={**o.breakdown_weekly, "platform_fixed": share_weekly})
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
