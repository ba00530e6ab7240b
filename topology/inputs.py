"""Cost inputs: what a team measures and prices before deciding how to serve a model.

Every field carries its unit in its name and a description (a test fails otherwise). These models
are the boundary of the planner: anything wrong with user input is reported here, naming the field,
the value and what is allowed, before any arithmetic runs.
"""

from __future__ import annotations

import datetime as dt
import re
import warnings
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from .errors import FieldsError, InputNotice
from .input_model import InputModel, not_after_today
from .names import (
    MODAL_BROAD_MULTIPLIER,
    MODAL_NAME_MAX,
    burst_app_name,
    check_aws_region,
    check_bucket_name,
    check_revision,
    check_model_name,
    check_modal_region,
    check_timezone,
    config_name,
    modal_region_multiplier,
    tenant_env_names,
)

from .engines import DEFAULT_ENGINE_IMAGE
from .rollout import RolloutInputs
from .timebase import HOURS_PER_WEEK

TENANT_NAME_MAX = 63  # a tenant name spells Secret keys, env variables and HAProxy lines: kept to a DNS label's length
TENANT_NAME = re.compile(r"(?=.*[A-Za-z0-9])[A-Za-z0-9_-]{1,%d}" % TENANT_NAME_MAX)  # with a letter or digit
PRICES_MAX_AGE_DAYS = 183  # list prices older than about six months have usually moved: warn, do not refuse


def first_repeat(keys: list) -> tuple[int, int] | None:
    """(first index, index of its first repeat) of the first key met twice, or None when all differ."""
    seen: dict = {}
    for i, k in enumerate(keys):
        j = seen.setdefault(k, i)
        if j != i:
            return j, i
    return None


GpuKindName = Literal["H100-80GB", "H200-141GB", "A100-80GB", "A100-40GB", "L40S-48GB"]
Precision = Literal["bf16", "fp16", "fp8", "int8", "int4"]


_Inputs = InputModel


class ModelInputs(_Inputs):
    """The model served by one endpoint."""

    name: str = Field(min_length=1, description="Served model name, e.g. 'llama-3.3-70b-instruct' (what clients send as "
                      "\"model\"); endpoints of one stack may share it.")
    revision: str = Field(
        min_length=1,
        description="Pinned weights revision (commit hash or release tag); floor and burst load exactly this one.",
    )
    parameters_billion: float = Field(gt=0, le=5000, description="Parameter count in billions.")
    precision: Precision = Field(description="Weight precision as served (bf16, fp16, fp8, int8, int4).")
    weights_gb: float = Field(gt=0, le=5000, description="Size of the served weights in GB (10^9 bytes).")
    tokenizer: str = Field(min_length=1, description="Tokenizer identity; LoRA adapters and both tiers must share it.")
    base_model: str = Field(
        min_length=1, description="Base model identity; every LoRA adapter must be trained on this base."
    )
    architecture_max_context_tokens: int = Field(
        gt=0, le=10_000_000, description="The model's own maximum context (tokens); the product limit is usually lower."
    )
    kv_cache_mib_per_token: float = Field(
        ge=0.0001,  # a 1B model's KV at 8 bits is about 0.015 MiB a token
        le=64,
        description="KV-cache memory per token in MiB at the served KV precision "
        "(2 × layers × kv_heads × head_dim × bytes / 2^20; Llama-3 70B bf16 KV: 0.3125).",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_model_name(v)  # becomes an S3 prefix, the served model name and a PromQL label value

    @field_validator("revision")
    @classmethod
    def _revision(cls, v: str) -> str:
        return check_revision(v)  # becomes a pod label value and an S3 prefix


class ApiOffer(_Inputs):
    """A managed API serving the same model (None on the endpoint when no API can: custom weights, data rules)."""

    provider: str = Field(min_length=1, description="Who sells it, e.g. 'together', 'fireworks', 'bedrock'.")
    usd_per_million_input_tokens: float = Field(ge=0, le=1000, description="Price per million input tokens, USD.")
    usd_per_million_output_tokens: float = Field(ge=0, le=1000, description="Price per million output tokens, USD.")
    measured_ttft_p99_ms: float = Field(
        gt=0, le=600_000, description="Measured p99 time to first token of the API for this request shape, ms."
    )


class RequestShape(_Inputs):
    """The token shape of the traffic, as measured in production or load tests."""

    input_tokens_mean: float = Field(ge=1, le=10_000_000, description="Mean prompt length, tokens.")
    input_tokens_p99: float = Field(gt=0, le=10_000_000, description="p99 prompt length, tokens.")
    output_tokens_mean: float = Field(ge=1, le=1_000_000, description="Mean generated length, tokens (a request generates at least one).")
    output_tokens_p99: float = Field(gt=0, le=1_000_000, description="p99 generated length, tokens.")
    product_max_context_tokens: int = Field(
        gt=0,
        le=10_000_000,
        description="The longest prompt + generation the product supports (tokens); becomes --max-model-len.",
    )
    max_tokens: int = Field(gt=0, le=1_000_000, description="Per-endpoint cap on generated tokens per request.")

    @model_validator(mode="after")
    def _ordered(self) -> "RequestShape":
        if self.input_tokens_p99 < self.input_tokens_mean:
            raise FieldsError(('input_tokens_p99', 'input_tokens_mean'), 
                f"input_tokens_p99={self.input_tokens_p99:g} is below input_tokens_mean="
                f"{self.input_tokens_mean:g}; a p99 must be at least the mean"
            )
        if self.output_tokens_p99 < self.output_tokens_mean:
            raise FieldsError(('output_tokens_p99', 'output_tokens_mean'), 
                f"output_tokens_p99={self.output_tokens_p99:g} is below output_tokens_mean="
                f"{self.output_tokens_mean:g}; a p99 must be at least the mean"
            )
        if self.output_tokens_p99 > self.max_tokens:
            # max_tokens caps every output (the gateway and the engine hold a request to it): a measured p99 above
            # it is a shape from another product or a typo, and the plan would size for outputs that never happen
            raise FieldsError(('output_tokens_p99', 'max_tokens'),
                f"output_tokens_p99={self.output_tokens_p99:g} is above max_tokens={self.max_tokens}, which caps "
                "every output; give the shape measured under that cap, or raise max_tokens"
            )
        if self.max_tokens >= self.product_max_context_tokens:
            raise FieldsError(('max_tokens', 'product_max_context_tokens'), 
                f"max_tokens={self.max_tokens} must be below product_max_context_tokens="
                f"{self.product_max_context_tokens} (a request needs room for its prompt)"
            )
        if self.input_tokens_p99 + self.output_tokens_mean > self.product_max_context_tokens:
            raise FieldsError(('input_tokens_p99', 'output_tokens_mean', 'product_max_context_tokens'), 
                f"input_tokens_p99 + output_tokens_mean = {self.input_tokens_p99 + self.output_tokens_mean:g} "
                f"exceeds product_max_context_tokens={self.product_max_context_tokens}; raise the product "
                "limit or the measured shape is wrong"
            )
        return self


class RateTrace(_Inputs):
    """A rate trace (CSV of window start seconds and mean requests/s) turned into an hour-of-week profile."""

    path: str = Field(min_length=1, description="CSV file with columns window_start_s,total_rate_rps (ServeGen form).")
    scale_to_mean_requests_per_s: float = Field(
        gt=0, le=1_000_000, description="Scale the trace so its weekly mean equals this many requests/s."
    )
    start_weekday: Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"] = Field(
        default="mon", description="Weekday of the trace's first window (window 0 starts at local midnight)."
    )
    zero_rate_is_traffic: bool = Field(
        default=False,
        description="A window with rate 0 is a real idle window; by default it is a gap with no data and skipped.",
    )


class Traffic(_Inputs):
    """Demand by hour of week (hour 0 = Monday 00:00 in `timezone`)."""

    timezone: str = Field(default="UTC", description="IANA timezone of the hour-of-week profile, e.g. 'America/New_York'.")
    hourly_mean_requests_per_s: list[float] | None = Field(
        default=None,
        description="168 values: mean requests/s in each hour of the week, Monday 00:00 first.",
    )
    within_hour_peak_factor: float = Field(
        default=1.5,
        ge=1,
        le=20,
        description=(
            "Busiest minute's request rate over the hour's mean rate (burstiness inside an hour), averaged over "
            "hours. Measurable from the gateway's request log: per-minute counts of each hour, Poisson noise "
            "removed, measured together with idle_minute_share "
            "(topology.plan.serverless.within_hour_from_minute_counts; `calibrate` does). Default 1.5: the bundled "
            "ServeGen, Mooncake and Azure-conversation replays measure 1.0-1.5 (Azure code: 7.3 at 0.3 req/s, "
            "3.3 at 3, 1.5 at 30)."
        ),
    )
    arrival_cluster_size: float = Field(
        default=1.0,
        ge=1,
        le=1000,
        description=(
            "Requests that arrive together (1 = independent arrivals): the variance over the mean of request "
            "counts in 10-second windows within each minute, from the gateway's request log "
            "(topology.plan.serverless.cluster_size_from_counts). Default 1: ServeGen, Mooncake and "
            "Azure-conversation replays measure 1.0-1.4; batch-submitting clients (Azure code) measure 10-70."
        ),
    )
    within_hour_correlation_s: float = Field(
        default=0.0,
        ge=0,
        le=3600,
        description=(
            "How long the within-hour rate factor persists, s: the minute rates' autocorrelation falls as "
            "e^(-lag / this). 0 = each minute's rate independent of the last. Measurable from the gateway's "
            "request log: the lag-1 autocorrelation of per-minute counts, Poisson noise removed "
            "(topology.plan.serverless.correlation_s_from_minute_counts). Default 0: the simulator's synthetic "
            "and rate-trace weeks draw minutes independently; replayed request traces measure 0 to 3600 "
            "(Azure code at 0.3 req/s 106-123)."
        ),
    )
    idle_minute_share: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description=(
            "Share of minutes in which the endpoint gets no request beyond what Poisson noise explains (clients "
            "that come and go): the within-hour rate is 0 in them, and the busiest minute "
            "(within_hour_peak_factor) is that of the minutes with traffic. Measurable from the gateway's request "
            "log: the share of empty minutes beyond those Poisson arrivals at the within-hour rate leave "
            "(topology.plan.serverless.within_hour_from_minute_counts; `calibrate` does). Default 0: every "
            "minute's rate from the "
            "within-hour factor alone (the simulator's synthetic and rate-trace weeks); the bundled Azure code "
            "trace replayed at 0.3 req/s measures about 0.5 (61% of its minutes are empty)."
        ),
    )
    rate_trace: RateTrace | None = Field(
        default=None,
        description="Derive the profile from a rate trace instead (resolved by topology.load_inputs before planning).",
    )
    spike_factor: float = Field(
        default=3.0, ge=1, le=20,
        description="Spike the endpoint must absorb: traffic × this over the busiest hour's peak for spike_minutes. "
        "Default 3 (the doctrine's spike drill: a launch, a retry storm or a client batch job triples traffic); "
        "burst headroom is sized to it, beyond it the gateway sheds (429).",
    )
    spike_minutes: float = Field(
        default=10.0, gt=0, le=240,
        description="Duration of that spike, minutes (default 10: the doctrine's drill; longer spikes are what the "
        "floor's autoscaler, not burst headroom, must carry).",
    )
    spike_warm_hours_fraction: float = Field(
        default=0.0, ge=0, le=1,
        description="Share of the week's hours, busiest first (by the hour's peak rate), in which the burst tier is "
        "kept warm for that spike: a clock-following min_containers sized so that the spike's excess over the floor "
        "is carried by ready containers while the autoscaler's new ones restore, priced in the plan. Outside these "
        "hours a spike's first serverless cold start is waited out at Modal by the requests sent to burst, which "
        "miss the TTFT SLO. Default 0 (none: warm containers bill every hour they are held); 0.1 is the busiest "
        "10% of hours, where the simulator's SLO-at-peak bar applies.",
    )
    non_streamed_fraction: float = Field(
        default=0.25, ge=0, le=1,
        description="Share of requests sent without stream=true (they get nothing until done). No public figure "
        "exists; 0.25 assumes chat UIs stream and API/batch callers do not. Measure it from gateway logs.",
    )

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, v: str) -> str:
        return check_timezone(v)

    @field_validator("hourly_mean_requests_per_s")
    @classmethod
    def _profile(cls, v: list[float] | None) -> list[float] | None:
        if v is None:
            return v
        if len(v) != HOURS_PER_WEEK:
            raise ValueError(f"needs exactly {HOURS_PER_WEEK} values (one per hour of the week), got {len(v)}")
        for i, x in enumerate(v):
            if not (x >= 0) or x > 1_000_000:
                raise ValueError(f"hour {i} has {x!r} requests/s; allowed 0 to 1,000,000")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> "Traffic":
        if (self.hourly_mean_requests_per_s is None) == (self.rate_trace is None):
            raise FieldsError(('hourly_mean_requests_per_s', 'rate_trace'), "give exactly one of hourly_mean_requests_per_s (168 values) or rate_trace")
        return self


class Slo(_Inputs):
    """The service level the endpoint promises; everything else is derived from it."""

    ttft_p99_ms: float = Field(gt=0, le=600_000, description="p99 time to first token, ms.")
    inter_token_p99_ms: float = Field(gt=0, le=60_000, description="p99 gap between streamed tokens, ms.")


class MigCapacity(_Inputs):
    """Measured engine capacity on one MIG slice (optional: defaults to the slice's share of the GPU)."""

    profile: str = Field(min_length=1, description="MIG profile, e.g. '3g.40gb'.")
    decode_tokens_per_s: float = Field(ge=1, le=1e7, description="Saturated aggregate output tokens/s on the slice.")
    prefill_tokens_per_s: float = Field(ge=1, le=1e8, description="Prefill tokens/s on the slice.")
    max_concurrent_sequences: int = Field(gt=0, le=4096, description="Concurrent sequences the slice holds.")


class EngineCapacity(_Inputs):
    """Measured throughput of one replica of the engine on one GPU kind (vLLM benchmark at saturation)."""

    gpu_kind: GpuKindName = Field(description="GPU kind the figures were measured on.")
    gpus_per_replica: int = Field(default=1, ge=1, le=16, description="GPUs per replica (tensor parallel size).")
    decode_tokens_per_s: float = Field(
        ge=1, le=1e7, description="Saturated aggregate output tokens/s of one replica (all sequences together)."
    )
    prefill_tokens_per_s: float = Field(ge=1, le=1e8, description="Prefill (prompt) tokens/s of one replica.")
    max_concurrent_sequences: int = Field(gt=0, le=4096, description="Concurrent sequences one replica holds at the shape.")
    mig: list[MigCapacity] = Field(default_factory=list, description="Measured figures per MIG profile, if any.")

    @field_validator("mig")
    @classmethod
    def _one_entry_per_profile(cls, v: list[MigCapacity]) -> list[MigCapacity]:
        seen: dict[str, int] = {}
        for i, m in enumerate(v):
            if m.profile in seen:
                raise ValueError(
                    f"MIG profile {m.profile!r} is listed twice (entries {seen[m.profile]} and {i}); "
                    "give one measured entry per profile"
                )
            seen[m.profile] = i
        return v


class ColdStarts(_Inputs):
    """Measured cold starts, seconds from the decision to scale to the first token served."""

    new_node_and_pod_s: float = Field(gt=0, le=7200, description="New GPU node joins, pod starts, weights load, warm-up passes.")
    pod_on_warm_node_s: float = Field(gt=0, le=7200, description="Pod on an already-running node: weights load + warm-up.")
    serverless_snapshot_restore_s: float = Field(gt=0, le=3600, description="Serverless container restored from a GPU snapshot.")
    serverless_no_snapshot_s: float = Field(gt=0, le=7200, description="Serverless container booting the engine from scratch.")

    @model_validator(mode="after")
    def _ordered(self) -> "ColdStarts":
        if self.pod_on_warm_node_s > self.new_node_and_pod_s:
            raise FieldsError(("pod_on_warm_node_s", "new_node_and_pod_s"),
                f"pod_on_warm_node_s={self.pod_on_warm_node_s:g} exceeds new_node_and_pod_s="
                f"{self.new_node_and_pod_s:g}; a new node cannot be faster than a warm one"
            )
        return self


class WeightPath(_Inputs):
    """The path weights travel from the region-local cache to serving nodes (the thundering-herd path)."""

    shared_path_gb_per_s: float = Field(
        ge=0.001, le=1000, description="Aggregate GB/s the region-local cache delivers to all nodes together."
    )
    per_node_gb_per_s: float = Field(ge=0.001, le=1000, description="GB/s one node can pull (NIC / disk bound).")
    acceptable_load_s: float = Field(
        default=180, gt=0, le=3600, description="Longest acceptable weight load during a scale-up step, s."
    )


class LoraAdapters(_Inputs):
    """Per-customer fine-tunes served as LoRA adapters on the shared base."""

    count: int = Field(ge=0, le=100_000, description="Adapters in total.")
    rank: int = Field(ge=1, le=512, description="Largest adapter rank.")
    size_mb: float = Field(gt=0, le=100_000, description="Size of one adapter on GPU, MB.")
    active_working_set: int = Field(
        ge=1, le=100_000, description="Distinct adapters typically in flight within a few seconds."
    )

    @model_validator(mode="after")
    def _working_set(self) -> "LoraAdapters":
        if self.active_working_set > max(self.count, 1):
            raise FieldsError(('active_working_set', 'count'), f"active_working_set={self.active_working_set} exceeds count={self.count}")
        return self


class Serverless(_Inputs):
    """The serverless tier (Modal) used for serverless-only or for burst above a dedicated floor."""

    gpu_kind: GpuKindName = Field(description="GPU kind for serverless containers.")
    region: str = Field(default="us-east", description="Modal region the containers are pinned to.")
    region_price_multiplier: float | None = Field(
        default=None, ge=1, le=3,
        description="Price multiplier for pinning a region, on GPU, CPU and memory alike. Default: Modal's for the "
        "region — 1.5 for a broad one ('us', 'eu': no '-'), 1.75 for a narrow one ('us-east', 'eu-west') "
        "(modal.com/docs/guide/region-selection); a value that differs is kept (a negotiated price) with a notice.",
    )
    gpu_snapshots: bool = Field(default=True, description="Restore from GPU memory snapshots (fast cold start).")
    scaledown_window_s: int = Field(default=120, ge=2, le=3600, description="Idle seconds before a container stops.")
    max_containers_cap: int = Field(
        default=20, ge=0, le=10_000, description="Hard cap on burst containers, whatever the plan sizes."
    )
    cpu_cores_per_container: float | None = Field(
        default=None, ge=0.125, le=64,
        description="Physical CPU cores each container reserves (Modal `cpu=`; billed at the greater of this and the "
        "usage). Default: 2 + the container's GPUs, vLLM's documented minimum (one core each for the API server, the "
        "engine core's busy loop and every GPU worker; docs/configuration/optimization.md, 'CPU Resources for GPU "
        "Deployments').",
    )
    memory_gib_per_container: float | None = Field(
        default=None, gt=0, le=2048,
        description="Host memory each container reserves, GiB (Modal `memory=`; billed at the greater of this and the "
        "usage). Default: the served weights (model.weights_gb): with GPU snapshots the engine sleeps at level 1 before "
        "the snapshot, which backs the weights up in host memory (vLLM's sleep-mode docs: 'make sure there's enough CPU "
        "memory to store the model weights'), and without them the weights pass through the page cache as they load. "
        "Set it to the usage Modal reports when that is higher.",
    )
    weights_region: str = Field(
        description="AWS region of the weight cache the Modal Volume is filled from (nearest to `region`)."
    )

    @field_validator("region")
    @classmethod
    def _modal_region(cls, v: str) -> str:
        return check_modal_region(v)

    @property
    def price_multiplier(self) -> float:
        """The region multiplier that applies: the input's, else Modal's for the region."""
        if self.region_price_multiplier is not None:
            return self.region_price_multiplier
        return modal_region_multiplier(self.region)

    @model_validator(mode="after")
    def _region_multiplier(self) -> "Serverless":
        listed = modal_region_multiplier(self.region)
        if self.region_price_multiplier is not None and self.region_price_multiplier != listed:
            warnings.warn(InputNotice(
                f"serverless.region_price_multiplier={self.region_price_multiplier:g} for region {self.region!r}: "
                f"Modal lists {listed:g}× for a {'broad' if listed == MODAL_BROAD_MULTIPLIER else 'narrow'} region "
                "(modal.com/docs/guide/region-selection); the plan uses the value given"), stacklevel=2)
        return self

    @field_validator("weights_region")
    @classmethod
    def _aws_region(cls, v: str) -> str:
        return check_aws_region(v)


class EndpointInputs(_Inputs):
    """One served endpoint: a model, its traffic and its SLO."""

    name: str = Field(
        min_length=1, max_length=40, pattern=r"^[a-z][a-z0-9-]*[a-z0-9]$",
        description="DNS-safe endpoint name, e.g. 'chat'.",
    )
    model: ModelInputs = Field(description="The model served.")
    shape: RequestShape = Field(description="Token shape of the requests.")
    traffic: Traffic = Field(description="Demand by hour of week.")
    slo: Slo = Field(description="Latency SLO.")
    engine: list[EngineCapacity] = Field(min_length=1, description="Measured capacity per GPU kind.")
    cold_starts: ColdStarts = Field(description="Measured cold starts.")
    weight_path: WeightPath = Field(description="Weight delivery path from the region-local cache.")
    serverless: Serverless = Field(description="Serverless tier settings.")
    managed_api: ApiOffer | None = Field(default=None, description="A managed API for this model, if one exists.")
    prefix_cache_hit_fraction: float = Field(
        default=0.0, ge=0, lt=1, description="Expected share of prompt tokens served from the prefix cache."
    )
    tenants: list[str] = Field(
        default_factory=lambda: ["default"], min_length=1,
        description="Tenants sharing the endpoint; more than one means per-tenant cache_salt. Names: 1–63 ASCII "
        "letters, digits, '-' or '_', distinct even with case and runs of '-'/'_' ignored (the gateway folds them).",
    )
    lora: LoraAdapters | None = Field(default=None, description="Per-customer LoRA adapters, if any.")
    headroom_fraction: float = Field(
        default=0.25, ge=0.2, le=0.3, description="Spare capacity at peak (doctrine: 20–30%)."
    )
    max_dedicated_replicas: int = Field(
        default=16, ge=0, le=1000, description="Hard cap on dedicated replicas for this endpoint."
    )
    scale_to_zero_allowed: bool = Field(
        default=True,
        description="May the endpoint have zero warm replicas when idle (a product decision: cold starts/day vs idle cost)?",
    )
    rollout: RolloutInputs | None = Field(
        default=None, description="A model rollout: eval gate → shadow → canary by user → promote, N−1 kept warm."
    )
    engine_image: str = Field(
        default=DEFAULT_ENGINE_IMAGE, min_length=1, max_length=300,
        description="Pinned vLLM OpenAI server image, tagged with its version (vX.Y.Z); the version picks the engine "
        "flags and metric names (topology/engines.py lists the supported series).",
    )

    @field_validator("tenants")
    @classmethod
    def _tenant_names(cls, v: list[str]) -> list[str]:
        for t in v:
            if not TENANT_NAME.fullmatch(t):
                raise ValueError(f"tenant name {t[:80]!r} must be 1–{TENANT_NAME_MAX} ASCII letters, digits, '-' or "
                                 "'_', with at least one letter or digit")
        if len(set(v)) != len(v):
            raise ValueError(f"tenant names repeat: {v}")
        # the gateway spells tenants folded (config_name: case and runs of '-'/'_' ignored); two that fold alike
        # would be one tenant there, answering with each other's keys and cache salt
        clash = first_repeat([config_name(t) for t in v])
        if clash:
            a, b = v[clash[0]], v[clash[1]]
            raise ValueError(f"tenant names {a!r} and {b!r} are the same tenant to the gateway (both spelt "
                             f"{config_name(b)!r}: case and '-'/'_' runs are folded); rename one")
        return v

    @model_validator(mode="after")
    def _cross(self) -> "EndpointInputs":
        if self.shape.product_max_context_tokens > self.model.architecture_max_context_tokens:
            raise FieldsError(("shape.product_max_context_tokens", "model.architecture_max_context_tokens"),
                f"shape.product_max_context_tokens={self.shape.product_max_context_tokens} exceeds "
                f"model.architecture_max_context_tokens={self.model.architecture_max_context_tokens}"
            )
        kinds = [e.gpu_kind for e in self.engine]
        if len(set(kinds)) != len(kinds):
            raise FieldsError(("engine",), f"engine lists a GPU kind twice: {kinds}")
        if self.serverless.gpu_kind not in kinds:
            raise FieldsError(("serverless.gpu_kind", "engine"),
                f"serverless.gpu_kind={self.serverless.gpu_kind} has no measured engine capacity; "
                f"measured kinds: {kinds}"
            )
        return self


class Prices(_Inputs):
    """Dated prices. A price without a date is folklore."""

    prices_as_of: dt.date = Field(description="Date the prices were read (YYYY-MM-DD). Required.")
    dedicated_on_demand_usd_per_gpu_hour: dict[GpuKindName, float] = Field(
        description="On-demand price per GPU-hour by GPU kind, USD."
    )
    reserved_discount_fraction: float = Field(
        ge=0, lt=1, description="Discount of reserved/committed capacity over on-demand (typically 0.30–0.40)."
    )
    serverless_usd_per_gpu_second: dict[GpuKindName, float] = Field(
        description="Serverless price per GPU-second by GPU kind, USD (before region pinning)."
    )
    serverless_usd_per_cpu_core_second: float = Field(
        default=0.0000131, ge=0, le=1,
        description="Serverless price per physical CPU core-second, USD, before region pinning. Modal bills a container's "
        "cores on top of its GPUs, at the greater of the reservation and the usage (modal.com/docs/guide/resources); "
        "default: Modal's list price as read 2026-06-27 (beam.cloud's pricing review, the FinOps profile of 2026-07-01).",
    )
    serverless_usd_per_memory_gib_second: float = Field(
        default=0.00000222, ge=0, le=1,
        description="Serverless price per GiB-second of host memory, USD, before region pinning (billed like the cores); "
        "default: Modal's list price as read 2026-07-01.",
    )
    platform_fixed_usd_per_month: float = Field(
        ge=0, le=10_000_000,
        description="Fixed monthly cost of running a dedicated cluster at all (control plane, gateway, "
        "monitoring, on-call share), USD.",
    )
    serverless_fixed_usd_per_month: float = Field(
        default=0, ge=0, le=10_000_000, description="Fixed monthly cost of the serverless account/plan, USD."
    )

    @field_validator("prices_as_of", mode="before")
    @classmethod
    def _a_date_not_a_number(cls, v: object) -> object:
        # pydantic would read 1700000000 as a Unix time: a number here is a mistake, not a date
        if isinstance(v, (int, float)):
            raise ValueError(f"{v!r} is a number, not a date; write the date the prices were read as YYYY-MM-DD")
        if isinstance(v, dt.datetime):
            raise ValueError(f"{v.isoformat()} has a time of day; write the date only, YYYY-MM-DD")
        return v

    @field_validator("prices_as_of")
    @classmethod
    def _not_in_the_future(cls, v: dt.date, info: ValidationInfo) -> dt.date:
        return not_after_today(v, info, "the date the prices were read")

    @field_validator("dedicated_on_demand_usd_per_gpu_hour", "serverless_usd_per_gpu_second")
    @classmethod
    def _positive(cls, v: dict[str, float]) -> dict[str, float]:
        for k, x in v.items():
            if not (x > 0) or x > 1000:
                raise ValueError(f"price for {k} is {x!r}; allowed above 0 and at most 1000")
        return v


class Region(_Inputs):
    """A cloud region that holds a region-local weight cache."""

    name: str = Field(min_length=1, description="AWS region, e.g. 'us-east-1'.")
    vpc_id: str | None = Field(default=None, description="VPC for an S3 gateway endpoint, if the cluster runs here.")

    @field_validator("name")
    @classmethod
    def _aws_region(cls, v: str) -> str:
        return check_aws_region(v)  # becomes part of the region-local bucket's name


class CostInputs(_Inputs):
    """Everything one environment (stack) plans from."""

    environment: str = Field(min_length=1, max_length=20, pattern=r"^[a-z][a-z0-9-]*$", description="Environment name, e.g. 'prod'.")
    project: str = Field(
        default="llm-serving", min_length=1, max_length=30, pattern=r"^[a-z][a-z0-9-]*$",
        description="Project prefix for resource names.",
    )
    floor_replicas_allowed: bool = Field(
        description="May this environment run always-on dedicated replicas? (dev: false — costly things default to safe)"
    )
    cluster_region: str = Field(min_length=1, description="AWS region of the Kubernetes cluster.")
    weights_source_bucket: str = Field(min_length=3, description="Source-of-truth bucket replicated to each region.")
    weights_source_region: str | None = Field(
        default=None, description="AWS region of the source-of-truth bucket (default: cluster_region)."
    )
    regions: list[Region] = Field(min_length=1, description="Regions with a region-local weight cache.")
    prices: Prices = Field(description="Dated prices.")
    endpoints: list[EndpointInputs] = Field(min_length=1, description="Endpoints served by this environment.")

    @field_validator("cluster_region", "weights_source_region")
    @classmethod
    def _aws_region(cls, v: str | None) -> str | None:
        return None if v is None else check_aws_region(v)

    @field_validator("weights_source_bucket")
    @classmethod
    def _bucket(cls, v: str) -> str:
        return check_bucket_name(v)

    @model_validator(mode="after")
    def _cross(self) -> "CostInputs":
        region_names = [r.name for r in self.regions]
        if self.cluster_region not in region_names:
            raise FieldsError(("cluster_region", "regions"),f"cluster_region={self.cluster_region!r} is not among regions {region_names}")
        if len({r.name for r in self.regions}) != len(self.regions):
            raise FieldsError(("regions",), f"regions repeat: {region_names} (one weight cache per region)")
        if self.environment.startswith("en-"):  # Modal reserves it for environment ids (name_utils.py)
            raise FieldsError(("environment",), f"environment={self.environment!r}: names starting 'en-' are "
                              "reserved by Modal, where the burst apps deploy into an environment of this name")
        names = [e.name for e in self.endpoints]
        for i, n in enumerate(names):
            # its weights volumes' names are as long (burst_volume_name), so this check covers them
            app = burst_app_name(self.project, self.environment, n)
            if len(app) > MODAL_NAME_MAX:
                raise FieldsError(("project", "environment", f"endpoints.{i}.name"),
                    f"the burst app name {app!r} is {len(app)} characters; Modal allows {MODAL_NAME_MAX}: shorten "
                    "the project, environment or endpoint name")
        if len(set(names)) != len(names):
            raise FieldsError(("endpoints",), f"endpoint names repeat: {names}")
        clash = first_repeat([config_name(n) for n in names])
        if clash:
            j, i = clash
            raise FieldsError((f"endpoints.{j}.name", f"endpoints.{i}.name"),
                f"endpoint names {names[j]!r} and {names[i]!r} are one endpoint to the gateway (both spelt "
                f"{config_name(names[i])!r}: runs of '-' are folded); rename one")
        # one gateway pod reads every endpoint's tenant secrets from environment variables spelt from the
        # endpoint and tenant names folded together: two pairs spelt alike would read one secret
        owners = [(i, t, var) for i, e in enumerate(self.endpoints) for t in e.tenants
                  for var in tenant_env_names(e.name, t, len(e.tenants) > 1)]
        clash = first_repeat([var for _, _, var in owners])
        if clash:
            (j, u, var), (i, t, _) = owners[clash[0]], owners[clash[1]]
            raise FieldsError((f"endpoints.{j}.tenants", f"endpoints.{i}.tenants"),
                f"endpoint {names[j]!r} tenant {u!r} and endpoint {names[i]!r} tenant {t!r} would share the "
                f"gateway's secret variable {var} (endpoint and tenant names are joined and folded); rename a "
                "tenant or an endpoint")
        for i, e in enumerate(self.endpoints):
            for cap in e.engine:
                if cap.gpu_kind not in self.prices.dedicated_on_demand_usd_per_gpu_hour:
                    raise FieldsError((f"endpoints.{i}.engine", "prices.dedicated_on_demand_usd_per_gpu_hour"),
                        f"endpoints[{i}].engine gpu_kind={cap.gpu_kind} has no price in "
                        "prices.dedicated_on_demand_usd_per_gpu_hour"
                    )
            if e.serverless.gpu_kind not in self.prices.serverless_usd_per_gpu_second:
                raise FieldsError((f"endpoints.{i}.serverless.gpu_kind", "prices.serverless_usd_per_gpu_second"),
                    f"endpoints[{i}].serverless.gpu_kind={e.serverless.gpu_kind} has no price in "
                    "prices.serverless_usd_per_gpu_second"
                )
            if e.serverless.weights_region not in region_names:
                raise FieldsError((f"endpoints.{i}.serverless.weights_region", "regions"),
                    f"endpoints[{i}].serverless.weights_region={e.serverless.weights_region!r} is not among "
                    f"regions {region_names}"
                )
        return self


def prices_age_warning(prices_as_of: dt.date, today: dt.date, max_age_days: int = PRICES_MAX_AGE_DAYS) -> str | None:
    """A warning when the dated prices are older than `max_age_days` (today passed in: no clock read here)."""
    age = (today - prices_as_of).days
    if age <= max_age_days:
        return None
    return (
        f"prices.prices_as_of={prices_as_of.isoformat()} is {age:,} days old (more than {max_age_days}): "
        "prices have likely rotted; re-read them and update the date"
    )
