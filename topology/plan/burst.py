"""The serverless (Modal) tier: the whole endpoint when serverless_only, the overflow above the floor when
floor_plus_burst — container size, caps, warm minimums by the clock, timeouts and the Volume it reads."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .. import costs
from ..catalog import GpuKind
from ..inputs import CostInputs, EndpointInputs
from ..names import burst_app_name, burst_volume_name
from ..spec import BurstSpec, Derivation
from ..timebase import HOURS_PER_WEEK
from ..windows import hour_windows, level_windows
from .demand import Demand
from .options import OptionEval
from .placement import Placement
from .container_price import ContainerPrice, container_price
from .section import Section
from .serverless import buffer_containers
from .limits import SpikeWarm, non_streamed_burst_rule, spike_headroom, spike_warm_derivation, step_token_budget
from .timing import longest_request_s, serverless_cold_start_s
from .weights import bucket_name


def _spike(inp: CostInputs, ep: EndpointInputs, demand: Demand, pl: Placement, sls: Placement, win: OptionEval):
    floor = win.floor_by_hour if win.floor_by_hour is not None and win.tier == "floor_plus_burst" else None
    floor_rps = (np.asarray(floor, dtype=float) * pl.planning_rps if floor is not None
                 else np.zeros(HOURS_PER_WEEK))
    usd_s = container_price(inp, ep, sls.gpus_per_replica).usd_per_s
    return spike_headroom(ep, demand.peak_rps, floor_rps, sls, usd_s, serverless_cold_start_s(ep))


def _spike_warm(win: OptionEval) -> SpikeWarm:
    """The spike's warm containers the winning option was costed with (options.evaluate_floor), none if not asked."""
    if win.spike_warm is not None:
        return win.spike_warm
    z = np.zeros(HOURS_PER_WEEK, int)
    return SpikeWarm(z, z, z.astype(bool), (0.0,) * 8)


def burst_spec(
    inp: CostInputs, ep: EndpointInputs, demand: Demand, sls: Placement, win: OptionEval,
    catalog: Mapping[str, GpuKind], pl: Placement | None = None,
) -> BurstSpec:
    cold = serverless_cold_start_s(ep)
    warm = win.warm_min_by_hour if win.warm_min_by_hour is not None else np.zeros(HOURS_PER_WEEK, int)
    sw = _spike_warm(win)
    if sw.protected.any():
        # the option's warm minimum already holds the spike's (options.evaluate_floor priced it): one level a hour
        min_c, schedule = level_windows(warm, cold)
    else:
        always = bool(warm.min() >= 1)
        min_c, schedule = (1 if always else 0), (() if always else hour_windows(warm > 0, 1, cold))
    spike = _spike(inp, ep, demand, pl or sls, sls, win)
    ns = non_streamed_burst_rule(ep, sls, has_floor=win.tier == "floor_plus_burst",
                                 cold_start_s=serverless_cold_start_s(ep))
    # headroom for the spike the endpoint must absorb: the cap is free until used (only running containers bill)
    max_c = max(1, min(ep.serverless.max_containers_cap, max(win.burst_max_containers, spike.containers)),
                int(sw.containers.max(initial=0)))
    # the buffer as it ran under the planned peak's cap (at most that cap − 1 beyond the containers in use): the
    # spike headroom raises the cap, and must not turn a buffer the planned cap held back into billed containers
    # (the serverless cost model bills the same buffer: serverless.buffer_containers)
    planned_max = max(1, min(ep.serverless.max_containers_cap, win.burst_max_containers))
    buffer = (buffer_containers(demand.peak_rps, sls.planning_rps, cold, planned_max)
              if win.tier == "serverless_only" else 0)
    kind = catalog[sls.gpu_kind]
    price = container_price(inp, ep, sls.gpus_per_replica)
    return BurstSpec(
        app_name=burst_app_name(inp.project, inp.environment, ep.name), environment=inp.environment,
        gpu=kind.modal_gpu if sls.gpus_per_replica == 1 else f"{kind.modal_gpu}:{sls.gpus_per_replica}",
        gpu_kind=sls.gpu_kind, gpus_per_container=sls.gpus_per_replica,
        cpu_cores=price.cpu_cores, memory_mib=price.memory_mib, usd_per_container_hour=round(price.usd_per_hour, 4),
        planning_requests_per_s=round(sls.planning_rps, 4), region=ep.serverless.region,
        min_containers=min_c,
        max_containers=max_c, buffer_containers=buffer, scaledown_window_s=ep.serverless.scaledown_window_s,
        startup_timeout_s=int(min(3600, max(600, 3 * ep.cold_starts.serverless_no_snapshot_s))),
        timeout_s=longest_request_s(ep, sls), max_inputs=sls.usable_concurrency,
        max_num_batched_tokens=step_token_budget(sls, sls.usable_concurrency),
        target_inputs=sls.planned_inflight,
        enable_memory_snapshot=ep.serverless.gpu_snapshots, enable_gpu_snapshot=ep.serverless.gpu_snapshots,
        # the revision the endpoint serves; under a rollout endpoint.py renames it to the served engine's
        volume_name=burst_volume_name(inp.project, inp.environment, ep.name, ep.model.revision),
        weights_region=ep.serverless.weights_region,
        weights_bucket=bucket_name(inp, ep.serverless.weights_region), min_containers_schedule=schedule,
        schedule_timezone=ep.traffic.timezone, non_streamed_rule=ns.rule, non_streamed_max_tokens=ns.max_tokens,
        spike_containers=spike.containers,
        spike_warm_hours_of_week=tuple(int(h) for h in np.flatnonzero(sw.protected)),
        spike_warm_usd_per_month=round(costs.monthly_from_weekly(win.spike_warm_weekly_usd), 2),
    )


def _container_price_derivation(inp: CostInputs, ep: EndpointInputs, p: ContainerPrice) -> Derivation:
    pr, s = inp.prices, ep.serverless
    gpu_s = pr.serverless_usd_per_gpu_second[s.gpu_kind]
    return Derivation(
        figure="burst_usd_per_container_hour", value=round(p.usd_per_hour, 4), unit="USD/h",
        formula=f"({p.gpus} GPU × ${gpu_s:g}/s + {p.cpu_cores:g} cores × ${pr.serverless_usd_per_cpu_core_second:g}/s + "
        f"{p.memory_mib / 1024:.2f} GiB × ${pr.serverless_usd_per_memory_gib_second:g}/s) × "
        f"{s.price_multiplier:g} region × 3600 = ${p.usd_per_hour:.4f}/h; cores and memory "
        f"{p.host_share:.1%} of it",
        inputs=("prices.serverless_usd_per_gpu_second", "prices.serverless_usd_per_cpu_core_second",
                "prices.serverless_usd_per_memory_gib_second", "serverless.cpu_cores_per_container",
                "serverless.memory_gib_per_container", "model.weights_gb", "serverless.region_price_multiplier"),
    )


def burst_section(
    inp: CostInputs, ep: EndpointInputs, demand: Demand, pl: Placement, sls: Placement, win: OptionEval,
    catalog: Mapping[str, GpuKind],
) -> Section[BurstSpec]:
    """`pl` is the floor's placement (the serverless one when serverless_only), for the derivation's text."""
    burst = burst_spec(inp, ep, demand, sls, win, catalog, pl)
    spike = _spike(inp, ep, demand, pl, sls, win)
    ns = non_streamed_burst_rule(ep, sls, has_floor=win.tier == "floor_plus_burst",
                                 cold_start_s=serverless_cold_start_s(ep))
    warnings: tuple[str, ...] = ()
    if spike.containers > ep.serverless.max_containers_cap:
        warnings = (f"{ep.name}: a {ep.traffic.spike_factor:g}× spike needs {spike.containers} burst containers > "
                    f"serverless.max_containers_cap {ep.serverless.max_containers_cap}: beyond the cap the gateway "
                    "sheds (429 after its bounded wait)",)
    if ep.serverless.gpu_snapshots and sls.gpus_per_replica > 1:
        extra_s = ep.cold_starts.serverless_no_snapshot_s - ep.cold_starts.serverless_snapshot_restore_s
        warnings += (f"{ep.name}: GPU snapshots on a {sls.gpus_per_replica}-GPU container: Modal's GPU memory "
                     "snapshots are 'generally incompatible with multi-GPU code' (docs/guide/memory-snapshots, "
                     "Limitations), and vLLM's tensor parallelism is a worker process per GPU; the plan takes "
                     f"cold_starts.serverless_snapshot_restore_s={ep.cold_starts.serverless_snapshot_restore_s:g} s, "
                     "so measure it on this container — if the restore falls back to a boot, each launch takes "
                     f"serverless_no_snapshot_s={ep.cold_starts.serverless_no_snapshot_s:g} s: {extra_s:g} s more "
                     f"(${extra_s * burst.usd_per_container_hour / 3600:,.2f} a launch) and a request waiting on a "
                     "launch misses the TTFT SLO; or set serverless.gpu_snapshots: false",)
    derivs = (Derivation(
        figure="burst_max_containers", value=burst.max_containers, unit="containers",
        formula=f"min(cap {ep.serverless.max_containers_cap}, max(⌈max over hours (peak − floor × "
        f"{pl.planning_rps:.3f}) / {sls.planning_rps:.3f}⌉ = {win.burst_max_containers}, the "
        f"{ep.traffic.spike_factor:g}× spike's {spike.containers})), at least the spike's warm minimum "
        f"{int(_spike_warm(win).containers.max(initial=0))}",
        inputs=("traffic.hourly_mean_requests_per_s", "traffic.within_hour_peak_factor", "traffic.spike_factor",
                "serverless.max_containers_cap"),
    ), _container_price_derivation(inp, ep, container_price(inp, ep, sls.gpus_per_replica)), spike.derivation,
        ns.derivation)
    sw = _spike_warm(win)
    if sw.protected.any():
        derivs += (spike_warm_derivation(ep, sw, sls, serverless_cold_start_s(ep), burst.spike_warm_usd_per_month),)
    return Section(burst, derivs, warnings)
