"""TopologySpec: the contract every consumer reads (Pulumi components, the Modal app, the gateway, the simulator).

Frozen, JSON round-trips, versioned. Consumers never re-decide what is written here: a decision a
consumer needs and the spec lacks belongs in the spec. Each endpoint carries `derivations`: the
arithmetic, with the input fields it read, that produced each figure.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .timebase import MINUTES_PER_WEEK

SPEC_VERSION = "1"

Tier = Literal["managed_api", "serverless_only", "dedicated_only", "floor_plus_burst"]
LayerTier = Literal["reserved", "scheduled_on_demand", "serverless_burst"]
CapacityType = Literal["reserved", "on_demand"]


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Derivation(_Spec):
    """One figure and the arithmetic that produced it."""

    figure: str = Field(description="What was derived, e.g. 'gpu_s_per_request'.")
    value: float = Field(description="The derived value.")
    unit: str = Field(description="Unit of the value.")
    formula: str = Field(description="The arithmetic with the numbers substituted.")
    inputs: tuple[str, ...] = Field(default=(), description="Input fields the figure was derived from.")


class AlternativeCost(_Spec):
    option: Tier
    feasible: bool = Field(description="Can this option meet the SLO and the environment's rules?")
    monthly_usd: float | None = Field(description="Monthly cost on the hour-of-week profile (None when infeasible).")
    reason: str = Field(description="Why it is infeasible, or what its cost consists of.")
    breakdown_usd: dict[str, float] = Field(default_factory=dict, description="Monthly cost by part.")


class Economics(_Spec):
    gpu_s_per_request: float = Field(description="GPU-seconds per request at saturation.")
    dedicated_usd_per_request_at_saturation: float
    reserved_usd_per_request_at_saturation: float
    api_usd_per_request: float | None
    break_even_duty_cycle_on_demand: float | None = Field(description="Duty cycle above which on-demand beats the API.")
    break_even_duty_cycle_reserved: float | None
    serverless_premium: float = Field(description="Serverless $/GPU-s over on-demand $/GPU-s (region pinning included).")
    serverless_break_even_busy_hours_per_day: float = Field(
        description="Busy hours/day above which a dedicated replica beats serverless."
    )
    weekly_requests: float
    mean_requests_per_s: float
    peak_requests_per_s: float = Field(description="Highest hourly mean × within-hour peak factor.")


class ReplicaCapacity(_Spec):
    gpu_kind: str
    mig_profile: str | None = Field(description="MIG slice one replica runs on; None = whole GPUs.")
    gpus_per_replica: int
    replicas_per_gpu: int = Field(description="Replicas sharing one GPU (MIG slices per GPU); 1 for whole GPUs.")
    saturated_requests_per_s: float = Field(description="Requests/s one replica completes at saturation.")
    slo_utilisation: float = Field(description="Highest utilisation at which the TTFT p99 SLO holds.")
    planning_utilisation: float = Field(description="min(slo_utilisation, 1/(1+headroom)).")
    planning_requests_per_s: float = Field(description="Requests/s one replica is planned to carry at peak.")
    usable_concurrency: int = Field(description="Sequences per replica: min(memory, inter-token SLO).")
    decode_tokens_per_s: float = Field(description="Aggregate decode tok/s of a replica at usable_concurrency.")
    prefill_tokens_per_s: float = Field(description="Prefill tok/s of a replica.")
    headroom_fraction: float
    kv_capacity_tokens: float = Field(
        description="KV cache of one replica, tokens: memory × gpu_memory_utilization − weights − overhead, over KV per token."
    )
    decode_step_floor_s: float = Field(
        description="Decode step time at batch 0 (the weights read once over the memory bandwidth), s: t_min of the "
        "decode line t(b) = t_min + b·k."
    )
    decode_step_s_per_sequence: float = Field(
        description="k of the decode line: step time added per sequence in the batch, s (unrounded, with t_min it "
        "reproduces decode_tokens_per_s at usable_concurrency)."
    )
    replicas_per_node: int = Field(description="Replicas one node of this placement carries.")
    gpus_per_node: int = Field(description="GPUs of the smallest instance type that fits a replica.")

    @property
    def gpu_fraction_per_replica(self) -> float:
        """GPUs one replica bills: a MIG slice bills its share of the GPU."""
        return self.gpus_per_replica / self.replicas_per_gpu


class CapacityLayer(_Spec):
    index: int = Field(description="1 = the bottom node of the load-duration curve (a node carries replicas_per_node replicas).")
    duty_fraction: float = Field(description="Share of the week's hours this layer is needed.")
    tier: LayerTier
    monthly_usd: float
    costs_usd_per_month: dict[str, float] = Field(description="What each tier would cost for this layer.")


class FloorWindow(_Spec):
    """A clock window with at least `replicas` ready; starts ahead of the demand rise by the cold-start lead."""

    start_minute_of_week: int = Field(ge=0, lt=MINUTES_PER_WEEK, description="Monday 00:00 = 0, in the profile's timezone.")
    end_minute_of_week: int = Field(ge=0, lt=MINUTES_PER_WEEK, description="Exclusive end; may be < start when wrapping past Sunday.")
    replicas: int = Field(ge=1)
    demand_rise_minute_of_week: int | None = Field(
        description="When the demand this window serves begins (start + lead), None when it is not a rise."
    )


class FloorSchedule(_Spec):
    timezone: str
    replicas_by_hour: tuple[int, ...] = Field(description="168 values: replicas that must be ready in each hour.")
    base_replicas: int = Field(description="Always-on replicas (reserved): the autoscaler's minimum.")
    reserved_replicas: int
    lead_time_s: float = Field(description="How far ahead of a rise a window starts (the dedicated cold start).")
    windows: tuple[FloorWindow, ...] = Field(description="Windows above the base, for cron triggers.")


class AutoscalingSpec(_Spec):
    metric: Literal["vllm:num_requests_waiting"] = "vllm:num_requests_waiting"
    target_waiting_per_replica: float = Field(description="KEDA AverageValue target of requests waiting per replica.")
    min_replicas: int
    max_replicas: int = Field(description="Hard cap: nothing scales without one.")
    polling_interval_s: int
    scale_up_pods_per_period: int = Field(description="Capped scale-up step (thundering herd, ramp).")
    scale_up_period_s: int
    scale_up_stabilization_s: int
    scale_down_stabilization_s: int
    scale_down_pods_per_period: int
    scale_down_period_s: int
    required_headroom_fraction: float = Field(description="steepest ramp × cold start / peak: what headroom must absorb.")
    burst_backlog_threshold: float | None = Field(
        default=None,
        description="floor_plus_burst: requests in flight to the burst tier above its planned capacity "
        "(max_containers × target_inputs); beyond it the floor scales up too, since the burst is saturated.",
    )
    steepest_ramp_requests_per_s_per_min: float


class HerdSpec(_Spec):
    weights_gb: float
    shared_path_gb_per_s: float
    per_node_gb_per_s: float
    concurrent_loads_at_full_speed: int = Field(description="Replicas that load at per-node speed before the path saturates.")
    step_replicas: int = Field(description="Largest scale-up step whose weight load stays within acceptable_load_s.")
    step_load_s: float = Field(description="Weight load time for one full step.")
    start_jitter_s: int = Field(description="Random delay window each pod waits before pulling weights.")


# Every hub client offline and no telemetry: weights and tokenizer come from the local copy only. Both tiers
# run the engine with exactly this environment (plus the LoRA resolver when adapters are served).
ENGINE_OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


class LoraSettings(_Spec):
    adapters_subdir: str = Field(
        default="adapters",
        description="Folder under the model revision's prefix holding one folder per adapter (adapters are trained "
        "against a base revision, so they travel with it through the weight caches and the Modal volume).",
    )
    enable_lora: bool
    max_loras: int
    max_cpu_loras: int
    max_lora_rank: int
    adapters_gb_on_gpu: float
    memory_headroom_gb: float


class EngineSpec(_Spec):
    """vLLM engine settings; the floor and the burst tier use exactly these (responses must not depend on the tier)."""

    image: str = Field(description="Pinned vLLM OpenAI server image.")
    served_model_name: str
    model_revision: str
    tokenizer: str
    weights_uri_suffix: str = Field(description="Path of the weights under each weight cache, e.g. 'models/llama/rev/'.")
    max_model_len: int = Field(description="= the product limit, never the model's maximum.")
    max_tokens: int = Field(description="Per-endpoint generation cap.")
    max_num_seqs: int
    tensor_parallel_size: int
    gpu_memory_utilization: float
    enable_prefix_caching: bool
    cache_salt_per_tenant: bool
    kv_cache_dtype: str
    quantization: str | None
    lora: LoraSettings | None
    port: int = 8000

    def vllm_env(self, model_path: str) -> dict[str, str]:
        """The engine's environment, the single source for both tiers: offline hubs, and with LoRA, vLLM's
        filesystem resolver loading an adapter by name from `<model_path>/<adapters_subdir>/<name>` on first use."""
        env = dict(ENGINE_OFFLINE_ENV)
        if self.lora is not None and self.lora.enable_lora:
            env.update({
                "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true",
                "VLLM_PLUGINS": "lora_filesystem_resolver",
                "VLLM_LORA_RESOLVER_CACHE_DIR": f"{model_path.rstrip('/')}/{self.lora.adapters_subdir}",
            })
        return env

    def vllm_args(self, model_path: str) -> list[str]:
        """The `vllm serve` command line, the single source for both tiers."""
        args = [
            "vllm", "serve", model_path,
            "--served-model-name", self.served_model_name,
            "--tokenizer", model_path,
            "--max-model-len", str(self.max_model_len),
            "--max-num-seqs", str(self.max_num_seqs),
            "--tensor-parallel-size", str(self.tensor_parallel_size),
            "--gpu-memory-utilization", f"{self.gpu_memory_utilization:.2f}",
            "--kv-cache-dtype", self.kv_cache_dtype,
            "--generation-config", "vllm",
            "--override-generation-config", json.dumps({"max_new_tokens": self.max_tokens}),
            "--port", str(self.port),
            "--disable-log-requests",
        ]
        args.append("--enable-prefix-caching" if self.enable_prefix_caching else "--no-enable-prefix-caching")
        if self.quantization:
            args += ["--quantization", self.quantization]
        if self.lora is not None and self.lora.enable_lora:
            args += [
                "--enable-lora",
                "--max-loras", str(self.lora.max_loras),
                "--max-cpu-loras", str(self.lora.max_cpu_loras),
                "--max-lora-rank", str(self.lora.max_lora_rank),
            ]
        return args


class MinContainersWindow(_Spec):
    start_minute_of_week: int = Field(ge=0, lt=MINUTES_PER_WEEK)
    end_minute_of_week: int = Field(ge=0, lt=MINUTES_PER_WEEK)
    min_containers: int = Field(ge=1)


class BurstSpec(_Spec):
    """Serverless (Modal) capacity: the whole endpoint when serverless_only, the overflow when floor_plus_burst."""

    provider: Literal["modal"] = "modal"
    app_name: str
    environment: str
    gpu: str = Field(description="Modal `gpu=` string, e.g. 'H100' or 'H100:2'.")
    gpu_kind: str
    gpus_per_container: int = Field(description="GPUs per container (the engine's tensor-parallel size).")
    planning_requests_per_s: float = Field(description="Requests/s one container is planned to carry at peak.")
    region: str
    min_containers: int = Field(description="Warm containers outside scheduled windows (0 = scale to zero).")
    max_containers: int = Field(description="Sized to the peak above the floor, capped by the input cap.")
    buffer_containers: int
    scaledown_window_s: int
    startup_timeout_s: int
    timeout_s: int = Field(description="Longest a single request may run (max_tokens at the inter-token SLO, plus prefill).")
    max_inputs: int = Field(description="@modal.concurrent max_inputs: concurrent requests per container.")
    target_inputs: int = Field(description="@modal.concurrent target_inputs: the autoscaler's per-container target.")
    enable_memory_snapshot: bool
    enable_gpu_snapshot: bool
    requires_proxy_auth: bool = True
    volume_name: str
    weights_region: str = Field(description="AWS region whose weight cache fills the Modal Volume.")
    weights_bucket: str
    min_containers_schedule: tuple[MinContainersWindow, ...] = Field(
        description="Clock-following minimum re-applied by a scheduled function (empty: none)."
    )
    schedule_timezone: str
    web_request_cap_s: int = Field(
        default=150,
        description="Modal answers a web request running past this with a 303 redirect, which OpenAI clients do "
        "not follow: a non-streamed burst request must finish within it.",
    )
    non_streamed_rule: Literal["fits", "cap_max_tokens", "floor_only", "require_streaming"] = Field(
        default="fits",
        description="What the gateway does with a non-streamed request (no `stream: true`) it would send to burst: "
        "'fits' nothing (max_tokens finishes within web_request_cap_s); 'cap_max_tokens' lower its max_tokens to "
        "non_streamed_max_tokens; 'floor_only' never overflow it to burst (it queues on the floor); "
        "'require_streaming' answer 400 (streaming required) instead of sending it to burst.",
    )
    non_streamed_max_tokens: int | None = Field(
        default=None,
        description="With 'cap_max_tokens': the max_tokens a non-streamed burst request gets (it finishes within "
        "web_request_cap_s at the container's per-sequence decode rate after the TTFT budget).",
    )
    spike_containers: int = Field(
        default=0,
        description="Containers the planned spike (traffic.spike_factor × the peak for spike_minutes) needs above "
        "the floor; max_containers covers it up to serverless.max_containers_cap.",
    )


class TenantSpec(_Spec):
    name: str
    api_key_secret_key: str = Field(description="Key in the gateway's API-key Secret holding this tenant's key.")
    cache_salt_secret_key: str | None = Field(description="Key holding the tenant's cache_salt (None: single tenant).")


class CanarySpec(_Spec):
    percent: float
    revision: str
    hash_key: Literal["user", "session"] = "user"
    user_header: str = Field(default="X-User-Id", description="Header carrying the user id the canary hash reads.")
    weights_uri_suffix: str = Field(description="Path of the candidate revision's weights under each weight cache.")
    replicas: int = Field(description="Candidate replicas: its share of users at peak, at the planning rate (≥ 1).")


class GatewaySpec(_Spec):
    """What the HAProxy gateway enforces for this endpoint."""

    overflow_inflight_per_replica: int = Field(description="In-flight per floor replica above which requests go to burst.")
    first_byte_timeout_s: int = Field(description="Time-to-first-byte limit (TTFT + burst cold start + prefill at max context).")
    max_request_s: int = Field(description="Limit for a non-streamed request, which sends nothing until done (= longest_request_s).")
    inter_chunk_timeout_s: int = Field(description="Idle limit between streamed chunks; never a total request timeout.")
    max_request_body_bytes: int = Field(description="Bodies above this get 413 before reaching a GPU.")
    max_tokens: int
    retry_budget_fraction: float = Field(description="Retries allowed as a share of requests.")
    max_retries: int = Field(description="Retries per request, only before any response byte.")
    sticky_hash_header: str = Field(description="Header hashed for session-sticky floor routing.")
    cache_isolation: Literal["single_tenant", "cache_salt", "separate_pools"]
    tenants: tuple[TenantSpec, ...]
    canary: CanarySpec | None
    admission_queue_timeout_s: float | None = Field(
        default=None,
        description="Admission control: longest a request may wait at the gateway for a sequence slot (floor: "
        "per-server maxconn = admission_inflight_per_floor_replica; burst: admission_burst_inflight in flight); "
        "past it the gateway answers 429 with Retry-After. = the TTFT budget − prefill of a p99 prompt − one decode "
        "step, so an admitted request can still meet its TTFT SLO. None: no admission control (managed API).",
    )
    admission_inflight_per_floor_replica: int = Field(
        default=0,
        description="Requests a floor replica holds at once (its max_num_seqs slots): the gateway's per-server "
        "maxconn; beyond it (and beyond the burst's limit) requests wait in the gateway queue.",
    )
    admission_burst_inflight: int = Field(
        default=0,
        description="Requests in flight to the burst tier at once: max_containers × max_inputs (its capacity at the "
        "spike it is sized for); beyond it requests wait in the gateway queue, then 429.",
    )
    retry_after_s: int = Field(
        default=0,
        description="Retry-After on a 429: the time a new burst container takes to serve (cold start), at least 1 s.",
    )


class EndpointSpec(_Spec):
    name: str
    model_name: str
    model_revision: str
    tier: Tier
    runner_up: Tier | None
    why_runner_up_lost: str
    alternatives: tuple[AlternativeCost, ...]
    economics: Economics
    capacity: ReplicaCapacity
    node_pools: tuple[str, ...] = Field(description="Node pools the dedicated replicas run on (empty: none).")
    layers: tuple[CapacityLayer, ...]
    floor: FloorSchedule
    autoscaling: AutoscalingSpec | None
    herd: HerdSpec
    engine: EngineSpec
    burst: BurstSpec | None
    burst_capacity: ReplicaCapacity | None = Field(
        description="One burst container's capacity and physics (the serverless placement); None without a burst tier."
    )
    gateway: GatewaySpec
    mig_decision: str = Field(description="Why MIG slices or whole GPUs were chosen.")
    pod_cold_start_s: float = Field(description="Measured: pod on a warm node to first token (startup probe budget).")
    node_cold_start_s: float = Field(description="Measured: new node + pod to first token.")
    serverless_cold_start_s: float = Field(description="Measured: serverless container start (snapshot restore when on).")
    slo_ttft_p99_ms: float = Field(description="The endpoint's TTFT p99 SLO (input), for alerts and checks.")
    slo_inter_token_p99_ms: float = Field(description="The endpoint's inter-token p99 SLO (input).")
    planned_prefix_cache_hit_fraction: float = Field(description="Prefix-cache hit share the plan assumed (input).")
    planned_input_tokens_p99: float = Field(description="p99 prompt length the plan assumed (input), tokens.")
    longest_request_s: int = Field(
        description="Longest a single request may run: prefill at the max context + max_tokens at the inter-token "
        "SLO, with margin. Bounds non-streamed requests at the gateway and the burst function timeout."
    )
    drain_grace_s: int = Field(
        description="Pod termination grace: in-flight streams finish before a replica goes (longest_request_s + 15 s)."
    )
    startup_budget_s: int = Field(
        description="Startup probe budget: 1.5 × the measured pod cold start + the start jitter (a slow start is not "
        "killed into a restart loop)."
    )
    monthly_usd: float
    derivations: tuple[Derivation, ...]
    warnings: tuple[str, ...]

    @property
    def has_floor(self) -> bool:
        """Dedicated replicas on the cluster (dedicated_only, floor_plus_burst)."""
        return self.tier in ("dedicated_only", "floor_plus_burst")

    @property
    def has_burst(self) -> bool:
        """A serverless tier carries traffic (serverless_only, floor_plus_burst); `burst` is then set."""
        return self.burst is not None and self.tier in ("serverless_only", "floor_plus_burst")

    @property
    def gated(self) -> bool:
        """Served by our own replicas behind the gateway (every tier but managed_api)."""
        return self.tier != "managed_api"


class MigLayoutSpec(_Spec):
    name: str = Field(description="mig-parted config name, set as the node label nvidia.com/mig.config.")
    devices: dict[str, int] = Field(description="profile -> instances per GPU.")


class NodePoolSpec(_Spec):
    name: str
    region: str
    gpu_kind: str
    instance_type: str
    gpus_per_node: int
    capacity_type: CapacityType
    min_nodes: int
    max_nodes: int
    mig_layout: MigLayoutSpec | None
    local_nvme_gb: int
    labels: dict[str, str]
    taint_key: str = "nvidia.com/gpu"


class WeightCacheSpec(_Spec):
    region: str
    bucket_name: str
    source_bucket: str
    source_region: str = Field(description="Region of the source-of-truth bucket (replication reads from there).")
    model_prefixes: tuple[str, ...] = Field(description="Prefixes (per model revision) replicated and readable by serving pods.")
    vpc_id: str | None
    protect: bool = True

    def uri(self, prefix: str) -> str:
        return f"s3://{self.bucket_name}/{prefix}"


class TopologySpec(_Spec):
    spec_version: str = SPEC_VERSION
    project: str
    environment: str
    prices_as_of: dt.date
    inputs_sha256: str = Field(description="Hash of the canonical inputs JSON this spec was planned from.")
    cluster_region: str
    node_pools: tuple[NodePoolSpec, ...]
    weight_caches: tuple[WeightCacheSpec, ...]
    endpoints: tuple[EndpointSpec, ...]
    monthly_usd_by_tier: dict[str, float]
    monthly_usd_total: float
    warnings: tuple[str, ...]

    def endpoint(self, name: str) -> EndpointSpec:
        for e in self.endpoints:
            if e.name == name:
                return e
        raise KeyError(f"no endpoint {name!r}; endpoints: {[e.name for e in self.endpoints]}")

    def weight_cache(self, region: str) -> WeightCacheSpec:
        for w in self.weight_caches:
            if w.region == region:
                return w
        raise KeyError(f"no weight cache in {region!r}")

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    @classmethod
    def from_json(cls, text: str) -> "TopologySpec":
        return cls.model_validate_json(text)

    def sha256(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()
