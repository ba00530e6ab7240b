"""Small, explicit inputs for planner tests: the doctrine's worked example as an endpoint."""

from __future__ import annotations

import copy
from typing import Any


def office_profile(peak: float, night: float, weekend: float) -> list[float]:
    """Weekday 9-to-5 shape with a morning ramp; weekends flat."""
    shape = {6: 0.2, 7: 0.45, 8: 0.8, 9: 1, 10: 1, 11: 1, 12: 0.85, 13: 1, 14: 1, 15: 1, 16: 0.9, 17: 0.6, 18: 0.35}
    out: list[float] = []
    for d in range(7):
        for h in range(24):
            if d < 5:
                out.append(max(night, peak * shape.get(h, 0.0)))
            else:
                out.append(weekend if 9 <= h < 18 else night)
    return out


ENDPOINT: dict[str, Any] = {
    "name": "chat",
    "model": {
        "name": "llama-3.3-70b-instruct", "revision": "rev1", "parameters_billion": 70, "precision": "fp8",
        "weights_gb": 70, "tokenizer": "llama3", "base_model": "llama-3.3-70b", "architecture_max_context_tokens": 131072,
        "kv_cache_mib_per_token": 0.3125,
    },
    "shape": {
        "input_tokens_mean": 2000, "input_tokens_p99": 8000, "output_tokens_mean": 400, "output_tokens_p99": 1500,
        "product_max_context_tokens": 16384, "max_tokens": 2048,
    },
    "traffic": {"timezone": "America/New_York", "hourly_mean_requests_per_s": office_profile(10, 0.5, 1), "within_hour_peak_factor": 1.5},
    "slo": {"ttft_p99_ms": 2000, "inter_token_p99_ms": 100},
    "engine": [{"gpu_kind": "H100-80GB", "gpus_per_replica": 2, "decode_tokens_per_s": 920, "prefill_tokens_per_s": 30000,
                "max_concurrent_sequences": 64}],
    "cold_starts": {"new_node_and_pod_s": 600, "pod_on_warm_node_s": 180, "serverless_snapshot_restore_s": 20,
                    "serverless_no_snapshot_s": 180},
    "weight_path": {"shared_path_gb_per_s": 10, "per_node_gb_per_s": 2.5},
    "serverless": {"gpu_kind": "H100-80GB", "weights_region": "us-east-1", "max_containers_cap": 60},
    "managed_api": {"provider": "together", "usd_per_million_input_tokens": 0.88, "usd_per_million_output_tokens": 0.88,
                    "measured_ttft_p99_ms": 900},
    "prefix_cache_hit_fraction": 0.3,
    "tenants": ["acme", "globex"],
    "max_dedicated_replicas": 60,
}

INPUTS: dict[str, Any] = {
    "environment": "prod",
    "floor_replicas_allowed": True,
    "cluster_region": "us-east-1",
    "weights_source_bucket": "acme-models",
    "regions": [{"name": "us-east-1"}],
    "prices": {
        "prices_as_of": "2026-10-04",
        "dedicated_on_demand_usd_per_gpu_hour": {"H100-80GB": 2.69},
        "reserved_discount_fraction": 0.35,
        "serverless_usd_per_gpu_second": {"H100-80GB": 0.001097},
        "platform_fixed_usd_per_month": 1500,
    },
    "endpoints": [ENDPOINT],
}


def inputs_dict(**endpoint_overrides: Any) -> dict[str, Any]:
    d = copy.deepcopy(INPUTS)
    d["endpoints"][0].update(copy.deepcopy(endpoint_overrides))
    return d


def set_path(d: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """Set 'endpoints.0.slo.ttft_p99_ms' style paths in a copy."""
    d = copy.deepcopy(d)
    cur: Any = d
    parts = path.split(".")
    for p in parts[:-1]:
        cur = cur[int(p)] if isinstance(cur, list) else cur[p]
    last = parts[-1]
    if isinstance(cur, list):
        cur[int(last)] = value
    else:
        cur[last] = value
    return d
