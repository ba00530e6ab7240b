"""One endpoint's spec from the decision: each section built by its own stage, in the order the report reads
them (economics, capacity, floor, autoscaling and node pools, engine, burst, gateway)."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .. import costs
from ..catalog import GpuKind
from ..inputs import CostInputs, EndpointInputs
from ..names import burst_volume_name
from ..pod_resources import catalog_instance, floor_pod_resources
from ..spec import AlternativeCost, AutoscalingSpec, BurstSpec, Derivation, EndpointSpec, HerdSpec, NodePoolSpec
from ..timebase import HOURS_PER_WEEK
from .autoscaling import autoscaling_section, with_burst_backlog
from .burst import burst_section
from .demand import Demand
from .economics import economics_section
from .engine import engine_section
from .gateway import gateway_spec
from .limits import admission, kv_at_p99_prompt, token_gap_p99
from .nodepools import node_pools
from .options import OptionEval, mig_decision
from .placement import Placement, capacity_section, replica_capacity
from .rollout import rollout_section
from .schedule import floor_section
from .section import Section
from .timing import serverless_cold_start_s


@dataclass
class EndpointPlan:
    spec: EndpointSpec
    pools: list[NodePoolSpec]
    weekly_by_tier: dict[str, float]
    uses_dedicated: bool
    uses_serverless: bool


def _alternatives(options: list[OptionEval]) -> tuple[AlternativeCost, ...]:
    return tuple(
        AlternativeCost(
            option=o.tier, feasible=o.feasible,
            monthly_usd=round(costs.monthly_from_weekly(o.weekly_usd), 2) if o.feasible else None,
            reason=o.reason,
            breakdown_usd={k: round(costs.monthly_from_weekly(v), 2) for k, v in o.breakdown_weekly.items()},
        )
        for o in options
    )


def _pod_resources_section(pl: Placement, catalog: Mapping[str, GpuKind]) -> Section:
    """CPU and memory of each floor pod, cut from its node's instance (Guaranteed QoS where it fits)."""
    res, derivs, warnings = floor_pod_resources(
        catalog_instance(catalog[pl.gpu_kind], pl.instance_type), pl.replicas_per_node, pl.gpus_per_replica)
    return Section(res, tuple(derivs), tuple(warnings))


def build_endpoint_spec(
    inp: CostInputs, ep: EndpointInputs, demand: Demand, ok: list[Placement], sls: Placement | None,
    herd: HerdSpec, options: list[OptionEval], win: OptionEval, runner: OptionEval | None, why: str,
    catalog: Mapping[str, GpuKind], planning_date: dt.date | None = None,
) -> EndpointPlan:
    s, slo = ep.shape, ep.slo
    warnings: list[str] = []
    derivs: list[Derivation] = []

    def take(section):  # collect a section's derivations and warnings in build order; return its value
        derivs.extend(section.derivations)
        warnings.extend(section.warnings)
        return section.value

    ded_pl = win.placement if win.uses_cluster else None
    # the placement whose figures describe the endpoint: the dedicated one, else the serverless one
    pl = ded_pl or sls or ok[0]
    econ = take(economics_section(inp, ep, demand, ok, pl))
    cap = take(capacity_section(ep, pl))
    floor_by_hour = win.floor_by_hour if win.floor_by_hour is not None else np.zeros(HOURS_PER_WEEK, int)
    if not win.uses_cluster:
        floor_by_hour = np.zeros(HOURS_PER_WEEK, int)
    floor = take(floor_section(ep, floor_by_hour, win.reserved_layers if ded_pl else 0, herd))
    autoscaling: AutoscalingSpec | None = None
    pools: list[NodePoolSpec] = []
    if ded_pl is not None:
        autoscaling = take(autoscaling_section(ep, demand, ded_pl, floor, herd, warn_headroom=win.tier == "dedicated_only"))
    engine = take(engine_section(ep, pl))
    burst: BurstSpec | None = None
    if win.uses_burst and sls is not None:
        burst = take(burst_section(inp, ep, demand, pl, sls, win, catalog))
    if autoscaling is not None and burst is not None and win.tier == "floor_plus_burst":
        autoscaling = take(with_burst_backlog(autoscaling, burst))
    gateway = gateway_spec(ep, pl, burst)
    pod_res = None
    if ded_pl is not None:
        pod_res = take(_pod_resources_section(ded_pl, catalog))
    rollout = None
    if ep.rollout is not None:
        ro = rollout_section(inp, ep, ded_pl, engine, gateway.overflow_inflight_per_replica, planning_date,
                             floor_by_hour=floor_by_hour,
                             reserved_nodes=win.reserved_layers // ded_pl.replicas_per_node if ded_pl else 0)
        derivs.extend(ro.derivations)
        warnings.extend(ro.warnings)
        rollout, engine = ro.spec, ro.served_engine
        gateway = gateway.model_copy(update={"canary": ro.canary, "shadow": ro.shadow})
        if burst is not None:  # the burst serves the served engine's weights, from that revision's own volume
            burst = burst.model_copy(update={"volume_name": burst_volume_name(
                inp.project, inp.environment, ep.name, engine.model_revision)})
    if ded_pl is not None and autoscaling is not None:
        # the rollout's pods (the candidate's, the warm previous version's) run on the floor's pools beside the
        # replicas KEDA may scale to: the on-demand pool's cap has room for them
        extra = 0
        if rollout is not None:
            extra = rollout.candidate_replicas + (rollout.previous.replicas if rollout.previous is not None
                                                  and rollout.previous.active else 0)
        pools = node_pools(inp, ep, ded_pl, win.reserved_layers, autoscaling.max_replicas + extra, catalog)
    derivs.extend(admission(ep, pl, serverless_cold_start_s(ep) if burst is not None else 0.0).derivations)
    if ded_pl is not None:
        kv = kv_at_p99_prompt(ep, ded_pl, gateway.overflow_inflight_per_replica if burst is not None
                              else gateway.admission_inflight_per_floor_replica)
        derivs.append(kv.derivation)
        if kv.warning:
            warnings.append(kv.warning)
        gap = token_gap_p99(ep, ded_pl, ded_pl.planned_inflight)
        derivs.append(gap.derivation)
        if gap.warning:
            warnings.append(gap.warning)
    spec = EndpointSpec(
        name=ep.name, model_name=ep.model.name, model_revision=engine.model_revision, tier=win.tier,
        runner_up=runner.tier if runner else None, why_runner_up_lost=why, alternatives=_alternatives(options),
        economics=econ, capacity=cap, node_pools=tuple(p.name for p in pools),
        layers=tuple(win.layers) if ded_pl else (), floor=floor, autoscaling=autoscaling, herd=herd,
        engine=engine, burst=burst,
        burst_capacity=replica_capacity(sls, ep.headroom_fraction) if burst is not None and sls is not None else None,
        gateway=gateway, mig_decision=mig_decision(ep, options, ok, win),
        pod_cold_start_s=ep.cold_starts.pod_on_warm_node_s, node_cold_start_s=ep.cold_starts.new_node_and_pod_s,
        serverless_cold_start_s=serverless_cold_start_s(ep),
        slo_ttft_p99_ms=slo.ttft_p99_ms, slo_inter_token_p99_ms=slo.inter_token_p99_ms,
        planned_prefix_cache_hit_fraction=ep.prefix_cache_hit_fraction, planned_input_tokens_p99=s.input_tokens_p99,
        longest_request_s=gateway.max_request_s, drain_grace_s=gateway.max_request_s + 15,
        startup_budget_s=math.ceil(1.5 * ep.cold_starts.pod_on_warm_node_s + herd.start_jitter_s), pod_resources=pod_res,
        monthly_usd=round(costs.monthly_from_weekly(win.weekly_usd), 2), derivations=tuple(derivs),
        warnings=tuple(warnings), rollout=rollout,
    )
    return EndpointPlan(spec, pools, dict(win.breakdown_weekly), ded_pl is not None, burst is not None)
