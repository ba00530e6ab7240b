"""How long things take: serverless cold starts, the herd of weight loads, the lead ahead of a demand rise,
and the longest a single request may run."""

from __future__ import annotations

import math

from ..inputs import EndpointInputs
from ..spec import HerdSpec
from .placement import Placement


def serverless_cold_start_s(ep: EndpointInputs) -> float:
    s = ep.serverless
    return ep.cold_starts.serverless_snapshot_restore_s if s.gpu_snapshots else ep.cold_starts.serverless_no_snapshot_s


def ttft_budget_s(ep: EndpointInputs) -> float:
    return ep.slo.ttft_p99_ms / 1000.0


def lead_time_s(ep: EndpointInputs, herd: HerdSpec) -> float:
    """How far ahead of a demand rise a clock window starts: a new node + pod, plus the start jitter."""
    return ep.cold_starts.new_node_and_pod_s + herd.start_jitter_s


def herd_limits(ep: EndpointInputs) -> HerdSpec:
    """N replicas pulling the same weights through one path: how many load at full speed, step cap, jitter."""
    w, path = ep.model.weights_gb, ep.weight_path
    full = max(1, int(path.shared_path_gb_per_s // path.per_node_gb_per_s))

    def load_s(n: int) -> float:
        return w * n / min(path.shared_path_gb_per_s, n * path.per_node_gb_per_s)

    step = 1
    while step < 64 and load_s(step + 1) <= path.acceptable_load_s:
        step += 1
    jitter = max(5, round(w / path.shared_path_gb_per_s * (step - 1))) if step > full else 5
    return HerdSpec(
        weights_gb=w, shared_path_gb_per_s=path.shared_path_gb_per_s, per_node_gb_per_s=path.per_node_gb_per_s,
        concurrent_loads_at_full_speed=full, step_replicas=step, step_load_s=round(load_s(step), 1),
        start_jitter_s=int(jitter),
    )


def longest_request_s(ep: EndpointInputs, pl: Placement) -> int:
    """Longest one request may run: prefill of a max-context prompt plus max_tokens at the inter-token SLO,
    doubled for margin, plus a minute for queueing and cold starts (never under 5 minutes)."""
    prefill_max = ep.shape.product_max_context_tokens / pl.prefill_tokens_per_s
    t = math.ceil(prefill_max + ep.shape.max_tokens * ep.slo.inter_token_p99_ms / 1000.0 * 2 + 60)
    return int(min(86400, max(300, t)))
