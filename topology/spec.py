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
    runs_fraction: float = Field(default=0.0, description="Share of the week's hours this node runs (reserved: 1).")
    serverless_usd_per_month: float = Field(
        default=0.0, description="Of monthly_usd, the serverless bill for the hours it is needed but not running.")


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
    target_waiting_per_replica: float = Field(description="KEDA AverageValue target of requests waiting per replica "
                                              "(from the admission wait: a saturated replica's bounded queue must reach it).")
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


class EngineMetrics(_Spec):
    """Names of the engine's Prometheus series, as stored (counters `_total`, histogram buckets `_bucket`), for
    the pinned vLLM version (topology/engines.py): alerts and autoscaler queries read them from here."""

    requests_waiting: str = Field(description="Gauge: requests queued in the scheduler (the KEDA trigger).")
    requests_running: str = Field(description="Gauge: requests in the running batch.")
    kv_cache_usage: str = Field(description="Gauge: share of KV-cache blocks in use, 0..1.")
    preemptions_total: str = Field(description="Counter: requests preempted.")
    prefix_cache_queries_total: str = Field(description="Counter: prompt tokens looked up in the prefix cache.")
    prefix_cache_hits_total: str = Field(description="Counter: prompt tokens found in the prefix cache.")
    prompt_tokens_bucket: str = Field(description="Histogram buckets: prompt tokens per finished request.")
    ttft_seconds_bucket: str = Field(description="Histogram buckets: time to first token, s.")
    inter_token_seconds_bucket: str = Field(description="Histogram buckets: gap between output tokens, s.")


class EngineSpec(_Spec):
    """vLLM engine settings; the floor and the burst tier use exactly these (responses must not depend on the tier)."""

    image: str = Field(description="Pinned vLLM OpenAI server image.")
    vllm_version: str = Field(description="The vLLM version the image tag pins; picks the row of topology/engines.py.")
    request_log_flags: tuple[str, ...] = Field(
        description="Flags keeping per-request logging off for this version (empty where off is the default)."
    )
    metrics: EngineMetrics = Field(description="The engine's metric names for this version.")
    served_model_name: str
    model_revision: str
    tokenizer: str
    weights_uri_suffix: str = Field(description="Path of the weights under each weight cache, e.g. 'models/llama/rev/'.")
    max_model_len: int = Field(description="= the product limit, never the model's maximum.")
    max_tokens: int = Field(description="Per-endpoint generation cap.")
    max_num_seqs: int
    max_num_batched_tokens: int | None = Field(
        default=None,
        description="Tokens one engine step may carry (running decodes plus prompt chunks): vLLM's own default for "
        "the device, rendered so the plan's per-token gap arithmetic and the engine agree (None: a spec saved "
        "before it, vLLM picks).")
    tensor_parallel_size: int
    gpu_memory_utilization: float
    enable_prefix_caching: bool
    cache_salt_per_tenant: bool
    kv_cache_dtype: str
    quantization: str | None
    lora: LoraSettings | None
    port: int = 8000

    @property
    def serves_lora(self) -> bool:
        """The engine serves LoRA adapters (and vLLM's filesystem resolver loads them by name)."""
        return self.lora is not None and self.lora.enable_lora

    def adapters_path(self, model_path: str) -> str | None:
        """Where the revision's adapters are copied with it (`<model_path>/<adapters_subdir>`), None without LoRA."""
        if not self.serves_lora:
            return None
        return f"{model_path.rstrip('/')}/{self.lora.adapters_subdir}"

    def vllm_env(self, model_path: str, lora_dir: str | None = None) -> dict[str, str]:
        """The engine's environment, the single source for both tiers: offline hubs, and with LoRA, vLLM's
        filesystem resolver loading an adapter by name from `<lora_dir>/<name>` on first use. lora_dir: the
        tier's resolver folder, adapters whose adapter_config.json names `model_path` as their base (the resolver
        compares it with the engine's model; components/fetch_weights.sh, modal_apps/settings.py); None: the
        adapters as copied, `adapters_path`."""
        env = dict(ENGINE_OFFLINE_ENV)
        adapters = self.adapters_path(model_path)
        if adapters is not None:
            env.update({
                "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true",
                "VLLM_PLUGINS": "lora_filesystem_resolver",
                "VLLM_LORA_RESOLVER_CACHE_DIR": lora_dir or adapters,
            })
        return env

    def vllm_args(self, model_path: str, max_num_batched_tokens: int | None = None) -> list[str]:
        """The `vllm serve` command line, the single source for both tiers; max_num_batched_tokens: the burst
        container's own step budget (its GPU may differ from the floor's), never below max_num_seqs."""
        budget = self.max_num_batched_tokens
        if max_num_batched_tokens is not None:
            budget = max(max_num_batched_tokens, self.max_num_seqs)
        args = [
            "vllm", "serve", model_path,
            "--served-model-name", self.served_model_name,
            "--tokenizer", model_path,
            "--max-model-len", str(self.max_model_len),
            "--max-num-seqs", str(self.max_num_seqs),
            *(["--max-num-batched-tokens", str(budget)] if budget is not None else []),
            "--tensor-parallel-size", str(self.tensor_parallel_size),
            "--gpu-memory-utilization", f"{self.gpu_memory_utilization:.2f}",
            "--kv-cache-dtype", self.kv_cache_dtype,
            "--generation-config", "vllm",
            "--override-generation-config", json.dumps({"max_new_tokens": self.max_tokens}),
            "--port", str(self.port),
            *self.request_log_flags,
        ]
        args.append("--enable-prefix-caching" if self.enable_prefix_caching else "--no-enable-prefix-caching")
        if self.quantization:
            args += ["--quantization", self.quantization]
        if self.serves_lora:
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
    # defaults: Modal's own reservation, what a spec saved before these fields deployed (docs/guide/resources)
    cpu_cores: float = Field(default=0.125, description="Physical CPU cores each container reserves (Modal `cpu=`).")
    memory_mib: int = Field(default=128, description="Host memory each container reserves, MiB (Modal `memory=`).")
    usd_per_container_hour: float = Field(
        default=0.0,
        description="What one running container bills an hour: GPUs, cores and memory, times the region multiplier "
        "(reported; left out of what the app is shipped, so a price update redeploys nothing).")
    planning_requests_per_s: float = Field(description="Requests/s one container is planned to carry at peak.")
    region: str
    min_containers: int = Field(description="Warm containers outside scheduled windows (0 = scale to zero).")
    max_containers: int = Field(description="Sized to the peak above the floor, capped by the input cap.")
    buffer_containers: int
    scaledown_window_s: int
    startup_timeout_s: int
    timeout_s: int = Field(description="Longest a single request may run (max_tokens at the inter-token SLO, plus prefill).")
    max_inputs: int = Field(description="@modal.concurrent max_inputs: concurrent requests per container.")
    max_num_batched_tokens: int | None = Field(
        default=None,
        description="The container engine's --max-num-batched-tokens, for its own GPU (the floor's may be a MIG "
        "slice); None: a spec saved before it, the engine spec's.")
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
    spike_warm_hours_of_week: tuple[int, ...] = Field(
        default=(),
        description="Hours of the week (Monday 00:00 = 0) whose minimum holds containers warm for that spike "
        "(traffic.spike_warm_hours_fraction, busiest first); a spike in any other hour waits out its first restore.",
    )
    spike_warm_usd_per_month: float = Field(
        default=0.0, description="What holding those warm containers adds to the serverless bill, $/month.",
    )


class TenantSpec(_Spec):
    name: str
    api_key_secret_key: str = Field(description="Key in the gateway's API-key Secret holding this tenant's key.")
    cache_salt_secret_key: str | None = Field(description="Key holding the tenant's cache_salt (None: single tenant).")


class CanarySpec(_Spec):
    """Canary by user or session (never per request): a stable hash of the id picks the candidate's users."""

    percent: float = Field(description="Share of users (hash buckets) sent to the candidate.")
    revision: str = Field(description="Candidate weights revision.")
    hash_key: Literal["user", "session"] = "user"
    user_header: str = Field(default="X-User-Id", description="Header carrying the user id the canary hash reads.")
    weights_uri_suffix: str = Field(description="Path of the candidate revision's weights under each weight cache.")
    replicas: int = Field(description="Candidate replicas: its share of users at peak, at the planning rate (≥ 1).")
    version: str | None = Field(default=None, description="Candidate model-version name (None: a bare revision canary); a new candidate reshuffles who is in the canary (the hash is seeded by this name, else the revision).")
    full_at_inflight_per_replica: int = Field(
        default=0, ge=0, description="The candidate is full when every candidate replica has this many requests in flight "
        "(the floor's overflow threshold); 0 = no limit given.",
    )
    overflow_to_incumbent: bool = Field(
        default=True, description="A canary user's request arriving when the candidate is full (or has no ready replica) goes "
        "to the incumbent (floor, then burst), never to an error and never queued behind the candidate.",
    )


class ShadowSpec(_Spec):
    """Shadow mirroring for the gateway: a copy of a bounded share of requests goes to the candidate and its answer is
    discarded. The user's request is served by the incumbent exactly as without shadow: it never waits for the
    mirror, its response never depends on it, and a slow or dead candidate costs the user nothing."""

    percent: float = Field(description="Share of requests mirrored (chosen per request: no user sees the candidate's output).")
    version: str = Field(description="Candidate model-version name.")
    candidate_backend: Literal["canary_pods"] = Field(
        default="canary_pods", description="Where mirrors go: the candidate track's headless Service (the gateway's canary servers)."
    )
    max_inflight: int = Field(description="Mirrors in flight above this are skipped, never queued (candidate replicas × overflow threshold).")
    replicas: int = Field(description="Candidate replicas sized for the mirrored share at peak.")
    responses_discarded: Literal[True] = Field(default=True, description="Always true: shadow output reaches no user.")


class ModelVersionSpec(_Spec):
    """A model version's identity: weights revision + engine image + the engine settings that can change outputs."""

    version: str = Field(description="Version name; labels its pods (serving.llm/model-version).")
    weights_revision: str
    engine_image: str
    engine_settings: dict[str, str] = Field(description="The output-changing engine settings (topology.rollout.OUTPUT_SETTINGS).")
    engine_settings_sha256: str = Field(description="16 hex digits over engine_settings (what an evaluation record names).")
    identity_sha256: str = Field(description="16 hex digits over weights, image and settings.")


class EvalEvidenceSpec(_Spec):
    """The offline evaluation that let the candidate out of the eval gate."""

    source: str = Field(description="The evaluation-record file it was read from.")
    metric: str
    value: float
    threshold: float
    higher_is_better: bool
    dataset: str
    evaluated_on: dt.date


class OutcomeMetricSpec(_Spec):
    name: str = Field(description="The canary's outcome metric (what users act on), compared candidate vs incumbent.")
    higher_is_better: bool
    comparison_window_hours: int


class PreviousWarmSpec(_Spec):
    """N−1 warm: after promotion the previous version keeps a warm minimum, so a rollback needs no cold start."""

    version: ModelVersionSpec
    engine: EngineSpec = Field(description="The previous version's engine settings (what its warm pods run).")
    replicas: int = Field(description="Warm replicas of the previous version (a fixed Deployment, outside autoscaling).")
    warm_until: dt.date = Field(description="promoted_on + previous_warm_days; the Deployment is removed from this date on.")
    active: bool = Field(description="planning date < warm_until (or no date given): the components declare the warm Deployment.")
    usd_per_day: float = Field(description="Warm replicas × GPUs per replica × on-demand $/GPU-h × 24.")
    window_usd: float = Field(description="usd_per_day × previous_warm_days: the whole window's price.")


class QualitySamplingSpec(_Spec):
    sample_fraction: float = Field(description="Share of production requests and responses sampled, per model version.")
    sink_uri: str = Field(description="s3://bucket/prefix/ of the evaluation sink.")
    prefixes: dict[str, str] = Field(description="Version name -> s3:// prefix its samples are written under.")


class RolloutSpec(_Spec):
    """One endpoint's rollout: who serves, who is candidate, what the gate saw, and what each stage costs."""

    stage: Literal["shadow", "canary", "promoted", "rolled_back"]
    incumbent: ModelVersionSpec
    candidate: ModelVersionSpec
    candidate_engine: EngineSpec = Field(description="Engine settings of the candidate's pods (the incumbent's, with its changes).")
    served_version: str = Field(description="The version the stable track serves (the candidate once promoted).")
    eval: EvalEvidenceSpec | None = Field(description="The passing evaluation (None only when rolled back).")
    shadow_percent: float
    canary_percent: float
    canary_hash_key: Literal["user", "session"]
    outcome_metric: OutcomeMetricSpec
    candidate_replicas: int = Field(description="Candidate pods in shadow or canary (0 in other stages).")
    candidate_usd_per_day: float = Field(description="Candidate pods × GPUs × on-demand $/GPU-h × 24 (0 when none).")
    promoted_on: dt.date | None
    previous_warm_replicas: int = Field(description="Replicas of the previous version kept warm after promotion (N−1).")
    previous_warm_days: int = Field(description="Days they are kept warm after promotion.")
    previous_warm_usd_per_day: float = Field(description="Their price per day, known before promotion so it can be budgeted.")
    previous: PreviousWarmSpec | None = Field(description="The warm previous version after promotion (None before).")
    floor_backend_version: str | None = Field(
        description="When set, the floor's headless Service selects pods of this version (stable and warm previous "
        "tracks alike): a rollback after promotion reaches the warm N−1 pods at once, not after a rolling redeploy."
    )
    quality_sampling: QualitySamplingSpec | None
    shadow_licenses_promotion: Literal[False] = Field(
        default=False, description="Always false: shadow checks latency, memory and output distributions; no user acted on its output."
    )


class GatewaySpec(_Spec):
    """What the HAProxy gateway enforces for this endpoint."""

    overflow_inflight_per_replica: int = Field(description="In-flight per floor replica above which requests go to burst.")
    first_byte_timeout_s: int = Field(description="Time-to-first-byte limit (TTFT + burst cold start + prefill at max context).")
    max_request_s: int = Field(description="Limit for a non-streamed request, which sends nothing until done (= longest_request_s).")
    inter_chunk_timeout_s: int = Field(description="Idle limit between streamed chunks; never a total request timeout.")
    sse_heartbeat_s: float = Field(description="Silence after which the gateway sends an SSE comment line "
                                   "(topology/gateway_timing.py: tightest idle timeout on the path / 4).")
    max_request_body_bytes: int = Field(description="Bodies above this get 413 before reaching a GPU.")
    max_tokens: int
    retry_budget_fraction: float = Field(description="Retries allowed as a share of requests.")
    max_retries: int = Field(description="Retries per request, only before any response byte.")
    sticky_hash_header: str = Field(description="Header hashed for session-sticky floor routing.")
    cache_isolation: Literal["single_tenant", "cache_salt", "separate_pools"]
    tenants: tuple[TenantSpec, ...]
    canary: CanarySpec | None
    shadow: ShadowSpec | None = Field(default=None, description="Shadow mirroring to the candidate (rollout stage shadow).")
    admission_queue_timeout_s: float | None = Field(
        default=None,
        description="Admission control: longest a request may wait at the gateway for a sequence slot (floor: "
        "per-server maxconn = admission_inflight_per_floor_replica; burst: admission_burst_inflight in flight); "
        "past it the gateway answers 429 with Retry-After. = the TTFT budget − prefill of a p99 prompt − the first "
        "token's gap at the admission cap, so an admitted request can still meet its TTFT SLO. None: no admission "
        "control (managed API).",
    )
    admission_inflight_per_floor_replica: int = Field(
        default=0,
        description="Requests a floor replica holds at once (the gateway's per-server maxconn): the largest batch "
        "whose token gap meets the inter-token SLO with the neighbours' mean prompt at its p99, at most max_num_seqs; "
        "beyond it (and beyond the burst's limit) requests wait in the gateway queue.",
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
    admission_queue_per_floor_replica: int = Field(
        default=0,
        description="Requests that may wait for admission per floor replica up: ⌈μ·w⌉, what one replica held at its "
        "admission cap (μ req/s) admits within the bounded wait w; a request finding the queue at that length per "
        "replica gets 429 at once (it would wait w and get 429 anyway), so a flood past the pod's connections drains "
        "instead of queueing behind the accept backlog. 0: no bound.",
    )


class PodResourcesSpec(_Spec):
    """CPU and memory of one floor replica's pod (topology/pod_resources.py); the arithmetic is in derivations."""

    instance_type: str = Field(description="Instance the share was cut from.")
    replicas_per_node: int = Field(description="Replicas sharing one node (GPU slots per node).")
    cpu_request_millicores: int
    cpu_limit_millicores: int
    memory_request_mib: int
    memory_limit_mib: int
    shm_mib: int = Field(description="Memory-backed /dev/shm (NCCL); charged to the pod's memory, inside the limit.")
    qos_class: Literal["Guaranteed", "Burstable"] = Field(
        description="Guaranteed (requests = limits) when the node's share per replica covers the engine's minimum."
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
    pod_resources: PodResourcesSpec | None = Field(
        default=None, description="CPU and memory of a floor replica's pod (None: no dedicated replicas)."
    )
    startup_budget_s: int = Field(
        description="Startup probe budget: 1.5 × the measured pod cold start + the start jitter (a slow start is not "
        "killed into a restart loop)."
    )
    monthly_usd: float
    derivations: tuple[Derivation, ...]
    warnings: tuple[str, ...]
    rollout: RolloutSpec | None = Field(default=None, description="A model rollout in progress (None: none).")

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


def saved_spec_problems(spec: TopologySpec) -> list[str]:
    """What makes a spec read from a file (for `diff`) unlike any spec `plan()` writes: an unknown version,
    repeated names, negative figures, min above max. Field paths as in the JSON; empty when sound."""
    problems: list[str] = []
    if spec.spec_version != SPEC_VERSION:
        problems.append(f"spec_version = {spec.spec_version!r}: unknown; this version reads {SPEC_VERSION!r}")
    for what, names in (("endpoints", [e.name for e in spec.endpoints]), ("node_pools", [p.name for p in spec.node_pools]),
                        ("weight_caches", [w.region for w in spec.weight_caches])):
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            problems.append(f"{what}: {', '.join(map(repr, dup))} appears more than once")
    # every figure a plan writes is a count, a price, a rate, a share or a duration: never negative
    stack: list[tuple[object, str]] = [(spec.model_dump(mode="json", exclude={"endpoints": {"__all__": {"derivations"}}}), "")]
    while stack:
        v, where = stack.pop()
        if isinstance(v, dict):
            stack.extend((x, f"{where}.{k}" if where else k) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((x, f"{where}.{i}") for i, x in enumerate(v))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0:
            problems.append(f"{where} = {v!r}: negative; a plan never writes a negative figure")
    for i, e in enumerate(spec.endpoints):
        if len(e.floor.replicas_by_hour) != 168:
            problems.append(f"endpoints.{i}.floor.replicas_by_hour: {len(e.floor.replicas_by_hour)} values; needs 168")
        if e.autoscaling is not None and e.autoscaling.min_replicas > e.autoscaling.max_replicas:
            problems.append(f"endpoints.{i}.autoscaling: min_replicas {e.autoscaling.min_replicas} > max_replicas "
                            f"{e.autoscaling.max_replicas}")
    for i, p in enumerate(spec.node_pools):
        if p.min_nodes > p.max_nodes:
            problems.append(f"node_pools.{i}: min_nodes {p.min_nodes} > max_nodes {p.max_nodes}")
    return sorted(problems)
