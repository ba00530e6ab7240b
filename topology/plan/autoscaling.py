"""The dedicated floor's autoscaling: queue signal (requests waiting per replica), thresholds from the cold
start and the steepest ramp, a scale-up step capped by the herd of weight loads, and the burst-backlog
trigger that scales the floor when the burst tier is saturated."""

from __future__ import annotations

import math

import numpy as np

from ..inputs import EndpointInputs
from ..spec import AutoscalingSpec, BurstSpec, Derivation, FloorSchedule, HerdSpec
from .demand import Demand
from .limits import admission
from .placement import Placement
from .section import Section


def autoscaling_section(
    ep: EndpointInputs, demand: Demand, ded_pl: Placement, floor: FloorSchedule, herd: HerdSpec, warn_headroom: bool,
) -> Section[AutoscalingSpec]:
    """`warn_headroom`: the floor alone carries the ramp (dedicated_only), so too little headroom is worth a warning."""
    ramp_rps_per_min = float(np.max(np.diff(np.concatenate([demand.peak_rps, demand.peak_rps[:1]])))) / 60.0
    ramp_rps_per_min = max(ramp_rps_per_min, 0.0)
    warm = ep.cold_starts.pod_on_warm_node_s
    peak = float(demand.peak_rps.max())
    required_headroom = (ramp_rps_per_min / 60.0 * warm) / peak if peak > 0 else 0.0
    step = max(1, min(herd.step_replicas, math.ceil(ramp_rps_per_min / 60.0 * warm / ded_pl.planning_rps) + 1))
    max_rep = min(ep.max_dedicated_replicas, max(floor.replicas_by_hour) + herd.step_replicas)
    target, target_formula = queue_target(ep, ded_pl)
    autoscaling = AutoscalingSpec(
        target_waiting_per_replica=target, min_replicas=floor.base_replicas, max_replicas=max_rep, polling_interval_s=15,
        scale_up_pods_per_period=step, scale_up_period_s=60,
        scale_up_stabilization_s=int(min(600, max(30, warm))),
        scale_down_stabilization_s=int(min(3600, max(600, 2 * ep.cold_starts.new_node_and_pod_s))),
        scale_down_pods_per_period=1, scale_down_period_s=120,
        required_headroom_fraction=round(required_headroom, 4),
        steepest_ramp_requests_per_s_per_min=round(ramp_rps_per_min, 4),
    )
    derivs = (
        Derivation(
            figure="target_waiting_per_replica", value=target, unit="requests", formula=target_formula,
            inputs=("slo.ttft_p99_ms", "slo.inter_token_p99_ms", "shape.input_tokens_p99", "engine.prefill_tokens_per_s"),
        ),
        Derivation(
            figure="required_headroom_fraction", value=autoscaling.required_headroom_fraction, unit="fraction",
            formula=f"steepest ramp {ramp_rps_per_min:.3f} req/s/min ÷ 60 × pod cold start {warm:g} s ÷ peak {peak:.2f} req/s",
            inputs=("traffic.hourly_mean_requests_per_s", "traffic.within_hour_peak_factor", "cold_starts.pod_on_warm_node_s"),
        ),
        Derivation(
            figure="scale_up_pods_per_period", value=step, unit="pods/60 s",
            formula=f"min(herd step {herd.step_replicas}, ⌈ramp × cold start / {ded_pl.planning_rps:.3f}⌉ + 1)",
            inputs=("weight_path.acceptable_load_s", "cold_starts.pod_on_warm_node_s"),
        ),
    )
    warnings: tuple[str, ...] = ()
    if required_headroom > ep.headroom_fraction and warn_headroom:
        warnings = (
            f"{ep.name}: the steepest ramp needs {required_headroom:.0%} headroom over a pod cold start "
            f"({warm:g} s) but the plan keeps {ep.headroom_fraction:.0%}: queue builds until new replicas are ready",
        )
    return Section(autoscaling, derivs, warnings)


def queue_target(ep: EndpointInputs, ded_pl: Placement) -> tuple[float, str]:
    """Requests waiting per replica the queue trigger aims at, planned with the gateway's admission control.

    Every floor endpoint runs it (gateway.admission_*): a request that cannot start within the bounded wait w
    gets 429, so it never joins the queue the trigger counts (the gateway's floor queue + vLLM's waiting).
    Little's law bounds that queue: waiting = admitted rate × mean wait ≤ μ × w, with μ what a replica held at
    the admission cap serves. Just past saturation (a spike the floor must grow for) the admitted wait spreads
    about evenly over [0, w], so a saturated replica averages μ·w/2 waiting, and one poll's reading swings
    around that. The HPA adds replicas only while every poll in its scale-up stabilization window asks for
    more (it acts on the lowest), so the target is half that average: ⌊μ·w/4⌋, at least 1. A target above
    μ·w/2 would almost never fire: the spike would be shed for its whole length and no replica added (prod
    guard before: target 3 against μ·w/2 = 2.97; its spike drill's polls read 0.1–2.6 waiting per replica).
    The floor of 1 is a single waiting request per replica: below saturation the queue rarely holds one."""
    adm = admission(ep, ded_pl, 0.0)
    mu_w = adm.saturated_rps * adm.queue_timeout_s
    target = float(max(1, math.floor(mu_w / 4)))
    return target, (f"max(1, ⌊μ {adm.saturated_rps:.3f} req/s (a replica at the admission cap of "
                    f"{adm.inflight_per_replica}) × bounded wait {adm.queue_timeout_s:g} s / 4⌋): the queue at "
                    f"saturation averages μ·w/2 = {mu_w / 2:.2f} (Little's law, waits spread over [0, w]); "
                    f"the target is half that so every poll of the stabilization window clears it")


def with_burst_backlog(autoscaling: AutoscalingSpec, burst: BurstSpec) -> Section[AutoscalingSpec]:
    """floor_plus_burst: beyond the burst's planned capacity the floor scales up as well."""
    backlog = float(burst.max_containers * burst.target_inputs)
    derivs = (Derivation(
        figure="burst_backlog_threshold", value=backlog, unit="requests in flight to burst",
        formula=f"max_containers {burst.max_containers} × target_inputs {burst.target_inputs}: beyond the burst's "
        "planned capacity the floor scales up as well",
        inputs=("serverless.max_containers_cap", "traffic.hourly_mean_requests_per_s"),
    ),)
    return Section(autoscaling.model_copy(update={"burst_backlog_threshold": backlog}), derivs)
