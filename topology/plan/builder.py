"""plan(inputs, catalog): every endpoint through the stages, the cluster's fixed cost shared by the endpoints
that use it, and the fleet's totals."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Mapping

from .. import costs
from ..catalog import GPU_KINDS, GpuKind
from ..inputs import CostInputs
from ..spec import SPEC_VERSION, TopologySpec
from .endpoint import EndpointPlan, build_endpoint_spec
from .options import decide, prepare_endpoint, with_platform_share
from .weights import weight_caches


def plan(
    inputs: CostInputs, catalog: Mapping[str, GpuKind] = GPU_KINDS, planning_date: dt.date | None = None
) -> TopologySpec:
    """Plan every endpoint; the fixed platform cost is shared by the endpoints that use the cluster. `planning_date`
    (passed by the caller, never read from the clock) decides whether a promoted rollout still keeps N−1 warm."""
    weekly_fixed = inputs.prices.platform_fixed_usd_per_month / costs.WEEKS_PER_MONTH
    n = len(inputs.endpoints)
    prepared = [prepare_endpoint(inputs, ep, catalog) for ep in inputs.endpoints]
    sharing = n  # start by assuming every endpoint shares the cluster, then settle the real count
    for _ in range(n + 1):
        share = weekly_fixed / max(1, sharing)
        decided = [decide(ep, with_platform_share(p.options, share)) for ep, p in zip(inputs.endpoints, prepared)]
        users = sum(1 for win, _, _ in decided if win.uses_cluster)
        if users == 0 or users == sharing:
            break
        sharing = users
    plans: list[EndpointPlan] = []
    for ep, p, (win, runner, why) in zip(inputs.endpoints, prepared, decided):
        options = with_platform_share(p.options, share)
        plans.append(build_endpoint_spec(inputs, ep, p.demand, p.ok, p.sls, p.herd, options, win, runner, why, catalog,
                                         planning_date))
    warnings: list[str] = []
    by_tier: dict[str, float] = {"reserved": 0.0, "on_demand": 0.0, "serverless": 0.0, "api": 0.0,
                                 "platform_fixed": 0.0, "serverless_fixed": 0.0}
    for p in plans:
        for k, v in p.weekly_by_tier.items():
            if k in ("platform_fixed", "serverless_fixed"):
                continue
            by_tier[k] = by_tier.get(k, 0.0) + v
        warnings += list(p.spec.warnings)
    if any(p.uses_dedicated for p in plans):
        by_tier["platform_fixed"] = weekly_fixed
    if any(p.uses_serverless for p in plans):
        by_tier["serverless_fixed"] = inputs.prices.serverless_fixed_usd_per_month / costs.WEEKS_PER_MONTH
    monthly = {k: round(costs.monthly_from_weekly(v), 2) for k, v in by_tier.items()}
    return TopologySpec(
        spec_version=SPEC_VERSION, project=inputs.project, environment=inputs.environment,
        prices_as_of=inputs.prices.prices_as_of,
        inputs_sha256=hashlib.sha256(inputs.model_dump_json().encode()).hexdigest(),
        cluster_region=inputs.cluster_region,
        node_pools=tuple(pool for p in plans for pool in p.pools), weight_caches=weight_caches(inputs),
        endpoints=tuple(p.spec for p in plans), monthly_usd_by_tier=monthly,
        monthly_usd_total=round(sum(monthly.values()), 2), warnings=tuple(warnings),
    )
