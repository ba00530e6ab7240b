"""The serverless (Modal) tier: the whole endpoint when serverless_only, the overflow above the floor when
floor_plus_burst — container size, caps, warm minimums by the clock, timeouts and the Volume it reads."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ..catalog import GpuKind
from ..inputs import CostInputs, EndpointInputs
from ..spec import BurstSpec, Derivation
from ..timebase import HOURS_PER_WEEK
from ..windows import hour_windows
from .demand import Demand
from .options import OptionEval
from .placement import Placement
from .section import Section
from .timing import longest_request_s, serverless_cold_start_s
from .weights import bucket_name


def burst_spec(
    inp: CostInputs, ep: EndpointInputs, demand: Demand, sls: Placement, win: OptionEval,
    catalog: Mapping[str, GpuKind],
) -> BurstSpec:
    cold = serverless_cold_start_s(ep)
    warm = win.warm_min_by_hour if win.warm_min_by_hour is not None else np.zeros(HOURS_PER_WEEK, int)
    always = bool(warm.min() >= 1)
    schedule = () if always else hour_windows(warm > 0, 1, cold)
    max_c = max(1, min(ep.serverless.max_containers_cap, win.burst_max_containers))
    ramp_rps_per_s = max(0.0, float(np.max(np.diff(demand.peak_rps)))) / 3600.0
    buffer = min(max_c, math.ceil(ramp_rps_per_s * cold / sls.planning_rps)) if win.tier == "serverless_only" else 0
    kind = catalog[sls.gpu_kind]
    return BurstSpec(
        app_name=f"{inp.project}-{inp.environment}-{ep.name}-burst", environment=inp.environment,
        gpu=kind.modal_gpu if sls.gpus_per_replica == 1 else f"{kind.modal_gpu}:{sls.gpus_per_replica}",
        gpu_kind=sls.gpu_kind, gpus_per_container=sls.gpus_per_replica,
        planning_requests_per_s=round(sls.planning_rps, 4), region=ep.serverless.region,
        min_containers=1 if always else 0,
        max_containers=max_c, buffer_containers=buffer, scaledown_window_s=ep.serverless.scaledown_window_s,
        startup_timeout_s=int(min(3600, max(600, 3 * ep.cold_starts.serverless_no_snapshot_s))),
        timeout_s=longest_request_s(ep, sls), max_inputs=sls.usable_concurrency,
        target_inputs=max(1, math.floor(sls.usable_concurrency * sls.planning_utilisation)),
        enable_memory_snapshot=ep.serverless.gpu_snapshots, enable_gpu_snapshot=ep.serverless.gpu_snapshots,
        volume_name=f"{inp.project}-{inp.environment}-{ep.name}-weights", weights_region=ep.serverless.weights_region,
        weights_bucket=bucket_name(inp, ep.serverless.weights_region), min_containers_schedule=schedule,
        schedule_timezone=ep.traffic.timezone,
    )


def burst_section(
    inp: CostInputs, ep: EndpointInputs, demand: Demand, pl: Placement, sls: Placement, win: OptionEval,
    catalog: Mapping[str, GpuKind],
) -> Section[BurstSpec]:
    """`pl` is the floor's placement (the serverless one when serverless_only), for the derivation's text."""
    burst = burst_spec(inp, ep, demand, sls, win, catalog)
    derivs = (Derivation(
        figure="burst_max_containers", value=burst.max_containers, unit="containers",
        formula=f"⌈max over hours (peak − floor × {pl.planning_rps:.3f}) / {sls.planning_rps:.3f}⌉, cap "
        f"{ep.serverless.max_containers_cap}",
        inputs=("traffic.hourly_mean_requests_per_s", "traffic.within_hour_peak_factor", "serverless.max_containers_cap"),
    ),)
    return Section(burst, derivs)
