"""The Pulumi program: stack config → cost inputs → plan → components → exports. The only shell.

`pulumi up -s prod` on a machine with AWS credentials; `python -m topology render stacks/Pulumi.prod.yaml
--out DIR` runs this same file under Pulumi's mocks and writes what it would declare.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pulumi

from components.cluster import Cluster, ClusterArgs
from components.floor_replicas import FloorReplicas, FloorReplicasArgs, canary_weights_prefix, previous_weights_prefix
from components.gateway import Gateway, GatewayArgs, gateway_pod_labels
from components.gateway_config import ClientLimits
from components.gpu_node_pool import GpuNodePool, GpuNodePoolArgs, existing_node_groups
from components.gpu_operator import GpuOperator, GpuOperatorArgs
from components.keda import Keda
from components.modal_burst import ModalBurst, ModalBurstArgs, ModalTokenError, code_sha256, default_python, modal_token_env
from components.monitoring import PROMETHEUS_URL, Monitoring, MonitoringArgs
from components.network_policy import Admitted
from components.node_autoscaler import NodeAutoscaler, NodeAutoscalerArgs
from components.observability import Observability, ObservabilityArgs
from components.quality_recorder import QualityRecorder, QualityRecorderArgs, sampled_endpoints
from components.stack_settings import check_replication_owner, gateway_ports, replication_destinations, stack_settings
from components.weight_cache import WeightCache, WeightCacheArgs, WeightReader
from components.weight_seed import WeightSeed, WeightSeedArgs
from components.weight_replication import WeightReplication, WeightReplicationArgs
from topology.catalog import MigLayoutError
from topology.cli import planning_hint, today
from topology.loading import InputError, check_kubeconfig_config, check_project_config_keys, inputs_from_document
from topology.plan import PlanningError, plan
from topology.node_schedule import pool_minimums

PROJECT_ROOT = Path(__file__).resolve().parent
AWS_REGION_RE = re.compile(r"[a-z]{2}(-[a-z]+)+-\d{1,2}")  # us-east-1, ap-southeast-5, us-gov-west-1, eu-isoe-west-1


class StackConfigError(pulumi.RunError, InputError):
    """Bad stack config: a RunError, so Pulumi prints the one-line message without a traceback."""

config = pulumi.Config()
source = f"stack {pulumi.get_stack()} config"
try:  # a mistyped setting would otherwise deploy its default silently
    # the engine passes config to the program as PULUMI_CONFIG (pulumi-language-python), mocks and inline programs
    # through set_all_config: both, as pulumi.Config reads them
    from pulumi.runtime.config import CONFIG as _ALL_CONFIG

    check_project_config_keys({**pulumi.runtime.get_config_env(), **_ALL_CONFIG.get()}, config.name, source)
    # the AWS provider's region: refused by the provider only when `up` configures it, so a render or a preview
    # under mocks passed `aws:region: abc`
    _aws_region = pulumi.Config("aws").get("region")
    if _aws_region is not None and not AWS_REGION_RE.fullmatch(_aws_region):
        raise InputError(f"{source} aws:region={_aws_region!r}: not an AWS region name (e.g. us-east-1, eu-central-1, "
                         "us-gov-west-1)")
except InputError as e:
    raise StackConfigError(str(e)) from None

# ── inputs → spec ──────────────────────────────────────────────────────────────────────────────
# the planning date decides whether a promoted rollout still keeps its previous version warm: the clock is read
# here, in the shell, never in the planner; `pulumi config set planningDate YYYY-MM-DD` pins it (reviews, renders)
_planning_date = config.get("planningDate")
utc_today = today()  # UTC, as planningDate is set (`date -u +%F`): the CLI's one clock read
try:
    planning_date = dt.date.fromisoformat(_planning_date) if _planning_date else utc_today
except ValueError:
    raise StackConfigError(f"{source} {config.name}:planningDate={_planning_date!r}: must be a date, YYYY-MM-DD") from None
try:
    inputs = inputs_from_document(config.require_object("inputs"), f"{source} {config.name}:inputs", PROJECT_ROOT,
                                  today=utc_today)  # prices dated in the future are refused, as by `plan`
    spec = plan(inputs, planning_date=planning_date)
    settings = stack_settings(
        {
            "cluster": config.get_object("cluster"),
            "gateway": config.get_object("gateway"),
            "namespace": config.get("namespace"),
            "prometheusUrl": config.get("prometheusUrl"),
            "monitorLabels": config.get_object("monitorLabels"),
            "weightReplication": config.get_object("weightReplication"),
            "s3GatewayEndpoint": config.get_object("s3GatewayEndpoint"),
            "monitoring": config.get("monitoring"),
            "qualityRecorderImage": config.get("qualityRecorderImage"),
            "networkPolicy": config.get_object("networkPolicy"),
        },
        source,
    )
    ports = gateway_ports(settings, spec)
    check_kubeconfig_config(config.get("kubeconfig"), config.full_key("kubeconfig"),
                            pulumi.runtime.is_config_secret(config.full_key("kubeconfig")))
except pulumi.ConfigMissingError:
    raise StackConfigError(f"{source}: missing {config.name}:inputs, the cost inputs mapping (see stacks/Pulumi.dev.yaml)") from None
except pulumi.ConfigTypeError as e:
    # the key that is wrong, not a list of others (it named inputs and cluster whatever the key was)
    raise StackConfigError(f"{source}: {' '.join(str(e).split())}; {e.key} must be a mapping of its settings "
                           "(see stacks/Pulumi.prod.yaml)") from None
except PlanningError as e:
    raise StackConfigError(f"{e}{planning_hint(str(e), inputs)}") from None
except (InputError, MigLayoutError) as e:
    raise StackConfigError(str(e)) from None

# ── cluster ────────────────────────────────────────────────────────────────────────────────────
cluster = Cluster(
    "cluster",
    ClusterArgs(
        settings=settings.cluster,
        region=spec.cluster_region,
        serving_namespace=settings.namespace,
        kubeconfig=config.get_secret("kubeconfig"),  # `pulumi config set --secret kubeconfig ...`; never plain
    ),
)
k8s_opts = pulumi.ResourceOptions(providers={"kubernetes": cluster.provider}, depends_on=[cluster])

# ── monitoring: kube-prometheus-stack where the stack creates its cluster, else the platform's ────
monitoring = None
if settings.installs_monitoring:
    if settings.prometheus_url != PROMETHEUS_URL:
        raise InputError(
            f"{source}: llm-serving:prometheusUrl is {settings.prometheus_url!r}, but with monitoring 'install' "
            f"Prometheus answers at {PROMETHEUS_URL!r}; set that, or `monitoring: platform` for another Prometheus"
        )
    monitoring = Monitoring("monitoring", MonitoringArgs(monitor_labels=settings.monitor_labels), opts=k8s_opts)
# PodMonitors and PrometheusRules wait for the release that defines their CRDs
monitored_opts = pulumi.ResourceOptions(providers={"kubernetes": cluster.provider},
                                        depends_on=[cluster, *([monitoring] if monitoring else [])])

# ── GPU node pools and the operator that partitions them ───────────────────────────────────────
node_minimums = pool_minimums(spec)  # the floor windows as each on-demand pool's minimum on the clock
# the node groups EKS lists now, read once: each pool keeps its current size through a change of its bounds
node_groups_now = {r: existing_node_groups(cluster.name, r) for r in sorted({p.region for p in spec.node_pools})}
node_pools = {
    p.name: GpuNodePool(
        f"pool-{p.name}",
        GpuNodePoolArgs(pool=p, cluster_name=cluster.name, node_role_arn=cluster.node_role_arn, subnet_ids=cluster.subnet_ids,
                        minimums=node_minimums.get(p.name, ()), existing_groups=node_groups_now[p.region]),
    )
    for p in spec.node_pools
}
# Reactive growth from zero (whole GPUs and MIG slices) for queue-triggered replicas above the clock's minimum.
node_autoscaler = (
    NodeAutoscaler("node-autoscaler", NodeAutoscalerArgs(
        cluster_name=cluster.name, region=spec.cluster_region, kubernetes_version=settings.cluster.kubernetes_version,
    ), opts=k8s_opts)
    if spec.node_pools else None
)
gpu_operator = (
    GpuOperator("gpu-operator", GpuOperatorArgs(node_pools=spec.node_pools), opts=k8s_opts) if spec.node_pools else None
)

# ── region-local weight caches ─────────────────────────────────────────────────────────────────
floor_endpoints = [e for e in spec.endpoints if e.node_pools]
weight_caches = {}
for cache in spec.weight_caches:
    readers = [
        WeightReader(
            endpoint=e.name, namespace=settings.namespace, service_account=f"{e.name}-vllm",
            prefixes=tuple(p for p in (e.engine.weights_uri_suffix, canary_weights_prefix(e, cache),
                                       previous_weights_prefix(e, cache)) if p),
        )
        for e in floor_endpoints
        if cache.region == spec.cluster_region
    ]
    weight_caches[cache.region] = WeightCache(
        f"weights-{cache.region}",
        WeightCacheArgs(
            cache=cache, cluster_name=cluster.name, cluster_region=spec.cluster_region, readers=readers,
            s3_endpoint_id=settings.s3_gateway_endpoint.existing_id if settings.s3_gateway_endpoint else None,
            create_s3_endpoint=bool(settings.s3_gateway_endpoint and settings.s3_gateway_endpoint.create),
        ),
    )
# The weights already in the source bucket, copied into each new cache (replication copies new writes only);
# floor pods and the Modal volume fill wait for it.
weight_seeds = {
    region: WeightSeed(f"weights-{region}-seed", WeightSeedArgs(cache=spec.weight_cache(region)),
                       opts=pulumi.ResourceOptions(depends_on=wc.storage))
    for region, wc in weight_caches.items()
}
# One stack owns the source bucket's replication configuration, with every sharing stack's caches in it.
if spec.weight_caches:
    try:
        check_replication_owner(settings, pulumi.get_stack(), PROJECT_ROOT)
    except InputError as e:
        raise StackConfigError(str(e)) from None
if spec.weight_caches and settings.owns_replication(pulumi.get_stack()):
    replicated = replication_destinations(settings, pulumi.get_stack(), spec, PROJECT_ROOT)
    WeightReplication(
        "weights-replication",
        WeightReplicationArgs(
            source_bucket=spec.weight_caches[0].source_bucket,
            source_region=spec.weight_caches[0].source_region,
            caches=replicated,
        ),
        opts=pulumi.ResourceOptions(depends_on=[c.versioning for c in weight_caches.values()]),
    )

# ── who may reach the engines and the recorder: the gateway and the Prometheus that scrapes them ────
GATEWAY_NAME = "gateway"
admitted = (Admitted(gateway_pod_labels=gateway_pod_labels(GATEWAY_NAME),
                     scrapers=settings.metrics_scrapers)
            if settings.network_policy.enabled else None)

# ── floor replicas (dedicated pools), autoscaled by KEDA ───────────────────────────────────────
floors: dict[str, FloorReplicas] = {}
if floor_endpoints:
    keda = Keda("keda", opts=k8s_opts)
    for e in floor_endpoints:
        cache = spec.weight_cache(spec.cluster_region)
        pools = [p for p in spec.node_pools if p.name in e.node_pools]
        floors[e.name] = FloorReplicas(
            f"floor-{e.name}",
            FloorReplicasArgs(
                endpoint=e,
                node_pools=pools,
                weights_uri=cache.uri(e.engine.weights_uri_suffix),
                canary_weights_uri=cache.uri(canary) if (canary := canary_weights_prefix(e, cache)) else None,
                previous_weights_uri=cache.uri(prev) if (prev := previous_weights_prefix(e, cache)) else None,
                namespace=settings.namespace,
                prometheus_url=settings.prometheus_url,
                monitor_labels=settings.monitor_labels,
                admitted=admitted,
            ),
            opts=pulumi.ResourceOptions(
                providers={"kubernetes": cluster.provider},
                depends_on=[cluster, keda, weight_caches[spec.cluster_region].pod_identity[e.name],
                            weight_seeds[spec.cluster_region], *([node_autoscaler] if node_autoscaler else []),
                            *([monitoring] if monitoring else []),
                            *(node_pools[p.name] for p in pools), *([gpu_operator] if gpu_operator else [])],
            ),
        )

# ── alerts: the doctrine's vLLM alerts for each endpoint with floor replicas ────────────────────
if floor_endpoints:
    Observability(
        "observability",
        ObservabilityArgs(spec=spec, namespace=settings.namespace, monitor_labels=settings.monitor_labels,
                          prices=inputs.prices),
        opts=monitored_opts,
    )

# ── burst capacity on Modal, and the gateway that overflows to it ─────────────────────────────
# Each endpoint with burst capacity gets its Modal app (deployed by a local command; token from secret
# config or the environment). The gateway sends each endpoint's traffic to its floor replicas while they
# have room and overflows to the burst URL; managed_api endpoints are called at the provider directly.
# what the deploy reads from this machine (the app's sources, the token, the interpreter), read once here
burst_endpoints = [e for e in spec.endpoints if e.burst is not None]
burst_code_sha256 = code_sha256() if burst_endpoints else ""
try:
    burst_token_env = modal_token_env() if burst_endpoints else {}
except ModalTokenError as e:  # a token in plain-text config: the message says how to fix it
    raise StackConfigError(str(e)) from None
bursts = {
    e.name: ModalBurst(f"{e.name}-burst", ModalBurstArgs(
        endpoint=e, environment=spec.environment, python=default_python(), code_sha256=burst_code_sha256,
        token_env=burst_token_env,
        weights_ready=tuple(s for r, s in weight_seeds.items() if r == e.burst.weights_region),
    ))
    for e in burst_endpoints
}
# ── quality sampling: the gateway's sampled exchanges → the evaluation sink, per model version ───
quality_recorder = None
if sampled_endpoints(spec):
    if settings.quality_recorder_image is None:
        raise StackConfigError(
            f"{source}: endpoints {[e.name for e in sampled_endpoints(spec)]} sample quality (rollout.quality_sampling) "
            f"but {config.name}:qualityRecorderImage is not set; build recorder/Dockerfile, push it and "
            f"`pulumi config set qualityRecorderImage <registry>/quality-recorder:<tag>`")
    quality_recorder = QualityRecorder(
        "quality",
        QualityRecorderArgs(spec=spec, namespace=settings.namespace, image=settings.quality_recorder_image,
                            cluster_name=cluster.name, region=spec.cluster_region,
                            monitor_labels=settings.monitor_labels, admitted=admitted),
        opts=monitored_opts,
    )

gateway = None
if any(e.gated for e in spec.endpoints):
    gateway = Gateway(
        GATEWAY_NAME,
        GatewayArgs(
            spec=spec,
            namespace=settings.namespace,
            floor_services={n: f.pods_dns for n, f in floors.items()},
            canary_services={n: f.canary_pods_dns for n, f in floors.items() if f.canary_pods_dns},
            burst_urls={n: b.url for n, b in bursts.items()},
            monitor_labels=settings.monitor_labels,
            quality_recorder=(f"{quality_recorder.service_dns}:{quality_recorder.port}" if quality_recorder else None),
            client_limits=ClientLimits(source=settings.gateway.client_source),
            ports=ports,
            # a cluster this stack creates has none of the Secrets the gateway reads (tenant keys, Modal proxy
            # auth) until they are created after it: `up` does not wait for its pods (they start once they exist)
            await_ready=settings.cluster.mode != "create",
        ),
        opts=monitored_opts,
    )

# ── exports ────────────────────────────────────────────────────────────────────────────────────
pulumi.export("spec", json.loads(spec.to_json()))
pulumi.export("specSha256", spec.sha256())
pulumi.export("costReport", {
    "pricesAsOf": spec.prices_as_of.isoformat(),
    "monthlyUsdTotal": spec.monthly_usd_total,
    "monthlyUsdByTier": spec.monthly_usd_by_tier,
    "endpoints": {
        e.name: {"tier": e.tier, "monthlyUsd": e.monthly_usd, "runnerUp": e.runner_up, "whyRunnerUpLost": e.why_runner_up_lost}
        for e in spec.endpoints
    },
    "warnings": list(spec.warnings),
})
pulumi.export("weightBuckets", {region: c.bucket_name for region, c in weight_caches.items()})
pulumi.export("weightUris", {
    e.name: {c.region: c.uri(e.engine.weights_uri_suffix) for c in spec.weight_caches if e.engine.weights_uri_suffix in c.model_prefixes}
    for e in spec.endpoints
})
pulumi.export("endpoints", {
    e.name: {"tier": e.tier, "servedModelName": e.engine.served_model_name,
             "floorService": floors[e.name].service_dns if e.name in floors else None,
             "floorPods": floors[e.name].pods_dns if e.name in floors else None,
             "canaryPods": floors[e.name].canary_pods_dns if e.name in floors else None,
             "previousPods": floors[e.name].previous_pods_dns if e.name in floors else None}
    for e in spec.endpoints
})
pulumi.export("burstUrls", {name: b.url for name, b in bursts.items()})
if gateway is not None:
    pulumi.export("gateway", {"service": gateway.service_name, "ports": gateway.ports})
pulumi.export("clusterName", cluster.name)
