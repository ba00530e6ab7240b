"""plan(inputs) -> TopologySpec: choose how each endpoint is served, and size it, with the arithmetic shown.

The planner is pure: no pulumi, no modal, no clock, no network, no files. Catalogs come in as arguments.

Outline for one endpoint:
1. Placements: each measured GPU kind as whole GPUs, and each MIG slice the model fits (weights + KV for
   at least one sequence at the product's maximum context). For each, replica capacity from the measured
   throughput, limited by the inter-token SLO, at the highest utilisation that keeps TTFT p99 within the
   SLO (M/M/c waiting on the replica's sequence slots) and never above 1/(1+headroom).
2. Load-duration curve: replicas needed in each of the 168 hours at the within-hour peak, cut into
   node-sized layers (nodes are what is paid for). The bottom nodes may be reserved (all hours,
   discounted); every other node runs on the clock in the hours where that beats letting serverless
   carry its share (an on/off schedule per node by dynamic programming: on-demand while running, the
   cold-start lead billed ahead of each start; serverless pays only the used share of each hour at the
   serverless premium, plus a cold start and scaledown tail, and a warm container where a restore is
   slower than the TTFT SLO).
3. Options — managed API, serverless only, dedicated only, floor + burst — each at its cheapest layer
   split, costed on the real profile with node packing and fixed platform costs; the cheapest feasible
   one wins and the report says why the runner-up lost.
4. The winner's floors (168 hours, windows starting a cold-start lead ahead of each rise), autoscaling
   (queue signal, thresholds from cold start and the steepest ramp, capped step), thundering-herd
   limits, engine flags, burst sizing and gateway settings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
import dataclasses
from dataclasses import dataclass, field

import numpy as np

from . import costs
from .catalog import GPU_KINDS, GpuKind, MigLayoutError, smallest_instance, validate_mig_layout
from .gateway_timing import heartbeat_interval_s
from .inputs import CostInputs, EndpointInputs
from .spec import (
    SPEC_VERSION,
    AlternativeCost,
    AutoscalingSpec,
    BurstSpec,
    CanarySpec,
    CapacityLayer,
    Derivation,
    Economics,
    EndpointSpec,
    EngineSpec,
    FloorSchedule,
    FloorWindow,
    GatewaySpec,
    HerdSpec,
    LoraSettings,
    MigLayoutSpec,
    MinContainersWindow,
    NodePoolSpec,
    ReplicaCapacity,
    TenantSpec,
    Tier,
    TopologySpec,
    WeightCacheSpec,
)

GPU_MEMORY_UTILIZATION = 0.90  # vLLM --gpu-memory-utilization; the rest is CUDA graphs, activations, fragmentation
ACTIVATION_OVERHEAD_GB_PER_GPU = 1.0  # non-KV, non-weight memory inside the utilisation budget
GB_PER_MIB = 1.048576e-3
MINUTES_PER_WEEK = 10080
DEFAULT_ENGINE_IMAGE = "vllm/vllm-openai:v0.11.0"
LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
P99 = 0.99
RETRY_BUDGET_FRACTION = 0.10
OVERHEAD_BYTES_PER_TOKEN = 8  # JSON-escaped text: ~4 chars/token, escapes up to 2×
BODY_SLACK_BYTES = 64 * 1024


class PlanningError(ValueError):
    """The inputs are valid one by one but no plan can meet them; the message names the constraint."""


# --------------------------------------------------------------------------------------------------
# Placement: where one replica runs and how much it carries
# --------------------------------------------------------------------------------------------------


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


def slo_utilisation(servers: int, saturated_rps: float, wait_budget_s: float) -> float:
    """Highest utilisation (≤ 0.98) whose p99 slot wait stays within the budget (bisection)."""
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


def _placement(
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
            _placement(ep, kind, cap.gpus_per_replica, None, cap.decode_tokens_per_s,
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
            r = _placement(ep, kind, 1, prof.name, d, p, s, est)
            (ok if isinstance(r, Placement) else bad).append(r)
    for mc in (m for cap in ep.engine for m in cap.mig):
        kind = catalog[next(c.gpu_kind for c in ep.engine if mc in c.mig)]
        if kind.profile(mc.profile) is None:
            raise PlanningError(
                f"endpoint {ep.name}: engine mig profile {mc.profile!r} does not exist on {kind.name}; "
                f"its profiles: {', '.join(p.name for p in kind.mig_profiles) or 'none (no MIG)'}"
            )
    return ok, bad


# --------------------------------------------------------------------------------------------------
# Layers and options
# --------------------------------------------------------------------------------------------------


@dataclass
class Demand:
    mean_rps: np.ndarray  # 168
    peak_rps: np.ndarray  # 168, mean × within-hour peak factor


@dataclass
class OptionEval:
    tier: Tier
    feasible: bool
    reason: str
    weekly_usd: float = math.inf
    breakdown_weekly: dict[str, float] = field(default_factory=dict)
    placement: Placement | None = None
    reserved_layers: int = 0
    scheduled_layers: int = 0
    floor_by_hour: np.ndarray | None = None
    burst_max_containers: int = 0
    warm_min_by_hour: np.ndarray | None = None
    layers: list[CapacityLayer] = field(default_factory=list)


@dataclass(frozen=True)
class Prices:
    serverless_container_hour: float
    on_demand_node_hour: float
    reserved_node_hour: float


def _prices(inp: CostInputs, ep: EndpointInputs, pl: Placement, sls: Placement) -> Prices:
    od_gpu = inp.prices.dedicated_on_demand_usd_per_gpu_hour[pl.gpu_kind]
    res_gpu = od_gpu * (1 - inp.prices.reserved_discount_fraction)
    sls_gpu_s = inp.prices.serverless_usd_per_gpu_second[ep.serverless.gpu_kind] * ep.serverless.region_price_multiplier
    return Prices(
        serverless_container_hour=sls_gpu_s * costs.SECONDS_PER_HOUR * sls.gpus_per_replica,
        on_demand_node_hour=od_gpu * pl.gpus_per_node,
        reserved_node_hour=res_gpu * pl.gpus_per_node,
    )


def replicas_needed_by_hour(peak_rps: np.ndarray, planning_rps: float) -> np.ndarray:
    """Replicas that carry each hour's within-hour peak at the planning utilisation (headroom included)."""
    return np.ceil(peak_rps / planning_rps - 1e-9).astype(int)


def serverless_cold_start_s(ep: EndpointInputs) -> float:
    s = ep.serverless
    return ep.cold_starts.serverless_snapshot_restore_s if s.gpu_snapshots else ep.cold_starts.serverless_no_snapshot_s


def _ttft_budget_s(ep: EndpointInputs) -> float:
    return ep.slo.ttft_p99_ms / 1000.0


def lead_time_s(ep: EndpointInputs, herd: HerdSpec) -> float:
    """How far ahead of a demand rise a clock window starts: a new node + pod, plus the start jitter."""
    return ep.cold_starts.new_node_and_pod_s + herd.start_jitter_s


@dataclass
class NodeGroups:
    """One placement's demand cut into node-sized layers: group g carries replicas g·rpn+1 … (g+1)·rpn.

    Nodes are what is paid for, so the load-duration choice is made per node: reserved (all hours),
    on-demand in the hours the clock schedules it, or serverless in the hours it is not running."""

    need: np.ndarray  # (168,) replicas needed at the within-hour peak
    needed: np.ndarray  # (G, 168) the group's lowest layer is needed
    serverless_usd: np.ndarray  # (G, 168) serverless cost of carrying the group's layers in that hour
    reserved_usd_week: float  # one reserved node for the week
    on_demand_node_hour: float
    rise_usd: float  # a scheduled node starts lead_s before its hour and is billed from then
    rpn: int
    ratio: float  # serverless containers per dedicated replica of capacity

    @property
    def groups(self) -> int:
        return self.needed.shape[0]


def node_groups(
    demand: Demand, pl: Placement, sls: Placement, pr: Prices, lead_s: float, sls_overhead_s: float,
    warm_container: bool = False,
) -> NodeGroups:
    need = replicas_needed_by_hour(demand.peak_rps, pl.planning_rps)
    rpn = pl.replicas_per_node
    top = int(need.max()) if need.size else 0
    groups = math.ceil(top / rpn)
    ks = np.arange(1, groups * rpn + 1)
    active = need[None, :] >= ks[:, None]  # (layers, 168)
    # serverless bills per second for the share of each layer's band that mean demand occupies, in
    # containers of the serverless placement's size, plus a cold start and scaledown tail per active hour
    fill = np.clip(demand.mean_rps[None, :] / pl.planning_rps - (ks[:, None] - 1), 0.0, 1.0) * active
    ratio = pl.planning_rps / sls.planning_rps
    per_layer = (fill * ratio + active * math.ceil(ratio) * sls_overhead_s / 3600.0) * pr.serverless_container_hour
    starts = np.arange(groups) * rpn
    sls_usd = np.add.reduceat(per_layer, starts, axis=0) if groups else np.zeros((0, 168))
    if warm_container and groups:
        # a restore slower than the TTFT SLO keeps a container warm in every hour the burst carries anything
        sls_usd = np.maximum(sls_usd, pr.serverless_container_hour * active[starts])
    return NodeGroups(
        need=need, needed=active[starts] if groups else np.zeros((0, 168), bool), serverless_usd=sls_usd,
        reserved_usd_week=168.0 * pr.reserved_node_hour, on_demand_node_hour=pr.on_demand_node_hour,
        rise_usd=lead_s / 3600.0 * pr.on_demand_node_hour, rpn=rpn, ratio=ratio,
    )


def schedule_dp(run_usd: np.ndarray, idle_usd: np.ndarray, rise_usd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cheapest on/off schedule per row over the week's hours (rows = node groups, all placements at once).

    A running node costs run_usd that hour; a stopped one costs idle_usd (what serverless pays instead,
    inf where it may not stop); starting costs rise_usd (the cold-start lead billed ahead of the hour).
    Returns (weekly cost per row, running mask). The week is treated as starting stopped, which can only
    overcount one rise at the wrap."""
    n = run_usd.shape[0]
    on = np.full(n, np.inf)
    off = np.zeros(n)
    came_on_from_on = np.zeros((168, n), bool)
    came_off_from_on = np.zeros((168, n), bool)
    for h in range(168):
        stay = on
        start = off + rise_usd
        came_on_from_on[h] = stay <= start
        new_on = np.minimum(stay, start) + run_usd[:, h]
        came_off_from_on[h] = on <= off
        new_off = np.minimum(on, off) + idle_usd[:, h]
        on, off = new_on, new_off
    cost = np.minimum(on, off)
    state = on <= off
    running = np.zeros((n, 168), bool)
    for h in range(167, -1, -1):
        running[:, h] = state
        state = np.where(state, came_on_from_on[h], came_off_from_on[h])
    return cost, running


@dataclass
class FloorChoice:
    reserved_nodes: int
    running: np.ndarray  # (G, 168) node g runs in hour h
    floor: np.ndarray  # (168,) replicas ready


def choose_floors(
    ng: NodeGroups, *, allow_serverless: bool, max_replicas: int, min_floor: int, burst_cap_containers: int
) -> FloorChoice | str:
    """Reserved nodes at the bottom, then each node group on the clock where it pays, serverless elsewhere.

    Returns the choice, or a reason why none meets the caps."""
    g_count, rpn = ng.groups, ng.rpn
    max_nodes = max_replicas // rpn
    if g_count == 0:
        return FloorChoice(0, np.zeros((0, 168), bool), np.full(168, min_floor if max_nodes else 0))
    # hours where serverless may not carry a group: not allowed at all, or beyond the burst cap
    if allow_serverless:
        burst_replicas = math.floor(burst_cap_containers / ng.ratio + 1e-9)
        min_nodes = np.ceil(np.maximum(ng.need - burst_replicas, 0) / rpn).astype(int)
    else:
        min_nodes = np.ceil(ng.need / rpn).astype(int)
    if min_floor:
        min_nodes = np.maximum(min_nodes, 1)
    if int(min_nodes.max()) > max_nodes:
        h = int(np.argmax(min_nodes))
        what = f"burst cap {burst_cap_containers} containers" if allow_serverless else "no burst"
        return (f"hour {h} needs {int(min_nodes[h]) * rpn} dedicated replicas ({int(ng.need[h])} at peak, {what}) "
                f"> max_dedicated_replicas={max_replicas}")
    g_index = np.arange(g_count)[:, None]
    forced = g_index < min_nodes[None, :]
    idle = np.where(ng.needed, ng.serverless_usd, 0.0)
    idle = np.where(forced, np.inf, idle)
    run = np.where(g_index < max_nodes, ng.on_demand_node_hour, np.inf) * np.ones((1, 168))
    dp_cost, running = schedule_dp(run, idle, np.full(g_count, ng.rise_usd))
    # reserved at the bottom: R nodes all week, the rest as scheduled above
    best_r, best = 0, math.inf
    suffix = np.concatenate([np.cumsum(dp_cost[::-1])[::-1], [0.0]])
    for r in range(0, min(g_count, max_nodes) + 1):
        total = r * ng.reserved_usd_week + suffix[r]
        if total < best - 1e-9:
            best_r, best = r, total
    if not math.isfinite(best):
        return "no schedule meets the caps"
    running = running.copy()
    running[:best_r] = True
    floor = np.minimum(running.sum(axis=0) * rpn, max_replicas)
    return FloorChoice(best_r, running, floor.astype(int))


PEAKS_PER_HOUR = 8  # within-hour peaks recur about every 7.5 minutes (bursty arrivals; calibrated against the simulator)


def serverless_alive_container_hours(
    rps: np.ndarray, containers_mean: np.ndarray, containers_peak: np.ndarray, scaledown_window_s: float
) -> np.ndarray:
    """Container-hours a serverless tier bills in each hour: containers live on for the scaledown window.

    A container bills whole while it is up, not the fraction of it the mean load uses: the first one is
    alive whenever a request came within the window (Poisson: 1 − e^(−λ·W)), and the containers a
    within-hour peak starts stay up for W after it — for the whole hour when peaks recur within W."""
    first = 1.0 - np.exp(-rps * scaledown_window_s)
    base = np.maximum(containers_mean, first)
    held = min(1.0, scaledown_window_s * PEAKS_PER_HOUR / 3600.0)
    return base + np.maximum(containers_peak - base, 0.0) * held


def _evaluate_floor(
    tier: Tier, ep: EndpointInputs, demand: Demand, pl: Placement, sls: Placement, pr: Prices,
    floor: np.ndarray, reserved_nodes: int, lead_s: float, ng: NodeGroups | None = None,
    running: np.ndarray | None = None,
) -> OptionEval:
    """Exact weekly cost of a floor on the profile: whole nodes, warm minimums, cold starts, tails."""
    rpn = pl.replicas_per_node
    nodes = np.ceil(floor / rpn).astype(int)
    od_nodes = np.maximum(nodes - reserved_nodes, 0)
    # each node added by the clock starts lead_s before its hour and is billed from then
    node_rises = np.maximum(od_nodes - np.roll(od_nodes, 1), 0).sum()
    reserved_usd = 168.0 * reserved_nodes * pr.reserved_node_hour
    od_usd = (od_nodes.sum() + node_rises * lead_s / 3600.0) * pr.on_demand_node_hour
    # burst: what the floor cannot carry, in serverless containers
    over_mean = np.maximum(demand.mean_rps - floor * pl.planning_rps, 0.0)
    over_peak = np.maximum(demand.peak_rps - floor * pl.planning_rps, 0.0)
    containers_mean = over_mean / sls.planning_rps
    containers_peak = np.ceil(over_peak / sls.planning_rps - 1e-9)
    burst_active = containers_peak > 0
    cold = serverless_cold_start_s(ep)
    warm_min = np.zeros(168, int)
    if burst_active.any() and cold > _ttft_budget_s(ep):
        # a restore slower than the TTFT SLO means burst hours keep one container warm
        warm_min = np.where(burst_active, 1, 0)
    if tier == "serverless_only" and not ep.scale_to_zero_allowed:
        warm_min = np.maximum(warm_min, 1)
    sls_hours = np.maximum(serverless_alive_container_hours(over_mean, containers_mean, containers_peak,
                                                            ep.serverless.scaledown_window_s), warm_min)
    overhead = containers_peak * cold / 3600.0  # each start bills its cold start
    serverless_usd = float((sls_hours.sum() + overhead.sum()) * pr.serverless_container_hour)
    max_containers = int(containers_peak.max()) if containers_peak.size else 0
    scheduled_nodes = int(max(0, nodes.max(initial=0) - reserved_nodes))
    ev = OptionEval(
        tier=tier, feasible=True, reason="", placement=pl, reserved_layers=reserved_nodes * rpn,
        scheduled_layers=scheduled_nodes * rpn, floor_by_hour=floor.astype(int), burst_max_containers=max_containers,
        warm_min_by_hour=warm_min,
    )
    ev.breakdown_weekly = {"reserved": reserved_usd, "on_demand": float(od_usd), "serverless": serverless_usd}
    ev.weekly_usd = reserved_usd + float(od_usd) + serverless_usd
    if ng is not None and running is not None:
        ev.layers = _layers(ng, running, reserved_nodes)
    return ev


def _layers(ng: NodeGroups, running: np.ndarray, reserved_nodes: int) -> list[CapacityLayer]:
    """One row per node of the load-duration curve: its duty, the tier it went to, what each tier would cost."""
    out = []
    for g in range(ng.groups):
        needed = ng.needed[g]
        hours = int(needed.sum())
        rises = int((needed & ~np.roll(needed, 1)).sum()) if hours < 168 else 0
        c = {
            "reserved": ng.reserved_usd_week,
            "scheduled_on_demand": hours * ng.on_demand_node_hour + rises * ng.rise_usd,
            "serverless_burst": float(ng.serverless_usd[g][needed].sum()),
        }
        tier = "reserved" if g < reserved_nodes else ("scheduled_on_demand" if running[g].any() else "serverless_burst")
        out.append(CapacityLayer(
            index=g + 1, duty_fraction=round(hours / 168.0, 4), tier=tier,
            monthly_usd=round(costs.monthly_from_weekly(c[tier]), 2),
            costs_usd_per_month={k: round(costs.monthly_from_weekly(v), 2) for k, v in c.items()},
        ))
    return out


# --------------------------------------------------------------------------------------------------
# Endpoint planning
# --------------------------------------------------------------------------------------------------


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


def floor_windows(floor: Sequence[int], base: int, lead_s: float) -> tuple[FloorWindow, ...]:
    """Contiguous runs of constant floor above the base; a run that rises starts lead_s early."""
    n = len(floor)
    windows: list[FloorWindow] = []
    if all(v == floor[0] for v in floor):
        return ()
    # rotate so that we start right after a change, keeping runs intact across the week's wrap
    start = next(h for h in range(n) if floor[h] != floor[h - 1])
    h = 0
    lead_min = math.ceil(lead_s / 60.0)
    while h < n:
        s = (start + h) % n
        v = floor[s]
        length = 1
        while length < n and floor[(s + length) % n] == v:
            length += 1
        h += length
        if v <= base:
            continue
        prev = floor[(s - 1) % n]
        rise = v > prev
        begin = (s * 60 - (lead_min if rise else 0)) % MINUTES_PER_WEEK
        end = ((s + length) % n) * 60
        windows.append(FloorWindow(
            start_minute_of_week=begin, end_minute_of_week=end % MINUTES_PER_WEEK, replicas=int(v),
            demand_rise_minute_of_week=(s * 60) if rise else None,
        ))
    return tuple(sorted(windows, key=lambda w: (w.demand_rise_minute_of_week or w.start_minute_of_week)))


def _hour_windows(active: np.ndarray, value: int, lead_s: float) -> tuple[MinContainersWindow, ...]:
    out = []
    lead_min = math.ceil(lead_s / 60.0)
    for s, length in costs.cyclic_runs([bool(x) for x in active]):
        if length == 168:
            return ()  # always on: expressed as min_containers instead
        out.append(MinContainersWindow(
            start_minute_of_week=(s * 60 - lead_min) % MINUTES_PER_WEEK,
            end_minute_of_week=((s + length) % 168) * 60,
            min_containers=value,
        ))
    return tuple(out)


def _lora(ep: EndpointInputs, pl: Placement) -> tuple[LoraSettings | None, list[str], list[Derivation]]:
    if ep.lora is None or ep.lora.count == 0:
        return None, [], []
    lo = ep.lora
    max_loras = min(lo.active_working_set, pl.usable_concurrency)
    rank = next((r for r in LORA_RANKS if r >= lo.rank), LORA_RANKS[-1])
    adapters_gb = max_loras * lo.size_mb / 1000.0
    kv_gb_per_token = ep.model.kv_cache_mib_per_token * GB_PER_MIB
    kv_needed = pl.usable_concurrency * (ep.shape.input_tokens_mean + ep.shape.output_tokens_mean) * kv_gb_per_token
    headroom = pl.memory_gb * GPU_MEMORY_UTILIZATION - ep.model.weights_gb - ACTIVATION_OVERHEAD_GB_PER_GPU * pl.gpus_per_replica - kv_needed
    warnings = []
    if adapters_gb > headroom:
        warnings.append(
            f"{ep.name}: LoRA working set {max_loras} × {lo.size_mb:g} MB = {adapters_gb:.2f} GB exceeds the memory "
            f"headroom {headroom:.2f} GB left after weights and KV for {pl.usable_concurrency} sequences at the "
            "mean context: expect adapter-cache thrash (fewer max_loras, smaller ranks, or more replicas)"
        )
    d = [Derivation(
        figure="lora_memory_headroom_gb", value=round(headroom, 3), unit="GB",
        formula=f"{pl.memory_gb:g}×{GPU_MEMORY_UTILIZATION} − {ep.model.weights_gb:g} − "
        f"{ACTIVATION_OVERHEAD_GB_PER_GPU * pl.gpus_per_replica:g} − KV {kv_needed:.2f}; adapters need {adapters_gb:.2f}",
        inputs=("model.weights_gb", "model.kv_cache_mib_per_token", "lora.size_mb", "lora.active_working_set"),
    )]
    return LoraSettings(
        enable_lora=True, max_loras=max_loras, max_cpu_loras=max(max_loras, min(lo.count, 4 * lo.active_working_set)),
        max_lora_rank=rank, adapters_gb_on_gpu=round(adapters_gb, 3), memory_headroom_gb=round(headroom, 3),
    ), warnings, d


@dataclass
class _EndpointPlan:
    spec: EndpointSpec
    pools: list[NodePoolSpec]
    weekly_by_tier: dict[str, float]
    uses_dedicated: bool
    uses_serverless: bool


def _demand(ep: EndpointInputs) -> Demand:
    if ep.traffic.hourly_mean_requests_per_s is None:
        raise PlanningError(
            f"endpoint {ep.name}: traffic.rate_trace must be resolved into hourly_mean_requests_per_s "
            "before planning (topology.load_inputs does this)"
        )
    mean = np.asarray(ep.traffic.hourly_mean_requests_per_s, dtype=float)
    return Demand(mean_rps=mean, peak_rps=mean * ep.traffic.within_hour_peak_factor)


def _better(a: OptionEval, b: OptionEval) -> bool:
    """Cheaper wins; within 1% the placement with more, smaller replicas wins (MIG: isolation and
    redundancy at the same price)."""
    if a.weekly_usd < b.weekly_usd * 0.99:
        return True
    if a.weekly_usd > b.weekly_usd * 1.01:
        return False
    assert a.placement is not None and b.placement is not None  # dedicated options always carry one
    return a.placement.gpu_fraction_per_replica < b.placement.gpu_fraction_per_replica


def _options(
    inp: CostInputs, ep: EndpointInputs, demand: Demand, ded: list[Placement], sls: Placement | None,
    sls_bad: str, herd: HerdSpec,
) -> list[OptionEval]:
    """Every alternative, each at its cheapest placement and layer split."""
    out: list[OptionEval] = []
    lead = lead_time_s(ep, herd)
    s = ep.shape
    # managed API
    if ep.managed_api is None:
        out.append(OptionEval("managed_api", False, "no managed API serves this model (custom weights or data rules)"))
    elif ep.managed_api.measured_ttft_p99_ms > ep.slo.ttft_p99_ms:
        out.append(OptionEval(
            "managed_api", False,
            f"API p99 TTFT {ep.managed_api.measured_ttft_p99_ms:g} ms > SLO {ep.slo.ttft_p99_ms:g} ms",
        ))
    else:
        per_req = costs.api_usd_per_request(
            s.input_tokens_mean, s.output_tokens_mean,
            ep.managed_api.usd_per_million_input_tokens, ep.managed_api.usd_per_million_output_tokens,
        )
        weekly = costs.weekly_requests(demand.mean_rps) * per_req
        out.append(OptionEval("managed_api", True, f"{costs.weekly_requests(demand.mean_rps):,.0f} req/week × ${per_req:.6f}",
                              weekly_usd=weekly, breakdown_weekly={"api": weekly}))
    sls_fixed = inp.prices.serverless_fixed_usd_per_month / costs.WEEKS_PER_MONTH
    cold = serverless_cold_start_s(ep)
    sls_overhead = cold + ep.serverless.scaledown_window_s
    # serverless only
    if sls is None:
        out.append(OptionEval("serverless_only", False, sls_bad))
    else:
        pr = _prices(inp, ep, sls, sls)
        ev = _evaluate_floor("serverless_only", ep, demand, sls, sls, pr, np.zeros(168, int), 0, lead)
        ev.breakdown_weekly["serverless_fixed"] = sls_fixed
        ev.weekly_usd += sls_fixed
        if ev.burst_max_containers > ep.serverless.max_containers_cap:
            ev.feasible, ev.reason = False, (
                f"peak needs {ev.burst_max_containers} containers > serverless.max_containers_cap "
                f"{ep.serverless.max_containers_cap}"
            )
        else:
            ev.reason = f"{sls.label} containers, up to {ev.burst_max_containers}"
        out.append(ev)
    # dedicated only, floor + burst: cheapest placement
    for tier in ("dedicated_only", "floor_plus_burst"):
        if not inp.floor_replicas_allowed:
            out.append(OptionEval(tier, False, f"environment {inp.environment} allows no floor replicas"))
            continue
        if not ded:
            out.append(OptionEval(tier, False, "no dedicated placement meets the SLO and memory"))
            continue
        if tier == "floor_plus_burst" and sls is None:
            out.append(OptionEval(tier, False, f"no burst tier: {sls_bad}"))
            continue
        burst = tier == "floor_plus_burst"
        best: OptionEval | None = None
        why_not: list[str] = []
        for pl in ded:
            burst_pl = sls if sls is not None else pl
            pr = _prices(inp, ep, pl, burst_pl)
            ng = node_groups(demand, pl, burst_pl, pr, lead, sls_overhead, warm_container=cold > _ttft_budget_s(ep))
            choice = choose_floors(
                ng, allow_serverless=burst, max_replicas=ep.max_dedicated_replicas,
                min_floor=0 if ep.scale_to_zero_allowed else 1, burst_cap_containers=ep.serverless.max_containers_cap,
            )
            if isinstance(choice, str):
                why_not.append(f"{pl.label}: {choice}")
                continue
            ev = _evaluate_floor(tier, ep, demand, pl, burst_pl, pr, choice.floor, choice.reserved_nodes, lead,
                                 ng, choice.running)
            if burst and ev.burst_max_containers == 0:
                why_not.append(f"{pl.label}: the cheapest floor leaves nothing to burst (that is dedicated_only)")
                continue
            if burst and not choice.floor.any():
                why_not.append(f"{pl.label}: the cheapest mix runs no floor (that is serverless_only)")
                continue
            if burst:
                ev.breakdown_weekly["serverless_fixed"] = sls_fixed
                ev.weekly_usd += sls_fixed
                if ev.burst_max_containers > ep.serverless.max_containers_cap:
                    why_not.append(f"{pl.label}: burst needs {ev.burst_max_containers} containers > cap "
                                   f"{ep.serverless.max_containers_cap}")
                    continue
            if best is None or _better(ev, best):
                best = ev
        if best is None:
            out.append(OptionEval(tier, False, "; ".join(why_not) or "no feasible schedule"))
        else:
            rpn = best.placement.replicas_per_node
            reserved_nodes, scheduled_nodes = best.reserved_layers // rpn, best.scheduled_layers // rpn
            best.reason = (
                f"{best.placement.label}, {rpn} replica(s)/node: {reserved_nodes} reserved node(s)"
                + (f" + up to {scheduled_nodes} on the clock" if scheduled_nodes else "")
                + (f", burst up to {best.burst_max_containers} containers" if burst else "")
            )
            out.append(best)
    return out


@dataclass
class _Prepared:
    """Everything about an endpoint that does not depend on how the fixed platform cost is shared."""

    demand: Demand
    ok: list[Placement]
    sls: Placement | None
    herd: HerdSpec
    options: list[OptionEval]  # dedicated options without their platform share


def _prepare_endpoint(inp: CostInputs, ep: EndpointInputs, catalog: Mapping[str, GpuKind]) -> _Prepared:
    demand = _demand(ep)
    ok, bad = placements(ep, catalog)
    if not ok:
        reasons = "; ".join(f"{b.label}: {b.reason}" for b in bad)
        raise PlanningError(f"endpoint {ep.name}: no GPU or MIG slice can serve it at the SLO — {reasons}")
    sls_candidates = [p for p in ok if p.gpu_kind == ep.serverless.gpu_kind and p.mig_profile is None]
    sls = sls_candidates[0] if sls_candidates else None
    sls_bad = next(
        (f"{b.label}: {b.reason}" for b in bad if b.label.startswith(ep.serverless.gpu_kind) and " " not in b.label),
        f"serverless.gpu_kind={ep.serverless.gpu_kind} cannot serve the model",
    )
    herd = herd_limits(ep)
    return _Prepared(demand, ok, sls, herd, _options(inp, ep, demand, ok, sls, sls_bad, herd))


def _with_platform_share(options: list[OptionEval], share_weekly: float) -> list[OptionEval]:
    """Dedicated options carry their share of the cluster's fixed cost (the same for every placement)."""
    out = []
    for o in options:
        if o.feasible and o.tier in ("dedicated_only", "floor_plus_burst"):
            o = dataclasses.replace(o, weekly_usd=o.weekly_usd + share_weekly,
                                    breakdown_weekly={**o.breakdown_weekly, "platform_fixed": share_weekly})
        out.append(o)
    return out


def _decide(ep: EndpointInputs, options: list[OptionEval]) -> tuple[OptionEval, OptionEval | None, str]:
    feasible = sorted((o for o in options if o.feasible), key=lambda o: o.weekly_usd)
    if not feasible:
        raise PlanningError(
            f"endpoint {ep.name}: no option is feasible — "
            + "; ".join(f"{o.tier}: {o.reason}" for o in options)
        )
    win = feasible[0]
    runner = feasible[1] if len(feasible) > 1 else None
    if runner is None:
        infeasible = [o for o in options if not o.feasible]
        why = "the only feasible option; " + "; ".join(f"{o.tier}: {o.reason}" for o in infeasible)
    else:
        diff = costs.monthly_from_weekly(runner.weekly_usd - win.weekly_usd)
        why = (f"{runner.tier} costs ${costs.monthly_from_weekly(runner.weekly_usd):,.0f}/month, "
               f"${diff:,.0f} more than {win.tier} (${costs.monthly_from_weekly(win.weekly_usd):,.0f})")
    return win, runner, why


def _mig_decision(ep: EndpointInputs, options: list[OptionEval], ok: list[Placement], win: OptionEval) -> str:
    migs = [p for p in ok if p.mig_profile]
    if not migs:
        return "whole GPUs: the model and its KV at the product's max context fit no MIG slice of the measured GPUs"
    ded = [o for o in options if o.tier in ("dedicated_only", "floor_plus_burst") and o.feasible]
    if not ded or win.placement is None or win.tier in ("managed_api", "serverless_only"):
        return f"no dedicated pool; slices that would fit: {', '.join(p.label for p in migs)}"
    chosen = win.placement
    est = " (slice capacity estimated from its bandwidth/SM share; measure it)" if chosen.estimated else ""
    if chosen.mig_profile:
        return (f"MIG {chosen.mig_profile}: {chosen.replicas_per_gpu} isolated replicas per {chosen.gpu_kind}, "
                f"{chosen.planning_rps:.2f} req/s each — cheaper than whole GPUs for this load{est}")
    return (f"whole {chosen.gpu_kind}: cheaper than the fitting slices "
            f"({', '.join(p.mig_profile or '' for p in migs)}) for this load")


def _build_endpoint_spec(
    inp: CostInputs, ep: EndpointInputs, demand: Demand, ok: list[Placement], sls: Placement | None,
    herd: HerdSpec, options: list[OptionEval], win: OptionEval, runner: OptionEval | None, why: str,
) -> _EndpointPlan:
    s, slo = ep.shape, ep.slo
    warnings: list[str] = []
    derivs: list[Derivation] = []
    ded_pl = win.placement if win.tier in ("dedicated_only", "floor_plus_burst") else None
    # the placement whose figures describe the endpoint: the dedicated one, else the serverless one
    pl = ded_pl or sls or ok[0]
    prices = inp.prices
    od = prices.dedicated_on_demand_usd_per_gpu_hour[pl.gpu_kind]
    reserved = od * (1 - prices.reserved_discount_fraction)
    # --- economics (whole-GPU, measured figures: the doctrine's method)
    ref = next((p for p in ok if p.gpu_kind == pl.gpu_kind and p.mig_profile is None), pl)
    gpu_s = ref.gpu_s_per_request
    ded_req = costs.dedicated_usd_per_request(gpu_s, od)
    res_req = costs.dedicated_usd_per_request(gpu_s, reserved)
    api_req = None
    be_od = be_res = None
    if ep.managed_api is not None:
        api_req = costs.api_usd_per_request(
            s.input_tokens_mean, s.output_tokens_mean,
            ep.managed_api.usd_per_million_input_tokens, ep.managed_api.usd_per_million_output_tokens,
        )
        be_od = costs.break_even_duty_cycle(ded_req, api_req)
        be_res = costs.break_even_duty_cycle(res_req, api_req)
    sls_kind = ep.serverless.gpu_kind
    premium = costs.serverless_premium(
        prices.serverless_usd_per_gpu_second[sls_kind] * ep.serverless.region_price_multiplier,
        prices.dedicated_on_demand_usd_per_gpu_hour[sls_kind],
    )
    be_hours = costs.serverless_break_even_busy_hours_per_day(premium)
    weekly_req = costs.weekly_requests(demand.mean_rps)
    econ = Economics(
        gpu_s_per_request=round(gpu_s, 4),
        dedicated_usd_per_request_at_saturation=round(ded_req, 7),
        reserved_usd_per_request_at_saturation=round(res_req, 7),
        api_usd_per_request=None if api_req is None else round(api_req, 7),
        break_even_duty_cycle_on_demand=None if be_od is None else round(be_od, 4),
        break_even_duty_cycle_reserved=None if be_res is None else round(be_res, 4),
        serverless_premium=round(premium, 3),
        serverless_break_even_busy_hours_per_day=round(be_hours, 2),
        weekly_requests=round(weekly_req, 1),
        mean_requests_per_s=round(float(demand.mean_rps.mean()), 4),
        peak_requests_per_s=round(float(demand.peak_rps.max()), 4),
    )
    h = ep.prefix_cache_hit_fraction
    derivs += [
        Derivation(
            figure="gpu_s_per_request", value=econ.gpu_s_per_request, unit="GPU-s",
            formula=f"{ref.gpus_per_replica} × ({s.output_tokens_mean:g}/{ref.decode_tokens_per_s:.0f} + "
            f"{s.input_tokens_mean:g}×(1−{h:g})/{ref.prefill_tokens_per_s:g})",
            inputs=("shape.output_tokens_mean", "shape.input_tokens_mean", "engine.decode_tokens_per_s",
                    "engine.prefill_tokens_per_s", "prefix_cache_hit_fraction", "engine.gpus_per_replica"),
        ),
        Derivation(
            figure="dedicated_usd_per_request_at_saturation", value=econ.dedicated_usd_per_request_at_saturation,
            unit="USD", formula=f"{gpu_s:.3f} GPU-s × ${od:g}/GPU-h / 3600",
            inputs=("prices.dedicated_on_demand_usd_per_gpu_hour",),
        ),
        Derivation(
            figure="serverless_break_even_busy_hours_per_day", value=econ.serverless_break_even_busy_hours_per_day,
            unit="h/day", formula=f"24 / premium {premium:.2f} (= ${prices.serverless_usd_per_gpu_second[sls_kind]:g}/GPU-s × "
            f"{ep.serverless.region_price_multiplier:g} × 3600 / ${prices.dedicated_on_demand_usd_per_gpu_hour[sls_kind]:g}/GPU-h)",
            inputs=("prices.serverless_usd_per_gpu_second", "serverless.region_price_multiplier",
                    "prices.dedicated_on_demand_usd_per_gpu_hour"),
        ),
    ]
    if api_req is not None and ep.managed_api is not None:
        derivs += [
            Derivation(
                figure="api_usd_per_request", value=econ.api_usd_per_request or 0.0, unit="USD",
                formula=f"({s.input_tokens_mean:g} × ${ep.managed_api.usd_per_million_input_tokens:g} + "
                f"{s.output_tokens_mean:g} × ${ep.managed_api.usd_per_million_output_tokens:g}) / 1e6",
                inputs=("managed_api.usd_per_million_input_tokens", "managed_api.usd_per_million_output_tokens"),
            ),
            Derivation(
                figure="break_even_duty_cycle_on_demand", value=econ.break_even_duty_cycle_on_demand or 0.0,
                unit="fraction", formula=f"{ded_req:.6f} / {api_req:.6f}", inputs=(),
            ),
        ]
    cap = ReplicaCapacity(
        gpu_kind=pl.gpu_kind, mig_profile=pl.mig_profile, gpus_per_replica=pl.gpus_per_replica,
        replicas_per_gpu=pl.replicas_per_gpu, saturated_requests_per_s=round(pl.saturated_rps, 4),
        slo_utilisation=round(pl.slo_utilisation, 4), planning_utilisation=round(pl.planning_utilisation, 4),
        planning_requests_per_s=round(pl.planning_rps, 4), usable_concurrency=pl.usable_concurrency,
        decode_tokens_per_s=round(pl.decode_tokens_per_s, 2), prefill_tokens_per_s=pl.prefill_tokens_per_s,
        headroom_fraction=ep.headroom_fraction,
    )
    derivs.append(Derivation(
        figure="planning_requests_per_s", value=cap.planning_requests_per_s, unit="req/s per replica",
        formula=f"saturated {pl.saturated_rps:.3f} × min(TTFT-SLO utilisation {pl.slo_utilisation:.3f}, "
        f"1/(1+{ep.headroom_fraction:g}))",
        inputs=("slo.ttft_p99_ms", "slo.inter_token_p99_ms", "headroom_fraction", "engine.max_concurrent_sequences"),
    ))
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
    # --- floors
    floor = win.floor_by_hour if win.floor_by_hour is not None else np.zeros(168, int)
    if win.tier in ("managed_api", "serverless_only"):
        floor = np.zeros(168, int)
    floor_list = [int(x) for x in floor]
    base = min(floor_list)
    lead = lead_time_s(ep, herd)
    windows = floor_windows(floor_list, base, lead)
    floor_spec = FloorSchedule(
        timezone=ep.traffic.timezone, replicas_by_hour=tuple(floor_list), base_replicas=base,
        reserved_replicas=win.reserved_layers if ded_pl else 0, lead_time_s=round(lead, 1), windows=windows,
    )
    derivs.append(Derivation(
        figure="floor_lead_time_s", value=round(lead, 1), unit="s",
        formula=f"new node + pod {ep.cold_starts.new_node_and_pod_s:g} s + start jitter {herd.start_jitter_s} s",
        inputs=("cold_starts.new_node_and_pod_s", "weight_path.shared_path_gb_per_s", "weight_path.per_node_gb_per_s"),
    ))
    # --- autoscaling (dedicated only)
    ramp_rps_per_min = float(np.max(np.diff(np.concatenate([demand.peak_rps, demand.peak_rps[:1]])))) / 60.0
    ramp_rps_per_min = max(ramp_rps_per_min, 0.0)
    warm = ep.cold_starts.pod_on_warm_node_s
    peak = float(demand.peak_rps.max())
    required_headroom = (ramp_rps_per_min / 60.0 * warm) / peak if peak > 0 else 0.0
    autoscaling = None
    pools: list[NodePoolSpec] = []
    if ded_pl is not None:
        step = max(1, min(herd.step_replicas, math.ceil(ramp_rps_per_min / 60.0 * warm / ded_pl.planning_rps) + 1))
        max_rep = min(ep.max_dedicated_replicas, max(floor_list) + herd.step_replicas)
        wait_budget = slo.ttft_p99_ms / 1000.0 - s.input_tokens_p99 * (1 - h) / ded_pl.prefill_tokens_per_s
        target = max(1.0, math.floor(ded_pl.saturated_rps * max(wait_budget, 0.0) * 0.5))
        autoscaling = AutoscalingSpec(
            target_waiting_per_replica=target, min_replicas=base, max_replicas=max_rep, polling_interval_s=15,
            scale_up_pods_per_period=step, scale_up_period_s=60,
            scale_up_stabilization_s=int(min(600, max(30, warm))),
            scale_down_stabilization_s=int(min(3600, max(600, 2 * ep.cold_starts.new_node_and_pod_s))),
            scale_down_pods_per_period=1, scale_down_period_s=120,
            required_headroom_fraction=round(required_headroom, 4),
            steepest_ramp_requests_per_s_per_min=round(ramp_rps_per_min, 4),
        )
        derivs += [
            Derivation(
                figure="target_waiting_per_replica", value=target, unit="requests",
                formula=f"max(1, ⌊saturated {ded_pl.saturated_rps:.3f} req/s × TTFT wait budget {max(wait_budget, 0):.3f} s × 0.5⌋)",
                inputs=("slo.ttft_p99_ms", "shape.input_tokens_p99", "engine.prefill_tokens_per_s"),
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
        ]
        if required_headroom > ep.headroom_fraction and win.tier == "dedicated_only":
            warnings.append(
                f"{ep.name}: the steepest ramp needs {required_headroom:.0%} headroom over a pod cold start "
                f"({warm:g} s) but the plan keeps {ep.headroom_fraction:.0%}: queue builds until new replicas are ready"
            )
        pools = _node_pools(inp, ep, ded_pl, win, max_rep)
    # --- engine
    lora, lora_warn, lora_d = _lora(ep, pl)
    warnings += lora_warn
    derivs += lora_d
    prefix = f"models/{ep.model.name}/{ep.model.revision}/"
    engine = EngineSpec(
        image=DEFAULT_ENGINE_IMAGE, served_model_name=ep.model.name, model_revision=ep.model.revision,
        tokenizer=ep.model.tokenizer, weights_uri_suffix=prefix, max_model_len=s.product_max_context_tokens,
        max_tokens=s.max_tokens, max_num_seqs=pl.usable_concurrency, tensor_parallel_size=pl.gpus_per_replica,
        gpu_memory_utilization=GPU_MEMORY_UTILIZATION, enable_prefix_caching=True,
        cache_salt_per_tenant=len(ep.tenants) > 1, kv_cache_dtype="auto", quantization=None, lora=lora,
    )
    # --- burst
    burst = None
    if win.tier in ("serverless_only", "floor_plus_burst") and sls is not None:
        burst = _burst_spec(inp, ep, demand, sls, win, floor)
        derivs.append(Derivation(
            figure="burst_max_containers", value=burst.max_containers, unit="containers",
            formula=f"⌈max over hours (peak − floor × {pl.planning_rps:.3f}) / {sls.planning_rps:.3f}⌉, cap "
            f"{ep.serverless.max_containers_cap}",
            inputs=("traffic.hourly_mean_requests_per_s", "traffic.within_hour_peak_factor", "serverless.max_containers_cap"),
        ))
    if autoscaling is not None and burst is not None and win.tier == "floor_plus_burst":
        backlog = float(burst.max_containers * burst.target_inputs)
        autoscaling = autoscaling.model_copy(update={"burst_backlog_threshold": backlog})
        derivs.append(Derivation(
            figure="burst_backlog_threshold", value=backlog, unit="requests in flight to burst",
            formula=f"max_containers {burst.max_containers} × target_inputs {burst.target_inputs}: beyond the burst's "
            "planned capacity the floor scales up as well",
            inputs=("serverless.max_containers_cap", "traffic.hourly_mean_requests_per_s"),
        ))
    gateway = _gateway_spec(ep, pl, burst)
    monthly = round(costs.monthly_from_weekly(win.weekly_usd), 2)
    alternatives = tuple(
        AlternativeCost(
            option=o.tier, feasible=o.feasible,
            monthly_usd=round(costs.monthly_from_weekly(o.weekly_usd), 2) if o.feasible else None,
            reason=o.reason,
            breakdown_usd={k: round(costs.monthly_from_weekly(v), 2) for k, v in o.breakdown_weekly.items()},
        )
        for o in options
    )
    spec = EndpointSpec(
        name=ep.name, model_name=ep.model.name, model_revision=ep.model.revision, tier=win.tier,
        runner_up=runner.tier if runner else None, why_runner_up_lost=why, alternatives=alternatives,
        economics=econ, capacity=cap, node_pools=tuple(p.name for p in pools),
        layers=tuple(win.layers) if ded_pl else (), floor=floor_spec, autoscaling=autoscaling, herd=herd,
        engine=engine, burst=burst, gateway=gateway, mig_decision=_mig_decision(ep, options, ok, win),
        pod_cold_start_s=ep.cold_starts.pod_on_warm_node_s, node_cold_start_s=ep.cold_starts.new_node_and_pod_s,
        serverless_cold_start_s=serverless_cold_start_s(ep),
        slo_ttft_p99_ms=slo.ttft_p99_ms, slo_inter_token_p99_ms=slo.inter_token_p99_ms,
        planned_prefix_cache_hit_fraction=ep.prefix_cache_hit_fraction, planned_input_tokens_p99=s.input_tokens_p99,
        longest_request_s=gateway.max_request_s, drain_grace_s=gateway.max_request_s + 15,
        startup_budget_s=math.ceil(1.5 * ep.cold_starts.pod_on_warm_node_s + herd.start_jitter_s),
        monthly_usd=monthly, derivations=tuple(derivs), warnings=tuple(warnings),
    )
    weekly = dict(win.breakdown_weekly)
    return _EndpointPlan(spec, pools, weekly, ded_pl is not None, burst is not None)


def _node_pools(inp: CostInputs, ep: EndpointInputs, pl: Placement, win: OptionEval, max_rep: int) -> list[NodePoolSpec]:
    rpn = pl.replicas_per_node
    layout = None
    labels = {"serving.llm/endpoint": ep.name, "serving.llm/gpu": pl.gpu_kind}
    if pl.mig_profile:
        prof = GPU_KINDS[pl.gpu_kind].profile(pl.mig_profile)
        devices = {pl.mig_profile: prof.max_instances_per_gpu if prof else 1}
        try:
            validate_mig_layout(pl.gpu_kind, devices)
        except MigLayoutError as e:  # the planner only emits catalog layouts; this guards catalog edits
            raise PlanningError(str(e)) from e
        layout = MigLayoutSpec(name=f"all-{pl.mig_profile}", devices=devices)
        labels["nvidia.com/mig.config"] = layout.name
    pools = []
    reserved_nodes = math.ceil(win.reserved_layers / rpn) if win.reserved_layers else 0
    common = dict(
        region=inp.cluster_region, gpu_kind=pl.gpu_kind, instance_type=pl.instance_type,
        gpus_per_node=pl.gpus_per_node, mig_layout=layout, local_nvme_gb=pl.local_nvme_gb,
    )
    if reserved_nodes:
        pools.append(NodePoolSpec(
            name=f"{ep.name}-reserved", capacity_type="reserved", min_nodes=reserved_nodes, max_nodes=reserved_nodes,
            labels={**labels, "serving.llm/capacity": "reserved"}, **common,
        ))
    od_max = math.ceil(max(0, max_rep - reserved_nodes * rpn) / rpn)
    if od_max:
        pools.append(NodePoolSpec(
            name=f"{ep.name}-on-demand", capacity_type="on_demand", min_nodes=0, max_nodes=od_max,
            labels={**labels, "serving.llm/capacity": "on-demand"}, **common,
        ))
    return pools


def _burst_spec(
    inp: CostInputs, ep: EndpointInputs, demand: Demand, sls: Placement, win: OptionEval, floor: np.ndarray
) -> BurstSpec:
    cold = serverless_cold_start_s(ep)
    warm = win.warm_min_by_hour if win.warm_min_by_hour is not None else np.zeros(168, int)
    always = bool(warm.min() >= 1)
    schedule = () if always else _hour_windows(warm > 0, 1, cold)
    max_c = max(1, min(ep.serverless.max_containers_cap, win.burst_max_containers))
    ramp_rps_per_s = max(0.0, float(np.max(np.diff(demand.peak_rps)))) / 3600.0
    buffer = min(max_c, math.ceil(ramp_rps_per_s * cold / sls.planning_rps)) if win.tier == "serverless_only" else 0
    kind = GPU_KINDS[sls.gpu_kind]
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
        weights_bucket=_bucket_name(inp, ep.serverless.weights_region), min_containers_schedule=schedule,
        schedule_timezone=ep.traffic.timezone,
    )


def longest_request_s(ep: EndpointInputs, pl: Placement) -> int:
    """Longest one request may run: prefill of a max-context prompt plus max_tokens at the inter-token SLO,
    doubled for margin, plus a minute for queueing and cold starts (never under 5 minutes)."""
    prefill_max = ep.shape.product_max_context_tokens / pl.prefill_tokens_per_s
    t = math.ceil(prefill_max + ep.shape.max_tokens * ep.slo.inter_token_p99_ms / 1000.0 * 2 + 60)
    return int(min(86400, max(300, t)))


def _gateway_spec(ep: EndpointInputs, pl: Placement, burst: BurstSpec | None) -> GatewaySpec:
    s = ep.shape
    cold = serverless_cold_start_s(ep) if burst is not None else 0.0
    prefill_max = s.product_max_context_tokens * (1 - ep.prefix_cache_hit_fraction) / pl.prefill_tokens_per_s
    first_byte = int(min(300, max(30, math.ceil(ep.slo.ttft_p99_ms / 1000.0 + cold + prefill_max))))
    inter_chunk = int(min(30, max(10, math.ceil(2 * prefill_max + 5))))
    multi = len(ep.tenants) > 1
    tenants = tuple(
        TenantSpec(name=t, api_key_secret_key=f"{t}-api-key", cache_salt_secret_key=f"{t}-cache-salt" if multi else None)
        for t in ep.tenants
    )
    canary = None
    if ep.canary_percent > 0 and ep.canary_revision:
        peak = max(ep.traffic.hourly_mean_requests_per_s or [0.0]) * ep.traffic.within_hour_peak_factor
        canary = CanarySpec(
            percent=ep.canary_percent, revision=ep.canary_revision,
            weights_uri_suffix=f"models/{ep.model.name}/{ep.canary_revision}/",
            replicas=max(1, math.ceil(peak * ep.canary_percent / 100.0 / pl.planning_rps - 1e-9)),
        )
    return GatewaySpec(
        overflow_inflight_per_replica=max(1, math.floor(pl.usable_concurrency * pl.planning_utilisation)),
        first_byte_timeout_s=first_byte, max_request_s=longest_request_s(ep, pl), inter_chunk_timeout_s=inter_chunk,
        sse_heartbeat_s=heartbeat_interval_s(),
        max_request_body_bytes=s.product_max_context_tokens * OVERHEAD_BYTES_PER_TOKEN + BODY_SLACK_BYTES,
        max_tokens=s.max_tokens, retry_budget_fraction=RETRY_BUDGET_FRACTION, max_retries=1,
        sticky_hash_header="X-Session-Id", cache_isolation="cache_salt" if multi else "single_tenant",
        tenants=tenants, canary=canary,
    )


def _bucket_name(inp: CostInputs, region: str) -> str:
    return f"{inp.project}-{inp.environment}-weights-{region}"


# --------------------------------------------------------------------------------------------------
# The fleet
# --------------------------------------------------------------------------------------------------


def plan(inputs: CostInputs, catalog: Mapping[str, GpuKind] = GPU_KINDS) -> TopologySpec:
    """Plan every endpoint; the fixed platform cost is shared by the endpoints that use the cluster."""
    import hashlib

    weekly_fixed = inputs.prices.platform_fixed_usd_per_month / costs.WEEKS_PER_MONTH
    n = len(inputs.endpoints)
    prepared = [_prepare_endpoint(inputs, ep, catalog) for ep in inputs.endpoints]
    sharing = n  # start by assuming every endpoint shares the cluster, then settle the real count
    for _ in range(n + 1):
        share = weekly_fixed / max(1, sharing)
        decided = [_decide(ep, _with_platform_share(p.options, share)) for ep, p in zip(inputs.endpoints, prepared)]
        users = sum(1 for win, _, _ in decided if win.tier in ("dedicated_only", "floor_plus_burst"))
        if users == 0 or users == sharing:
            break
        sharing = users
    plans: list[_EndpointPlan] = []
    for ep, p, (win, runner, why) in zip(inputs.endpoints, prepared, decided):
        options = _with_platform_share(p.options, share)
        plans.append(_build_endpoint_spec(inputs, ep, p.demand, p.ok, p.sls, p.herd, options, win, runner, why))
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
    prefixes = sorted({f"models/{e.model.name}/{e.model.revision}/" for e in inputs.endpoints}
                      | {f"models/{e.model.name}/{e.canary_revision}/" for e in inputs.endpoints if e.canary_revision})
    caches = tuple(
        WeightCacheSpec(
            region=r.name, bucket_name=_bucket_name(inputs, r.name), source_bucket=inputs.weights_source_bucket,
            source_region=inputs.weights_source_region or inputs.cluster_region,
            model_prefixes=tuple(prefixes), vpc_id=r.vpc_id, protect=True,
        )
        for r in inputs.regions
    )
    return TopologySpec(
        spec_version=SPEC_VERSION, project=inputs.project, environment=inputs.environment,
        prices_as_of=inputs.prices.prices_as_of,
        inputs_sha256=hashlib.sha256(inputs.model_dump_json().encode()).hexdigest(),
        cluster_region=inputs.cluster_region,
        node_pools=tuple(pool for p in plans for pool in p.pools), weight_caches=caches,
        endpoints=tuple(p.spec for p in plans), monthly_usd_by_tier=monthly,
        monthly_usd_total=round(sum(monthly.values()), 2), warnings=tuple(warnings),
    )
