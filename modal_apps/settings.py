"""What the burst app is told, and the Modal settings that follow from it.

The Modal app (`modal_apps/burst.py`) never decides anything: it reads one endpoint's `BurstSpec` and
`EngineSpec` (a `BurstAppConfig`) and this module turns them into the keyword arguments of Modal's
decorators. Tests check this object, and Modal's public `Function.info()` of the app built from it.

Where the config comes from, first match wins (the first two are what `pulumi up` uses; the last is
for a stand-alone `modal deploy`):

  LLM_SERVING_BURST_SPEC       JSON of a BurstAppConfig or of an EndpointSpec
  LLM_SERVING_BURST_SPEC_FILE  path of such a JSON file, or of a TopologySpec JSON (+ LLM_SERVING_ENDPOINT)
  LLM_SERVING_STACK            path of a stack file, planned locally (+ LLM_SERVING_ENDPOINT)

Inside the container only the first is used: the deploying machine ships the config as an `env=` value,
so containers never re-plan and never need the stack file.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar
from zoneinfo import ZoneInfo

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from topology.spec import BurstSpec, EndpointSpec, EngineSpec, MinContainersWindow, TopologySpec
from topology.timebase import MINUTES_PER_WEEK

ENV_SPEC = "LLM_SERVING_BURST_SPEC"
ENV_SPEC_FILE = "LLM_SERVING_BURST_SPEC_FILE"
ENV_STACK = "LLM_SERVING_STACK"
ENV_ENDPOINT = "LLM_SERVING_ENDPOINT"

CLASS_NAME = "BurstServer"
WEIGHTS_MOUNT = "/weights"
# Written by `python -m modal_apps.weights sync` next to the weights; the server refuses to start on a
# volume holding another revision, so the burst tier can never answer with a different model.
REVISION_MARKER = ".llm-serving/revision.json"

# The clock-following minimum is re-checked every FOLLOW_CLOCK_PERIOD_MIN minutes and looks that far
# ahead, so a rise is never late and a fall is at most one period late (a few warm minutes).
FOLLOW_CLOCK_PERIOD_MIN = 5
FOLLOW_CLOCK_CRON = f"*/{FOLLOW_CLOCK_PERIOD_MIN} * * * *"


class BurstConfigError(ValueError):
    """The burst app cannot find or read its config; the message names the variable and what is allowed."""


class BurstAppConfig(BaseModel):
    """The slice of the topology spec one burst app needs: small enough to ship as an env var."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    endpoint: str = Field(description="Endpoint name in the topology spec.")
    model_name: str = Field(description="Model served (same as the floor).")
    model_revision: str = Field(description="Pinned weights revision (same as the floor).")
    burst: BurstSpec
    engine: EngineSpec

    @classmethod
    def from_endpoint(cls, endpoint: EndpointSpec) -> "BurstAppConfig":
        if endpoint.burst is None:
            raise BurstConfigError(
                f"endpoint {endpoint.name!r} has tier {endpoint.tier!r} and no burst capacity "
                "(endpoint.burst is None); only serverless_only and floor_plus_burst endpoints have a Modal app"
            )
        return cls(
            endpoint=endpoint.name,
            model_name=endpoint.model_name,
            model_revision=endpoint.model_revision,
            burst=endpoint.burst,
            engine=endpoint.engine,
        )

    # what the plan reports about the burst, not how it runs: left out of what the app is shipped (and of the
    # deploy trigger), so a dated price update re-deploys nothing (a redeploy restarts containers: cold starts)
    REPORT_ONLY: ClassVar[dict[str, set[str]]] = {"burst": {"spike_warm_usd_per_month", "usd_per_container_hour"}}

    def to_json(self) -> str:
        return self.model_dump_json(exclude=self.REPORT_ONLY)

    def sha256(self) -> str:
        """Changes whenever anything the deployed app depends on changes: the deploy trigger."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()


def burst_configs(spec: TopologySpec) -> dict[str, BurstAppConfig]:
    """Every endpoint of a spec that has burst capacity, by endpoint name."""
    return {e.name: BurstAppConfig.from_endpoint(e) for e in spec.endpoints if e.burst is not None}


def _config_from_document(data: Any, source: str, endpoint: str | None) -> BurstAppConfig:
    if not isinstance(data, dict):
        raise BurstConfigError(f"{source}: expected a JSON object, got {type(data).__name__}")
    try:
        if "endpoints" in data:  # a whole TopologySpec
            spec = TopologySpec.model_validate(data)
            if not endpoint:
                raise BurstConfigError(
                    f"{source} holds a whole topology spec: set {ENV_ENDPOINT} to one of "
                    f"{sorted(burst_configs(spec))} (the endpoints with burst capacity)"
                )
            return _pick_endpoint(spec, endpoint, source)
        if "tier" in data:  # one EndpointSpec
            return BurstAppConfig.from_endpoint(EndpointSpec.model_validate(data))
        return BurstAppConfig.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        raise BurstConfigError(
            f"{source}: not a BurstAppConfig, EndpointSpec or TopologySpec: {first['loc']}: {first['msg']}"
        ) from None


def _pick_endpoint(spec: TopologySpec, endpoint: str, source: str) -> BurstAppConfig:
    try:
        return BurstAppConfig.from_endpoint(spec.endpoint(endpoint))
    except KeyError:
        raise BurstConfigError(
            f"{ENV_ENDPOINT}={endpoint!r} is not an endpoint of {source}; endpoints with burst capacity: "
            f"{sorted(burst_configs(spec))}"
        ) from None


def load_config(environ: Mapping[str, str] | None = None) -> BurstAppConfig:
    """The burst app's config from the environment (see the module docstring for the order)."""
    env = os.environ if environ is None else environ
    endpoint = env.get(ENV_ENDPOINT) or None
    if env.get(ENV_SPEC):
        try:
            data = json.loads(env[ENV_SPEC])
        except json.JSONDecodeError as e:
            raise BurstConfigError(f"{ENV_SPEC} is not valid JSON ({e.msg} at char {e.pos})") from None
        return _config_from_document(data, ENV_SPEC, endpoint)
    if env.get(ENV_SPEC_FILE):
        path = Path(env[ENV_SPEC_FILE])
        from topology.errors import InputError
        from topology.reading import loads_json, read_text

        try:  # bounded, UTF-8, depth-limited: one-line errors naming the file
            data = loads_json(read_text(path, ENV_SPEC_FILE), f"{ENV_SPEC_FILE}={str(path)!r}")
        except InputError as e:
            raise BurstConfigError(str(e)) from None
        return _config_from_document(data, f"{ENV_SPEC_FILE}={str(path)!r}", endpoint)
    if env.get(ENV_STACK):
        from topology import InputError, PlanningError, load_inputs, plan

        if not endpoint:
            raise BurstConfigError(f"{ENV_STACK} is set: also set {ENV_ENDPOINT} to the endpoint to deploy")
        try:
            spec = plan(load_inputs(env[ENV_STACK]))
        except (InputError, PlanningError) as e:
            raise BurstConfigError(f"{ENV_STACK}={env[ENV_STACK]!r}: {e}") from None
        return _pick_endpoint(spec, endpoint, f"{ENV_STACK}={env[ENV_STACK]!r}")
    raise BurstConfigError(
        f"the burst app has no config: set {ENV_SPEC} (JSON of a BurstAppConfig or EndpointSpec), "
        f"{ENV_SPEC_FILE} (path of such a JSON file, or a TopologySpec JSON with {ENV_ENDPOINT}), or "
        f"{ENV_STACK}=stacks/Pulumi.<env>.yaml with {ENV_ENDPOINT}=<endpoint>"
    )


# --- Modal settings --------------------------------------------------------------------------------


@dataclass(frozen=True)
class BurstSettings:
    """Every Modal setting of the burst app, derived from the config and nothing else."""

    app_name: str
    environment: str
    gpu: str
    cpu_cores: float
    memory_mib: int
    region: str
    min_containers: int
    max_containers: int
    buffer_containers: int
    scaledown_window_s: int
    startup_timeout_s: int
    timeout_s: int
    enable_memory_snapshot: bool
    enable_gpu_snapshot: bool
    max_inputs: int
    target_inputs: int
    requires_proxy_auth: bool
    port: int
    image: str
    volume_name: str
    weights_mount: str
    model_path: str
    model_revision: str
    engine_command: tuple[str, ...]
    server_command: tuple[str, ...]
    container_env: dict[str, str] = field(hash=False)
    min_containers_schedule: tuple[MinContainersWindow, ...] = ()
    schedule_timezone: str = "UTC"

    def cls_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `@app.cls`, except the image and volume objects (burst.py adds those)."""
        kwargs: dict[str, Any] = dict(
            gpu=self.gpu,
            # reserved, so billed at least this (the plan priced it): vLLM's cores and the host memory a level-1
            # sleep backs the weights up to before the snapshot
            cpu=self.cpu_cores,
            memory=self.memory_mib,
            region=self.region,
            min_containers=self.min_containers,
            max_containers=self.max_containers,
            buffer_containers=self.buffer_containers,
            scaledown_window=self.scaledown_window_s,
            startup_timeout=self.startup_timeout_s,
            timeout=self.timeout_s,
            enable_memory_snapshot=self.enable_memory_snapshot,
            env=dict(self.container_env),
        )
        if self.enable_gpu_snapshot:
            kwargs["experimental_options"] = {"enable_gpu_snapshot": True}
        return kwargs

    def concurrent_kwargs(self) -> dict[str, int]:
        return {"max_inputs": self.max_inputs, "target_inputs": self.target_inputs}

    def web_server_kwargs(self) -> dict[str, Any]:
        return {
            "port": self.port,
            "startup_timeout": self.startup_timeout_s,
            "requires_proxy_auth": self.requires_proxy_auth,
        }

    @property
    def follows_clock(self) -> bool:
        return bool(self.min_containers_schedule)


# Flags added to the floor's command line that change how the process starts and sleeps, never what it
# answers: bind on all interfaces (Modal's proxy connects from outside the process) and sleep mode, so
# the weights sit in host memory while the snapshot is taken and are woken back onto the GPU after restore.
SERVER_ONLY_FLAGS = ("--host", "0.0.0.0", "--enable-sleep-mode")


def model_path(engine: EngineSpec, weights_mount: str = WEIGHTS_MOUNT) -> str:
    """Where the weights sit in the container: the volume mirrors the weight cache's layout."""
    return f"{weights_mount}/{engine.weights_uri_suffix.strip('/')}"


def build_settings(config: BurstAppConfig) -> BurstSettings:
    burst, engine = config.burst, config.engine
    if burst.enable_gpu_snapshot and not burst.enable_memory_snapshot:
        raise BurstConfigError(
            f"endpoint {config.endpoint!r}: burst.enable_gpu_snapshot=True needs burst.enable_memory_snapshot=True "
            "(Modal's GPU snapshots are an option of memory snapshots)"
        )
    if burst.target_inputs > burst.max_inputs:
        raise BurstConfigError(
            f"endpoint {config.endpoint!r}: burst.target_inputs={burst.target_inputs} exceeds "
            f"burst.max_inputs={burst.max_inputs}; the autoscaler target must be at most the hard limit"
        )
    path = model_path(engine)
    # the container's own step budget (its GPU, not the floor's: a MIG floor's is smaller)
    engine_command = tuple(engine.vllm_args(path, burst.max_num_batched_tokens))
    return BurstSettings(
        app_name=burst.app_name,
        environment=burst.environment,
        gpu=burst.gpu,
        cpu_cores=burst.cpu_cores,
        memory_mib=burst.memory_mib,
        region=burst.region,
        min_containers=burst.min_containers,
        max_containers=burst.max_containers,
        buffer_containers=burst.buffer_containers,
        scaledown_window_s=burst.scaledown_window_s,
        startup_timeout_s=burst.startup_timeout_s,
        timeout_s=burst.timeout_s,
        enable_memory_snapshot=burst.enable_memory_snapshot,
        enable_gpu_snapshot=burst.enable_gpu_snapshot,
        max_inputs=burst.max_inputs,
        target_inputs=burst.target_inputs,
        requires_proxy_auth=burst.requires_proxy_auth,
        port=engine.port,
        image=engine.image,
        volume_name=burst.volume_name,
        weights_mount=WEIGHTS_MOUNT,
        model_path=path,
        model_revision=config.model_revision,
        engine_command=engine_command,
        server_command=engine_command + SERVER_ONLY_FLAGS,
        container_env={
            # The container re-imports burst.py: it reads the same config instead of re-planning.
            ENV_SPEC: config.to_json(),
            # Never a model hub at boot: the weights come from the volume or nowhere. The same engine
            # environment as the floor's pods (offline hubs, LoRA resolver), so the engine behaves the same.
            **engine.vllm_env(path),
            # Exposes /sleep and /wake_up, used around the snapshot; the endpoint is private (proxy auth).
            "VLLM_SERVER_DEV_MODE": "1",
        },
        min_containers_schedule=burst.min_containers_schedule,
        schedule_timezone=burst.schedule_timezone,
    )


# --- The LoRA resolver's folder --------------------------------------------------------------------

LORA_DIR_ENV = "VLLM_LORA_RESOLVER_CACHE_DIR"
# Writable and outside the read-only weights volume: the folder the engine's resolver reads, built at start from
# the adapters on the volume (or left empty when the volume holds none: a revision synced before adapters existed,
# or with none yet).
EMPTY_LORA_DIR = "/tmp/llm-serving/lora-adapters"
BASE_MODEL_KEY = "base_model_name_or_path"


def ensure_lora_resolver_dir(settings: BurstSettings, environ: MutableMapping[str, str] | None = None,
                             empty_dir: str = EMPTY_LORA_DIR) -> str | None:
    """The folder the engine's filesystem LoRA resolver reads, made to exist; None when LoRA is off.

    vLLM's resolver plugin raises at engine start unless VLLM_LORA_RESOLVER_CACHE_DIR is an existing directory,
    and it loads an adapter only when its adapter_config.json names, as base_model_name_or_path, exactly the
    engine's model — here the model's path on the volume (vllm/plugins/lora_resolvers/filesystem_resolver.py and
    serving_models.py resolve_lora, 0.11.0), where a trained adapter names its hub id. The volume is mounted
    read-only, so the engine is pointed at a folder elsewhere (`empty_dir`) holding, per adapter on the volume,
    links to its files and an adapter_config.json naming `settings.model_path` (as the floor's fetch does,
    components/fetch_weights.sh); with none on the volume it stays empty and resolves no adapter, like the floor's."""
    env = os.environ if environ is None else environ
    source = settings.container_env.get(LORA_DIR_ENV)
    if source is None:
        return None
    os.makedirs(empty_dir, exist_ok=True)
    if os.path.isdir(source):
        lora_view(Path(source), Path(empty_dir), settings.model_path)
    env[LORA_DIR_ENV] = empty_dir  # the engine subprocess inherits this environment
    return empty_dir


def lora_view(source: Path, view: Path, model_path: str) -> list[str]:
    """`view`/<name> for each adapter folder `source`/<name> with an adapter_config.json: symbolic links to its
    files and a copy of the config naming `model_path` as the base model. Returns the adapters placed; one whose
    config is not a JSON object is skipped (vLLM could not load it either)."""
    placed = []
    for src in sorted(p for p in source.iterdir() if (p / "adapter_config.json").is_file()):
        try:
            config = json.loads((src / "adapter_config.json").read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(config, dict):
            continue
        dest = view / src.name
        dest.mkdir(parents=True, exist_ok=True)
        for f in src.iterdir():
            if f.name == "adapter_config.json":
                continue
            link = dest / f.name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(f)
        (dest / "adapter_config.json").write_text(json.dumps({**config, BASE_MODEL_KEY: model_path}))
        placed.append(src.name)
    return placed


# --- The clock-following minimum ------------------------------------------------------------------


def minute_of_week(now: dt.datetime, timezone: str) -> int:
    """Minutes since Monday 00:00 in `timezone` (the spec's schedule clock)."""
    if now.tzinfo is None:
        raise ValueError("minute_of_week needs an aware datetime (got a naive one)")
    local = now.astimezone(ZoneInfo(timezone))
    return local.weekday() * 1440 + local.hour * 60 + local.minute


def _in_window(start: int, end: int, minute: int) -> bool:
    if start <= end:
        return start <= minute < end
    return minute >= start or minute < end  # wraps past Sunday 24:00


def desired_min_containers(settings: BurstSettings, minute: int, lookahead_min: int = FOLLOW_CLOCK_PERIOD_MIN) -> int:
    """The minimum to hold now: the highest window touching [minute, minute + lookahead), else the base."""
    wanted = settings.min_containers
    for w in settings.min_containers_schedule:
        if any(_in_window(w.start_minute_of_week, w.end_minute_of_week, (minute + k) % MINUTES_PER_WEEK)
               for k in range(max(lookahead_min, 1))):
            wanted = max(wanted, w.min_containers)
    return wanted
