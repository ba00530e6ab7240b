"""FloorReplicas: vLLM on an endpoint's dedicated node pools, scaled by KEDA on work waiting.

What the doctrine asks of a floor replica, and where it lands here:
- engine arguments come verbatim from the spec (`EngineSpec.vllm_args`): max-model-len = the product
  limit, prefix caching, LoRA settings — the burst tier runs the same command line;
- weights come from the region-local bucket to the node's NVMe (init container, jittered start, one
  copy per node), and the container cannot reach a model hub (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE,
  a local model path, no hub token);
- a startup probe sized from the measured cold start; readiness only after a synthetic warm-up
  generation has returned at least one token (components/warmup_probe.py);
- whole GPUs or exactly the pool's MIG slice as the resource request; zone spread; a PDB;
- a KEDA ScaledObject: a Prometheus trigger on `vllm:num_requests_waiting` per replica (never GPU
  utilisation), cron triggers for the clock-following floor windows, capped scale-up steps and the
  spec's stabilization windows.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s

from topology.spec import ENGINE_OFFLINE_ENV, EndpointSpec, EngineSpec, FloorSchedule, NodePoolSpec, WeightCacheSpec
from topology.timebase import MINUTES_PER_DAY, MINUTES_PER_WEEK
from topology.windows import clear_of_clock_gaps

from ._common import CAPACITY_LABEL, ENDPOINT_LABEL, GPU_TAINT_EFFECT_K8S, MIG_CONFIG_LABEL, TYPE_PREFIX, child
from .gpu_node_pool import NVME_MOUNT, node_labels
from .network_policy import Admitted, ingress_policy_spec
from .names import (
    POD_TARGET_LABELS, TRACK_CANARY, TRACK_LABEL, TRACK_METRIC_LABEL, TRACK_PREVIOUS, TRACK_STABLE, VERSION_LABEL,
    burst_backend_name, engine_selector, floor_backend_name,
)

WEIGHTS_MOUNT = "/models"  # where the node-local weight copy appears inside the pod
WARMUP_MOUNT = "/opt/warmup"
WARMUP_SENTINEL = "/tmp/warmup-done"  # container filesystem: an engine restart clears it
AWS_CLI_IMAGE = "public.ecr.aws/aws-cli/aws-cli:2.27.50"  # pinned: the init container's only tool
# Environment that keeps every hub client offline: weights and tokenizer come from the local copy only.
HUB_OFFLINE_ENV = ENGINE_OFFLINE_ENV
_WARMUP_SCRIPT = Path(__file__).with_name("warmup_probe.py")
_FETCH_SCRIPT = Path(__file__).with_name("fetch_weights.sh")


def minute_of_week_cron(minute_of_week: int) -> str:
    """5-field cron (`M H * * DOW`) firing once a week at this minute; minute 0 = Monday 00:00, cron DOW 0 = Sunday."""
    if not 0 <= minute_of_week < MINUTES_PER_WEEK:
        raise ValueError(f"minute of week {minute_of_week} outside 0..{MINUTES_PER_WEEK - 1}")
    day, minute_of_day = divmod(minute_of_week, MINUTES_PER_DAY)
    hour, minute = divmod(minute_of_day, 60)
    return f"{minute} {hour} * * {(day + 1) % 7}"


def cron_triggers(floor: FloorSchedule) -> list[dict]:
    """One KEDA cron trigger per floor window. A window wrapping past Sunday 24:00 (end < start) needs no
    special case: KEDA's cron scaler is active from the latest `start` until the next `end`."""
    triggers = []
    for w in floor.windows:
        if w.start_minute_of_week == w.end_minute_of_week:
            raise ValueError(f"floor window at minute {w.start_minute_of_week} has zero length")
        triggers.append({
            "type": "cron",
            "name": f"floor-{w.start_minute_of_week}-{w.end_minute_of_week}",
            "metadata": {  # KEDA rejects non-string metadata values
                "timezone": floor.timezone,
                # an edge in an hour a clock change skips would not fire that week: moved out of it
                "start": minute_of_week_cron(clear_of_clock_gaps(w.start_minute_of_week, floor.timezone, earlier=True)),
                "end": minute_of_week_cron(clear_of_clock_gaps(w.end_minute_of_week, floor.timezone, earlier=False)),
                "desiredReplicas": str(w.replicas),
            },
        })
    return triggers


def _number(x: float) -> str:
    return f"{x:g}"


def queue_query(namespace: str, endpoint: str, served_model_name: str, waiting_metric: str,
                gateway_queues: bool = False) -> str:
    """Requests waiting summed over the endpoint's stable replicas; KEDA's AverageValue divides by replicas.
    The endpoint label (copied from the pods by the PodMonitor) keeps another endpoint serving the same model name
    out; canary pods serve the same model name too, so the track label keeps their queue out of the stable count.
    `waiting_metric` is the pinned engine version's name (EngineSpec.metrics.requests_waiting).

    `gateway_queues`: the endpoint runs admission control, so the gateway holds each floor
    server at maxconn = the spec's admission cap (at most the engine's max_num_seqs) and the floor's queue waits
    in HAProxy, not in vLLM — the engine's gauge stays near 0 however long the queue. Then the requests queued in the gateway's floor backend
    (backend and per-server queues: a request pinned to a full replica waits on that server) are added, from
    every gateway pod. An absent gateway series adds 0; an absent engine series still leaves the sum undefined
    (the trigger's ignoreNullValues false holds the size rather than read "no queue")."""
    q = f"sum({waiting_metric}{engine_selector(namespace, endpoint, served_model_name, stable=True)})"
    if not gateway_queues:
        return q
    sel = f'{{namespace="{namespace}",proxy="{floor_backend_name(endpoint)}"}}'
    return (f"{q} + (sum(haproxy_backend_current_queue{sel}) or vector(0))"
            f" + (sum(haproxy_server_current_queue{sel}) or vector(0))")


def gateway_queues_floor(ep: EndpointSpec) -> bool:
    """Whether the floor's queue waits in the gateway: admission control caps each floor server's in-flight."""
    g = ep.gateway
    return g.admission_queue_timeout_s is not None and g.admission_inflight_per_floor_replica > 0


def colon_restoring_relabelings(metric_names: Sequence[str]) -> list[dict]:
    """PodMonitor `metricRelabelings` that turn an escaped `vllm_x` back into the engine's `vllm:x`.

    prometheus_client >= 0.22 answers an OpenMetrics request without an `escaping` term (Prometheus 2.x's Accept
    header) with `escaping=underscores` and renames `vllm:num_requests_waiting` to `vllm_num_requests_waiting`
    (client_python #1177). vLLM 0.11-0.13 answer the exact `/metrics` with prometheus-fastapi-instrumentator's
    plain-text handler (colons kept) but `/metrics/...` with prometheus_client's negotiating app, so the names
    hang on a route detail; this rule makes every query independent of it on any Prometheus version (a
    `scrapeProtocols` pin needs >= 2.49). The anchored regex leaves a name that arrives with its colon alone.
    A name with two colons could not be mapped back, so it is refused."""
    prefixes: list[str] = []
    for name in metric_names:
        if name.count(":") > 1:
            raise ValueError(f"engine metric {name!r} has more than one colon: an escaped scrape could not be mapped back")
        prefix = name.partition(":")[0] if ":" in name else None
        if prefix and prefix not in prefixes:
            prefixes.append(prefix)
    return [{"sourceLabels": ["__name__"], "regex": f"{prefix}_(.+)", "targetLabel": "__name__",
             "replacement": f"{prefix}:$1", "action": "replace"} for prefix in prefixes]


def burst_backlog_query(namespace: str, endpoint: str) -> str:
    """Requests the gateway pods have in flight to the endpoint's burst backend (HAProxy's own exporter)."""
    return f'sum(haproxy_backend_current_sessions{{namespace="{namespace}",proxy="{burst_backend_name(endpoint)}"}})'


def candidate_engine(ep: EndpointSpec) -> EngineSpec | None:
    """The engine of the rollout candidate's pods, which exist in shadow and canary (None otherwise)."""
    r = ep.rollout
    return r.candidate_engine if r is not None and r.stage in ("shadow", "canary") else None


def previous_engine(ep: EndpointSpec) -> EngineSpec | None:
    """The engine of the previous version's warm pods, while its N−1 window lasts (None otherwise)."""
    r = ep.rollout
    return r.previous.engine if r is not None and r.previous is not None and r.previous.active else None


def _cached_prefix(ep: EndpointSpec, cache: WeightCacheSpec, engine: EngineSpec | None, what: str) -> str | None:
    if engine is None:
        return None
    if engine.weights_uri_suffix not in cache.model_prefixes:
        raise ValueError(
            f"endpoint {ep.name!r}: {what} weights {engine.weights_uri_suffix!r} are not among the prefixes of weight "
            f"cache {cache.bucket_name} ({list(cache.model_prefixes)})"
        )
    return engine.weights_uri_suffix


def canary_weights_prefix(ep: EndpointSpec, cache: WeightCacheSpec) -> str | None:
    """The weight-cache prefix of the rollout candidate (shadow or canary), or None when it has no pods."""
    return _cached_prefix(ep, cache, candidate_engine(ep), "candidate")


def previous_weights_prefix(ep: EndpointSpec, cache: WeightCacheSpec) -> str | None:
    """The weight-cache prefix of the warm previous version, or None outside its N−1 window."""
    return _cached_prefix(ep, cache, previous_engine(ep), "previous version")


def lora_view_dir(local_dir: str) -> str:
    """The floor's LoRA resolver folder: beside the node's copy of the revision (shared by that revision's pods on
    the node), each adapter's files linked from the copy and its adapter_config.json naming `local_dir`, the
    engine's model, as its base (components/fetch_weights.sh)."""
    return f"{local_dir.rstrip('/')}.lora"


def lora_dir_env(eng: EngineSpec, local_dir: str, weights_uri: str) -> list[dict]:
    """The fetch container's LoRA settings: LORA_DIR, the resolver's folder it builds (vLLM's filesystem resolver
    refuses to start when it does not exist, and an S3 copy of a revision without adapters creates no folder);
    LORA_SRC, the adapters as copied with the revision; ADAPTERS_URI, their prefix, copied again at every start."""
    adapters = eng.adapters_path(local_dir)
    if adapters is None or eng.lora is None:
        return []
    return [{"name": "LORA_DIR", "value": lora_view_dir(local_dir)}, {"name": "LORA_SRC", "value": adapters},
            {"name": "ADAPTERS_URI", "value": f"{weights_uri.rstrip('/')}/{eng.lora.adapters_subdir}/"}]



# pulumi-kubernetes waits for a Deployment to be available with every replica of its new ReplicaSet ready, 10 minutes
# unless told otherwise (provider/pkg/await/deployment.go, DefaultDeploymentTimeoutMins), and the Deployment
# controller marks a rollout failed after progressDeadlineSeconds (600 s by default) without a pod becoming ready.
# A floor replica on a new GPU node takes the measured node cold start (assist: 540 s) plus its start jitter, and a
# template change rolls the floor one surge pod at a time, so both defaults fail a first `up` or a rollout.
AWAIT_MARGIN = 1.5


def progress_deadline_s(ep: EndpointSpec) -> int:
    """The longest one pod of the floor may take to become ready on a new node, with a margin (at least the
    controller's default 600 s)."""
    return max(600, math.ceil(AWAIT_MARGIN * (ep.node_cold_start_s + ep.herd.start_jitter_s)))


def rollout_timeout_s(ep: EndpointSpec, replicas: int) -> int:
    """How long `pulumi up` may wait for a floor Deployment of up to `replicas` replicas: the first surge pod on a
    new node, the others one after another on nodes that have room (maxSurge 1, maxUnavailable 0), with a margin
    (at least the provider's default 10 minutes)."""
    one_by_one = max(0, replicas - 1) * (ep.pod_cold_start_s + ep.herd.start_jitter_s)
    return max(600, math.ceil(AWAIT_MARGIN * (ep.node_cold_start_s + ep.herd.start_jitter_s + one_by_one)))


def await_timeouts(ep: EndpointSpec, replicas: int) -> pulumi.CustomTimeouts:
    t = f"{math.ceil(rollout_timeout_s(ep, replicas) / 60)}m"
    return pulumi.CustomTimeouts(create=t, update=t)


@functools.cache
def _scripts_data() -> dict[str, str]:
    """What every floor pod runs from the scripts ConfigMap: the weights fetch (init) and the warm-up probe (read
    once: the ConfigMap and every Deployment's volume name need them)."""
    return {"warmup_probe.py": _WARMUP_SCRIPT.read_text(), "fetch_weights.sh": _FETCH_SCRIPT.read_text()}


@functools.cache
def _scripts_digest() -> str:
    data = _scripts_data()
    return hashlib.sha256("".join(f"{k}\0{data[k]}\0" for k in sorted(data)).encode()).hexdigest()[:10]


def scripts_configmap_name(app: str) -> str:
    """`<app>-scripts-<digest of the scripts>`: a new script gets a new name (and so a new pod template)."""
    return f"{app}-scripts-{_scripts_digest()}"

PRESTOP_SLEEP_S = 10  # long enough for the headless Service (and the gateway resolving it) to drop the pod


@dataclass(frozen=True)

class FloorReplicasArgs:
    endpoint: EndpointSpec
    """The endpoint; it must have node pools and autoscaling settings."""
    node_pools: Sequence[NodePoolSpec]
    """The endpoint's pools (spec.node_pools named by endpoint.node_pools); they share one MIG layout."""
    weights_uri: str
    """s3:// URI of the served revision in the cluster region's weight cache."""
    namespace: str
    """Namespace of the serving workloads (created by Cluster)."""
    prometheus_url: str
    """Prometheus the KEDA queue trigger queries."""
    monitor_labels: dict[str, str] = field(default_factory=dict)
    """Labels the Prometheus operator selects PodMonitors by."""
    canary_weights_uri: str | None = None
    """s3:// URI of the rollout candidate; required in shadow and canary (see canary_weights_prefix())."""
    previous_weights_uri: str | None = None
    """s3:// URI of the previous version; required while it is kept warm (see previous_weights_prefix())."""
    warmup_timeout_s: int = 50
    """Longest the warm-up generation may take before the readiness probe reports not ready."""
    warmup_max_tokens: int = 1
    """Tokens the warm-up generation asks for (at least one must come back)."""
    admitted: Admitted | None = None
    """The clients the engines admit (a NetworkPolicy); None: no policy (any pod in the cluster reaches them)."""
    stale_lock_s: int = 120
    """A node-local weight-copy lock whose heartbeat (refreshed every few seconds by the copying pod) is older
    than this was left by a killed pod and is taken over."""
    aws_cli_image: str = AWS_CLI_IMAGE
    """Image of the weight-fetch init container."""


class FloorReplicas(pulumi.ComponentResource):
    deployment_name: str
    service_name: str
    service_account_name: str

    def __init__(self, name: str, args: FloorReplicasArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        ep = args.endpoint
        if ep.autoscaling is None:
            raise ValueError(f"endpoint {ep.name!r} has node pools but no autoscaling settings in the spec")
        if not args.node_pools:
            raise ValueError(f"endpoint {ep.name!r}: floor replicas need at least one node pool")
        for uri in (args.weights_uri, args.canary_weights_uri, args.previous_weights_uri):
            if uri is not None and not uri.startswith("s3://"):
                raise ValueError(f"endpoint {ep.name!r}: weight URIs must be s3:// URIs, got {uri!r}")
        cand_engine, prev_engine = candidate_engine(ep), previous_engine(ep)
        if cand_engine is not None and args.canary_weights_uri is None:
            raise ValueError(f"endpoint {ep.name!r} has a rollout candidate ({cand_engine.model_revision}) but no canary_weights_uri")
        if prev_engine is not None and args.previous_weights_uri is None:
            raise ValueError(f"endpoint {ep.name!r} keeps its previous version warm but has no previous_weights_uri")
        super().__init__(f"{TYPE_PREFIX}:FloorReplicas", name, None, opts)

        app = f"{ep.name}-vllm"
        self.deployment_name = self.service_name = self.service_account_name = app
        ns = args.namespace
        labels = {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": ep.name, ENDPOINT_LABEL: ep.name}
        stable = {**labels, TRACK_LABEL: TRACK_STABLE}
        meta = lambda n: {"name": n, "namespace": ns, "labels": labels}  # noqa: E731

        k8s.core.v1.ServiceAccount(f"{name}-service-account", metadata=meta(app), opts=child(self))
        # named by its content and immutable, as the gateway's config: a new script is a new ConfigMap that the
        # rolled pods mount, where under one fixed name a floor pod restarting later ran the new script with the
        # environment of its old template
        warmup = k8s.core.v1.ConfigMap(
            f"{name}-scripts",
            metadata=meta(scripts_configmap_name(app)),
            immutable=True,
            data=dict(_scripts_data()),
            opts=child(self),
        )
        deployment = k8s.apps.v1.Deployment(
            f"{name}-deployment",
            metadata={**meta(app), "annotations": {
                "serving.llm/tier": ep.tier,
                "serving.llm/cache-isolation": ep.gateway.cache_isolation,
                # read by the right-size-before-platform policy (policies/rules.py)
                "serving.llm/mean-requests-per-s": f"{ep.economics.mean_requests_per_s:.4g}",
            }},
            spec=self._deployment_spec(args, app, stable, args.weights_uri, ep.engine.model_revision, ep.floor.base_replicas,
                                       version=ep.rollout.served_version if ep.rollout else None),
            # KEDA owns the replica count once it runs; Pulumi sets the first value only
            opts=child(self, depends_on=[warmup], ignore_changes=["spec.replicas"],
                       custom_timeouts=await_timeouts(ep, ep.autoscaling.max_replicas if ep.autoscaling else
                                                      ep.floor.base_replicas)),
        )
        if args.admitted is not None:
            # every engine of the endpoint (stable, canary, previous): its port admits the gateway and the scrapers
            k8s.networking.v1.NetworkPolicy(f"{name}-network-policy", metadata=meta(app),
                                            spec=ingress_policy_spec(labels, ep.engine.port, args.admitted),
                                            opts=child(self))
        service = k8s.core.v1.Service(
            f"{name}-service",
            metadata=meta(app),
            spec={
                "type": "ClusterIP",
                "selector": stable,
                "ports": [{"name": "http", "port": ep.engine.port, "targetPort": "http", "protocol": "TCP"}],
            },
            opts=child(self),
        )
        # the gateway's floor backend; after a rollback from a promotion it selects the incumbent's pods by version,
        # so the warm N−1 pods serve at once while the stable Deployment rolls back a pod at a time
        back_to = ep.rollout.floor_backend_version if ep.rollout else None
        self._headless_service(f"{name}-pods-service", meta(f"{app}-pods"),
                               {**labels, VERSION_LABEL: back_to} if back_to else stable, ep.engine.port)
        k8s.policy.v1.PodDisruptionBudget(
            f"{name}-pdb",
            metadata=meta(app),
            spec={
                "maxUnavailable": 1,  # drains take one replica at a time; never blocks a drain of a 1-replica floor
                "selector": {"matchLabels": stable},
                "unhealthyPodEvictionPolicy": "AlwaysAllow",
            },
            opts=child(self),
        )
        k8s.apiextensions.CustomResource(
            f"{name}-pod-monitor",
            api_version="monitoring.coreos.com/v1",
            kind="PodMonitor",
            metadata={"name": app, "namespace": ns, "labels": {**labels, **args.monitor_labels}},
            spec={
                "selector": {"matchLabels": labels},
                "podTargetLabels": list(POD_TARGET_LABELS),
                "podMetricsEndpoints": [{
                    "port": "http", "path": "/metrics", "interval": f"{ep.autoscaling.polling_interval_s}s",
                    "metricRelabelings": colon_restoring_relabelings(tuple(ep.engine.metrics.model_dump().values())),
                }],
            },
            opts=child(self),
        )
        k8s.apiextensions.CustomResource(
            f"{name}-scaled-object",
            api_version="keda.sh/v1alpha1",
            kind="ScaledObject",
            metadata=meta(app),
            spec=scaled_object_spec(ep, app, ns, args.prometheus_url),
            opts=child(self, depends_on=[deployment]),
        )
        self.service_dns = f"{app}.{ns}.svc.cluster.local:{ep.engine.port}"
        self.pods_dns = f"{app}-pods.{ns}.svc.cluster.local"  # headless: resolves to the ready pods
        self.canary_pods_dns: str | None = None
        self.previous_pods_dns: str | None = None
        r = ep.rollout
        if r is not None and cand_engine is not None and args.canary_weights_uri is not None:
            # the candidate version on the same pools under the same served name, with its own engine settings; the
            # gateway mirrors a share of requests to it (shadow) or sends it a stable hash of users (canary)
            canary = {**labels, TRACK_LABEL: TRACK_CANARY}
            share = r.shadow_percent if r.stage == "shadow" else r.canary_percent
            k8s.apps.v1.Deployment(
                f"{name}-canary-deployment",
                metadata={**meta(f"{app}-canary"), "annotations": {
                    "serving.llm/rollout-stage": r.stage, f"serving.llm/{r.stage}-percent": f"{share:g}",
                    "serving.llm/identity": r.candidate.identity_sha256,
                }},
                spec=self._deployment_spec(args, app, canary, args.canary_weights_uri, cand_engine.model_revision,
                                           r.candidate_replicas, engine=cand_engine, version=r.candidate.version),
                opts=child(self, depends_on=[warmup], custom_timeouts=await_timeouts(ep, r.candidate_replicas)),
            )
            self._headless_service(f"{name}-canary-pods-service", meta(f"{app}-canary-pods"), canary, ep.engine.port)
            self.canary_pods_dns = f"{app}-canary-pods.{ns}.svc.cluster.local"
        if r is not None and r.previous is not None and prev_engine is not None and args.previous_weights_uri is not None:
            # N−1 warm: a fixed warm minimum of the previous version, outside KEDA, until the window ends (then the
            # planner stops declaring it and `pulumi up` removes it); a rollback flips the floor Service to it
            prev = {**labels, TRACK_LABEL: TRACK_PREVIOUS}
            k8s.apps.v1.Deployment(
                f"{name}-previous-deployment",
                metadata={**meta(f"{app}-previous"), "annotations": {
                    "serving.llm/warm-until": r.previous.warm_until.isoformat(),
                    "serving.llm/identity": r.previous.version.identity_sha256,
                }},
                spec=self._deployment_spec(args, app, prev, args.previous_weights_uri, prev_engine.model_revision,
                                           r.previous.replicas, engine=prev_engine, version=r.previous.version.version),
                opts=child(self, depends_on=[warmup], custom_timeouts=await_timeouts(ep, r.previous.replicas)),
            )
            self._headless_service(f"{name}-previous-pods-service", meta(f"{app}-previous-pods"), prev, ep.engine.port)
            self.previous_pods_dns = f"{app}-previous-pods.{ns}.svc.cluster.local"
        self.register_outputs({
            "deployment": deployment.metadata.apply(lambda m: m["name"]),
            "service": service.metadata.apply(lambda m: m["name"]),
            "serviceDns": self.service_dns,
            "podsDns": self.pods_dns,
            "canaryPodsDns": self.canary_pods_dns,
            "previousPodsDns": self.previous_pods_dns,
        })

    def _headless_service(self, resource_name: str, metadata: dict, selector: dict[str, str], port: int) -> None:
        # headless: one DNS record per *ready* pod, so the gateway balances and counts in-flight per replica,
        # and a replica joins the gateway's backends only after its warm-up generation succeeded
        k8s.core.v1.Service(
            resource_name,
            metadata=metadata,
            spec={
                "clusterIP": "None",
                "publishNotReadyAddresses": False,
                "selector": selector,
                "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
            },
            opts=child(self),
        )

    @staticmethod
    def _deployment_spec(
        args: FloorReplicasArgs, app: str, labels: dict[str, str], weights_uri: str, revision: str, replicas: int,
        engine: EngineSpec | None = None, version: str | None = None,
    ) -> dict:
        ep = args.endpoint
        eng = engine or ep.engine
        pools = args.node_pools
        layouts = {p.mig_layout.name if p.mig_layout else None for p in pools}
        if len(layouts) != 1:
            raise ValueError(f"endpoint {ep.name!r}: its node pools mix MIG layouts {sorted(map(str, layouts))}")
        layout = pools[0].mig_layout
        profile = ep.capacity.mig_profile
        if profile is not None:
            if layout is None or profile not in layout.devices:
                raise ValueError(
                    f"endpoint {ep.name!r} runs on MIG slice {profile!r} but its pools' layout is "
                    f"{layout.devices if layout else 'MIG off'}"
                )
            if not re.fullmatch(r"[0-9a-z.]+", profile):
                # `1g.10gb+me` (media extensions): `+` is not allowed in a Kubernetes resource name, and the device
                # plugin's name for such a slice is not checked here; the planner never picks one
                raise ValueError(f"endpoint {ep.name!r} runs on MIG slice {profile!r}, which has no resource name "
                                 f"nvidia.com/mig-{profile} Kubernetes accepts; use a profile without '+me'")
            gpu_resources = {f"nvidia.com/mig-{profile}": "1"}
        else:
            gpu_resources = {"nvidia.com/gpu": str(ep.capacity.gpus_per_replica)}
        pod = ep.pod_resources
        if pod is None:
            raise ValueError(f"endpoint {ep.name!r} has node pools but no pod_resources in the spec")
        # sized by the planner from the instance and replicas per node (topology/pod_resources.py); requests =
        # limits for CPU and memory in every container (init included) is what makes the pod Guaranteed
        requests = {"cpu": f"{pod.cpu_request_millicores}m", "memory": f"{pod.memory_request_mib}Mi"}
        limits = {"cpu": f"{pod.cpu_limit_millicores}m", "memory": f"{pod.memory_limit_mib}Mi"}

        node_selector = {ENDPOINT_LABEL: ep.name}
        mig_label = node_labels(pools[0]).get(MIG_CONFIG_LABEL)
        if mig_label is not None:
            node_selector[MIG_CONFIG_LABEL] = mig_label

        weights_suffix = weights_uri.removeprefix("s3://").split("/", 1)[1]
        local_dir = f"{WEIGHTS_MOUNT}/{weights_suffix.strip('/')}"
        on_nvme = all(p.local_nvme_gb > 0 for p in pools)
        weights_volume = (
            {"name": "weights", "hostPath": {"path": f"{NVME_MOUNT}/llm-weights", "type": "DirectoryOrCreate"}}
            if on_nvme else {"name": "weights", "emptyDir": {}}
        )
        budget_s = ep.startup_budget_s
        env = [{"name": k, "value": v} for k, v in sorted(HUB_OFFLINE_ENV.items())]
        engine_env = [{"name": k, "value": v}
                      for k, v in sorted(eng.vllm_env(local_dir, lora_view_dir(local_dir)).items())]
        warmup_env = [
            {"name": "WARMUP_PORT", "value": str(eng.port)},
            {"name": "WARMUP_MODEL", "value": eng.served_model_name},
            {"name": "WARMUP_MAX_TOKENS", "value": str(args.warmup_max_tokens)},
            {"name": "WARMUP_SENTINEL", "value": WARMUP_SENTINEL},
            {"name": "WARMUP_TIMEOUT_S", "value": str(args.warmup_timeout_s)},
        ]
        fetch = {
            "name": "fetch-weights",
            "image": args.aws_cli_image,
            "command": ["/bin/sh", f"{WARMUP_MOUNT}/fetch_weights.sh"],
            "env": env + [
                {"name": "WEIGHTS_URI", "value": weights_uri},
                {"name": "LOCAL_DIR", "value": local_dir},
                {"name": "START_JITTER_S", "value": str(ep.herd.start_jitter_s)},
                {"name": "STALE_LOCK_S", "value": str(args.stale_lock_s)},
                # a neighbour's copy outlasting the whole startup budget is stuck: fail, the kubelet retries
                {"name": "LOCK_WAIT_MAX_S", "value": str(budget_s)},
                *lora_dir_env(eng, local_dir, weights_uri),
            ],
            "volumeMounts": [
                {"name": "weights", "mountPath": WEIGHTS_MOUNT},
                {"name": "scripts", "mountPath": WARMUP_MOUNT, "readOnly": True},
            ],
            # the same as the engine: init containers count for QoS, and a pod's request is max(init, sum(app))
            "resources": {"requests": dict(requests), "limits": dict(limits)},
        }
        engine = {
            "name": "vllm",
            "image": eng.image,
            "command": eng.vllm_args(local_dir),
            "ports": [{"name": "http", "containerPort": eng.port, "protocol": "TCP"}],
            "env": engine_env + warmup_env,
            "resources": {"requests": {**requests, **gpu_resources}, "limits": {**limits, **gpu_resources}},
            "startupProbe": {
                "httpGet": {"path": "/health", "port": "http"},
                "periodSeconds": 10,
                "failureThreshold": max(3, math.ceil(budget_s / 10)),
            },
            "readinessProbe": {
                "exec": {"command": ["python3", f"{WARMUP_MOUNT}/warmup_probe.py"]},
                "periodSeconds": 10,
                "timeoutSeconds": args.warmup_timeout_s + 5,
                "failureThreshold": 3,
            },
            "livenessProbe": {
                "httpGet": {"path": "/health", "port": "http"},
                "periodSeconds": 15,
                "timeoutSeconds": 5,
                "failureThreshold": 4,
            },
            "volumeMounts": [
                {"name": "weights", "mountPath": WEIGHTS_MOUNT, "readOnly": True},
                {"name": "scripts", "mountPath": WARMUP_MOUNT, "readOnly": True},
                {"name": "dshm", "mountPath": "/dev/shm"},  # NCCL between tensor-parallel ranks
            ],
            # on scale-down or rollout: leave the gateway's pool first, then let in-flight streams finish
            "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SLEEP_S}}},
        }
        return {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            # a new replica must be ready before an old one goes: capacity never dips during a rollout
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            # a surge pod may wait for a new GPU node: not a stuck rollout before that has had its time
            "progressDeadlineSeconds": progress_deadline_s(ep),
            "template": {
                "metadata": {"labels": {**labels, "serving.llm/model-revision": revision,
                                        **({VERSION_LABEL: version} if version else {})}},
                "spec": {
                    "serviceAccountName": app,
                    "automountServiceAccountToken": False,
                    # the default 30 s would cut long streams on every scale-down (spec: longest request + 15 s)
                    "terminationGracePeriodSeconds": ep.drain_grace_s,
                    "nodeSelector": node_selector,
                    "tolerations": [{"key": p, "operator": "Exists", "effect": GPU_TAINT_EFFECT_K8S}
                                    for p in sorted({p.taint_key for p in pools})],
                    "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                        # fill the already-paid reserved nodes before the on-demand pool grows
                        "weight": 100,
                        "preference": {"matchExpressions": [{"key": CAPACITY_LABEL, "operator": "In", "values": ["reserved"]}]},
                    }]}},
                    "topologySpreadConstraints": [
                        # ScheduleAnyway: a capacity reservation lives in one zone; spreading must not strand it
                        {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
                         "labelSelector": {"matchLabels": labels}},
                        {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
                         "labelSelector": {"matchLabels": labels}},
                    ],
                    "initContainers": [fetch],
                    "containers": [engine],
                    "volumes": [
                        weights_volume,
                        {"name": "scripts", "configMap": {"name": scripts_configmap_name(app), "defaultMode": 0o555}},
                        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{pod.shm_mib}Mi"}},
                    ],
                },
            },
        }


def scaled_object_spec(ep: EndpointSpec, deployment: str, namespace: str, prometheus_url: str) -> dict:
    a = ep.autoscaling
    assert a is not None  # checked by FloorReplicas before calling (internal invariant)
    # A floor whose base is 0 (scale to zero allowed, no floor in some hours) is woken and stopped by KEDA itself,
    # not the HPA: from 0 any trigger above its activation threshold (default 0) scales it to 1, and once every
    # trigger is inactive for cooldownPeriod (default 300 s) KEDA drops it to 0 in one step (keda v2.20.2
    # pkg/scaling/executor/scale_scaledobjects.go). So the stop waits as long as the HPA's scale-down window, and
    # the burst backlog wakes it only past the burst's planned capacity (burst_backlog_trigger).
    to_zero = {"cooldownPeriod": a.scale_down_stabilization_s} if ep.floor.base_replicas == 0 else {}
    return {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment},
        "minReplicaCount": ep.floor.base_replicas,
        "maxReplicaCount": a.max_replicas,
        "pollingInterval": a.polling_interval_s,
        **to_zero,
        "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
            "scaleUp": {
                "stabilizationWindowSeconds": a.scale_up_stabilization_s,
                "selectPolicy": "Min",
                "policies": [{"type": "Pods", "value": a.scale_up_pods_per_period, "periodSeconds": a.scale_up_period_s}],
            },
            "scaleDown": {
                "stabilizationWindowSeconds": a.scale_down_stabilization_s,
                "selectPolicy": "Min",
                "policies": [{"type": "Pods", "value": a.scale_down_pods_per_period, "periodSeconds": a.scale_down_period_s}],
            },
        }}},
        "triggers": [
            {
                "type": "prometheus",
                "name": "requests-waiting",
                "metricType": "AverageValue",
                "metadata": {
                    "serverAddress": prometheus_url,
                    "query": queue_query(namespace, ep.name, ep.engine.served_model_name,
                                         ep.engine.metrics.requests_waiting, gateway_queues_floor(ep)),
                    "threshold": _number(a.target_waiting_per_replica),
                    # no metric (Prometheus down) must not read as "no queue": hold the current size
                    "ignoreNullValues": "false",
                },
            },
            *burst_backlog_trigger(ep, namespace, prometheus_url),
            *cron_triggers(ep.floor),
        ],
    }


def burst_backlog_trigger(ep: EndpointSpec, namespace: str, prometheus_url: str) -> list[dict]:
    """floor_plus_burst: the gateway keeps the floor's queue short by overflowing, so a sustained overload
    shows up as requests in flight to the burst tier; beyond the burst's planned capacity the floor grows
    too (still within the capped step and max replicas)."""
    threshold = ep.autoscaling.burst_backlog_threshold if ep.autoscaling else None
    if threshold is None:
        return []
    metadata = {
        "serverAddress": prometheus_url,
        "query": burst_backlog_query(namespace, ep.name),
        "threshold": _number(threshold),
        # no series means no burst traffic (or no gateway yet): nothing to add
        "ignoreNullValues": "true",
    }
    if ep.floor.base_replicas == 0:
        # from zero replicas KEDA activates on any value above activationThreshold (default 0): one request in
        # flight to burst, in an hour the plan serves from burst alone, would start a floor replica and a GPU node,
        # which the emptied backlog then stops again a cooldown later. Wake only past the burst's planned capacity.
        metadata["activationThreshold"] = _number(threshold)
    return [{"type": "prometheus", "name": "burst-backlog", "metricType": "Value", "metadata": metadata}]
