"""Stage 1, placement and capacity: where one replica runs and how much it carries.

For each measured GPU kind (whole GPUs) and each MIG slice the model fits (weights + KV for one sequence at
the product's maximum context): the replica's KV capacity, its decode line t(b) = t_min + b·k, the batch the
inter-token SLO allows, and the highest utilisation that keeps TTFT p99 within the SLO (M/M/c waiting on the
replica's sequence slots, Erlang C), never above 1/(1+headroom). Also the spec's `ReplicaCapacity` of a
placement and the capacity warnings.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .. import costs
from ..catalog import GpuKind, smallest_instance
from ..inputs import EndpointInputs
from ..spec import Derivation, ReplicaCapacity
from .errors import PlanningError
from .section import Section

GPU_MEMORY_UTILIZATION = 0.90  # vLLM --gpu-memory-utilization; the rest is CUDA graphs, activations, fragmentation
ACTIVATION_OVERHEAD_GB_PER_GPU = 1.0  # non-KV, non-weight memory inside the utilisation budget
GB_PER_MIB = 1.048576e-3
P99 = 0.99


@dataclass(frozen=True)
class Placement:
    gpu_kind: str
    mig_profile: str | None
    gpus_per_replica: int
    replicas_per_gpu: int
    decode_tokens_per_s: float  # effective, at usable concurrency
    prefill_tokens_per_s: float
    measured_max_seqs: int
    usable_concurrency: int
    memory_gb: float  # per replica
    kv_capacity_tokens: float
    decode_step_floor_s: float
    saturated_rps: float
    slo_utilisation: float
    planning_utilisation: float
    planning_rps: float
    gpu_s_per_request: float
    estimated: bool  # MIG capacity derived from the slice's share, not measured
    instance_type: str
    gpus_per_node: int
    local_nvme_gb: int

    @property
    def planned_inflight(self) -> int:
        """Requests in flight a replica or container is planned at: the serverless target_inputs, the floor's
        batch under the gateway's overflow threshold (at least 1)."""
        return max(1, math.floor(self.usable_concurrency * self.planning_utilisation))

    @property
    def label(self) -> str:
        return f"{self.gpu_kind} {self.mig_profile}" if self.mig_profile else (
            f"{self.gpu_kind}×{self.gpus_per_replica}" if self.gpus_per_replica > 1 else self.gpu_kind
        )

    @property
    def gpu_fraction_per_replica(self) -> float:
        return self.gpus_per_replica / self.replicas_per_gpu

    @property
    def replicas_per_node(self) -> int:
        return max(1, (self.gpus_per_node * self.replicas_per_gpu) // self.gpus_per_replica)

    @property
    def decode_step_s_per_sequence(self) -> float:
        """k of the decode line, recovered from the effective rate usable / (t_min + usable·k)."""
        t_min = self.decode_step_floor_s
        return max(0.0, (self.usable_concurrency / self.decode_tokens_per_s - t_min) / self.usable_concurrency)


@dataclass(frozen=True)
class Infeasible:
    label: str
    reason: str


_LOG_FACT = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, 8193, dtype=float)))])


def erlang_c(servers: int, offered_load: float) -> float:
    """Probability an arrival waits (M/M/c), from Erlang B computed in log space (stable for large c)."""
    if offered_load <= 0:
        return 0.0
    if offered_load >= servers:
        return 1.0
    k = np.arange(servers + 1, dtype=float)
    logs = k * math.log(offered_load) - _LOG_FACT[: servers + 1]
    top = logs.max()
    erlang_b = math.exp(logs[-1] - top) / float(np.exp(logs - top).sum())
    rho = offered_load / servers
    return erlang_b / (1.0 - rho * (1.0 - erlang_b))


def p99_wait_s(servers: int, saturated_rps: float, utilisation: float) -> float:
    """p99 wait for a sequence slot: P(W > t) = C(c, A)·exp(−μ(1−ρ)t) with μ the replica's saturated rate."""
    c_wait = erlang_c(servers, utilisation * servers)
    if c_wait <= 1.0 - P99:
        return 0.0
    return math.log(c_wait / (1.0 - P99)) / (saturated_rps * (1.0 - utilisation))


@functools.lru_cache(maxsize=4096)
def slo_utilisation(servers: int, saturated_rps: float, wait_budget_s: float) -> float:
    """Highest utilisation (≤ 0.98) whose p99 slot wait stays within the budget (bisection).

    Cached: 31 Erlang C evaluations each, and the endpoints of a fleet that share a model, engine and SLO
    (copies per region or tenant) ask the same question; the answer is a pure function of the arguments."""
    lo, hi = 0.0, 0.98
    if p99_wait_s(servers, saturated_rps, hi) <= wait_budget_s:
        return hi
    for _ in range(30):
        mid = (lo + hi) / 2
        if p99_wait_s(servers, saturated_rps, mid) <= wait_budget_s:
            lo = mid
        else:
            hi = mid
    return lo


def placement_for(
    ep: EndpointInputs,
    kind: GpuKind,
    gpus: int,
    mig_profile: str | None,
    decode: float,
    prefill: float,
    max_seqs: int,
    estimated: bool,
) -> Placement | Infeasible:
    m, shape, slo = ep.model, ep.shape, ep.slo
    prof = kind.profile(mig_profile) if mig_profile else None
    if prof is not None:
        memory_gb = prof.memory_gb
        bandwidth = kind.memory_bandwidth_tb_per_s * prof.memory_slices / 8
        replicas_per_gpu = prof.max_instances_per_gpu
        label = f"{kind.name} {mig_profile}"
    else:
        memory_gb = kind.memory_gb * gpus
        bandwidth = kind.memory_bandwidth_tb_per_s * gpus
        replicas_per_gpu = 1
        label = kind.name if gpus == 1 else f"{kind.name}×{gpus}"
    largest = kind.instance_types[-1]
    if gpus > largest.gpus_per_node:
        # a replica is one pod on one node: 16 GPUs on 8-GPU nodes planned pods that could never be scheduled
        return Infeasible(label, f"gpus_per_replica={gpus} is more than the largest {kind.name} node holds "
                                 f"({largest.name}, {largest.gpus_per_node} GPUs); a replica runs on one node")
    kv_gb_per_token = m.kv_cache_mib_per_token * GB_PER_MIB
    budget_gb = memory_gb * GPU_MEMORY_UTILIZATION - m.weights_gb - ACTIVATION_OVERHEAD_GB_PER_GPU * gpus
    kv_tokens = budget_gb / kv_gb_per_token if budget_gb > 0 else 0.0
    if kv_tokens < shape.product_max_context_tokens:
        return Infeasible(
            label,
            f"weights {m.weights_gb:g} GB + KV for one {shape.product_max_context_tokens}-token sequence "
            f"({shape.product_max_context_tokens * kv_gb_per_token:.1f} GB) exceed {memory_gb:g} GB × "
            f"{GPU_MEMORY_UTILIZATION} − {ACTIVATION_OVERHEAD_GB_PER_GPU * gpus:g} GB overhead",
        )
    # Decode step time: t(b) = t_min + b·k, where t_min reads the weights once (memory bound) and
    # t(max_seqs) = max_seqs / decode (the measured saturated aggregate).
    t_min = m.weights_gb / (bandwidth * 1000.0)  # s: GB / (TB/s × 1000 GB/TB)
    t_sat = max_seqs / decode
    t_min = min(t_min, t_sat)
    itl_s = slo.inter_token_p99_ms / 1000.0
    if t_min > itl_s:
        return Infeasible(
            label,
            f"inter_token_p99_ms={slo.inter_token_p99_ms:g} is below the decode step floor "
            f"{t_min * 1000:.1f} ms ({m.weights_gb:g} GB over {bandwidth:.2f} TB/s)",
        )
    k = (t_sat - t_min) / max_seqs
    # Continuous batching interleaves the other sequences' prefills with decode steps: each of the b − 1
    # neighbours brings p̄ seconds of prefill per ō tokens it generates, so a sequence sees the gap
    # gap(b) = t_min + b·k + (b − 1)·p̄/ō, and the inter-token SLO caps b where gap(b) = SLO.
    prefill_per_token = (shape.input_tokens_mean * (1 - ep.prefix_cache_hit_fraction) / prefill) / shape.output_tokens_mean
    itl_limit = int((itl_s - t_min + prefill_per_token) / (k + prefill_per_token)) if (k + prefill_per_token) > 0 else max_seqs
    usable = max(0, min(max_seqs, itl_limit))
    if usable < 1:
        return Infeasible(label, f"no batch size keeps the inter-token gap under {slo.inter_token_p99_ms:g} ms")
    eff_decode = usable / (t_min + usable * k)
    replica_s = costs.gpu_seconds_per_request(
        shape.input_tokens_mean, shape.output_tokens_mean, eff_decode, prefill, ep.prefix_cache_hit_fraction, 1
    )
    saturated_rps = 1.0 / replica_s
    prefill_p99_s = shape.input_tokens_p99 * (1 - ep.prefix_cache_hit_fraction) / prefill
    wait_budget = slo.ttft_p99_ms / 1000.0 - prefill_p99_s - (t_min + usable * k)
    if wait_budget <= 0:
        return Infeasible(
            label,
            f"ttft_p99_ms={slo.ttft_p99_ms:g} is below the p99 prompt's prefill time: "
            f"{shape.input_tokens_p99:g} tokens × (1 − {ep.prefix_cache_hit_fraction:g}) / {prefill:g} tok/s "
            f"= {prefill_p99_s * 1000:.0f} ms plus one decode step",
        )
    rho_slo = slo_utilisation(usable, saturated_rps, wait_budget)
    rho_plan = min(rho_slo, 1.0 / (1.0 + ep.headroom_fraction))
    inst = smallest_instance(kind, gpus)
    return Placement(
        gpu_kind=kind.name,
        mig_profile=mig_profile,
        gpus_per_replica=gpus,
        replicas_per_gpu=replicas_per_gpu,
        decode_tokens_per_s=eff_decode,
        prefill_tokens_per_s=prefill,
        measured_max_seqs=max_seqs,
        usable_concurrency=usable,
        memory_gb=memory_gb,
        kv_capacity_tokens=kv_tokens,
        decode_step_floor_s=t_min,
        saturated_rps=saturated_rps,
        slo_utilisation=rho_slo,
        planning_utilisation=rho_plan,
        planning_rps=saturated_rps * rho_plan,
        gpu_s_per_request=replica_s * gpus / replicas_per_gpu,
        estimated=estimated,
        instance_type=inst.name,
        gpus_per_node=inst.gpus_per_node,
        local_nvme_gb=inst.local_nvme_gb,
    )


def placements(ep: EndpointInputs, catalog: Mapping[str, GpuKind]) -> tuple[list[Placement], list[Infeasible]]:
    """Every way to run one replica: whole GPUs per measured kind, and each MIG slice of single-GPU kinds."""
    ok: list[Placement] = []
    bad: list[Infeasible] = []
    for cap in ep.engine:
        kind = catalog[cap.gpu_kind]
        for r in [
            placement_for(ep, kind, cap.gpus_per_replica, None, cap.decode_tokens_per_s,
                       cap.prefill_tokens_per_s, cap.max_concurrent_sequences, False)
        ]:
            (ok if isinstance(r, Placement) else bad).append(r)
        if cap.gpus_per_replica != 1 or not kind.mig_profiles:
            continue
        measured = {mc.profile: mc for mc in cap.mig}
        for prof in kind.mig_profiles:
            if prof.name.endswith("+me") or prof.compute_slices == 7:
                continue  # +me variants carry media engines, 7g is the whole GPU
            mc = measured.get(prof.name)
            if mc is not None:
                d, p, s, est = mc.decode_tokens_per_s, mc.prefill_tokens_per_s, mc.max_concurrent_sequences, False
            else:
                # No public per-slice table: decode follows the slice's memory bandwidth share, prefill its SMs.
                d = cap.decode_tokens_per_s * prof.memory_slices / 8
                p = cap.prefill_tokens_per_s * prof.compute_slices / 7
                s = max(1, int(cap.max_concurrent_sequences * prof.memory_slices / 8))
                est = True
            r = placement_for(ep, kind, 1, prof.name, d, p, s, est)
            (ok if isinstance(r, Placement) else bad).append(r)
    for mc in (m for cap in ep.engine for m in cap.mig):
        kind = catalog[next(c.gpu_kind for c in ep.engine if mc in c.mig)]
        if kind.profile(mc.profile) is None:
            raise PlanningError(
                f"endpoint {ep.name}: engine mig profile {mc.profile!r} does not exist on {kind.name}; "
                f"its profiles: {', '.join(p.name for p in kind.mig_profiles) or 'none (no MIG)'}"
            )
    return ok, bad


def replica_capacity(pl: Placement, headroom_fraction: float) -> ReplicaCapacity:
    """The spec's view of one placement: planning figures (rounded for reading) and the replica's physics."""
    return ReplicaCapacity(
        gpu_kind=pl.gpu_kind, mig_profile=pl.mig_profile, gpus_per_replica=pl.gpus_per_replica,
        replicas_per_gpu=pl.replicas_per_gpu, saturated_requests_per_s=round(pl.saturated_rps, 4),
        slo_utilisation=round(pl.slo_utilisation, 4), planning_utilisation=round(pl.planning_utilisation, 4),
        planning_requests_per_s=round(pl.planning_rps, 4), usable_concurrency=pl.usable_concurrency,
        decode_tokens_per_s=round(pl.decode_tokens_per_s, 2), prefill_tokens_per_s=pl.prefill_tokens_per_s,
        headroom_fraction=headroom_fraction,
        kv_capacity_tokens=pl.kv_capacity_tokens, decode_step_floor_s=pl.decode_step_floor_s,
        decode_step_s_per_sequence=pl.decode_step_s_per_sequence, replicas_per_node=pl.replicas_per_node,
        gpus_per_node=pl.gpus_per_node,
    )


def capacity_section(ep: EndpointInputs, pl: Placement) -> Section[ReplicaCapacity]:
    """The endpoint's replica capacity, how its planning rate was derived, and what limits it."""
    s, slo = ep.shape, ep.slo
    cap = replica_capacity(pl, ep.headroom_fraction)
    derivs = (Derivation(
        figure="planning_requests_per_s", value=cap.planning_requests_per_s, unit="req/s per replica",
        formula=f"saturated {pl.saturated_rps:.3f} × min(TTFT-SLO utilisation {pl.slo_utilisation:.3f}, "
        f"1/(1+{ep.headroom_fraction:g}))",
        inputs=("slo.ttft_p99_ms", "slo.inter_token_p99_ms", "headroom_fraction", "engine.max_concurrent_sequences"),
    ),)
    warnings: list[str] = []
    if pl.usable_concurrency < pl.measured_max_seqs:
        warnings.append(
            f"{ep.name}: the inter-token SLO {slo.inter_token_p99_ms:g} ms limits a replica to "
            f"{pl.usable_concurrency} of its {pl.measured_max_seqs} measured sequences"
        )
    if pl.estimated:
        warnings.append(f"{ep.name}: {pl.label} capacity is estimated from the slice's share of the GPU; measure it")
    seqs_at_max = int(pl.kv_capacity_tokens // s.product_max_context_tokens)
    if seqs_at_max < pl.usable_concurrency:
        warnings.append(
            f"{ep.name}: only {seqs_at_max} sequences fit at the product max context "
            f"{s.product_max_context_tokens} (max_num_seqs {pl.usable_concurrency}): long pastes at max × max "
            "concurrency preempt; keep the gateway cap and alert on vllm:num_preemptions_total"
        )
    return Section(cap, derivs, tuple(warnings))
