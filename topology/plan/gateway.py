"""What the HAProxy gateway enforces for one endpoint: timeouts from the SLO and the longest request, the body
limit, retries, overflow to burst and tenants (the canary and shadow come from topology/plan/rollout.py)."""

from __future__ import annotations

import math

from ..gateway_timing import heartbeat_interval_s
from ..inputs import EndpointInputs
from ..names import tenant_api_key_secret_key, tenant_cache_salt_secret_key
from ..spec import BurstSpec, GatewaySpec, TenantSpec
from .limits import admission, floor_overflow
from .placement import Placement
from .timing import longest_request_s, serverless_cold_start_s

RETRY_BUDGET_FRACTION = 0.10
OVERHEAD_BYTES_PER_TOKEN = 8  # JSON-escaped text: ~4 chars/token, escapes up to 2×
BODY_SLACK_BYTES = 64 * 1024


def gateway_spec(ep: EndpointInputs, pl: Placement, burst: BurstSpec | None) -> GatewaySpec:
    s = ep.shape
    cold = serverless_cold_start_s(ep) if burst is not None else 0.0
    prefill_max = s.product_max_context_tokens * (1 - ep.prefix_cache_hit_fraction) / pl.prefill_tokens_per_s
    first_byte = int(min(300, max(30, math.ceil(ep.slo.ttft_p99_ms / 1000.0 + cold + prefill_max))))
    inter_chunk = int(min(30, max(10, math.ceil(2 * prefill_max + 5))))
    multi = len(ep.tenants) > 1
    tenants = tuple(
        TenantSpec(name=t, api_key_secret_key=tenant_api_key_secret_key(t),
                   cache_salt_secret_key=tenant_cache_salt_secret_key(t) if multi else None)
        for t in ep.tenants
    )
    adm = admission(ep, pl, cold if burst is not None else 0.0)
    return GatewaySpec(
        overflow_inflight_per_replica=floor_overflow(adm, pl),
        first_byte_timeout_s=first_byte, max_request_s=longest_request_s(ep, pl), inter_chunk_timeout_s=inter_chunk,
        sse_heartbeat_s=heartbeat_interval_s(),
        max_request_body_bytes=s.product_max_context_tokens * OVERHEAD_BYTES_PER_TOKEN + BODY_SLACK_BYTES,
        max_tokens=s.max_tokens, retry_budget_fraction=RETRY_BUDGET_FRACTION, max_retries=1,
        sticky_hash_header="X-Session-Id", cache_isolation="cache_salt" if multi else "single_tenant",
        tenants=tenants, canary=None,  # canary and shadow: set by the rollout section
        admission_queue_timeout_s=adm.queue_timeout_s, admission_inflight_per_floor_replica=adm.inflight_per_replica,
        admission_burst_inflight=burst.max_containers * burst.max_inputs if burst is not None else 0,
        retry_after_s=adm.retry_after_s, admission_queue_per_floor_replica=adm.queue_per_replica,
    )
