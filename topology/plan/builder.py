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
from .options import decide, prepare_endpoints, with_platform_share
from .weights import weight_caches


def plan(
    inputs: CostInputs, catalog: Mapping[str, GpuKind] = GPU_KINDS, planning_date: dt.date | None = None
) -> TopologySpec:
    """Plan every endpoint; the fixed platform cost is shared by the endpoints served on it (all but managed API). `planning_date`
    (passed by the caller, never read from the clock) decides whether a promoted rollout still keeps N−1 warm."""
    weekly_fixed = inputs.prices.platform_fixed_usd_per_month / costs.WEEKS_PER_MONTH
    weekly_sls_fixed = inputs.prices.serverless_fixed_usd_per_month / costs.WEEKS_PER_MONTH
    n = len(inputs.endpoints)
    prepared = prepare_endpoints(inputs, catalog)  # the schedule DP runs once for every endpoint
    # both fixed costs are shared by the endpoints that use them: start by assuming every endpoint does, then
    # settle the real counts (each endpoint's bill then adds up to the stack's, and a second user of a fixed
    # cost pays its share, not the whole again)
    sharing = sls_sharing = n
    for _ in range(2 * n + 2):
        share, sls_share = weekly_fixed / max(1, sharing), weekly_sls_fixed / max(1, sls_sharing)
        decided = [decide(ep, with_platform_share(p.options, share, sls_share))
                   for ep, p in zip(inputs.endpoints, prepared)]
        users = sum(1 for win, _, _ in decided if win.uses_platform)
        sls_users = sum(1 for win, _, _ in decided if win.uses_burst)
        if (users == 0 or users == sharing) and (sls_users == 0 or sls_users == sls_sharing):
            break
        sharing, sls_sharing = users or sharing, sls_users or sls_sharing
    plans: list[EndpointPlan] = []
    for ep, p, (win, runner, why) in zip(inputs.endpoints, prepared, decided):
        options = with_platform_share(p.options, share, sls_share)
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
    if any(p.spec.gated for p in plans):  # the cluster, the gateway and monitoring run for any gated endpoint
        by_tier["platform_fixed"] = weekly_fixed
    if any(p.uses_serverless for p in plans):
        by_tier["serverless_fixed"] = weekly_sls_fixed
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
