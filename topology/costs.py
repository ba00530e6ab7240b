"""Serving economics by the GPU-time-per-request method (never a guessed aggregate throughput).

GPU-seconds per request = gpus_per_replica × (output_tokens / decode_tok_s + input_tokens × (1 − prefix_hit) / prefill_tok_s)

Worked example (the doctrine's): 70B FP8 on one H100, 2,000 in / 400 out, 460 decode tok/s, 15,000 prefill tok/s
→ 400/460 + 2000/15000 = 0.870 + 0.133 = 1.00 GPU-s; at $2.50/GPU-h → $0.00069/request at saturation;
API at $0.90/M × 2,400 tokens = $0.00216 → break-even duty cycle = 0.00069/0.00216 ≈ 32%.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .timebase import HOURS_PER_WEEK, SECONDS_PER_HOUR

HOURS_PER_MONTH = 730.0  # 8,760 h per year / 12: the cloud providers' billing month
WEEKS_PER_MONTH = HOURS_PER_MONTH / HOURS_PER_WEEK


def gpu_seconds_per_request(
    input_tokens: float,
    output_tokens: float,
    decode_tokens_per_s: float,
    prefill_tokens_per_s: float,
    prefix_cache_hit_fraction: float = 0.0,
    gpus_per_replica: int = 1,
) -> float:
    """GPU-seconds one request costs a replica running at saturation."""
    replica_s = output_tokens / decode_tokens_per_s + input_tokens * (1.0 - prefix_cache_hit_fraction) / prefill_tokens_per_s
    return gpus_per_replica * replica_s


def dedicated_usd_per_request(gpu_s_per_request: float, usd_per_gpu_hour: float) -> float:
    """$/request when the GPU is busy all the time (saturation)."""
    return gpu_s_per_request * usd_per_gpu_hour / SECONDS_PER_HOUR


def api_usd_per_request(
    input_tokens: float, output_tokens: float, usd_per_million_input: float, usd_per_million_output: float
) -> float:
    """$/request on a managed API, input and output billed separately (prefix hits are not discounted)."""
    return (input_tokens * usd_per_million_input + output_tokens * usd_per_million_output) / 1e6


def break_even_duty_cycle(dedicated_usd_per_request_at_saturation: float, api_usd_per_request_: float) -> float:
    """Sustained busy share above which a dedicated GPU is cheaper than the API (may exceed 1: never)."""
    if api_usd_per_request_ <= 0:
        return math.inf
    return dedicated_usd_per_request_at_saturation / api_usd_per_request_


MIB_PER_GIB = 1024
BYTES_PER_GIB = 2**30


def serverless_container_resources(cpu_cores: float | None, memory_gib: float | None, gpus: int,
                                   weights_gb: float) -> tuple[float, int]:
    """(physical cores, MiB of host memory) one serverless container reserves: the inputs where given, else 2 + its
    GPUs (vLLM's documented minimum: the API server, the engine core and one worker per GPU) and the served weights
    (held in host memory by a level-1 sleep before a snapshot), rounded up to whole MiB as Modal's `memory=` takes."""
    cores = float(cpu_cores) if cpu_cores is not None else 2.0 + gpus
    gib = float(memory_gib) if memory_gib is not None else weights_gb * 1e9 / BYTES_PER_GIB
    return cores, int(math.ceil(gib * MIB_PER_GIB - 1e-9))


def serverless_container_usd_per_s(gpu_usd_per_s: float, gpus: float, cpu_cores: float, cpu_usd_per_core_s: float,
                                   memory_mib: int, memory_usd_per_gib_s: float, region_multiplier: float) -> float:
    """What one running serverless container bills a second: its GPUs, its cores and its memory, all times the region
    multiplier (Modal: the multiplier applies to GPU, CPU and memory alike, docs/guide/region-selection).

    Worked example: one H100 at $0.001097/s, 3 cores at $0.0000131, 65,536 MiB (64 GiB) at $0.00000222/GiB, pinned
    at 1.5× → (0.001097 + 0.0000393 + 0.00014208) × 1.5 = $0.00191757/s = $6.9033/h, against $5.9238/h for the GPU
    alone (+16.5%)."""
    return (gpu_usd_per_s * gpus + cpu_cores * cpu_usd_per_core_s
            + memory_mib / MIB_PER_GIB * memory_usd_per_gib_s) * region_multiplier


def serverless_premium(serverless_usd_per_gpu_second: float, on_demand_usd_per_gpu_hour: float) -> float:
    """How many times dearer a serverless GPU-second is than an on-demand one."""
    return serverless_usd_per_gpu_second * SECONDS_PER_HOUR / on_demand_usd_per_gpu_hour


def serverless_break_even_busy_hours_per_day(premium: float) -> float:
    """Dedicated pays 24 h/day; serverless pays only busy hours × premium → break-even at 24 / premium."""
    return 24.0 / premium


def weekly_requests(hourly_mean_requests_per_s: Sequence[float]) -> float:
    return sum(hourly_mean_requests_per_s) * SECONDS_PER_HOUR


def monthly_from_weekly(weekly_usd: float) -> float:
    return weekly_usd * WEEKS_PER_MONTH


def cyclic_runs(active: Sequence[bool]) -> list[tuple[int, int]]:
    """Maximal runs of True in a cyclic week, as (start_hour, length). A run may wrap past hour 167."""
    n = len(active)
    if all(active):
        return [(0, n)]
    if not any(active):
        return []
    # start scanning just after an inactive hour so no run is split by the wrap
    first_off = next(i for i in range(n) if not active[i])
    runs: list[tuple[int, int]] = []
    i = 0
    while i < n:
        h = (first_off + 1 + i) % n
        if active[h]:
            length = 0
            while i < n and active[(first_off + 1 + i) % n]:
                length += 1
                i += 1
            runs.append((h, length))
        else:
            i += 1
    return runs
